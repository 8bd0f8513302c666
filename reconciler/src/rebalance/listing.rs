//! Listing for a rebalance: each range of a target's objects (across the cluster or one
//! namespace) page by page, label-selected to what can need work, metadata only. A page is read
//! whole and parsed ([`super::pages`]), and its objects are handed to the writers one by one; the
//! next page is requested at once and opens when the current one's objects have room to wait for
//! a write slot (a page and [`LISTED_AHEAD`] more), so a page is read to its end at the
//! apiserver's speed, however slowly its objects are written.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use futures::AsyncBufReadExt;
use kube::Client;
use kube::api::{ListParams, ObjectMeta, VersionMatch};
use kube::core::{ApiResource, DynamicObject, Request, Resource};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, warn};

use sharder_common::RingLabels;
use sharder_runtime::retry::retry_after;

use super::pages;
use super::strays::Strays;
use super::{OVERLOAD_RETRIES, Outcome, Rebalancer, RingView, Scope, Target};

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
    objects: std::vec::IntoIter<pages::Waiting>,
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

/// One list of a target's objects: across the cluster (`namespace` `None`) or in one
/// namespace, its pages continuing `first`.
#[derive(Clone, Copy, Debug)]
struct ListRange<'a> {
    target: &'a Target,
    namespace: Option<&'a str>,
    first: &'a ListParams,
    /// Places for listed objects waiting for a write slot.
    room: &'a Arc<Semaphore>,
}

/// How listing a page ended.
enum PageEnd {
    /// Every object was handed over; the next page, already requested, if there is one.
    Page(Option<Opening>),
    /// The writers stopped taking objects.
    Stopped,
}

/// A list page being requested in the background, with the places its objects may take
/// (dropping it cancels the request).
type Opening = AbortOnDropHandle<Result<(Page, OwnedSemaphorePermit), kube::Error>>;

/// A listed object waiting for a write slot, holding its place in the room.
pub(super) type Queued = (pages::Waiting, OwnedSemaphorePermit);

impl Rebalancer {
    /// Lists `target`'s objects in `scope` page by page into `tx`, across the cluster or
    /// namespace by namespace ([`Namespaces::list_ranges`]; objects in namespaces the ring
    /// does not shard are left out), each page once `room` has a place for each of its objects;
    /// the outcome counts what was listed and failed lists, and, when `scope` selects every
    /// object no available shard holds and was listed to its end, those objects
    /// ([`Outcome::strays`]).
    pub(super) async fn list_into(
        &self,
        view: &RingView<'_>,
        target: &Target,
        scope: &Scope,
        room: &Arc<Semaphore>,
        tx: UnboundedSender<Queued>,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        let mut strays = scope.finds_strays().then(Strays::default);
        let first = first_page(scope, view.labels, view.available, self.settings.page_size);
        for namespace in view.namespaces.list_ranges(target) {
            let range = ListRange {
                target,
                namespace,
                first: &first,
                room,
            };
            let mut opening = self.open_page(&range, None);
            loop {
                if !view.is_current() {
                    return outcome;
                }
                let listing = std::time::Instant::now();
                let before = outcome.listed;
                let page = self
                    .list_page(view, &range, opening, &tx, &mut outcome, strays.as_mut())
                    .await;
                let objects = outcome.listed - before;
                match page {
                    Ok(PageEnd::Stopped) => return outcome,
                    Ok(PageEnd::Page(next)) => {
                        debug!(resource = %target.resource, namespace = namespace.unwrap_or(""), objects, list_ms = listing.elapsed().as_secs_f64() * 1e3, "listed a page");
                        match next {
                            Some(next) => opening = next,
                            None => break,
                        }
                    }
                    Err(e) => {
                        warn!(resource = %target.resource, namespace = namespace.unwrap_or(""), error = %e, "cannot list objects");
                        outcome.errors += 1;
                        outcome.failed_lists += 1;
                        return outcome;
                    }
                }
            }
        }
        if let Some(strays) = strays {
            outcome.strays.insert(target.resource.clone(), strays);
        }
        outcome
    }

    /// Requests a page of `range` in the background (its first, or the one `token`
    /// continues) once its room has a place for each object the page may hold.
    fn open_page(&self, range: &ListRange<'_>, token: Option<&str>) -> Opening {
        let client = self.lists.clone();
        let api = range.target.api.clone();
        let namespace = range.namespace.map(str::to_owned);
        let params = match token {
            Some(token) => range.first.clone().continue_token(token),
            None => range.first.clone(),
        };
        let room = Arc::clone(range.room);
        let page_size = self.settings.page_size;
        AbortOnDropHandle::new(tokio::spawn(async move {
            let places = room
                .acquire_many_owned(page_size)
                .await
                .expect("the room is never closed");
            let page = as_told(|| Page::open(&client, &api, namespace.as_deref(), &params)).await?;
            Ok((page, places))
        }))
    }

    /// Lists the page `opening` into `tx` (counting its objects, and the main objects already
    /// draining, in `outcome`, and those no available shard holds in `strays`), leaving out
    /// objects in namespaces the ring does not shard and main objects that stay; each object
    /// handed over takes one of the page's places (the rest are given back when the page ends).
    /// The next page (the range's first page continued) is requested at once, and opens once its
    /// places are free.
    async fn list_page(
        &self,
        view: &RingView<'_>,
        range: &ListRange<'_>,
        opening: Opening,
        tx: &UnboundedSender<Queued>,
        outcome: &mut Outcome,
        mut strays: Option<&mut Strays>,
    ) -> Result<PageEnd, kube::Error> {
        let target = range.target;
        let (mut page, mut places) = opening
            .await
            .map_err(|e| kube::Error::Service(e.into()))??;
        // The next page is requested at once; it opens once its places are free.
        let next = page
            .continue_token()
            .map(|token| self.open_page(range, Some(token)));
        while let Some(meta) = page.next() {
            outcome.listed += 1;
            if !view.namespaces.holds(target, meta.namespace.as_deref()) {
                continue;
            }
            if let Some(strays) = strays.as_deref_mut() {
                strays.see(&meta, view.labels, view.available);
            }
            // A main object that stays is done here; only work goes to the writers.
            if self.stays(view, target, &meta) {
                let labels = meta.labels.as_ref();
                outcome.draining += usize::from(labels.is_some_and(|l| view.labels.is_draining(l)));
                continue;
            }
            // A page longer than asked for (an apiserver that ignores `limit`) waits for places.
            let place = match places.split(1) {
                Some(place) => place,
                None => Arc::clone(range.room)
                    .acquire_owned()
                    .await
                    .expect("the room is never closed"),
            };
            if tx.send((meta.into(), place)).is_err() {
                return Ok(PageEnd::Stopped);
            }
        }
        Ok(PageEnd::Page(next))
    }
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
