//! Starts the shared control plane, prints `pids <etcd> <apiserver> dir <folder>`, then panics
//! once a line arrives on stdin (`panic`) or waits to be killed (`hang`). The harness tests use it to prove that no process
//! outlives a test binary that panics or is killed.

use std::io::Write as _;

#[tokio::main]
async fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let control_plane = match sharder_harness::ControlPlane::shared().await {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let [etcd, apiserver] = control_plane.pids();
    println!(
        "pids {etcd} {apiserver} dir {}",
        control_plane.dir().display()
    );
    let _ = std::io::stdout().flush();
    match mode.as_str() {
        "panic" => {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            panic!("the probe panics on purpose")
        }
        "hang" => loop {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        },
        other => {
            eprintln!("usage: control-plane-probe panic|hang (got {other:?})");
            std::process::exit(2);
        }
    }
}
