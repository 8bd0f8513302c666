//! A real single-node cluster for the tests that run the chart's pods: the control plane bound to
//! a pod bridge's gateway, containerd (Debian's, CRI), kubelet, kube-proxy (iptables) and
//! kube-scheduler, with Sharder's image built from this checkout and imported into containerd
//! (no registry is needed or reached).
//!
//! One node per machine at a time (a lock file): it lives under a fixed folder so that whatever a
//! crashed run left behind (processes, mounts, cgroups, iptables chains, the bridge, sysctls) is
//! found and removed by `harness/node/host.sh clean` before the next start, as it is at exit.
//! Tests that do not ask for [`Node::shared`] start nothing of it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;
use tokio::sync::OnceCell;

use crate::control_plane::{Options, assets_dir, free_port, path_str, spawn_logged, tail};
use crate::supervisor::{blocking, lifetime_child_status, run_at_exit};
use crate::{ControlPlane, Error, binaries};

pub mod chart;

/// The pod bridge's gateway: the apiserver and kubelet are bound to it (`harness/node/host.sh`
/// creates the bridge, `10.244.0.0/24`).
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);

/// The node's name.
pub const NODE_NAME: &str = "node-1";

/// The tag of the images built for the node (the chart's appVersion, so the chart's default image
/// `sharder:<appVersion>` is the one built here).
pub const IMAGE_TAG: &str = "0.1.0";

/// The image holding the product's binaries, as containerd names it after the import.
pub const IMAGE: &str = "docker.io/library/sharder:0.1.0";

/// How long the node may take to register and report Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// The running node and its control plane.
#[derive(Debug)]
pub struct Node {
    control_plane: &'static ControlPlane,
    dir: PathBuf,
    kubelet_pid: u32,
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

/// Runs a command to completion; its stderr (and stdout) in the error.
fn run(what: &str, command: &mut Command) -> Result<String, Error> {
    let output = blocking(|| command.stdin(Stdio::null()).output())
        .map_err(|e| Error::Provision(format!("cannot run {what}: {e}")))?;
    if !output.status.success() {
        return Err(Error::Provision(format!(
            "{what} failed with {}:\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The node's folder: fixed, so a crashed run's remains are found.
fn node_dir() -> PathBuf {
    std::env::temp_dir().join("sharder-node")
}

/// Holds the machine-wide node lock for the rest of the process's life.
fn lock_machine() -> Result<(), Error> {
    static LOCK: OnceLock<nix::fcntl::Flock<std::fs::File>> = OnceLock::new();
    let path = std::env::temp_dir().join("sharder-node.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(Error::io("open the node lock file"))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::Io("lock the node lock file", e.into()))
        .map(|locked| {
            // The lock is held by the open file; keep it open until the process exits.
            let _ = LOCK.set(locked);
        })
}

impl Node {
    /// The node of this test binary, started on first use (after the node of another test binary
    /// on this machine has gone), and removed when the binary exits.
    pub async fn shared() -> Result<&'static Node, Error> {
        static SHARED: OnceCell<Node> = OnceCell::const_new();
        SHARED.get_or_try_init(Self::start).await
    }

    async fn start() -> Result<Self, Error> {
        let assets = tokio::task::spawn_blocking(assets_dir)
            .await
            .map_err(|e| Error::Provision(e.to_string()))??;
        for bin in [
            "kubelet",
            "kube-proxy",
            "kube-scheduler",
            "kube-controller-manager",
        ] {
            if !assets.join(bin).is_file() {
                return Err(Error::Provision(format!(
                    "{} has no '{bin}': a node needs it (harness/control-plane/provision.sh \
                     builds it; with KUBEBUILDER_ASSETS, put it there)",
                    assets.display()
                )));
            }
        }
        // The images first: a build error should not leave a half-started node behind; and
        // before the machine's node lock, so a binary waiting for another's node has them ready.
        let images = std::env::temp_dir().join(format!("sharder-images-{}", std::process::id()));
        let mut remove = Command::new("rm");
        remove.arg("-rf").arg(&images);
        run_at_exit(remove);
        let binaries = binaries::binary("pause")?
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| Error::Build("the binaries have no folder".into()))?;
        let archives = run(
            "harness/image/build.sh",
            Command::new("bash")
                .arg(script("image/build.sh"))
                .args(["--binaries", &path_str(&binaries)])
                .args(["--pause", &path_str(&binaries.join("pause"))])
                .args(["--tag", IMAGE_TAG])
                .args(["--out", &path_str(&images)])
                .stderr(Stdio::inherit()),
        )?;
        tokio::task::spawn_blocking(lock_machine)
            .await
            .map_err(|e| Error::Provision(e.to_string()))??;
        let dir = node_dir();

        let mut clean = Command::new("bash");
        clean
            .arg(script("node/host.sh"))
            .arg("clean")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        run_at_exit(clean);
        run(
            "harness/node/host.sh prepare",
            Command::new("bash")
                .arg(script("node/host.sh"))
                .arg("prepare")
                .arg(&dir)
                .arg(format!("docker.io/library/sharder-pause:{IMAGE_TAG}")),
        )?;

        let control_plane = ControlPlane::dedicated(Options {
            node_address: Some(GATEWAY),
            ..Options::default()
        })
        .await?;
        let mut node = Self {
            control_plane,
            dir,
            kubelet_pid: 0,
        };
        let logs = node.dir.join("logs");

        let socket = node.dir.join("containerd.sock");
        let mut containerd = Command::new("containerd");
        containerd.args(["--config", &path_str(&node.dir.join("containerd.toml"))]);
        let containerd_pid = spawn_logged(containerd, &logs.join("containerd.log"))?;
        let started = Instant::now();
        while !socket.exists() {
            if let Some(status) = lifetime_child_status(containerd_pid) {
                return Err(Error::NotReady(format!(
                    "containerd exited with {status}: {}",
                    node.log_tail("containerd.log", 30)
                )));
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(Error::NotReady(format!(
                    "containerd did not open {} within {READY_TIMEOUT:?}",
                    socket.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for archive in archives
            .lines()
            .map(str::trim)
            .filter(|l| l.ends_with(".tar"))
        {
            run(
                "ctr images import",
                Command::new("ctr")
                    .args(["--address", &path_str(&socket), "-n", "k8s.io"])
                    .args(["images", "import", archive]),
            )?;
        }
        let _ = std::fs::remove_dir_all(&images);

        let kubeconfig = path_str(control_plane.kubeconfig());
        let kubelet_dir = node.dir.join("kubelet");
        let mut kubelet = Command::new(assets.join("kubelet"));
        kubelet
            .args(["--kubeconfig", &kubeconfig])
            // This machine's cgroups are v1 (hybrid), on which kubelet refuses to start unless
            // told otherwise; it runs on them as it did before the default changed.
            .arg("--fail-cgroupv1=false")
            .arg(format!(
                "--container-runtime-endpoint=unix://{}",
                socket.display()
            ))
            .args(["--root-dir", &path_str(&kubelet_dir.join("root"))])
            .args(["--cert-dir", &path_str(&kubelet_dir.join("pki"))])
            .args([
                "--volume-plugin-dir",
                &path_str(&kubelet_dir.join("volume-plugins")),
            ])
            .args(["--cgroup-driver", "cgroupfs", "--fail-swap-on=false"])
            .args(["--oom-score-adj", "0", "--hostname-override", NODE_NAME])
            .args(["--address", &GATEWAY.to_string()])
            .args(["--node-ip", &GATEWAY.to_string()])
            .args(["--read-only-port", "0", "--healthz-port", "0"])
            .arg("--authentication-token-webhook=false")
            .args(["--authorization-mode", "AlwaysAllow"])
            .args(["--cgroups-per-qos=false", "--enforce-node-allocatable="])
            .arg("--protect-kernel-defaults=false")
            .args([
                "--serialize-image-pulls=false",
                "--image-gc-high-threshold",
                "100",
            ])
            .args(["--eviction-hard=", "--v", "1"])
            // The node's status is computed every 10 s by default, so the node reported Ready
            // up to 10 s after it was; a status unchanged is still posted only every 5 minutes.
            .args(["--node-status-update-frequency", "1s"]);
        let kubelet_pid = spawn_logged(kubelet, &logs.join("kubelet.log"))?;
        node.kubelet_pid = kubelet_pid;

        let mut proxy = Command::new(assets.join("kube-proxy"));
        proxy
            .args(["--kubeconfig", &kubeconfig])
            .args([
                "--proxy-mode",
                "iptables",
                "--cluster-cidr",
                "10.244.0.0/16",
            ])
            .args(["--hostname-override", NODE_NAME])
            .args(["--conntrack-max-per-core", "0"])
            .args(["--conntrack-tcp-timeout-established", "0"])
            .args(["--conntrack-tcp-timeout-close-wait", "0"])
            .args(["--oom-score-adj", "0"])
            .arg(format!("--healthz-bind-address=127.0.0.1:{}", free_port()?))
            .arg(format!("--metrics-bind-address=127.0.0.1:{}", free_port()?));
        let proxy_pid = spawn_logged(proxy, &logs.join("kube-proxy.log"))?;

        let mut scheduler = Command::new(assets.join("kube-scheduler"));
        scheduler
            .args(["--kubeconfig", &kubeconfig])
            .args(["--leader-elect=false", "--bind-address", "127.0.0.1"])
            .args(["--secure-port", "0"]);
        let scheduler_pid = spawn_logged(scheduler, &logs.join("kube-scheduler.log"))?;

        node.wait_registered(&[
            ("containerd", containerd_pid),
            ("kubelet", kubelet_pid),
            ("kube-proxy", proxy_pid),
            ("kube-scheduler", scheduler_pid),
        ])
        .await?;
        Ok(node)
    }

    /// Waits until the node reports Ready, failing early when one of `processes` exits.
    async fn wait_registered(&self, processes: &[(&str, u32)]) -> Result<(), Error> {
        let nodes = Api::<NodeObject>::all(self.control_plane.client().await?);
        let started = Instant::now();
        let mut last = "not registered".to_owned();
        while started.elapsed() < READY_TIMEOUT {
            for (name, pid) in processes {
                if let Some(status) = lifetime_child_status(*pid) {
                    return Err(Error::NotReady(format!(
                        "{name} exited with {status}; its log:\n{}",
                        self.log_tail(&format!("{name}.log"), 30)
                    )));
                }
            }
            match nodes.get_opt(NODE_NAME).await {
                Ok(Some(node)) => {
                    let ready = node
                        .status
                        .and_then(|s| s.conditions)
                        .into_iter()
                        .flatten()
                        .find(|c| c.type_ == "Ready");
                    match ready {
                        Some(c) if c.status == "True" => return Ok(()),
                        Some(c) => last = format!("Ready={}: {:?}", c.status, c.message),
                        None => last = "no Ready condition".into(),
                    }
                }
                Ok(None) => {}
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(Error::NotReady(format!(
            "node {NODE_NAME} not Ready within {READY_TIMEOUT:?} ({last}); kubelet log:\n{}",
            self.log_tail("kubelet.log", 40)
        )))
    }

    /// The control plane the node belongs to (bound to [`GATEWAY`]).
    pub fn control_plane(&self) -> &'static ControlPlane {
        self.control_plane
    }

    /// The last `lines` lines of one of the node's logs (`containerd.log`, `kubelet.log`,
    /// `kube-proxy.log`, `kube-scheduler.log`).
    pub fn log_tail(&self, log: &str, lines: usize) -> String {
        match std::fs::read_to_string(self.dir.join("logs").join(log)) {
            Ok(text) => tail(&text, lines),
            Err(_) => format!("({log} missing)"),
        }
    }

    /// Freezes (SIGSTOP) or resumes (SIGCONT) kubelet: while frozen, nothing on the node is
    /// restarted, probed or reported, as when a node's agent hangs.
    pub fn freeze_kubelet(&self, frozen: bool) -> Result<(), Error> {
        let signal = if frozen {
            nix::sys::signal::Signal::SIGSTOP
        } else {
            nix::sys::signal::Signal::SIGCONT
        };
        let pid = i32::try_from(self.kubelet_pid).map_err(|e| Error::Provision(e.to_string()))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .map_err(|e| Error::Io("signal kubelet", e.into()))
    }

    /// Runs `ctr` against the node's containerd (`-n k8s.io`); its stdout.
    pub fn ctr(&self, args: &[&str]) -> Result<String, Error> {
        run(
            "ctr",
            Command::new("ctr")
                .args(["--address", &path_str(&self.dir.join("containerd.sock"))])
                .args(["-n", "k8s.io"])
                .args(args),
        )
    }
}
