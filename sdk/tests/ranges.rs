//! Shards of the SDK in range mode against a real kube-apiserver with the `ShardedListAndWatch`
//! gate and the reconciler: each shard reconciles only what its ranges select, a second shard
//! takes its share only after the first stopped serving it, and no object is reconciled while
//! another shard serves it; against an apiserver without the gate a shard serves nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ApiResource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use sharder_common::Ring;
use sharder_common::ranges::{RANGE_TOKENS_PER_SHARD, RangeKey, ShardSelector, assign_uids};
use sharder_harness::wait::eventually;
use sharder_harness::world::World;
use sharder_sdk::shard::{Shard, ShardReconcileError};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(40);

/// What the shards of a test share: every shard, and what each reconciled, and each time one
/// reconciled an object another shard served at that moment.
#[derive(Default)]
struct Seen {
    shards: Mutex<Vec<Shard>>,
    reconciled: Mutex<BTreeMap<String, BTreeSet<String>>>,
    double: Mutex<Vec<String>>,
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// Starts shard `name` in range mode by uid over the namespace's Secrets, reconciling with
/// [`record`]; returns it, its stop token and its task.
fn start_shard(
    world: &World,
    seen: &Arc<Seen>,
    name: &str,
) -> (Shard, CancellationToken, tokio::task::JoinHandle<()>) {
    let shard = Shard::new(world.client.clone(), world.id(), name);
    seen.shards.lock().expect("lock").push(shard.clone());
    let lease = shard.lease(&world.ns, Duration::from_secs(10), Duration::from_secs(1));
    let shutdown = CancellationToken::new();
    let (ns, me, seen) = (world.ns.clone(), shard.clone(), Arc::clone(seen));
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        let resources = vec![ApiResource::erase::<Secret>(&())];
        let controllers = |client: kube::Client, stop: CancellationToken| {
            let context = Arc::new((me.clone(), Arc::clone(&seen)));
            let api = Api::<Secret>::namespaced(client, &ns);
            let reconciler = me.reconciler(record);
            async move {
                Controller::new(api, watcher::Config::default())
                    .graceful_shutdown_on(stop.cancelled_owned())
                    .run(
                        reconciler,
                        |_, _: &ShardReconcileError<Never>, _| {
                            Action::requeue(Duration::from_secs(1))
                        },
                        context,
                    )
                    .for_each(|_| async {})
                    .await;
            }
        };
        let result = me
            .run_ranges(lease, &ns, RangeKey::Uid, resources, &stop, controllers)
            .await;
        assert!(result.is_ok(), "{result:?}");
    });
    (shard, shutdown, task)
}

/// The reconcile of the test's shards: records the object, and whether another shard served it
/// at that moment.
async fn record(secret: Arc<Secret>, ctx: Arc<(Shard, Arc<Seen>)>) -> Result<Action, Never> {
    let (me, seen) = (&ctx.0, &ctx.1);
    let uid = secret.uid().unwrap_or_default();
    let ns = secret.namespace();
    for other in seen.shards.lock().expect("lock").iter() {
        if other.name() != me.name()
            && other
                .serving()
                .is_some_and(|s| s.selects(&uid, ns.as_deref()))
        {
            seen.double.lock().expect("lock").push(format!(
                "{} reconciled by {} while {} served it",
                secret.name_any(),
                me.name(),
                other.name()
            ));
        }
    }
    seen.reconciled
        .lock()
        .expect("lock")
        .entry(me.name().to_owned())
        .or_default()
        .insert(secret.name_any());
    Ok(Action::await_change())
}

#[tokio::test(flavor = "multi_thread")]
async fn each_object_is_reconciled_by_the_shard_whose_ranges_hold_it_through_a_scale_out() {
    let world = World::new("sdk-ranges").await;
    world.create_ring().await;
    world.to_range_mode("uid", true).await;
    let flags = world.reconciler_flags(
        "replica-0",
        &world.ns,
        "https://127.0.0.1:9",
        Duration::from_secs(1),
    );
    let _reconciler = world
        .start_reconciler("reconciler", &world.admin_env(), &flags)
        .await;
    world.create_secrets(30).await;
    let secrets: BTreeMap<String, String> = world
        .list_secrets()
        .await
        .into_iter()
        .map(|(name, s)| (name, s.uid().unwrap_or_default()))
        .collect();
    let seen = Arc::new(Seen::default());
    let reconciled = |shard: &str| -> BTreeSet<String> {
        seen.reconciled
            .lock()
            .expect("lock")
            .get(shard)
            .cloned()
            .unwrap_or_default()
    };

    let (a, stop_a, run_a) = start_shard(&world, &seen, "shard-a");
    eventually("shard-a reconciled every Secret", WAIT, || async {
        let done = reconciled("shard-a");
        (done.len() == secrets.len()).then_some(()).ok_or(format!(
            "{} of {}",
            done.len(),
            secrets.len()
        ))
    })
    .await;

    let (b, stop_b, run_b) = start_shard(&world, &seen, "shard-b");
    let two = assign_uids(&Ring::with_tokens(
        ["shard-a", "shard-b"],
        RANGE_TOKENS_PER_SHARD,
    ));
    let share_of_b: BTreeSet<String> = secrets
        .iter()
        .filter(|(_, uid)| {
            ShardSelector::new(RangeKey::Uid, two["shard-b"].iter().copied()).selects(uid, None)
        })
        .map(|(name, _)| name.clone())
        .collect();
    assert!(!share_of_b.is_empty(), "shard-b's share holds Secrets");
    eventually(
        "shard-b reconciled its share, and only that",
        WAIT,
        || async {
            let done = reconciled("shard-b");
            (done == share_of_b)
                .then_some(())
                .ok_or(format!("{done:?}"))
        },
    )
    .await;
    assert_eq!(
        seen.double.lock().expect("lock").clone(),
        Vec::<String>::new()
    );
    assert_eq!(a.serving().map(|s| s.ranges), Some(two["shard-a"].clone()));
    assert_eq!(b.serving().map(|s| s.ranges), Some(two["shard-b"].clone()));
    assert_eq!(
        seen.double.lock().expect("lock").clone(),
        Vec::<String>::new()
    );
    assert_eq!(
        (a.out_of_range(), b.out_of_range()),
        (0, 0),
        "the apiserver selected"
    );

    stop_a.cancel();
    stop_b.cancel();
    run_a.await.expect("shard-a");
    run_b.await.expect("shard-b");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shard_against_an_apiserver_without_the_gate_serves_nothing() {
    use k8s_openapi::api::coordination::v1::Lease;
    use sharder_common::ranges::{ASSIGNED_ANNOTATION, EPOCH_ANNOTATION, Range, SERVED_ANNOTATION};
    use sharder_harness::ControlPlane;
    use sharder_harness::control_plane::Options;

    let cp = ControlPlane::dedicated(Options {
        without_sharded_list_and_watch: true,
        ..Options::default()
    })
    .await
    .expect("control plane");
    let ns = cp.namespace("sdk-gate-off").await.expect("namespace");
    let world = World::with_ring(cp, ns.clone(), "gate-off".into()).await;
    world.create_secrets(5).await;
    // Played reconciler: shard-a's Lease, free, assigned every range for the epoch the shard's
    // taking it begins (its leaseTransitions 0 -> 1).
    let everything = ShardSelector::new(RangeKey::Uid, [Range::ALL]).to_string();
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), &ns);
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some("shard-a".into()),
            labels: Some([(world.id().kind.lease_label().to_owned(), world.ring.clone())].into()),
            annotations: Some(
                [
                    (ASSIGNED_ANNOTATION.to_owned(), everything.clone()),
                    (EPOCH_ANNOTATION.to_owned(), "1".to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(10),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    };
    leases
        .create(&kube::api::PostParams::default(), &lease)
        .await
        .expect("lease");
    let seen = Arc::new(Seen::default());
    let (shard, stop, run) = start_shard(&world, &seen, "shard-a");
    // It answers with what it serves: nothing, as the apiserver would not select.
    eventually("shard-a says it serves nothing", WAIT, || async {
        let lease = leases.get("shard-a").await.map_err(|e| e.to_string())?;
        let annotations = lease.metadata.annotations.unwrap_or_default();
        let assigned = annotations.get(ASSIGNED_ANNOTATION) == Some(&everything);
        let served = annotations.get(SERVED_ANNOTATION).map(String::as_str);
        (assigned && served == Some(""))
            .then_some(())
            .ok_or(format!("assigned {assigned}, served {served:?}"))
    })
    .await;
    assert_eq!(shard.serving(), None);
    assert_eq!(
        seen.reconciled.lock().expect("lock").len(),
        0,
        "nothing reconciled"
    );
    stop.cancel();
    run.await.expect("shard-a");
}
