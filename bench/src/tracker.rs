//! Where every Secret of a benchmark's namespace is, from one metadata watch of the bench's own
//! (the product caches nothing; the bench may): waiting for the objects to converge follows
//! watch events instead of listing the namespace again and again, which would load the
//! apiserver the benchmarks measure, and tells the instant the last object arrived.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use sharder_common::{ObjectKey, Ring, RingLabels};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::progress::progress;
use crate::{Error, RingSetup};

/// Raised when something the waits rely on stops (a bench shard losing its Lease): a wait on
/// the objects then ends at once with the reason instead of running into its timeout.
#[derive(Clone, Debug, Default)]
pub(crate) struct Alarm(watch::Sender<Option<String>>);

impl Alarm {
    /// Raises the alarm for `why` (the first reason is kept).
    pub(crate) fn raise(&self, why: String) {
        self.0.send_if_modified(|raised| {
            let first = raised.is_none();
            raised.get_or_insert(why);
            first
        });
    }

    /// Why the alarm was raised, once it is.
    pub(crate) async fn raised(&self) -> String {
        // The sender is this alarm, which outlives the wait, so the wait cannot fail.
        let mut alarm = self.0.subscribe();
        let why = alarm.wait_for(Option::is_some).await.map(|why| why.clone());
        why.ok().flatten().unwrap_or_default()
    }
}

/// Where one object is.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Place {
    shard: Option<String>,
    draining: bool,
}

#[derive(Default)]
struct State {
    objects: HashMap<String, Place>,
    synced: bool,
    /// The ring the objects should converge to, and the namespace (for the objects' keys).
    target: Option<(Ring, String)>,
    /// Objects not on their target shard, or draining.
    misplaced: usize,
    /// When `misplaced` last became 0 (with a target set).
    settled_at: Option<Instant>,
    error: Option<String>,
}

impl State {
    /// Object `name`'s shard on the target ring (`None` with no target).
    fn desired(&self, name: &str) -> Option<&str> {
        let (ring, ns) = self.target.as_ref()?;
        let key = ObjectKey::main("", "Secret", Some(ns), name)?;
        ring.shard_for(key.as_str())
    }

    fn misplaced(&self, name: &str, place: Option<&Place>) -> bool {
        self.target.is_some()
            && place.is_some_and(|p| p.draining || p.shard.as_deref() != self.desired(name))
    }

    /// Up to `n` misplaced objects as `name on <shard>[ draining], not <desired>`, for a
    /// timeout's message.
    fn examples(&self, n: usize) -> String {
        let mut wrong: Vec<String> = self
            .objects
            .iter()
            .filter(|(name, place)| self.misplaced(name, Some(place)))
            .map(|(name, place)| {
                format!(
                    "{name} on {}{}, not {}",
                    place.shard.as_deref().unwrap_or("no shard"),
                    if place.draining { " draining" } else { "" },
                    self.desired(name).unwrap_or("none")
                )
            })
            .collect();
        wrong.sort();
        wrong.truncate(n);
        wrong.join("; ")
    }

    fn recount(&mut self) {
        self.misplaced = self
            .objects
            .iter()
            .filter(|(name, place)| self.misplaced(name, Some(place)))
            .count();
        self.settle(Instant::now());
    }

    fn settle(&mut self, now: Instant) {
        if self.synced && self.target.is_some() && self.misplaced == 0 {
            self.settled_at.get_or_insert(now);
        } else {
            self.settled_at = None;
        }
    }

    fn set(&mut self, name: String, place: Option<Place>, now: Instant) {
        let before = self.misplaced(&name, self.objects.get(&name));
        let after = self.misplaced(&name, place.as_ref());
        match place {
            Some(place) => self.objects.insert(name, place),
            None => self.objects.remove(&name),
        };
        self.misplaced = self.misplaced + usize::from(after) - usize::from(before);
        self.settle(now);
    }
}

/// How often a wait for the objects says how far they are.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// A metadata watch of a namespace's Secrets, counting those not where a given ring puts them.
pub(crate) struct Tracker {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
    task: JoinHandle<()>,
    setup_ns: String,
    alarm: Alarm,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tracker {
    /// Starts watching the Secrets of `setup`'s namespace; returns once the first list is in.
    /// Waits end early when `alarm` is raised.
    pub(crate) async fn start(setup: &RingSetup, alarm: &Alarm) -> Result<Self, Error> {
        let api: Api<PartialObjectMeta<Secret>> = Api::namespaced(setup.client.clone(), &setup.ns);
        let state = Arc::new(Mutex::new(State::default()));
        let changed = Arc::new(Notify::new());
        let labels: RingLabels = setup.labels.clone();
        let task = {
            let state = Arc::clone(&state);
            let changed = Arc::clone(&changed);
            tokio::spawn(async move {
                let mut events = std::pin::pin!(watcher::watcher(
                    api,
                    watcher::Config::default().page_size(500)
                ));
                while let Some(event) = events.next().await {
                    let now = Instant::now();
                    let place = |meta: &PartialObjectMeta<Secret>| Place {
                        shard: labels.shard_of(meta.labels()).map(str::to_owned),
                        draining: labels.is_draining(meta.labels()),
                    };
                    let mut s = lock(&state);
                    // The benchmarks delete no object: a relist applies what it lists.
                    match event {
                        Ok(Event::Apply(meta) | Event::InitApply(meta)) => {
                            s.set(meta.name_any(), Some(place(&meta)), now);
                        }
                        Ok(Event::Delete(meta)) => s.set(meta.name_any(), None, now),
                        Ok(Event::Init) => {}
                        Ok(Event::InitDone) => {
                            s.synced = true;
                            s.settle(now);
                        }
                        Err(e) => s.error = Some(e.to_string()),
                    }
                    drop(s);
                    changed.notify_waiters();
                }
            })
        };
        let tracker = Self {
            state,
            changed,
            task,
            setup_ns: setup.ns.clone(),
            alarm: alarm.clone(),
        };
        tracker
            .wait(Duration::from_secs(600), "the first list", |s| s.synced)
            .await?;
        Ok(tracker)
    }

    async fn wait(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&State) -> bool,
    ) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut said = tokio::time::Instant::now();
        loop {
            let notified = self.changed.notified();
            {
                let s = lock(&self.state);
                if done(&s) {
                    return Ok(());
                }
                // How far the objects are, at most every 5 s while they move.
                if said.elapsed() >= PROGRESS_EVERY && s.target.is_some() {
                    said = tokio::time::Instant::now();
                    progress!(
                        "  {} of {} objects not yet on their shard of the ring",
                        s.misplaced,
                        s.objects.len()
                    );
                }
            }
            let timed_out = tokio::select! {
                _ = notified => false,
                why = self.alarm.raised() => {
                    return Err(Error::Setup(format!(
                        "the Secrets of {} cannot reach {what}: {why}",
                        self.setup_ns
                    )));
                }
                _ = tokio::time::sleep_until(deadline) => true,
            };
            if timed_out {
                let s = lock(&self.state);
                return Err(Error::Setup(format!(
                    "the Secrets of {} did not reach {what} within {timeout:?}: {} of {} misplaced ({}){}",
                    self.setup_ns,
                    s.misplaced,
                    s.objects.len(),
                    s.examples(5),
                    s.error
                        .as_ref()
                        .map(|e| format!(" (last watch error: {e})"))
                        .unwrap_or_default()
                )));
            }
        }
    }

    /// Waits until every object is on its shard of `ring` (keys in `setup`'s namespace) and none is
    /// draining; returns when that happened (the watch event that completed it) and every
    /// object's shard.
    pub(crate) async fn converge(
        &self,
        setup: &RingSetup,
        ring: &Ring,
    ) -> Result<(Instant, BTreeMap<String, String>), Error> {
        {
            let mut s = lock(&self.state);
            s.target = Some((ring.clone(), setup.ns.clone()));
            s.settled_at = None;
            s.recount();
        }
        self.wait(Duration::from_secs(600), "their shards", |s| {
            s.settled_at.is_some()
        })
        .await?;
        let mut s = lock(&self.state);
        let at = s.settled_at.unwrap_or_else(Instant::now);
        let all = s
            .objects
            .iter()
            .map(|(name, place)| (name.clone(), place.shard.clone().unwrap_or_default()))
            .collect();
        s.target = None;
        Ok((at, all))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_raised_alarm_wakes_its_waiter_with_the_first_reason() {
        let alarm = Alarm::default();
        let waiting = tokio::spawn({
            let alarm = alarm.clone();
            async move { alarm.raised().await }
        });
        tokio::task::yield_now().await;
        alarm.raise("shard-1 stopped".into());
        alarm.raise("shard-2 stopped".into());
        assert_eq!(waiting.await.expect("waiter"), "shard-1 stopped");
        assert_eq!(alarm.raised().await, "shard-1 stopped");
    }

    #[test]
    fn a_timeout_names_the_misplaced_objects_where_they_are_and_where_they_belong() {
        let mut s = State {
            target: Some((Ring::new(["home"]), "ns".into())),
            ..State::default()
        };
        let place = |shard: Option<&str>, draining| {
            let shard = shard.map(str::to_owned);
            Some(Place { shard, draining })
        };
        let now = Instant::now();
        s.set("a".into(), place(Some("home"), false), now);
        assert_eq!((s.misplaced, s.examples(5)), (0, String::new()));
        s.set("a".into(), place(Some("home"), true), now);
        s.set("b".into(), place(None, false), now);
        s.set("c".into(), place(Some("old"), false), now);
        assert_eq!(s.misplaced, 3);
        let all = "a on home draining, not home; b on no shard, not home; c on old, not home";
        assert_eq!(s.examples(5), all);
        assert_eq!(s.examples(1), "a on home draining, not home");
    }
}
