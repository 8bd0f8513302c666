//! Section 6, the ring: lookup cost for 10 and 100 shards (timed here, the median of 5 runs of
//! a million lookups; `cargo bench -p sharder-common --bench ring` has criterion's estimates),
//! balance over 100k keys for 3, 10 and 50 shards, and the share of objects a switch from the
//! reference's v0.8 sharder moves (it hashed `<apiVersion>/<Kind>/<namespace>/<name>`).

use std::hint::black_box;
use std::time::Instant;

use sharder_common::{ObjectKey, Ring};

use crate::report::table;
use crate::stats::median;

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

/// A ring of `shards` shards named `shard-<i>`.
fn ring(shards: usize) -> Ring {
    Ring::new((0..shards).map(|i| format!("shard-{i}")))
}

/// The keys of Secrets `object-<i>` for `0..n` in namespace `default`.
fn keys(n: usize) -> Vec<String> {
    let key = |i| ObjectKey::main("", "Secret", Some("default"), &format!("object-{i}"));
    (0..n)
        .filter_map(|i| key(i).map(|k| k.to_string()))
        .collect()
}

/// The share of `keys` objects (the [`MIX`] in turn, spread over 10 namespaces) whose shard
/// differs between the v0.8 key (`<apiVersion>/<Kind>/<namespace>/<name>`) and the current one
/// (`<group>/<Kind>/<namespace>/<name>`) on a ring of `shards` shards: what switching from a
/// v0.8 sharder moves once.
fn v08_moves(shards: usize, keys: usize) -> f64 {
    let ring = ring(shards);
    let moved = (0..keys).filter(|i| {
        let (api_version, group, kind) = MIX[i % MIX.len()];
        let (namespace, name) = (format!("team-{}", i % 10), format!("object-{i}"));
        let new = ObjectKey::main(group, kind, Some(&namespace), &name).map(|k| k.to_string());
        ring.shard_for(&format!("{api_version}/{kind}/{namespace}/{name}"))
            != new
                .and_then(|k| ring.shard_for(&k).map(str::to_owned))
                .as_deref()
    });
    moved.count() as f64 / keys as f64
}

/// Balance of `shards` shards over `keys` Secret keys: the largest and the smallest shard
/// against the mean, and the standard deviation against the mean.
fn balance(shards: usize, keys: &[String]) -> [f64; 3] {
    let ring = ring(shards);
    let mut counts = std::collections::HashMap::<&str, f64>::new();
    for key in keys {
        *counts
            .entry(ring.shard_for(key).unwrap_or_default())
            .or_default() += 1.0;
    }
    let counts: Vec<f64> = (0..shards)
        .map(|i| {
            counts
                .get(format!("shard-{i}").as_str())
                .copied()
                .unwrap_or(0.0)
        })
        .collect();
    let mean = keys.len() as f64 / shards as f64;
    let variance = counts.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / shards as f64;
    let max = counts.iter().copied().fold(0.0, f64::max);
    let min = counts.iter().copied().fold(f64::MAX, f64::min);
    [max / mean, min / mean, variance.sqrt() / mean]
}

/// Nanoseconds per lookup on a ring of `shards` shards: the median of 5 runs of a million
/// lookups of 1,024 keys in turn.
fn lookup_ns(shards: usize) -> f64 {
    let (ring, keys) = (ring(shards), keys(1024));
    let runs = (0..5).map(|_| {
        let started = Instant::now();
        for i in 0..1_000_000 {
            black_box(ring.shard_for(black_box(&keys[i % keys.len()])));
        }
        started.elapsed().as_secs_f64() * 1e3
    });
    median(runs.collect())
}

/// The section's text.
pub(crate) fn run() -> String {
    let lookups = [10, 100].map(|s| format!("{s} | {:.1}", lookup_ns(s)));
    let keys = keys(100_000);
    let balance = [3, 10, 50].map(|s| {
        let [max, min, dev] = balance(s, &keys);
        format!("{s} | {max:.3} | {min:.3} | {:.1} %", 100.0 * dev)
    });
    let moved = [3, 10, 50].map(|s| format!("{s} | {:.1} %", 100.0 * v08_moves(s, 100_000)));
    format!(
        "Lookup (100 tokens per shard, XXH64, binary search; the median of 5 runs of a million lookups of 1,024 keys in turn; `cargo bench -p sharder-common --bench ring` has criterion's estimates):\n\n{}Balance over 100,000 object keys:\n\n{}Switching from the reference's v0.8 sharder (object key `<apiVersion>/<Kind>/<namespace>/<name>`) to the current key (`<group>/<Kind>/<namespace>/<name>`): share of 100,000 objects (Secrets, Deployments and a custom resource in turn) that land on another shard, moved once.\n\n{}",
        table("shards | ns per lookup", lookups),
        table("shards | max/mean | min/mean | relative std dev", balance),
        table("shards | objects moved", moved)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_move_under_the_v08_key_as_often_as_another_shard_is_picked() {
        // The two keys hash independently, so about (n-1)/n of the objects move.
        let share = v08_moves(4, 20_000);
        assert!((share - 0.75).abs() < 0.05, "{share}");
        assert_eq!(v08_moves(1, 100), 0.0, "one shard: nothing moves");
    }

    #[test]
    fn balance_counts_every_key() {
        let [max, min, dev] = balance(3, &keys(3000));
        assert!(
            max >= 1.0 && min <= 1.0 && min > 0.5 && dev >= 0.0,
            "{max} {min} {dev}"
        );
    }
}
