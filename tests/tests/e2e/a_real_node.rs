//! The user's journey on a real node (`sharder_harness::node`): the chart installed with Helm from
//! the image built from this checkout, its pods scheduled, started by kubelet and containerd and
//! reached through Services; the example shards as the StatefulSet of
//! `docs/examples/statefulset-shards.yaml`; then what operators do: create objects, scale out,
//! lose the leading reconciler and a webhook pod, roll the shards to a new configuration, lose a
//! shard hard, upgrade and uninstall. Every `kubectl` command is printed as it runs (`make
//! demo-cluster` shows them).
//!
//! The shards record their reconciles on stdout (`--record-file=/dev/stdout`, kept throughout)
//! and start with a longer Lease than the example's ([`FIRST_LEASE`]); the rolling update
//! applies the example's own. The records are read back through the pods' logs and checked for
//! single ownership and ordered handover, as in the other end-to-end tests.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::{AsyncBufReadExt as _, TryStreamExt as _};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, ListParams, LogParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sharder_common::{ObjectKey, Ring, RingKind};
use sharder_example::record::{self, Line};
use sharder_harness::helm::Helm;
use sharder_harness::node::Node;
use sharder_harness::node::chart::{
    self, Kubectl, RELEASE, RELEASE_NAMESPACE as RELEASE_NS, RING, SHARDS_NAMESPACE as SHARDS_NS,
    STATEFULSET, Workload, leader,
};
use sharder_harness::wait::{eventually, http_get, metric_sum, metric_value};
use sharder_harness::world::World;
use sharder_tests::history::History;
use sharder_tests::ownership;
use sharder_tests::system::{Objects, objects_converged, unix_nanos};

const OBJECTS: usize = 200;
/// Pods start from a local image, but the first start of everything on 2 cores takes a while.
const START: Duration = Duration::from_secs(240);
/// The shards' `--lease-duration` until their rolling update. A shard is dead, and its objects
/// move, twice its Lease's duration after its last renewal: 45 s leaves the first starts of
/// everything on a busy 2-core machine room. The rolling update to the example's own 15 s is
/// covered by the 45 s its Leases still say until each successor renews (kubelet 1.37 replaces
/// each pod within about a second: `docs/performance-notes.md`, "Real node on 1.37"); the hard
/// kill and the rejoin after it then wait on 15 s.
const FIRST_LEASE: &str = "45s";
/// The one change to the example's shard arguments that stays through the rolling update.
const RECORD: &str = "--record-file=/dev/stdout";
/// A rebalance or a reassignment: twice the lease duration plus the writes.
const MOVE: Duration = Duration::from_secs(150);
/// The install's `reconciler.sweepInterval`, shorter than the chart's 5 minutes: on a loaded
/// machine a child whose webhook call or owner read missed its bound is created unlabelled and
/// waits for the next sweep.
const SWEEP: Duration = Duration::from_secs(30);
/// Objects created through the webhook until each, and each child its shard makes, is on its
/// shard (a sweep included).
const ASSIGNED: Duration = Duration::from_secs(MOVE.as_secs() + SWEEP.as_secs());

/// The shards' records, read from their containers' logs as the containers run: one text per
/// container instance, and when its log ended (the container exited).
#[derive(Clone, Default)]
struct Records(Arc<Mutex<BTreeMap<String, Container>>>);

#[derive(Clone, Default)]
struct Container {
    text: String,
    ended: Option<u128>,
    killed: Option<u128>,
}

impl Records {
    /// Follows the log of every container of the shards' pods, from its first line.
    fn collect(client: Client) -> (Self, tokio::task::JoinHandle<()>) {
        let records = Self::default();
        let this = records.clone();
        let task = tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client, SHARDS_NS);
            let mut followed = BTreeSet::new();
            loop {
                let list = pods
                    .list(
                        &ListParams::default().labels("app.kubernetes.io/name=checksum-controller"),
                    )
                    .await;
                for pod in list.map(|l| l.items).unwrap_or_default() {
                    let name = pod.name_any();
                    let running = pod
                        .status
                        .and_then(|s| s.container_statuses)
                        .into_iter()
                        .flatten()
                        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                        .filter_map(|c| c.container_id);
                    for id in running {
                        if followed.insert(id.clone()) {
                            tokio::spawn(this.clone().follow(pods.clone(), name.clone(), id));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        (records, task)
    }

    async fn follow(self, pods: Api<Pod>, pod: String, id: String) {
        let params = LogParams {
            container: Some("shard".into()),
            follow: true,
            ..LogParams::default()
        };
        match pods.log_stream(&pod, &params).await {
            Ok(stream) => {
                let mut lines = stream.lines();
                loop {
                    match lines.try_next().await {
                        Ok(Some(line)) => {
                            let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
                            let container = all.entry(id.clone()).or_default();
                            container.text.push_str(&line);
                            container.text.push('\n');
                        }
                        Ok(None) => break,
                        Err(e) => {
                            eprintln!("the log of {pod} ({id}) broke off: {e}");
                            break;
                        }
                    }
                }
            }
            Err(e) => eprintln!("cannot follow the log of {pod} ({id}): {e}"),
        }
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id)
            .or_default()
            .ended = Some(unix_nanos());
    }

    /// Notes that container `id` was killed at `t` (its log may end later: kubelet serves it).
    fn killed(&self, id: &str, t: u128) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id.to_owned())
            .or_default()
            .killed = Some(t);
    }

    /// Every record line, as written.
    fn lines(&self) -> Vec<Line> {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.values().flat_map(|c| record::parse(&c.text)).collect()
    }

    /// The single-ownership report, each container instance its own shard (a restarted shard
    /// keeps its name; its killed instance's open reconciles end where its log ended).
    fn ownership(&self) -> ownership::Report {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut lines = Vec::new();
        let mut lives = ownership::Lives::new();
        for (id, container) in all.iter() {
            let short = id.rsplit('/').next().unwrap_or(id).get(..12).unwrap_or(id);
            for mut line in record::parse(&container.text) {
                line.shard = format!("{}@{short}", line.shard);
                if let Some(t) = container.killed.or(container.ended) {
                    lives.insert(line.shard.clone(), vec![(0, Some(t))]);
                }
                lines.push(line);
            }
        }
        ownership::check(&lines, &lives, unix_nanos())
    }
}

/// Waits until `want` replicas of the workload are ready (the error says why not).
async fn wait_ready(node: &Node, workload: Workload, name: &str, ns: &str, want: i32) {
    node.wait_ready(workload, name, ns, Some(want), START)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The shard each Secret of the namespace sits on now.
async fn placement(world: &World) -> BTreeMap<String, Option<String>> {
    world
        .list_secrets()
        .await
        .into_iter()
        .map(|(name, secret)| (name.clone(), world.shard_of(&secret)))
        .collect()
}

fn ring_of(shards: usize) -> Ring {
    Ring::new((0..shards).map(|i| format!("{STATEFULSET}-{i}")))
}

fn key(name: &str) -> String {
    ObjectKey::main("", "Secret", Some(SHARDS_NS), name)
        .expect("named")
        .to_string()
}

/// `<Kind> <name>` of every object `api` lists; with `terminating_gone`, of every object not
/// being deleted.
async fn names<K>(api: Api<K>, terminating_gone: bool) -> Result<Vec<String>, String>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .iter()
        .filter(|o| !terminating_gone || o.meta().deletion_timestamp.is_none())
        .map(|o| format!("{} {}", K::kind(&()), o.name_any()))
        .collect())
}

/// The IP of pod `ns/name` (the pod network is reachable from the node, i.e. from here), once
/// kubelet reported it.
async fn pod_ip(client: &Client, ns: &str, name: &str) -> Result<IpAddr, String> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| e.to_string())?
        .status
        .and_then(|s| s.pod_ip)
        .and_then(|ip| ip.parse().ok())
        .ok_or(format!("no IP of pod {name} yet"))
}

/// The chart's webhook pods.
async fn webhook_pods(client: &Client) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
        .list(&ListParams::default().labels("app.kubernetes.io/component=webhook"))
        .await
        .expect("webhook pods")
        .items
}

/// The webhook pods' owner reads that failed or missed their bound (each child left unassigned
/// at CREATE for the reconciler's sweep), from their metrics.
async fn owner_lookup_errors(client: &Client) -> f64 {
    let mut errors = 0.0;
    for pod in webhook_pods(client).await {
        let ip = pod_ip(client, RELEASE_NS, &pod.name_any())
            .await
            .expect("a running webhook pod's IP");
        let (_, metrics) = http_get(SocketAddr::new(ip, 8080), "/metrics")
            .await
            .expect("the webhook's metrics");
        errors += metric_sum(
            &metrics,
            "sharder_webhook_owner_lookups_total",
            &[("result", "error")],
        );
    }
    errors
}

/// Creates Secrets `object-<i>` for `range`; each must come back from the CREATE labelled with
/// the shard the ring of `shards` shards picks (the webhook assigned it). If one does not, the
/// apiserver's log says why its call to the webhook failed (failurePolicy Ignore).
async fn create_assigned(
    world: &World,
    objects: &Objects,
    range: std::ops::Range<usize>,
    shards: usize,
) {
    for i in range {
        let name = format!("object-{i}");
        let created = objects
            .create_secret(&name, &format!("{i}-0"))
            .await
            .expect("create");
        assert_eq!(
            world.shard_of(&created).as_deref(),
            ring_of(shards).shard_for(&key(&name)),
            "{name} assigned at CREATE; the apiserver's failed webhook calls:\n{}",
            world.cp.failed_webhook_calls().join("\n")
        );
    }
}

/// The probe Secret of each namespace [`outside_the_ring`] writes to.
const PROBE: &str = "namespace-selector-probe";

/// Creates a Secret [`PROBE`] in `default`, which the ring's default namespace selector selects,
/// and in `kube-system` and the release's namespace, which it leaves out; the namespaces where
/// that went wrong (assigned outside, or unassigned in `default`).
async fn outside_the_ring(world: &World) -> Vec<String> {
    let mut wrong = Vec::new();
    for ns in ["default", "kube-system", RELEASE_NS] {
        let secrets =
            Api::<k8s_openapi::api::core::v1::Secret>::namespaced(world.client.clone(), ns);
        let probe = k8s_openapi::api::core::v1::Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(PROBE.into()),
                ..kube::api::ObjectMeta::default()
            },
            ..Default::default()
        };
        let created = secrets
            .create(&kube::api::PostParams::default(), &probe)
            .await
            .expect("a probe Secret");
        if world.shard_of(&created).is_some() != (ns == "default") {
            wrong.push(format!("{ns}: {:?}", world.shard_of(&created)));
        }
    }
    wrong
}

/// The probe Secrets [`outside_the_ring`] created where the ring does not shard that carry a
/// shard now.
async fn probes_assigned_outside(world: &World) -> Vec<String> {
    let mut assigned = Vec::new();
    for ns in ["kube-system", RELEASE_NS] {
        let secrets =
            Api::<k8s_openapi::api::core::v1::Secret>::namespaced(world.client.clone(), ns);
        let probe = secrets.get(PROBE).await.expect("the probe Secret");
        if let Some(shard) = world.shard_of(&probe) {
            assigned.push(format!("{ns}: {shard}"));
        }
    }
    assigned
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_the_chart_through_the_operators_day() {
    let node = Node::shared().await.expect("a node");
    let cp = node.control_plane();
    let client = cp.client().await.expect("client");
    let kubectl = Kubectl::of(node).expect("kubectl");
    let helm = Helm::get().expect("helm");

    // Install, as the README says, with a shorter sweep (see `SWEEP`).
    let mut values = chart::ring_values();
    values["reconciler"] = json!({ "sweepInterval": format!("{}s", SWEEP.as_secs()) });
    let installed = node
        .install_chart(&values, START)
        .await
        .expect("helm install");
    eprintln!("helm install to all pods Ready: {installed:?}");
    kubectl
        .run(&["get", "pods", "-n", RELEASE_NS, "-o", "wide"])
        .expect("kubectl");

    // The example shards, 3 of them, recording their reconciles on stdout.
    node.apply_example(3, &[RECORD, &format!("--lease-duration={FIRST_LEASE}")])
        .expect("the example shards");
    let world = World::with_ring(cp, SHARDS_NS.into(), RING.into())
        .await
        .with_kind(RingKind::ControllerRing);
    let (records, collector) = Records::collect(client.clone());
    let history = History::start(&client, SHARDS_NS, &world.labels);
    wait_ready(node, Workload::StatefulSet, STATEFULSET, SHARDS_NS, 3).await;
    eventually("the ring holds the 3 shards", START, || async {
        let ring = world.desired_ring().await;
        (ring.shards() == ring_of(3).shards())
            .then_some(())
            .ok_or(format!("{:?}", ring.shards()))
    })
    .await;

    // From the first CREATE to the end of the rolling update, the machine to itself (see
    // `sharder_tests::MACHINE`): CREATEs must meet the webhook's timeout and replaced pods their
    // Leases. Before and after, the other tests run beside the node's start and the lease-bound
    // waits below.
    let machine = sharder_tests::MACHINE.write().await;

    // Objects: assigned at CREATE by the webhook, through its Service.
    let objects = Objects::new(world.secrets());
    let creating = Instant::now();
    create_assigned(&world, &objects, 0..OBJECTS, 3).await;
    eventually(
        "every object with its checksums on its shard",
        ASSIGNED,
        || async { objects_converged(&world, &ring_of(3)).await },
    )
    .await;
    eprintln!(
        "{OBJECTS} objects and their checksums on their shards {:?} after the first CREATE; \
         owner reads over their bound (children left to the sweep): {}",
        creating.elapsed(),
        owner_lookup_errors(&client).await
    );
    // The default namespace selector (the README's ring has none of its own): a Secret in
    // `default` is assigned at CREATE, one in `kube-system` or the release's namespace is not
    // (by the `kubernetes.io/metadata.name` label the apiserver puts on every namespace).
    let outside = outside_the_ring(&world).await;
    assert!(
        outside.is_empty(),
        "the default namespace selector assigned {outside:?}"
    );
    eventually("the shards' records read from their logs", MOVE, || async {
        let shards: BTreeSet<String> = records.lines().into_iter().map(|l| l.shard).collect();
        (shards.len() == 3)
            .then_some(())
            .ok_or(format!("records of {shards:?}"))
    })
    .await;

    // Scale out: only what the ring moves moves, each through a drain.
    let before = placement(&world).await;
    let expected: BTreeSet<String> = before
        .keys()
        .filter(|name| ring_of(3).shard_for(&key(name)) != ring_of(4).shard_for(&key(name)))
        .cloned()
        .collect();
    node.scale_example(4).expect("kubectl scale");
    eventually("rebalanced onto the fourth shard", MOVE, || async {
        objects_converged(&world, &ring_of(4)).await
    })
    .await;
    let after = placement(&world).await;
    let moved: BTreeSet<String> = before
        .iter()
        .filter(|(name, shard)| after.get(*name) != Some(shard))
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(moved, expected, "exactly the objects the ring moves");
    let outside = probes_assigned_outside(&world).await;
    assert!(
        outside.is_empty(),
        "the scale-out's full lists assigned {outside:?} outside the ring's namespaces"
    );
    let drained: BTreeSet<String> = history
        .versions()
        .into_iter()
        .filter(|v| v.draining && v.owner.is_none())
        .map(|v| {
            v.object
                .trim_start_matches(&format!("{SHARDS_NS}/"))
                .to_owned()
        })
        .collect();
    assert!(
        expected.is_subset(&drained),
        "every moved object was drained first: {:?} without a drain",
        expected.difference(&drained).collect::<Vec<_>>()
    );
    eprintln!(
        "scale-out: {} of {OBJECTS} objects moved, each drained first",
        moved.len()
    );

    // The label guard (on by default): the shards' drain acknowledgements above went through
    // with their pods' tokens; an operator's relabel onto another shard is denied.
    let (name, shard) = after.iter().next().expect("an object");
    let ring = ring_of(4);
    let elsewhere = ring
        .shards()
        .iter()
        .find(|s| Some(*s) != shard.as_ref())
        .expect("another shard");
    let relabel = kubectl.run(&[
        "label",
        "secret",
        "-n",
        SHARDS_NS,
        name,
        &format!("{}={elsewhere}", world.labels.shard),
        "--overwrite",
    ]);
    let denial = format!("{relabel:?}");
    assert!(
        denial.contains("denied") && denial.contains("are the sharder's"),
        "the label guard denies an operator's relabel: {denial}"
    );
    for ns in [RELEASE_NS, SHARDS_NS] {
        for c in chart::pod_memory(&client, ns).await.expect("pod memory") {
            eprintln!(
                "working set (cgroup) {ns}/{}: {:.1} MiB",
                c.pod,
                c.working_set as f64 / 1024.0
            );
        }
    }

    // The leading reconciler goes: another replica leads.
    let first = eventually("a leader", START, || leader(&client)).await;
    let lost = Instant::now();
    kubectl
        .run(&["delete", "pod", "-n", RELEASE_NS, &first, "--wait=false"])
        .expect("kubectl");
    // The standby, or the replacement pod if it starts first: whichever takes the released
    // Lease.
    let second = eventually("another replica leads", MOVE, || async {
        let now = leader(&client).await?;
        (now != first)
            .then_some(now.clone())
            .ok_or(format!("still {now}"))
    })
    .await;
    eprintln!(
        "leader {first} deleted; {second} leads after {:?}",
        lost.elapsed()
    );
    eventually("the new leader's gauge says so", MOVE, || async {
        let ip = pod_ip(&client, RELEASE_NS, &second).await?;
        let (_, metrics) = http_get(SocketAddr::new(ip, 8080), "/metrics")
            .await
            .map_err(|e| e.to_string())?;
        let leading = metric_value(
            &metrics,
            "leader_election_master_status",
            &[("name", "sharder-reconciler")],
        );
        (leading == Some(1.0))
            .then_some(())
            .ok_or(format!("leader gauge {leading:?}"))
    })
    .await;
    wait_ready(
        node,
        Workload::Deployment,
        "sharder-reconciler",
        RELEASE_NS,
        2,
    )
    .await;

    // One webhook pod goes: creates keep being assigned at CREATE.
    let webhook = webhook_pods(&client)
        .await
        .into_iter()
        .next()
        .expect("a webhook pod")
        .name_any();
    kubectl
        .run(&["delete", "pod", "-n", RELEASE_NS, &webhook, "--wait=false"])
        .expect("kubectl");
    create_assigned(&world, &objects, OBJECTS..OBJECTS + 20, 4).await;
    wait_ready(node, Workload::Deployment, "sharder-webhook", RELEASE_NS, 2).await;

    // A rolling update of the shards (the example applied again with its own Lease duration)
    // moves nothing and writes nothing: each successor takes its stable name's Lease back.
    eventually("converged before the rolling update", ASSIGNED, || async {
        objects_converged(&world, &ring_of(4)).await
    })
    .await;
    let before = placement(&world).await;
    let mark = cp.audit_mark();
    node.reapply_example(4, &[RECORD])
        .expect("the example applied again");
    kubectl
        .run(&[
            "rollout",
            "status",
            "statefulset",
            STATEFULSET,
            "-n",
            SHARDS_NS,
            "--timeout=300s",
        ])
        .expect("kubectl");
    assert_eq!(
        placement(&world).await,
        before,
        "a rolling update moves nothing"
    );
    let mut writes: BTreeMap<String, usize> = BTreeMap::new();
    for e in cp.audited_writes_since(mark) {
        let resource = e["objectRef"]["resource"].as_str().unwrap_or_default();
        if e["objectRef"]["namespace"] == SHARDS_NS && ["secrets", "configmaps"].contains(&resource)
        {
            let who = format!("{} {} {resource}", e["user"]["username"], e["verb"]);
            *writes.entry(who).or_default() += 1;
        }
    }
    if !writes.is_empty() {
        // What explains moves during a rolling update: the pods' replacement times and the shard
        // Leases' states as the reconciler saw them.
        for e in cp.audited_writes_since(mark) {
            if e["objectRef"]["resource"] == "pods" && e["objectRef"]["namespace"] == SHARDS_NS {
                eprintln!(
                    "{} {} pod {} {}",
                    e["stageTimestamp"],
                    e["verb"],
                    e["objectRef"]["name"],
                    e["objectRef"]["subresource"]
                );
            }
        }
        let logs = kubectl.run(&[
            "logs",
            "-n",
            RELEASE_NS,
            "-l",
            "app.kubernetes.io/component=reconciler",
            "--tail=-1",
        ]);
        for line in logs
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("shard_leases"))
        {
            eprintln!("{line}");
        }
    }
    assert!(
        writes.is_empty(),
        "writes to sharded objects during the rolling update: {writes:?}"
    );
    drop(machine);

    // A shard killed hard, its node agent frozen so it cannot restart it: its objects are
    // reassigned within the lease bound; when kubelet resumes, the shard comes back and its
    // objects return through drains.
    let victim = format!("{STATEFULSET}-3");
    let container = Api::<Pod>::namespaced(client.clone(), SHARDS_NS)
        .get(&victim)
        .await
        .expect("the fourth shard's pod")
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.container_id)
        .expect("its container");
    let id = container.rsplit('/').next().expect("an id").to_owned();
    node.freeze_kubelet(true).expect("freeze kubelet");
    eprintln!("$ ctr -n k8s.io tasks kill -s SIGKILL {id}   # {victim}, kubelet frozen");
    node.ctr(&["tasks", "kill", "-s", "SIGKILL", &id])
        .expect("kill the shard");
    let killed = Instant::now();
    records.killed(&container, unix_nanos());
    eventually("the killed shard's objects reassigned", MOVE, || async {
        objects_converged(&world, &ring_of(3)).await
    })
    .await;
    let reassigned = killed.elapsed();
    node.freeze_kubelet(false).expect("resume kubelet");
    eprintln!("{victim} killed: its objects reassigned after {reassigned:?}; kubelet resumed");
    eventually(
        "the restarted shard holds its objects again",
        START,
        || async { objects_converged(&world, &ring_of(4)).await },
    )
    .await;

    // Upgrade, then uninstall: nothing of Sharder left, the sharded objects intact.
    let values_upgraded = {
        let mut v = values.clone();
        v["reconciler"] = json!({ "sweepInterval": "20s" });
        v
    };
    eprintln!(
        "$ helm upgrade {RELEASE} charts/sharder -n {RELEASE_NS} --reuse-values --set reconciler.sweepInterval=20s"
    );
    helm.deploy(
        "upgrade",
        &values_upgraded,
        RELEASE,
        RELEASE_NS,
        cp.kubeconfig(),
    )
    .expect("helm upgrade");
    eventually(
        "the reconciler rolled out with the new value",
        START,
        // Pods being deleted are not counted (see the uninstall below), as `kubectl rollout
        // status` counts them.
        || async {
            let pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
                .list(&ListParams::default().labels("app.kubernetes.io/component=reconciler"))
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let updated = pods
                .iter()
                .filter(|p| {
                    p.spec.as_ref().is_some_and(|s| {
                        s.containers[0]
                            .args
                            .iter()
                            .flatten()
                            .any(|a| a == "--sweep-interval=20s")
                    })
                })
                .count();
            (updated == 2 && pods.len() == 2)
                .then_some(())
                .ok_or(format!("{updated} of {} updated", pods.len()))
        },
    )
    .await;
    wait_ready(
        node,
        Workload::Deployment,
        "sharder-reconciler",
        RELEASE_NS,
        2,
    )
    .await;

    collector.abort();
    let handover = ownership::check_handover(
        &history.versions(),
        &records.lines(),
        &ownership::Lives::new(),
        MOVE.as_nanos(),
        unix_nanos(),
    );
    let summary = ownership::assert_holds(&records.ownership(), &handover, &[]);
    eprintln!("ownership: {summary}");

    eprintln!("$ helm uninstall {RELEASE} -n {RELEASE_NS}");
    helm.run(&[
        "uninstall",
        "--name",
        RELEASE,
        "--namespace",
        RELEASE_NS,
        "--kubeconfig",
        cp.kubeconfig().to_str().expect("path"),
    ])
    .expect("helm uninstall");
    eventually("nothing of Sharder left", START, || async {
        let configurations = Api::<MutatingWebhookConfiguration>::all(client.clone());
        let mut left = names(configurations, false).await?;
        left.extend(names(Api::<ValidatingAdmissionPolicy>::all(client.clone()), false).await?);
        left.extend(
            names(
                Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
                false,
            )
            .await?,
        );
        for kind in [RingKind::ControllerRing, RingKind::ClusterRing] {
            let rings = Api::<DynamicObject>::all_with(client.clone(), &kind.api_resource());
            let listed = rings.list(&ListParams::default()).await;
            let listed = listed.map_err(|e| e.to_string())?;
            left.extend(
                listed
                    .items
                    .iter()
                    .map(|r| format!("{kind:?} {}", r.name_any())),
            );
        }
        let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
        left.extend(names(pods, false).await?);
        left.is_empty().then_some(()).ok_or(left.join(", "))
    })
    .await;
    // What stays, as docs/operations.md says: the leader Lease the reconciler made at run time.
    let leases = names(Api::<Lease>::namespaced(client.clone(), RELEASE_NS), false).await;
    assert_eq!(
        leases,
        Ok(vec![format!("Lease {RELEASE}-reconciler")]),
        "after helm uninstall the release namespace holds only the reconcilers' leader Lease"
    );
    assert_eq!(
        world.list_secrets().await.len(),
        OBJECTS + 20,
        "the sharded objects are intact"
    );
}
