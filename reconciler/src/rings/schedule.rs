//! When a ring is rebalanced and what is listed (docs/design.md §2, step 3): pure functions of
//! what the controller remembers of the ring ([`Progress`]), what it observes ([`Observed`]) and
//! a given instant, so every rule is tested with chosen instants. A full list covers what the
//! others would and replaces them; a failed rebalance's lists come again after a backoff.

use std::collections::BTreeSet;
use std::time::Duration;

use sharder_common::Keying;
use tokio::time::Instant;

use crate::terms::{MAX_AWAITING, ObjectId, Pass, Scope};

/// The shortest requeue, so a busy ring never spins.
pub(crate) const MIN_REQUEUE: Duration = Duration::from_millis(100);

/// The wait before a failed rebalance's work is tried again the first time.
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(2);

/// Timing of rebalances.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Intervals {
    /// Full resync of every ring.
    pub resync: Duration,
    /// The sweep of a quiet ring: the objects no available shard holds ([`Scope::Stray`]).
    pub sweep: Duration,
    /// Follow-up sweeps while drains are not acknowledged yet.
    pub drain_check: Duration,
}

/// What the ring looks like now.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Observed<'a> {
    /// The ring's uid (a recreated ring is a new ring).
    pub uid: &'a str,
    /// Its generation (spec changes).
    pub generation: i64,
    /// What it hashes (an annotation: no generation counts its changes).
    pub keying: Keying,
    /// Its available shards.
    pub available: &'a BTreeSet<String>,
}

/// What the controller remembers of a ring between reconciles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Progress {
    /// The uid it was remembered for.
    pub uid: String,
    /// The generation last acted on.
    pub generation: i64,
    /// The keying last acted on.
    pub keying: Keying,
    /// The available shards last rebalanced for.
    pub available: BTreeSet<String>,
    /// When the last full list ended.
    pub last_full: Instant,
    /// When the last pass of any lists ended.
    pub last_rebalance: Instant,
    /// Where the ring's moves stand.
    pub moves: Moves,
    /// The full list the ring is owed beyond its schedule.
    pub owed: Owed,
    /// Failed passes in a row (their work comes again after [`retry_delay`]).
    pub failures: u32,
    /// When the last failed pass ended.
    pub last_failure: Instant,
}

/// Where a ring's moves stand after its last pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Moves {
    /// Done until the ring's next change, sweep, resync or retry.
    #[default]
    Done,
    /// Drain checks follow: drains are pending, or children wait for their owners.
    Draining {
        /// Whether drains were pending (then everything is listed once none is,
        /// [`Scope::AfterDrains`]).
        drains_pending: bool,
        /// Controlled objects waiting for their owner, or whose write failed.
        awaiting: Vec<ObjectId>,
    },
}

/// The full list a ring is owed beyond its schedule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Owed {
    /// None.
    #[default]
    Nothing,
    /// At the next reconcile: a full list failed, or more than [`MAX_AWAITING`] children
    /// waited.
    FullList,
    /// At its retry: a full list failed only through writes refused for good (drain checks
    /// before it list what they select).
    FullListAtRetry,
}

impl Progress {
    /// Whether drain checks are due (drains pending, or controlled objects waiting).
    pub(crate) fn drain_checks_due(&self) -> bool {
        matches!(self.moves, Moves::Draining { .. })
    }

    /// Whether every object is where the ring puts it, as far as the controller knows: no
    /// drain check due, no failed work to try again, no full list owed.
    pub(crate) fn settled(&self) -> bool {
        !self.drain_checks_due() && self.failures == 0 && self.owed == Owed::Nothing
    }

    fn drains_pending(&self) -> bool {
        matches!(
            self.moves,
            Moves::Draining {
                drains_pending: true,
                ..
            }
        )
    }

    fn awaiting(&self) -> &[ObjectId] {
        match &self.moves {
            Moves::Draining { awaiting, .. } => awaiting,
            Moves::Done => &[],
        }
    }
}

/// How a rebalance went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ran {
    /// Whether it listed everything.
    pub full: bool,
    /// Whether drains are still pending (or the list after them must come again).
    pub drains_pending: bool,
    /// Whether any list or write failed (the same work is then tried again).
    pub failed: bool,
    /// Whether it failed only through writes the apiserver refused for good.
    pub refused: bool,
    /// Controlled objects still waiting for their owners.
    pub awaiting: Vec<ObjectId>,
}

impl Ran {
    /// Whether drain checks follow it: drains pending or controlled objects waiting.
    pub(crate) fn drain_checks(&self) -> bool {
        self.drains_pending || !self.awaiting.is_empty()
    }
}

/// The remembered progress of the ring `observed` shows, if it is the same ring.
fn same_ring<'p>(progress: Option<&'p Progress>, observed: &Observed<'_>) -> Option<&'p Progress> {
    progress.filter(|p| p.uid == observed.uid)
}

/// The rebalance to run now, if any: the lists due ([`scopes`]) and the children waiting
/// for their owners; none while no shard is available.
pub(crate) fn next_pass(
    progress: Option<&Progress>,
    observed: &Observed<'_>,
    intervals: &Intervals,
    now: Instant,
) -> Option<Pass> {
    if observed.available.is_empty() {
        return None;
    }
    let lists = scopes(progress, observed, intervals, now);
    let same = same_ring(progress, observed);
    let recheck = match same {
        Some(p) if !lists.contains(&Scope::All) => p.awaiting().to_vec(),
        _ => Vec::new(),
    };
    // Children wait only while drain checks are due, so they never make a pass without lists.
    (!lists.is_empty()).then(|| Pass {
        lists,
        recheck,
        drain_checks_due: same.is_some_and(Progress::drain_checks_due),
        drains_pending: same.is_some_and(Progress::drains_pending),
    })
}

/// The lists to run now.
fn scopes(
    progress: Option<&Progress>,
    observed: &Observed<'_>,
    intervals: &Intervals,
    now: Instant,
) -> BTreeSet<Scope> {
    let Some(p) = same_ring(progress, observed) else {
        return [Scope::All].into();
    };
    let retry_due = p.owed != Owed::FullListAtRetry
        || now.saturating_duration_since(p.last_failure) >= retry_delay(p.failures, intervals);
    if p.generation != observed.generation
        || p.keying != observed.keying
        || (p.owed != Owed::Nothing && retry_due)
        || observed.available.difference(&p.available).next().is_some()
        || now.saturating_duration_since(p.last_full) >= intervals.resync
    {
        return [Scope::All].into();
    }
    let mut scopes: BTreeSet<Scope> = p
        .available
        .difference(observed.available)
        .map(|dead| Scope::OnShard(dead.clone()))
        .collect();
    if p.drain_checks_due() {
        scopes.insert(Scope::Unassigned);
    } else if (p.failures > 0 && p.owed == Owed::Nothing && scopes.is_empty())
        || now.saturating_duration_since(p.last_rebalance) >= intervals.sweep
    {
        // A failed sweep is swept again at the retry (a dead shard's list, listed again while
        // the shard's objects were not all moved, selects what failed there).
        scopes.insert(Scope::Stray);
    }
    scopes
}

/// What to remember after a reconcile at `now` (`ran`: `None` if nothing was listed). A failed
/// rebalance keeps the previous shards so its work comes again; a full list refused for good
/// keeps the observed ones and waits for its own retry, which drain checks do not push back.
pub(crate) fn progress_after(
    progress: Option<&Progress>,
    observed: &Observed<'_>,
    ran: Option<Ran>,
    now: Instant,
) -> Progress {
    let previous = same_ring(progress, observed);
    let held = previous.is_some_and(|p| p.owed == Owed::FullListAtRetry);
    let mut next = Progress {
        uid: observed.uid.to_owned(),
        generation: observed.generation,
        keying: observed.keying,
        available: observed.available.clone(),
        last_full: previous.map_or(now, |p| p.last_full),
        last_rebalance: previous.map_or(now, |p| p.last_rebalance),
        moves: previous.map(|p| p.moves.clone()).unwrap_or_default(),
        owed: previous.map_or(Owed::Nothing, |p| p.owed),
        failures: previous.filter(|_| held).map_or(0, |p| p.failures),
        last_failure: previous.map_or(now, |p| p.last_failure),
    };
    if let Some(ran) = ran {
        if ran.full {
            next.last_full = now;
        }
        next.last_rebalance = now;
        let too_many = ran.awaiting.len() > MAX_AWAITING;
        // What a failed full list did not reach is known nowhere else (a resync or a spec
        // change would not come again): everything is listed again, until a full list goes
        // through.
        next.owed = match (too_many, ran.full) {
            (true, _) => Owed::FullList,
            (false, true) if ran.refused => Owed::FullListAtRetry,
            (false, true) if ran.failed => Owed::FullList,
            (false, false) if held => Owed::FullListAtRetry,
            _ => Owed::Nothing,
        };
        next.moves = if ran.drain_checks() {
            Moves::Draining {
                drains_pending: ran.drains_pending,
                awaiting: if too_many { Vec::new() } else { ran.awaiting },
            }
        } else {
            Moves::Done
        };
        let refused = next.owed == Owed::FullListAtRetry;
        if ran.failed {
            if !refused {
                next.available = previous.map(|p| p.available.clone()).unwrap_or_default();
            }
            // A refused full list's retry is pushed back by its own failures only: a drain
            // check failing meanwhile is not the same work.
            if ran.full || !held {
                next.failures = previous.map_or(0, |p| p.failures).saturating_add(1);
                next.last_failure = now;
            }
        } else if !refused {
            next.failures = 0;
        }
    }
    next
}

/// The wait after `failures` failed rebalances in a row: [`FIRST_RETRY`] doubled for each
/// failure after the first, at most the sweep interval.
pub(crate) fn retry_delay(failures: u32, intervals: &Intervals) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_RETRY
        .saturating_mul(1 << doublings)
        .min(intervals.sweep)
}

/// How long until the ring's next resync, sweep, drain check or retry; at least [`MIN_REQUEUE`].
pub(crate) fn requeue_after(progress: &Progress, intervals: &Intervals, now: Instant) -> Duration {
    let until_resync = intervals
        .resync
        .saturating_sub(now.saturating_duration_since(progress.last_full));
    let until_sweep = intervals
        .sweep
        .saturating_sub(now.saturating_duration_since(progress.last_rebalance));
    let mut wait = until_resync.min(until_sweep);
    if progress.drain_checks_due() {
        wait = wait.min(intervals.drain_check);
    }
    let since = now.saturating_duration_since(progress.last_failure);
    let until_retry = retry_delay(progress.failures, intervals).saturating_sub(since);
    // A retry already due did not run because nothing could (no shard is available): the
    // shards' return brings the ring back.
    if progress.failures > 0 && !until_retry.is_zero() {
        wait = wait.min(until_retry);
    }
    wait.max(MIN_REQUEUE)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVALS: Intervals = Intervals {
        resync: Duration::from_secs(300),
        sweep: Duration::from_secs(30),
        drain_check: Duration::from_secs(2),
    };

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    fn observed<'a>(available: &'a BTreeSet<String>, generation: i64) -> Observed<'a> {
        Observed {
            uid: "uid-1",
            generation,
            keying: Keying::Object,
            available,
        }
    }

    fn progress(available: &[&str], at: Instant) -> Progress {
        Progress {
            uid: "uid-1".into(),
            generation: 1,
            keying: Keying::Object,
            available: set(available),
            last_full: at,
            last_rebalance: at,
            moves: Moves::Done,
            owed: Owed::Nothing,
            failures: 0,
            last_failure: at,
        }
    }

    /// A rebalance that listed everything (`full`) or not, and `failed` or not, with no drain
    /// pending and no child waiting.
    fn ran(full: bool, failed: bool) -> Ran {
        Ran {
            full,
            drains_pending: false,
            failed,
            refused: false,
            awaiting: Vec::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_ring_is_settled_only_with_no_drain_check_retry_or_full_list_ahead() {
        let done = progress(&["a"], Instant::now());
        let draining = |drains_pending| Progress {
            moves: Moves::Draining {
                drains_pending,
                awaiting: Vec::new(),
            },
            ..done.clone()
        };
        let cases = [
            ("done", done.clone(), true),
            ("drains pending", draining(true), false),
            ("children waiting", draining(false), false),
            (
                "a failed pass to retry",
                Progress {
                    failures: 1,
                    ..done.clone()
                },
                false,
            ),
            (
                "a full list owed",
                Progress {
                    owed: Owed::FullList,
                    ..done.clone()
                },
                false,
            ),
            (
                "a full list owed at the retry",
                Progress {
                    owed: Owed::FullListAtRetry,
                    ..done.clone()
                },
                false,
            ),
        ];
        for (case, progress, settled) in cases {
            assert_eq!(progress.settled(), settled, "{case}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_recreated_changed_or_grown_ring_is_listed_in_full() {
        let t0 = Instant::now();
        let ab = set(&["a", "b"]);
        let abc = set(&["a", "b", "c"]);
        let known = progress(&["a", "b"], t0);
        let recreated = Progress {
            uid: "uid-0".into(),
            ..known.clone()
        };
        let all: BTreeSet<Scope> = [Scope::All].into();
        let table = [
            ("never seen", None, observed(&ab, 1)),
            ("recreated", Some(&recreated), observed(&ab, 1)),
            ("spec changed", Some(&known), observed(&ab, 2)),
            ("shard added", Some(&known), observed(&abc, 1)),
            (
                "keyed by namespace now",
                Some(&known),
                Observed {
                    keying: Keying::Namespace,
                    ..observed(&ab, 1)
                },
            ),
        ];
        for (what, progress, observed) in table {
            assert_eq!(scopes(progress, &observed, &INTERVALS, t0), all, "{what}");
        }
        assert!(
            scopes(Some(&known), &observed(&ab, 1), &INTERVALS, t0).is_empty(),
            "nothing changed: nothing to list"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn resyncs_and_sweeps_of_strays_from_the_cache_come_when_their_intervals_pass() {
        let t0 = Instant::now();
        let ab = set(&["a", "b"]);
        let known = progress(&["a", "b"], t0);
        let at = |seconds| t0 + Duration::from_secs(seconds);
        assert!(scopes(Some(&known), &observed(&ab, 1), &INTERVALS, at(29)).is_empty());
        assert_eq!(
            scopes(Some(&known), &observed(&ab, 1), &INTERVALS, at(30)),
            [Scope::Stray].into()
        );
        let draining = Progress {
            moves: draining(false, &[]),
            ..known.clone()
        };
        assert_eq!(
            scopes(Some(&draining), &observed(&ab, 1), &INTERVALS, at(30)),
            [Scope::Unassigned].into(),
            "while drains are pending, the unassigned objects are listed"
        );
        assert_eq!(
            scopes(Some(&known), &observed(&ab, 1), &INTERVALS, at(300)),
            [Scope::All].into()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_shard_is_listed_by_its_label_and_pending_drains_are_swept() {
        let t0 = Instant::now();
        let a = set(&["a"]);
        let known = progress(&["a", "b", "c"], t0);
        assert_eq!(
            scopes(Some(&known), &observed(&a, 1), &INTERVALS, t0),
            [Scope::OnShard("b".into()), Scope::OnShard("c".into())].into()
        );
        let draining = Progress {
            moves: draining(false, &[]),
            ..progress(&["a"], t0)
        };
        assert_eq!(
            scopes(Some(&draining), &observed(&a, 1), &INTERVALS, t0),
            [Scope::Unassigned].into()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn progress_remembers_what_ran_and_keeps_old_shards_after_a_failure() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(7);
        let ab = set(&["a", "b"]);
        let abc = set(&["a", "b", "c"]);
        let known = progress(&["a", "b"], t0);

        let idle = progress_after(Some(&known), &observed(&ab, 1), None, later);
        assert_eq!(idle, known, "nothing ran: nothing changes");

        let full = Ran {
            drains_pending: true,
            ..ran(true, false)
        };
        let after = progress_after(Some(&known), &observed(&abc, 1), Some(full.clone()), later);
        assert_eq!(
            (
                after.available.clone(),
                after.last_full,
                after.last_rebalance,
                after.drain_checks_due()
            ),
            (abc.clone(), later, later, true)
        );
        assert!(after.drains_pending());
        let ended = progress_after(
            Some(&after),
            &observed(&abc, 1),
            Some(ran(false, false)),
            later,
        );
        assert_eq!(
            (ended.drain_checks_due(), ended.drains_pending()),
            (false, false),
            "once no drain is pending"
        );

        let failed = Ran {
            failed: true,
            ..full
        };
        let retry = progress_after(Some(&known), &observed(&abc, 1), Some(failed), later);
        assert_eq!(retry.available, ab, "the added shard counts as new again");
        assert_eq!(
            scopes(Some(&retry), &observed(&abc, 1), &INTERVALS, later),
            [Scope::All].into(),
            "so the next reconcile lists again"
        );

        let first = progress_after(None, &observed(&ab, 3), None, later);
        assert_eq!((first.generation, first.last_full), (3, later));
    }

    #[tokio::test(start_paused = true)]
    async fn a_scale_out_refused_for_good_is_listed_again_at_its_retry_not_at_every_drain_check() {
        let t0 = Instant::now();
        let (ab, abc) = (set(&["a", "b"]), set(&["a", "b", "c"]));
        let known = progress(&["a", "b"], t0);
        let at = |seconds| t0 + Duration::from_secs(seconds);
        // The scale-out's full list: some moves forbidden, drains pending.
        let refused = Ran {
            drains_pending: true,
            refused: true,
            ..ran(true, true)
        };
        let held = progress_after(Some(&known), &observed(&abc, 1), Some(refused), at(0));
        assert_eq!(
            (held.owed, held.failures, &held.available),
            (Owed::FullListAtRetry, 1, &abc),
            "the added shard is not new again"
        );
        let drain_check = Ran {
            drains_pending: true,
            ..ran(false, false)
        };
        assert_eq!(
            scopes(Some(&held), &observed(&abc, 1), &INTERVALS, at(1)),
            [Scope::Unassigned].into(),
            "the drain checks before the retry list the unassigned objects only"
        );
        let checked = progress_after(
            Some(&held),
            &observed(&abc, 1),
            Some(drain_check.clone()),
            at(1),
        );
        assert_eq!(
            (checked.owed, checked.failures),
            (Owed::FullListAtRetry, 1),
            "still due"
        );
        let unreachable = Ran {
            failed: true,
            ..drain_check.clone()
        };
        let unreachable =
            progress_after(Some(&checked), &observed(&abc, 1), Some(unreachable), at(1));
        assert_eq!(
            (
                unreachable.owed,
                unreachable.failures,
                unreachable.last_failure
            ),
            (Owed::FullListAtRetry, 1, at(0)),
            "a failed drain check does not push the retry back"
        );
        assert_eq!(
            requeue_after(&checked, &INTERVALS, at(1)),
            Duration::from_secs(1),
            "the retry comes when due"
        );
        assert_eq!(
            scopes(Some(&checked), &observed(&abc, 1), &INTERVALS, at(2)),
            [Scope::All].into(),
            "everything again at the retry"
        );
        let abcd = set(&["a", "b", "c", "d"]);
        assert_eq!(
            scopes(Some(&checked), &observed(&abcd, 1), &INTERVALS, at(1)),
            [Scope::All].into(),
            "a shard added since is listed for at once"
        );
        let none = BTreeSet::new();
        let no_shards = progress_after(Some(&checked), &observed(&none, 1), None, at(3));
        assert_eq!(
            requeue_after(&no_shards, &INTERVALS, at(3)),
            INTERVALS.drain_check,
            "a retry due with no shard to list for waits for the shards, not at every turn"
        );
        let idle = Progress {
            moves: Moves::Done,
            ..checked.clone()
        };
        assert!(
            scopes(Some(&idle), &observed(&abc, 1), &INTERVALS, at(1)).is_empty(),
            "no drain pending: nothing before the retry"
        );

        // Refused again at the retry: the backoff doubles.
        let again = Ran {
            drains_pending: true,
            refused: true,
            ..ran(true, true)
        };
        let again = progress_after(Some(&checked), &observed(&abc, 1), Some(again), at(2));
        assert_eq!((again.failures, again.last_failure), (2, at(2)));
        assert_eq!(
            scopes(Some(&again), &observed(&abc, 1), &INTERVALS, at(5)),
            [Scope::Unassigned].into()
        );
        assert_eq!(
            scopes(Some(&again), &observed(&abc, 1), &INTERVALS, at(6)),
            [Scope::All].into()
        );
        let listed = progress_after(
            Some(&again),
            &observed(&abc, 1),
            Some(ran(true, false)),
            at(6),
        );
        assert_eq!(
            (listed.owed, listed.failures),
            (Owed::Nothing, 0),
            "once it went through"
        );

        // A full list that failed otherwise (a list, or a write that may go through the next
        // time: the apiserver away) is listed again at every drain check, as before.
        let away = Ran {
            drains_pending: true,
            ..ran(true, true)
        };
        let away = progress_after(Some(&known), &observed(&abc, 1), Some(away), at(0));
        assert_eq!((away.owed, &away.available), (Owed::FullList, &ab));
        assert_eq!(
            scopes(Some(&away), &observed(&abc, 1), &INTERVALS, at(0)),
            [Scope::All].into()
        );
        // So is a refused one whose retry then fails otherwise.
        let away = Ran {
            drains_pending: true,
            ..ran(true, true)
        };
        let away = progress_after(Some(&checked), &observed(&abc, 1), Some(away), at(2));
        assert_eq!(away.owed, Owed::FullList);
        assert_eq!(
            scopes(Some(&away), &observed(&abc, 1), &INTERVALS, at(2)),
            [Scope::All].into()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_resync_or_spec_change_is_listed_again_and_a_failed_sweep_swept_again() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(7);
        let ab = set(&["a", "b"]);
        let known = progress(&["a", "b"], t0);
        // The full list of a spec change (generation 2) failed: the shards did not change, so
        // only the failure brings the next full list.
        let after = progress_after(
            Some(&known),
            &observed(&ab, 2),
            Some(ran(true, true)),
            later,
        );
        assert_eq!(
            scopes(Some(&after), &observed(&ab, 2), &INTERVALS, later),
            [Scope::All].into(),
            "listed again"
        );
        assert!(
            !after.drain_checks_due(),
            "at the next reconcile, not at every drain check"
        );
        let listed = progress_after(
            Some(&after),
            &observed(&ab, 2),
            Some(ran(true, false)),
            later,
        );
        assert_eq!(listed.owed, Owed::Nothing, "once it went through");

        // A failed sweep: swept again at the retry, before the sweep interval passed.
        let after = progress_after(
            Some(&known),
            &observed(&ab, 1),
            Some(ran(false, true)),
            later,
        );
        assert_eq!(
            scopes(Some(&after), &observed(&ab, 1), &INTERVALS, later),
            [Scope::Stray].into()
        );
        let swept = progress_after(
            Some(&after),
            &observed(&ab, 1),
            Some(ran(false, false)),
            later,
        );
        assert!(
            scopes(Some(&swept), &observed(&ab, 1), &INTERVALS, later).is_empty(),
            "once it went through, the sweep interval again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_rebalance_is_tried_again_after_a_backoff_up_to_the_sweep_interval() {
        let t0 = Instant::now();
        let (a, abc) = (set(&["a"]), set(&["a", "b", "c"]));
        let known = progress(&["a", "b", "c"], t0);
        // Shards b and c died; moving their objects failed three times in a row.
        let mut after = known.clone();
        for _ in 0..3 {
            after = progress_after(Some(&after), &observed(&a, 1), Some(ran(false, true)), t0);
        }
        assert_eq!(after.failures, 3);
        assert_eq!(
            after.available, abc,
            "the dead shards are still to be emptied"
        );
        assert_eq!(
            scopes(Some(&after), &observed(&a, 1), &INTERVALS, t0),
            [Scope::OnShard("b".into()), Scope::OnShard("c".into())].into(),
            "their lists again"
        );
        assert_eq!(
            requeue_after(&after, &INTERVALS, t0),
            Duration::from_secs(8),
            "2 s doubled twice, long before the next sweep"
        );
        let delays: Vec<u64> = (1..=6)
            .map(|n| retry_delay(n, &INTERVALS).as_secs())
            .collect();
        assert_eq!(delays, [2, 4, 8, 16, 30, 30], "at most the sweep interval");
        assert_eq!(retry_delay(u32::MAX, &INTERVALS), INTERVALS.sweep);

        let moved = progress_after(Some(&after), &observed(&a, 1), Some(ran(false, false)), t0);
        assert_eq!((moved.failures, &moved.available), (0, &a));
        assert_eq!(
            requeue_after(&moved, &INTERVALS, t0),
            INTERVALS.sweep,
            "once it went through, the next sweep"
        );
    }

    fn draining(drains_pending: bool, awaiting: &[ObjectId]) -> Moves {
        Moves::Draining {
            drains_pending,
            awaiting: awaiting.to_vec(),
        }
    }

    fn pass(drain_checks_due: bool, drains_pending: bool, lists: &[Scope]) -> Pass {
        Pass {
            lists: lists.iter().cloned().collect(),
            recheck: Vec::new(),
            drain_checks_due,
            drains_pending,
        }
    }

    #[test]
    fn everything_is_listed_again_once_the_drains_ended() {
        // (what, pending, drains pending before, drains made or listed, the closing list)
        #[rustfmt::skip]
        let table = [
            ("drains pending", 1, true, 0, false),
            ("the last drain check", 0, true, 0, true),
            ("only children waited", 0, false, 0, false),
            ("drained, acknowledged at once", 0, false, 5, true),
            ("drained, not acknowledged", 3, false, 5, false),
            ("a resync or sweep that drained nothing", 0, false, 0, false),
            ("a new leader met ended drains", 0, false, 2, true),
        ];
        for (what, pending, before, drains, want) in table {
            let pass = pass(true, before, &[Scope::Unassigned]);
            assert_eq!(pass.lists_after_drains(pending, drains), want, "{what}");
        }
    }

    #[test]
    fn pending_drains_are_counted_where_there_can_be_some() {
        // (what, drain checks due, lists, drained, counted)
        #[rustfmt::skip]
        let table = [
            ("a drain check", true, &[Scope::Unassigned][..], 0, true),
            ("a full list", false, &[Scope::All], 0, true),
            ("a sweep that drained", false, &[Scope::Stray], 1, true),
            ("a quiet sweep", false, &[Scope::Stray], 0, false),
            ("a dead shard's list", false, &[Scope::OnShard("a".into())], 0, false),
        ];
        for (what, due, lists, drained, want) in table {
            assert_eq!(
                pass(due, false, lists).counts_drains(drained),
                want,
                "{what}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_lists_what_is_due_and_reads_waiting_children_again_unless_it_lists_all() {
        let t0 = Instant::now();
        let (ab, none) = (set(&["a", "b"]), set(&[]));
        let waiting = Progress {
            moves: draining(true, &[child("c-1")]),
            ..progress(&["a", "b"], t0)
        };
        let check = next_pass(Some(&waiting), &observed(&ab, 1), &INTERVALS, t0);
        assert_eq!(
            check,
            Some(Pass {
                lists: [Scope::Unassigned].into(),
                recheck: vec![child("c-1")],
                drain_checks_due: true,
                drains_pending: true,
            })
        );
        let full = next_pass(Some(&waiting), &observed(&ab, 2), &INTERVALS, t0).expect("a pass");
        assert_eq!(full.lists, [Scope::All].into());
        assert!(
            full.recheck.is_empty(),
            "a full list plans every child again"
        );
        let idle = progress(&["a", "b"], t0);
        assert_eq!(
            next_pass(Some(&idle), &observed(&ab, 1), &INTERVALS, t0),
            None,
            "nothing due"
        );
        assert_eq!(
            next_pass(Some(&waiting), &observed(&none, 1), &INTERVALS, t0),
            None,
            "no shard available"
        );
        let only_children = Progress {
            moves: draining(false, &[child("c-1")]),
            ..waiting.clone()
        };
        let rechecked = next_pass(Some(&only_children), &observed(&ab, 1), &INTERVALS, t0);
        assert_eq!(
            rechecked.map(|p| (p.lists, p.recheck, p.drains_pending)),
            Some(([Scope::Unassigned].into(), vec![child("c-1")], false)),
            "waiting children alone keep the drain checks"
        );
    }

    fn child(name: &str) -> ObjectId {
        ObjectId {
            resource: sharder_common::GroupResource::new("", "configmaps"),
            namespace: Some("ns".into()),
            name: name.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn children_waiting_for_their_owners_keep_the_drain_checks_coming() {
        let t0 = Instant::now();
        let ab = set(&["a", "b"]);
        let known = progress(&["a", "b"], t0);
        let waiting = Ran {
            awaiting: vec![child("c-1")],
            ..ran(false, false)
        };
        let after = progress_after(Some(&known), &observed(&ab, 1), Some(waiting), t0);
        assert_eq!(after.awaiting(), [child("c-1")]);
        assert!(
            after.drain_checks_due(),
            "a waiting child keeps the ring draining"
        );
        assert!(
            !after.drains_pending(),
            "but no drain is pending: the children are not listed again"
        );
        assert_eq!(requeue_after(&after, &INTERVALS, t0), INTERVALS.drain_check);

        let too_many = Ran {
            awaiting: (0..=MAX_AWAITING)
                .map(|i| child(&format!("c-{i}")))
                .collect(),
            ..ran(false, false)
        };
        let after = progress_after(Some(&known), &observed(&ab, 1), Some(too_many), t0);
        assert!(after.awaiting().is_empty(), "not remembered one by one");
        assert_eq!(after.owed, Owed::FullList);
        assert_eq!(
            scopes(Some(&after), &observed(&ab, 1), &INTERVALS, t0),
            [Scope::All].into(),
            "the next reconcile lists everything instead"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requeues_wait_for_the_next_sweep_or_resync_or_drain_check() {
        let t0 = Instant::now();
        let known = progress(&["a"], t0);
        let after = |seconds| t0 + Duration::from_secs(seconds);
        assert_eq!(
            requeue_after(&known, &INTERVALS, t0),
            Duration::from_secs(30)
        );
        assert_eq!(
            requeue_after(&known, &INTERVALS, after(25)),
            Duration::from_secs(5)
        );
        assert_eq!(requeue_after(&known, &INTERVALS, after(45)), MIN_REQUEUE);
        let draining = Progress {
            moves: draining(false, &[]),
            ..known.clone()
        };
        assert_eq!(
            requeue_after(&draining, &INTERVALS, t0),
            INTERVALS.drain_check
        );
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(
            requeue_after(&known, &INTERVALS, Instant::now()),
            Duration::from_secs(1),
            "paused time moves only when told"
        );
    }
}
