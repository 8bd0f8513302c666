//! Sharder's end-to-end system for the scenario tests and the demo: every component as a real
//! process on the harness's control plane ([`system::System`]), the observed history of the
//! sharded objects ([`history`]) and the single-ownership and ordered-handover checks
//! ([`ownership`]) fed from the example shards' reconcile records.

pub mod history;
pub mod ownership;
pub mod system;
