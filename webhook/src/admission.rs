//! The webhook's decision as a pure function of an admission request and the ring snapshot of
//! its ring (a ClusterRing or a ControllerRing: docs/design.md §7): already labelled -> allowed without patch; otherwise a JSON patch
//! that adds the shard label of the shard the ring picks for the object's key. It never denies.

use std::collections::BTreeMap;
use std::fmt;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use k8s_openapi::ByteString;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde::Serialize;
use serde_json::Value;
use sharder_common::handover::{OwnerState, child_shard};
use sharder_common::{ClusterRingSpec, Keying, ObjectKey, Ring, RingId, RingLabels, Role, Roles};

/// Everything the webhook needs of one ring: its label keys, which resources it shards
/// in which role, and the ring of its available shards. Immutable; rebuilt when the ring or its
/// shards change.
#[derive(Clone, Debug, PartialEq)]
pub struct RingSnapshot {
    /// The ring.
    pub id: RingId,
    /// Its shard and drain label keys.
    pub labels: RingLabels,
    /// The ring of available shards.
    pub ring: Ring,
    /// The JSON pointers an assignment patch writes (built once, not per review).
    pointers: Pointers,
    /// The resources' roles, or why the spec is invalid (then nothing is assigned, as the
    /// reconciler moves nothing of an invalid ring).
    roles: Result<Roles, String>,
    /// What the ring hashes.
    keying: Keying,
}

impl RingSnapshot {
    /// The snapshot of `ring` with `spec` and the given available shards (invalid, assigning
    /// nothing, when the ring's name or spec is: [`RingId::validate`],
    /// [`ClusterRingSpec::roles`]).
    pub fn new<I, S>(ring: &RingId, spec: &ClusterRingSpec, available_shards: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            id: ring.clone(),
            labels: ring.labels(),
            pointers: Pointers::new(&ring.labels()),
            ring: Ring::new(available_shards),
            roles: ring
                .validate()
                .and_then(|()| spec.roles())
                .map_err(|e| e.to_string()),
            keying: Keying::Object,
        }
    }

    /// The same snapshot for a ring that hashes as `keying` says.
    pub fn keyed_by(mut self, keying: Keying) -> Self {
        self.keying = keying;
        self
    }

    /// The snapshot of `ring` whose spec cannot be read (`reason`): it assigns nothing.
    pub fn invalid(ring: &RingId, reason: String) -> Self {
        Self {
            id: ring.clone(),
            labels: ring.labels(),
            pointers: Pointers::new(&ring.labels()),
            ring: Ring::new(std::iter::empty::<String>()),
            roles: Err(reason),
            keying: Keying::Object,
        }
    }

    /// Why the ring is invalid, if it is.
    pub fn invalid_reason(&self) -> Option<&str> {
        self.roles.as_ref().err().map(String::as_str)
    }

    /// The role of a resource in this ring, if it is sharded by it (`None` too when the spec is
    /// invalid).
    pub fn role(&self, group: &str, resource: &str) -> Option<Role> {
        self.roles.as_ref().ok()?.get(group, resource)
    }
}

/// Why an object was allowed without an assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// The path names a ClusterRing the webhook does not know.
    UnknownRing,
    /// The ClusterRing's spec is invalid (its status says why).
    InvalidRing,
    /// The ring has no available shard.
    NoShardAvailable,
    /// A main object without a name yet (`generateName`): the reconciler's sweep assigns it.
    NoName,
    /// A controlled object without a controller ownerReference.
    NoControllerReference,
    /// A controlled object whose controller ownerReference is malformed.
    MalformedOwnerReference,
    /// The resource (or subresource) is not sharded by this ring.
    ResourceNotSharded,
    /// The request carries no object (e.g. DELETE).
    NoObject,
    /// A controlled object whose owner no shard holds yet (unassigned or not found): the
    /// reconciler's sweep assigns it once the owner is held.
    OwnerNotHeld,
    /// A controlled object whose owner could not be read: the reconciler's sweep assigns it.
    OwnerUnknown,
}

impl SkipReason {
    /// Every reason, for metrics.
    pub const ALL: [SkipReason; 10] = [
        Self::UnknownRing,
        Self::InvalidRing,
        Self::NoShardAvailable,
        Self::NoName,
        Self::NoControllerReference,
        Self::MalformedOwnerReference,
        Self::ResourceNotSharded,
        Self::NoObject,
        Self::OwnerNotHeld,
        Self::OwnerUnknown,
    ];

    /// The reason as a metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownRing => "unknown_ring",
            Self::InvalidRing => "invalid_ring",
            Self::NoShardAvailable => "no_shard_available",
            Self::NoName => "no_name",
            Self::NoControllerReference => "no_controller_reference",
            Self::MalformedOwnerReference => "malformed_owner_reference",
            Self::ResourceNotSharded => "resource_not_sharded",
            Self::NoObject => "no_object",
            Self::OwnerNotHeld => "owner_not_held",
            Self::OwnerUnknown => "owner_unknown",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the webhook does with one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The object already carries the ring's shard label: allowed, no patch.
    AlreadyAssigned,
    /// Allowed with a patch adding the shard label.
    Assign {
        /// The object's key on the ring.
        key: ObjectKey,
        /// The shard picked by the ring.
        shard: String,
        /// The JSON patch for the object.
        patch: Patch,
    },
    /// A controlled object: it goes where its owner is held now, which only the owner's state
    /// tells ([`decide_child`]).
    FollowOwner {
        /// The object's key on the ring (its owner's key).
        key: ObjectKey,
        /// Its controller owner.
        owner: OwnerRef,
    },
    /// Allowed without a patch.
    Skip {
        /// Why.
        reason: SkipReason,
        /// Details for the log line.
        detail: String,
    },
}

/// The controller owner of a controlled object under admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRef {
    /// The owner's `apiVersion`.
    pub api_version: String,
    /// The owner's kind.
    pub kind: String,
    /// The owner's namespace: the object's (`None`: cluster-scoped).
    pub namespace: Option<String>,
    /// The owner's name.
    pub name: String,
}

/// The JSON pointer `/metadata/labels[/key]` (RFC 6901 escaping by jsonptr).
fn labels_pointer(key: Option<&str>) -> PointerBuf {
    PointerBuf::from_tokens(["metadata", "labels"].into_iter().chain(key))
}

/// The JSON pointers of a ring's assignment patch: the label map, its shard label and its drain
/// label.
#[derive(Clone, Debug, PartialEq)]
struct Pointers {
    labels: PointerBuf,
    shard: PointerBuf,
    drain: PointerBuf,
}

impl Pointers {
    fn new(labels: &RingLabels) -> Self {
        Self {
            labels: labels_pointer(None),
            shard: labels_pointer(Some(&labels.shard)),
            drain: labels_pointer(Some(&labels.drain)),
        }
    }
}

impl RingSnapshot {
    /// The patch that sets the shard label to `shard` (and drops a leftover drain label) on an
    /// object whose `labels` are as given.
    pub fn assignment_patch(
        &self,
        labels: Option<&BTreeMap<String, String>>,
        shard: &str,
    ) -> Patch {
        let mut ops = Vec::with_capacity(2);
        if labels.is_none() {
            ops.push(PatchOperation::Add(AddOperation {
                path: self.pointers.labels.clone(),
                value: Value::Object(serde_json::Map::new()),
            }));
        }
        ops.push(PatchOperation::Add(AddOperation {
            path: self.pointers.shard.clone(),
            value: Value::String(shard.to_owned()),
        }));
        if labels.is_some_and(|l| l.contains_key(&self.labels.drain)) {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: self.pointers.drain.clone(),
            }));
        }
        Patch(ops)
    }
}

/// Decides what to do with `request` for the ring snapshot `ring` (`None`: unknown ring).
pub fn decide(request: &AdmissionRequest<DynamicObject>, ring: Option<&RingSnapshot>) -> Decision {
    let skip = |reason, detail: String| Decision::Skip { reason, detail };
    let Some(ring) = ring else {
        return skip(SkipReason::UnknownRing, String::new());
    };
    let Some(object) = request.object.as_ref() else {
        return skip(SkipReason::NoObject, format!("{:?}", request.operation));
    };
    let (group, resource) = (&request.resource.group, &request.resource.resource);
    if let Err(reason) = &ring.roles {
        return skip(SkipReason::InvalidRing, reason.clone());
    }
    let role = match (&request.sub_resource, ring.role(group, resource)) {
        (None, Some(role)) => role,
        (Some(sub), _) => {
            return skip(
                SkipReason::ResourceNotSharded,
                format!("subresource {resource}/{sub}"),
            );
        }
        (None, None) => {
            return skip(
                SkipReason::ResourceNotSharded,
                format!("{resource}.{group}"),
            );
        }
    };
    let labels = object.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(&ring.labels.shard)) {
        return Decision::AlreadyAssigned;
    }
    let key = match ObjectKey::of(
        ring.keying,
        role,
        group,
        &request.kind.kind,
        request.namespace.as_deref(),
        &object.metadata,
    ) {
        Ok(Some(key)) => key,
        Ok(None) if role == Role::Main => return skip(SkipReason::NoName, String::new()),
        Ok(None) => return skip(SkipReason::NoControllerReference, String::new()),
        Err(e) => return skip(SkipReason::MalformedOwnerReference, e.to_string()),
    };
    let Some(shard) = ring.ring.shard_for(key.as_str()) else {
        return skip(SkipReason::NoShardAvailable, String::new());
    };
    // A controlled object follows its owner's holder; in a ring keyed by namespace one without
    // a (well-formed) controller has a key all the same and takes the ring's choice.
    let owners = object
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    if role == Role::Controlled
        && ObjectKey::controlled(request.namespace.as_deref(), owners).is_ok_and(|k| k.is_some())
    {
        let controller = owners.iter().find(|r| r.controller == Some(true));
        if let Some(controller) = controller {
            return Decision::FollowOwner {
                key,
                owner: OwnerRef {
                    api_version: controller.api_version.clone(),
                    kind: controller.kind.clone(),
                    namespace: request.namespace.clone(),
                    name: controller.name.clone(),
                },
            };
        }
    }
    Decision::Assign {
        patch: ring.assignment_patch(labels, shard),
        shard: shard.to_owned(),
        key,
    }
}

/// The decision for a controlled object ([`Decision::FollowOwner`]) once its owner's state is
/// known: the shard that holds the owner now, never the ring's choice ahead of it
/// (`sharder_common::handover`); skipped while no shard holds the owner.
pub fn decide_child(
    request: &AdmissionRequest<DynamicObject>,
    ring: &RingSnapshot,
    key: ObjectKey,
    owner: &OwnerState,
) -> Decision {
    let Some(desired) = ring.ring.shard_for(key.as_str()) else {
        return Decision::Skip {
            reason: SkipReason::NoShardAvailable,
            detail: String::new(),
        };
    };
    match child_shard(owner, desired, |s| ring.ring.contains(s)) {
        Some(shard) => Decision::Assign {
            patch: ring.assignment_patch(
                request
                    .object
                    .as_ref()
                    .and_then(|o| o.metadata.labels.as_ref()),
                shard,
            ),
            shard: shard.to_owned(),
            key,
        },
        None => Decision::Skip {
            reason: SkipReason::OwnerNotHeld,
            detail: format!("owner {}", owner.as_str()),
        },
    }
}

/// An AdmissionReview answer as the apiserver reads it. kube's `AdmissionResponse` writes its
/// patch as a JSON array of byte values (up to four characters a byte, each formatted as a
/// number); Go's `[]byte` reads base64 as well, which this writes (four characters per three
/// bytes).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer<'a> {
    api_version: &'a str,
    kind: &'a str,
    response: AnswerResponse<'a>,
}

/// The `response` of an [`Answer`].
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AnswerResponse<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<ByteString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<[String; 1]>,
}

/// Room for a serialized assignment patch (the label map, the shard label and a drain label's
/// removal fit), so the buffer is not regrown per review.
const PATCH_CAPACITY: usize = 256;

/// Room for a serialized answer beside its patch, so the buffer is not regrown per review.
const ANSWER_CAPACITY: usize = 256;

/// The response body (an AdmissionReview) for `decision`: always allowed; carries the patch of
/// an assignment, and a warning for a malformed controller reference (which the user can fix).
pub fn encode(
    request: &AdmissionRequest<DynamicObject>,
    decision: &Decision,
) -> Result<Vec<u8>, ReviewError> {
    let (patch, warnings) = match decision {
        // Serializing a patch of strings cannot fail; if it ever did, allowing the write
        // unassigned is the safe answer (the reconciler's sweep assigns it).
        Decision::Assign { patch, .. } => {
            let mut bytes = Vec::with_capacity(PATCH_CAPACITY);
            let written = serde_json::to_writer(&mut bytes, patch);
            (written.ok().map(|()| ByteString(bytes)), None)
        }
        Decision::Skip {
            reason: SkipReason::MalformedOwnerReference,
            detail,
        } => (
            None,
            Some([format!("sharder: object not assigned to a shard: {detail}")]),
        ),
        _ => (None, None),
    };
    let patch_len = patch.as_ref().map_or(0, |p| p.0.len());
    let answer = Answer {
        api_version: &request.types.api_version,
        kind: &request.types.kind,
        response: AnswerResponse {
            uid: &request.uid,
            allowed: true,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            warnings,
        },
    };
    let mut body = Vec::with_capacity(ANSWER_CAPACITY + patch_len * 4 / 3);
    serde_json::to_writer(&mut body, &answer).map_err(ReviewError::Encode)?;
    Ok(body)
}

/// Why a request body is not an AdmissionReview the webhook can answer.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The body is not JSON of an `admission.k8s.io/v1` AdmissionReview.
    #[error("body is not an admission.k8s.io/v1 AdmissionReview: {0}")]
    Parse(#[source] serde_json::Error),
    /// The AdmissionReview has no `request`.
    #[error("AdmissionReview has no request")]
    NoRequest,
    /// The answer could not be serialized (not expected: it holds strings only).
    #[error("could not serialize the AdmissionReview answer: {0}")]
    Encode(#[source] serde_json::Error),
    /// The AdmissionReview has an apiVersion other than `admission.k8s.io/v1`.
    #[error("AdmissionReview apiVersion {0:?} is not supported (expected admission.k8s.io/v1)")]
    Version(String),
}

/// Parses a request body into the AdmissionRequest it carries.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, ReviewError> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(ReviewError::Parse)?;
    if review.types.api_version != "admission.k8s.io/v1" {
        return Err(ReviewError::Version(review.types.api_version));
    }
    review.try_into().map_err(|_| ReviewError::NoRequest)
}

/// The pure path from request body to response body for a known owner state: parse the
/// review, decide (a controlled object by `owner`), answer.
pub fn review(
    body: &[u8],
    ring: Option<&RingSnapshot>,
    owner: &OwnerState,
) -> Result<(AdmissionRequest<DynamicObject>, Decision, Vec<u8>), ReviewError> {
    let request = parse(body)?;
    let decision = match (decide(&request, ring), ring) {
        (Decision::FollowOwner { key, .. }, Some(ring)) => decide_child(&request, ring, key, owner),
        (decision, _) => decision,
    };
    let body = encode(&request, &decision)?;
    Ok((request, decision, body))
}

#[cfg(test)]
mod tests;
