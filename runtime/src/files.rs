//! Files that change under a running process: certificates and CA bundles mounted from Secrets
//! or ConfigMaps.
//!
//! Kubernetes updates such volumes by swapping a symlink (`..data`), which inotify on the file
//! path does not report; so the files are re-read on an interval and compared with what was
//! loaded. Contents that do not read or do not load (a certificate replaced but not yet its key,
//! a half-written bundle) keep what was loaded in service and are tried again on the next tick.

use std::fmt::Display;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Re-reads with `read` every `interval` until `shutdown`; when the contents differ from
/// `loaded`, hands them to `apply` and remembers them once it succeeds. `what` names the files
/// in the warnings (e.g. `"the TLS files"`); `apply` logs what it did.
pub async fn reload_on_change<T, E>(
    what: &'static str,
    interval: Duration,
    mut loaded: T,
    mut read: impl FnMut() -> Result<T, E>,
    mut apply: impl FnMut(&T) -> Result<(), E>,
    shutdown: CancellationToken,
) where
    T: PartialEq,
    E: Display,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let current = match read() {
            Ok(current) => current,
            Err(e) => {
                warn!(error = %e, "cannot read {what}, keeping what was loaded");
                continue;
            }
        };
        if current == loaded {
            continue;
        }
        match apply(&current) {
            Ok(()) => loaded = current,
            Err(e) => warn!(error = %e, "changed {what} do not load yet, keeping what was loaded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn changed_contents_are_applied_once_and_bad_ones_keep_the_loaded() {
        // What the "file" holds at each tick; "bad" does not load, "gone" does not read.
        let contents = Arc::new(Mutex::new("a".to_owned()));
        let applied = Arc::new(Mutex::new(Vec::new()));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let contents = contents.clone();
            let applied = applied.clone();
            let shutdown = shutdown.clone();
            reload_on_change(
                "the test file",
                Duration::from_secs(1),
                "a".to_owned(),
                move || {
                    let c = contents.lock().expect("lock").clone();
                    if c == "gone" {
                        Err("no such file".to_owned())
                    } else {
                        Ok(c)
                    }
                },
                move |c: &String| {
                    if c == "bad" {
                        return Err("does not parse".to_owned());
                    }
                    applied.lock().expect("lock").push(c.clone());
                    Ok(())
                },
                shutdown,
            )
        });
        let step = |to: &str| {
            *contents.lock().expect("lock") = to.to_owned();
        };
        let tick = || tokio::time::sleep(Duration::from_millis(1_001));
        tick().await;
        step("b");
        tick().await;
        tick().await;
        step("bad");
        tick().await;
        step("gone");
        tick().await;
        step("b");
        tick().await;
        step("c");
        tick().await;
        shutdown.cancel();
        task.await.expect("task");
        assert_eq!(*applied.lock().expect("lock"), ["b", "c"]);
    }
}
