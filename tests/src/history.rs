//! The observed history of a test namespace's sharded objects: every version of its Secrets
//! (owners) and of the ConfigMaps they control (children), from metadata-only watches, with the
//! time each was seen. The ownership checks read it: how long objects stayed unassigned, and
//! whether children ever ran ahead of their owners ([`crate::ownership::check_handover`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use sharder_common::RingLabels;
use tokio::task::JoinHandle;

use crate::ownership::Version;
use crate::system::unix_nanos;

type Versions = Arc<Mutex<Vec<Version>>>;

/// Watches that record every version; stop when dropped.
pub struct History {
    versions: Versions,
    tasks: Vec<JoinHandle<()>>,
}

impl History {
    /// Starts watching the Secrets of `ns` (but probes) and the ConfigMaps of `ns` that have
    /// a controller, reading shard and drain labels with `labels`.
    pub fn start(client: &Client, ns: &str, labels: &RingLabels) -> Self {
        let versions = Versions::default();
        let tasks = vec![
            tokio::spawn(record::<Secret>(
                Api::namespaced(client.clone(), ns),
                labels.clone(),
                Arc::clone(&versions),
                |meta, _| !meta.name_any().starts_with("probe-"),
            )),
            tokio::spawn(record::<ConfigMap>(
                Api::namespaced(client.clone(), ns),
                labels.clone(),
                Arc::clone(&versions),
                |_, owner| owner.is_some(),
            )),
        ];
        Self { versions, tasks }
    }

    /// Every version seen so far.
    pub fn versions(&self) -> Vec<Version> {
        self.versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The longest time any object stayed unassigned (seen without a shard label until it was
    /// labelled or deleted), up to `now` for objects still unassigned.
    pub fn longest_unassigned(&self, now: u128) -> Duration {
        let mut since: BTreeMap<String, u128> = BTreeMap::new();
        let mut longest = 0u128;
        let mut versions = self.versions();
        versions.sort_by_key(|v| v.rv);
        for v in versions {
            if v.shard.is_none() && !v.deleted {
                since.entry(v.object).or_insert(v.t);
            } else if let Some(start) = since.remove(&v.object) {
                longest = longest.max(v.t.saturating_sub(start));
            }
        }
        for start in since.values() {
            longest = longest.max(now.saturating_sub(*start));
        }
        Duration::from_nanos(u64::try_from(longest).unwrap_or(u64::MAX))
    }
}

impl Drop for History {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn record<K>(
    api: Api<PartialObjectMeta<K>>,
    labels: RingLabels,
    versions: Versions,
    keep: fn(&PartialObjectMeta<K>, Option<&String>) -> bool,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
    while let Some(event) = events.next().await {
        let (object, deleted) = match event {
            Ok(Event::Apply(o) | Event::InitApply(o)) => (o, false),
            Ok(Event::Delete(o)) => (o, true),
            Ok(Event::Init | Event::InitDone) => continue,
            // Connecting again at once (a backoff would leave gaps in the history after an
            // apiserver restart, seen as children ahead of their owners), but yielding: a watch
            // whose client is already gone (the test ending) fails without waiting, and a task
            // that never yields is never aborted, holding the test's runtime at its shutdown.
            Err(_) => {
                tokio::task::yield_now().await;
                continue;
            }
        };
        let namespace = object.namespace().unwrap_or_default();
        let owner = object
            .owner_references()
            .iter()
            .find(|r| r.controller == Some(true))
            .map(|r| format!("{namespace}/{}", r.name));
        if !keep(&object, owner.as_ref()) {
            continue;
        }
        let Some(rv) = object
            .resource_version()
            .and_then(|rv| rv.parse::<u64>().ok())
        else {
            continue;
        };
        let version = Version {
            rv,
            t: unix_nanos(),
            object: format!("{namespace}/{}", object.name_any()),
            owner,
            shard: labels.shard_of(object.labels()).map(str::to_owned),
            draining: labels.is_draining(object.labels()),
            deleted,
        };
        versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(version);
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use kube::client::Body;

    use super::*;

    #[test]
    fn a_history_whose_client_is_gone_lets_its_runtime_stop() {
        // As at a test's end: the client's connection is gone before the history's watches are
        // aborted, and each watch request fails at once. A watch that never yields keeps its
        // worker (and this thread) busy for good, so the runtime lives in a thread of its own.
        let (stopped, stop) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
                drop(handle);
                let client = Client::new(service, "default");
                let labels = sharder_common::RingId::cluster_ring("ring").labels();
                let history = History::start(&client, "ns", &labels);
                tokio::time::sleep(Duration::from_millis(200)).await;
                drop(history);
            });
            drop(runtime);
            let _ = stopped.send(());
        });
        assert!(
            stop.recv_timeout(Duration::from_secs(20)).is_ok(),
            "the runtime did not stop: a watch task never yields to its abort"
        );
    }
}
