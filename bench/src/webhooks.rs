//! The two webhooks of the latency comparison, each a process serving TLS on loopback: the
//! floor webhook (`floor-webhook`, a fixed one-label patch) and the sharder webhook (started by
//! the shared launcher, watching the real rings and Leases). Both bind a port of their own
//! choosing and report it.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use sharder_harness::certs::TestCa;
use sharder_harness::launch::{Env, Webhook};
use sharder_harness::{ControlPlane, Supervised};

use crate::Error;

/// The running webhooks.
pub(crate) struct Webhooks {
    /// The floor webhook's address.
    pub(crate) floor: SocketAddr,
    /// The sharder webhook.
    pub(crate) sharder: Webhook,
    /// The PEM CA both certificates are signed by.
    pub(crate) ca_pem: String,
    /// A file holding `ca_pem` (the reconciler's `--webhook-ca-file`).
    pub(crate) ca_file: PathBuf,
    /// The folder of the sharder webhook's certificate, `tls.crt` and `tls.key` (signed by
    /// `ca_pem`, for `127.0.0.1`): another webhook on loopback may serve it too.
    pub(crate) cert_dir: PathBuf,
    _floor_process: Supervised,
    _dir: tempfile::TempDir,
}

/// The path of one of this crate's binaries, next to the running one (built by
/// `cargo build -p sharder-bench --bins`, or by cargo for this crate's tests).
fn bench_binary(name: &str) -> Result<PathBuf, Error> {
    let exe = std::env::current_exe().map_err(Error::io("find this executable"))?;
    // <target>/<profile>/sharder-bench, or <target>/<profile>/deps/<test> in tests.
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(Error::Setup(format!(
        "the {name} binary is not built (cargo build -p sharder-bench --bins)"
    )))
}

/// Spawns `command` as `name` with its stdout piped and waits for the first line starting with
/// `prefix` (how the bench's own helper binaries report that they are ready); returns the
/// process and that line.
async fn spawn_until_line(
    name: &str,
    mut command: Command,
    prefix: &'static str,
) -> Result<(Supervised, String), Error> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut process = Supervised::spawn(name, command).map_err(Error::io("start a helper"))?;
    let stdout = process
        .take_stdout()
        .ok_or_else(|| Error::Setup(format!("{name} has no stdout")))?;
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with(prefix))
    })
    .await
    .ok()
    .flatten()
    .ok_or_else(|| Error::Setup(format!("{name} exited before printing {prefix:?}")))?;
    Ok((process, line))
}

/// Starts the memory baseline (`metadata-cache`, a kube-rs reflector over the metadata of the
/// Secrets of `ns`); returns once it holds `n` objects.
pub(crate) async fn metadata_cache(
    cp: &ControlPlane,
    ns: &str,
    n: usize,
) -> Result<Supervised, Error> {
    let mut command = Command::new(bench_binary("metadata-cache")?);
    command
        .env("KUBECONFIG", cp.kubeconfig())
        .args([ns, &n.to_string()]);
    Ok(spawn_until_line("metadata-cache", command, "synced")
        .await?
        .0)
}

/// Starts a shard's cache of its share (`share-cache`, a kube-rs reflector over the whole
/// Secrets of `ns` that `labels` or `selector` select, `-` for none); returns once it holds `n`.
pub(crate) async fn share_cache(
    cp: &ControlPlane,
    ns: &str,
    n: usize,
    labels: &str,
    selector: &str,
) -> Result<Supervised, Error> {
    let mut command = Command::new(bench_binary("share-cache")?);
    command
        .env("KUBECONFIG", cp.kubeconfig())
        .args([ns, &n.to_string(), labels, selector]);
    Ok(spawn_until_line("share-cache", command, "synced").await?.0)
}

/// Starts both webhooks (each with the `MALLOC_ARENA_MAX` the chart sets); returns once both
/// serve (the sharder webhook ready).
pub(crate) async fn start(cp: &ControlPlane) -> Result<Webhooks, Error> {
    let arenas = crate::chart_arena_max("webhook.yaml")?.to_string();
    let ca = TestCa::new("bench-ca")?;
    let cert = ca.serving_cert("bench-webhook")?;
    let dir = tempfile::tempdir().map_err(Error::io("create a temporary folder"))?;
    let (cert_file, key_file) = cert
        .write_to(dir.path())
        .map_err(Error::io("write the certificate"))?;
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).map_err(Error::io("write the CA"))?;

    let mut command = Command::new(bench_binary("floor-webhook")?);
    command
        .arg(&cert_file)
        .arg(&key_file)
        .env("MALLOC_ARENA_MAX", &arenas);
    let (floor_process, line) = spawn_until_line("floor-webhook", command, "serving ").await?;
    let floor = line
        .strip_prefix("serving ")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| Error::Setup(format!("the floor webhook reported {line:?}")))?;

    let env = Env::new(dir.path(), cp.kubeconfig()).var("MALLOC_ARENA_MAX", &arenas);
    let sharder = Webhook::start("webhook", &env, &cert_file, &key_file, &[]).await?;
    Ok(Webhooks {
        floor,
        sharder,
        ca_pem: ca.pem(),
        ca_file,
        cert_dir: dir.path().to_path_buf(),
        _floor_process: floor_process,
        _dir: dir,
    })
}
