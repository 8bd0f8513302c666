//! The two kinds of ring and every name that follows from a ring's kind and name (docs/design.md
//! §2): `ClusterRing`, the contract of the reference implementation's v0.8 release, and
//! `ControllerRing`, the contract of its releases since v0.9. Both declare the same thing (a
//! ring's resources and namespaces); they differ only in the names on the wire: the label on shard
//! Leases, the shard and drain label keys, the webhook path, the webhook configuration's name and
//! the metric label. This module is the one place that tells the kinds apart.

use std::fmt;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use sha2::{Digest, Sha256};

use crate::key::{KEY_ANNOTATION, Keying};
use crate::labels::{
    DRAIN_LABEL_PREFIX, MAX_LABEL_NAME_LEN, MAX_LABEL_VALUE_LEN, RingLabels, SHARD_LABEL_PREFIX,
};
use crate::ranges::{RANGE_KEY_ANNOTATION, RangeKey};
use crate::{ClusterRing, Error, Role, Roles};

/// API group of both ring kinds.
pub const API_GROUP: &str = "sharding.timebertt.dev";

/// API version of both ring kinds.
pub const API_VERSION: &str = "v1alpha1";

/// Path prefix of the webhook; `<kind in lower case>/<ring>` follows.
pub const WEBHOOK_PATH_PREFIX: &str = "/webhooks/sharder/";

/// Prefix of the labels on shard Leases that name their ring (`<prefix><kind in lower case>`).
const LEASE_LABEL_PREFIX: &str = "alpha.sharding.timebertt.dev/";

/// The kind of a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RingKind {
    /// `ClusterRing` (reference v0.8): label keys `…/clusterring-<sha256(name)[..8]>-<name>`,
    /// cut to 63 characters, so any name fits.
    ClusterRing,
    /// `ControllerRing` (reference v0.9 and later): label keys `…/<name>`; the name is at most
    /// 63 characters.
    ControllerRing,
}

impl RingKind {
    /// Both kinds.
    pub const ALL: [Self; 2] = [Self::ClusterRing, Self::ControllerRing];

    /// The kind as the API names it (`ClusterRing`, `ControllerRing`).
    pub fn kind(self) -> &'static str {
        match self {
            Self::ClusterRing => "ClusterRing",
            Self::ControllerRing => "ControllerRing",
        }
    }

    /// The kind in lower case: the lease label's and the webhook path's segment, the metric
    /// label's name and the value of `--ring-kinds`.
    pub fn lower(self) -> &'static str {
        match self {
            Self::ClusterRing => "clusterring",
            Self::ControllerRing => "controllerring",
        }
    }

    /// The resource's plural name.
    pub fn plural(self) -> &'static str {
        match self {
            Self::ClusterRing => "clusterrings",
            Self::ControllerRing => "controllerrings",
        }
    }

    /// The label on shard Leases whose value names the shard's ring of this kind.
    pub fn lease_label(self) -> &'static str {
        match self {
            Self::ClusterRing => "alpha.sharding.timebertt.dev/clusterring",
            Self::ControllerRing => "alpha.sharding.timebertt.dev/controllerring",
        }
    }

    /// The name of a ring state gauge (`metadata_generation`, `observed_generation`,
    /// `status_shards`, `status_available_shards`) for rings of this kind:
    /// `kube_clusterring_<name>` as kube-state-metrics would name it for a ClusterRing,
    /// `controller_sharding_controllerring_<name>` as the reference names it for a
    /// ControllerRing.
    pub fn state_metric(self, name: &str) -> String {
        match self {
            Self::ClusterRing => format!("kube_clusterring_{name}"),
            Self::ControllerRing => format!("controller_sharding_controllerring_{name}"),
        }
    }

    /// The kind's API resource, for clients that serve both kinds with one code path.
    pub fn api_resource(self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(API_GROUP, API_VERSION, self.kind()),
            self.plural(),
        )
    }

    /// The kind whose rings `lease_label` (a label key on a shard Lease) names, if any.
    pub fn of_lease_label(lease_label: &str) -> Option<Self> {
        let lower = lease_label.strip_prefix(LEASE_LABEL_PREFIX)?;
        Self::ALL.into_iter().find(|k| k.lower() == lower)
    }
}

impl std::str::FromStr for RingKind {
    type Err = Error;

    /// Parses the kind in lower case (`clusterring`, `controllerring`), as `--ring-kinds` takes it.
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|k| k.lower() == s)
            .ok_or_else(|| Error::UnknownRingKind(s.to_owned()))
    }
}

impl fmt::Display for RingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}

/// One ring: its kind and name. Every name the ring has on the wire follows from it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RingId {
    /// The ring's kind.
    pub kind: RingKind,
    /// The ring object's name.
    pub name: String,
}

impl RingId {
    /// The ring `name` of `kind`.
    pub fn new(kind: RingKind, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
        }
    }

    /// The ClusterRing `name`.
    pub fn cluster_ring(name: impl Into<String>) -> Self {
        Self::new(RingKind::ClusterRing, name)
    }

    /// The ControllerRing `name`.
    pub fn controller_ring(name: impl Into<String>) -> Self {
        Self::new(RingKind::ControllerRing, name)
    }

    /// Checks what a ring's name must satisfy for its Leases and label keys to be valid and its
    /// own: it is at most 63 characters (its shards' Leases carry it as a label value; a
    /// ControllerRing's name is also the name part of its label keys; the ControllerRing CRD
    /// says so too), and a ControllerRing's is not the label name of a ClusterRing
    /// (`clusterring-<8 hex digits>-…`), whose objects it would share.
    pub fn validate(&self) -> Result<(), Error> {
        if self.name.len() > MAX_LABEL_VALUE_LEN {
            let keys = match self.kind {
                RingKind::ClusterRing => "",
                RingKind::ControllerRing => " and the name part of the ring's label keys",
            };
            return Err(Error::InvalidRing(format!(
                "{} name must not be longer than {MAX_LABEL_VALUE_LEN} characters \
                 (metadata.name {:?} has {}): it is the value of label {} on the ring's shard \
                 Leases{keys}",
                self.kind.kind(),
                self.name,
                self.name.len(),
                self.kind.lease_label(),
            )));
        }
        if self.kind != RingKind::ControllerRing {
            return Ok(());
        }
        let hashed = self
            .name
            .strip_prefix("clusterring-")
            .and_then(|rest| rest.get(..9))
            .is_some_and(|h| h.ends_with('-') && h[..8].bytes().all(|b| b.is_ascii_hexdigit()));
        if hashed {
            return Err(Error::InvalidRing(format!(
                "ControllerRing name {:?} has the form of a ClusterRing's label name \
                 (clusterring-<checksum>-<name>): the two rings would share label keys; \
                 rename it",
                self.name
            )));
        }
        Ok(())
    }

    /// The name part shared by the ring's shard and drain label keys: for a ClusterRing the
    /// first 63 characters of `clusterring-<hex(sha256(name))[..8]>-<name>`, for a
    /// ControllerRing the name itself.
    pub fn label_name(&self) -> String {
        match self.kind {
            RingKind::ClusterRing => {
                let digest = Sha256::digest(self.name.as_bytes());
                let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
                format!("clusterring-{hex}-{}", self.name)
                    .chars()
                    .take(MAX_LABEL_NAME_LEN)
                    .collect()
            }
            RingKind::ControllerRing => self.name.clone(),
        }
    }

    /// The ring's shard and drain label keys.
    pub fn labels(&self) -> RingLabels {
        let name = self.label_name();
        RingLabels {
            shard: format!("{SHARD_LABEL_PREFIX}{name}"),
            drain: format!("{DRAIN_LABEL_PREFIX}{name}"),
        }
    }

    /// The label selector of the ring's shard Leases (`<lease label>=<name>`).
    pub fn lease_selector(&self) -> String {
        format!("{}={}", self.kind.lease_label(), self.name)
    }

    /// The path the apiserver calls the webhook on for this ring:
    /// `/webhooks/sharder/<kind in lower case>/<name>`.
    pub fn webhook_path(&self) -> String {
        format!("{WEBHOOK_PATH_PREFIX}{}/{}", self.kind.lower(), self.name)
    }

    /// The ring a webhook path names, if it names one.
    pub fn from_webhook_path(path: &str) -> Option<Self> {
        let (kind, name) = path.strip_prefix(WEBHOOK_PATH_PREFIX)?.split_once('/')?;
        let kind = RingKind::ALL.into_iter().find(|k| k.lower() == kind)?;
        (!name.is_empty() && !name.contains('/')).then(|| Self::new(kind, name))
    }

    /// The name of the ring's MutatingWebhookConfiguration: for a ClusterRing `sharder-` + its
    /// label name (unique per ring whatever the name's length), for a ControllerRing
    /// `controllerring-<name>`, as the reference names it.
    pub fn configuration_name(&self) -> String {
        match self.kind {
            RingKind::ClusterRing => format!("sharder-{}", self.label_name()),
            RingKind::ControllerRing => format!("controllerring-{}", self.name),
        }
    }

    /// The name the reference's v0.8 gave a ClusterRing's configuration when its name differs
    /// from Sharder's: `sharding-` + the label name. A switch from v0.8 leaves it calling the
    /// reference's removed Service; the reconciler deletes it. None for a ControllerRing (the
    /// reference names it as Sharder does, and Sharder takes it over).
    pub fn reference_configuration_name(&self) -> Option<String> {
        match self.kind {
            RingKind::ClusterRing => Some(format!("sharding-{}", self.label_name())),
            RingKind::ControllerRing => None,
        }
    }
}

/// A ring object of either kind as read from the apiserver: its identity and its fields. The two
/// kinds' schemas are the same, so a ControllerRing is read into [`ClusterRing`]'s type; what
/// depends on the kind is asked of [`id`](Self::id), never of the object.
#[derive(Clone, Debug, PartialEq)]
pub struct RingObject {
    /// The ring.
    pub id: RingId,
    /// Its metadata, spec and status.
    pub object: ClusterRing,
    /// Why its spec or status could not be read, if so (then its spec is empty and it is
    /// invalid).
    pub unreadable: Option<String>,
}

impl RingObject {
    /// A ClusterRing.
    pub fn cluster_ring(object: ClusterRing) -> Self {
        Self {
            id: RingId::cluster_ring(object.name_any()),
            object,
            unreadable: None,
        }
    }

    /// A ring of `kind` as a watch or list of that kind returns it.
    pub fn from_dynamic(kind: RingKind, object: &DynamicObject) -> Self {
        let id = RingId::new(kind, object.name_any());
        let fields = serde_json::json!({
            "metadata": object.metadata,
            "spec": object.data.get("spec").cloned().unwrap_or_else(|| serde_json::json!({})),
            "status": object.data.get("status").cloned(),
        });
        match serde_json::from_value::<ClusterRing>(fields) {
            Ok(ring) => Self {
                id,
                object: ring,
                unreadable: None,
            },
            Err(e) => {
                let mut ring = ClusterRing::new(&id.name, Default::default());
                ring.metadata = object.metadata.clone();
                Self {
                    id,
                    object: ring,
                    unreadable: Some(format!("spec or status does not parse: {e}")),
                }
            }
        }
    }

    /// The ring's resources with their roles, or why the ring is invalid: its name
    /// ([`RingId::validate`]), an unreadable spec, or the spec's own checks
    /// ([`crate::ClusterRingSpec::roles`]).
    pub fn roles(&self) -> Result<Roles, Error> {
        self.id.validate()?;
        if let Some(reason) = &self.unreadable {
            return Err(Error::InvalidRing(reason.clone()));
        }
        self.object.spec.roles()
    }

    /// The ring's range key if it is in range mode ([`crate::ranges::RANGE_KEY_ANNOTATION`]),
    /// or why it cannot be: an unknown key, or the key `uid` on a ring with controlled resources
    /// (a child would hash apart from its owner).
    pub fn range_key(&self) -> Result<Option<RangeKey>, Error> {
        let Some(value) = self.object.annotations().get(RANGE_KEY_ANNOTATION) else {
            return Ok(None);
        };
        let key: RangeKey = value.parse().map_err(|_| {
            Error::InvalidRing(format!(
                "annotation {RANGE_KEY_ANNOTATION}: {value:?} is not uid or namespace"
            ))
        })?;
        let controlled = self
            .roles()?
            .iter()
            .any(|(_, role)| role == Role::Controlled);
        if key == RangeKey::Uid && controlled {
            return Err(Error::InvalidRing(format!(
                "annotation {RANGE_KEY_ANNOTATION}: uid would hash children apart from their owners; use namespace, or no controlled resources"
            )));
        }
        Ok(Some(key))
    }

    /// What the ring hashes in label mode ([`crate::key::KEY_ANNOTATION`]; by object when not
    /// annotated), or why it cannot say: an unknown value, or the annotation on a ring in range
    /// mode, whose key is its range key's.
    pub fn keying(&self) -> Result<Keying, Error> {
        let annotations = self.object.annotations();
        let Some(value) = annotations.get(KEY_ANNOTATION) else {
            return Ok(Keying::Object);
        };
        if annotations.contains_key(RANGE_KEY_ANNOTATION) {
            return Err(Error::InvalidRing(format!(
                "annotation {KEY_ANNOTATION} is for label mode; a ring in range mode is keyed by its {RANGE_KEY_ANNOTATION}: remove one"
            )));
        }
        value.parse()
    }

    /// The ring's shard and drain label keys.
    pub fn labels(&self) -> RingLabels {
        self.id.labels()
    }

    /// A controller reference to the ring, for the objects it owns (its webhook configuration).
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: format!("{API_GROUP}/{API_VERSION}"),
            kind: self.id.kind.kind().to_owned(),
            name: self.id.name.clone(),
            uid: self.object.uid().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    /// A reference to the ring, for Events about it.
    pub fn object_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(format!("{API_GROUP}/{API_VERSION}")),
            kind: Some(self.id.kind.kind().to_owned()),
            name: Some(self.id.name.clone()),
            uid: self.object.uid(),
            resource_version: self.object.resource_version(),
            ..ObjectReference::default()
        }
    }
}

impl fmt::Display for RingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ring_label_keys_match_the_seed_golden_value() {
        let labels = RingId::cluster_ring("example").labels();
        assert_eq!(
            labels.shard,
            "shard.alpha.sharding.timebertt.dev/clusterring-50d858e0-example"
        );
        assert_eq!(
            labels.drain,
            "drain.alpha.sharding.timebertt.dev/clusterring-50d858e0-example"
        );
    }

    #[test]
    fn controller_ring_label_keys_are_the_plain_name() {
        let labels = RingId::controller_ring("example").labels();
        assert_eq!(labels.shard, "shard.alpha.sharding.timebertt.dev/example");
        assert_eq!(labels.drain, "drain.alpha.sharding.timebertt.dev/example");
    }

    #[test]
    fn cluster_ring_name_parts_are_checksum_prefixed_for_a_table_of_rings() {
        // Checksums computed independently with `printf %s NAME | sha256sum | cut -c1-8`.
        let table = [
            ("example", "clusterring-50d858e0-example"),
            ("a", "clusterring-ca978112-a"),
            ("my-clusterring", "clusterring-f959313c-my-clusterring"),
            (
                "kube-controller-manager-deployment",
                "clusterring-9b5084f8-kube-controller-manager-deployment",
            ),
        ];
        for (ring, want) in table {
            assert_eq!(RingId::cluster_ring(ring).label_name(), want, "ring {ring}");
        }
    }

    #[test]
    fn long_cluster_ring_names_are_cut_to_63_characters() {
        let ring = "r".repeat(200);
        let name = RingId::cluster_ring(&ring).label_name();
        assert_eq!(name.len(), MAX_LABEL_NAME_LEN);
        assert!(name.starts_with("clusterring-"));
        // 12 ("clusterring-") + 8 (checksum) + 1 ("-") leave 42 characters of the ring name.
        assert_eq!(&name[21..], "r".repeat(42));
        let exact = "x".repeat(42);
        assert!(RingId::cluster_ring(&exact).label_name().ends_with(&exact));
    }

    #[test]
    fn long_cluster_rings_sharing_a_prefix_get_distinct_keys() {
        let a = RingId::cluster_ring(format!("{}-a", "p".repeat(80)));
        let b = RingId::cluster_ring(format!("{}-b", "p".repeat(80)));
        assert_ne!(a.labels(), b.labels());
    }

    #[test]
    fn a_ring_name_of_63_characters_is_valid_and_64_is_not() {
        let exact = RingId::controller_ring("c".repeat(63));
        assert!(exact.validate().is_ok());
        assert_eq!(
            exact.labels().shard,
            format!("shard.alpha.sharding.timebertt.dev/{}", "c".repeat(63))
        );
        assert!(RingId::cluster_ring("c".repeat(63)).validate().is_ok());
        for (ring, names) in [
            (RingId::controller_ring("c".repeat(64)), "label keys"),
            (RingId::cluster_ring("c".repeat(64)), "Leases"),
        ] {
            let error = ring.validate().expect_err("64 characters").to_string();
            assert!(
                error.contains("must not be longer than 63")
                    && error.contains("metadata.name")
                    && error.contains(ring.kind.lease_label())
                    && error.contains(names),
                "{error}"
            );
        }
    }

    #[test]
    fn each_kind_names_its_lease_label_path_and_configuration() {
        let cluster = RingId::cluster_ring("example");
        let controller = RingId::controller_ring("example");
        assert_eq!(
            cluster.lease_selector(),
            "alpha.sharding.timebertt.dev/clusterring=example"
        );
        assert_eq!(
            controller.lease_selector(),
            "alpha.sharding.timebertt.dev/controllerring=example"
        );
        assert_eq!(
            cluster.webhook_path(),
            "/webhooks/sharder/clusterring/example"
        );
        assert_eq!(
            controller.webhook_path(),
            "/webhooks/sharder/controllerring/example"
        );
        assert_eq!(
            cluster.configuration_name(),
            "sharder-clusterring-50d858e0-example"
        );
        assert_eq!(controller.configuration_name(), "controllerring-example");
        assert_eq!(
            cluster.reference_configuration_name().as_deref(),
            Some("sharding-clusterring-50d858e0-example")
        );
        assert_eq!(controller.reference_configuration_name(), None);
        assert_eq!(cluster.to_string(), "ClusterRing example");
        assert_eq!(controller.to_string(), "ControllerRing example");
    }

    #[test]
    fn webhook_paths_name_their_ring_and_nothing_else() {
        for ring in [
            RingId::cluster_ring("example"),
            RingId::controller_ring("example"),
            RingId::controller_ring("c".repeat(63)),
        ] {
            assert_eq!(RingId::from_webhook_path(&ring.webhook_path()), Some(ring));
        }
        for path in [
            "/webhooks/sharder/clusterring/",
            "/webhooks/sharder/clusterring",
            "/webhooks/sharder/otherring/example",
            "/webhooks/sharder/controllerring/a/b",
            "/webhooks/other/controllerring/example",
            "",
        ] {
            assert_eq!(RingId::from_webhook_path(path), None, "{path}");
        }
    }

    #[test]
    fn lease_labels_name_their_kind() {
        for kind in RingKind::ALL {
            assert_eq!(RingKind::of_lease_label(kind.lease_label()), Some(kind));
        }
        assert_eq!(
            RingKind::of_lease_label("alpha.sharding.timebertt.dev/state"),
            None
        );
    }

    #[test]
    fn each_kind_has_its_api_resource() {
        let r = RingKind::ControllerRing.api_resource();
        assert_eq!(
            (r.group.as_str(), r.version.as_str(), r.kind.as_str()),
            ("sharding.timebertt.dev", "v1alpha1", "ControllerRing")
        );
        assert_eq!(r.plural, "controllerrings");
        assert_eq!(r.api_version, "sharding.timebertt.dev/v1alpha1");
        assert_eq!(RingKind::ClusterRing.api_resource().plural, "clusterrings");
    }

    #[test]
    fn the_two_kinds_never_share_a_label_key() {
        for name in ["example", "a", "checksums", &"c".repeat(63)] {
            assert_ne!(
                RingId::cluster_ring(name).labels(),
                RingId::controller_ring(name).labels()
            );
        }
        // The one ControllerRing name that would share a ClusterRing's keys is refused.
        let cluster = RingId::cluster_ring("example");
        let twin = RingId::controller_ring(cluster.label_name());
        assert_eq!(twin.labels(), cluster.labels());
        let error = twin.validate().expect_err("a twin").to_string();
        assert!(error.contains("share label keys"), "{error}");
        assert!(
            RingId::controller_ring("clusterring-example")
                .validate()
                .is_ok(),
            "only the checksum form is refused"
        );
    }

    #[test]
    fn kinds_parse_from_lower_case() {
        for kind in RingKind::ALL {
            assert_eq!(kind.lower().parse::<RingKind>().ok(), Some(kind));
        }
        let error = "ClusterRing"
            .parse::<RingKind>()
            .expect_err("case")
            .to_string();
        assert!(error.contains("clusterring, controllerring"), "{error}");
    }

    #[test]
    fn a_controller_ring_is_read_into_the_shared_type_and_keeps_its_kind() {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "sharding.timebertt.dev/v1alpha1",
            "kind": "ControllerRing",
            "metadata": { "name": "example", "uid": "u-1", "generation": 3 },
            "spec": { "resources": [{ "group": "", "resource": "secrets",
                "controlledResources": [{ "group": "", "resource": "configmaps" }] }] },
            "status": { "shards": 2, "availableShards": 1 },
        }))
        .expect("an object");
        let ring = RingObject::from_dynamic(RingKind::ControllerRing, &object);
        assert_eq!(ring.id, RingId::controller_ring("example"));
        assert_eq!(ring.unreadable, None);
        assert_eq!(ring.object.metadata.generation, Some(3));
        assert_eq!(ring.roles().expect("valid").len(), 2);
        assert_eq!(
            ring.object.status.as_ref().and_then(|s| s.available_shards),
            Some(1)
        );
        assert_eq!(
            ring.labels().shard,
            "shard.alpha.sharding.timebertt.dev/example"
        );
        let owner = ring.owner_reference();
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("ControllerRing", "u-1", Some(true))
        );
        assert_eq!(
            ring.object_reference().kind.as_deref(),
            Some("ControllerRing")
        );
    }

    #[test]
    fn an_unreadable_or_misnamed_ring_is_invalid_and_says_why() {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "sharding.timebertt.dev/v1alpha1",
            "kind": "ControllerRing",
            "metadata": { "name": "broken" },
            "spec": { "resources": "not a list" },
        }))
        .expect("an object");
        let ring = RingObject::from_dynamic(RingKind::ControllerRing, &object);
        let error = ring.roles().expect_err("unreadable").to_string();
        assert!(error.contains("does not parse"), "{error}");

        let mut long = object.clone();
        long.metadata.name = Some("l".repeat(64));
        long.data["spec"] = serde_json::json!({});
        let error = RingObject::from_dynamic(RingKind::ControllerRing, &long)
            .roles()
            .expect_err("too long")
            .to_string();
        assert!(error.contains("longer than 63"), "{error}");
    }

    #[test]
    fn a_ring_is_in_range_mode_by_its_annotation_and_refuses_uid_with_children() {
        use crate::{ClusterRingSpec, GroupResource, RingResource};
        let ring = |annotation: Option<&str>, children: &[&str]| {
            let mut object = ClusterRing::new(
                "ring",
                ClusterRingSpec {
                    resources: vec![RingResource {
                        group: String::new(),
                        resource: "configmaps".into(),
                        controlled_resources: children
                            .iter()
                            .map(|r| GroupResource::new("", *r))
                            .collect(),
                    }],
                    ..ClusterRingSpec::default()
                },
            );
            if let Some(value) = annotation {
                object
                    .annotations_mut()
                    .insert(RANGE_KEY_ANNOTATION.into(), value.into());
            }
            RingObject::cluster_ring(object)
        };
        for (annotation, children, expected) in [
            (None, &[][..], Ok(None)),
            (Some("uid"), &[], Ok(Some(RangeKey::Uid))),
            (
                Some("namespace"),
                &["secrets"],
                Ok(Some(RangeKey::Namespace)),
            ),
            (
                Some("uid"),
                &["secrets"],
                Err("uid would hash children apart"),
            ),
            (Some("name"), &[], Err("\"name\" is not uid or namespace")),
        ] {
            let got = ring(annotation, children).range_key();
            match (got, expected) {
                (Ok(key), Ok(want)) => assert_eq!(key, want, "{annotation:?}"),
                (Err(e), Err(fault)) => assert!(e.to_string().contains(fault), "{e}"),
                (got, want) => panic!("{annotation:?} {children:?}: {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn a_rings_keying_comes_from_its_key_annotation_in_label_mode_only() {
        let ring = |annotations: &[(&str, &str)]| {
            let mut object = ClusterRing::new("ring", crate::ClusterRingSpec::default());
            for (key, value) in annotations {
                object
                    .annotations_mut()
                    .insert((*key).into(), (*value).into());
            }
            RingObject::cluster_ring(object)
        };
        type Annotations<'a> = &'a [(&'a str, &'a str)];
        let table: [(Annotations<'_>, Result<Keying, &str>); 6] = [
            (&[], Ok(Keying::Object)),
            (&[(KEY_ANNOTATION, "object")], Ok(Keying::Object)),
            (&[(KEY_ANNOTATION, "namespace")], Ok(Keying::Namespace)),
            (
                &[(KEY_ANNOTATION, "")],
                Err("\"\" is not object or namespace"),
            ),
            (
                &[(KEY_ANNOTATION, "uid")],
                Err("\"uid\" is not object or namespace"),
            ),
            (
                &[
                    (KEY_ANNOTATION, "namespace"),
                    (RANGE_KEY_ANNOTATION, "namespace"),
                ],
                Err("is for label mode"),
            ),
        ];
        for (annotations, expected) in table {
            match (ring(annotations).keying(), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{annotations:?}"),
                (Err(e), Err(fault)) => assert!(e.to_string().contains(fault), "{e}"),
                (got, want) => panic!("{annotations:?}: {got:?}, expected {want:?}"),
            }
        }
    }
}
