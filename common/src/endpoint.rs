//! The webhook endpoint of the wire contract (docs/design.md §6): the apiserver calls
//! `POST /webhooks/sharder/clusterring/<ring>`, one path per ClusterRing. The reconciler writes
//! this path into each ring's webhook configuration and the webhook routes by it.

/// Path prefix of the webhook; the ring name follows.
pub const WEBHOOK_PATH_PREFIX: &str = "/webhooks/sharder/clusterring/";

/// The webhook path of ring `ring`.
pub fn webhook_path(ring: &str) -> String {
    format!("{WEBHOOK_PATH_PREFIX}{ring}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_names_the_ring() {
        assert_eq!(
            webhook_path("example"),
            "/webhooks/sharder/clusterring/example"
        );
    }
}
