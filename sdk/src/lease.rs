//! A Lease keeper: acquire, renew and release one `coordination.k8s.io/v1` Lease.
//!
//! The same code serves leader election (the reconciler's Lease) and shard membership (a shard's
//! own Lease, named after the shard, labelled with its ring). Every write carries the Lease's
//! resourceVersion, so two candidates never both win.
//!
//! A held Lease is renewed every `renew_interval`. When no renewal has succeeded for
//! `duration - renew_interval` (before the Lease can expire and someone else take it over), or
//! someone else holds the Lease, the keeper cancels [`Held::lost`]: whatever runs under the Lease
//! must stop at once.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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

/// What one attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The Lease is held by us now.
    Held,
    /// Someone else holds the Lease (or won a race for it).
    HeldByOther,
}

/// Keeps one Lease.
#[derive(Clone)]
pub struct LeaseKeeper {
    api: Api<Lease>,
    config: LeaseConfig,
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
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

    /// One attempt: create the Lease, renew it if ours, or take it if released or expired.
    pub async fn try_acquire_or_renew(&self) -> Result<Attempt, LeaseError> {
        let now = Timestamp::now();
        let me = &self.config.identity;
        let existing = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.err(e))?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    labels: Some(self.config.labels.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(seconds(self.config.duration)),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Held),
                Err(e) if Self::is_conflict(&e) => Ok(Attempt::HeldByOther),
                Err(e) => Err(self.err(e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(renew), Some(d)) => renew.0 + SignedDuration::from_secs(i64::from(d)) <= now,
            _ => true,
        };
        if holder == *me {
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(seconds(self.config.duration));
        } else if holder.is_empty() || expired {
            spec.holder_identity = Some(me.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(seconds(self.config.duration));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        } else {
            return Ok(Attempt::HeldByOther);
        }
        let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.extend(self.config.labels.clone());
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Held),
            Err(e) if Self::is_conflict(&e) => Ok(Attempt::HeldByOther),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Waits until the Lease is held (retrying every `renew_interval`), then keeps renewing it
    /// in the background.
    pub async fn acquire(self, shutdown: &CancellationToken) -> Result<Held, LeaseError> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => break,
                Ok(Attempt::HeldByOther) => {}
                Err(e) => warn!(error = %e, "cannot acquire the lease yet"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return Err(LeaseError::Cancelled),
                () = tokio::time::sleep(self.config.renew_interval) => {}
            }
        }
        info!(lease = %self.config.name, namespace = %self.config.namespace, identity = %self.config.identity, "lease acquired");
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew(self.clone(), lost.clone(), stop.clone()));
        Ok(Held {
            keeper: self,
            lost,
            stop,
            task: Some(task),
        })
    }

    /// Releases the Lease if we hold it: empty holder, duration 1 s, so others may take it at
    /// once and the reconciler sees the shard dead without waiting for expiry.
    pub async fn release(&self) -> Result<(), LeaseError> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.err(e))?
        else {
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
            .await
            .map_err(|e| self.err(e))?;
        info!(lease = %self.config.name, namespace = %self.config.namespace, "lease released");
        Ok(())
    }
}

async fn renew(keeper: LeaseKeeper, lost: CancellationToken, stop: CancellationToken) {
    let deadline = keeper
        .config
        .duration
        .saturating_sub(keeper.config.renew_interval)
        .max(keeper.config.renew_interval);
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(keeper.config.renew_interval) => {}
        }
        match keeper.try_acquire_or_renew().await {
            Ok(Attempt::Held) => last_renewal = tokio::time::Instant::now(),
            Ok(Attempt::HeldByOther) => {
                warn!(lease = %keeper.config.name, "lease taken by someone else");
                lost.cancel();
                return;
            }
            Err(e) => {
                warn!(lease = %keeper.config.name, error = %e, "lease renewal failed");
                if last_renewal.elapsed() >= deadline {
                    warn!(lease = %keeper.config.name, "no renewal within the deadline, lease lost");
                    lost.cancel();
                    return;
                }
            }
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

    /// Stops renewing without releasing (a crash, as seen by others).
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
