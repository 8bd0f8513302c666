//! How many writes the rebalancer keeps in flight: a limit that adapts to the apiserver's
//! answers (additive increase, multiplicative decrease), between 1 and `--max-concurrent-writes`.
//!
//! - Every write the apiserver accepted (or refused for a reason of the object's own: a
//!   conflict, a missing object) lets the limit grow: by one per answer until the first sign of
//!   overload ("slow start", doubling per round of writes), then by one per round.
//! - A sign of overload (429 Too Many Requests, as API Priority and Fairness or the in-flight
//!   limits answer; a 5xx; a request that failed on the way; an answer that took longer than
//!   [`SLOW_WRITE`], the wait of a request queued by API Priority and Fairness or held up by a
//!   saturated etcd) halves it, once per round: the other writes of the same round saw the same
//!   apiserver and are not counted again.
//!
//! This is the reconciler's only bound on its writes by default: it starts fast and follows
//! what the apiserver can take (`--max-writes-per-second` adds a fixed rate on top, off by
//! default).
//!
//! [`AdaptiveLimit`] is pure (unit-tested answer by answer); [`WriteSlots`] shares it between
//! every write of the reconciler: a write takes a slot before it is sent and gives it back with
//! the apiserver's answer.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often a write or a list page the apiserver was too busy for is sent again.
pub(crate) const OVERLOAD_RETRIES: usize = 5;

/// A write answered after longer than this counts as a sign of overload: a merge patch of
/// metadata is answered in milliseconds by an apiserver with room; one that took a second
/// waited in a queue (API Priority and Fairness queues a request before it refuses it) or
/// behind storage.
pub(crate) const SLOW_WRITE: Duration = Duration::from_secs(1);

/// The apiserver's answer to one write, as far as the limit cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// It was handled (written, or refused for the object's own reasons: conflict, gone).
    Handled,
    /// The apiserver is overloaded or unreachable: 429, 5xx, a transport error or timeout, or
    /// an answer slower than [`SLOW_WRITE`].
    Overloaded,
}

impl Answer {
    /// The answer to a write that the apiserver refused as `overloaded` (or not), after `took`.
    pub(crate) fn of(overloaded: bool, took: Duration) -> Self {
        if overloaded || took > SLOW_WRITE {
            Self::Overloaded
        } else {
            Self::Handled
        }
    }
}

/// The adaptive limit of writes in flight.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AdaptiveLimit {
    limit: f64,
    max: f64,
    slow_start: bool,
    /// Answers still to come from the round in which the limit was last halved; overload
    /// signals among them are not counted again.
    cooldown: usize,
}

impl AdaptiveLimit {
    /// A limit starting at `initial` (at least 1), never above `max` (at least 1).
    pub(crate) fn new(initial: usize, max: usize) -> Self {
        let max = max.max(1) as f64;
        Self {
            limit: (initial.max(1) as f64).min(max),
            max,
            slow_start: true,
            cooldown: 0,
        }
    }

    /// Writes that may be in flight now.
    pub(crate) fn current(&self) -> usize {
        // The limit is between 1 and max, both usize: the cast only drops the fraction.
        self.limit.floor() as usize
    }

    /// Takes the answer to one write into account.
    pub(crate) fn on_answer(&mut self, answer: Answer) {
        let cooling = self.cooldown > 0;
        self.cooldown = self.cooldown.saturating_sub(1);
        match answer {
            Answer::Handled => {
                let step = if self.slow_start {
                    1.0
                } else {
                    1.0 / self.limit
                };
                self.limit = (self.limit + step).min(self.max);
            }
            Answer::Overloaded if cooling => {}
            Answer::Overloaded => {
                self.slow_start = false;
                // The others of the round in flight with this write.
                self.cooldown = self.current() - 1;
                self.limit = (self.limit / 2.0).max(1.0);
            }
        }
    }
}

/// The reconciler's write slots: at most [`AdaptiveLimit::current`] writes in flight at once,
/// over every ring and rebalance.
#[derive(Debug)]
pub(crate) struct WriteSlots {
    state: Mutex<SlotState>,
    freed: Notify,
    gauge: Gauge,
}

/// The limit, the writes in flight, and their integral over time.
#[derive(Debug)]
struct SlotState {
    limit: AdaptiveLimit,
    in_flight: usize,
    busy: Busy,
}

/// Writes in flight integrated over time (write-seconds), to tell how many were in flight on
/// average between two readings ([`Busy::mean_since`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Busy {
    at: Instant,
    write_seconds: f64,
}

impl Busy {
    fn new(at: Instant) -> Self {
        Self {
            at,
            write_seconds: 0.0,
        }
    }

    /// The integral carried to `now`, `in_flight` writes having been in flight since the last
    /// change.
    fn advanced(self, now: Instant, in_flight: usize) -> Self {
        Self {
            at: now,
            write_seconds: self.write_seconds
                + in_flight as f64 * now.saturating_duration_since(self.at).as_secs_f64(),
        }
    }

    /// Writes in flight on average from `earlier` to this reading (0 over no time).
    pub(crate) fn mean_since(&self, earlier: &Busy) -> f64 {
        let seconds = self.at.saturating_duration_since(earlier.at).as_secs_f64();
        if seconds > 0.0 {
            (self.write_seconds - earlier.write_seconds) / seconds
        } else {
            0.0
        }
    }
}

/// One write in flight; give it back with [`Slot::answered`] (dropping it gives it back without
/// an answer, e.g. when the rebalance is abandoned).
#[derive(Debug)]
pub(crate) struct Slot<'a> {
    slots: &'a WriteSlots,
    answer: Option<Answer>,
}

impl WriteSlots {
    /// Slots starting at `initial` in flight, at most `max`; `gauge` shows the limit.
    pub(crate) fn new(initial: usize, max: usize, gauge: Gauge) -> Self {
        let limit = AdaptiveLimit::new(initial, max);
        gauge.set(i64::try_from(limit.current()).unwrap_or(i64::MAX));
        Self {
            state: Mutex::new(SlotState {
                limit,
                in_flight: 0,
                busy: Busy::new(Instant::now()),
            }),
            freed: Notify::new(),
            gauge,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a free slot.
    pub(crate) async fn acquire(&self) -> Slot<'_> {
        loop {
            let freed = self.freed.notified();
            {
                let mut state = self.lock();
                if state.in_flight < state.limit.current() {
                    state.busy = state.busy.advanced(Instant::now(), state.in_flight);
                    state.in_flight += 1;
                    return Slot {
                        slots: self,
                        answer: None,
                    };
                }
            }
            freed.await;
        }
    }

    /// Writes in flight now and the limit.
    pub(crate) fn in_flight(&self) -> (usize, usize) {
        let state = self.lock();
        (state.in_flight, state.limit.current())
    }

    /// The integral of writes in flight up to now.
    pub(crate) fn busy(&self) -> Busy {
        let state = self.lock();
        state.busy.advanced(Instant::now(), state.in_flight)
    }
}

impl Slot<'_> {
    /// Gives the slot back with the apiserver's answer to its write.
    pub(crate) fn answered(mut self, answer: Answer) {
        self.answer = Some(answer);
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut state = self.slots.lock();
        state.busy = state.busy.advanced(Instant::now(), state.in_flight);
        state.in_flight = state.in_flight.saturating_sub(1);
        if let Some(answer) = self.answer {
            state.limit.on_answer(answer);
            self.slots
                .gauge
                .set(i64::try_from(state.limit.current()).unwrap_or(i64::MAX));
        }
        drop(state);
        self.slots.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt as _;

    use std::time::Duration;

    use super::*;

    #[test]
    fn a_refusal_or_a_slow_answer_is_overload_and_a_quick_one_is_not() {
        let ms = Duration::from_millis;
        let cases = [
            (false, ms(3), Answer::Handled),
            (false, SLOW_WRITE, Answer::Handled),
            (false, SLOW_WRITE + ms(1), Answer::Overloaded),
            (true, ms(3), Answer::Overloaded),
            (true, ms(5000), Answer::Overloaded),
        ];
        for (refused, took, answer) in cases {
            assert_eq!(Answer::of(refused, took), answer, "{refused} {took:?}");
        }
    }

    #[test]
    fn the_limit_starts_where_it_is_told_within_its_bounds() {
        assert_eq!(AdaptiveLimit::new(16, 64).current(), 16);
        assert_eq!(AdaptiveLimit::new(16, 8).current(), 8);
        assert_eq!(AdaptiveLimit::new(0, 8).current(), 1);
        assert_eq!(AdaptiveLimit::new(4, 0).current(), 1);
    }

    #[test]
    fn answers_grow_the_limit_by_one_each_until_the_first_overload() {
        let mut limit = AdaptiveLimit::new(16, 64);
        for _ in 0..16 {
            limit.on_answer(Answer::Handled);
        }
        assert_eq!(limit.current(), 32, "one round of 16 answers doubles it");
        for _ in 0..100 {
            limit.on_answer(Answer::Handled);
        }
        assert_eq!(limit.current(), 64, "never above the maximum");
    }

    #[test]
    fn an_overload_halves_the_limit_once_per_round() {
        let mut limit = AdaptiveLimit::new(64, 64);
        limit.on_answer(Answer::Overloaded);
        assert_eq!(limit.current(), 32);
        // The other 63 writes that were in flight with it: not counted again.
        for _ in 0..63 {
            limit.on_answer(Answer::Overloaded);
        }
        assert_eq!(limit.current(), 32);
        limit.on_answer(Answer::Overloaded);
        assert_eq!(
            limit.current(),
            16,
            "the next round's overload halves it again"
        );
    }

    #[test]
    fn after_an_overload_the_limit_grows_by_one_per_round() {
        let mut limit = AdaptiveLimit::new(40, 64);
        limit.on_answer(Answer::Overloaded);
        assert_eq!(limit.current(), 20);
        for _ in 0..20 {
            limit.on_answer(Answer::Handled);
        }
        assert_eq!(
            limit.current(),
            20,
            "a round of 20 answers adds 1 (just under)"
        );
        for _ in 0..2 {
            limit.on_answer(Answer::Handled);
        }
        assert_eq!(limit.current(), 21);
    }

    #[test]
    fn the_limit_never_falls_below_one() {
        let mut limit = AdaptiveLimit::new(2, 64);
        for _ in 0..10 {
            limit.on_answer(Answer::Overloaded);
            limit.on_answer(Answer::Overloaded);
        }
        assert_eq!(limit.current(), 1);
        limit.on_answer(Answer::Handled);
        assert!(limit.current() >= 1);
    }

    #[tokio::test]
    async fn slots_hold_writes_to_the_limit_and_follow_its_changes() {
        let slots = WriteSlots::new(2, 4, Gauge::default());
        let a = slots.acquire().await;
        let b = slots.acquire().await;
        assert_eq!(slots.in_flight(), (2, 2));
        let mut third = std::pin::pin!(slots.acquire());
        assert!(
            third.as_mut().now_or_never().is_none(),
            "a third write waits"
        );
        // Handled: the limit grows to 3 and the slot is free: the waiting write goes.
        a.answered(Answer::Handled);
        let c = third.await;
        assert_eq!(slots.in_flight(), (2, 3));
        // Overloaded: the limit halves to 1 with 1 still in flight: the next write waits.
        b.answered(Answer::Overloaded);
        assert_eq!(slots.in_flight(), (1, 1));
        let mut next = std::pin::pin!(slots.acquire());
        assert!(next.as_mut().now_or_never().is_none());
        drop(c);
        next.await;
        assert_eq!(slots.gauge.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_mean_in_flight_is_the_integral_of_writes_over_time() {
        let slots = WriteSlots::new(4, 4, Gauge::default());
        let start = slots.busy();
        let a = slots.acquire().await;
        let b = slots.acquire().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(a);
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(b);
        tokio::time::sleep(Duration::from_secs(2)).await;
        // 2 writes for 1 s, 1 for 1 s, none for 2 s: 3 write-seconds over 4 s.
        let end = slots.busy();
        assert!((end.mean_since(&start) - 0.75).abs() < 1e-9, "{end:?}");
        assert_eq!(end.mean_since(&end), 0.0, "over no time");
    }
}
