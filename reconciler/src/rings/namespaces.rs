//! Which namespaces a ring's namespaced objects are sharded in: those both its
//! namespaceSelector (none: all) and the global `--namespace-selector` select (the same selector
//! the ring's webhook configuration carries), and how its objects are listed
//! ([`Namespaces::new`]: namespace by namespace when it selects at most half of the cluster's).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ListParams;
use kube::core::{Selector, SelectorExt as _};
use kube::{Api, Client, ResourceExt};
use sharder_common::ClusterRingSpec;

use crate::Error;
use crate::rebalance::Target;
use sharder_common::webhook_configuration::ring_namespace_selector;

/// Namespaces per list page.
const PAGE: u32 = 500;

/// The ring's namespaces now: every namespace is listed (metadata only, page by page) and
/// matched against the ring's selector with the apiserver's semantics (kube's `Selector`).
pub(crate) async fn namespaces(
    client: &Client,
    spec: &ClusterRingSpec,
    global: &LabelSelector,
) -> Result<Namespaces, Error> {
    // The ring's own selector is checked first, so its error names the ring's field.
    spec.parse_namespace_selector()?;
    let selector = Selector::try_from(ring_namespace_selector(spec, global))
        .map_err(|e| Error::NamespaceSelector(e.to_string()))?;
    let api = Api::<Namespace>::all(client.clone());
    let mut params = ListParams::default().limit(PAGE);
    let mut selected = BTreeSet::new();
    let mut total = 0;
    loop {
        let page = api.list_metadata(&params).await.map_err(Error::Kube)?;
        total += page.items.len();
        selected.extend(
            page.items
                .iter()
                .filter(|ns| selector.matches(ns.labels()))
                .map(ResourceExt::name_any),
        );
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(Namespaces::new(selected, total)),
        }
    }
}

/// Which namespaces a ring's namespaced objects may be in, and how they are listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Namespaces {
    /// The ring's namespaces.
    pub selected: BTreeSet<String>,
    /// List namespaced objects namespace by namespace instead of across the cluster (see
    /// [`Namespaces::new`]).
    pub one_by_one: bool,
}

impl Namespaces {
    /// The ring's namespaces `selected` among the cluster's `total`. Its namespaced objects
    /// are listed namespace by namespace when it selects at most half of them, else across the
    /// cluster (objects elsewhere left out as they arrive). The apiserver goes through every
    /// object of the resource in a list's range, whatever the label selector (its watch cache
    /// holds each resource ordered by namespace): across the cluster, a ring of a few
    /// namespaces would have every Secret (say) of the cluster read on every sweep, while one
    /// list per namespace reads only its own, at a request each.
    pub(crate) fn new(selected: BTreeSet<String>, total: usize) -> Self {
        let one_by_one = selected.len() * 2 <= total;
        Self {
            selected,
            one_by_one,
        }
    }

    /// Whether a namespaced object in `namespace` belongs to the ring.
    pub(crate) fn contains(&self, namespace: &str) -> bool {
        self.selected.contains(namespace)
    }

    /// Whether an object of `target` in `namespace` (as listed) belongs to the ring: every
    /// cluster-scoped one, a namespaced one in a selected namespace.
    pub(crate) fn holds(&self, target: &Target, namespace: Option<&str>) -> bool {
        !target.namespaced || namespace.is_some_and(|ns| self.contains(ns))
    }

    /// Where `target`'s objects are listed from: `None` for the whole cluster, else each
    /// namespace.
    pub(crate) fn list_ranges(&self, target: &Target) -> Vec<Option<&str>> {
        if target.namespaced && self.one_by_one {
            self.selected.iter().map(|ns| Some(ns.as_str())).collect()
        } else {
            vec![None]
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::{ApiResource, GroupVersionKind};
    use sharder_common::{GroupResource, Role};

    use super::*;

    fn target(namespaced: bool) -> Target {
        Target {
            resource: GroupResource {
                group: String::new(),
                resource: "secrets".into(),
            },
            role: Role::Main,
            api: ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Secret")),
            namespaced,
        }
    }

    fn names(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_ring_of_at_most_half_the_namespaces_lists_them_one_by_one() {
        for (selected, total, one_by_one) in [
            (&["a"][..], 1000, true),
            (&["a", "b"], 4, true),
            (&["a", "b", "c"], 5, false),
            (&["a", "b"], 2, false),
            (&[], 0, true),
            (&[], 7, true),
        ] {
            let namespaces = Namespaces::new(names(selected), total);
            assert_eq!(namespaces.one_by_one, one_by_one, "{selected:?} of {total}");
        }
    }

    #[test]
    fn a_listed_object_belongs_to_the_ring_only_in_a_selected_namespace() {
        let namespaces = Namespaces::new(names(&["a", "b", "c"]), 4);
        let secrets = target(true);
        assert!(namespaces.holds(&secrets, Some("a")));
        assert!(
            !namespaces.holds(&secrets, Some("kube-system")),
            "a cluster-wide list brings objects of other namespaces: they are left out"
        );
        assert!(
            !namespaces.holds(&secrets, None),
            "namespaced but no namespace"
        );
        let cluster_scoped = target(false);
        assert!(namespaces.holds(&cluster_scoped, None));
        assert!(Namespaces::default().holds(&cluster_scoped, None));
    }

    #[test]
    fn list_ranges_are_each_namespace_in_order_or_the_whole_cluster() {
        let few = Namespaces::new(names(&["b", "a"]), 10);
        assert_eq!(few.list_ranges(&target(true)), vec![Some("a"), Some("b")]);
        assert_eq!(
            few.list_ranges(&target(false)),
            vec![None],
            "cluster-scoped objects are listed across the cluster"
        );
        let most = Namespaces::new(names(&["a", "b", "c"]), 4);
        assert_eq!(most.list_ranges(&target(true)), vec![None]);
        assert!(most.contains("a") && !most.contains("d"));
        let none = Namespaces::new(BTreeSet::new(), 3);
        assert!(
            none.list_ranges(&target(true)).is_empty(),
            "no namespace selected: nothing namespaced to list"
        );
    }
}
