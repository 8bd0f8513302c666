//! A real Kubernetes control plane on loopback: etcd + kube-apiserver, with token authentication
//! and RBAC, started once per test binary ([`ControlPlane::shared`]). Neither can bind port 0
//! and report it, so each is started on ports that were free a moment ago and started again on
//! new ones if another process took a port meanwhile; kube-controller-manager binds no port.
//!
//! Binaries come from `KUBEBUILDER_ASSETS` when set, otherwise from
//! `harness/control-plane/provision.sh` (which builds kube-apiserver once per machine and caches it
//! outside the repository).

use std::ffi::OsString;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio::sync::OnceCell;

use crate::Error;
use crate::proxy::Proxy;
use crate::supervisor::{
    blocking, lifetime_child_status, remove_at_exit, spawn_for_process_lifetime,
};

/// The label every namespace carries with its own name (set by the apiserver): what a ring's or
/// a webhook's namespaceSelector selects a test namespace by.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The admin's username (`system:masters`), as the apiserver names it to admission and the
/// audit log.
pub const ADMIN_USER: &str = "admin";

/// Label a test's ring carries with the test's namespace, so a reconciler started with
/// `--ring-selector` manages only the rings of its own test.
pub const RING_NAMESPACE_LABEL: &str = "sharder.test/namespace";

/// How long the control plane may take to answer `/readyz` (a few seconds on 2 cores).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The folder holding `etcd` and `kube-apiserver` (and `kube-controller-manager` when built here).
pub fn assets_dir() -> Result<PathBuf, Error> {
    static ASSETS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    ASSETS
        .get_or_init(|| provision().map_err(|e| e.to_string()))
        .clone()
        .map_err(Error::Provision)
}

fn provision() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS") {
        let dir = PathBuf::from(dir);
        for bin in ["etcd", "kube-apiserver"] {
            if !dir.join(bin).is_file() {
                return Err(Error::Provision(format!(
                    "KUBEBUILDER_ASSETS={} has no '{bin}'",
                    dir.display()
                )));
            }
        }
        return Ok(dir);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("control-plane/provision.sh");
    let mut provision = Command::new("bash");
    provision.arg(&script).stderr(Stdio::inherit());
    let output = blocking(|| provision.output())
        .map_err(|e| Error::Provision(format!("cannot run {}: {e}", script.display())))?;
    if !output.status.success() {
        return Err(Error::Provision(format!(
            "{} failed with {}",
            script.display(),
            output.status
        )));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| Error::Provision(format!("{} printed no folder", script.display())))?;
    Ok(PathBuf::from(dir))
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound and released). Another process
/// may take it before it is used: only for programs that cannot bind port 0 themselves, started
/// by [`start_on_free_ports`], which tries again on new ports when that happens.
pub(crate) fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(Error::io("bind a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(Error::io("read a bound port"))?
        .port())
}

/// How often a control plane process is started on new ports after its ports were taken.
const PORT_ATTEMPTS: usize = 5;

/// Starts the program `command(ports)` builds (with two ports that were free a moment ago),
/// logging into `<dir>/<name>.log`, and waits until that log contains the line the builder
/// names, which the program writes once it listens. When the program exits because a port was
/// taken meanwhile ("address already in use"), it is started again on new ports. Returns its
/// pid and what the builder returned.
async fn start_on_free_ports<T>(
    name: &str,
    dir: &Path,
    mut command: impl FnMut([u16; 2]) -> (Command, String, T),
) -> Result<(Process, T), Error> {
    let log = dir.join(format!("{name}.log"));
    for attempt in 1..=PORT_ATTEMPTS {
        let (command, serving, value) = command([free_port()?, free_port()?]);
        let process = Process::spawn(command, &log)?;
        let pid = process.pid();
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(&serving) {
                return Ok((process, value));
            }
            if let Some(status) = lifetime_child_status(pid) {
                if text.contains("address already in use") && attempt < PORT_ATTEMPTS {
                    eprintln!(
                        "[control-plane] {name}: a port was taken meanwhile, starting it again on new ports"
                    );
                    break;
                }
                return Err(Error::NotReady(format!(
                    "{name} exited with {status}; its log:\n{}",
                    tail(&text, 30)
                )));
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(Error::NotReady(format!(
                    "{name} did not log {serving:?} within {READY_TIMEOUT:?}; its log:\n{}",
                    tail(&text, 30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Err(Error::NotReady(format!(
        "{name}: its ports were taken {PORT_ATTEMPTS} times"
    )))
}

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The resource and name of the object audit event `event` wrote, if it is a write by `user` to
/// an object in namespace `namespace` (the one place the tests and benchmarks read writes from
/// the audit log by).
pub fn audited_write<'a>(
    event: &'a serde_json::Value,
    namespace: &str,
    user: &str,
) -> Option<(&'a str, &'a str)> {
    let object = &event["objectRef"];
    (event["user"]["username"] == user && object["namespace"] == namespace).then(|| {
        (
            object["resource"].as_str().unwrap_or_default(),
            object["name"].as_str().unwrap_or_default(),
        )
    })
}

/// The verbs of writes in the audit log.
const WRITES: [&str; 4] = ["create", "update", "patch", "delete"];

/// A position in the apiserver's audit log (see [`ControlPlane::audit_mark`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditMark(u64);

/// How a control plane's kube-apiserver is started, beyond what every one gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// `--request-timeout`: how long a request other than a watch may take before the
    /// apiserver ends it (`None`: its default, 60 s).
    pub request_timeout: Option<Duration>,
    /// For a cluster with a node ([`crate::node`]): the apiserver binds and advertises this
    /// address (the pod bridge's gateway, which pods reach through the `kubernetes` Service)
    /// instead of 127.0.0.1, and kube-controller-manager runs every controller (ServiceAccount
    /// tokens, StatefulSets, endpoints) instead of only garbage collection, namespaces,
    /// Deployments and ReplicaSets (whose Pods stay Pending where no node runs).
    pub node_address: Option<std::net::Ipv4Addr>,
    /// `--max-mutating-requests-inflight`, with API Priority and Fairness off so that the
    /// limit answers 429 at once instead of queueing (requests of `system:masters`, such as the
    /// test's own, are never refused).
    pub max_mutating_in_flight: Option<u32>,
    /// Leases are stored through a proxy in front of etcd ([`ControlPlane::lease_storage`],
    /// `--etcd-servers-overrides`), so that a test can slow what the apiserver reads of them;
    /// and the audit log records every list and watch of Leases too, with how it was answered.
    /// The proxy runs on the runtime of the test that starts the control plane: a test that
    /// blocks (reading the audit log) should run on a multi-thread runtime.
    pub lease_storage_link: bool,
    /// The apiserver runs without the `ShardedListAndWatch` feature gate (range mode's
    /// `shardSelector`), which is on otherwise.
    pub without_sharded_list_and_watch: bool,
    /// The apiserver serves no MutatingAdmissionPolicies (`--runtime-config`), as one before
    /// Kubernetes 1.36 does not.
    pub without_mutating_admission_policies: bool,
}

/// One of the control plane's two processes (see [`ControlPlane::restart`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// etcd: restarted on the same data folder and ports.
    Etcd,
    /// kube-apiserver: restarted with the same flags on the same address.
    Apiserver,
}

/// A control plane process with what it takes to start it again.
#[derive(Debug)]
struct Process {
    pid: AtomicU32,
    /// The program and arguments it was started with.
    command: (OsString, Vec<OsString>),
}

impl Process {
    /// Spawns `command`, its output to `log`.
    fn spawn(command: Command, log: &Path) -> Result<Self, Error> {
        let again = (
            command.get_program().to_owned(),
            command.get_args().map(ToOwned::to_owned).collect(),
        );
        Ok(Self {
            pid: AtomicU32::new(spawn_logged(command, log)?),
            command: again,
        })
    }

    fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// The value of `flag` among its arguments (`--flag value`).
    fn flag(&self, flag: &str) -> Option<String> {
        let args = &self.command.1;
        let at = args.iter().position(|a| a == flag)?;
        args.get(at + 1).map(|v| v.to_string_lossy().into_owned())
    }
}

/// A second kube-apiserver on a control plane's etcd ([`ControlPlane::another_apiserver`]).
#[derive(Debug)]
pub struct OtherApiserver {
    url: String,
    kubeconfig: PathBuf,
}

impl OtherApiserver {
    /// Its URL, `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A kubeconfig file for the admin user against it.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
}

/// A running etcd + kube-apiserver pair.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    etcd: Process,
    apiserver: Process,
    url: String,
    token: String,
    ca_file: PathBuf,
    kubeconfig: PathBuf,
    sa_key: PathBuf,
    lease_storage: Option<Proxy>,
}

impl ControlPlane {
    /// The control plane of this test binary, started on first use. Processes are killed and the
    /// temp folder removed when the binary exits, whatever the test outcome.
    pub async fn shared() -> Result<&'static ControlPlane, Error> {
        static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();
        SHARED
            .get_or_try_init(|| Self::start(Options::default()))
            .await
    }

    /// A control plane of its own started with `options`, for a test that needs the apiserver
    /// set up differently. It lives as long as the test binary (like [`Self::shared`]).
    pub async fn dedicated(options: Options) -> Result<&'static ControlPlane, Error> {
        Ok(Box::leak(Box::new(Self::start(options).await?)))
    }

    async fn start(options: Options) -> Result<Self, Error> {
        let assets = tokio::task::spawn_blocking(assets_dir)
            .await
            .map_err(|e| Error::Provision(e.to_string()))??;
        let dir = tempfile::Builder::new()
            .prefix("sharder-control-plane-")
            .tempdir()
            .map_err(Error::io("create the control plane's temp folder"))?
            .keep();
        remove_at_exit(dir.clone());

        let sa_key = dir.join("sa.key");
        let key = rcgen::KeyPair::generate().map_err(|e| Error::Provision(e.to_string()))?;
        write(&sa_key, key.serialize_pem().as_bytes())?;
        let sa_pub = dir.join("sa.pub");
        write(&sa_pub, key.public_key_pem().as_bytes())?;
        let token = random_token();
        let tokens = dir.join("tokens.csv");
        write(
            &tokens,
            format!("{token},{ADMIN_USER},{ADMIN_USER},system:masters\n").as_bytes(),
        )?;

        // Writes (not Lease renewals or Events) are audited, so tests can count the writes a
        // component makes, by user and object; and the lists of the test resource `gadgets`, so
        // they can tell how a component lists.
        let audit_policy = dir.join("audit-policy.yaml");
        let lease_reads = if options.lease_storage_link {
            "- level: Metadata\n  verbs: [list, watch]\n  resources:\n  - group: coordination.k8s.io\n    resources: [leases]\n"
        } else {
            ""
        };
        write(
            &audit_policy,
            format!(
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n{lease_reads}\
- level: None\n  resources:\n  - group: coordination.k8s.io\n  - group: events.k8s.io\n  - group: \"\"\n    resources: [events]\n\
- level: Metadata\n  verbs: [list]\n  resources:\n  - group: test.sharder.dev\n    resources: [gadgets]\n\
- level: Metadata\n  verbs: [create, update, patch, delete]\n- level: None\n"
            )
            .as_bytes(),
        )?;
        let (etcd, etcd_url) = start_on_free_ports("etcd", &dir, |[client, peer]| {
            let etcd_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let mut etcd = Command::new(assets.join("etcd"));
            etcd.args(["--data-dir", &path_str(&dir.join(format!("etcd-{client}")))])
                .args(["--listen-client-urls", &etcd_url])
                .args(["--advertise-client-urls", &etcd_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("default={peer_url}")]);
            // etcd's JSON log line once its client port serves.
            let serving = format!("\"traffic\":\"grpc+http\",\"address\":\"127.0.0.1:{client}\"");
            (etcd, serving, etcd_url)
        })
        .await?;

        let lease_storage = if options.lease_storage_link {
            let etcd_addr = etcd_url.trim_start_matches("http://");
            let etcd_addr = etcd_addr
                .parse()
                .map_err(|e| Error::Provision(format!("etcd's address {etcd_addr}: {e}")))?;
            Some(
                Proxy::to(etcd_addr)
                    .await
                    .map_err(Error::io("start the proxy in front of etcd"))?,
            )
        } else {
            None
        };
        let certs = dir.join("certs");
        let address = options
            .node_address
            .map_or_else(|| "127.0.0.1".to_owned(), |a| a.to_string());
        let (apiserver, secure_port) =
            start_on_free_ports("kube-apiserver", &dir, |[secure_port, _]| {
                let mut apiserver = Command::new(assets.join("kube-apiserver"));
                apiserver
                    .args(["--etcd-servers", &etcd_url])
                    .args(["--secure-port", &secure_port.to_string()])
                    .args(["--bind-address", &address])
                    .args(["--advertise-address", &address])
                    .args(["--cert-dir", &path_str(&certs)])
                    .args(["--token-auth-file", &path_str(&tokens)])
                    .args(["--authorization-mode", "RBAC"])
                    .args(["--service-account-key-file", &path_str(&sa_pub)])
                    .args(["--service-account-signing-key-file", &path_str(&sa_key)])
                    .args(["--service-account-issuer", "https://kubernetes.default.svc"])
                    .args(["--service-cluster-ip-range", "10.96.0.0/16"])
                    .args(["--audit-policy-file", &path_str(&audit_policy)])
                    .args(["--audit-log-path", &path_str(&dir.join("audit.log"))])
                    .args(["--audit-log-mode", "blocking"])
                    // 0 would mean lumberjack's default: rotation at 100 MB, after which the
                    // counts of a long run (the benchmarks) would start over mid-measurement.
                    .args(["--audit-log-maxsize", "1000000"]);
                if options.node_address.is_some() {
                    // The node's name resolves nowhere: logs, exec and port-forward go to its IP.
                    apiserver.args(["--kubelet-preferred-address-types", "InternalIP"]);
                } else {
                    // The `kubernetes` Service's endpoints would be a loopback address, which
                    // the apiserver refuses; nothing in a cluster without a node uses them.
                    apiserver.args(["--endpoint-reconciler-type", "none"]);
                }
                if !options.without_sharded_list_and_watch {
                    apiserver.arg("--feature-gates=ShardedListAndWatch=true");
                }
                if options.without_mutating_admission_policies {
                    // The admission plugin lists the policies: off with their API.
                    apiserver.args([
                        "--runtime-config=admissionregistration.k8s.io/v1/mutatingadmissionpolicies=false,admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings=false",
                        "--disable-admission-plugins=MutatingAdmissionPolicy",
                    ]);
                }
                if let Some(limit) = options.max_mutating_in_flight {
                    apiserver.arg(format!("--max-mutating-requests-inflight={limit}"));
                    apiserver.arg("--enable-priority-and-fairness=false");
                }
                if let Some(timeout) = options.request_timeout {
                    apiserver.arg(format!("--request-timeout={}s", timeout.as_secs().max(1)));
                }
                if let Some(link) = &lease_storage {
                    apiserver.arg(format!(
                        "--etcd-servers-overrides=coordination.k8s.io/leases#http://{}",
                        link.addr()
                    ));
                }
                let serving = format!("Serving securely on {address}:{secure_port}");
                (apiserver, serving, secure_port)
            })
            .await?;

        let url = format!("https://{address}:{secure_port}");
        let ca_file = certs.join("apiserver.crt");
        let kubeconfig = dir.join("kubeconfig");
        let control_plane = Self {
            dir,
            etcd,
            apiserver,
            url,
            token,
            ca_file,
            kubeconfig,
            sa_key,
            lease_storage,
        };
        control_plane.wait_ready().await?;
        write(
            &control_plane.kubeconfig,
            control_plane
                .kubeconfig_yaml(&control_plane.token)
                .as_bytes(),
        )?;
        // Garbage collection (ownerReferences), namespace deletion and real Deployment ->
        // ReplicaSet -> Pod hierarchies need the controller manager; the provisioning script
        // builds it beside the apiserver.
        let kcm = assets.join("kube-controller-manager");
        if kcm.is_file() {
            let mut command = Command::new(kcm);
            command
                .args(["--kubeconfig", &path_str(&control_plane.kubeconfig)])
                .args([
                    "--service-account-private-key-file",
                    &path_str(&control_plane.sa_key),
                ])
                .args(["--leader-elect=false", "--bind-address", "127.0.0.1"])
                .args(["--secure-port", "0"]);
            if options.node_address.is_some() {
                command
                    .args(["--controllers", "*"])
                    .args(["--root-ca-file", &path_str(&control_plane.ca_file)])
                    .args([
                        "--flex-volume-plugin-dir",
                        &path_str(&control_plane.dir.join("flexvolume")),
                    ]);
            } else {
                command.args([
                    "--controllers",
                    "garbagecollector,namespace,deployment,replicaset",
                ]);
            }
            spawn_logged(
                command,
                &control_plane.dir.join("kube-controller-manager.log"),
            )?;
        }
        Ok(control_plane)
    }

    /// Stops `part` (SIGKILL: at once; on SIGTERM kube-apiserver waits for open requests),
    /// leaves it down for `down`, and starts it again with the same flags (etcd on the same data
    /// folder and ports, kube-apiserver on the same address); returns once the apiserver answers ready again. For a [`Self::dedicated`] control plane:
    /// every client of it sees the outage.
    pub async fn restart(&self, part: Part, down: Duration) -> Result<(), Error> {
        let (name, process) = match part {
            Part::Etcd => ("etcd", &self.etcd),
            Part::Apiserver => ("kube-apiserver", &self.apiserver),
        };
        let pid = process.pid();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
            nix::sys::signal::Signal::SIGKILL,
        );
        let stopping = Instant::now();
        while lifetime_child_status(pid).is_none() {
            if stopping.elapsed() > READY_TIMEOUT {
                return Err(Error::NotReady(format!(
                    "{name} (pid {pid}) did not stop within {READY_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!(
            "[control-plane] {name} stopped in {:.1} s",
            stopping.elapsed().as_secs_f64()
        );
        tokio::time::sleep(down.saturating_sub(stopping.elapsed())).await;
        let starting = Instant::now();
        let (program, args) = &process.command;
        let mut command = Command::new(program);
        command.args(args);
        let pid = spawn_logged(command, &self.dir.join(format!("{name}.log")))?;
        process.pid.store(pid, Ordering::Relaxed);
        // The apiserver's readiness includes its etcd and its watch caches: either restart
        // ends here.
        self.wait_ready().await?;
        eprintln!(
            "[control-plane] {name} started again, the apiserver ready {:.1} s after the start",
            starting.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// The proxy Leases are stored through ([`Options::lease_storage_link`]).
    pub fn lease_storage(&self) -> Option<&Proxy> {
        self.lease_storage.as_ref()
    }

    /// etcd's client address.
    pub fn etcd_addr(&self) -> std::net::SocketAddr {
        self.etcd
            .flag("--listen-client-urls")
            .and_then(|url| url.strip_prefix("http://").and_then(|a| a.parse().ok()))
            .expect("etcd listens on http://<ip>:<port>")
    }

    /// Starts a second kube-apiserver on this control plane's etcd, as the other replica of an
    /// HA control plane: the same flags and tokens, a port and serving certificate of its own.
    /// `overrides` send resources' storage elsewhere (`--etcd-servers-overrides`, e.g.
    /// `("/secrets", a proxy in front of etcd)`), so that its watch cache of them can be made to
    /// lag. It runs as long as the test binary.
    pub async fn another_apiserver(
        &self,
        name: &str,
        overrides: &[(&str, std::net::SocketAddr)],
    ) -> Result<OtherApiserver, Error> {
        let (program, args) = &self.apiserver.command;
        let address = self
            .apiserver
            .flag("--bind-address")
            .unwrap_or_else(|| "127.0.0.1".to_owned());
        let certs = self.dir.join(format!("{name}-certs"));
        let audit = self.dir.join(format!("{name}-audit.log"));
        let (_process, port) = start_on_free_ports(name, &self.dir, |[port, _]| {
            let mut command = Command::new(program);
            let mut args = args.iter();
            while let Some(arg) = args.next() {
                command.arg(arg);
                let replaced = match arg.to_str() {
                    Some("--secure-port") => Some(port.to_string()),
                    Some("--cert-dir") => Some(path_str(&certs)),
                    Some("--audit-log-path") => Some(path_str(&audit)),
                    _ => None,
                };
                if let Some(value) = replaced {
                    command.arg(value);
                    args.next();
                }
            }
            for (resource, addr) in overrides {
                command.arg(format!("--etcd-servers-overrides={resource}#http://{addr}"));
            }
            (
                command,
                format!("Serving securely on {address}:{port}"),
                port,
            )
        })
        .await?;
        let url = format!("https://{address}:{port}");
        let yaml = self
            .kubeconfig_yaml(&self.token)
            .replace(&self.url, &url)
            .replace(
                &self.ca_file.display().to_string(),
                &certs.join("apiserver.crt").display().to_string(),
            );
        let kubeconfig = self.dir.join(format!("{name}.kubeconfig"));
        write(&kubeconfig, yaml.as_bytes())?;
        let config = Config::from_custom_kubeconfig(
            Kubeconfig::from_yaml(&yaml).map_err(Error::Kubeconfig)?,
            &KubeConfigOptions::default(),
        )
        .await
        .map_err(Error::Kubeconfig)?;
        let client = Client::try_from(config).map_err(Error::Kube)?;
        let started = Instant::now();
        loop {
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::NotReady(e.to_string()))?;
            match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => break,
                answer if started.elapsed() > READY_TIMEOUT => {
                    return Err(Error::NotReady(format!(
                        "{name} not ready within {READY_TIMEOUT:?} ({answer:?}); its log:\n{}",
                        self.log_tail(&format!("{name}.log"), 30)
                    )));
                }
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        Ok(OtherApiserver { url, kubeconfig })
    }

    async fn wait_ready(&self) -> Result<(), Error> {
        let started = Instant::now();
        let mut last = String::from("not started");
        while started.elapsed() < READY_TIMEOUT {
            if let Some(status) = lifetime_child_status(self.apiserver.pid()) {
                return Err(Error::NotReady(format!(
                    "kube-apiserver exited with {status}; its log:\n{}",
                    self.log_tail("kube-apiserver.log", 30)
                )));
            }
            // The serving certificate appears a moment after the process starts.
            if self.ca_file.is_file() {
                match self.readyz().await {
                    Ok(body) if body.trim() == "ok" => return Ok(()),
                    Ok(body) => last = body,
                    Err(e) => last = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(Error::NotReady(format!(
            "no ready answer within {READY_TIMEOUT:?} (last: {last}); kube-apiserver log:\n{}",
            self.log_tail("kube-apiserver.log", 30)
        )))
    }

    async fn readyz(&self) -> Result<String, Error> {
        let client = self.client_with_token(&self.token).await?;
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| Error::NotReady(e.to_string()))?;
        client.request_text(request).await.map_err(Error::Kube)
    }

    /// The last `lines` lines of one of the control plane's logs (`etcd.log`, `kube-apiserver.log`).
    pub fn log_tail(&self, log: &str, lines: usize) -> String {
        match std::fs::read_to_string(self.dir.join(log)) {
            Ok(text) => tail(&text, lines),
            Err(_) => format!("({log} missing)"),
        }
    }

    /// The apiserver's log lines about webhook calls that failed (it admits the object without
    /// the webhook's patch when the webhook's failurePolicy is Ignore), oldest first.
    pub fn failed_webhook_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("kube-apiserver.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.to_lowercase().contains("failed calling webhook"))
            .map(str::to_owned)
            .collect()
    }

    /// Process ids of etcd and kube-apiserver.
    pub fn pids(&self) -> [u32; 2] {
        [self.etcd.pid(), self.apiserver.pid()]
    }

    /// Where the audit log ends now: [`audited_writes_since`](Self::audited_writes_since) this
    /// mark reads only what was written after it (without parsing what came before).
    pub fn audit_mark(&self) -> AuditMark {
        AuditMark(
            std::fs::metadata(self.dir.join("audit.log"))
                .map(|m| m.len())
                .unwrap_or(0),
        )
    }

    /// The audit events of successful writes (create, update, patch, delete; not Leases or
    /// Events) after `mark` (`AuditMark::default()`: all), one JSON object each.
    pub fn audited_writes_since(&self, mark: AuditMark) -> Vec<serde_json::Value> {
        self.audited_requests_since(mark)
            .into_iter()
            .filter(|event| {
                WRITES.contains(&event["verb"].as_str().unwrap_or_default())
                    && event["responseStatus"]["code"]
                        .as_u64()
                        .is_some_and(|c| c < 300)
            })
            .collect()
    }

    /// The audit events of answered write requests (as [`Self::audited_writes_since`], refused
    /// ones included) after `mark`.
    pub fn audited_requests_since(&self, mark: AuditMark) -> Vec<serde_json::Value> {
        use std::io::{Read as _, Seek as _};
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(self.dir.join("audit.log")) {
            // An event is one line, written whole: a mark taken between two is at a line start.
            let _ = file
                .seek(std::io::SeekFrom::Start(mark.0))
                .and_then(|_| file.read_to_string(&mut text));
        }
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|event| event["stage"] == "ResponseComplete")
            .collect()
    }

    /// The apiserver's URL, `https://127.0.0.1:<port>` (the node address instead with
    /// [`Options::node_address`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The PEM file of the apiserver's serving certificate chain (use it as the CA).
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// A kubeconfig file for the admin user (`system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The control plane's temp folder (logs, certificates, kubeconfigs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The ServiceAccount signing key (PEM), for tests that need to inspect tokens.
    pub fn service_account_key(&self) -> &Path {
        &self.sa_key
    }

    /// A kubeconfig YAML for the given bearer token.
    pub fn kubeconfig_yaml(&self, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sharder-test\n  cluster:\n    \
             server: {}\n    certificate-authority: {}\nusers:\n- name: user\n  user:\n    \
             token: {token}\ncontexts:\n- name: sharder-test\n  context:\n    cluster: \
             sharder-test\n    user: user\n    namespace: default\ncurrent-context: sharder-test\n",
            self.url,
            self.ca_file.display()
        )
    }

    /// Writes a kubeconfig for `token` into the control plane's folder and returns its path (for
    /// processes started by tests with the permissions of that token).
    pub fn write_kubeconfig(&self, name: &str, token: &str) -> Result<PathBuf, Error> {
        let path = self.dir.join(format!("kubeconfig-{name}"));
        write(&path, self.kubeconfig_yaml(token).as_bytes())?;
        Ok(path)
    }

    /// An admin client. Make one per test: a client belongs to the runtime that created it.
    pub async fn client(&self) -> Result<Client, Error> {
        self.client_with_token(&self.token).await
    }

    /// A client authenticated with `token` (for example a ServiceAccount token).
    pub async fn client_with_token(&self, token: &str) -> Result<Client, Error> {
        Client::try_from(self.config_with_token(token).await?).map_err(Error::Kube)
    }

    /// The client configuration of the admin user (to build other clients from).
    pub async fn config(&self) -> Result<Config, Error> {
        self.config_with_token(&self.token).await
    }

    async fn config_with_token(&self, token: &str) -> Result<Config, Error> {
        let kubeconfig =
            Kubeconfig::from_yaml(&self.kubeconfig_yaml(token)).map_err(Error::Kubeconfig)?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(Error::Kubeconfig)
    }

    /// Creates a namespace named `<prefix>-<random>` and returns its name.
    pub async fn namespace(&self, prefix: &str) -> Result<String, Error> {
        let name = format!("{prefix}-{}", &random_token()[..8]);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(self.client().await?)
            .create(&PostParams::default(), &ns)
            .await
            .map_err(Error::Kube)?;
        Ok(name)
    }

    /// A token of ServiceAccount `namespace/name` bound to cluster-admin (so tests and
    /// benchmarks can tell its writes apart in the audit log without restricting it).
    pub async fn cluster_admin_token(&self, namespace: &str, name: &str) -> Result<String, Error> {
        let token = self.service_account_token(namespace, name).await?;
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(format!("{name}-{namespace}")),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: "cluster-admin".into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.into(),
                namespace: Some(namespace.into()),
                ..Subject::default()
            }]),
        };
        match Api::<ClusterRoleBinding>::all(self.client().await?)
            .create(&PostParams::default(), &binding)
            .await
        {
            Ok(_) => Ok(token),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(token),
            Err(e) => Err(Error::Kube(e)),
        }
    }

    /// Creates the ServiceAccount `namespace/name` if absent and mints a token for it through
    /// the TokenRequest API, so a component can run with exactly the permissions RBAC grants it.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<String, Error> {
        let api = Api::<ServiceAccount>::namespaced(self.client().await?, namespace);
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        match api.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(Error::Kube(e)),
        }
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec!["https://kubernetes.default.svc".into()],
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        let response = api
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(Error::Kube)?;
        response.status.map(|s| s.token).ok_or_else(|| {
            Error::NotReady(format!(
                "TokenRequest for {namespace}/{name} returned no token"
            ))
        })
    }
}

pub(crate) fn spawn_logged(mut command: Command, log: &Path) -> Result<u32, Error> {
    let file = std::fs::File::create(log).map_err(Error::io("create a log file"))?;
    let err = file.try_clone().map_err(Error::io("open a log file"))?;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err));
    let program = command.get_program().to_string_lossy().into_owned();
    spawn_for_process_lifetime(command)
        .map_err(|e| Error::Provision(format!("cannot start {program}: {e}")))
}

fn write(path: &Path, contents: &[u8]) -> Result<(), Error> {
    let mut file = std::fs::File::create(path).map_err(Error::io("write a control plane file"))?;
    file.write_all(contents)
        .map_err(Error::io("write a control plane file"))
}

pub(crate) fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// A random lowercase hex string of 32 characters.
pub fn random_token() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for _ in 0..2 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        out.push_str(&format!("{:016x}", hasher.finish()));
    }
    out
}
