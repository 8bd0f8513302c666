//! Object keys (docs/design.md §4): the string hashed onto the ring.
//!
//! A main object's key is `<group>/<Kind>/<namespace>/<name>` (core group empty, cluster-scoped
//! objects with an empty namespace). A controlled object's key is its controller owner's key,
//! built from the `controller: true` ownerReference, so owner and children land on one shard. The
//! version is never part of a key: a version bump must not move objects. A ring keyed by
//! namespace ([`Keying::Namespace`]) hashes every namespaced object by its namespace instead, so
//! a namespace's objects live on one shard whatever owns what.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::Error;
use crate::cluster_ring::Role;

/// The ring annotation that chooses what a ring in label mode hashes ([`Keying`]): `object`
/// (the default) or `namespace`. An annotation, not a spec field: the reference's CRDs prune
/// fields their schema does not know, annotations survive.
pub const KEY_ANNOTATION: &str = "sharder.dev/key";

/// What a ring hashes for each object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Keying {
    /// A main object's own key, a controlled object's controller's key (the reference's rule).
    #[default]
    Object,
    /// The namespace of every namespaced object ([`ObjectKey::namespace`]); cluster-scoped
    /// objects keep their object key, so a Namespace lands with its objects.
    Namespace,
}

impl Keying {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Object => "object",
            Self::Namespace => "namespace",
        }
    }
}

impl FromStr for Keying {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self, Error> {
        match value {
            "object" => Ok(Self::Object),
            "namespace" => Ok(Self::Namespace),
            other => Err(Error::InvalidRing(format!(
                "annotation {KEY_ANNOTATION}: {other:?} is not object or namespace"
            ))),
        }
    }
}

impl fmt::Display for Keying {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The key of an object on the ring.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(String);

impl ObjectKey {
    /// The key of a main object. `None` when the object has no name yet (created with
    /// `generateName`: the webhook leaves it unassigned and the reconciler's sweep assigns it).
    pub fn main(group: &str, kind: &str, namespace: Option<&str>, name: &str) -> Option<Self> {
        if name.is_empty() {
            return None;
        }
        Some(Self::build(
            group,
            kind,
            namespace.unwrap_or_default(),
            name,
        ))
    }

    /// The key of a controlled object in `namespace` (None or empty when cluster-scoped): its
    /// controller owner's key. `Ok(None)` when no ownerReference has `controller: true`.
    ///
    /// Errors name the malformed reference: more than one controller, an unparsable
    /// `apiVersion`, or an empty `kind` or `name`.
    pub fn controlled(
        namespace: Option<&str>,
        owner_references: &[OwnerReference],
    ) -> Result<Option<Self>, Error> {
        let mut controllers = owner_references
            .iter()
            .filter(|r| r.controller == Some(true));
        let Some(owner) = controllers.next() else {
            return Ok(None);
        };
        if controllers.next().is_some() {
            return Err(Error::MultipleControllers {
                count: owner_references
                    .iter()
                    .filter(|r| r.controller == Some(true))
                    .count(),
            });
        }
        let group = group_of_api_version(&owner.api_version)?;
        if owner.kind.is_empty() {
            return Err(Error::MalformedOwnerReference {
                field: "kind",
                value: owner.kind.clone(),
                reason: "must not be empty",
            });
        }
        if owner.name.is_empty() {
            return Err(Error::MalformedOwnerReference {
                field: "name",
                value: owner.name.clone(),
                reason: "must not be empty",
            });
        }
        Ok(Some(Self::build(
            group,
            &owner.kind,
            namespace.unwrap_or_default(),
            &owner.name,
        )))
    }

    /// The key of every namespaced object of `namespace` in a ring keyed by namespace: the key
    /// of the Namespace object itself (`/Namespace//<namespace>`).
    pub fn namespace(namespace: &str) -> Self {
        Self::build("", "Namespace", "", namespace)
    }

    /// The key of an object of a resource with `role` in a ring that hashes as `keying` says
    /// (group and kind of the object's resource, the object's namespace, its metadata): its
    /// namespace's key when keyed by namespace and namespaced, otherwise a main object's own
    /// key, a controlled object's owner's key. `Ok(None)` when it has none (no name yet, no
    /// controller reference); errors name a malformed controller reference.
    pub fn of(
        keying: Keying,
        role: Role,
        group: &str,
        kind: &str,
        namespace: Option<&str>,
        meta: &ObjectMeta,
    ) -> Result<Option<Self>, Error> {
        if let (Keying::Namespace, Some(namespace)) = (keying, namespace.filter(|n| !n.is_empty()))
        {
            return Ok(Some(Self::namespace(namespace)));
        }
        match role {
            Role::Main => Ok(Self::main(
                group,
                kind,
                namespace,
                meta.name.as_deref().unwrap_or_default(),
            )),
            Role::Controlled => Self::controlled(
                namespace,
                meta.owner_references.as_deref().unwrap_or_default(),
            ),
        }
    }

    fn build(group: &str, kind: &str, namespace: &str, name: &str) -> Self {
        Self(format!("{group}/{kind}/{namespace}/{name}"))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ObjectKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// How logs and errors name an object: `namespace/name`, or `name` when cluster-scoped.
pub fn display_name(meta: &ObjectMeta) -> String {
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// The API group of an `apiVersion`: `"v1"` -> `""`, `"apps/v1"` -> `"apps"`.
pub fn group_of_api_version(api_version: &str) -> Result<&str, Error> {
    let malformed = |reason| Error::MalformedOwnerReference {
        field: "apiVersion",
        value: api_version.to_owned(),
        reason,
    };
    if api_version.is_empty() {
        return Err(malformed("must not be empty"));
    }
    match api_version.split_once('/') {
        None => Ok(""),
        Some((group, version)) => {
            if group.is_empty() || version.is_empty() {
                Err(malformed("must be <version> or <group>/<version>"))
            } else if version.contains('/') {
                Err(malformed("has more than one '/'"))
            } else {
                Ok(group)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(
        api_version: &str,
        kind: &str,
        name: &str,
        controller: Option<bool>,
    ) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "0a1b2c3d".into(),
            controller,
            block_owner_deletion: None,
        }
    }

    #[test]
    fn main_object_keys_follow_the_contract() {
        let table = [
            ("", "Secret", Some("default"), "foo", "/Secret/default/foo"),
            (
                "apps",
                "Deployment",
                Some("prod"),
                "web",
                "apps/Deployment/prod/web",
            ),
            (
                "example.com",
                "Widget",
                None,
                "w1",
                "example.com/Widget//w1",
            ),
            (
                "",
                "Namespace",
                Some(""),
                "kube-system",
                "/Namespace//kube-system",
            ),
        ];
        for (group, kind, namespace, name, want) in table {
            let key = ObjectKey::main(group, kind, namespace, name).expect("named object");
            assert_eq!(key.as_str(), want);
            assert_eq!(key.to_string(), want);
        }
    }

    #[test]
    fn main_object_without_a_name_has_no_key() {
        assert_eq!(ObjectKey::main("", "Secret", Some("default"), ""), None);
    }

    #[test]
    fn controlled_object_key_equals_its_owners_key() {
        let refs = [
            owner("v1", "ConfigMap", "unrelated", None),
            owner("apps/v1", "Deployment", "web", Some(true)),
        ];
        let child = ObjectKey::controlled(Some("prod"), &refs).expect("valid");
        let parent = ObjectKey::main("apps", "Deployment", Some("prod"), "web");
        assert_eq!(child, parent);
    }

    #[test]
    fn controlled_key_ignores_the_owners_version() {
        let v1 =
            ObjectKey::controlled(Some("ns"), &[owner("example.com/v1", "W", "a", Some(true))]);
        let v2 =
            ObjectKey::controlled(Some("ns"), &[owner("example.com/v2", "W", "a", Some(true))]);
        assert_eq!(v1.expect("valid"), v2.expect("valid"));
    }

    #[test]
    fn core_group_owner_gives_an_empty_group() {
        let key = ObjectKey::controlled(Some("default"), &[owner("v1", "Secret", "s", Some(true))])
            .expect("valid")
            .expect("has controller");
        assert_eq!(key.as_str(), "/Secret/default/s");
    }

    #[test]
    fn cluster_scoped_controlled_object_has_an_empty_namespace() {
        let key = ObjectKey::controlled(None, &[owner("example.com/v1", "Theme", "t", Some(true))])
            .expect("valid")
            .expect("has controller");
        assert_eq!(key.as_str(), "example.com/Theme//t");
    }

    #[test]
    fn no_controller_reference_means_no_key() {
        let table: [&[OwnerReference]; 3] = [
            &[],
            &[owner("v1", "Secret", "s", None)],
            &[owner("v1", "Secret", "s", Some(false))],
        ];
        for refs in table {
            assert_eq!(
                ObjectKey::controlled(Some("ns"), refs).expect("valid"),
                None
            );
        }
    }

    #[test]
    fn malformed_controller_references_are_typed_errors() {
        let table = [
            (owner("", "Secret", "s", Some(true)), "apiVersion"),
            (owner("/v1", "Secret", "s", Some(true)), "apiVersion"),
            (owner("apps/", "Deployment", "s", Some(true)), "apiVersion"),
            (owner("a/b/c", "Deployment", "s", Some(true)), "apiVersion"),
            (owner("apps/v1", "", "s", Some(true)), "kind"),
            (owner("apps/v1", "Deployment", "", Some(true)), "name"),
        ];
        for (reference, want_field) in table {
            match ObjectKey::controlled(Some("ns"), std::slice::from_ref(&reference)) {
                Err(Error::MalformedOwnerReference { field, .. }) => {
                    assert_eq!(field, want_field, "{reference:?}");
                }
                other => panic!("{reference:?}: expected a malformed reference, got {other:?}"),
            }
        }
    }

    #[test]
    fn two_controller_references_are_an_error() {
        let refs = [
            owner("v1", "Secret", "a", Some(true)),
            owner("v1", "Secret", "b", Some(true)),
        ];
        assert!(matches!(
            ObjectKey::controlled(Some("ns"), &refs),
            Err(Error::MultipleControllers { count: 2 })
        ));
    }

    #[test]
    fn malformed_non_controller_references_are_ignored() {
        let refs = [
            owner("", "", "", None),
            owner("v1", "Secret", "ok", Some(true)),
        ];
        assert!(
            ObjectKey::controlled(Some("ns"), &refs)
                .expect("valid")
                .is_some()
        );
    }

    #[test]
    fn keys_by_role_come_from_the_object_or_its_controller() {
        let meta = ObjectMeta {
            name: Some("child".into()),
            owner_references: Some(vec![owner("v1", "Secret", "parent", Some(true))]),
            ..ObjectMeta::default()
        };
        let main = ObjectKey::of(
            Keying::Object,
            Role::Main,
            "",
            "ConfigMap",
            Some("ns"),
            &meta,
        );
        assert_eq!(
            main.expect("valid").expect("named").as_str(),
            "/ConfigMap/ns/child"
        );
        let controlled = ObjectKey::of(
            Keying::Object,
            Role::Controlled,
            "",
            "ConfigMap",
            Some("ns"),
            &meta,
        );
        assert_eq!(
            controlled.expect("valid").expect("controlled").as_str(),
            "/Secret/ns/parent"
        );
        let unnamed = ObjectMeta::default();
        assert_eq!(
            ObjectKey::of(
                Keying::Object,
                Role::Main,
                "",
                "Secret",
                Some("ns"),
                &unnamed
            )
            .expect("valid"),
            None
        );
        let malformed = ObjectMeta {
            owner_references: Some(vec![owner("a/b/c", "Secret", "p", Some(true))]),
            ..ObjectMeta::default()
        };
        assert!(
            ObjectKey::of(
                Keying::Object,
                Role::Controlled,
                "",
                "ConfigMap",
                Some("ns"),
                &malformed
            )
            .is_err()
        );
    }

    #[test]
    fn a_ring_keyed_by_namespace_hashes_each_namespaced_object_by_its_namespace() {
        let meta = |name: &str, owners: Vec<OwnerReference>| ObjectMeta {
            name: (!name.is_empty()).then(|| name.into()),
            owner_references: (!owners.is_empty()).then_some(owners),
            ..ObjectMeta::default()
        };
        let controller = || vec![owner("v1", "Secret", "parent", Some(true))];
        let malformed = || vec![owner("a/b/c", "Secret", "p", Some(true))];
        // (role, kind, namespace, name, owners, key by object, key by namespace)
        let table = [
            (
                Role::Main,
                "ConfigMap",
                Some("ns"),
                "a",
                vec![],
                Some("/ConfigMap/ns/a"),
                Some("/Namespace//ns"),
            ),
            (
                Role::Main,
                "ConfigMap",
                Some("ns"),
                "",
                vec![],
                None,
                Some("/Namespace//ns"),
            ),
            (
                Role::Controlled,
                "ConfigMap",
                Some("ns"),
                "c",
                controller(),
                Some("/Secret/ns/parent"),
                Some("/Namespace//ns"),
            ),
            (
                Role::Controlled,
                "ConfigMap",
                Some("ns"),
                "c",
                vec![],
                None,
                Some("/Namespace//ns"),
            ),
            (
                Role::Controlled,
                "ConfigMap",
                Some("other"),
                "c",
                malformed(),
                None,
                Some("/Namespace//other"),
            ),
            // Cluster-scoped: the object key either way; a Namespace's own key is its objects'.
            (
                Role::Main,
                "Namespace",
                None,
                "ns",
                vec![],
                Some("/Namespace//ns"),
                Some("/Namespace//ns"),
            ),
            (
                Role::Main,
                "Namespace",
                Some(""),
                "ns",
                vec![],
                Some("/Namespace//ns"),
                Some("/Namespace//ns"),
            ),
            (
                Role::Controlled,
                "Widget",
                None,
                "w",
                controller(),
                Some("/Secret//parent"),
                Some("/Secret//parent"),
            ),
        ];
        for (role, kind, namespace, name, owners, by_object, by_namespace) in table {
            let meta = meta(name, owners);
            let key = |keying| {
                ObjectKey::of(keying, role, "", kind, namespace, &meta)
                    .ok()
                    .flatten()
                    .map(|k| k.as_str().to_owned())
            };
            let case = format!("{role:?} {kind} {namespace:?}/{name}");
            assert_eq!(key(Keying::Object).as_deref(), by_object, "{case}");
            assert_eq!(key(Keying::Namespace).as_deref(), by_namespace, "{case}");
        }
    }

    #[test]
    fn keyings_parse_from_their_names_only() {
        for keying in [Keying::Object, Keying::Namespace] {
            assert_eq!(keying.as_str().parse::<Keying>().expect("own name"), keying);
            assert_eq!(keying.to_string(), keying.as_str());
        }
        let error = "Namespace".parse::<Keying>().expect_err("case matters");
        assert_eq!(
            error.to_string(),
            format!(
                "invalid ring: annotation {KEY_ANNOTATION}: \"Namespace\" is not object or namespace"
            )
        );
    }

    #[test]
    fn display_names_are_namespace_slash_name_or_the_name_alone() {
        let named = |namespace: Option<&str>, name: &str| ObjectMeta {
            name: Some(name.into()),
            namespace: namespace.map(Into::into),
            ..ObjectMeta::default()
        };
        assert_eq!(display_name(&named(Some("ns"), "a")), "ns/a");
        assert_eq!(display_name(&named(None, "a")), "a");
        assert_eq!(display_name(&named(Some(""), "a")), "a");
    }

    #[test]
    fn errors_name_the_field_to_fix() {
        let err = group_of_api_version("a/b/c").expect_err("malformed");
        assert_eq!(
            err.to_string(),
            "malformed controller ownerReference: apiVersion \"a/b/c\" has more than one '/'"
        );
    }
}
