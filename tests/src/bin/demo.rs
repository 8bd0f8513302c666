//! `make demo`: the whole system on a local control plane. Starts the webhook, the reconciler and
//! three example shards as processes, creates a ControllerRing and 100 Secrets, shows how many each
//! shard holds, adds a fourth shard and shows the drains and moves as the logs report them,
//! crashes a shard and shows its objects reassigned once its Lease runs out, then prints the
//! final table. Every process is stopped on exit or Ctrl-C.

use std::collections::BTreeMap;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::time::{Duration, Instant};

use sharder_tests::system::{Options, System};

const OBJECTS: usize = 100;
const LEASE_SECONDS: u64 = 4;

fn step(text: &str) {
    println!("\n==> {text}");
}

fn table(before: Option<&BTreeMap<String, usize>>, now: &BTreeMap<String, usize>) {
    println!("    {:<10} {:>8}", "shard", "objects");
    let mut shards: Vec<&String> = now.keys().collect();
    if let Some(before) = before {
        shards.extend(before.keys().filter(|s| !now.contains_key(*s)));
        shards.sort();
        shards.dedup();
    }
    for shard in shards {
        let n = now.get(shard).copied().unwrap_or(0);
        let change = before
            .map(|b| n as i64 - b.get(shard).copied().unwrap_or(0) as i64)
            .filter(|c| *c != 0)
            .map(|c| format!("  ({c:+})"))
            .unwrap_or_default();
        println!("    {shard:<10} {n:>8}{change}");
    }
}

/// Follows the processes' JSON logs and prints the lines about moves, drains and Leases.
async fn follow(dir: std::path::PathBuf) {
    let mut offsets: BTreeMap<std::path::PathBuf, u64> = BTreeMap::new();
    // Start at the current end of every log: only what happens from now on.
    let mut first = true;
    loop {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_none_or(|e| e != "log") {
                    continue;
                }
                let process = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let Ok(mut file) = std::fs::File::open(&path) else {
                    continue;
                };
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                let offset = offsets
                    .entry(path.clone())
                    .or_insert(if first { len } else { 0 });
                if *offset >= len || file.seek(SeekFrom::Start(*offset)).is_err() {
                    continue;
                }
                let mut text = String::new();
                if file.read_to_string(&mut text).is_err() {
                    continue;
                }
                // Only whole lines; the rest is read next time.
                let whole = text.rfind('\n').map_or(0, |i| i + 1);
                *offset += whole as u64;
                for line in text[..whole].lines() {
                    if let Some(shown) = show(&process, line) {
                        println!("    {shown}");
                    }
                }
            }
        }
        first = false;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn show(process: &str, line: &str) -> Option<String> {
    let event: serde_json::Value = serde_json::from_str(line).ok()?;
    // An event's own fields, or those of the span it was logged in (ring, shard, reconcile).
    let field = |name: &str| {
        event[name]
            .as_str()
            .or_else(|| event["span"][name].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let message = field("message");
    let object = field("object");
    match message.as_str() {
        "draining" => Some(format!(
            "[{process}] draining {object}: {} -> {}",
            field("from"),
            field("to")
        )),
        // Controlled objects follow their owners; the summary counts them.
        "moved" if field("resource") == "configmaps" => None,
        "moved" => Some(format!(
            "[{process}] moved {object}: {} -> {} ({})",
            field("from"),
            field("to"),
            field("reason")
        )),
        "drain acknowledged" => Some(format!("[{process}] drain acknowledged: {object}")),
        "shard stopped renewing its lease: took the lease over, shard is dead" => {
            Some(format!("[{process}] {} {message}", field("shard")))
        }
        _ => None,
    }
}

async fn demo() {
    let started = Instant::now();
    step(
        "Starting a local control plane (etcd + kube-apiserver), the webhook, the reconciler and 3 example shards",
    );
    let mut system = System::start(
        "demo",
        Options {
            lease_seconds: LEASE_SECONDS,
            reconcile_delay_ms: 0,
            ..Options::default()
        },
    )
    .await;
    println!(
        "    {:?} {:?} shards Secrets (and the ConfigMaps they control) of namespace {:?}",
        system.kind, system.ring, system.ns
    );
    println!("    shard label: {}", system.labels.shard);

    step(&format!(
        "Creating {OBJECTS} Secrets; the webhook assigns each to a shard, the shard writes its checksums ConfigMap"
    ));
    system.create_secrets(0..OBJECTS).await;
    system.wait_converged("objects assigned").await;
    let three = system.holdings().await;
    table(None, &three);

    step(
        "Adding shard-3: the reconciler drains the objects that move, their shards acknowledge, the webhook assigns them to shard-3",
    );
    let follower = tokio::spawn(follow(system.dir().to_path_buf()));
    system.start_shard("shard-3").await;
    system.wait_converged("rebalanced onto shard-3").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let four = system.holdings().await;
    table(Some(&three), &four);

    step(&format!(
        "Crashing shard-1 (SIGKILL, no release): its objects move once its {LEASE_SECONDS} s Lease has expired and the reconciler took it over"
    ));
    let crashed = Instant::now();
    system.kill_shard("shard-1");
    system.wait_converged("shard-1's objects reassigned").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    follower.abort();
    println!(
        "    reassigned {:.1} s after the crash",
        crashed.elapsed().as_secs_f64()
    );
    let after = system.holdings().await;
    table(Some(&four), &after);

    step("Final state");
    table(None, &after);
    let report = system.ownership();
    println!(
        "    {} reconciles of {} objects; {} objects were reconciled by more than one shard over time, never two at once ({} overlaps)",
        report.total(),
        report.reconciles.len(),
        report.objects_with_several_shards(),
        report.overlaps.len()
    );
    let kept = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/demo");
    let _ = std::fs::remove_dir_all(&kept);
    if std::fs::create_dir_all(&kept).is_ok() {
        if let Ok(entries) = std::fs::read_dir(system.dir()) {
            for entry in entries.flatten() {
                let _ = std::fs::copy(entry.path(), kept.join(entry.file_name()));
            }
        }
        println!(
            "    logs (JSON) and reconcile records of every process kept in {}",
            kept.canonicalize().unwrap_or(kept).display()
        );
    }
    println!(
        "\nDone in {:.0} s. Stopping every process.",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    tokio::select! {
        () = demo() => {}
        _ = tokio::signal::ctrl_c() => println!("\ninterrupted: stopping every process"),
    }
}
