//! Drain acknowledgements as they happen. While a ring has drain checks due (drains pending or
//! children waiting for their owners), one metadata watch per main resource of the ring selects
//! only the objects carrying the ring's drain label, what is draining now and never the ring's
//! other objects, and wakes the ring when it matters: the last draining object left the
//! selection (every drain acknowledged: the ring lists everything once more at once), or one
//! left while children wait for their owners (they follow it now). An object leaves when its
//! shard acknowledged the drain (the label is gone) or it was deleted. Acknowledgements of a
//! ring with no child waiting wake nothing before the last: the webhook assigns each
//! acknowledged object in the shard's own request, and a rebalance per acknowledgement would
//! only load the apiserver the shards are acknowledging through. The drain checks
//! (`--drain-check-interval`) stay the fallback: a watch that is refused (no `watch` permission
//! on a resource) ends, and they carry on alone.
//!
//! Wakes for waiting children are coalesced to one per [`COALESCE`] and one after the last: a
//! shard acknowledges its drains one object after the other, and the ring controller's debounce
//! would push a ring woken more often than that back until the acknowledgements ended.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use kube::api::{ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use sharder_common::{RingId, RingKind, Role};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::rebalance::Target;

/// The shortest time between two wakes of one ring by its acknowledgements.
pub(crate) const COALESCE: Duration = Duration::from_millis(250);

/// What a ring's acknowledgement watches select: its drain label on its main resources.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Selection {
    drain: String,
    resources: Vec<ApiResource>,
}

/// A ring's running watches (stopped when dropped).
#[derive(Debug)]
struct Watching {
    selection: Selection,
    /// Whether children of the ring wait for their owners (every acknowledgement wakes it).
    children: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The acknowledgement watches of the rings of one kind.
pub(crate) struct Acks {
    client: Client,
    wake: mpsc::UnboundedSender<String>,
    watching: Mutex<HashMap<String, Watching>>,
}

/// The rings woken by their acknowledgements, as the ring controller takes triggers.
pub(crate) type Woken =
    std::pin::Pin<Box<dyn Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static>>;

impl Acks {
    /// Watches with `client` for the rings of `kind`, and the stream of the rings they wake.
    pub(crate) fn new(client: Client, kind: RingKind) -> (Self, Woken) {
        let (wake, woken) = mpsc::unbounded_channel::<String>();
        let resource = kind.api_resource();
        let woken = futures::stream::unfold(woken, move |mut woken| {
            let resource = resource.clone();
            async move {
                let name = woken.recv().await?;
                Some((Ok(DynamicObject::new(&name, &resource)), woken))
            }
        });
        let acks = Self {
            client,
            wake,
            watching: Mutex::new(HashMap::new()),
        };
        (acks, Box::pin(woken))
    }

    fn watching(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watching>> {
        self.watching.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Follows the acknowledgements of `ring` (drain label `drain`) on the main resources of
    /// `targets`, `children` telling whether children wait for their owners: starts its
    /// watches, unless they run for the same already.
    pub(crate) fn follow(&self, ring: &RingId, drain: &str, targets: &[Target], children: bool) {
        let selection = Selection {
            drain: drain.to_owned(),
            resources: targets
                .iter()
                .filter(|t| t.role == Role::Main)
                .map(|t| t.api.clone())
                .collect(),
        };
        let mut watching = self.watching();
        if let Some(w) = watching.get(&ring.name)
            && w.selection == selection
            && !w.task.is_finished()
        {
            w.children.store(children, Ordering::Relaxed);
            return;
        }
        let waiting = Arc::new(AtomicBool::new(children));
        let task = tokio::spawn(watch(
            self.client.clone(),
            ring.clone(),
            selection.clone(),
            Arc::clone(&waiting),
            self.wake.clone(),
        ));
        watching.insert(
            ring.name.clone(),
            Watching {
                selection,
                children: waiting,
                task,
            },
        );
    }

    /// Stops following `ring`'s acknowledgements (no drain checks due, or the ring is gone).
    pub(crate) fn stop(&self, ring: &RingId) {
        self.watching().remove(&ring.name);
    }
}

/// When to wake a ring, as events come: at once for the first object leaving the selection,
/// then at most once per [`COALESCE`], one more after the last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Coalesce {
    /// Until when the next wake waits, after the last one.
    quiet_until: Option<Instant>,
    /// Whether an object left since the last wake.
    pending: bool,
}

impl Coalesce {
    /// An object left the selection at `now`: whether to wake the ring now.
    fn left(&mut self, now: Instant) -> bool {
        if self.quiet_until.is_some_and(|until| now < until) {
            self.pending = true;
            return false;
        }
        self.quiet_until = Some(now + COALESCE);
        self.pending = false;
        true
    }

    /// The quiet time ended at `now`: whether to wake the ring now (objects left meanwhile).
    fn quiet(&mut self, now: Instant) -> bool {
        let wake = std::mem::take(&mut self.pending);
        self.quiet_until = wake.then_some(now + COALESCE);
        wake
    }
}

/// An object by namespace and name.
type Key = (Option<String>, String);

/// The objects draining now, per resource, as the watches of a ring's resources list and see
/// them.
#[derive(Debug, Default)]
struct Draining {
    /// Per resource (by index), its objects carrying the drain label, once its list is in.
    listed: Vec<Option<HashSet<Key>>>,
}

impl Draining {
    fn new(resources: usize) -> Self {
        Self {
            listed: vec![None; resources],
        }
    }

    /// Takes watch event `event` of resource `i`; whether it was an object leaving the
    /// selection.
    fn take(&mut self, i: usize, event: &Event<PartialObjectMeta<DynamicObject>>) -> bool {
        let key = |o: &PartialObjectMeta<DynamicObject>| {
            (
                o.metadata.namespace.clone(),
                o.metadata.name.clone().unwrap_or_default(),
            )
        };
        let Some(slot) = self.listed.get_mut(i) else {
            return false;
        };
        match event {
            Event::Init => {
                *slot = None;
                false
            }
            // A relist starts its set anew: until its end the resource counts as unlisted.
            Event::InitApply(o) | Event::Apply(o) => {
                slot.get_or_insert_with(HashSet::new).insert(key(o));
                false
            }
            Event::InitDone => {
                slot.get_or_insert_with(HashSet::new);
                false
            }
            Event::Delete(o) => {
                if let Some(set) = slot.as_mut() {
                    set.remove(&key(o));
                }
                true
            }
        }
    }

    /// Whether every resource listed and none has a draining object.
    fn none(&self) -> bool {
        self.listed
            .iter()
            .all(|l| l.as_ref().is_some_and(HashSet::is_empty))
    }
}

/// Whether an event should wake the ring: an object `left` while children wait (coalesced),
/// or nothing drains any more (at once).
fn wakes(left: bool, children: bool, none: bool) -> Wake {
    match (left, children, none) {
        (_, _, true) => Wake::Now,
        (true, true, false) => Wake::Coalesced,
        _ => Wake::No,
    }
}

/// What an event does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    No,
    Coalesced,
    Now,
}

/// Watches `selection` and sends `ring`'s name on `wake` when it matters ([`wakes`],
/// [`Coalesce`]). Ends when a watch is forbidden (the drain checks carry on without it) or
/// nobody takes the wakes any more.
async fn watch(
    client: Client,
    ring: RingId,
    selection: Selection,
    children: Arc<AtomicBool>,
    wake: mpsc::UnboundedSender<String>,
) {
    let config = watcher::Config::default().labels(&selection.drain);
    let watches = selection.resources.iter().enumerate().map(|(i, resource)| {
        let api = Api::<PartialObjectMeta<DynamicObject>>::all_with(client.clone(), resource);
        sharder_runtime::controller::wait_out_refusals(watcher::watcher(api, config.clone()))
            .default_backoff()
            .map(move |event| (i, event))
            .boxed()
    });
    let mut events = futures::stream::select_all(watches);
    let mut draining = Draining::new(selection.resources.len());
    // The ring is woken once when nothing drains any more, not at every relist after.
    let mut ended = false;
    let mut coalesce = Coalesce::default();
    loop {
        let quiet_until = coalesce.quiet_until;
        let wake_now = tokio::select! {
            event = events.next() => match event {
                None => return,
                Some((i, Ok(event))) => {
                    let left = draining.take(i, &event);
                    let none = draining.none();
                    let decided = wakes(left, children.load(Ordering::Relaxed), none && !ended);
                    ended = none;
                    match decided {
                        Wake::Now => true,
                        Wake::Coalesced => coalesce.left(Instant::now()),
                        Wake::No => false,
                    }
                }
                Some((_, Err(e))) if forbidden(&e) => {
                    warn!(%ring, error = %e, "cannot watch the draining objects; acknowledgements are seen at the drain checks");
                    return;
                }
                Some((_, Err(e))) => {
                    debug!(%ring, error = %e, "acknowledgement watch failed; it starts again");
                    false
                }
            },
            () = sleep_until(quiet_until), if quiet_until.is_some() => coalesce.quiet(Instant::now()),
        };
        if wake_now && wake.send(ring.name.clone()).is_err() {
            return;
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// Whether `error` is a refusal for want of permission.
fn forbidden(error: &watcher::Error) -> bool {
    matches!(
        error,
        watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            if s.code == 403
    ) || matches!(error, watcher::Error::WatchError(s) if s.code == 403)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str) -> PartialObjectMeta<DynamicObject> {
        PartialObjectMeta {
            types: None,
            metadata: kube::api::ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                ..Default::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    #[test]
    fn nothing_drains_once_every_resource_listed_and_each_drained_object_left() {
        let mut d = Draining::new(2);
        assert!(!d.none(), "nothing listed yet");
        assert!(!d.take(0, &Event::Init));
        assert!(!d.take(0, &Event::InitApply(object("a"))));
        assert!(!d.take(0, &Event::InitDone));
        assert!(!d.take(1, &Event::Init));
        assert!(!d.take(1, &Event::InitDone));
        assert!(!d.none(), "a drains");
        assert!(!d.take(1, &Event::Apply(object("b"))));
        assert!(d.take(0, &Event::Delete(object("a"))), "a left");
        assert!(!d.none(), "b drains");
        assert!(d.take(1, &Event::Delete(object("b"))));
        assert!(d.none());
        // A relist of resource 0: unlisted until its end.
        assert!(!d.take(0, &Event::Init));
        assert!(!d.none(), "relisting");
        assert!(!d.take(0, &Event::InitDone));
        assert!(d.none());
        assert!(!d.take(5, &Event::InitDone), "no such resource");
    }

    #[test]
    fn an_acknowledgement_wakes_the_ring_only_for_waiting_children_or_the_last_drain() {
        let cases = [
            // (left, children waiting, none draining any more) -> wake
            ((false, false, false), Wake::No),
            ((true, false, false), Wake::No),
            ((true, true, false), Wake::Coalesced),
            ((false, true, false), Wake::No),
            ((true, false, true), Wake::Now),
            ((false, false, true), Wake::Now),
            ((true, true, true), Wake::Now),
        ];
        for ((left, children, none), wake) in cases {
            assert_eq!(
                wakes(left, children, none),
                wake,
                "{left} {children} {none}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_acknowledgement_wakes_at_once_and_a_burst_once_more_after_the_quiet_time() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalesce::default();
        assert!(c.left(t0), "the first wakes at once");
        assert!(!c.left(t0 + ms(10)), "within the quiet time: held");
        assert!(!c.left(t0 + ms(200)));
        assert_eq!(c.quiet_until, Some(t0 + COALESCE));
        assert!(c.quiet(t0 + COALESCE), "held ones wake once at its end");
        assert_eq!(c.quiet_until, Some(t0 + COALESCE * 2), "and start another");
        assert!(!c.quiet(t0 + COALESCE * 2), "nothing held: no wake");
        assert_eq!(c.quiet_until, None, "quiet again");
        assert!(c.left(t0 + ms(5000)), "the next one wakes at once");
    }

    #[tokio::test(start_paused = true)]
    async fn an_acknowledgement_after_the_quiet_time_wakes_at_once() {
        let t0 = Instant::now();
        let mut c = Coalesce::default();
        assert!(c.left(t0));
        assert!(c.left(t0 + COALESCE), "the quiet time has passed");
    }

    #[test]
    fn only_a_forbidden_watch_ends_the_following() {
        let status = |code| {
            Box::new(kube::core::Status {
                code,
                ..Default::default()
            })
        };
        let cases = [
            (
                watcher::Error::InitialListFailed(kube::Error::Api(status(403))),
                true,
            ),
            (
                watcher::Error::WatchStartFailed(kube::Error::Api(status(403))),
                true,
            ),
            (watcher::Error::WatchError(status(403)), true),
            (
                watcher::Error::InitialListFailed(kube::Error::Api(status(500))),
                false,
            ),
            (watcher::Error::WatchError(status(410)), false),
            (watcher::Error::NoResourceVersion, false),
        ];
        for (error, expected) in cases {
            assert_eq!(forbidden(&error), expected, "{error:?}");
        }
    }
}
