//! Faults real clusters have, with the ownership and handover checkers running: a zombie shard
//! (alive, its Lease renewals refused), a shard cut off from the apiserver by a partition that
//! heals, a webhook that accepts connections and never answers, the apiserver or etcd killed
//! and started again in the middle of a rebalance, an apiserver whose watch cache answers 429
//! after a restart, and an apiserver refusing writes (429) through a scale-out: by its in-flight
//! limit, and by API Priority and Fairness for the reconciler alone.
//!
//! What each case showed (the margin a lost shard stops before its Lease expires, how late its
//! Lease is taken over, the cost of a hung webhook per CREATE) is printed for the notes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::DeleteParams;
use sharder_harness::control_plane::{AuditMark, Part};
use sharder_harness::fixtures::rule;
use sharder_harness::launch::Env;
use sharder_harness::proxy::Proxy;
use sharder_harness::wait::{eventually, metric_sum, metric_value};
use sharder_runtime::lease::LEASE_LOST_EXIT_STATUS;
use sharder_tests::system::{
    Objects, Options, RECONCILER_ACCOUNT, SHARD_ACCOUNT, System, WAIT, unix_nanos,
};

/// The lost shard's Lease: its duration and renew interval are the SDK's defaults scaled down
/// (15 s / 2 s), keeping the default margin of one renew interval between the renewal deadline
/// and the Lease's expiry.
const LEASE: Duration = Duration::from_secs(6);
const RENEW: Duration = Duration::from_secs(2);

/// The overloaded apiserver's `--max-mutating-requests-inflight` (its default is 200).
const MUTATING_IN_FLIGHT: u32 = 8;

/// Updates every Secret of `names` in turn until stopped, so the shards keep reconciling.
fn churn(objects: Objects, names: Vec<String>) -> (Arc<AtomicBool>, tokio::task::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let task = tokio::spawn(async move {
        let mut version = 0;
        while !stopped.load(Ordering::Relaxed) {
            for name in &names {
                version += 1;
                let _ = objects.update_secret(name, &format!("v{version}")).await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (stop, task)
}

/// Polls Lease `name` every 50 ms until stopped; every spec seen, in order.
fn watch_lease(
    system: &System,
    name: &str,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<Vec<LeaseSpec>>) {
    let leases = system.leases();
    let name = name.to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let task = tokio::spawn(async move {
        let mut seen: Vec<LeaseSpec> = Vec::new();
        while !stopped.load(Ordering::Relaxed) {
            if let Ok(lease) = leases.get(&name).await {
                let spec = lease.spec.unwrap_or_default();
                if seen.last() != Some(&spec) {
                    seen.push(spec);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    });
    (stop, task)
}

/// When the last renewal by `holder` among `specs` expires.
fn expiry_of_last_renewal(specs: &[LeaseSpec], holder: &str) -> Timestamp {
    let last = specs
        .iter()
        .rev()
        .find(|s| s.holder_identity.as_deref() == Some(holder))
        .expect("a renewal by the holder was seen");
    last.renew_time.as_ref().expect("renewTime").0
        + SignedDuration::from_secs(i64::from(last.lease_duration_seconds.expect("duration")))
}

/// A write request by one user, as the audit log shows it.
struct Request {
    /// When the apiserver received it.
    at: Timestamp,
    /// The answer's status code.
    code: u64,
    /// Verb, resource and name.
    what: String,
}

/// The write requests `user` made after `mark` (answered, refused ones included).
fn requests_of(system: &System, user: &str, mark: AuditMark) -> Vec<Request> {
    system
        .cp
        .audited_requests_since(mark)
        .into_iter()
        .filter(|e| e["user"]["username"] == user)
        .map(|e| Request {
            at: e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<Timestamp>().ok())
                .expect("an audit timestamp"),
            code: e["responseStatus"]["code"].as_u64().unwrap_or_default(),
            what: format!(
                "{} {}/{}",
                e["verb"].as_str().unwrap_or_default(),
                e["objectRef"]["resource"].as_str().unwrap_or_default(),
                e["objectRef"]["name"].as_str().unwrap_or_default()
            ),
        })
        .collect()
}

/// Seconds from `a` to `b` (negative if `b` is earlier).
fn seconds(a: Timestamp, b: Timestamp) -> f64 {
    b.duration_since(a).as_secs_f64()
}

/// Creates Secrets `object-0` .. `object-<n-1>`, `at_once` at a time.
async fn create_at_once(system: &System, n: usize, at_once: usize) {
    let objects = system.objects();
    futures::stream::iter(0..n)
        .map(|i| {
            let objects = objects.clone();
            async move {
                objects
                    .create_secret(&format!("object-{i}"), &format!("{i}-0"))
                    .await
                    .expect("create");
            }
        })
        .buffer_unordered(at_once)
        .collect::<Vec<()>>()
        .await;
}

/// Starts a system with two ordinary shards.
async fn two_shards(prefix: &str) -> System {
    System::start(
        prefix,
        Options {
            shards: 2,
            ..Options::default()
        },
    )
    .await
}

/// Starts `lost` in `env` with the case's Lease (again, when it rejoins: as its pod would be
/// restarted).
async fn start_lost(system: &mut System, lost: &str, env: &Env) {
    let mut flags = system.shard_flags(lost);
    flags.lease_duration = LEASE;
    flags.lease_renew = RENEW;
    system.start_shard_as(flags, env).await;
}

/// The shard `lost` is cut off by `cut` while objects change: it must give its Lease up before
/// the Lease expires (and exit, to be restarted), write nothing after that, and its objects
/// must move to the others; `heal` undoes the fault. Returns the audit mark taken before the
/// cut and when its last Lease renewal expired.
async fn lose<Cut, Heal>(
    system: &mut System,
    lost: &str,
    user: &str,
    cut: Cut,
    heal: Heal,
) -> (AuditMark, Timestamp)
where
    Cut: AsyncFnOnce(),
    Heal: AsyncFnOnce(),
{
    let names: Vec<String> = (0..30).map(|i| format!("object-{i}")).collect();
    system.create_secrets(0..30).await;
    system
        .wait_converged("objects spread over three shards")
        .await;
    let held = system
        .holdings()
        .await
        .get(lost)
        .copied()
        .unwrap_or_default();
    assert!(held > 0, "{lost} holds no object to lose");

    let (stop_churn, churning) = churn(system.objects(), names);
    let (stop_watch, watching) = watch_lease(system, lost);
    tokio::time::sleep(RENEW).await; // Reconciles by the shard are under way.
    let mark = system.audit_mark();
    let cut_at = Timestamp::now();
    cut().await;
    let status = system.wait_shard_exit(lost, 3 * LEASE).await;
    let gone = Timestamp::now();
    assert_eq!(
        status.code(),
        Some(i32::from(LEASE_LOST_EXIT_STATUS)),
        "{lost} exited {status} after losing its Lease"
    );
    eventually("the lost shard leaves the ring", WAIT, || async {
        let ring = system.desired_ring().await;
        match ring.shards().iter().any(|s| s == lost) {
            true => Err(ring.shards().to_vec()),
            false => Ok(()),
        }
    })
    .await;
    stop_churn.store(true, Ordering::Relaxed);
    churning.await.expect("churn");
    system
        .wait_converged("the lost shard's objects moved")
        .await;
    stop_watch.store(true, Ordering::Relaxed);
    let specs = watching.await.expect("lease watch");
    let expired = expiry_of_last_renewal(&specs, lost);
    let taken = specs
        .iter()
        .rev()
        .find(|s| s.holder_identity.as_deref() != Some(lost))
        .and_then(|s| s.acquire_time.as_ref().map(|t| t.0));
    heal().await;

    assert!(
        gone < expired,
        "{lost} was still running {:.2} s after its Lease expired",
        seconds(expired, gone)
    );
    let writes: Vec<Request> = requests_of(system, user, mark)
        .into_iter()
        .filter(|r| r.code < 300)
        .collect();
    let late: Vec<&Request> = writes.iter().filter(|r| r.at >= expired).collect();
    assert!(
        late.is_empty(),
        "{lost} wrote after its Lease expired: {:?}",
        late.iter().map(|r| &r.what).collect::<Vec<_>>()
    );
    let last_write = writes.last().map(|r| r.at);
    let report = system.assert_single_ownership();
    eprintln!(
        "{lost}: held {held} objects; cut at {cut_at}; gone {:.2} s before its Lease expired \
         ({:.2} s after the cut); last write {} s before expiry; Lease taken over {} s after \
         expiry; {} reconciles, 0 overlaps",
        seconds(gone, expired),
        seconds(cut_at, gone),
        last_write.map_or("(none)".to_owned(), |w| format!(
            "{:.2}",
            seconds(w, expired)
        )),
        taken.map_or("(not seen)".to_owned(), |t| format!(
            "{:.2}",
            seconds(expired, t)
        )),
        report.total()
    );
    (mark, expired)
}

/// Restarts `lost` in `env` and checks it rejoins: objects come back to it through drains and
/// the ownership invariant holds over the whole run.
async fn rejoin(system: &mut System, lost: &str, env: &Env) {
    start_lost(system, lost, env).await;
    system.wait_converged("the shard rejoined").await;
    let back = system
        .holdings()
        .await
        .get(lost)
        .copied()
        .unwrap_or_default();
    assert!(back > 0, "no object came back to {lost}");
    system.assert_single_ownership();
    eprintln!("{lost} rejoined: {back} objects back");
}

#[tokio::test]
async fn a_zombie_shard_stops_before_its_lease_expires_and_its_objects_move_away_and_back() {
    const ZOMBIE: &str = "zombie";
    let mut system = two_shards("zombie").await;
    let renewals_binding = format!("zombie-renewals-{}", system.ns);
    // Everything the shard needs on the namespace's objects and Leases, with Lease updates (its
    // renewals) in a binding of their own that the test takes away.
    let all = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    let objects = vec![
        rule("", &["secrets", "configmaps"], &all),
        rule(
            "coordination.k8s.io",
            &["leases"],
            &["get", "list", "watch", "create"],
        ),
    ];
    let renewals = vec![rule(
        "coordination.k8s.io",
        &["leases"],
        &["update", "patch"],
    )];
    system
        .grant(&format!("zombie-objects-{}", system.ns), ZOMBIE, objects)
        .await;
    system
        .grant(&renewals_binding, ZOMBIE, renewals.clone())
        .await;
    let env = system.restricted_env(ZOMBIE).await;
    start_lost(&mut system, ZOMBIE, &env).await;

    let user = system.service_account(ZOMBIE);
    let bindings: Api<ClusterRoleBinding> = Api::all(system.client.clone());
    lose(
        &mut system,
        ZOMBIE,
        &user,
        async || {
            bindings
                .delete(&renewals_binding, &DeleteParams::default())
                .await
                .expect("revoke renewals");
        },
        async || {},
    )
    .await;

    let refused = system.log(ZOMBIE).matches("lease renewal failed").count();
    assert!(refused > 0, "the zombie's renewals were not refused");
    system.grant(&renewals_binding, ZOMBIE, renewals).await;
    rejoin(&mut system, ZOMBIE, &env).await;
}

#[tokio::test]
async fn a_partitioned_shard_stops_in_time_and_nothing_it_sent_lands_stale_after_the_heal() {
    const CUT_OFF: &str = "cut-off";
    let mut system = two_shards("partition").await;
    let cp = system.cp;
    let apiserver = cp.url().trim_start_matches("https://");
    let network = Proxy::to(apiserver.parse().expect("the apiserver's address"))
        .await
        .expect("proxy");
    let token = cp
        .cluster_admin_token(&system.ns, CUT_OFF)
        .await
        .expect("token");
    let kubeconfig = system.dir().join("kubeconfig-cut-off");
    std::fs::write(
        &kubeconfig,
        cp.kubeconfig_yaml(&token)
            .replace(cp.url(), &format!("https://{}", network.addr())),
    )
    .expect("kubeconfig");
    let env = Env::new(system.dir(), &kubeconfig);
    start_lost(&mut system, CUT_OFF, &env).await;

    let user = system.service_account(CUT_OFF);
    let partitioned = Instant::now();
    let (mark, expired) = lose(
        &mut system,
        CUT_OFF,
        &user,
        async || network.blackhole(true),
        // Longer than twice the Lease, then heal: what the shard sent meanwhile arrives now.
        async || {
            let heal_at = partitioned + 2 * LEASE + RENEW;
            tokio::time::sleep_until(heal_at.into()).await;
            network.blackhole(false);
        },
    )
    .await;

    // Whatever arrives after the heal came from a process whose Lease expired: optimistic
    // locking must refuse every write of it. Its Lease renewals at least were sent into the
    // partition: the proxy delivers them, and holds the exited process's end of stream until
    // the apiserver answered them.
    eventually("the cut-off shard's connections end", WAIT, || async {
        match network.connections() {
            0 => Ok(()),
            open => Err(open),
        }
    })
    .await;
    let arrived = network.late_answers();
    assert!(
        arrived > 0,
        "no request of the cut-off shard arrived after the heal: nothing below was put to the test"
    );
    let lease = system.leases().get_opt(CUT_OFF).await.expect("its Lease");
    let holder = lease.and_then(|l| l.spec?.holder_identity);
    assert_ne!(
        holder.as_deref(),
        Some(CUT_OFF),
        "a renewal sent into the partition took the Lease back after the heal"
    );
    let late: Vec<Request> = requests_of(&system, &user, mark)
        .into_iter()
        .filter(|r| r.at >= expired)
        .collect();
    let described: Vec<String> = late
        .iter()
        .map(|r| format!("{} {}", r.what, r.code))
        .collect();
    assert!(
        late.iter().all(|r| r.code >= 400),
        "a write sent before the partition landed after the Lease expired: {described:?}"
    );
    eprintln!(
        "{CUT_OFF}: {arrived} requests answered after the heal; audited writes that arrived after \
         its Lease expired (refused): {described:?}"
    );
    rejoin(&mut system, CUT_OFF, &env).await;
}

#[tokio::test]
async fn a_hung_webhook_costs_each_create_its_timeout_and_the_sweep_assigns_what_it_missed() {
    let system = two_shards("hung-webhook").await;
    let created = |name: String| {
        let objects = system.objects();
        async move {
            let started = Instant::now();
            let secret = objects.create_secret(&name, "0").await.expect("create");
            (started.elapsed(), secret)
        }
    };
    let mut answered = Vec::new();
    for i in 0..5 {
        let (took, secret) = created(format!("answered-{i}")).await;
        assert!(system.shard_of(&secret).is_some(), "the webhook assigns");
        answered.push(took);
    }

    // The webhook's Service accepts the apiserver's connections and never answers.
    system.blackhole_webhooks(true);
    let hung = futures::future::join_all((0..3).map(|i| created(format!("hung-{i}")))).await;
    for (_, secret) in &hung {
        assert_eq!(
            system.shard_of(secret),
            None,
            "created without the webhook's answer (failurePolicy Ignore)"
        );
    }
    system
        .wait_until_all_assigned("the sweep assigns what the webhook missed")
        .await;
    system.blackhole_webhooks(false);
    let (_, secret) = created("after".to_owned()).await;
    assert!(
        system.shard_of(&secret).is_some(),
        "the healed webhook assigns again"
    );
    system.wait_converged("every object reconciled").await;
    system.assert_single_ownership();
    let hung: Vec<Duration> = hung.into_iter().map(|(took, _)| took).collect();
    eprintln!("CREATE took {answered:?} with the webhook answering, {hung:?} with it hung");
    // The apiserver waits the ring's webhook out once per CREATE, neither less nor again.
    let timeout = webhook_timeout(&system).await;
    for took in &hung {
        assert!(
            *took >= timeout && *took <= timeout + HUNG_CREATE_MARGIN,
            "a CREATE with the webhook hung took {took:?}, its timeoutSeconds being {timeout:?}"
        );
    }
}

/// What a CREATE may take beyond the webhook's `timeoutSeconds` on a busy machine: less than
/// the 5 s timeout the reconciler sets by default, so a second wait of it shows.
const HUNG_CREATE_MARGIN: Duration = Duration::from_secs(4);

/// The `timeoutSeconds` of the webhook configuration the reconciler keeps for `system`'s ring.
async fn webhook_timeout(system: &System) -> Duration {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    let configurations = Api::<MutatingWebhookConfiguration>::all(system.client.clone())
        .list(&Default::default())
        .await
        .expect("the webhook configurations");
    let seconds = configurations
        .items
        .iter()
        .filter(|c| {
            c.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.name == system.ring)
        })
        .flat_map(|c| c.webhooks.iter().flatten())
        .find_map(|w| w.timeout_seconds)
        .expect("the ring's webhook configuration with a timeoutSeconds");
    Duration::from_secs(u64::try_from(seconds).expect("a positive timeoutSeconds"))
}

#[tokio::test]
async fn an_apiserver_restart_mid_rebalance_needs_no_component_restart_and_the_rebalance_completes()
{
    restart_mid_rebalance(Part::Apiserver).await;
}

#[tokio::test]
async fn an_etcd_restart_mid_rebalance_needs_no_component_restart_and_the_rebalance_completes() {
    restart_mid_rebalance(Part::Etcd).await;
}

/// 1,000 objects on two shards, a third joins, and `part` of the control plane is stopped for
/// 10 s once the rebalance has begun: it completes without any component restarting, within
/// [`restart_recovery`] of the return.
async fn restart_mid_rebalance(part: Part) {
    const OBJECTS: usize = 1000;
    const PLACED: Duration = Duration::from_secs(180);
    const SWEEP: Duration = Duration::from_secs(90);
    // The reconciler's drains, at most this many a second, take several seconds for the third
    // shard's share: the stop comes while most of them are still to be written, or unseen by
    // the shards whose watches it breaks.
    const WRITES_PER_SECOND: u32 = 50;
    let cp = sharder_harness::ControlPlane::dedicated(Default::default())
        .await
        .expect("a control plane of its own");
    // Leases that outlast the outage (10 s down, plus the apiserver's start, which is slow on a
    // loaded machine; docs/performance-notes.md "Faults"). A renewal refused for longer than the
    // deadline makes the component exit, as its pod would be restarted: not what this test is
    // about.
    let lease = Duration::from_secs(90);
    let mut system = System::start(
        match part {
            Part::Apiserver => "apiserver-restart",
            Part::Etcd => "etcd-restart",
        },
        Options {
            shards: 2,
            lease_seconds: lease.as_secs(),
            // Nothing moves while the control plane is away (10 s plus the apiserver's start),
            // and the watches are then refused once or twice more (410 Gone) through
            // kube-runtime's backoff: the bound on how long a child may stay behind its owner
            // (the sweep interval + 10 s) must cover that.
            sweep_seconds: SWEEP.as_secs(),
            control_plane: Some(cp),
            reconciler_extra: vec![
                (
                    "--leader-election-duration".into(),
                    format!("{}s", lease.as_secs()),
                ),
                ("--leader-election-renew".into(), "2s".into()),
                (
                    "--max-writes-per-second".into(),
                    WRITES_PER_SECOND.to_string(),
                ),
            ],
            ..Options::default()
        },
    )
    .await;
    create_at_once(&system, OBJECTS, 16).await;
    // The first reconciles may take more than `WAIT` beside the rest of the suite on a busy
    // machine.
    eventually("objects on two shards", PLACED, || system.converged()).await;
    let leader = system.leader().await;

    system.start_shard("shard-2").await;
    let moved = eventually("the rebalance starts", WAIT, || async {
        match system.holdings().await.get("shard-2").copied() {
            Some(n) if n > 0 => Ok(n),
            _ => Err("nothing on shard-2 yet"),
        }
    })
    .await;
    let (cut, blind_from) = (Instant::now(), unix_nanos());
    cp.restart(part, Duration::from_secs(10))
        .await
        .expect("the control plane starts again");
    let back = Instant::now();
    // Each component's watches connect again every second while the apiserver is away, and are
    // refused (410 Gone, with kube-runtime's backoff) when they resume from a version the new
    // apiserver's watch cache does not have: recovery takes one or two of those steps.
    let recovery = restart_recovery(SWEEP, OBJECTS, WRITES_PER_SECOND);
    eventually("the rebalance completes", recovery, || system.converged()).await;
    let completed = back.elapsed();
    // The history's watches resumed somewhere in between.
    system.history_blind(blind_from, unix_nanos());
    let exited = system.exited();
    assert!(
        exited.is_empty(),
        "components exited: {exited:?} (the control plane was down {:.1} s; Leases {lease:?})",
        back.duration_since(cut).as_secs_f64()
    );
    let holdings = system.holdings().await;
    let share = holdings.get("shard-2").copied().unwrap_or(0);
    assert!(
        moved < share,
        "the rebalance had ended when {part:?} stopped ({moved} of {share} objects on shard-2): \
         the case does not test a restart mid-rebalance (lower --max-writes-per-second)"
    );
    system.assert_single_ownership();
    let leader_after = system.leader().await;
    eprintln!(
        "{part:?} restart: {moved} of {OBJECTS} objects on the new shard at the stop; down \
         {:.1} s (killed, 10 s, start); rebalance complete {:.1} s after its return (bound {:.0} s); \
         holdings {holdings:?}; leader replica-{leader} before, replica-{leader_after} after",
        back.duration_since(cut).as_secs_f64(),
        completed.as_secs_f64(),
        recovery.as_secs_f64(),
    );
}

/// How long a rebalance cut by a control plane restart may take to complete after the return:
/// the later of the shards' watches resuming ([`SHARDS_RESUME`]; their acknowledgements end the
/// drains) and the reconciler's next try (its retry delay grows while the apiserver is away, to at
/// most the sweep interval), then every one of the `objects` drained again at the reconciler's
/// write limit.
fn restart_recovery(sweep: Duration, objects: usize, writes_per_second: u32) -> Duration {
    let writes = Duration::from_secs_f64(objects as f64 / f64::from(writes_per_second));
    SHARDS_RESUME.max(sweep) + writes
}

/// How many answered-429 reads of Leases [`watches_wait_out_a_restarted_apiserver_s_retry_after`]
/// needs of each component: kube-runtime's backoff would have grown past the Retry-After by the
/// fourth (0.8, 1.6, 3.2 s and jitter).
const REFUSED_READS: usize = 4;

/// The bytes per second the restarted apiserver reads its Leases' storage at.
const LEASE_STORAGE_RATE: u64 = 4 * 1024;

/// Leases of 2 KiB that its Lease cache reads first: 240 KiB, about 60 s at that rate, longer
/// than [`REFUSAL_WINDOW`].
const BALLAST_LEASES: usize = 120;

/// How long the link stays throttled at most: it is opened as soon as both components were
/// refused [`REFUSED_READS`] times, however long the restarted apiserver took to authorise them.
const REFUSAL_WINDOW: Duration = Duration::from_secs(45);

/// How long the example shards' watches may take to resume after the restart: they back off
/// kube-runtime's way (at most 30 s between tries, up to doubled by jitter), and the restarted
/// apiserver refuses them for up to two more tries (403 until its authorizer has synced, then
/// 410 Gone for the version they resume from) after the ones its absence refused.
const SHARDS_RESUME: Duration = Duration::from_secs(2 * 60);

/// Right after an apiserver restart its watch cache of Leases initialises (here held back by a
/// throttled link to their storage), and lists and watches of Leases are answered 429 with a
/// Retry-After. The webhook's and the reconciler's Lease watches (their clients without kube's
/// retry layer: `sharder_runtime::client`) each try again after the wait the answer names,
/// neither sooner nor after a growing backoff, and both go on working without a restart once
/// the cache is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_wait_out_a_restarted_apiserver_s_retry_after() {
    use kube::api::{ObjectMeta, PostParams};
    let cp = sharder_harness::ControlPlane::dedicated(sharder_harness::control_plane::Options {
        lease_storage_link: true,
        ..Default::default()
    })
    .await
    .expect("a control plane of its own");
    let ns = cp.namespace("retry-after").await.expect("a namespace");
    let webhook_token = cp
        .cluster_admin_token(&ns, "sharder-webhook")
        .await
        .expect("the webhook's token");
    let webhook_kubeconfig = cp
        .write_kubeconfig(&format!("webhook-{ns}"), &webhook_token)
        .expect("the webhook's kubeconfig");
    // Leases that outlast the throttled link: renewals wait behind the cache's list there.
    let lease = Duration::from_secs(120);
    let mut system = System::start(
        "retry-after",
        Options {
            shards: 2,
            lease_seconds: lease.as_secs(),
            control_plane: Some(cp),
            namespace: Some(ns.clone()),
            service_accounts: true,
            webhook_kubeconfig: Some(webhook_kubeconfig),
            reconciler_extra: vec![
                (
                    "--leader-election-duration".into(),
                    format!("{}s", lease.as_secs()),
                ),
                ("--leader-election-renew".into(), "2s".into()),
            ],
            ..Options::default()
        },
    )
    .await;
    create_at_once(&system, 20, 8).await;
    eventually("objects on two shards", WAIT, || system.converged()).await;
    // Leases of no ring in a namespace of their own: what the cache must read before it is
    // ready, for several Retry-Afters at the throttled rate.
    let ballast = cp.namespace("lease-ballast").await.expect("a namespace");
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        system.client.clone(),
        &ballast,
    );
    futures::stream::iter(0..BALLAST_LEASES)
        .map(|i| {
            let leases = leases.clone();
            async move {
                let lease = k8s_openapi::api::coordination::v1::Lease {
                    metadata: ObjectMeta {
                        name: Some(format!("ballast-{i}")),
                        annotations: Some([("ballast".to_owned(), "x".repeat(2048))].into()),
                        ..ObjectMeta::default()
                    },
                    ..Default::default()
                };
                leases
                    .create(&PostParams::default(), &lease)
                    .await
                    .expect("a ballast Lease");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;

    let users = [
        system.service_account("sharder-webhook"),
        system.service_account(RECONCILER_ACCOUNT),
    ];
    let link = cp.lease_storage().expect("the link to the Leases' storage");
    let mark = cp.audit_mark();
    link.throttle(Some(LEASE_STORAGE_RATE));
    // The cache stays uninitialised until both were refused often enough to show how they wait.
    let opened = async {
        let deadline = Instant::now() + REFUSAL_WINDOW;
        while Instant::now() < deadline {
            let requests = cp.audited_requests_since(mark);
            if users.iter().all(|user| {
                let reads = lease_reads(&requests, user);
                reads.iter().filter(|r| r.code == 429).count() >= REFUSED_READS
            }) {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        link.throttle(None);
    };
    let blind_from = unix_nanos();
    let restart = async {
        let restarted = cp.restart(Part::Apiserver, Duration::from_secs(1)).await;
        (restarted, Timestamp::now())
    };
    let ((restarted, ready), ()) = tokio::join!(restart, opened);
    restarted.expect("the apiserver is ready again, its Lease cache initialised");

    // Both go on without a restart: a new shard joins the reconciler's ring and takes its
    // share, and the webhook places a new object by the ring of three.
    system.start_shard("shard-2").await;
    eventually("the objects on three shards", WAIT + SHARDS_RESUME, || {
        system.converged()
    })
    .await;
    system.history_blind(blind_from, unix_nanos());
    let created = system
        .create_secret("after-the-restart", "1")
        .await
        .expect("create");
    let three = sharder_common::Ring::new(["shard-0", "shard-1", "shard-2"]);
    assert_eq!(
        system.shard_of(&created).as_deref(),
        three.shard_for(&system.key("after-the-restart")),
        "the webhook assigns by the ring it watched again"
    );
    let exited = system.exited();
    assert!(exited.is_empty(), "components exited: {exited:?}");

    // Each component's watches of one request: the webhook's one Lease watch per ring kind,
    // the reconciler's two (its shard lease controller's and its rings' triggers).
    let requests = cp.audited_requests_since(mark);
    for (user, watches) in users.iter().zip([1, 2]) {
        let reads = lease_reads(&requests, user);
        let refusals = reads.iter().filter(|r| r.code == 429).count();
        assert!(
            refusals >= REFUSED_READS,
            "{user}: {refusals} Lease reads answered 429"
        );
        let mut uris: Vec<&str> = reads.iter().map(|r| r.uri.as_str()).collect();
        uris.sort_unstable();
        uris.dedup();
        for uri in uris {
            let of_uri: Vec<&LeaseRead> = reads.iter().filter(|r| r.uri == uri).collect();
            let seen: Vec<String> = of_uri
                .iter()
                .map(|r| {
                    let took = r.answered.duration_since(r.received);
                    format!(
                        "{} {} {:?} answered {took:#}",
                        r.received, r.code, r.retry_after
                    )
                })
                .collect();
            let broken = retry_after_broken(&of_uri, watches, ready);
            assert!(broken.is_empty(), "{user}, {uri}: {broken:#?} of {seen:#?}");
        }
        eprintln!("{user}: {refusals} Lease reads answered 429, each waited out as asked");
    }
    system.assert_single_ownership();
}

/// One list or watch of Leases, as the audit log recorded it.
#[derive(Debug)]
struct LeaseRead {
    uri: String,
    code: u64,
    /// The Retry-After of a refusal.
    retry_after: Option<Duration>,
    received: Timestamp,
    answered: Timestamp,
}

/// The lists and watches of Leases `user` made, by the time they were received.
fn lease_reads(events: &[serde_json::Value], user: &str) -> Vec<LeaseRead> {
    let time = |v: &serde_json::Value| v.as_str().and_then(|t| t.parse::<Timestamp>().ok());
    let mut reads: Vec<LeaseRead> = events
        .iter()
        .filter(|e| e["user"]["username"] == user && e["objectRef"]["resource"] == "leases")
        .filter(|e| e["verb"] == "list" || e["verb"] == "watch")
        .filter_map(|e| {
            Some(LeaseRead {
                uri: e["requestURI"].as_str()?.to_owned(),
                code: e["responseStatus"]["code"].as_u64()?,
                retry_after: e["responseStatus"]["details"]["retryAfterSeconds"]
                    .as_u64()
                    .map(Duration::from_secs),
                received: time(&e["requestReceivedTimestamp"])?,
                answered: time(&e["stageTimestamp"])?,
            })
        })
        .collect();
    reads.sort_by_key(|r| r.received);
    reads
}

/// How close to the apiserver's readiness a read must come to count as held back by its startup.
const READY_SLACK: SignedDuration = SignedDuration::from_millis(500);

/// How the reads of one request (`reads`, by a component with at most `watches` watches making
/// it, in the order they came) broke the Retry-After of their refusals. Each watch asks again no
/// sooner than the answer says, so of any `watches + 1` reads in a row whose first `watches` were
/// refused, the last came at least that long after the earliest of those refusals' answers
/// allowed (answers may come in another order than the requests). And about that long, not after a backoff growing beyond
/// it: the median wait from a refusal to the next read is within 1 s of the Retry-After (the
/// next read may be another watch's, which only shortens the wait; a busy machine may hold one
/// back longer now and then). A read answered with another error (a 403 while a restarted
/// apiserver's authorizer catches up) puts the component's backoff in force for the rest of the
/// run, as it should: the waits after it say nothing about the Retry-After and are left out of
/// the median. So is a wait that ends as the apiserver turned ready (`ready`, within
/// [`READY_SLACK`]): until then its authenticators may refuse a request before the audit log
/// names its user, an error this check cannot see.
fn retry_after_broken(reads: &[&LeaseRead], watches: usize, ready: Timestamp) -> Vec<String> {
    let since = |later: &LeaseRead, earlier: &LeaseRead| {
        Duration::try_from(later.received.duration_since(earlier.answered)).unwrap_or_default()
    };
    let mut broken = Vec::new();
    let mut over = Vec::new();
    for (i, read) in reads.iter().enumerate().filter(|(_, r)| r.code == 429) {
        let Some(asked) = read.retry_after else {
            broken.push(format!("a 429 at {} without a Retry-After", read.answered));
            continue;
        };
        // Of `watches + 1` reads in a row, two are one watch's: when the first `watches` were all
        // refused, the last came no sooner than the earliest moment one of them allowed.
        let window = reads.get(i..i + watches).unwrap_or_default();
        let allowed = window
            .iter()
            .map(|r| {
                (r.code == 429)
                    .then_some(r.retry_after.map(|a| (r, a)))
                    .flatten()
            })
            .collect::<Option<Vec<_>>>()
            .and_then(|refused| {
                refused.into_iter().min_by_key(|(r, a)| {
                    r.answered + SignedDuration::try_from(*a).unwrap_or_default()
                })
            });
        if let (Some((first, asked)), Some(next)) = (allowed, reads.get(i + watches)) {
            let waited = since(next, first);
            if waited + Duration::from_millis(10) < asked {
                broken.push(format!(
                    "asked again {waited:?} after a 429 at {} asking for {asked:?}",
                    first.answered
                ));
            }
        }
        let backing_off = reads[..i].iter().any(|r| r.code != 200 && r.code != 429);
        if let Some(next) = reads.get(i + 1)
            && !backing_off
            && !(read.answered < ready && next.received >= ready - READY_SLACK)
        {
            over.push(since(next, read).saturating_sub(asked));
        }
    }
    over.sort_unstable();
    if let Some(median) = over.get(over.len() / 2)
        && *median > Duration::from_secs(1)
    {
        broken.push(format!(
            "asked again {median:?} later than asked at the median of {} waits: a growing backoff",
            over.len()
        ));
    }
    broken
}

#[test]
fn a_retry_after_waited_out_late_is_a_growing_backoff_unless_another_error_came_first() {
    let at = |s: i64| Timestamp::from_second(1_000_000 + s).expect("a time");
    let read = |s: i64, code: u64| LeaseRead {
        uri: "/leases".into(),
        code,
        retry_after: (code == 429).then_some(Duration::from_secs(1)),
        received: at(s),
        answered: at(s),
    };
    let ready_long_before = at(-60);
    let late = [read(0, 429), read(6, 200)];
    let late: Vec<&LeaseRead> = late.iter().collect();
    assert_eq!(
        retry_after_broken(&late, 1, ready_long_before).len(),
        1,
        "5 s more than asked"
    );
    assert!(
        retry_after_broken(&late, 1, at(6)).is_empty(),
        "the read came as the apiserver turned ready"
    );
    assert_eq!(
        retry_after_broken(&late, 1, at(8)).len(),
        1,
        "ready 2 s after the read: the component waited on its own"
    );
    let after_403 = [read(0, 403), read(3, 429), read(9, 200)];
    let after_403: Vec<&LeaseRead> = after_403.iter().collect();
    assert!(retry_after_broken(&after_403, 1, ready_long_before).is_empty());
    // Two watches refused, the later-received one answered first: the next read is the
    // earlier-answered watch's, a full Retry-After after its own answer.
    let at_ms = |ms: i64| at(0) + SignedDuration::from_millis(ms);
    let reordered = [
        LeaseRead {
            received: at_ms(0),
            answered: at_ms(700),
            ..read(0, 429)
        },
        LeaseRead {
            received: at_ms(5),
            answered: at_ms(600),
            ..read(0, 429)
        },
        LeaseRead {
            received: at_ms(1_654),
            answered: at_ms(1_654),
            ..read(0, 200)
        },
        LeaseRead {
            received: at_ms(1_707),
            answered: at_ms(1_707),
            ..read(0, 200)
        },
    ];
    let reordered: Vec<&LeaseRead> = reordered.iter().collect();
    assert!(retry_after_broken(&reordered, 2, ready_long_before).is_empty());
    let too_soon = [
        read(0, 429),
        read(0, 429),
        LeaseRead {
            received: at_ms(500),
            ..read(0, 200)
        },
    ];
    let too_soon: Vec<&LeaseRead> = too_soon.iter().collect();
    assert_eq!(
        retry_after_broken(&too_soon, 2, ready_long_before).len(),
        1,
        "one of two refused watches asked again after half the Retry-After"
    );
    let early = [read(0, 403), read(3, 429), read(3, 200)];
    let early: Vec<&LeaseRead> = early.iter().collect();
    assert_eq!(
        retry_after_broken(&early, 1, ready_long_before).len(),
        1,
        "sooner than asked"
    );
}

/// Waits until `system` converges, at most `timeout`, starting again every shard or reconciler
/// that gave its Lease up meanwhile (renewals refused for longer than its renew deadline: its
/// pod would be restarted), and appending each reading of the reconciler's write limit to
/// `limits` (their course shows the backoff). Returns what was restarted.
async fn converge_restarting(
    system: &mut System,
    timeout: Duration,
    limits: &mut Vec<f64>,
) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut restarted = Vec::new();
    while let Err(why) = system.converged().await {
        assert!(
            Instant::now() < deadline,
            "not converged in {timeout:?}: {why}"
        );
        restarted.extend(system.restart_lease_losers().await);
        limits.extend(write_limit(system).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    restarted
}

/// The reconciler's write limit as its metrics give it now.
async fn write_limit(system: &System) -> Option<f64> {
    let metrics = system.reconciler_metrics(0).await;
    metric_value(&metrics, "sharder_reconciler_write_concurrency_limit", &[])
}

#[tokio::test]
async fn an_overloaded_apiserver_refuses_writes_and_the_scale_out_completes_with_nothing_lost() {
    const OBJECTS: usize = 1000;
    const RECOVERY: Duration = Duration::from_secs(180);
    let cp = sharder_harness::ControlPlane::dedicated(sharder_harness::control_plane::Options {
        max_mutating_in_flight: Some(MUTATING_IN_FLIGHT),
        ..Default::default()
    })
    .await
    .expect("a control plane of its own");
    let mut system = System::start(
        "overload",
        Options {
            shards: 2,
            // The SDK's default: renewals refused now and then must not cost the Leases.
            lease_seconds: 15,
            // A child follows its owner with one write, which may be refused too (each refusal
            // costs the Retry-After, 1 s): the handover bound (the sweep interval + 10 s) is
            // widened with it, for a loaded machine.
            sweep_seconds: 40,
            // Refusals are told apart by user in the audit log; the admin (system:masters) is
            // never refused, so the test's own writes always land.
            service_accounts: true,
            control_plane: Some(cp),
            // The reconciler's defaults (the harness's are short, for failover tests).
            reconciler_extra: vec![
                ("--leader-election-duration".into(), "15s".into()),
                ("--leader-election-renew".into(), "2s".into()),
            ],
            ..Options::default()
        },
    )
    .await;
    // The admin is never refused, but its requests take free places: a few at once leave places
    // for the shards' Lease renewals.
    create_at_once(&system, OBJECTS, 4).await;
    // The shards' first reconcile of each object is a write too, refused as often.
    let first = Instant::now();
    let mut limits = Vec::new();
    let mut restarted = converge_restarting(&mut system, RECOVERY, &mut limits).await;
    let settled = first.elapsed();

    let mark = system.audit_mark();
    // The limit before the change: the course of readings starts where the scale-out does.
    limits.extend(write_limit(&system).await);
    let started = Instant::now();
    system.start_shard("shard-2").await;
    restarted.extend(converge_restarting(&mut system, RECOVERY, &mut limits).await);
    let completed = started.elapsed();
    let holdings = held_once(&system, OBJECTS).await;

    let refused = |account: &str| {
        let requests = requests_of(&system, &system.service_account(account), mark);
        let refused = requests.iter().filter(|r| r.code == 429).count();
        (refused, requests.len())
    };
    let (reconciler_refused, reconciler_requests) = refused(RECONCILER_ACCOUNT);
    let (shards_refused, shards_requests) = refused(SHARD_ACCOUNT);
    let metrics = system.reconciler_metrics(0).await;
    let counted = metric_sum(&metrics, "sharder_reconciler_overloaded_writes_total", &[]);
    let (fell, recovered) = fell_and_recovered(&limits);
    let lowest_limit = limits.iter().copied().fold(f64::INFINITY, f64::min);
    eprintln!(
        "overload (--max-mutating-requests-inflight={MUTATING_IN_FLIGHT}): {OBJECTS} objects \
         settled on two shards {:.1} s after their creation; scale-out of them to a third shard complete in {:.1} s; reconciler {reconciler_refused} \
         of {reconciler_requests} writes refused (429), its metric counts {counted}, its write \
         limit went down to {lowest_limit}; shards {shards_refused} of {shards_requests} refused; \
         holdings {holdings:?}; restarted after losing their Lease: {restarted:?}",
        settled.as_secs_f64(),
        completed.as_secs_f64()
    );
    assert!(
        reconciler_refused > 0,
        "the reconciler met no 429: the case does not test overload (lower the limit)"
    );
    assert!(
        counted >= 1.0 && counted <= reconciler_refused as f64,
        "the reconciler's metric counts its refused writes: {counted} of {reconciler_refused}"
    );
    assert!(
        fell && recovered,
        "the write limit fell under the 429s ({fell}) and rose again after ({recovered}): \
         {limits:?}"
    );
}

/// Asserts that `system` holds its `objects` objects, each once and never by two shards at
/// once; its holdings.
async fn held_once(system: &System, objects: usize) -> std::collections::BTreeMap<String, usize> {
    let holdings = system.holdings().await;
    assert_eq!(
        holdings.values().sum::<usize>(),
        objects,
        "every object held once: {holdings:?}"
    );
    system.assert_single_ownership();
    holdings
}

/// Whether a course of readings of the write limit fell below an earlier reading, and rose
/// again after a fall.
fn fell_and_recovered(limits: &[f64]) -> (bool, bool) {
    let mut highest = f64::NEG_INFINITY;
    let mut lowest_since_fall: Option<f64> = None;
    let mut recovered = false;
    for &limit in limits {
        if let Some(lowest) = lowest_since_fall.as_mut() {
            recovered |= limit > *lowest;
            *lowest = lowest.min(limit);
        } else if limit < highest {
            lowest_since_fall = Some(limit);
        }
        highest = highest.max(limit);
    }
    (lowest_since_fall.is_some(), recovered)
}

#[test]
fn a_write_limit_that_only_grows_or_never_rises_again_is_told_apart() {
    let cases: [(&[f64], (bool, bool)); 6] = [
        (&[], (false, false)),
        (&[16.0, 17.0, 30.0], (false, false)),
        (&[16.0, 8.0], (true, false)),
        (&[16.0, 8.0, 4.0, 4.0], (true, false)),
        (&[16.0, 8.0, 4.0, 5.0], (true, true)),
        (&[16.0, 20.0, 10.0, 10.5], (true, true)),
    ];
    for (limits, expected) in cases {
        assert_eq!(fell_and_recovered(limits), expected, "{limits:?}");
    }
}

/// Seats of the priority level that API Priority and Fairness gives the reconciler's writes in
/// [`api_priority_and_fairness_refuses_the_reconciler_s_writes_and_it_waits_and_recovers`]: far
/// below the adaptive limit's start (16), with no queue, so that writes beyond them are refused
/// (429) at once.
const APF_SHARES: i32 = 1;

/// A priority level of `APF_SHARES` that lends nothing, borrows nothing and refuses what it
/// cannot serve at once, and a flow schema sending `user`'s patches of Secrets to it; both
/// named `name`.
fn tiny_priority_level(name: &str, user: &str) -> (serde_json::Value, serde_json::Value) {
    let level = serde_json::json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": { "name": name },
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": APF_SHARES,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": { "type": "Reject" },
            },
        },
    });
    let (namespace, account) = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .expect("a ServiceAccount's user name");
    let schema = serde_json::json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": { "name": name },
        "spec": {
            "priorityLevelConfiguration": { "name": name },
            // Ahead of `service-accounts` (9000), the suggested schema that takes the
            // reconciler's requests otherwise.
            "matchingPrecedence": 100,
            "distinguisherMethod": { "type": "ByUser" },
            "rules": [{
                "subjects": [{
                    "kind": "ServiceAccount",
                    "serviceAccount": { "namespace": namespace, "name": account },
                }],
                "resourceRules": [{
                    "verbs": ["patch"],
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "namespaces": [namespace],
                }],
            }],
        },
    });
    (level, schema)
}

/// Per object, the waits between a refused request (429) and the next request for the same
/// object, in seconds.
fn waits_after_refusals(requests: &[Request]) -> Vec<f64> {
    let mut last: std::collections::HashMap<&str, &Request> = std::collections::HashMap::new();
    let mut waits = Vec::new();
    for request in requests {
        if let Some(previous) = last.insert(&request.what, request)
            && previous.code == 429
        {
            waits.push(seconds(previous.at, request.at));
        }
    }
    waits
}

#[test]
fn the_wait_after_a_refusal_is_measured_to_the_same_object_s_next_request() {
    let at = |s: i64| Timestamp::from_second(1_000 + s).expect("a time");
    let request = |s, code, what: &str| Request {
        at: at(s),
        code,
        what: what.to_owned(),
    };
    let requests = [
        request(0, 429, "patch secrets/a"),
        request(1, 429, "patch secrets/b"),
        request(2, 200, "patch secrets/a"),
        request(3, 200, "patch secrets/c"),
        request(6, 429, "patch secrets/c"),
        request(7, 429, "patch secrets/b"),
        request(9, 200, "patch secrets/c"),
    ];
    assert_eq!(waits_after_refusals(&requests), vec![2.0, 6.0, 3.0]);
    assert!(
        waits_after_refusals(&requests[..2]).is_empty(),
        "no retry yet"
    );
}

#[tokio::test]
async fn api_priority_and_fairness_refuses_the_reconciler_s_writes_and_it_waits_and_recovers() {
    const OBJECTS: usize = 600;
    const RECOVERY: Duration = Duration::from_secs(180);
    let mut system = System::start(
        "apf",
        Options {
            shards: 2,
            lease_seconds: 15,
            sweep_seconds: 40,
            // Requests are told apart by user in the audit log, and the flow schema selects the
            // reconciler's.
            service_accounts: true,
            ..Options::default()
        },
    )
    .await;
    create_at_once(&system, OBJECTS, 16).await;
    system.wait_converged("the objects on two shards").await;

    let user = system.service_account(RECONCILER_ACCOUNT);
    let name = format!("sharder-test-{}", system.ns);
    let (level, schema) = tiny_priority_level(&name, &user);
    let api = |kind: &str| {
        let gvk = kube::api::GroupVersionKind::gvk("flowcontrol.apiserver.k8s.io", "v1", kind);
        let resource = kube::api::ApiResource::from_gvk(&gvk);
        Api::<kube::api::DynamicObject>::all_with(system.client.clone(), &resource)
    };
    let levels = api("PriorityLevelConfiguration");
    let schemas = api("FlowSchema");
    for (api, object) in [(&levels, level), (&schemas, schema)] {
        api.create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(object).expect("an object"),
        )
        .await
        .expect("create");
    }
    // The apiserver's flow control takes a schema when it marks it not dangling (its priority
    // level exists).
    eventually("the flow schema is taken", WAIT, || async {
        let schema = schemas.get(&name).await.map_err(|e| e.to_string())?;
        let status = &schema.data["status"];
        let taken = status["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Dangling" && c["status"] == "False")
        });
        if taken {
            Ok(())
        } else {
            Err(status.to_string())
        }
    })
    .await;

    let mark = system.audit_mark();
    // The limit before the change: the course of readings starts where the scale-out does.
    let mut limits: Vec<f64> = write_limit(&system).await.into_iter().collect();
    system.start_shard("shard-2").await;
    let restarted = converge_restarting(&mut system, RECOVERY, &mut limits).await;
    for api in [&schemas, &levels] {
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
    held_once(&system, OBJECTS).await;

    let requests = requests_of(&system, &user, mark);
    let refused = requests.iter().filter(|r| r.code == 429).count();
    let waits = waits_after_refusals(&requests);
    let shortest = waits.iter().copied().fold(f64::INFINITY, f64::min);
    let (fell, recovered) = fell_and_recovered(&limits);
    let lowest_limit = limits.iter().copied().fold(f64::INFINITY, f64::min);
    eprintln!(
        "API Priority and Fairness ({APF_SHARES} share, no queue): the reconciler's scale-out \
         writes: {refused} of {} refused (429), {} retried, the shortest wait before a retry \
         {shortest:.3} s; its write limit went down to {lowest_limit}; restarted after losing \
         their Lease: {restarted:?}",
        requests.len(),
        waits.len(),
    );
    assert!(
        refused > 0 && !waits.is_empty(),
        "no write was refused and retried: the case does not test overload"
    );
    // The apiserver's Retry-After for a rejection is a whole number of seconds, at least 1.
    assert!(
        shortest >= 1.0,
        "a refused write was sent again {shortest:.3} s after the refusal, before the \
         apiserver's Retry-After (at least 1 s): {waits:?}"
    );
    assert!(
        fell && recovered,
        "the write limit fell under the 429s ({fell}) and rose again after ({recovered}): \
         {limits:?}"
    );
}
