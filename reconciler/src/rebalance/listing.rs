//! Listing for a rebalance: each range of a target's objects (across the cluster or one
//! namespace) page by page, label-selected to what can need work, metadata only. A page is read
//! whole and parsed ([`super::pages`]), and its objects that need work go to the writers through
//! one bounded channel of a page and [`LISTED_AHEAD`] places. A page is requested only once the
//! channel has a place for each object it may hold, so it is read to its end at the
//! apiserver's speed, however slowly its objects are written, and what waits for a write is at
//! most the channel's capacity.

use std::collections::BTreeSet;
use std::future::Future;

use futures::AsyncBufReadExt;
use kube::Client;
use kube::api::{ListParams, ObjectMeta, VersionMatch};
use kube::core::{ApiResource, DynamicObject, Request, Resource};
use tokio::sync::mpsc::Sender;
use tokio::time::Instant;
use tracing::{debug, warn};

use sharder_common::RingLabels;
use sharder_runtime::retry::retry_after;

use super::concurrency::OVERLOAD_RETRIES;
use super::outcome::Outcome;
use super::pages;
use super::strays::Strays;
use super::view::RingView;
use crate::terms::{Scope, Target};

/// Listed objects that may wait for a write slot beyond a page, so the writers do not run dry
/// while the next page is prepared.
pub(crate) const LISTED_AHEAD: usize = 64;

/// The resource version a list that needs no confirmed state starts at, with
/// `resourceVersionMatch=NotOlderThan`: any state at least that new, which the apiserver's
/// watch cache has at once, page by page. A list without a version is a consistent read, for
/// which the cache first waits to hear from etcd that it is current; a version of 0 would make
/// the apiserver ignore the page size. A write planned from a state that has changed since is
/// refused by its resourceVersion precondition and planned again from the object read anew.
pub(super) const FROM_THE_CACHE: &str = "1";

/// The first page's request of `scope`'s list of a ring with `labels` and the `available`
/// shards: `page_size` objects, label-selected; from the watch cache as it is
/// ([`FROM_THE_CACHE`]) unless the list confirms earlier writes.
fn first_page(
    scope: &Scope,
    labels: &RingLabels,
    available: &BTreeSet<String>,
    page_size: u32,
) -> ListParams {
    let mut first = ListParams::default().limit(page_size);
    if let Some(selector) = scope.selector(labels, available) {
        first = first.labels(&selector);
    }
    if !scope.confirms() {
        first = first
            .at(FROM_THE_CACHE)
            .matching(VersionMatch::NotOlderThan);
    }
    first
}

/// One page of a metadata-only list, read whole and parsed into what a move needs
/// ([`pages::parse`]).
pub(super) struct Page {
    objects: std::vec::IntoIter<pages::ListedMeta>,
    continue_token: Option<String>,
}

impl Page {
    /// Requests one page of `api`'s objects in `namespace` (`None`: every namespace), metadata
    /// only.
    pub(super) async fn open(
        client: &Client,
        api: &ApiResource,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<Self, kube::Error> {
        let request = Request::new(DynamicObject::url_path(api, namespace))
            .list_metadata(params)
            .map_err(kube::Error::BuildRequest)?;
        let mut body = client.request_stream(request).await?;
        let mut chunks = pages::Chunks::default();
        loop {
            let chunk = body.fill_buf().await.map_err(kube::Error::ReadEvents)?;
            if chunk.is_empty() {
                break;
            }
            chunks.push(chunk);
            let read = chunk.len();
            body.consume_unpin(read);
        }
        let page = pages::parse(chunks).map_err(kube::Error::SerdeError)?;
        Ok(Self {
            objects: page.objects.into_iter(),
            continue_token: page.continue_token,
        })
    }

    /// The next object of the page; `None` after the last.
    pub(super) fn next(&mut self) -> Option<ObjectMeta> {
        self.objects.next().map(ObjectMeta::from)
    }

    /// The token of the next page (`None` on the last page).
    pub(super) fn continue_token(&self) -> Option<&str> {
        self.continue_token.as_deref()
    }
}

/// `request`'s answer, asked for again after the wait the apiserver named when it was too busy
/// for it for now (a 429 with Retry-After), up to [`OVERLOAD_RETRIES`] times, before its error
/// counts.
async fn as_told<T, F: Future<Output = Result<T, kube::Error>>>(
    mut request: impl FnMut() -> F,
) -> Result<T, kube::Error> {
    let mut busy = 0;
    loop {
        match request().await {
            Err(e) if busy < OVERLOAD_RETRIES && retry_after(&e).is_some() => {
                let wait = retry_after(&e).unwrap_or_default();
                busy += 1;
                debug!(error = %e, wait_ms = wait.as_millis(), "the apiserver asked to list again later");
                tokio::time::sleep(wait).await;
            }
            answer => return answer,
        }
    }
}

/// A listed object on its way to the writers, and when its page arrived (what the writers
/// learn of the ring's Leases later holds for it: [`super::view::LiveNow`]).
pub(super) type Listed = (pages::ListedMeta, Instant);

/// The capacity of the channel between the lister and the writers for pages of `page_size`:
/// a page, and [`LISTED_AHEAD`] objects of the page before it still waiting when it is
/// requested.
pub(super) fn channel_capacity(page_size: u32) -> usize {
    page_size as usize + LISTED_AHEAD
}

/// Lists `target`'s objects in `scope` with `client`, `page_size` at a time, into `tx` (of
/// [`channel_capacity`]), across the cluster or namespace by namespace
/// ([`Namespaces::list_ranges`]; objects in namespaces the ring does not shard are left
/// out), each page once `tx` has a place for each of its objects; main objects that stay
/// are done here. The outcome counts what was listed, the main objects already draining and
/// failed lists, and, when `scope` selects every object no available shard holds and was
/// listed to its end, those objects ([`Outcome::strays`]).
pub(super) async fn list_into(
    client: &Client,
    view: &RingView<'_>,
    target: &Target,
    scope: &Scope,
    page_size: u32,
    tx: Sender<Listed>,
) -> Outcome {
    let mut outcome = Outcome::default();
    let mut strays = scope.finds_strays().then(Strays::default);
    let first = first_page(scope, view.labels, view.available, page_size);
    for namespace in view.namespaces.list_ranges(target) {
        let mut params = first.clone();
        loop {
            if !view.is_current() {
                return outcome;
            }
            // The writers stopped taking objects: nothing more to list.
            let Ok(mut places) = tx.reserve_many(page_size as usize).await else {
                return outcome;
            };
            let page = as_told(|| Page::open(client, &target.api, namespace, &params)).await;
            let seen = Instant::now();
            let mut page = match page {
                Ok(page) => page,
                Err(e) => {
                    warn!(resource = %target.resource, namespace = namespace.unwrap_or(""), error = %e, "cannot list objects");
                    outcome.errors += 1;
                    outcome.failed_lists += 1;
                    return outcome;
                }
            };
            let before = outcome.listed;
            while let Some(meta) = page.next() {
                outcome.listed += 1;
                if !view.namespaces.holds(target, meta.namespace.as_deref()) {
                    continue;
                }
                if let Some(strays) = strays.as_mut() {
                    strays.see(&meta, view.labels, view.available);
                }
                if view.stays(target, &meta) {
                    let labels = meta.labels.as_ref();
                    outcome.already_draining +=
                        usize::from(labels.is_some_and(|l| view.labels.is_draining(l)));
                    continue;
                }
                // A page longer than asked for (an apiserver that ignores `limit`) waits
                // for places.
                let sent = match places.next() {
                    Some(place) => {
                        place.send((meta.into(), seen));
                        true
                    }
                    None => tx.send((meta.into(), seen)).await.is_ok(),
                };
                if !sent {
                    return outcome;
                }
            }
            debug!(resource = %target.resource, namespace = namespace.unwrap_or(""), objects = outcome.listed - before, "listed a page");
            match page.continue_token() {
                Some(token) => params = first.clone().continue_token(token),
                None => break,
            }
        }
    }
    if let Some(strays) = strays {
        outcome.strays.insert(target.resource.clone(), strays);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// An apiserver answer: `code` with a Retry-After of `seconds`, or a page (`None`).
    fn answer(code: Option<(u16, u32)>) -> Result<&'static str, kube::Error> {
        match code {
            None => Ok("page"),
            Some((code, seconds)) => {
                let status = serde_json::json!({
                    "code": code,
                    "status": "Failure",
                    "details": { "retryAfterSeconds": seconds },
                });
                Err(kube::Error::Api(Box::new(
                    serde_json::from_value(status).expect("a Status"),
                )))
            }
        }
    }

    #[test]
    fn lists_that_find_work_read_the_cache_as_it_is_and_the_list_after_the_drains_is_a_consistent_read()
     {
        let id = sharder_common::RingId::controller_ring("ring");
        let labels = id.labels();
        let available: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let shard = &labels.shard;
        let cases = [
            (Scope::All, None, true),
            (Scope::OnShard("a".into()), Some(format!("{shard}=a")), true),
            (Scope::Unassigned, Some(format!("!{shard}")), true),
            (Scope::Stray, Some(format!("{shard} notin (a,b)")), true),
            (Scope::AfterDrains, None, false),
        ];
        for (scope, selector, cached) in cases {
            let params = first_page(&scope, &labels, &available, 500);
            assert_eq!(params.limit, Some(500), "{scope:?}");
            assert_eq!(params.label_selector, selector, "{scope:?}");
            let version = (
                params.resource_version.as_deref(),
                params.version_match.clone(),
            );
            let from_cache = (Some(FROM_THE_CACHE), Some(VersionMatch::NotOlderThan));
            assert_eq!(version == from_cache, cached, "{scope:?}: {version:?}");
            if !cached {
                assert_eq!(version, (None, None), "{scope:?}: a consistent read");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_page_is_asked_again_after_each_retry_after_and_other_errors_end_it() {
        let busy = Some((429, 2));
        let cases = [
            (vec![None], Ok(()), 1, 0),
            (vec![busy, busy, None], Ok(()), 3, 4),
            (vec![Some((429, 0)), None], Err(429), 1, 0),
            (vec![Some((500, 2)), None], Err(500), 1, 0),
            (
                vec![busy; OVERLOAD_RETRIES + 1],
                Err(429),
                OVERLOAD_RETRIES + 1,
                2 * OVERLOAD_RETRIES as u64,
            ),
        ];
        for (answers, outcome, requests, waited) in cases {
            let left = Mutex::new(answers.clone().into_iter());
            let asked = Mutex::new(0);
            let started = tokio::time::Instant::now();
            let result = as_told(|| {
                *asked.lock().expect("count") += 1;
                let next = left.lock().expect("answers").next().expect("an answer");
                async move { answer(next) }
            })
            .await;
            let outcome_seen = match result {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) => Err(status.code),
                Err(e) => panic!("{e}"),
            };
            assert_eq!(outcome_seen, outcome, "{answers:?}");
            assert_eq!(*asked.lock().expect("count"), requests, "{answers:?}");
            assert_eq!(
                started.elapsed(),
                Duration::from_secs(waited),
                "{answers:?}"
            );
        }
    }
}
