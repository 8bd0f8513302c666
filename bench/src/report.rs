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
        out += "Why the defaults are what they are: `docs/performance-notes.md`; what earlier runs found about missed goals (profiles, the parts of the work one by one) is in its git history.\n\n";
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
    done: bool,
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
            cp.map_or("not started".into(), |_| "loopback, audit log on"
                .to_owned())
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
    let unfinished: Vec<&str> = args
        .sections
        .iter()
        .filter(|s| !sections.contains_key(s))
        .map(|s| s.heading())
        .collect();
    let when = if done {
        format!("The run took {:.0} s.", took.as_secs_f64())
    } else {
        format!(
            "Written {:.0} s into a run that had not finished; not yet measured: {}.",
            took.as_secs_f64(),
            unfinished.join("; ")
        )
    };
    let reference = args.reference.as_ref().map_or_else(
        || "not given".to_owned(),
        |_| format!("the reference's `sharder` {}", args.reference_version),
    );
    let mut out = format!(
        "# Benchmarks\n\nWritten by `sharder-bench` (`make bench`; `make bench-scale` for the larger sizes) on the local control plane, every section from this one run; every comparison is measured side by side in it. {when}\n\n## Machine and versions\n\n{}Parameters: {} creates per round at {}/s, {} rounds per mode; objects: {:?} (memory), {:?} (idle cost), {} (rebalancing, crashes, rolling updates), {:?} (beside the reference, whose binary is {reference}), {} (the real node); shard Lease {} s; idle windows {} s.\n\n",
        table(" | ", machine),
        args.creates,
        args.rate,
        args.rounds,
        args.sizes,
        args.idle_sizes,
        args.rebalance_objects,
        args.reference_sizes,
        args.node_objects,
        args.lease_seconds,
        args.idle_window_seconds,
    );
    for section in <Section as clap::ValueEnum>::value_variants() {
        let text = match sections.get(section) {
            Some(text) => text.as_str(),
            None if !args.sections.contains(section) => "Not run: not among `--sections`.\n\n",
            None if done => "Not run.\n\n",
            None => "Not measured yet when this was written.\n\n",
        };
        let _ = write!(out, "## {}\n\n{text}", section.heading());
    }
    let negative = negative_cells(&out);
    if !negative.is_empty() {
        let _ = write!(
            out,
            "## {NEGATIVE}\n\nA duration, percentile or count below zero is a bug of the bench, not a result: {}.\n\n",
            negative.join("; ")
        );
    }
    out.trim_end().to_owned() + "\n"
}

/// The heading the report adds when a table holds a figure below zero.
pub(crate) const NEGATIVE: &str = "Figures below zero";

/// The rows of `text`'s tables holding a cell that starts with a number below zero.
fn negative_cells(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| line.starts_with('|'))
        .filter(|line| {
            line.split('|').any(|cell| {
                let cell = cell.trim();
                cell.strip_prefix('-')
                    .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            })
        })
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_below_zero_is_found_and_a_dash_or_a_plus_is_not() {
        let text = "| a | b |\n|---|---|\n| 1 | -51.00 |\n| - | +2.1 |\nx -3\n";
        assert_eq!(negative_cells(text), ["| 1 | -51.00 |"]);
        assert!(negative_cells("| - | 0.5 |\n|---|---|\n").is_empty());
    }

    #[test]
    fn a_stopped_run_s_report_names_what_it_did_not_measure_yet() {
        let args = <Args as clap::Parser>::parse_from(["sharder-bench", "--sections", "ring,load"]);
        let texts = BTreeMap::from([(Section::Ring, "ring figures\n\n".to_owned())]);
        let partial = render(&args, None, Duration::from_secs(61), &texts, false);
        assert!(partial.contains("Written 61 s into a run that had not finished; not yet measured: 2. The webhook alone under load."), "{partial}");
        assert!(
            partial.contains(
                "## 2. The webhook alone under load\n\nNot measured yet when this was written."
            ),
            "{partial}"
        );
        assert!(
            partial.contains(
                "## 1. CREATE latency added by the webhook\n\nNot run: not among `--sections`."
            ),
            "{partial}"
        );
        assert!(partial.contains("## 6. Ring\n\nring figures"), "{partial}");
        let done = render(&args, None, Duration::from_secs(61), &texts, true);
        assert!(done.contains("The run took 61 s."), "{done}");
        assert!(
            done.contains("## 2. The webhook alone under load\n\nNot run.\n"),
            "{done}"
        );
        assert!(!done.contains(NEGATIVE), "{done}");
    }

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
