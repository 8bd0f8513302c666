//! A Lease keeper: acquire, renew and release one `coordination.k8s.io/v1` Lease, and [`hold`]:
//! run work only while holding it.
//!
//! The same code serves leader election (the reconciler's Lease) and shard membership (a shard's
//! own Lease, named after the shard, labelled with its ring). Every write carries the Lease's
//! resourceVersion, so two candidates never both win. A renewal is one write on the Lease as
//! this keeper last wrote it; only a Lease changed since is read again.
//!
//! What an attempt writes is a pure function of the Lease as found ([`plan`]). A held Lease is
//! renewed every `renew_interval`. When no renewal has succeeded within [`renewal_deadline`]
//! (before the Lease can expire and someone else take it over; a timer, so a renewal that hangs
//! does not delay it), or someone else holds the Lease, the keeper cancels [`Held::lost`]:
//! whatever runs under the Lease must stop at once.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// What Lease to keep and how.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// Holder identity written when holding it.
    pub identity: String,
    /// `leaseDurationSeconds`: how long the Lease is valid after a renewal.
    pub duration: Duration,
    /// How often a held Lease is renewed (and how often a candidate retries).
    pub renew_interval: Duration,
    /// Labels the Lease must carry (for example the ring label of a shard Lease).
    pub labels: BTreeMap<String, String>,
}

/// Errors of the lease keeper.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// A request about the Lease failed.
    #[error("lease {namespace}/{name}: {source}")]
    Api {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// The failure.
        #[source]
        source: kube::Error,
    },
    /// Shutdown was requested before the Lease was acquired.
    #[error("shutdown before the lease was acquired")]
    Cancelled,
}

/// The exit status of a binary whose Lease was lost (the leader's or a shard's): it stopped its
/// work at once and asks to be started again, as a standby or a new shard. Any other failure
/// exits with 1.
pub const LEASE_LOST_EXIT_STATUS: u8 = 3;

/// How many times one attempt reads the Lease again after its write lost a race (409).
pub const CONFLICT_REREADS: usize = 3;

/// What one attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The Lease is held by us now.
    Held,
    /// Someone else holds the Lease (read after any race for it).
    HeldByOther,
}

/// What an attempt writes, decided from the Lease as found.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// No Lease yet: create it with this spec.
    Create(LeaseSpec),
    /// We hold it: renew it (same holder, new renewTime).
    Renew(LeaseSpec),
    /// It is released (empty holder) or expired: take it (new holder, one more transition).
    Take(LeaseSpec),
    /// Someone else holds it and it has not expired: leave it.
    HeldByOther,
}

/// What an attempt by `identity` at `now` writes to a Lease whose spec is `existing` (`None`:
/// the Lease does not exist). A Lease held by `identity` is renewed even when it has expired
/// (a restarted holder with a stable identity takes its own Lease back at once); a Lease
/// without renewTime or duration counts as expired.
pub fn plan(
    existing: Option<&LeaseSpec>,
    identity: &str,
    duration: Duration,
    now: Timestamp,
) -> Plan {
    let seconds = lease_seconds(duration);
    let Some(current) = existing else {
        return Plan::Create(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        });
    };
    let holder = current.holder_identity.as_deref().unwrap_or_default();
    let expired = match (&current.renew_time, current.lease_duration_seconds) {
        (Some(renew), Some(d)) => renew.0 + SignedDuration::from_secs(i64::from(d)) <= now,
        _ => true,
    };
    if holder == identity {
        Plan::Renew(LeaseSpec {
            renew_time: Some(MicroTime(now)),
            lease_duration_seconds: Some(seconds),
            ..current.clone()
        })
    } else if holder.is_empty() || expired {
        Plan::Take(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_duration_seconds: Some(seconds),
            lease_transitions: Some(current.lease_transitions.unwrap_or(0).saturating_add(1)),
            ..current.clone()
        })
    } else {
        Plan::HeldByOther
    }
}

/// How long renewals may fail before the Lease counts as lost: `duration - renew_interval`
/// (at least one interval), so whatever runs under it stops before anyone else can take it.
/// The deadline runs from the start of the last successful renewal (its renewTime is no earlier)
/// and is kept by a timer, whatever an attempt in flight is doing: a request that hangs (a
/// partitioned network) does not hold the verdict back.
pub fn renewal_deadline(duration: Duration, renew_interval: Duration) -> Duration {
    duration.saturating_sub(renew_interval).max(renew_interval)
}

/// `leaseDurationSeconds` for `duration`: whole seconds, at least one.
fn lease_seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// Keeps one Lease.
#[derive(Clone)]
pub struct LeaseKeeper {
    api: Api<Lease>,
    config: LeaseConfig,
}

impl LeaseKeeper {
    /// A keeper of the Lease described by `config`.
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    fn err(&self, source: kube::Error) -> LeaseError {
        LeaseError::Api {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source,
        }
    }

    fn is_conflict(e: &kube::Error) -> bool {
        matches!(e, kube::Error::Api(s) if s.code == 409)
    }

    /// One attempt: create the Lease, renew it if ours, or take it if released or expired
    /// (see [`plan`]).
    ///
    /// A write that loses a race (409: the Lease changed since it was read) does not decide
    /// anything by itself: the writer may be another candidate, or only someone writing the
    /// Lease's labels (the shard lease controller's state label on a shard Lease). The Lease is
    /// read and planned again, up to [`CONFLICT_REREADS`] times; what it then shows decides.
    /// Still racing after that, the attempt fails (the renewal loop retries until its deadline).
    pub async fn try_acquire_or_renew(&self) -> Result<Attempt, LeaseError> {
        self.attempt(None).await.map(|(attempt, _)| attempt)
    }

    /// An attempt that starts from `known`, the Lease as this keeper last wrote it: a renewal
    /// is written on it at once, one request (as client-go's leader election does), and only
    /// a Lease that changed since (409) or is gone (404) is read and planned again. Returns
    /// the Lease as written, if this attempt wrote it.
    async fn attempt(&self, known: Option<Lease>) -> Result<(Attempt, Option<Lease>), LeaseError> {
        if let Some(lease) = known {
            match self.renew_known(lease).await {
                Ok(Some(written)) => return Ok((Attempt::Held, Some(written))),
                Ok(None) => {}
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        self.rereading(|| self.read_plan_write()).await
    }

    /// Runs `read_and_write` (a read of the Lease and a write on it) again while its write
    /// loses a race (409), up to [`CONFLICT_REREADS`] more times.
    async fn rereading<T, Fut>(&self, read_and_write: impl Fn() -> Fut) -> Result<T, LeaseError>
    where
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let mut rereads = 0;
        loop {
            match read_and_write().await {
                Err(e) if Self::is_conflict(&e) && rereads < CONFLICT_REREADS => rereads += 1,
                result => return result.map_err(|e| self.err(e)),
            }
        }
    }

    /// Renews `lease` without reading it first, if [`plan`] renews it as it was last written
    /// (it does while it names us; `None` otherwise). The write carries its resourceVersion.
    async fn renew_known(&self, mut lease: Lease) -> Result<Option<Lease>, kube::Error> {
        let planned = plan(
            lease.spec.as_ref(),
            &self.config.identity,
            self.config.duration,
            Timestamp::now(),
        );
        let Plan::Renew(spec) = planned else {
            return Ok(None);
        };
        lease.spec = Some(spec);
        self.api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
            .map(Some)
    }

    /// One read of the Lease, its [`plan`], and the write it asks for; returns the Lease as
    /// written.
    async fn read_plan_write(&self) -> Result<(Attempt, Option<Lease>), kube::Error> {
        let existing = self.api.get_opt(&self.config.name).await?;
        let planned = plan(
            existing.as_ref().and_then(|l| l.spec.as_ref()),
            &self.config.identity,
            self.config.duration,
            Timestamp::now(),
        );
        let written = match (planned, existing) {
            (Plan::HeldByOther, _) => return Ok((Attempt::HeldByOther, None)),
            (Plan::Create(spec), _) | (Plan::Renew(spec) | Plan::Take(spec), None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        labels: Some(self.config.labels.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await?
            }
            (Plan::Renew(spec) | Plan::Take(spec), Some(mut lease)) => {
                lease.spec = Some(spec);
                lease
                    .metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .extend(self.config.labels.clone());
                self.api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await?
            }
        };
        Ok((Attempt::Held, Some(written)))
    }

    /// Waits until the Lease is held (retrying every `renew_interval`), then keeps renewing it
    /// in the background.
    pub async fn acquire(self, shutdown: &CancellationToken) -> Result<Held, LeaseError> {
        let (renewed_at, written) = loop {
            let started = Instant::now();
            match self.attempt(None).await {
                Ok((Attempt::Held, written)) => break (started, written),
                Ok((Attempt::HeldByOther, _)) => {}
                Err(e) => warn!(error = %e, "cannot acquire the lease yet"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return Err(LeaseError::Cancelled),
                () = tokio::time::sleep(self.config.renew_interval) => {}
            }
        };
        info!(lease = %self.config.name, namespace = %self.config.namespace, identity = %self.config.identity, "lease acquired");
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew(
            self.clone(),
            (renewed_at, written),
            lost.clone(),
            stop.clone(),
        ));
        Ok(Held {
            keeper: self,
            lost,
            stop,
            task: Some(task),
        })
    }

    /// Releases the Lease if we hold it: empty holder, duration 1 s, so others may take it at
    /// once and the reconciler sees the shard dead without waiting for expiry. A release that
    /// loses a race (the shard lease controller wrote its state label between the read and the
    /// write) reads the Lease again, as [`try_acquire_or_renew`](Self::try_acquire_or_renew)
    /// does.
    pub async fn release(&self) -> Result<(), LeaseError> {
        self.rereading(|| self.release_once()).await
    }

    /// One read of the Lease and, if we hold it, the write releasing it.
    async fn release_once(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        self.api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await?;
        info!(lease = %self.config.name, namespace = %self.config.namespace, "lease released");
        Ok(())
    }
}

/// Renews the Lease every `renew_interval` until `stop`, each time from the Lease as last
/// written (`written` first); cancels `lost` (and returns) when someone else holds it, or when
/// no renewal started within [`renewal_deadline`] of the one started at `renewed_at` has
/// succeeded, an attempt in flight included.
async fn renew(
    keeper: LeaseKeeper,
    (mut renewed_at, mut written): (Instant, Option<Lease>),
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let config = &keeper.config;
    // The whole seconds the Lease says (see `lease_seconds`), not the configured fraction.
    let deadline = renewal_deadline(
        Duration::from_secs(config.duration.as_secs().max(1)),
        config.renew_interval,
    );
    let lose = |why: &str| {
        warn!(lease = %config.name, deadline = ?deadline, "lease lost: {why}");
        lost.cancel();
    };
    loop {
        let lost_at = renewed_at + deadline;
        tokio::select! {
            () = stop.cancelled() => return,
            () = sleep_until(lost_at) => return lose("not renewed within the deadline"),
            () = tokio::time::sleep(config.renew_interval) => {}
        }
        let started = Instant::now();
        let attempt = tokio::select! {
            () = stop.cancelled() => return,
            () = sleep_until(lost_at) => {
                return lose("not renewed within the deadline (a renewal is still unanswered)");
            }
            attempt = keeper.attempt(written.take()) => attempt,
        };
        match attempt {
            Ok((Attempt::Held, lease)) => (renewed_at, written) = (started, lease),
            Ok((Attempt::HeldByOther, _)) => return lose("held by someone else"),
            Err(e) => warn!(lease = %config.name, error = %e, "lease renewal failed"),
        }
    }
}

/// A held Lease, renewed in the background until released, abandoned, dropped (renewal stops,
/// like a crash) or lost.
pub struct Held {
    keeper: LeaseKeeper,
    lost: CancellationToken,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Held {
    /// Cancelled when the Lease is lost: stop everything that runs under it at once.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Stops renewing and releases the Lease (graceful shutdown).
    pub async fn release(mut self) -> Result<(), LeaseError> {
        self.stop_renewing().await;
        if self.lost.is_cancelled() {
            return Ok(());
        }
        self.keeper.release().await
    }

    /// Stops renewing without releasing: the Lease runs out after its duration, unless the
    /// same identity takes it again first (a restart with a stable identity). To others it
    /// looks like a crash.
    pub async fn abandon(mut self) {
        self.stop_renewing().await;
    }

    async fn stop_renewing(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Held {
    /// Dropped without release (e.g. its task aborted): renewal stops, the Lease expires.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What [`hold`] does with the Lease when the work under it has stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnStop {
    /// Release it: others may take it at once (a shard's objects move to other shards at once;
    /// a standby leader takes over at once).
    #[default]
    Release,
    /// Stop renewing but do not release: the Lease runs out after its duration, unless the same
    /// identity takes it again first. For stable identities (a StatefulSet's pod names): a
    /// restart within the duration keeps the shard's objects where they are.
    Keep,
}

/// What the work under a Lease is given.
#[derive(Clone, Debug)]
pub struct Holding {
    /// Cancelled when the work should stop gracefully (shutdown requested). The Lease is held
    /// until the work returns.
    pub stop: CancellationToken,
    /// Cancelled when the Lease is lost; the work is dropped at that moment too.
    pub lost: CancellationToken,
}

/// Why work under a Lease ended other than by a requested stop.
#[derive(Debug, thiserror::Error)]
pub enum HoldError<E> {
    /// The Lease could not be acquired or released.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The Lease was lost (not renewed in time, or taken over): the work was dropped at once.
    #[error("lease {0} lost: work stopped at once")]
    Lost(String),
    /// The work failed; the Lease was handled as on a stop.
    #[error("{0}")]
    Work(E),
    /// The work returned without being asked to stop; the Lease was handled as on a stop.
    #[error("the work under lease {0} ended without being asked to stop")]
    Ended(String),
}

/// Runs `work` only while holding the Lease of `keeper`: waits for it (returning `Ok` if
/// `shutdown` comes first), runs the work while renewing, and
/// - on `shutdown`, cancels [`Holding::stop`], waits for the work to return, then releases or
///   keeps the Lease as `on_stop` says: `Ok`;
/// - when the Lease is lost, drops the work at once: [`HoldError::Lost`];
/// - when the work fails or returns by itself, handles the Lease as on a stop and reports it
///   ([`HoldError::Work`], [`HoldError::Ended`]): a supervised process then exits.
///
/// The one helper behind the reconciler's leader election and a shard's membership.
pub async fn hold<F, Fut, E>(
    keeper: LeaseKeeper,
    shutdown: &CancellationToken,
    on_stop: OnStop,
    work: F,
) -> Result<(), HoldError<E>>
where
    F: FnOnce(Holding) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    let name = keeper.config.name.clone();
    let held = match keeper.acquire(shutdown).await {
        Ok(held) => held,
        Err(LeaseError::Cancelled) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let holding = Holding {
        stop: CancellationToken::new(),
        lost: held.lost(),
    };
    let lost = held.lost();
    let stop = holding.stop.clone();
    let running = work(holding);
    tokio::pin!(running);
    let outcome = loop {
        tokio::select! {
            result = &mut running => break result,
            () = lost.cancelled() => {
                error!(lease = %name, "lease lost, work stopped at once");
                return Err(HoldError::Lost(name));
            }
            () = shutdown.cancelled(), if !stop.is_cancelled() => {
                info!(lease = %name, "stopping the work under the lease");
                stop.cancel();
            }
        }
    };
    let result = match outcome {
        Ok(()) if stop.is_cancelled() => Ok(()),
        Ok(()) => Err(HoldError::Ended(name.clone())),
        Err(e) => {
            error!(lease = %name, error = %e, "the work under the lease failed");
            Err(HoldError::Work(e))
        }
    };
    match on_stop {
        OnStop::Release => held.release().await?,
        OnStop::Keep => {
            held.abandon().await;
            info!(lease = %name, "lease kept: not renewed any more, not released");
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_700_000_000;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(T0 + seconds).expect("valid")
    }

    fn spec(holder: &str, renewed: i64, seconds: i32, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(at(renewed))),
            acquire_time: Some(MicroTime(at(renewed))),
            lease_duration_seconds: Some(seconds),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    const TEN: Duration = Duration::from_secs(10);

    #[test]
    fn a_missing_lease_is_created_with_no_transitions() {
        assert_eq!(
            plan(None, "me", TEN, at(0)),
            Plan::Create(spec("me", 0, 10, 0))
        );
    }

    #[test]
    fn our_own_lease_is_renewed_even_after_it_expired() {
        for renewed in [-5, -100] {
            let current = spec("me", renewed, 10, 3);
            let Plan::Renew(next) = plan(Some(&current), "me", TEN, at(0)) else {
                panic!("renewed at T0{renewed:+} must be renewed");
            };
            assert_eq!(next.renew_time, Some(MicroTime(at(0))));
            assert_eq!(next.acquire_time, current.acquire_time, "not re-acquired");
            assert_eq!(next.lease_transitions, Some(3), "no transition");
        }
    }

    #[test]
    fn a_released_or_expired_lease_is_taken_with_one_more_transition() {
        let table = [
            spec("", -1, 1, 2),
            spec("other", -10, 10, 2),
            spec("other", -30, 10, 2),
            LeaseSpec {
                holder_identity: Some("other".into()),
                lease_transitions: Some(2),
                ..LeaseSpec::default()
            },
        ];
        for current in table {
            let Plan::Take(next) = plan(Some(&current), "me", TEN, at(0)) else {
                panic!("{current:?} must be taken");
            };
            assert_eq!(next.holder_identity.as_deref(), Some("me"));
            assert_eq!(next.acquire_time, Some(MicroTime(at(0))));
            assert_eq!(next.lease_duration_seconds, Some(10));
            assert_eq!(next.lease_transitions, Some(3));
        }
    }

    #[test]
    fn a_lease_held_by_someone_else_until_it_expires_is_left_alone() {
        let current = spec("other", -9, 10, 0);
        assert_eq!(plan(Some(&current), "me", TEN, at(0)), Plan::HeldByOther);
        assert!(matches!(
            plan(Some(&current), "me", TEN, at(1)),
            Plan::Take(_)
        ));
    }

    /// A keeper of Lease `ns/l` as `me` talking to a mock apiserver, and the Lease as the
    /// apiserver holds it at resourceVersion `rv`.
    mod mock {
        use super::*;
        use http::{Method, Request, Response};
        use kube::client::Body;

        pub(super) type Apiserver = tower_test::mock::Handle<Request<Body>, Response<Body>>;
        const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l";

        pub(super) fn keeper() -> (LeaseKeeper, Apiserver) {
            let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
            let config = LeaseConfig {
                namespace: "ns".into(),
                name: "l".into(),
                identity: "me".into(),
                duration: Duration::from_secs(10),
                renew_interval: Duration::from_secs(1),
                labels: [("app".to_owned(), "test".to_owned())].into(),
            };
            (
                LeaseKeeper::new(Client::new(service, "default"), config),
                handle,
            )
        }

        pub(super) fn lease(rv: &str) -> Lease {
            Lease {
                metadata: ObjectMeta {
                    name: Some("l".into()),
                    namespace: Some("ns".into()),
                    resource_version: Some(rv.into()),
                    labels: Some([("app".to_owned(), "test".to_owned())].into()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec("me", 0, 10, 1)),
            }
        }

        fn json(status: u16, body: Vec<u8>) -> Response<Body> {
            Response::builder()
                .status(status)
                .body(Body::from(body))
                .expect("response")
        }

        /// Answers a GET of the Lease with `found`.
        pub(super) async fn get(handle: &mut Apiserver, found: &Lease) {
            let (request, respond) = handle.next_request().await.expect("a request");
            assert_eq!(
                (request.method(), request.uri().path()),
                (&Method::GET, PATH)
            );
            respond.send_response(json(200, serde_json::to_vec(found).expect("json")));
        }

        /// Answers a PUT of the Lease at `rv`: as written at `rv + 1`, or a conflict
        /// (`status` 409). Returns what was sent.
        pub(super) async fn put(handle: &mut Apiserver, rv: &str, status: u16) -> Lease {
            let (request, respond) = handle.next_request().await.expect("a request");
            assert_eq!(
                (request.method(), request.uri().path()),
                (&Method::PUT, PATH)
            );
            let body = request.into_body().collect_bytes().await.expect("body");
            let mut sent: Lease = serde_json::from_slice(&body).expect("a Lease");
            assert_eq!(sent.metadata.resource_version.as_deref(), Some(rv));
            if status == 409 {
                let conflict = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                    "status": "Failure", "reason": "Conflict", "code": 409,
                    "message": "the object has been modified"});
                respond.send_response(json(409, conflict.to_string().into_bytes()));
            } else {
                let next = rv.parse::<u32>().expect("a number") + 1;
                sent.metadata.resource_version = Some(next.to_string());
                respond.send_response(json(200, serde_json::to_vec(&sent).expect("json")));
            }
            sent
        }
    }

    #[tokio::test]
    async fn a_renewal_is_one_write_on_the_lease_as_last_written_and_a_conflict_reads_it_again() {
        let (keeper, mut handle) = mock::keeper();
        let renewed = |sent: Lease| {
            let spec = sent.spec.expect("spec");
            assert_eq!(spec.holder_identity.as_deref(), Some("me"));
            assert!(spec.renew_time.expect("renewTime").0 > at(0));
        };
        let apiserver = tokio::spawn(async move {
            // A renewal from the Lease as last written: one PUT, nothing read.
            renewed(mock::put(&mut handle, "7", 200).await);
            // The next from what that PUT returned; the Lease changed since (a label write).
            mock::put(&mut handle, "8", 409).await;
            mock::get(&mut handle, &mock::lease("9")).await;
            renewed(mock::put(&mut handle, "9", 200).await);
        });
        let (attempt, written) = keeper
            .attempt(Some(mock::lease("7")))
            .await
            .expect("renewed");
        assert_eq!(attempt, Attempt::Held);
        let written = written.expect("the Lease as written");
        assert_eq!(written.metadata.resource_version.as_deref(), Some("8"));
        let (attempt, written) = keeper.attempt(Some(written)).await.expect("renewed");
        assert_eq!(attempt, Attempt::Held);
        assert_eq!(
            written.and_then(|l| l.metadata.resource_version).as_deref(),
            Some("10")
        );
        apiserver
            .await
            .expect("one write a renewal; a read only after a conflict");
    }

    #[tokio::test]
    async fn a_release_that_meets_a_label_write_reads_the_lease_again_and_releases_it() {
        let (keeper, mut handle) = mock::keeper();
        let apiserver = tokio::spawn(async move {
            mock::get(&mut handle, &mock::lease("5")).await;
            // The shard lease controller wrote its state label between the read and the write.
            mock::put(&mut handle, "5", 409).await;
            mock::get(&mut handle, &mock::lease("6")).await;
            let sent = mock::put(&mut handle, "6", 200).await.spec.expect("spec");
            assert_eq!(sent.holder_identity.as_deref(), Some(""));
            assert_eq!(sent.lease_duration_seconds, Some(1));
        });
        keeper.release().await.expect("released");
        apiserver
            .await
            .expect("the release written on the Lease read again");
    }

    #[test]
    fn the_renewal_deadline_ends_before_the_lease_can_expire() {
        let s = Duration::from_secs;
        assert_eq!(renewal_deadline(s(15), s(5)), s(10));
        assert_eq!(
            renewal_deadline(s(3), Duration::from_millis(500)),
            Duration::from_millis(2500)
        );
        assert_eq!(renewal_deadline(s(2), s(2)), s(2), "at least one interval");
    }
}
