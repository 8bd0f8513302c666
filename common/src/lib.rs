//! Pure sharding logic shared by the Sharder webhook and reconciler (and usable by shards):
//! the `ClusterRing` API and its CRD, the label keys of the wire contract, the consistent-hash
//! ring, object keys, shard lease states, and the webhook endpoint and configuration.
//!
//! Nothing here does I/O, talks to an apiserver, or needs an async runtime.

pub mod cluster_ring;
pub mod handover;
pub mod key;
pub mod label_guard;
pub mod labels;
pub mod lease;
pub mod placement_policy;
pub mod ranges;
pub mod ring;
pub mod ring_kind;
pub mod webhook_configuration;

pub use cluster_ring::{
    ClusterRing, ClusterRingSpec, ClusterRingStatus, GroupResource, RingResource, Role, Roles,
};
pub use handover::OwnerState;
pub use key::{Keying, ObjectKey};
pub use labels::RingLabels;
pub use lease::{LeaseStatus, ShardLease, ShardState, is_available, shard_state};
pub use ring::Ring;
pub use ring_kind::{RingId, RingKind, RingObject};

/// Errors of the pure sharding logic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A controller ownerReference cannot be turned into an object key; `field` names the field
    /// of the reference to fix.
    #[error("malformed controller ownerReference: {field} {value:?} {reason}")]
    MalformedOwnerReference {
        /// The field of the ownerReference that is malformed.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// An object has more than one ownerReference with `controller: true`.
    #[error("object has {count} ownerReferences with controller: true (at most one is allowed)")]
    MultipleControllers {
        /// How many controller references the object has.
        count: usize,
    },

    /// A state label value that is not one of the five shard states.
    #[error("unknown shard state {0:?} (expected ready, expired, uncertain, dead or orphaned)")]
    UnknownShardState(String),

    /// A ring the sharder cannot act on; the message names the field to fix.
    #[error("invalid ring: {0}")]
    InvalidRing(String),

    /// A ring kind that is neither `clusterring` nor `controllerring`.
    #[error("unknown ring kind {0:?} (expected clusterring, controllerring)")]
    UnknownRingKind(String),

    /// A `shardSelector` the apiserver would refuse; the message says what is wrong.
    #[error("invalid shard selector: {0}")]
    InvalidShardSelector(String),

    /// The CRD could not be serialized.
    #[error("cannot serialize the ClusterRing CRD: {0}")]
    Serialize(String),
}
