//! The shard SDK against a real kube-apiserver: the shard Lease follows the protocol, a lost Lease
//! stops the controllers at once, a graceful stop releases the Lease only after the controllers
//! finished, and drains are acknowledged under an optimistic lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use sharder_common::{RingId, RingKind};
use sharder_harness::world::{World, set_lease_holder};
use sharder_sdk::shard::{Shard, ShardError, ShardReconcileError};
use tokio_util::sync::CancellationToken;

/// Sets a flag when dropped: shows whether the controllers' future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_lost_lease_stops_the_controllers_at_once() {
    let world = World::new("shard-lost").await;
    let (client, ns) = (world.client.clone(), world.ns.clone());
    let shard = Shard::new(client.clone(), RingId::controller_ring("ring-a"), "shard-a");
    // A Lease long enough that a slow apiserver cannot lose it before the thief takes it; the
    // shard sees the theft at its next renewal, 200 ms later.
    let lease = shard.lease(&ns, Duration::from_secs(15), Duration::from_millis(200));
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(Arc::clone(&dropped));
    let shutdown = CancellationToken::new();

    let run = shard.run(lease, &shutdown, |_stop| async move {
        let _flag = flag;
        std::future::pending::<()>().await;
    });
    let thief = async {
        // Once the shard holds its Lease (protocol: named after the shard, held by its name,
        // labelled with the ring), someone else takes it.
        let held = loop {
            if let Ok(lease) = leases.get("shard-a").await {
                break lease;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            held.metadata.labels.as_ref().expect("labels")[RingKind::ControllerRing.lease_label()],
            "ring-a"
        );
        let spec = held.spec.clone().expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("shard-a"));
        assert!(
            !dropped.load(Ordering::SeqCst),
            "controllers run while the lease is held"
        );
        // The shard renews every 200 ms meanwhile.
        set_lease_holder(&leases, "shard-a", "shardlease-controller").await;
    };
    let (result, ()) = tokio::join!(tokio::time::timeout(Duration::from_secs(20), run), thief);
    let result = result.expect("run returns once the lease is lost");
    assert!(
        matches!(result, Err(ShardError::LeaseLost(ref name)) if name == "shard-a"),
        "{result:?}"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the controllers were dropped"
    );
}

#[tokio::test]
async fn a_graceful_stop_releases_the_lease_after_the_controllers_finished() {
    let world = World::new("shard-stop").await;
    let (client, ns) = (world.client.clone(), world.ns.clone());
    let shard = Shard::new(client.clone(), RingId::controller_ring("ring-b"), "shard-b");
    let lease = shard.lease(&ns, Duration::from_secs(10), Duration::from_millis(200));
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let shutdown = CancellationToken::new();
    let holder_when_finished = Arc::new(std::sync::Mutex::new(None));
    let seen = Arc::clone(&holder_when_finished);
    let leases_in = leases.clone();
    let trigger = shutdown.clone();

    let run = shard.run(lease, &shutdown, |stop| async move {
        trigger.cancel();
        stop.cancelled().await;
        // Still finishing in-flight work: the Lease must still be held.
        let lease = leases_in.get("shard-b").await.expect("lease");
        *seen.lock().expect("lock") = lease.spec.and_then(|s| s.holder_identity);
    });
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("run returns")
        .expect("graceful stop");
    assert_eq!(
        holder_when_finished.lock().expect("lock").as_deref(),
        Some("shard-b"),
        "held while the controllers finish"
    );
    let released = leases.get("shard-b").await.expect("lease");
    assert_eq!(
        released.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(""),
        "released afterwards"
    );
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

#[tokio::test]
async fn a_drain_is_acknowledged_under_an_optimistic_lock_instead_of_reconciled() {
    let world = World::new("shard-drain").await;
    let (client, ns) = (world.client.clone(), world.ns.clone());
    let shard = Shard::new(client.clone(), RingId::controller_ring("ring-c"), "shard-c");
    let labels = shard.labels().clone();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let create = |name: &str, drain: bool| {
        let mut l = std::collections::BTreeMap::from([
            (labels.shard.clone(), "shard-c".to_owned()),
            ("keep".to_owned(), "me".to_owned()),
        ]);
        if drain {
            l.insert(labels.drain.clone(), "true".to_owned());
        }
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(l),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        }
    };
    let reconciled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&reconciled);
    let mut wrapped = shard.reconciler(move |_: Arc<Secret>, _: Arc<()>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Never>(Action::await_change()) }
    });

    let draining = secrets
        .create(&PostParams::default(), &create("draining", true))
        .await
        .expect("create");
    wrapped(Arc::new(draining), Arc::new(()))
        .await
        .expect("acknowledged");
    let after = secrets.get("draining").await.expect("get");
    let l = after.metadata.labels.expect("labels");
    assert!(
        !l.contains_key(&labels.shard) && !l.contains_key(&labels.drain),
        "{l:?}"
    );
    assert_eq!(l["keep"], "me", "other labels stay");
    assert_eq!(
        reconciled.load(Ordering::SeqCst),
        0,
        "a draining object is not reconciled"
    );

    // A stale copy (the object changed since) is not acknowledged: 409, retried later.
    let stale = secrets
        .create(&PostParams::default(), &create("stale", true))
        .await
        .expect("create");
    let mut newer = stale.clone();
    newer.metadata.annotations = Some([("touched".to_owned(), "yes".to_owned())].into());
    secrets
        .replace("stale", &PostParams::default(), &newer)
        .await
        .expect("update");
    let result = wrapped(Arc::new(stale), Arc::new(())).await;
    assert!(
        matches!(result, Err(ShardReconcileError::Acknowledge { source: kube::Error::Api(ref s), .. }) if s.code == 409),
        "{result:?}"
    );
    let still = secrets.get("stale").await.expect("get");
    assert!(
        still
            .metadata
            .labels
            .expect("labels")
            .contains_key(&labels.drain)
    );

    // An assigned object without the drain label is reconciled.
    let mine = secrets
        .create(&PostParams::default(), &create("mine", false))
        .await
        .expect("create");
    wrapped(Arc::new(mine), Arc::new(()))
        .await
        .expect("reconciled");
    assert_eq!(reconciled.load(Ordering::SeqCst), 1);
}
