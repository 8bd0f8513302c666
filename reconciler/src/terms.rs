//! The words a rebalance is made of, shared by the ring controller that schedules it and the
//! rebalancer that lists and writes: the resources of a ring ([`Target`]), which of their
//! objects one list selects ([`Scope`]), where they are listed from ([`Namespaces`]), how
//! one object is named ([`ObjectId`]) and one rebalance as data ([`Pass`]). A leaf: it imports
//! nothing of this crate.

use std::collections::BTreeSet;

use kube::core::ApiResource;
use sharder_common::{GroupResource, RingLabels, Role};

/// One resource of a ring, resolved through discovery.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// Group and plural name.
    pub resource: GroupResource,
    /// Main or controlled.
    pub role: Role,
    /// Kind, version and plural for requests.
    pub api: ApiResource,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

/// Which objects one list selects. Every list is consistent (`resourceVersion` unset) and
/// paginated (`--list-page-size`): from Kubernetes 1.34 on the apiserver answers it from its
/// watch cache after one read of etcd's current revision (`docs/operations.md`, "Lists and reads").
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Scope {
    /// Every object of the resource (a shard was added, the ring changed, periodic resync).
    All,
    /// Objects on one shard (`<shard label>=<shard>`), when that shard died.
    OnShard(String),
    /// Objects without a shard (`!<shard label>`) at a drain check: objects whose drain was
    /// acknowledged, new objects the webhook missed, `generateName` objects.
    Unassigned,
    /// Objects without a shard or on a shard that is not available (`<shard label> notin
    /// (<available shards>)`): the sweep of a quiet ring.
    Stray,
    /// Every object again, once the drains of a rebalance all ended: what the drain checks'
    /// lists cannot select. An acknowledged object that a webhook which had not seen the new
    /// shard's Lease yet put back on its old shard (drained again); a child its owner's old
    /// shard created while the owner drained (a reconcile begun before the drain label), which
    /// came after the lists that drained the owner and sits on a live shard.
    AfterDrains,
}

impl Scope {
    /// The name of the list in metrics (`sharder_reconciler_rebalances_total`'s `list` label).
    pub(crate) fn list_name(&self) -> &'static str {
        match self {
            Self::All => "all",
            Self::OnShard(_) => "on_shard",
            Self::Unassigned => "unassigned",
            Self::Stray => "stray",
            Self::AfterDrains => "after_drains",
        }
    }

    /// Whether the list selects every object of the resource that no available shard holds
    /// (then what it finds of them is their count, `rebalance::strays`).
    pub(crate) fn finds_strays(&self) -> bool {
        matches!(self, Self::All | Self::AfterDrains | Self::Stray)
    }

    /// Whether the list confirms what earlier writes did, so it must see every one of them: the
    /// list once the drains ended. The others only find work, whose writes are checked by
    /// their resourceVersion preconditions (`rebalance::listing::FROM_THE_CACHE`).
    pub(crate) fn confirms(&self) -> bool {
        matches!(self, Self::AfterDrains)
    }

    /// The label selector of the list (`None`: every object).
    pub(crate) fn selector(
        &self,
        labels: &RingLabels,
        available: &BTreeSet<String>,
    ) -> Option<String> {
        match self {
            Self::All | Self::AfterDrains => None,
            Self::OnShard(shard) => Some(format!("{}={shard}", labels.shard)),
            Self::Unassigned => Some(format!("!{}", labels.shard)),
            Self::Stray => Some(format!(
                "{} notin ({})",
                labels.shard,
                available.iter().cloned().collect::<Vec<_>>().join(",")
            )),
        }
    }
}

/// One rebalance as data, as the schedule decides it (`rings::schedule::next_pass`) and the
/// rebalancer runs it (`rebalance::Rebalancer::pass`): its lists, the children it reads again,
/// and what follows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pass {
    /// The lists, each over every resource of the ring (main resources first).
    pub lists: BTreeSet<Scope>,
    /// Controlled objects that waited for their owners, read again by name after the lists
    /// (none after a full list: it planned every child again).
    pub recheck: Vec<ObjectId>,
    /// Whether drain checks were due: the drains still pending are counted after the lists
    /// even when they drained nothing.
    pub drain_checks_due: bool,
    /// Whether drains were pending after the last pass.
    pub drains_pending: bool,
}

impl Pass {
    /// Whether the pending drains are counted after the lists, which `drained` objects: drain
    /// checks due, drains made, or everything listed.
    pub(crate) fn counts_drains(&self, drained: usize) -> bool {
        self.drain_checks_due || drained > 0 || self.lists.contains(&Scope::All)
    }

    /// Whether everything is listed once more at the end ([`Scope::AfterDrains`]): no drain is
    /// `pending` of those pending before the pass or made or met by it (`drains`).
    pub(crate) fn lists_after_drains(&self, pending: usize, drains: usize) -> bool {
        pending == 0 && (self.drains_pending || drains > 0)
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

/// The most controlled objects remembered as waiting for their owners (a pass keeps one more to
/// tell that there were more); beyond it they are listed again instead of read by name.
pub(crate) const MAX_AWAITING: usize = 10_000;

/// One object of a ring's resource: enough to read it again.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ObjectId {
    /// Its resource.
    pub resource: GroupResource,
    /// Its namespace (`None`: cluster-scoped).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use kube::core::GroupVersionKind;

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
