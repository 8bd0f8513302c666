//! The ring: lookup cost (the criterion bench `sharder-common/benches/ring.rs`, run as a
//! subprocess), balance (objects per shard for 100k keys: max/mean and relative standard
//! deviation) for 3, 10 and 50 shards, and the share of objects a switch from the reference's
//! v0.8 sharder moves (it hashed `<apiVersion>/<Kind>/<namespace>/<name>`).

use sharder_common::{ObjectKey, Ring};

/// Balance of one ring.
#[derive(Clone, Debug)]
pub struct Balance {
    /// Shards on the ring.
    pub shards: usize,
    /// Keys assigned.
    pub keys: usize,
    /// Largest shard / mean.
    pub max_over_mean: f64,
    /// Smallest shard / mean.
    pub min_over_mean: f64,
    /// Standard deviation / mean.
    pub relative_std_dev: f64,
}

/// The ring section's results.
#[derive(Clone, Debug)]
pub struct RingResult {
    /// Criterion's lookup estimates: (benchmark, "[low mid high]"), or why they are missing.
    pub lookups: Result<Vec<(String, String)>, String>,
    /// Balance for 3, 10, 50 shards.
    pub balance: Vec<Balance>,
    /// (shards, share of 100k objects that land on another shard under the v0.8 key).
    pub v08_moves: Vec<(usize, f64)>,
}

/// A typical mix of main objects as (apiVersion, group, Kind): core, a built-in group and a
/// custom resource.
const MIX: [(&str, &str, &str); 3] = [
    ("v1", "", "Secret"),
    ("apps/v1", "apps", "Deployment"),
    (
        "webhosting.timebertt.dev/v1alpha1",
        "webhosting.timebertt.dev",
        "Website",
    ),
];

/// The share of `keys` objects (the [`MIX`] in turn, spread over 10 namespaces) whose shard
/// differs between the v0.8 key (`<apiVersion>/<Kind>/<namespace>/<name>`) and the current one
/// (`<group>/<Kind>/<namespace>/<name>`) on a ring of `shards` shards: what switching from a
/// v0.8 sharder moves once.
pub fn v08_moves(shards: usize, keys: usize) -> f64 {
    let ring = Ring::new((0..shards).map(|i| format!("shard-{i}")));
    let moved = (0..keys)
        .filter(|i| {
            let (api_version, group, kind) = MIX[i % MIX.len()];
            let (namespace, name) = (format!("team-{}", i % 10), format!("object-{i}"));
            let old = format!("{api_version}/{kind}/{namespace}/{name}");
            let new = ObjectKey::main(group, kind, Some(&namespace), &name)
                .map(|k| k.to_string())
                .unwrap_or_default();
            ring.shard_for(&old) != ring.shard_for(&new)
        })
        .count();
    moved as f64 / keys as f64
}

/// Balance of `shards` shards named `shard-<i>` over `keys` Secret keys.
pub fn balance(shards: usize, keys: usize) -> Balance {
    let ring = Ring::new((0..shards).map(|i| format!("shard-{i}")));
    let mut counts = vec![0usize; shards];
    for i in 0..keys {
        let key = ObjectKey::main("", "Secret", Some("default"), &format!("object-{i}"))
            .map(|k| k.to_string())
            .unwrap_or_default();
        if let Some(shard) = ring.shard_for(&key) {
            let index: usize = shard.trim_start_matches("shard-").parse().unwrap_or(0);
            counts[index] += 1;
        }
    }
    let mean = keys as f64 / shards as f64;
    let variance = counts
        .iter()
        .map(|c| (*c as f64 - mean).powi(2))
        .sum::<f64>()
        / shards as f64;
    Balance {
        shards,
        keys,
        max_over_mean: counts.iter().copied().max().unwrap_or(0) as f64 / mean,
        min_over_mean: counts.iter().copied().min().unwrap_or(0) as f64 / mean,
        relative_std_dev: variance.sqrt() / mean,
    }
}

/// Criterion's `name time: [low mid high]` lines.
pub fn parse_criterion(output: &str) -> Vec<(String, String)> {
    let mut results = Vec::new();
    let mut name = String::new();
    for line in output.lines() {
        let trimmed = line.trim();
        if let Some((before, after)) = trimmed.split_once("time:") {
            if !before.trim().is_empty() {
                name = before.trim().to_owned();
            }
            results.push((name.clone(), after.trim().to_owned()));
        } else if !trimmed.is_empty() && !line.starts_with(' ') {
            name = trimmed.to_owned();
        }
    }
    results
}

/// Runs the balance computation and, with `criterion`, the lookup bench.
pub fn run(criterion: bool) -> RingResult {
    let lookups = if criterion {
        crate::cargo_bench("sharder-common", "ring", "--noplot").map(|out| parse_criterion(&out))
    } else {
        Err("not run (--criterion false)".to_owned())
    };
    RingResult {
        lookups,
        balance: [3, 10, 50]
            .into_iter()
            .map(|s| balance(s, 100_000))
            .collect(),
        v08_moves: [3, 10, 50]
            .into_iter()
            .map(|s| (s, v08_moves(s, 100_000)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criterion_lines_are_parsed_with_their_names() {
        let out = "ring lookup/10 shards   time:   [20.1 ns 20.5 ns 21.0 ns]\n\
                   ring lookup/100 shards\n                        time:   [30.0 ns 31.0 ns 32.0 ns]\n";
        assert_eq!(
            parse_criterion(out),
            [
                (
                    "ring lookup/10 shards".to_owned(),
                    "[20.1 ns 20.5 ns 21.0 ns]".to_owned()
                ),
                (
                    "ring lookup/100 shards".to_owned(),
                    "[30.0 ns 31.0 ns 32.0 ns]".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn objects_move_under_the_v08_key_as_often_as_another_shard_is_picked() {
        // The two keys hash independently, so about (n-1)/n of the objects move.
        let share = v08_moves(4, 20_000);
        assert!((share - 0.75).abs() < 0.05, "{share}");
        assert_eq!(v08_moves(1, 100), 0.0, "one shard: nothing moves");
    }

    #[test]
    fn balance_counts_every_key() {
        let b = balance(3, 3000);
        assert!(b.max_over_mean >= 1.0 && b.min_over_mean <= 1.0);
        assert!(b.relative_std_dev >= 0.0);
    }
}
