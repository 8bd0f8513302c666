//! The test harness itself, against the real control plane: it answers, authenticates
//! ServiceAccount tokens under RBAC, and leaves no process behind when a test binary panics or is
//! killed.

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use sharder_harness::ControlPlane;

#[tokio::test]
async fn admin_client_reaches_a_ready_apiserver() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.expect("client");
    let version = client.apiserver_version().await.expect("version");
    assert_eq!(version.major, "1");
    // The kubeconfig file written for other processes works as well.
    let kubeconfig = kube::config::Kubeconfig::read_from(cp.kubeconfig()).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    let from_file = Client::try_from(config).expect("client from file");
    from_file
        .apiserver_version()
        .await
        .expect("version via kubeconfig file");
}

#[tokio::test]
async fn service_account_tokens_get_exactly_what_rbac_grants() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    let ns = cp.namespace("rbac").await.expect("namespace");
    let token = cp
        .service_account_token(&ns, "reader")
        .await
        .expect("token");
    let as_reader = cp.client_with_token(&token).await.expect("client");
    let configmaps = Api::<ConfigMap>::namespaced(as_reader, &ns);

    match configmaps.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403 before any binding, got {other:?}"),
    }

    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.clone()),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: meta("read-configmaps"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["list".into()],
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta("read-configmaps"),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "read-configmaps".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "reader".into(),
            namespace: Some(ns.clone()),
            ..Subject::default()
        }]),
    };
    let pp = PostParams::default();
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&pp, &role)
        .await
        .expect("role");
    Api::<RoleBinding>::namespaced(admin, &ns)
        .create(&pp, &binding)
        .await
        .expect("binding");

    // RBAC caches refresh quickly but not instantly.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match configmaps.list(&ListParams::default()).await {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("list still refused after the binding: {e}"),
        }
    }
    // The binding grants list only.
    let cm = ConfigMap {
        metadata: meta("not-allowed"),
        ..ConfigMap::default()
    };
    match configmaps.create(&PostParams::default(), &cm).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403 for create, got {other:?}"),
    }
}

/// Whether a process is gone (no /proc entry, or a zombie waiting for its new parent to reap it).
fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

fn wait_gone(pids: &[u32]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if pids.iter().all(|pid| is_gone(*pid)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Runs the probe binary in `mode` and returns its control plane's pids and folder.
fn start_probe(mode: &str) -> (std::process::Child, Vec<u32>, String) {
    let mut probe = Command::new(env!("CARGO_BIN_EXE_control-plane-probe"))
        .arg(mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the probe");
    let stdout = probe.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the probe's pids");
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"pids"), "probe said {line:?}");
    let pids = vec![
        words[1].parse().expect("etcd pid"),
        words[2].parse().expect("apiserver pid"),
    ];
    assert!(
        pids.iter().all(|pid| !is_gone(*pid)),
        "control plane runs under the probe"
    );
    (probe, pids, words[4].to_owned())
}

#[test]
fn a_panicking_test_binary_leaves_no_process_or_folder_behind() {
    let (mut probe, pids, dir) = start_probe("panic");
    writeln!(probe.stdin.as_mut().expect("stdin"), "panic now").expect("tell the probe");
    let status = probe.wait().expect("probe exits");
    assert!(!status.success(), "the probe panicked");
    assert!(
        wait_gone(&pids),
        "etcd/kube-apiserver {pids:?} outlived a panicking test binary"
    );
    assert!(
        !std::path::Path::new(&dir).exists(),
        "{dir} was left behind"
    );
}

#[test]
fn a_killed_test_binary_leaves_no_process_behind() {
    let (mut probe, pids, dir) = start_probe("hang");
    probe.kill().expect("SIGKILL the probe");
    probe.wait().expect("reap the probe");
    assert!(
        wait_gone(&pids),
        "etcd/kube-apiserver {pids:?} outlived a killed test binary"
    );
    // A killed binary cannot remove its folder (etcd's data, ~140 MB): this test does, or every
    // `make test` would leave one behind.
    std::fs::remove_dir_all(&dir).expect("remove the killed probe's folder");
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_webhooks_started_at_once_each_bind_a_port_of_their_own() {
    use std::collections::BTreeSet;

    use sharder_harness::launch::Webhook;
    use sharder_harness::world::World;

    // Every component binds port 0 itself and reports the address it got: started all at once,
    // none can be handed a port another one took meanwhile.
    let world = World::new("ports").await;
    let env = world.admin_env();
    let (cert, key) = (world.dir().join("tls.crt"), world.dir().join("tls.key"));
    let starts = (0..20).map(|i| {
        let (env, cert, key) = (&env, &cert, &key);
        async move { Webhook::start(&format!("webhook-{i}"), env, cert, key, &[]).await }
    });
    let webhooks: Vec<Webhook> = futures::future::join_all(starts)
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("every webhook starts and becomes ready");
    let addrs: BTreeSet<_> = webhooks.iter().flat_map(|w| [w.addr, w.admin]).collect();
    assert_eq!(addrs.len(), 40, "40 distinct addresses: {addrs:?}");
    for webhook in &webhooks {
        let (status, body) = sharder_harness::wait::http_get(webhook.admin, "/readyz")
            .await
            .expect("admin port answers");
        assert_eq!((status, body.as_str()), (200, "ok\n"), "{}", webhook.admin);
        tokio::net::TcpStream::connect(webhook.addr)
            .await
            .expect("the TLS port accepts connections");
    }
}
