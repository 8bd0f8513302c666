//! What one pass did, as counts and the objects left waiting ([`Outcome`]), and what handling
//! one object ended with ([`Handled`]): the rebalancer adds them up, the ring controller
//! schedules and reports from them.

use std::collections::{BTreeMap, BTreeSet};

use sharder_common::GroupResource;

use super::plan::{ChainProblem, Move, Reason};
use super::strays::Strays;
use crate::terms::{MAX_AWAITING, ObjectId, Scope};

/// What handling one object ended with.
pub(crate) enum Handled {
    /// Written.
    Moved(Move),
    /// A controlled object waits for its owner.
    Awaiting(ObjectId),
    /// Needed nothing (or was gone).
    Stayed,
    /// The write failed (after its retries). A controlled object is named: no label selects it
    /// again (it sits on a live shard), so it is looked at again like one awaiting its owner.
    Failed {
        /// The controlled object to look at again, if any.
        object: Option<ObjectId>,
        /// Whether the apiserver refused the write for good (400, 403, 422).
        permanent: bool,
    },
    /// Not written: the ring was deleted or replaced.
    Abandoned,
    /// Left where it is: its owner chain cannot be followed.
    Unresolved(ChainProblem),
}

/// Counts of one rebalance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Objects listed.
    pub listed: usize,
    /// Drain labels added.
    pub drained: usize,
    /// Main objects listed that were draining already (such as a previous leader's drains).
    pub already_draining: usize,
    /// Direct assignments, by reason.
    pub assigned: BTreeMap<Reason, usize>,
    /// Lists and writes that failed (writes after retries).
    pub errors: usize,
    /// Of those, failed lists.
    pub failed_lists: usize,
    /// Of those, writes refused for good (forbidden, invalid).
    pub refused: usize,
    /// Controlled objects waiting for their owner, or whose move failed: at most
    /// [`MAX_AWAITING`] and one more, which says there were too many to remember (memory stays
    /// bounded however many wait).
    pub awaiting: Vec<ObjectId>,
    /// Objects that needed a write but were left because the ring was gone by then.
    pub abandoned: usize,
    /// Objects left where they are because their owner chain cannot be followed, and the
    /// least such problem.
    pub unresolved: (usize, Option<ChainProblem>),
    /// Per resource, the objects no available shard held, as the last list of all of them found.
    pub strays: BTreeMap<GroupResource, Strays>,
    /// The lists run.
    pub lists: BTreeSet<Scope>,
    /// Drains not acknowledged yet, as counted after the lists (0 when not counted).
    pub pending_drains: usize,
    /// Whether drains are pending, or the list after them must come again (it failed or
    /// drained again).
    pub drains_pending: bool,
}

impl Outcome {
    /// Whether anything was written.
    pub(crate) fn moved_anything(&self) -> bool {
        self.drained > 0 || self.assigned.values().any(|n| *n > 0)
    }

    /// Adds `other`'s counts and waiting objects to these.
    pub(crate) fn add(&mut self, other: Outcome) {
        self.listed += other.listed;
        self.drained += other.drained;
        self.already_draining += other.already_draining;
        self.errors += other.errors;
        self.failed_lists += other.failed_lists;
        self.refused += other.refused;
        self.abandoned += other.abandoned;
        self.unresolved.0 += other.unresolved.0;
        if let Some(problem) = other.unresolved.1 {
            self.unresolved(problem);
        }
        for (reason, n) in other.assigned {
            *self.assigned.entry(reason).or_default() += n;
        }
        other.awaiting.into_iter().for_each(|o| self.wait(o));
        self.lists.extend(other.lists);
        self.pending_drains += other.pending_drains;
        self.drains_pending |= other.drains_pending;
        // `other` listed later: what it found replaces what was found before.
        self.strays.extend(other.strays);
    }

    /// Remembers `object` as waiting, up to one beyond [`MAX_AWAITING`].
    fn wait(&mut self, object: ObjectId) {
        if self.awaiting.len() <= MAX_AWAITING {
            self.awaiting.push(object);
        }
    }

    /// Whether more objects wait than are remembered by name.
    pub(crate) fn too_many_awaiting(&self) -> bool {
        self.awaiting.len() > MAX_AWAITING
    }

    /// Keeps `problem` if it is the least (in order) seen: the same chains give the same one.
    fn unresolved(&mut self, problem: ChainProblem) {
        let least = self
            .unresolved
            .1
            .take()
            .map_or(problem.clone(), |p| p.min(problem));
        self.unresolved.1 = Some(least);
    }

    /// Counts what handling one object ended with.
    pub(crate) fn count(&mut self, handled: Handled) {
        match handled {
            Handled::Moved(Move::Drain { .. }) => self.drained += 1,
            Handled::Moved(Move::Assign { reason, .. }) => {
                *self.assigned.entry(reason).or_default() += 1;
            }
            Handled::Awaiting(object) => self.wait(object),
            Handled::Stayed => {}
            Handled::Failed { object, permanent } => {
                self.errors += 1;
                self.refused += usize::from(permanent);
                object.into_iter().for_each(|o| self.wait(o));
            }
            Handled::Abandoned => self.abandoned += 1,
            Handled::Unresolved(problem) => {
                self.unresolved.0 += 1;
                self.unresolved(problem);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use sharder_common::GroupResource;

    use super::*;

    fn object(name: &str) -> ObjectId {
        ObjectId {
            resource: GroupResource::new("", "configmaps"),
            namespace: Some("ns".into()),
            name: name.into(),
        }
    }

    #[test]
    fn a_controlled_object_whose_write_failed_is_looked_at_again_and_a_main_one_is_not() {
        let mut outcome = Outcome::default();
        outcome.count(Handled::Failed {
            object: Some(object("child-1")),
            permanent: false,
        });
        outcome.count(Handled::Failed {
            object: None,
            permanent: true,
        });
        outcome.count(Handled::Awaiting(object("child-2")));
        assert_eq!((outcome.errors, outcome.refused), (2, 1));
        assert_eq!(outcome.awaiting, [object("child-1"), object("child-2")]);
    }

    #[test]
    fn an_outcome_remembers_one_waiting_object_beyond_the_bound_and_no_more() {
        let mut outcome = Outcome::default();
        for i in 0..MAX_AWAITING {
            outcome.count(Handled::Awaiting(object(&format!("child-{i}"))));
        }
        assert!(!outcome.too_many_awaiting(), "as many as the bound");
        let mut more = Outcome::default();
        for i in 0..5 {
            more.count(Handled::Awaiting(object(&format!("more-{i}"))));
        }
        outcome.add(more);
        assert!(outcome.too_many_awaiting());
        assert_eq!(outcome.awaiting.len(), MAX_AWAITING + 1);
    }
}
