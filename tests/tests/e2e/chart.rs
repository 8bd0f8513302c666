//! The Helm chart with real Helm (the Helm v4 SDK from PyPI): lint, renders of the main value
//! combinations, an install into the real apiserver (every object accepted, the CRD established,
//! the generated certificate kept across an upgrade), then the webhook and the reconciler run as
//! local processes authenticated as the chart's own ServiceAccounts, with RBAC on, through the
//! happy path: assignment, scale-out, a shard crash, and a ControllerRing's objects assigned.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::DynamicObject;
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use serde_json::{Value, json};
use sharder_common::{ClusterRing, ClusterRingSpec, RingKind};
use sharder_harness::ControlPlane;
use sharder_harness::control_plane::{NAMESPACE_NAME_LABEL, RING_NAMESPACE_LABEL};
use sharder_harness::helm::{Helm, documents};
use sharder_harness::wait::eventually;
use sharder_harness::world::World;
use sharder_runtime::logging::LogFormat;
use sharder_tests::system::{Options, System, WAIT};

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn kinds(docs: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    kinds.sort();
    kinds
}

fn args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect()
}

fn ring_values(name: &str, namespace: &str) -> Value {
    json!({
        "name": name,
        "labels": { RING_NAMESPACE_LABEL: namespace },
        "resources": [{
            "group": "",
            "resource": "secrets",
            "controlledResources": [{ "group": "", "resource": "configmaps" }]
        }],
        "namespaceSelector": { "matchLabels": { NAMESPACE_NAME_LABEL: namespace } }
    })
}

#[test]
fn the_chart_lints_clean_and_bad_values_are_named() {
    let helm = Helm::get().expect("helm");
    for kube_version in [None, Some("v1.34.0"), Some("v1.37.0")] {
        let report = helm.lint(&json!({}), kube_version).expect("lint");
        let findings: Vec<&Value> = report["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["severity"].as_i64().unwrap_or(0) >= 2)
            .collect();
        assert!(findings.is_empty(), "{kube_version:?}: {findings:?}");
        assert_eq!(report["errors"], json!([]), "{kube_version:?}");
    }
    for (values, named) in [
        (json!({ "webhook": { "replica": 2 } }), "replica"),
        (json!({ "tls": { "mode": "bogus" } }), "/tls/mode"),
        (json!({ "tls": { "mode": "secret" } }), "/tls/secretName"),
        (
            json!({ "reconciler": { "sweepInterval": "soon" } }),
            "/reconciler/sweepInterval",
        ),
        (
            json!({ "clusterRings": [{ "name": "Bad Name", "resources": [{ "resource": "secrets" }] }] }),
            "/clusterRings/0/name",
        ),
        // A ControllerRing's name is the value of its Leases' ring label: 63 characters at most.
        (
            json!({ "controllerRings": [{ "name": "r".repeat(64), "resources": [{ "resource": "secrets" }] }] }),
            "/controllerRings/0/name",
        ),
        (
            json!({ "reconciler": { "namespaceSelector": { "matchExpressions": [{ "key": "a", "operator": "Near" }] } } }),
            "/reconciler/namespaceSelector/matchExpressions/0/operator",
        ),
        (
            json!({ "prometheusRule": { "enabled": true, "unassignedFor": "a while" } }),
            "/prometheusRule/unassignedFor",
        ),
    ] {
        let report = helm.lint(&values, None).expect("lint");
        let errors = report["errors"].to_string();
        assert!(errors.contains(named), "{values}: {errors}");
        assert!(
            helm.render(&values, "sharder", "sharder-system").is_err(),
            "{values} renders"
        );
    }
}

#[test]
fn the_defaults_render_a_hardened_webhook_and_reconciler() {
    let helm = Helm::get().expect("helm");
    let docs = helm
        .render(&json!({}), "sharder", "sharder-system")
        .expect("render");
    assert_eq!(
        kinds(&docs),
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "Deployment",
            "Deployment",
            "PodDisruptionBudget",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Secret",
            "Service",
            "Service",
            "ServiceAccount",
            "ServiceAccount"
        ]
    );
    let webhook = find(&docs, "Deployment", "sharder-webhook").expect("webhook");
    let reconciler = find(&docs, "Deployment", "sharder-reconciler").expect("reconciler");
    for deployment in [webhook, reconciler] {
        assert_eq!(deployment["spec"]["replicas"], 2);
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let container = &pod["containers"][0];
        let sc = &container["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert!(container["resources"]["requests"]["memory"].is_string());
    }
    // The webhook serves the generated certificate; the reconciler gets only its CA.
    let secret = find(&docs, "Secret", "sharder-webhook-tls").expect("tls secret");
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert!(
            secret["data"][key].as_str().is_some_and(|v| !v.is_empty()),
            "{key}"
        );
    }
    let ca_volume = &reconciler["spec"]["template"]["spec"]["volumes"][0]["secret"];
    assert_eq!(ca_volume["secretName"], "sharder-webhook-tls");
    assert_eq!(
        ca_volume["items"],
        json!([{ "key": "ca.crt", "path": "ca.crt" }])
    );
    let reconciler_args = args(reconciler);
    assert!(
        !reconciler_args
            .iter()
            .any(|a| a.starts_with("--namespace-selector")),
        "the reconciler's default (all but kube-system and its namespace): {reconciler_args:?}"
    );
    for flag in [
        "--webhook-ca-file=/etc/sharder/ca/ca.crt",
        "--webhook-service-name=sharder-webhook",
        "--leader-election-name=sharder-reconciler",
        "--namespace=$(POD_NAMESPACE)",
    ] {
        assert!(
            reconciler_args.iter().any(|a| a == flag),
            "{flag} in {reconciler_args:?}"
        );
    }
    let service = find(&docs, "Service", "sharder-webhook").expect("service");
    assert_eq!(service["spec"]["ports"][0]["port"], 443);
    let pdb = find(&docs, "PodDisruptionBudget", "sharder-webhook").expect("pdb");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    // Without rings, the reconciler may touch no sharded object at all.
    let role = find(&docs, "ClusterRole", "sharder-reconciler").expect("role");
    let rules = role["rules"].as_array().expect("rules");
    assert!(
        !rules
            .iter()
            .any(|r| r["verbs"] == json!(["get", "list", "watch", "patch"])),
        "{rules:?}"
    );
    assert!(
        helm.notes(&json!({}), "sharder", "sharder-system")
            .expect("notes")
            .contains("Next steps")
    );
}

/// The webhook's or the reconciler's flags as the chart renders them for `deployment`, parsed
/// by the component's own flag parser.
fn parsed<A: clap::Parser>(binary: &str, deployment: &Value) -> A {
    A::try_parse_from(std::iter::once(binary.to_owned()).chain(args(deployment)))
        .unwrap_or_else(|e| panic!("{binary} refuses the chart's flags: {e}"))
}

#[test]
fn every_value_that_becomes_a_flag_reaches_its_component_as_it_reads_it() {
    let helm = Helm::get().expect("helm");
    let values = json!({
        "logFormat": "plain",
        "webhook": {
            "port": 9444,
            "adminPort": 9191,
            "timeoutSeconds": 7,
            "extraArgs": ["--max-body-bytes=1048576"],
        },
        "reconciler": {
            "leaderElection": { "duration": "20s", "renew": "4s" },
            "sweepInterval": "2m",
            "resyncInterval": "3h",
            "maxWritesPerSecond": 50,
            "maxConcurrentWrites": 16,
            "ringSelector": "team=a",
            "namespaceSelector": { "matchLabels": { "sharded": "true" } },
            "adminPort": 9292,
            "extraArgs": ["--list-page-size=100"],
        },
    });
    let docs = helm
        .render(&values, "sharder", "sharder-system")
        .expect("render");

    let webhook = find(&docs, "Deployment", "sharder-webhook").expect("webhook");
    let webhook: sharder_webhook::Args = parsed("sharder-webhook", webhook);
    assert_eq!(webhook.listen_addr.port(), 9444);
    assert_eq!(webhook.common.admin.admin_addr.port(), 9191);
    assert_eq!(webhook.common.log.log_format, LogFormat::Plain);
    assert_eq!(webhook.max_body_bytes, 1_048_576);
    let service = find(&docs, "Service", "sharder-webhook").expect("service");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "https");

    let reconciler = find(&docs, "Deployment", "sharder-reconciler").expect("reconciler");
    let reconciler: sharder_reconciler::Args = parsed("sharder-reconciler", reconciler);
    let secs = Duration::from_secs;
    assert_eq!(reconciler.leader_election_name, "sharder-reconciler");
    assert_eq!(reconciler.leader_election_duration, secs(20));
    assert_eq!(reconciler.leader_election_renew, secs(4));
    assert_eq!(reconciler.webhook_service_name, "sharder-webhook");
    assert_eq!(reconciler.webhook_timeout_seconds, 7);
    assert_eq!(reconciler.sweep_interval, secs(120));
    assert_eq!(reconciler.resync_interval, secs(3 * 3600));
    assert_eq!(reconciler.max_writes_per_second, 50);
    assert_eq!(reconciler.max_concurrent_writes, 16);
    assert_eq!(reconciler.ring_selector, "team=a");
    assert_eq!(
        reconciler
            .namespace_selector
            .and_then(|s| s.match_labels)
            .unwrap_or_default(),
        [("sharded".to_owned(), "true".to_owned())].into()
    );
    assert_eq!(reconciler.common.admin.admin_addr.port(), 9292);
    assert_eq!(reconciler.common.log.log_format, LogFormat::Plain);
    assert_eq!(reconciler.list_page_size, 100);
}

#[test]
fn a_global_namespace_selector_reaches_the_reconciler_as_json() {
    let helm = Helm::get().expect("helm");
    let selector = json!({ "matchExpressions": [
        { "key": "sharding.example.com/disabled", "operator": "DoesNotExist" },
        { "key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "sharder-system"] }
    ] });
    let docs = helm
        .render(
            &json!({ "reconciler": { "namespaceSelector": selector } }),
            "sharder",
            "sharder-system",
        )
        .expect("render");
    let reconciler = find(&docs, "Deployment", "sharder-reconciler").expect("reconciler");
    let flag = args(reconciler)
        .into_iter()
        .find_map(|a| a.strip_prefix("--namespace-selector=").map(str::to_owned))
        .expect("--namespace-selector");
    let parsed: Value = serde_json::from_str(&flag).expect("JSON");
    assert_eq!(parsed, selector);
}

#[test]
fn the_ring_selector_reaches_the_reconciler_under_its_name_or_its_former_one() {
    let helm = Helm::get().expect("helm");
    for (values, expected) in [
        (json!({}), ""),
        (
            json!({ "reconciler": { "ringSelector": "team=a" } }),
            "team=a",
        ),
        (
            json!({ "reconciler": { "clusterRingSelector": "team=b" } }),
            "team=b",
        ),
        (
            json!({ "reconciler": { "ringSelector": "team=a", "clusterRingSelector": "team=b" } }),
            "team=a",
        ),
    ] {
        let docs = helm
            .render(&values, "sharder", "sharder-system")
            .expect("render");
        let reconciler = find(&docs, "Deployment", "sharder-reconciler").expect("reconciler");
        let flag = args(reconciler)
            .into_iter()
            .find_map(|a| a.strip_prefix("--ring-selector=").map(str::to_owned));
        assert_eq!(flag.as_deref(), Some(expected), "{values}");
    }
}

#[test]
fn rings_of_both_kinds_from_values_grant_exactly_their_resources() {
    let helm = Helm::get().expect("helm");
    let controller_ring = json!({
        "name": "other-operator",
        "resources": [{
            "group": "apps",
            "resource": "deployments",
            "controlledResources": [{ "group": "apps", "resource": "replicasets" }]
        }],
    });
    let values = json!({
        "clusterRings": [ring_values("my-operator", "team-a")],
        "controllerRings": [controller_ring],
        "shardedResources": [{ "group": "batch", "resources": ["jobs"] }],
        "serviceMonitor": { "enabled": true },
    });
    let docs = helm
        .render(&values, "sharder", "sharder-system")
        .expect("render");
    let ring = find(&docs, "ClusterRing", "my-operator").expect("ring");
    let typed: ClusterRing = serde_json::from_value(ring.clone()).expect("a valid ClusterRing");
    assert_eq!(
        typed.spec.resources[0].controlled_resources[0].resource,
        "configmaps"
    );
    typed.spec.validate().expect("valid");
    // A ControllerRing has a ClusterRing's spec under its own kind.
    let ring = find(&docs, "ControllerRing", "other-operator").expect("controller ring");
    let spec: ClusterRingSpec =
        serde_json::from_value(ring["spec"].clone()).expect("a valid ControllerRing spec");
    assert_eq!(
        spec.resources[0].controlled_resources[0].resource,
        "replicasets"
    );
    spec.validate().expect("valid");
    let role = find(&docs, "ClusterRole", "sharder-reconciler").expect("role");
    let sharded: Vec<&Value> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| r["verbs"] == json!(["get", "list", "watch", "patch"]))
        .collect();
    assert_eq!(
        sharded,
        [
            &json!({ "apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list", "watch", "patch"] }),
            &json!({ "apiGroups": ["apps"], "resources": ["deployments", "replicasets"], "verbs": ["get", "list", "watch", "patch"] }),
            &json!({ "apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "patch"] }),
        ]
    );
    let webhook_role = find(&docs, "ClusterRole", "sharder-webhook").expect("role");
    let owners: Vec<&Value> = webhook_role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| r["verbs"] == json!(["get"]))
        .collect();
    assert_eq!(
        owners,
        [
            &json!({ "apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get"] }),
            &json!({ "apiGroups": ["apps"], "resources": ["deployments", "replicasets"], "verbs": ["get"] }),
            &json!({ "apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"] }),
        ],
        "the webhook only reads owners of the sharded resources"
    );
    assert!(find(&docs, "ServiceMonitor", "sharder").is_some());
    let notes = helm
        .notes(&values, "sharder", "sharder-system")
        .expect("notes");
    assert!(
        notes.contains("ClusterRings created: my-operator")
            && notes.contains("ControllerRings created: other-operator"),
        "{notes}"
    );
}

#[test]
fn the_prometheus_rule_holds_the_alerts_of_the_operations_guide_when_enabled() {
    let helm = Helm::get().expect("helm");
    let defaults = helm
        .render(&json!({}), "sharder", "sharder-system")
        .expect("render");
    assert!(!kinds(&defaults).contains(&"PrometheusRule".to_owned()));
    let docs = helm
        .render(
            &json!({ "prometheusRule": { "enabled": true, "unassignedFor": "20m" } }),
            "sharder",
            "sharder-system",
        )
        .expect("render");
    let rule = find(&docs, "PrometheusRule", "sharder").expect("a PrometheusRule");
    let rules = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules");
    let mut in_chart: Vec<&str> = rules
        .iter()
        .map(|r| r["expr"].as_str().expect("an expression"))
        .collect();
    // The guide's alerts: the promql block of its metrics section, each line an expression and
    // its comment.
    let guide = include_str!("../../../docs/operations.md");
    let block = guide
        .split("```promql\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a promql block in docs/operations.md");
    let mut in_guide: Vec<&str> = block
        .lines()
        .map(|line| line.split(" # ").next().unwrap_or_default().trim())
        .filter(|expr| !expr.is_empty())
        .collect();
    in_chart.sort_unstable();
    in_guide.sort_unstable();
    assert_eq!(in_chart, in_guide);
    let unassigned = rules
        .iter()
        .find(|r| r["alert"] == "ShardedObjectsUnassigned")
        .expect("the unassigned objects' alert");
    assert_eq!(unassigned["for"], "20m");
    assert!(
        unassigned["expr"]
            .as_str()
            .is_some_and(|e| e.contains("sharder_reconciler_unassigned_objects"))
    );
}

#[test]
fn tls_comes_from_cert_manager_or_an_existing_secret_when_chosen() {
    let helm = Helm::get().expect("helm");
    let docs = helm
        .render(
            &json!({ "tls": { "mode": "certManager" } }),
            "sharder",
            "sharder-system",
        )
        .expect("render");
    assert!(find(&docs, "Secret", "sharder-webhook-tls").is_none());
    let cert = find(&docs, "Certificate", "sharder-webhook").expect("certificate");
    assert_eq!(cert["spec"]["secretName"], "sharder-webhook-tls");
    assert_eq!(cert["spec"]["issuerRef"]["name"], "sharder-webhook-ca");
    assert!(
        cert["spec"]["dnsNames"]
            .as_array()
            .expect("names")
            .contains(&json!("sharder-webhook.sharder-system.svc"))
    );
    assert!(find(&docs, "Issuer", "sharder-webhook-selfsigned").is_some());
    assert!(find(&docs, "Certificate", "sharder-webhook-ca").is_some());

    let docs = helm
        .render(
            &json!({ "tls": { "mode": "certManager", "certManager": { "issuerRef": { "name": "corp", "kind": "ClusterIssuer" } } } }),
            "sharder",
            "sharder-system",
        )
        .expect("render");
    assert_eq!(
        kinds(&docs).iter().filter(|k| *k == "Certificate").count(),
        1
    );
    assert!(!kinds(&docs).contains(&"Issuer".to_owned()));
    let cert = find(&docs, "Certificate", "sharder-webhook").expect("certificate");
    assert_eq!(
        cert["spec"]["issuerRef"],
        json!({ "name": "corp", "kind": "ClusterIssuer" })
    );

    let docs = helm
        .render(
            &json!({ "tls": { "mode": "secret", "secretName": "mine" } }),
            "sharder",
            "sharder-system",
        )
        .expect("render");
    assert!(
        !kinds(&docs)
            .iter()
            .any(|k| k == "Secret" || k == "Certificate")
    );
    let webhook = find(&docs, "Deployment", "sharder-webhook").expect("webhook");
    assert_eq!(
        webhook["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        "mine"
    );
}

/// The Api of the kind of manifest document `doc` (namespaced ones in `namespace`).
async fn api_for(client: &kube::Client, doc: &Value, namespace: &str) -> Api<DynamicObject> {
    let api_version = doc["apiVersion"].as_str().expect("apiVersion");
    let kind = doc["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("{api_version} {kind} not served: {e}"));
    match caps.scope {
        Scope::Namespaced => Api::namespaced_with(client.clone(), namespace, &resource),
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    }
}

/// Every object Helm rendered exists in the cluster.
async fn assert_installed(cp: &ControlPlane, docs: &[Value], namespace: &str) {
    let client = cp.client().await.expect("client");
    for doc in docs {
        let kind = doc["kind"].as_str().expect("kind");
        let name = doc["metadata"]["name"].as_str().expect("name");
        api_for(&client, doc, namespace)
            .await
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn installed_chart_rbac_is_enough_for_assignment_scale_out_a_crash_and_a_controller_ring() {
    let helm = Helm::get().expect("helm");
    let cp = ControlPlane::shared().await.expect("control plane");
    let release_ns = cp.namespace("sharder-system").await.expect("namespace");
    let ns = cp.namespace("chart").await.expect("namespace");
    // A ControllerRing beside the ClusterRing, over a namespace of its own, labelled for the
    // same reconciler (its ring selector is the ClusterRing's namespace label).
    let cr_ns = cp.namespace("chart-cr").await.expect("namespace");
    let controller_ring = json!({
        "name": cr_ns,
        "labels": { RING_NAMESPACE_LABEL: ns },
        "resources": [{ "group": "", "resource": "secrets" }],
        "namespaceSelector": { "matchLabels": { NAMESPACE_NAME_LABEL: cr_ns } }
    });
    let values = json!({
        "clusterRings": [ring_values(&ns, &ns)],
        "controllerRings": [controller_ring],
    });

    let release = helm
        .deploy("install", &values, "sharder", &release_ns, cp.kubeconfig())
        .expect("helm install");
    assert_eq!(release["status"], "deployed");
    let client = cp.client().await.expect("client");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    eventually("the ClusterRing CRD is established", WAIT, || async {
        let crd = crds
            .get("clusterrings.sharding.timebertt.dev")
            .await
            .map_err(|e| e.to_string())?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established
            .then_some(())
            .ok_or_else(|| "not established".to_owned())
    })
    .await;
    let docs = documents(release["manifest"].as_str().expect("manifest")).expect("manifest");
    assert!(docs.len() >= 15, "{} objects", docs.len());
    assert_installed(cp, &docs, &release_ns).await;
    Api::<ClusterRing>::all(client.clone())
        .get(&ns)
        .await
        .expect("the ring from values");

    // The generated certificate survives an upgrade.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &release_ns);
    let before = secrets.get("sharder-webhook-tls").await.expect("tls").data;
    helm.deploy("upgrade", &values, "sharder", &release_ns, cp.kubeconfig())
        .expect("helm upgrade");
    let after = secrets.get("sharder-webhook-tls").await.expect("tls").data;
    assert_eq!(before, after, "the certificate is kept across upgrades");

    // The webhook and the reconciler as the chart's ServiceAccounts (RBAC on).
    let mut kubeconfigs = Vec::new();
    for account in ["sharder-webhook", "sharder-reconciler"] {
        let token = cp
            .service_account_token(&release_ns, account)
            .await
            .expect("token");
        kubeconfigs.push(
            cp.write_kubeconfig(&format!("{release_ns}-{account}"), &token)
                .expect("kubeconfig"),
        );
    }
    let mut system = System::start(
        "chart",
        Options {
            namespace: Some(ns.clone()),
            kind: RingKind::ClusterRing,
            create_ring: false,
            webhook_kubeconfig: Some(kubeconfigs[0].clone()),
            reconciler_kubeconfig: Some(kubeconfigs[1].clone()),
            reconciler_namespace: Some(release_ns.clone()),
            ..Options::default()
        },
    )
    .await;
    system.create_secrets(0..30).await;
    system
        .wait_converged("objects assigned under the chart's RBAC")
        .await;
    system.start_shard("shard-3").await;
    system
        .wait_converged("rebalanced onto shard-3 under the chart's RBAC")
        .await;
    system.kill_shard("shard-1");
    system
        .wait_converged("the crashed shard's objects reassigned under the chart's RBAC")
        .await;
    eprintln!("under the chart's RBAC: {:?}", system.holdings().await);
    // The ControllerRing: its webhook configuration made and its objects assigned at CREATE
    // by the chart's webhook, its status written, under the same RBAC.
    let mut controller_ring = World::in_namespace(cp, cr_ns.clone())
        .await
        .with_kind(RingKind::ControllerRing);
    controller_ring.add_shard_lease("cr-shard-0", 3600).await;
    controller_ring.wait_until_webhook_assigns().await;
    controller_ring.wait_until_ring_ready(1).await;
    let ring = Api::<ClusterRing>::all(client.clone())
        .get(&ns)
        .await
        .expect("ring");
    let ready = ring.status.as_ref().map(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    });
    assert_eq!(ready, Some(true), "the reconciler wrote the ring's status");
    for process in ["webhook-0", "reconciler-0"] {
        let log = system.log(process);
        assert!(
            !log.to_lowercase().contains("forbidden"),
            "{process} was denied something:\n{log}"
        );
    }
    system.assert_single_ownership();
    drop(system);

    helm.run(&[
        "uninstall",
        "--name",
        "sharder",
        "--namespace",
        &release_ns,
        "--kubeconfig",
        cp.kubeconfig().to_str().expect("path"),
    ])
    .expect("helm uninstall");
    assert!(
        secrets
            .get_opt("sharder-webhook-tls")
            .await
            .expect("get")
            .is_none()
    );
}

#[tokio::test]
async fn the_statefulset_example_is_accepted_by_the_apiserver_and_its_flags_parse() {
    use clap::Parser as _;

    let manifest = include_str!("../../../docs/examples/statefulset-shards.yaml");
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.expect("client");
    let ns = cp.namespace("statefulset").await.expect("namespace");
    let docs = documents(manifest).expect("YAML documents");
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..kube::api::PostParams::default()
    };
    for doc in &docs {
        let object: DynamicObject = serde_json::from_value(doc.clone()).expect("an object");
        api_for(&client, doc, &ns)
            .await
            .create(&dry_run, &object)
            .await
            .unwrap_or_else(|e| panic!("{} is rejected: {e}", doc["kind"]));
    }
    let statefulset = find(&docs, "StatefulSet", "checksum-controller").expect("a StatefulSet");
    let args: Vec<String> = statefulset["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string").to_owned())
        .collect();
    let parsed = sharder_example::Args::try_parse_from(
        std::iter::once("checksum-controller".to_owned()).chain(args),
    )
    .expect("the example controller accepts the manifest's flags");
    assert!(parsed.stable_name, "stable names keep their Lease");
}
