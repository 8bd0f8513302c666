//! Running kube-runtime controllers so that they stop when asked, and say when their watch
//! listed.
//!
//! A controller started with `graceful_shutdown_on(stop)` waits for its reconciles in flight
//! once `stop` is cancelled. In kube-runtime 5 its runner first waits for the store to be ready
//! (the main watch's first list), and keeps waiting after a shutdown was asked for: the watch
//! is no longer polled then, so a controller stopped before its first list would never end (a
//! process SIGTERMed right after it started would hang until it is killed, its Lease not
//! released). Nothing has been reconciled before that list (the runner starts only once the
//! store is ready), so [`drive`] drops such a controller at once; one that listed is left to
//! finish its reconciles.
//!
//! The listed state comes from the watch stream itself ([`listed_controller`]):
//! kube-runtime's `Store::wait_until_ready` wakes one waiter only, and the runner is already
//! one, so nothing else may wait on (or poll) a controller's store readiness.
//!
//! A relist (after the watch fell too far behind, as every watch does when the apiserver
//! restarts: 410 Gone) is different in kube-runtime 5: the relisted objects trigger reconciles
//! as they arrive, but the store takes the new list only at its end, so those reconciles read
//! the objects as they were before the watch broke (or miss them: "not found in local store"),
//! and nothing triggers them again once the store is current. Objects drained while the watch
//! was down would never be acknowledged. So relisted
//! objects trigger nothing as they arrive; every object of the store is reconciled once the
//! relist is complete (`after_a_relist_every_object_is_reconciled_as_relisted` below).
//!
//! While the apiserver is down (a restart, an upgrade), every watch is refused its connection,
//! and right after it came back, a watch of a resource whose watch cache still initialises is
//! answered 429 with a Retry-After. kube-runtime backs off on each such error, doubling up to
//! 30 s, so a watch would come back long after the apiserver. The watches here connect again
//! every second while the connection is refused, as client-go's reflector does, and wait as
//! long as a 429's Retry-After says ([`watch`]); other errors keep the backoff.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt as _;
use kube::Api;
use kube::runtime::controller::Controller;
use kube::runtime::{reflector, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Whether a controller's main watch has listed once. Any number of tasks may wait on it.
#[derive(Clone, Debug)]
pub struct Listed(watch::Receiver<bool>);

/// The writing side of a [`Listed`]: what a watch stream reports its first list to.
#[derive(Debug)]
pub struct ListedSender(watch::Sender<bool>);

impl Listed {
    /// A [`Listed`] and the sender that marks it listed.
    pub fn channel() -> (ListedSender, Self) {
        let (tx, rx) = watch::channel(false);
        (ListedSender(tx), Self(rx))
    }

    /// Whether the watch has listed.
    pub fn is_listed(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until the watch listed; `false` if it ended before.
    pub async fn wait(mut self) -> bool {
        self.0.wait_for(|listed| *listed).await.is_ok()
    }
}

impl ListedSender {
    /// Whether the watch has listed.
    pub fn is_listed(&self) -> bool {
        *self.0.borrow()
    }

    /// Marks the watch listed; whether it had listed before (this is a relist).
    pub fn listed(&self) -> bool {
        self.0.send_replace(true)
    }
}

/// A controller over `api` (objects selected by `config`) whose main watch says when it
/// listed. Secondary watches (`owns`, `watches`) are added to it as to any controller.
pub fn listed_controller<K>(api: Api<K>, config: watcher::Config) -> (Controller<K>, Listed)
where
    K: Clone + kube::Resource<DynamicType = ()> + DeserializeOwned + Debug + Send + Sync + 'static,
{
    listed_controller_with(api, config, ())
}

/// The same for a resource known at run time (`dyntype`, e.g. the [`kube::core::ApiResource`] of
/// a `DynamicObject`).
pub fn listed_controller_with<K>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
) -> (Controller<K>, Listed)
where
    K: Clone + kube::Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Debug + Unpin + Send + Sync,
{
    controller_over(watch(api, config), dyntype)
}

/// The controller of [`listed_controller_with`] over `events`, a watcher's stream.
fn controller_over<K>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    dyntype: K::DynamicType,
) -> (Controller<K>, Listed)
where
    K: Clone + kube::Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Debug + Unpin + Send + Sync,
{
    let writer = reflector::store::Writer::new(dyntype.clone());
    let store = writer.as_reader();
    let (sender, listed) = Listed::channel();
    let (relisted_tx, relisted_rx) = futures::channel::mpsc::unbounded::<()>();
    let stream = reflector::reflector(writer, events).filter_map(move |event| {
        let object = match event {
            Ok(watcher::Event::Apply(object)) => Some(Ok(object)),
            // The first list: the runner waits for the store, so these read it current.
            Ok(watcher::Event::InitApply(object)) if !sender.is_listed() => Some(Ok(object)),
            Ok(watcher::Event::InitDone) => {
                if sender.listed() {
                    let _ = relisted_tx.unbounded_send(());
                }
                None
            }
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        };
        std::future::ready(object)
    });
    (
        kube_runtime::Controller::for_stream_with(stream, store, dyntype)
            // After a relist, every object again, now that the store holds the new list.
            .reconcile_all_on(relisted_rx),
        listed,
    )
}

/// kube-runtime's watch of `api` (objects selected by `config`) that rides out an apiserver's
/// restart ([`wait_out_refusals`]). Use it for a controller's secondary watches too
/// (`owns_stream(watch(api, config).touched_objects())`): a controller backs off once for all
/// its watches, so one watch's errors delay every other.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    wait_out_refusals(watcher::watcher(api, config))
}

/// How long a watch waits before it connects again after its connection was refused.
pub const REFUSED_RETRY: Duration = Duration::from_secs(1);

/// Whether `error` (or an error it was caused by) is a refused TCP connection: nothing listens
/// at the apiserver's address, as while it restarts.
pub fn is_connection_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        next = error.source();
    }
    false
}

/// How long a watch waits out `error` before it tries again, if it is a refusal for now: a
/// refused connection ([`REFUSED_RETRY`]) or an answer with a Retry-After
/// ([`crate::retry::watch_retry_after`]). `None`: an error for the backoff.
pub fn pause_for(error: &watcher::Error) -> Option<Duration> {
    if is_connection_refused(error) {
        return Some(REFUSED_RETRY);
    }
    crate::retry::watch_retry_after(error)
}

/// `events` (a watcher's stream) with refusals waited out ([`pause_for`]) instead of passed on:
/// the first of a run is logged, and a backoff after the stream (a controller's, or
/// `default_backoff`) does not grow while the apiserver is away or asks to wait. Any other
/// error is passed on.
pub fn wait_out_refusals<T: Send>(
    events: impl futures::Stream<Item = Result<T, watcher::Error>> + Send,
) -> impl futures::Stream<Item = Result<T, watcher::Error>> + Send {
    let mut refused = false;
    events.filter_map(move |event| {
        let pause = match &event {
            Err(e) => pause_for(e),
            Ok(_) => None,
        };
        match (&event, pause) {
            (Err(e), Some(pause)) => {
                if !std::mem::replace(&mut refused, true) {
                    warn!(error = %e, wait_ms = pause.as_millis(), "the apiserver refused the watch for now: trying again after the wait");
                }
            }
            (Ok(_), _) => refused = false,
            (Err(_), None) => {}
        }
        async move {
            match pause {
                Some(pause) => {
                    tokio::time::sleep(pause).await;
                    None
                }
                None => Some(event),
            }
        }
    })
}

/// Drives `running` (a controller's `run(..)` stream consumed to its end, started with
/// `graceful_shutdown_on(stop)`) until it ends. Once `stop` is cancelled while the controller's
/// main watch (`listed`) has not listed yet, `running` is dropped at once instead (see the
/// module docs): nothing of it was reconciled.
pub async fn drive(running: impl Future<Output = ()>, listed: &Listed, stop: &CancellationToken) {
    let stopped_unlisted = async {
        stop.cancelled().await;
        if listed.is_listed() {
            // Its reconciles finish first: `running` ends by itself.
            std::future::pending::<()>().await;
        }
    };
    // `running` is polled first: the listed state it set is the one looked at, and nothing
    // starts between the look and the drop.
    tokio::select! {
        biased;
        () = running => {}
        () = stopped_unlisted => debug!("controller stopped before its watch listed"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::controller::Action;
    use tokio::sync::mpsc::UnboundedSender;

    use super::*;

    /// A controller whose main watch never lists: its trigger stream holds the store's writer
    /// (as a reflector does) and yields nothing, so the runner is held until a readiness that
    /// never comes.
    fn unlisted_controller() -> Controller<ConfigMap> {
        let (store, writer) = reflector::store::<ConfigMap>();
        let trigger =
            futures::stream::pending::<Result<ConfigMap, watcher::Error>>().map(move |object| {
                let _held = &writer;
                object
            });
        kube_runtime::Controller::for_stream(trigger, store)
    }

    async fn count(_: Arc<ConfigMap>, calls: Arc<AtomicUsize>) -> Result<Action, std::io::Error> {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(Action::await_change())
    }

    fn running(
        controller: Controller<ConfigMap>,
        stop: CancellationToken,
        calls: Arc<AtomicUsize>,
    ) -> impl Future<Output = ()> {
        controller
            .graceful_shutdown_on(stop.cancelled_owned())
            .run(count, |_, _, _| Action::await_change(), calls)
            .for_each(|_| async {})
    }

    #[tokio::test(start_paused = true)]
    async fn a_controller_stopped_before_its_watch_listed_ends_at_once() {
        let stop = CancellationToken::new();
        let (_sender, listed) = Listed::channel();
        let calls = Arc::new(AtomicUsize::new(0));
        let controller = unlisted_controller();
        let driven = tokio::spawn({
            let stop = stop.clone();
            let running = running(controller, stop.clone(), calls.clone());
            async move { drive(running, &listed, &stop).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), driven)
            .await
            .expect("ends once stopped")
            .expect("task");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn kube_runtime_alone_keeps_an_unlisted_controller_waiting_after_a_stop() {
        // The behaviour `drive` works around; if kube-runtime fixes it, this test says so.
        let stop = CancellationToken::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let controller = unlisted_controller();
        let running = running(controller, stop.clone(), calls);
        stop.cancel();
        assert!(
            tokio::time::timeout(Duration::from_secs(60), running)
                .await
                .is_err(),
            "kube-runtime now ends an unlisted controller on a graceful stop: drive's workaround can go"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_listed_controller_is_left_to_end_by_itself() {
        let stop = CancellationToken::new();
        let (sender, listed) = Listed::channel();
        sender.listed();
        let ended = Arc::new(AtomicUsize::new(0));
        let running = {
            let ended = ended.clone();
            let stop = stop.clone();
            async move {
                stop.cancelled().await;
                // Reconciles in flight finishing.
                tokio::time::sleep(Duration::from_secs(5)).await;
                ended.fetch_add(1, Ordering::SeqCst);
            }
        };
        stop.cancel();
        drive(running, &listed, &stop).await;
        assert_eq!(ended.load(Ordering::SeqCst), 1, "waited for the reconciles");
    }

    /// ConfigMap `object` at version `v` (in its data).
    fn at_version(v: &str) -> ConfigMap {
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("object".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            data: Some([("v".to_owned(), v.to_owned())].into()),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_relist_every_object_is_reconciled_as_relisted() {
        let (events, stream) = futures::channel::mpsc::unbounded();
        let (controller, _) = controller_over(stream.map(Ok), ());
        // Each reconcile sends the version it read.
        let (read, mut reads) = tokio::sync::mpsc::unbounded_channel::<String>();
        let reconcile = |object: Arc<ConfigMap>, read: Arc<UnboundedSender<String>>| async move {
            let v = object.data.as_ref().and_then(|d| d.get("v")).cloned();
            let _ = read.send(v.unwrap_or_default());
            Ok::<_, std::io::Error>(Action::await_change())
        };
        let running = controller
            .run(reconcile, |_, _, _| Action::await_change(), Arc::new(read))
            .for_each(|_| async {});
        let _running = tokio::spawn(running);
        let send = |event| events.unbounded_send(event).expect("the stream is read");
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(at_version("1")));
        send(watcher::Event::InitDone);
        let first = tokio::time::timeout(Duration::from_secs(60), reads.recv()).await;
        assert_eq!(first.ok().flatten().as_deref(), Some("1"));
        // The watch fell behind (410 Gone) and lists again; the object changed meanwhile (a
        // drain written while the apiserver was away).
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(at_version("2")));
        // Time moves on only once nothing else can run: a reconcile the relisted object
        // triggered has run by then, reading the store as it was before the relist.
        tokio::time::sleep(Duration::from_secs(1)).await;
        send(watcher::Event::InitDone);
        let next = tokio::time::timeout(Duration::from_secs(60), reads.recv()).await;
        assert_eq!(
            next.ok().flatten().as_deref(),
            Some("2"),
            "the next reconcile after the relist reads the relisted object"
        );
    }

    fn refused() -> watcher::Error {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        watcher::Error::WatchStartFailed(kube::Error::Service(Box::new(io)))
    }

    #[tokio::test]
    async fn a_watch_refused_its_connection_says_so_through_its_error_sources() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let mut events = std::pin::pin!(watcher::watcher(
            Api::<ConfigMap>::all(client),
            watcher::Config::default()
        ));
        // `Init` comes first, then the list's error.
        let error = loop {
            if let Err(e) = events.next().await.expect("an event") {
                break e;
            }
        };
        assert!(is_connection_refused(&error), "{error:?}");
        assert!(!is_connection_refused(&watcher::Error::NoResourceVersion));
    }

    fn busy(retry_after_seconds: u32) -> watcher::Error {
        let status = serde_json::json!({
            "code": 429,
            "status": "Failure",
            "details": { "retryAfterSeconds": retry_after_seconds },
        });
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
            serde_json::from_value(status).expect("a Status"),
        )))
    }

    #[test]
    fn a_watch_waits_out_refused_connections_and_retry_afters_and_nothing_else() {
        let cases = [
            (refused(), Some(REFUSED_RETRY)),
            (busy(3), Some(Duration::from_secs(3))),
            (busy(0), None),
            (watcher::Error::NoResourceVersion, None),
        ];
        for (error, pause) in cases {
            assert_eq!(pause_for(&error), pause, "{error:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_are_waited_out_as_told_and_other_errors_passed_on() {
        let started = tokio::time::Instant::now();
        let events = futures::stream::iter([
            Err(refused()),
            Err(busy(3)),
            Err(refused()),
            Err(watcher::Error::NoResourceVersion),
            Ok(1),
        ]);
        let out: Vec<_> = wait_out_refusals(events).collect().await;
        assert!(
            matches!(
                out.as_slice(),
                [Err(watcher::Error::NoResourceVersion), Ok(1)]
            ),
            "{out:?}"
        );
        assert_eq!(
            started.elapsed(),
            2 * REFUSED_RETRY + Duration::from_secs(3)
        );
    }
}
