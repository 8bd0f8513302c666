//! Load run of the TLS webhook server beside the floor webhook, in the same run
//! ([`sharder_bench::load::run_in_process`], what the report's section 2 runs): reviews/s and
//! p50/p90/p99 per round, the medians, and the sharder/floor ratios.
//!
//! `cargo bench -p sharder-bench --bench load -- --load-connections 32 --load-seconds 5 --load-rounds 3`
// A bench target is a crate of its own; its items need no docs.
#![allow(missing_docs)]

use clap::Parser as _;
use sharder_bench::load::{LoadOptions, run_in_process};

/// The load flags (`cargo bench` adds `--bench`, which is accepted and ignored).
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    load: LoadOptions,
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let options = Cli::parse().load;
    let run = run_in_process(options).expect("load run");
    println!(
        "webhook load: {} connections, {} s per round, {} rounds each, TLS over loopback\n\n{}",
        options.connections,
        options.seconds,
        options.rounds,
        run.markdown()
    );
    let (throughput, p99) = run.ratios();
    println!(
        "sharder/floor: throughput {throughput:.2}x (goal >= {}), p99 {p99:.2}x (goal <= {})",
        sharder_bench::load::THROUGHPUT_GOAL,
        sharder_bench::load::P99_GOAL,
    );
}
