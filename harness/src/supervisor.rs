//! Starts and reaps the child processes of tests so that none outlives the test binary.
//!
//! Three layers make sure of it:
//! - every child is spawned from one long-lived supervisor thread with `PR_SET_PDEATHSIG =
//!   SIGKILL`, so the kernel kills it when the test binary dies, even by SIGKILL (the signal fires
//!   when the *thread* that forked exits, hence the dedicated thread that never does);
//! - an `atexit` hook kills every registered child and removes registered temp folders when the
//!   test binary exits normally (libtest exits through `exit` after all tests, panics included);
//! - [`Supervised`] kills its child on drop, for processes a single test owns.
#![allow(unsafe_code)]

use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

type SpawnReply = mpsc::Sender<io::Result<Child>>;

/// Runs `wait`, a call that blocks (a process run to its end), from async code without holding
/// up the runtime's other tasks: on a multi-thread runtime the worker hands them to another
/// thread first ([`tokio::task::block_in_place`]). A worker blocked otherwise keeps the task it
/// was about to run next, which no other worker may take (docs/performance-notes.md, "A blocked
/// worker and the bench smoke's Leases").
pub fn blocking<T>(wait: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
        _ => wait(),
    }
}

static SPAWNER: OnceLock<Mutex<mpsc::Sender<(Command, SpawnReply)>>> = OnceLock::new();
static CHILDREN: Mutex<Vec<Child>> = Mutex::new(Vec::new());
static TEMP_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static EXIT_COMMANDS: Mutex<Vec<Command>> = Mutex::new(Vec::new());
static EXIT_HOOK: OnceLock<()> = OnceLock::new();

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

extern "C" fn on_exit() {
    for mut child in lock(&CHILDREN).drain(..) {
        let _ = child.kill();
        let _ = child.wait();
    }
    if std::env::var_os("SHARDER_KEEP_TMP").is_none() {
        for mut command in lock(&EXIT_COMMANDS).drain(..) {
            let _ = command.status();
        }
        for dir in lock(&TEMP_DIRS).drain(..) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn install_exit_hook() {
    EXIT_HOOK.get_or_init(|| {
        // SAFETY: `on_exit` is a plain `extern "C"` function without arguments that does not
        // unwind (every fallible call's result is ignored).
        unsafe {
            libc::atexit(on_exit);
        }
    });
}

fn spawner() -> &'static Mutex<mpsc::Sender<(Command, SpawnReply)>> {
    SPAWNER.get_or_init(|| {
        install_exit_hook();
        let (tx, rx) = mpsc::channel::<(Command, SpawnReply)>();
        std::thread::Builder::new()
            .name("sharder-test-supervisor".into())
            .spawn(move || {
                // The sender lives in a static, so this loop runs until the process exits.
                for (mut command, reply) in rx {
                    // SAFETY: the closure runs between fork and exec and only calls prctl(2),
                    // which is async-signal-safe; it allocates nothing.
                    unsafe {
                        command.pre_exec(|| {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawn the test supervisor thread");
        Mutex::new(tx)
    })
}

fn spawn_from_supervisor(command: Command) -> io::Result<Child> {
    let (reply_tx, reply_rx) = mpsc::channel();
    lock(spawner())
        .send((command, reply_tx))
        .map_err(|_| io::Error::other("test supervisor thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("test supervisor thread is gone"))?
}

/// Spawns a child that lives until the test binary exits (then it is killed).
pub(crate) fn spawn_for_process_lifetime(command: Command) -> io::Result<u32> {
    let child = spawn_from_supervisor(command)?;
    let pid = child.id();
    lock(&CHILDREN).push(child);
    Ok(pid)
}

/// Whether a child registered with [`spawn_for_process_lifetime`] has exited, and how.
pub(crate) fn lifetime_child_status(pid: u32) -> Option<ExitStatus> {
    lock(&CHILDREN)
        .iter_mut()
        .find(|c| c.id() == pid)
        .and_then(|c| c.try_wait().ok().flatten())
}

/// Registers a folder to remove when the test binary exits (kept when `SHARDER_KEEP_TMP` is set).
pub(crate) fn remove_at_exit(dir: PathBuf) {
    install_exit_hook();
    lock(&TEMP_DIRS).push(dir);
}

/// Registers a command to run when the test binary exits, after its children are killed (not
/// when `SHARDER_KEEP_TMP` is set): the removal of what they leave outside their processes.
pub(crate) fn run_at_exit(command: Command) {
    install_exit_hook();
    lock(&EXIT_COMMANDS).push(command);
}

/// A child process owned by one test: killed (SIGKILL) and reaped on drop, and killed by the
/// kernel if the test binary dies first.
#[derive(Debug)]
pub struct Supervised {
    child: Option<Child>,
    name: String,
}

impl Supervised {
    /// Spawns `command`; `name` appears in errors.
    pub fn spawn(name: impl Into<String>, command: Command) -> io::Result<Self> {
        let name = name.into();
        let child = spawn_from_supervisor(command)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start {name}: {e}")))?;
        Ok(Self {
            child: Some(child),
            name,
        })
    }

    /// The process's stdout, if it was piped (once).
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.as_mut()?.stdout.take()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The exit status if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends `signal` (for example SIGTERM for a graceful stop, SIGKILL for a crash).
    pub fn signal(&self, signal: Signal) -> io::Result<()> {
        let pid = i32::try_from(self.pid()).map_err(io::Error::other)?;
        kill(Pid::from_raw(pid), signal).map_err(io::Error::from)
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then SIGKILL if the process has not exited after `grace`.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.try_wait().is_none() {
            let _ = self.signal(Signal::SIGTERM);
            if let Some(status) = self.wait_timeout(grace) {
                return Some(status);
            }
        }
        self.kill()
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn a_blocking_call_leaves_the_runtimes_other_tasks_running() {
        // One worker: a call that blocked it without handing its tasks over would stop the
        // ticker for the whole call.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .expect("runtime");
        let ticks = Arc::new(AtomicU32::new(0));
        let counted = ticks.clone();
        runtime.spawn(async move {
            loop {
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let during = runtime.block_on(async move {
            tokio::spawn(async move {
                let before = ticks.load(Ordering::Relaxed);
                blocking(|| std::thread::sleep(Duration::from_millis(500)));
                ticks.load(Ordering::Relaxed) - before
            })
            .await
            .expect("the blocking task")
        });
        assert!(during >= 10, "{during} ticks in 500 ms");
        assert_eq!(blocking(|| 7), 7, "outside a runtime it just runs");
    }
}
