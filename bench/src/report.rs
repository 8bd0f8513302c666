//! The markdown report: machine, versions, parameters, then every section's text; and the two
//! shapes every section writes in, tables and goals.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use sharder_harness::ControlPlane;

use crate::{Args, Section};

/// A markdown table: `header` is the cells joined by ` | `, each row too.
pub(crate) fn table(header: &str, rows: impl IntoIterator<Item = String>) -> String {
    let columns = header.matches(" | ").count() + 1;
    let mut out = format!("| {header} |\n|{}\n", "---|".repeat(columns));
    for row in rows {
        let _ = writeln!(out, "| {row} |");
    }
    out + "\n"
}

/// One goal: what is measured, its figure, the bound, and whether the figure is within it.
pub(crate) type Goal = (String, String, &'static str, bool);

/// The goals' table; a missed goal points to where what is known about it is written.
pub(crate) fn goals(goals: &[Goal]) -> String {
    let rows = goals.iter().map(|(what, figure, bound, met)| {
        format!(
            "{what} | {figure} | {bound} | {}",
            if *met { "met" } else { "**missed**" }
        )
    });
    let mut out = table("goal | figure | bound | verdict", rows);
    if goals.iter().any(|g| !g.3) {
        out += "What is known about a missed goal (profiles, the parts of the work one by one) is in `docs/performance-notes.md`.\n\n";
    }
    out
}

/// The first line a program prints for `args` (stdout, else stderr), or "unknown".
fn first_line(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().ok();
    let text = output.map(|o| {
        if o.stdout.is_empty() {
            o.stderr
        } else {
            o.stdout
        }
    });
    let text = String::from_utf8_lossy(text.as_deref().unwrap_or_default()).into_owned();
    text.lines()
        .next()
        .map_or("unknown".to_owned(), |l| l.trim().to_owned())
}

/// The first line of a `/proc` file starting with `prefix`, without it.
fn proc_line(file: &str, prefix: &str) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let line = text.lines().find_map(|l| l.strip_prefix(prefix));
    line.map_or("unknown".to_owned(), |v| {
        v.trim_start_matches([' ', '\t', ':']).trim().to_owned()
    })
}

/// The whole report: `sections` holds the text of each section that ran.
pub(crate) fn render(
    args: &Args,
    cp: Option<&ControlPlane>,
    took: Duration,
    sections: &BTreeMap<Section, String>,
) -> String {
    let assets = sharder_harness::control_plane::assets_dir().unwrap_or_default();
    let version = |binary: &str| first_line(&assets.join(binary).to_string_lossy(), &["--version"]);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let machine = [
        format!(
            "CPU | {cores} x {}",
            proc_line("/proc/cpuinfo", "model name")
        ),
        format!("memory | {}", proc_line("/proc/meminfo", "MemTotal")),
        format!("kernel | {}", first_line("uname", &["-sr"])),
        format!("rustc | {}", first_line("rustc", &["--version"])),
        format!("kube-apiserver | {}", version("kube-apiserver")),
        format!("etcd | {}", version("etcd")),
        format!(
            "apiserver | {}",
            cp.map_or("not started".into(), |cp| format!(
                "{} (loopback, audit log on)",
                cp.url()
            ))
        ),
        format!(
            "build | {}",
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
        ),
    ];
    let mut out = format!(
        "# Benchmarks\n\nWritten by `make bench` (`cargo run --release -p sharder-bench`) on the local control plane; every comparison is measured side by side in the same run. Run took {:.0} s.\n\n## Machine and versions\n\n{}Parameters: {} creates per round at {}/s, {} rounds per mode; memory sizes {:?}; rebalancing {} objects; shard Lease {} s.\n\n",
        took.as_secs_f64(),
        table(" | ", machine),
        args.creates,
        args.rate,
        args.rounds,
        args.sizes,
        args.rebalance_objects,
        args.lease_seconds
    );
    for section in <Section as clap::ValueEnum>::value_variants() {
        let text = sections.get(section).map_or("Not run.\n\n", String::as_str);
        let _ = write!(out, "## {}\n\n{text}", section.heading());
    }
    out.trim_end().to_owned() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_has_a_separator_per_column_and_a_missed_goal_says_where_to_read_on() {
        assert_eq!(
            table("a | b", ["1 | 2".into()]),
            "| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        );
        let met = goals(&[("x".into(), "1".into(), "<= 2", true)]);
        assert!(met.contains("| x | 1 | <= 2 | met |") && !met.contains("performance-notes"));
        let missed = goals(&[("x".into(), "3".into(), "<= 2", false)]);
        assert!(missed.contains("| **missed** |") && missed.contains("performance-notes"));
    }
}
