//! Progress on stderr while the bench runs: every line carries the time since the start and an
//! estimate of what is left, so a user sees within a minute that it works and how long it
//! will take. The estimate is each section's expected length from its parameters
//! ([`crate::Section::estimate`]), less what the running section has used so far.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The run's plan: when it started, the sections still to end and their estimates, and when
/// the running one began.
struct Plan {
    started: Instant,
    left: Vec<(&'static str, Duration)>,
    section_started: Instant,
}

fn plan() -> &'static Mutex<Plan> {
    static PLAN: OnceLock<Mutex<Plan>> = OnceLock::new();
    PLAN.get_or_init(|| {
        Mutex::new(Plan {
            started: Instant::now(),
            left: Vec::new(),
            section_started: Instant::now(),
        })
    })
}

/// Starts the clock with the sections to run and their estimates, in order.
pub(crate) fn start(sections: Vec<(&'static str, Duration)>) {
    let (count, total) = (sections.len(), sections.iter().map(|s| s.1).sum());
    let mut p = plan().lock().unwrap_or_else(PoisonError::into_inner);
    p.started = Instant::now();
    p.section_started = p.started;
    p.left = sections;
    drop(p);
    say(&format!(
        "{count} steps to run, about {} in all (an estimate from the parameters)",
        minutes(total)
    ));
}

/// Marks section `name` as running from now.
pub(crate) fn begin(name: &str) {
    plan()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .section_started = Instant::now();
    say(name);
}

/// Marks section `name` as done (its estimate leaves what is left).
pub(crate) fn end(name: &str) {
    let mut p = plan().lock().unwrap_or_else(PoisonError::into_inner);
    let took = p.section_started.elapsed();
    p.left.retain(|s| s.0 != name);
    drop(p);
    say(&format!("{name}: done in {}", minutes(took)));
}

/// How long the run has taken so far.
pub(crate) fn elapsed() -> Duration {
    plan()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .started
        .elapsed()
}

/// Prints `what` on stderr after the elapsed time and the estimate of what is left.
pub(crate) fn say(what: &str) {
    let p = plan().lock().unwrap_or_else(PoisonError::into_inner);
    let left = left(p.left.iter().map(|s| s.1), p.section_started.elapsed());
    let elapsed = p.started.elapsed();
    drop(p);
    eprintln!(
        "[bench {} | ~{} left] {what}",
        minutes(elapsed),
        minutes(left)
    );
}

/// What is left: the estimates of the sections not done, the running one (the first) less
/// what it has used (never below zero).
fn left(estimates: impl Iterator<Item = Duration>, running_for: Duration) -> Duration {
    let mut estimates = estimates;
    let Some(running) = estimates.next() else {
        return Duration::ZERO;
    };
    running.saturating_sub(running_for) + estimates.sum::<Duration>()
}

/// `m:ss`.
fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

/// Prints a line of progress (`format!` arguments) with the elapsed time and what is left.
macro_rules! progress {
    ($($arg:tt)*) => {
        $crate::progress::say(&format!($($arg)*))
    };
}
pub(crate) use progress;

/// Counts work done of a known total and says so at most every few seconds (and at the end).
pub(crate) struct Counter {
    what: String,
    total: usize,
    done: usize,
    said: Instant,
}

impl Counter {
    /// A counter of `total` items of `what` (e.g. "objects created in ns").
    pub(crate) fn new(what: impl Into<String>, total: usize) -> Self {
        Self {
            what: what.into(),
            total,
            done: 0,
            said: Instant::now(),
        }
    }

    /// Counts `n` more; says how far once 5 s went by since it last did, or at the total.
    pub(crate) fn add(&mut self, n: usize) {
        self.done += n;
        if self.said.elapsed() >= Duration::from_secs(5) || self.done == self.total {
            self.said = Instant::now();
            say(&format!("  {}: {} of {}", self.what, self.done, self.total));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left_is_the_running_estimate_less_its_time_and_every_later_one() {
        let s = Duration::from_secs;
        assert_eq!(left([s(60), s(30)].into_iter(), s(20)), s(70));
        assert_eq!(left([s(60), s(30)].into_iter(), s(90)), s(30));
        assert_eq!(left(std::iter::empty(), s(5)), s(0));
        assert_eq!(minutes(s(125)), "2:05");
    }
}
