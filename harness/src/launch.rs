//! One typed launcher per component: the webhook, the reconciler and the example shard as real
//! processes, used by every test, the demo and the benchmarks.
//!
//! No component is handed a port that was merely free a moment ago: each binds port 0 itself
//! (`--listen-addr 127.0.0.1:0`, `--admin-addr 127.0.0.1:0`); the launcher finds the addresses
//! it listens on in `/proc` (the admin server is the one that answers `GET /livez`), never in
//! its log, which is for people. Logs go to `<dir>/<name>.log`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use sharder_common::{RingId, RingKind};

use crate::binaries::binary;
use crate::wait::{Rebalances, http_get};
use crate::{Error, Supervised};

/// How long a component may take to report its addresses and become ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Let the kernel pick a free loopback port.
pub const ANY_LOOPBACK_PORT: &str = "127.0.0.1:0";

/// A component process with JSON logs in a file.
#[derive(Debug)]
pub struct Process {
    process: Supervised,
    log: PathBuf,
}

impl Process {
    /// Starts `binary` as `name` with `args` (plus `--admin-addr 127.0.0.1:0` and
    /// `--log-format json`) in `env` (kubeconfig, variables), logging to
    /// `<env.dir>/<name>.log` (appended), and waits until it listens on `listeners` addresses,
    /// one its admin server; returns the process, the admin address and the others.
    pub async fn start(
        name: &str,
        binary_name: &str,
        env: &Env,
        args: &[String],
        listeners: usize,
    ) -> Result<(Self, SocketAddr, Vec<SocketAddr>), Error> {
        let mut process = Self::spawn(name, binary_name, env, args)?;
        let mut others = process.listening(listeners).await?;
        let mut admin = None;
        for (i, addr) in others.iter().enumerate() {
            let probe = tokio::time::timeout(Duration::from_secs(5), http_get(*addr, "/livez"));
            if matches!(probe.await, Ok(Ok((200, _)))) {
                admin = Some(i);
                break;
            }
        }
        let Some(admin) = admin else {
            return Err(process.failed(&format!("serves no admin server on {others:?}")));
        };
        let admin = others.remove(admin);
        Ok((process, admin, others))
    }

    /// Starts `binary` as `name` with `args` (plus `--admin-addr 127.0.0.1:0` and
    /// `--log-format json`) in `env`, logging to `<env.dir>/<name>.log` (appended).
    pub fn spawn(name: &str, binary_name: &str, env: &Env, args: &[String]) -> Result<Self, Error> {
        let log = env.dir.join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(Error::io("open a component log"))?;
        let mut command = Command::new(binary(binary_name)?);
        // No backtrace on an error exit, as in CI whatever this shell says: resolving one from a
        // debug build's symbols delays a shard's exit on a lost Lease, which the fault tests time.
        command
            .env("KUBECONFIG", &env.kubeconfig)
            .env("NO_COLOR", "1")
            .env("RUST_BACKTRACE", "0")
            .env_remove("RUST_LIB_BACKTRACE")
            .envs(env.vars.iter().map(|(k, v)| (k, v)))
            .args(args)
            .args(["--admin-addr", ANY_LOOPBACK_PORT, "--log-format", "json"])
            .stdin(Stdio::null())
            .stdout(
                file.try_clone()
                    .map_err(Error::io("open a component log"))?,
            )
            .stderr(file);
        let process = Supervised::spawn(name, command).map_err(Error::io("start a component"))?;
        Ok(Self { process, log })
    }

    /// The log so far (of every process of this name).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log file.
    pub fn log_file(&self) -> &Path {
        &self.log
    }

    /// Waits until the process listens on `n` TCP addresses (or more), and returns them; fails
    /// at once if it exits first, with its log tail.
    async fn listening(&mut self, n: usize) -> Result<Vec<SocketAddr>, Error> {
        let started = Instant::now();
        loop {
            let found = crate::procfs::listening(self.process.pid()).unwrap_or_default();
            if found.len() >= n {
                return Ok(found);
            }
            if let Some(status) = self.process.try_wait() {
                return Err(self.failed(&format!("exited with {status} before it listened")));
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(self.failed(&format!(
                    "listened on {found:?}, not {n} addresses, within {START_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn failed(&self, what: &str) -> Error {
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Error::NotReady(format!(
            "{} {what}; its log:\n{}",
            self.process.name(),
            tail.join("\n")
        ))
    }

    /// Waits until `GET /readyz` on `admin` answers 200 (while the process runs).
    pub async fn wait_ready(&mut self, admin: SocketAddr) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            let last = match http_get(admin, "/readyz").await {
                Ok((200, _)) => return Ok(()),
                Ok((status, body)) => format!("{status} {}", body.trim()),
                Err(e) => e.to_string(),
            };
            if let Some(status) = self.process.try_wait() {
                return Err(self.failed(&format!("exited with {status} before it was ready")));
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(self.failed(&format!("not ready within {START_TIMEOUT:?}: {last}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Sends `signal`.
    pub fn signal(&self, signal: Signal) -> std::io::Result<()> {
        self.process.signal(signal)
    }

    /// The exit status if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.process.try_wait()
    }

    /// SIGTERM, then SIGKILL after `grace`; the exit status.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.process.stop(grace)
    }

    /// SIGKILL (a crash).
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.process.kill()
    }
}

/// Where a component's files are and which credentials it runs with.
#[derive(Clone, Debug)]
pub struct Env {
    /// Folder for logs.
    pub dir: PathBuf,
    /// Kubeconfig of the process.
    pub kubeconfig: PathBuf,
    /// Extra environment variables.
    pub vars: Vec<(String, String)>,
}

impl Env {
    /// Logs in `dir`, credentials from `kubeconfig`.
    pub fn new(dir: &Path, kubeconfig: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            kubeconfig: kubeconfig.to_owned(),
            vars: Vec::new(),
        }
    }

    /// The same with the environment variable `key=value` added.
    pub fn var(mut self, key: &str, value: &str) -> Self {
        self.vars.push((key.to_owned(), value.to_owned()));
        self
    }
}

/// A running `sharder-webhook`.
#[derive(Debug)]
pub struct Webhook {
    /// The process.
    pub process: Process,
    /// Its TLS address.
    pub addr: SocketAddr,
    /// Its admin address (`/readyz`, `/metrics`).
    pub admin: SocketAddr,
}

impl Webhook {
    /// Starts webhook `name` serving the PEM files `cert` and `key`, plus `extra` flags; returns
    /// once it is ready (rings and Leases listed, certificate loaded).
    pub async fn start(
        name: &str,
        env: &Env,
        cert: &Path,
        key: &Path,
        extra: &[&str],
    ) -> Result<Self, Error> {
        let mut args = strings(&["--listen-addr", ANY_LOOPBACK_PORT]);
        args.push("--tls-cert-file".into());
        args.push(path(cert));
        args.push("--tls-key-file".into());
        args.push(path(key));
        args.extend(strings(extra));
        let (mut process, admin, served) =
            Process::start(name, "sharder-webhook", env, &args, 2).await?;
        let addr = served[0];
        process.wait_ready(admin).await?;
        Ok(Self {
            process,
            addr,
            admin,
        })
    }

    /// The URL the apiserver calls for `ring`.
    pub fn url(&self, ring: &RingId) -> String {
        format!("https://{}{}", self.addr, ring.webhook_path())
    }

    /// The webhook's metrics (Prometheus text).
    pub async fn metrics(&self) -> String {
        metrics(self.admin).await
    }
}

/// The metrics (Prometheus text) served on admin address `admin`; empty when it does not answer.
pub async fn metrics(admin: SocketAddr) -> String {
    http_get(admin, "/metrics")
        .await
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// The flags of a reconciler started by tests.
#[derive(Clone, Debug)]
pub struct ReconcilerFlags {
    /// `--namespace` (its leader election Lease; excluded from sharding by default).
    pub namespace: String,
    /// `--identity`.
    pub identity: String,
    /// `--webhook-url` (base URL).
    pub webhook_url: String,
    /// `--webhook-ca-file`.
    pub ca_file: PathBuf,
    /// `--ring-selector`.
    pub ring_selector: String,
    /// More flags.
    pub extra: Vec<String>,
}

impl ReconcilerFlags {
    /// Sets `flag` (`--name`) to `value` among the extra flags, replacing a value given before.
    pub fn set(&mut self, flag: &str, value: &str) {
        match self.extra.iter().position(|f| f == flag) {
            Some(i) if i + 1 < self.extra.len() => self.extra[i + 1] = value.to_owned(),
            _ => self.extra.extend([flag.to_owned(), value.to_owned()]),
        }
    }
}

/// A running `sharder-reconciler`.
#[derive(Debug)]
pub struct Reconciler {
    /// The process.
    pub process: Process,
    /// Its admin address.
    pub admin: SocketAddr,
}

impl Reconciler {
    /// Starts reconciler `name`; returns once it is ready (it may still wait for leadership).
    pub async fn start(name: &str, env: &Env, flags: &ReconcilerFlags) -> Result<Self, Error> {
        let mut args = strings(&[
            "--namespace",
            &flags.namespace,
            "--identity",
            &flags.identity,
            "--webhook-url",
            &flags.webhook_url,
            "--ring-selector",
            &flags.ring_selector,
        ]);
        args.push("--webhook-ca-file".into());
        args.push(path(&flags.ca_file));
        args.extend(flags.extra.iter().cloned());
        let (mut process, admin, _) =
            Process::start(name, "sharder-reconciler", env, &args, 1).await?;
        process.wait_ready(admin).await?;
        Ok(Self { process, admin })
    }

    /// The reconciler's metrics (Prometheus text).
    pub async fn metrics(&self) -> String {
        metrics(self.admin).await
    }

    /// What its metrics say of `ring`'s rebalances now.
    pub async fn rebalances(&self, ring: &RingId) -> Rebalances {
        Rebalances::of(&self.metrics().await, ring)
    }

    /// Polls its metrics of `ring` every 50 ms until `check` holds for them (`what` describes
    /// it) and returns them; fails at once if the process exits first.
    pub async fn wait_for_rebalances(
        &mut self,
        ring: &RingId,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Rebalances) -> bool,
    ) -> Result<Rebalances, Error> {
        let started = Instant::now();
        loop {
            let now = self.rebalances(ring).await;
            if check(&now) {
                return Ok(now);
            }
            if let Some(status) = self.process.try_wait() {
                return Err(self
                    .process
                    .failed(&format!("exited with {status} before {what}")));
            }
            if started.elapsed() > timeout {
                return Err(self
                    .process
                    .failed(&format!("not {what} within {timeout:?}: {now:?}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The flags of an example shard (`checksum-controller`) started by tests.
#[derive(Clone, Debug)]
pub struct ShardFlags {
    /// `--controllerring` or `--clusterring`, by the ring's kind.
    pub ring: RingId,
    /// `--shard-name`.
    pub name: String,
    /// `--lease-namespace` and `--namespace` (the watched namespace).
    pub namespace: String,
    /// `--lease-duration`.
    pub lease_duration: Duration,
    /// `--lease-renew`.
    pub lease_renew: Duration,
    /// `--reconcile-delay`.
    pub reconcile_delay: Duration,
    /// `--record-file`.
    pub record_file: Option<PathBuf>,
    /// More flags (e.g. `--stable-name`).
    pub extra: Vec<String>,
}

/// A running example shard.
#[derive(Debug)]
pub struct Shard {
    /// The process.
    pub process: Process,
    /// Its admin address (`/readyz` answers 200 while it holds its Lease).
    pub admin: SocketAddr,
}

impl Shard {
    /// Starts the shard; returns once its admin server is up (not necessarily holding its
    /// Lease yet).
    pub async fn start(env: &Env, flags: &ShardFlags) -> Result<Self, Error> {
        let millis = |d: Duration| format!("{}ms", d.as_millis());
        let ring_flag = match flags.ring.kind {
            RingKind::ControllerRing => "--controllerring",
            RingKind::ClusterRing => "--clusterring",
        };
        let mut args = strings(&[
            ring_flag,
            &flags.ring.name,
            "--shard-name",
            &flags.name,
            "--lease-namespace",
            &flags.namespace,
            "--namespace",
            &flags.namespace,
            "--lease-duration",
            &millis(flags.lease_duration),
            "--lease-renew",
            &millis(flags.lease_renew),
            "--reconcile-delay",
            &millis(flags.reconcile_delay),
        ]);
        if let Some(record) = &flags.record_file {
            args.push("--record-file".into());
            args.push(path(record));
        }
        args.extend(flags.extra.iter().cloned());
        let (process, admin, _) =
            Process::start(&flags.name, "checksum-controller", env, &args, 1).await?;
        Ok(Self { process, admin })
    }
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Component logs by process name, for dumping the tails of a failed test.
pub fn dump_logs(dir: &Path, names: impl IntoIterator<Item = String>, lines: usize) {
    let mut seen = BTreeMap::new();
    for name in names {
        seen.insert(name.clone(), dir.join(format!("{name}.log")));
    }
    for (name, file) in seen {
        let log = std::fs::read_to_string(file).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        eprintln!("----- {name} (last {lines} lines) -----");
        for line in tail.into_iter().rev() {
            eprintln!("{line}");
        }
    }
}
