//! Supervised tasks: the long-running parts of a component (servers, watches, controllers) run
//! as named tasks that end only when asked to stop. A task that ends by itself, fails or panics
//! stops the others and makes [`Tasks::supervise`] fail naming it, so the process exits with an
//! error (and is restarted) instead of running on without a part it needs.

use std::fmt::Display;
use std::future::Future;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::Error;

/// A set of named tasks that run until `stop` is cancelled.
pub struct Tasks {
    set: JoinSet<(String, Result<(), String>)>,
    stop: CancellationToken,
}

impl Tasks {
    /// An empty set whose tasks are expected to end once `stop` is cancelled.
    pub fn new(stop: CancellationToken) -> Self {
        Self {
            set: JoinSet::new(),
            stop,
        }
    }

    /// The token that asks every task to stop.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// Runs `task` as `name`.
    pub fn spawn<F, E>(&mut self, name: impl Into<String>, task: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Display,
    {
        let name = name.into();
        self.set.spawn(async move {
            let result = task.await.map_err(|e| e.to_string());
            (name, result)
        });
    }

    /// Waits until every task ended. `Ok` when all ended after `stop` was cancelled without an
    /// error. When a task fails, panics, or ends before `stop` was cancelled, `stop` is
    /// cancelled so the others end too, and once they did the first such task is reported.
    pub async fn supervise(mut self) -> Result<(), Error> {
        let mut first: Option<Error> = None;
        while let Some(joined) = self.set.join_next().await {
            let failure = match joined {
                Ok((_, Ok(()))) if self.stop.is_cancelled() => None,
                Ok((task, Ok(()))) => Some(Error::TaskEnded {
                    task,
                    reason: "ended without being asked to stop".to_owned(),
                }),
                Ok((task, Err(reason))) => Some(Error::TaskEnded { task, reason }),
                Err(e) => Some(Error::TaskEnded {
                    task: "a task".to_owned(),
                    reason: if e.is_panic() {
                        "panicked".to_owned()
                    } else {
                        e.to_string()
                    },
                }),
            };
            if let Some(failure) = failure {
                error!(error = %failure, "stopping every other task");
                self.stop.cancel();
                first.get_or_insert(failure);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn until(stop: CancellationToken) -> Result<(), String> {
        stop.cancelled().await;
        Ok(())
    }

    #[tokio::test]
    async fn tasks_that_end_when_asked_to_stop_are_fine() {
        let stop = CancellationToken::new();
        let mut tasks = Tasks::new(stop.clone());
        tasks.spawn("a", until(stop.clone()));
        tasks.spawn("b", until(stop.clone()));
        stop.cancel();
        tasks.supervise().await.expect("graceful");
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_ending_by_itself_stops_the_others_and_is_named() {
        let stop = CancellationToken::new();
        let mut tasks = Tasks::new(stop.clone());
        tasks.spawn("server", until(stop.clone()));
        tasks.spawn("watch", async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<(), String>(())
        });
        let err = tasks.supervise().await.expect_err("the watch ended");
        assert_eq!(
            err.to_string(),
            "task watch ended unexpectedly: ended without being asked to stop"
        );
        assert!(stop.is_cancelled(), "the others were asked to stop");
    }

    #[tokio::test]
    async fn a_failing_task_is_reported_with_its_error() {
        let stop = CancellationToken::new();
        let mut tasks = Tasks::new(stop.clone());
        tasks.spawn("server", until(stop.clone()));
        tasks.spawn("admin", async { Err::<(), _>("address in use") });
        let err = tasks.supervise().await.expect_err("admin failed");
        assert_eq!(
            err.to_string(),
            "task admin ended unexpectedly: address in use"
        );
    }

    #[tokio::test]
    async fn a_panicking_task_is_reported() {
        let stop = CancellationToken::new();
        let mut tasks = Tasks::new(stop.clone());
        tasks.spawn("server", until(stop.clone()));
        tasks.spawn("broken", async {
            if stop_never() {
                return Ok::<(), String>(());
            }
            panic!("boom")
        });
        let err = tasks.supervise().await.expect_err("panicked");
        assert!(err.to_string().ends_with("panicked"), "{err}");
    }

    fn stop_never() -> bool {
        false
    }

    #[tokio::test]
    async fn a_failure_after_the_stop_is_still_reported() {
        let stop = CancellationToken::new();
        let mut tasks = Tasks::new(stop.clone());
        let token = stop.clone();
        tasks.spawn("server", async move {
            token.cancelled().await;
            Err::<(), _>("could not drain connections")
        });
        stop.cancel();
        assert!(tasks.supervise().await.is_err());
    }
}
