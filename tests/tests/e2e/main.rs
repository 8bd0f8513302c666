//! Sharder end to end, one test binary (one control plane): every component a real process on the
//! real apiserver. One module per topic: the ClusterRing API and shard Leases as the apiserver
//! serves them, the scenarios (scale-out and in, crashes, leader failover, the webhook down, a
//! rolling update), range mode, the Helm chart installed and run with its own RBAC, the chaos
//! run, and the user's journey on a real node. libtest starts tests in name order:
//! `a_real_node` comes first so that its node start and its lease-bound waits run beside the
//! other tests.

mod a_real_node;
mod chaos;
mod chart;
mod cluster_ring_api;
mod faults;
mod range_mode;
mod scenarios;
