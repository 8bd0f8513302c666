//! Sharder's end-to-end system for the scenario tests and the demo: every component as a real
//! process on the harness's control plane ([`system::System`]), the observed history of the
//! sharded objects ([`history`]) and the single-ownership and ordered-handover checks
//! ([`ownership`]) fed from the example shards' reconcile records.

pub mod history;
pub mod ownership;
pub mod system;

/// The machine, shared by the tests that run Sharder as processes ([`system::System`] holds a
/// read guard while it lives) and taken whole by the journey on the real node from its first
/// CREATE to the end of its rolling update (a write guard): on 2 cores, kubelet and containerd
/// starved by the parallel process tests replaced a shard pod more slowly than its Lease allows,
/// which turns a rolling update into moves (docs/performance-notes.md, "Real node"). Fair: tests
/// asking after the journey wait for it. This holds within the e2e binary only: `make test`
/// runs the other crates' test binaries beside it (`harness/run-tests.sh`).
pub static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());
