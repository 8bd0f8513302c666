//! The chaos run: objects are created, updated and deleted all the time while random shards
//! crash or stop (and new ones start), the reconciler leader is killed and a webhook replica is
//! killed, each restarted later. At the end the system converges and the ownership invariant
//! holds over the whole run.
//!
//! `SHARDER_CHAOS_SECONDS` sets the duration (default 20, what CI runs); `SHARDER_CHAOS_SEED`
//! replays a run (the seed is printed). A long run:
//! `SHARDER_CHAOS_SECONDS=600 cargo test -p sharder-tests --test e2e chaos -- --nocapture`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sharder_tests::system::{Objects, Options, System, unix_nanos};

/// A small deterministic generator (xorshift64*), so a seed replays a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n.max(1) as u64).unwrap_or(0)
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the churn did, and the Secrets it believes exist.
#[derive(Default)]
struct Churn {
    creates: usize,
    updates: usize,
    deletes: usize,
    failures: Vec<String>,
    alive: BTreeSet<String>,
}

async fn churn(objects: Objects, stop: Arc<AtomicBool>, seed: u64, initial: usize) -> Churn {
    let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut churn = Churn {
        alive: (0..initial).map(|i| format!("object-{i}")).collect(),
        ..Churn::default()
    };
    let mut next = initial;
    let mut version = 0;
    while !stop.load(Ordering::Relaxed) {
        version += 1;
        let pick = |rng: &mut Rng, alive: &BTreeSet<String>| {
            alive.iter().nth(rng.below(alive.len())).cloned()
        };
        match rng.below(10) {
            0..=3 => {
                let name = format!("object-{next}");
                next += 1;
                match objects.create_secret(&name, &format!("{next}-0")).await {
                    Ok(_) => {
                        churn.creates += 1;
                        churn.alive.insert(name);
                    }
                    Err(e) => churn.failures.push(format!("create {name}: {e}")),
                }
            }
            4..=7 => {
                if let Some(name) = pick(&mut rng, &churn.alive) {
                    match objects.update_secret(&name, &format!("v{version}")).await {
                        Ok(()) => churn.updates += 1,
                        Err(e) => churn.failures.push(format!("update {name}: {e}")),
                    }
                }
            }
            _ => {
                if let Some(name) = pick(&mut rng, &churn.alive) {
                    match objects.delete_secret(&name).await {
                        Ok(()) => {
                            churn.deletes += 1;
                            churn.alive.remove(&name);
                        }
                        Err(e) => churn.failures.push(format!("delete {name}: {e}")),
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    churn
}

/// One chaos step; returns what it did.
async fn act(system: &mut System, rng: &mut Rng, next_shard: &mut usize) -> String {
    // Bring back what an earlier step killed.
    for i in 0..system.options.reconcilers {
        if !system.reconciler_running(i) {
            system.start_reconciler(i).await;
            return format!("restarted reconciler-{i}");
        }
    }
    for i in 0..system.options.webhooks {
        if !system.webhook_running(i) {
            system.start_webhook(i).await;
            return format!("restarted webhook-{i}");
        }
    }
    let shards = system.running_shards();
    match rng.below(6) {
        0 | 1 if shards.len() > 2 => {
            let victim = shards[rng.below(shards.len())].clone();
            system.kill_shard(&victim);
            format!("killed {victim}")
        }
        2 if shards.len() > 2 => {
            let victim = shards[rng.below(shards.len())].clone();
            let clean = system.stop_shard(&victim);
            assert!(clean, "{victim} stops cleanly on SIGTERM");
            format!("stopped {victim}")
        }
        3 => {
            let leader = system.leader().await;
            system.kill_reconciler(leader);
            format!("killed the reconciler leader reconciler-{leader}")
        }
        4 => {
            let i = rng.below(system.options.webhooks);
            system.kill_webhook(i);
            format!("killed webhook-{i}")
        }
        _ if shards.len() < 5 => {
            let name = format!("shard-{next_shard}");
            *next_shard += 1;
            system.start_shard(&name).await;
            format!("started {name}")
        }
        _ => "nothing".to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn single_ownership_holds_through_chaos() {
    let seconds = env_or("SHARDER_CHAOS_SECONDS", 20);
    let seed = env_or(
        "SHARDER_CHAOS_SEED",
        u64::try_from(unix_nanos() % u128::from(u64::MAX)).unwrap_or(1),
    )
    .max(1);
    eprintln!("chaos: {seconds} s, seed {seed} (SHARDER_CHAOS_SEED={seed} replays the choices)");
    let options = Options {
        webhooks: 2,
        reconcilers: 2,
        ..Options::default()
    };
    let mut system = System::start("chaos", options).await;
    let initial = 60;
    system.create_secrets(0..initial).await;
    system.wait_converged("initial objects assigned").await;

    let stop = Arc::new(AtomicBool::new(false));
    let churn_task = tokio::spawn(churn(system.objects(), Arc::clone(&stop), seed, initial));
    let mut rng = Rng(seed);
    let mut next_shard = system.options.shards;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        let pause = 800 + 200 * rng.below(8);
        tokio::time::sleep(Duration::from_millis(pause as u64)).await;
        let action = act(&mut system, &mut rng, &mut next_shard).await;
        eprintln!("chaos {:>5.1}s: {action}", started.elapsed().as_secs_f64());
    }
    stop.store(true, Ordering::Relaxed);
    let churn = churn_task.await.expect("churn");
    eprintln!(
        "churn: {} creates, {} updates, {} deletes",
        churn.creates, churn.updates, churn.deletes
    );
    assert!(
        churn.failures.is_empty(),
        "writes fail only if the apiserver fails them: {:?}",
        churn.failures
    );

    // Restore the replicas, then everything converges: no object lost, all on their shards.
    for i in 0..system.options.reconcilers {
        if !system.reconciler_running(i) {
            system.start_reconciler(i).await;
        }
    }
    for i in 0..system.options.webhooks {
        if !system.webhook_running(i) {
            system.start_webhook(i).await;
        }
    }
    system.wait_converged("converged after the chaos").await;
    let names: BTreeSet<String> = system.list_secrets().await.into_keys().collect();
    assert_eq!(
        names, churn.alive,
        "exactly the objects the churn left exist"
    );
    eprintln!("final: {:?}", system.holdings().await);
    system.assert_single_ownership();
}
