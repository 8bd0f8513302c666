//! Percentiles, medians, a process's CPU time, and units.

use std::time::Duration;

/// The `p`-th percentile (0..=100) of `sorted` (nearest rank; the default value when empty).
pub(crate) fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `f` over `items` (mean of the middle two for an even count; NaN if none).
pub(crate) fn median_of<T>(items: &[T], f: impl Fn(&T) -> f64) -> f64 {
    median(items.iter().map(f).collect())
}

/// The median of figure `i` over the `rows` of `key`.
pub(crate) fn median_at<K: PartialEq, const N: usize>(
    rows: &[(K, [f64; N])],
    key: K,
    i: usize,
) -> f64 {
    median(rows.iter().filter(|r| r.0 == key).map(|r| r.1[i]).collect())
}

/// The median of `values` (mean of the middle two for an even count; NaN if none).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// A figure over a contender's rounds: the median, the lowest and the highest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Spread {
    /// The median.
    pub(crate) median: f64,
    /// The lowest.
    pub(crate) low: f64,
    /// The highest.
    pub(crate) high: f64,
}

impl Spread {
    /// The spread of `values` (`None` without any).
    pub(crate) fn of(values: impl Iterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.collect();
        v.sort_by(f64::total_cmp);
        let (low, high) = (*v.first()?, *v.last()?);
        Some(Self {
            median: median(v),
            low,
            high,
        })
    }

    /// The median with its unit, and the range of the rounds where there was more than one.
    pub(crate) fn text(&self, unit: &str, rounds: usize) -> String {
        if rounds > 1 {
            format!(
                "{:.2}{unit} [{:.2}-{:.2}]",
                self.median, self.low, self.high
            )
        } else {
            format!("{:.2}{unit}", self.median)
        }
    }
}

/// Milliseconds of a duration.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// CPU time (user + system) process `pid` used so far, in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start at the state, field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i - 3)?.parse::<u64>().ok();
    // utime and stime are fields 14 and 15, in clock ticks (100 per second on Linux).
    Some((ticks(14)? + ticks(15)?) as f64 / 100.0)
}

/// KiB as MiB.
pub(crate) fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&sorted, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&sorted, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&sorted, 100.0), Duration::from_millis(100));
        assert_eq!(percentile::<Duration>(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn this_process_uses_cpu_time() {
        let before = cpu_seconds(std::process::id()).expect("cpu");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(200) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let used = cpu_seconds(std::process::id()).expect("cpu") - before;
        assert!(used > 0.05 && x > 0, "{used} s");
    }
}
