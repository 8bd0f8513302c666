//! The shard SDK for kube-rs controllers ([`shard`]: shard Lease, a watch of the assigned
//! objects, drain acknowledgement; [`ranges`]: the same in range mode), with the runtime pieces a sharded controller needs
//! re-exported from `sharder-runtime`: admin server (probes and Prometheus metrics), logging,
//! graceful shutdown on signals, the Lease keeper, and controllers that stop when asked even
//! before their watch listed ([`controller`]).

pub mod ranges;
pub mod shard;

/// A ring's kind and name, from which the shard's Lease label and label keys follow.
pub use sharder_common::{RingId, RingKind};

/// Range mode's keys, ranges and selectors.
pub use sharder_common::ranges::{RangeKey, ShardSelector};

pub use sharder_runtime::{
    AdminArgs, CommonArgs, Error, LogArgs, LogFormat, Readiness, Tasks, admin, controller,
    host_name, lease, logging, parse_duration, shutdown_on_signal, start, tasks,
};
