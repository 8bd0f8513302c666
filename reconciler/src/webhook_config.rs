//! Keeping each ring's MutatingWebhookConfiguration (built by
//! `sharder_common::webhook_configuration`) in the cluster: [`controller`] applies it when it is
//! missing or differs, [`drift`] tells what differs, [`ca`] follows the CA file; [`guard`] keeps
//! the ring's label guard beside it and [`placement`] its placement policy, both through
//! [`pairs`].

pub(crate) mod ca;
pub(crate) mod controller;
pub(crate) mod drift;
pub(crate) mod guard;
pub(crate) mod pairs;
pub(crate) mod placement;
