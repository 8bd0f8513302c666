//! The ring: lookup cost (the criterion bench `sharder-common/benches/ring.rs`, run as a
//! subprocess), balance (objects per shard for 100k keys: max/mean and relative standard
//! deviation) for 3, 10 and 50 shards, and the share of objects a switch from the reference's
//! v0.8 sharder moves (it hashed `<apiVersion>/<Kind>/<namespace>/<name>`).

use sharder_common::{ObjectKey, Ring};

use crate::report::table;

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
fn v08_moves(shards: usize, keys: usize) -> f64 {
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

/// Balance of `shards` shards named `shard-<i>` over `keys` Secret keys: the largest and the
/// smallest shard against the mean, and the standard deviation against the mean.
fn balance(shards: usize, keys: usize) -> [f64; 3] {
    let ring = Ring::new((0..shards).map(|i| format!("shard-{i}")));
    let mut counts = std::collections::HashMap::<&str, f64>::new();
    for i in 0..keys {
        let key = ObjectKey::main("", "Secret", Some("default"), &format!("object-{i}"));
        if let Some(shard) = key.and_then(|k| ring.shard_for(k.as_ref())) {
            *counts.entry(shard).or_default() += 1.0;
        }
    }
    let mean = keys as f64 / shards as f64;
    let counts: Vec<f64> = (0..shards)
        .map(|i| {
            counts
                .get(format!("shard-{i}").as_str())
                .copied()
                .unwrap_or(0.0)
        })
        .collect();
    let variance = counts.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / shards as f64;
    let (max, min) = (
        counts.iter().copied().fold(0.0, f64::max),
        counts.iter().copied().fold(f64::MAX, f64::min),
    );
    [max / mean, min / mean, variance.sqrt() / mean]
}

/// Criterion's `name time: [low mid high]` lines.
fn parse_criterion(output: &str) -> Vec<(String, String)> {
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

/// Runs `cargo bench -p sharder-common --bench ring`; its stdout, or why not.
fn cargo_bench() -> Result<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let output = std::process::Command::new(cargo)
        .args(["bench", "--locked", "--manifest-path"])
        .arg(manifest)
        .args(["-p", "sharder-common", "--bench", "ring", "--", "--noplot"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo bench: {e}"))?;
    match output.status.success() {
        true => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
        false => Err("cargo bench -p sharder-common --bench ring failed".to_owned()),
    }
}

/// The section's text: balance and v0.8 moves computed here, and with `criterion` the lookup
/// bench.
pub(crate) fn run(criterion: bool) -> String {
    let lookups = if !criterion {
        "not run (--criterion false)\n\n".to_owned()
    } else {
        match cargo_bench() {
            Ok(out) => table(
                "benchmark | time [low estimate high]",
                parse_criterion(&out)
                    .into_iter()
                    .map(|(n, t)| format!("{n} | {t}")),
            ),
            Err(e) => format!("{e}\n\n"),
        }
    };
    let balance = [3, 10, 50].map(|s| {
        let [max, min, dev] = balance(s, 100_000);
        format!("{s} | {max:.3} | {min:.3} | {:.1} %", 100.0 * dev)
    });
    let moved = [3, 10, 50].map(|s| format!("{s} | {:.1} %", 100.0 * v08_moves(s, 100_000)));
    format!(
        "Lookup (criterion, `cargo bench -p sharder-common --bench ring`; 100 tokens per shard, XXH64, binary search):\n\n{lookups}Balance over 100,000 object keys:\n\n{}Switching from the reference's v0.8 sharder (object key `<apiVersion>/<Kind>/<namespace>/<name>`) to the current key (`<group>/<Kind>/<namespace>/<name>`): share of 100,000 objects (Secrets, Deployments and a custom resource in turn) that land on another shard, moved once.\n\n{}",
        table("shards | max/mean | min/mean | relative std dev", balance),
        table("shards | objects moved", moved)
    )
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
        let [max, min, dev] = balance(3, 3000);
        assert!(
            max >= 1.0 && min <= 1.0 && min > 0.5 && dev >= 0.0,
            "{max} {min} {dev}"
        );
    }
}
