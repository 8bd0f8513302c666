//! Drain acknowledgements as they happen (docs/design.md §2, step 1). While a ring's drain
//! checks are due, one metadata watch per main resource selects only the objects carrying its
//! drain label and wakes the ring as they leave it: at once while children wait for their
//! owners, otherwise once the acknowledgements pause. It keeps and lists no object (a list of
//! one tells whether any drains and from where to watch); the drain checks stay the fallback.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use kube::api::{ApiResource, DynamicObject, ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use sharder_common::{RingId, RingKind, Role};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::terms::Target;

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

    /// Follows `ring`'s acknowledgements (drain label `drain`) on the main resources of
    /// `targets`, unless its watches run for the same already.
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

    /// An object left the selection at `now` while no child waits: the ring is woken once the
    /// acknowledgements pause for [`COALESCE`].
    fn paused(&mut self, now: Instant) {
        self.pending = true;
        self.quiet_until = Some(now + COALESCE);
    }

    /// The quiet time ended at `now`: whether to wake the ring now (objects left meanwhile).
    fn quiet(&mut self, now: Instant) -> bool {
        let wake = std::mem::take(&mut self.pending);
        self.quiet_until = wake.then_some(now + COALESCE);
        wake
    }
}

/// What one resource's watch tells of its draining objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    /// Its list (at the watch's beginning) found objects draining, or none.
    Listed { empty: bool },
    /// An object began draining (or changed while it drains).
    Began,
    /// An object left the selection.
    Left,
}

/// Per resource of a ring, whether nothing drains there as its last list and events since tell.
#[derive(Debug, Default)]
struct Lists {
    empty: Vec<Option<bool>>,
}

/// What one signal tells of the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Nothing,
    /// An object left the selection.
    Left,
    /// Every resource's list found nothing draining, and nothing began since.
    NoneDraining,
}

impl Lists {
    fn new(resources: usize) -> Self {
        Self {
            empty: vec![None; resources],
        }
    }

    /// Takes `signal` of resource `i`.
    fn take(&mut self, i: usize, signal: Signal) -> Seen {
        let Some(empty) = self.empty.get_mut(i) else {
            return Seen::Nothing;
        };
        match signal {
            Signal::Listed { empty: none } => {
                *empty = Some(none);
                if self.empty.iter().all(|e| *e == Some(true)) {
                    return Seen::NoneDraining;
                }
            }
            Signal::Began => *empty = Some(false),
            Signal::Left => return Seen::Left,
        }
        Seen::Nothing
    }
}

/// What an event does, with or without `children` waiting for their owners.
fn wakes(seen: Seen, children: bool) -> Wake {
    match (seen, children) {
        (Seen::NoneDraining, _) => Wake::Now,
        (Seen::Left, true) => Wake::Coalesced,
        (Seen::Left, false) => Wake::Paused,
        (Seen::Nothing, _) => Wake::No,
    }
}

/// What an event does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    No,
    Coalesced,
    Paused,
    Now,
}

/// Watches `selection` and sends `ring`'s name on `wake` when it matters ([`wakes`],
/// [`Coalesce`]); ends when a watch is forbidden or nobody takes the wakes.
async fn watch(
    client: Client,
    ring: RingId,
    selection: Selection,
    children: Arc<AtomicBool>,
    wake: mpsc::UnboundedSender<String>,
) {
    let (signals, mut received) = mpsc::unbounded_channel();
    // One task per resource, aborted when this one ends (a JoinSet aborts its tasks when
    // dropped).
    let mut followers = tokio::task::JoinSet::new();
    for (i, resource) in selection.resources.iter().enumerate() {
        let api = Api::<DynamicObject>::all_with(client.clone(), resource);
        followers.spawn(follow(api, selection.drain.clone(), i, signals.clone()));
    }
    drop(signals);
    let mut lists = Lists::new(selection.resources.len());
    let mut coalesce = Coalesce::default();
    loop {
        let quiet_until = coalesce.quiet_until;
        let wake_now = tokio::select! {
            signal = received.recv() => match signal {
                None => return,
                Some((i, Ok(signal))) => {
                    match wakes(lists.take(i, signal), children.load(Ordering::Relaxed)) {
                        Wake::Now => true,
                        Wake::Coalesced => coalesce.left(Instant::now()),
                        Wake::Paused => {
                            coalesce.paused(Instant::now());
                            false
                        }
                        Wake::No => false,
                    }
                }
                Some((_, Err(e))) if forbidden(&e) => {
                    warn!(%ring, error = %e, "cannot watch the draining objects; acknowledgements are seen at the drain checks");
                    return;
                }
                Some((_, Err(e))) => {
                    debug!(%ring, error = %e, "acknowledgement watch failed; it begins again");
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

/// The longest wait before a failed list or watch of [`follow`] begins again.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Follows the objects of `api` carrying label `drain`, sending resource `i`'s [`Signal`]s and
/// errors on `signals`; begins again when its watch ends, after a backoff when it failed.
async fn follow(
    api: Api<DynamicObject>,
    drain: String,
    i: usize,
    signals: mpsc::UnboundedSender<(usize, Result<Signal, kube::Error>)>,
) {
    let mut retry = Duration::from_millis(500);
    loop {
        let failed = match watch_once(&api, &drain, i, &signals).await {
            Ok(()) => {
                retry = Duration::from_millis(500);
                None
            }
            Err(e) => Some(e),
        };
        if let Some(e) = failed {
            let pause = sharder_runtime::retry::retry_after(&e).unwrap_or(retry);
            if signals.send((i, Err(e))).is_err() {
                return;
            }
            tokio::time::sleep(pause).await;
            retry = (retry * 2).min(MAX_RETRY);
        }
        if signals.is_closed() {
            return;
        }
    }
}

/// One list of one object and the watch from its version, until the watch ends.
async fn watch_once(
    api: &Api<DynamicObject>,
    drain: &str,
    i: usize,
    signals: &mpsc::UnboundedSender<(usize, Result<Signal, kube::Error>)>,
) -> Result<(), kube::Error> {
    let list = api
        .list_metadata(&ListParams::default().labels(drain).limit(1))
        .await?;
    let empty = list.items.is_empty();
    let version = list.metadata.resource_version.unwrap_or_default();
    let _ = signals.send((i, Ok(Signal::Listed { empty })));
    let params = WatchParams::default().labels(drain);
    let mut events = std::pin::pin!(api.watch_metadata(&params, &version).await?);
    while let Some(event) = events.next().await {
        let signal = match event? {
            WatchEvent::Added(_) | WatchEvent::Modified(_) => Signal::Began,
            WatchEvent::Deleted(_) => Signal::Left,
            WatchEvent::Bookmark(_) => continue,
            // Mostly 410 Gone: the version is too old; begin again.
            WatchEvent::Error(status) => return Err(kube::Error::Api(status)),
        };
        if signals.send((i, Ok(signal))).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// Whether `error` is a refusal for want of permission.
fn forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 403)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_drains_when_every_resource_s_list_found_nothing_and_nothing_began_since() {
        let listed = |empty| Signal::Listed { empty };
        let mut l = Lists::new(2);
        assert_eq!(
            l.take(0, listed(true)),
            Seen::Nothing,
            "resource 1 unlisted"
        );
        assert_eq!(l.take(1, listed(false)), Seen::Nothing, "resource 1 drains");
        assert_eq!(l.take(1, Signal::Left), Seen::Left);
        // Its watch begins again with a list that finds nothing: nothing drains anywhere.
        assert_eq!(l.take(1, listed(true)), Seen::NoneDraining);
        // An object begins draining: a list of the other resource alone tells nothing.
        assert_eq!(l.take(1, Signal::Began), Seen::Nothing);
        assert_eq!(l.take(0, listed(true)), Seen::Nothing);
        assert_eq!(l.take(5, listed(true)), Seen::Nothing, "no such resource");
    }

    #[test]
    fn an_acknowledgement_wakes_the_ring_at_once_for_waiting_children_else_once_they_pause() {
        let cases = [
            ((Seen::Nothing, false), Wake::No),
            ((Seen::Nothing, true), Wake::No),
            ((Seen::Left, true), Wake::Coalesced),
            ((Seen::Left, false), Wake::Paused),
            ((Seen::NoneDraining, false), Wake::Now),
            ((Seen::NoneDraining, true), Wake::Now),
        ];
        for ((seen, children), wake) in cases {
            assert_eq!(wakes(seen, children), wake, "{seen:?} {children}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_waiting_children_the_ring_wakes_once_the_acknowledgements_pause() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalesce::default();
        c.paused(t0);
        c.paused(t0 + ms(200));
        assert_eq!(
            c.quiet_until,
            Some(t0 + ms(200) + COALESCE),
            "each pushes it back"
        );
        assert!(c.quiet(t0 + ms(200) + COALESCE), "then one wake");
        assert!(!c.quiet(t0 + ms(200) + COALESCE * 2));
        assert_eq!(c.quiet_until, None);
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
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            }))
        };
        assert!(forbidden(&status(403)));
        for code in [401, 410, 429, 500] {
            assert!(!forbidden(&status(code)), "{code}");
        }
        assert!(!forbidden(&kube::Error::Service("timed out".into())));
    }
}
