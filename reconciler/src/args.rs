//! The flags of `sharder-reconciler` (each with an environment variable fallback) and their
//! parsing: what an operator sets, in one place.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use sharder_runtime::{CommonArgs, RingKindArgs, parse_duration};

/// Flags of `sharder-reconciler` (each with an environment variable fallback).
#[derive(clap::Parser, Clone, Debug)]
#[command(name = "sharder-reconciler", version, about = "Sharder's reconciler")]
pub struct Args {
    /// Namespace of the leader election Lease; also excluded from sharding by default.
    #[arg(long, env = "SHARDER_NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// Name of the leader election Lease.
    #[arg(
        long,
        env = "SHARDER_LEADER_ELECTION_NAME",
        default_value = "sharder-reconciler"
    )]
    pub leader_election_name: String,

    /// Identity of this replica in leader election (defaults to the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Leader election Lease duration.
    #[arg(long, env = "SHARDER_LEADER_ELECTION_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_duration: Duration,

    /// How often the leader renews its Lease (and standbys retry).
    #[arg(long, env = "SHARDER_LEADER_ELECTION_RENEW", default_value = "5s", value_parser = parse_duration)]
    pub leader_election_renew: Duration,

    /// PEM CA bundle that signed the webhook's certificate (the webhook configurations' caBundle).
    #[arg(long, env = "SHARDER_WEBHOOK_CA_FILE")]
    pub webhook_ca_file: PathBuf,

    /// How often `--webhook-ca-file` is checked for changes (a changed bundle goes into every
    /// webhook configuration).
    #[arg(long, env = "SHARDER_WEBHOOK_CA_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub webhook_ca_reload_interval: Duration,

    /// Base URL of the webhook (e.g. `https://127.0.0.1:9443`) instead of a Service.
    #[arg(
        long,
        env = "SHARDER_WEBHOOK_URL",
        conflicts_with = "webhook_service_name"
    )]
    pub webhook_url: Option<String>,

    /// Name of the webhook's Service (in `--namespace`).
    #[arg(
        long,
        env = "SHARDER_WEBHOOK_SERVICE_NAME",
        default_value = "sharder-webhook"
    )]
    pub webhook_service_name: String,

    /// Port of the webhook's Service.
    #[arg(long, env = "SHARDER_WEBHOOK_SERVICE_PORT", default_value_t = 443)]
    pub webhook_service_port: i32,

    /// `timeoutSeconds` of the webhook calls (1-30). What the apiserver waits for a webhook that
    /// accepts connections and never answers, on every CREATE of a ring's objects; then it
    /// creates the object unassigned (failurePolicy Ignore) and the next sweep assigns it.
    #[arg(
        long,
        env = "SHARDER_WEBHOOK_TIMEOUT_SECONDS",
        default_value_t = 5,
        value_parser = clap::value_parser!(i32).range(1..=30)
    )]
    pub webhook_timeout_seconds: i32,

    /// The namespaces every ring is limited to, as a JSON LabelSelector (`matchLabels`,
    /// `matchExpressions`), in addition to the ring's own namespaceSelector. Default: every
    /// namespace but `kube-system` and `--namespace`.
    #[arg(long, env = "SHARDER_NAMESPACE_SELECTOR", value_parser = parse_namespace_selector)]
    pub namespace_selector: Option<LabelSelector>,

    /// Label selector of the rings (of every served kind) this reconciler manages (empty: all).
    /// Shard Leases of other rings are left alone.
    #[arg(
        long,
        env = "SHARDER_RING_SELECTOR",
        alias = "clusterring-selector",
        default_value = ""
    )]
    pub ring_selector: String,

    /// The ring kinds served.
    #[command(flatten)]
    pub rings: RingKindArgs,

    /// Full resync of every ring: a list of all its objects, page by page, which repairs
    /// what no sweep selects (an object the webhook placed by a ring it had not updated yet).
    /// Rings are also listed in full whenever a shard joins or their spec changes.
    #[arg(long, env = "SHARDER_RESYNC_INTERVAL", default_value = "6h", value_parser = parse_duration)]
    pub resync_interval: Duration,

    /// Sweep for objects without a shard or on a shard not in the ring (missed by the webhook,
    /// created with generateName, labelled by hand): one list of what needs work. The default
    /// waits as long as the reference implementation's resync period.
    #[arg(long, env = "SHARDER_SWEEP_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub sweep_interval: Duration,

    /// Follow-up sweeps while drains are not acknowledged yet.
    #[arg(long, env = "SHARDER_DRAIN_CHECK_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub drain_check_interval: Duration,

    /// Objects per list page (at least 1). Up to a page of the objects that need a write wait
    /// for a write slot, so memory grows with it.
    #[arg(long, env = "SHARDER_LIST_PAGE_SIZE", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub list_page_size: u32,

    /// Object writes in flight at most: the limit starts at 16 (or this, if lower) and adapts
    /// to the apiserver's answers, growing while writes succeed and halving when it is
    /// overloaded (429, 503, 504, an answer slower than a second). More in flight than the
    /// apiserver's cores can serve adds latency for every other client, not writes per second.
    #[arg(long, env = "SHARDER_MAX_CONCURRENT_WRITES", default_value_t = DEFAULT_MAX_CONCURRENT_WRITES)]
    pub max_concurrent_writes: usize,

    /// A fixed bound on object writes per second, on top of the write concurrency that
    /// follows the apiserver's answers (0: none, the default).
    #[arg(long, env = "SHARDER_MAX_WRITES_PER_SECOND", default_value_t = 0)]
    pub max_writes_per_second: u32,

    /// The label guard (docs/operations.md, "Label guard"): a ValidatingAdmissionPolicy per
    /// ring that admits only the protocol's changes of the ring's shard and drain labels.
    /// `auto`: on where the apiserver serves ValidatingAdmissionPolicies (Kubernetes 1.30 or
    /// later), off where it does not.
    #[arg(long, env = "SHARDER_LABEL_GUARD", value_enum, default_value_t = LabelGuard::Auto)]
    pub label_guard: LabelGuard,

    /// Users who may acknowledge any shard's drains, comma-separated: shards that run outside
    /// pods and share one identity (e.g. `system:serviceaccount:<namespace>:<name>`). A shard
    /// in a pod acknowledges its own drains with its pod-bound token and needs no entry here.
    #[arg(long, env = "SHARDER_LABEL_GUARD_ACKNOWLEDGERS", value_delimiter = ',')]
    pub label_guard_acknowledgers: Vec<String>,

    /// For rings keyed by namespace (docs/design.md §4): a MutatingAdmissionPolicy in front
    /// of the webhook that assigns the objects of each namespace in the ring's table inside the
    /// apiserver, the table a ConfigMap in `--namespace`. `auto`: where the apiserver serves
    /// MutatingAdmissionPolicies (Kubernetes 1.36 or later); `off`: the webhook alone, and the
    /// policies of an earlier run are deleted.
    #[arg(long, env = "SHARDER_PLACEMENT_POLICY", value_enum, default_value_t = PlacementPolicy::Auto)]
    pub placement_policy: PlacementPolicy,

    /// Admin server and logging flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Whether namespace rings get a placement policy (`--placement-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementPolicy {
    /// Where the apiserver serves MutatingAdmissionPolicies.
    Auto,
    /// Never: the webhook alone.
    Off,
}

/// Whether the label guard is on (`--label-guard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LabelGuard {
    /// On where the apiserver serves ValidatingAdmissionPolicies, off where it does not.
    Auto,
    /// On; the reconciler does not start leading where the API is not served.
    On,
    /// Off: no guard, and the guards of an earlier run are deleted.
    Off,
}

/// Default of `--max-concurrent-writes`.
pub const DEFAULT_MAX_CONCURRENT_WRITES: usize = 32;

/// Parses `--namespace-selector`: a JSON LabelSelector that is also a valid selector.
fn parse_namespace_selector(value: &str) -> Result<LabelSelector, String> {
    let selector: LabelSelector = serde_json::from_str(value)
        .map_err(|e| format!("not a JSON LabelSelector (matchLabels, matchExpressions): {e}"))?;
    kube::core::Selector::try_from(selector.clone()).map_err(|e| format!("{e}: {value}"))?;
    Ok(selector)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    /// The flags every reconciler needs.
    const BASE: [&str; 5] = [
        "sharder-reconciler",
        "--webhook-url",
        "https://webhook",
        "--webhook-ca-file",
        "/ca.crt",
    ];

    #[test]
    fn a_list_page_of_no_objects_is_refused_with_the_flag_named() {
        let parse = |size: &str| {
            Args::try_parse_from(BASE.iter().copied().chain(["--list-page-size", size]))
        };
        let err = parse("0").expect_err("0 is no page").to_string();
        assert!(err.contains("--list-page-size"), "{err}");
        assert_eq!(parse("1").expect("1 object a page").list_page_size, 1);
    }

    #[test]
    fn a_webhook_timeout_the_api_would_refuse_is_refused_with_the_flag_named() {
        let parse = |seconds: &str| {
            let flag = format!("--webhook-timeout-seconds={seconds}");
            Args::try_parse_from(BASE.iter().copied().chain([flag.as_str()]))
        };
        for refused in ["0", "31", "-1"] {
            let err = parse(refused).expect_err(refused).to_string();
            assert!(err.contains("--webhook-timeout-seconds"), "{err}");
        }
        assert_eq!(parse("30").expect("30 s").webhook_timeout_seconds, 30);
        assert_eq!(
            Args::try_parse_from(BASE)
                .expect("defaults")
                .webhook_timeout_seconds,
            5
        );
    }

    #[test]
    fn the_namespace_selector_flag_is_a_json_label_selector() {
        let parsed = parse_namespace_selector(
            r#"{"matchExpressions":[{"key":"team","operator":"NotIn","values":["infra"]}]}"#,
        )
        .expect("parses");
        assert_eq!(parsed.match_expressions.expect("expressions").len(), 1);
        assert!(parse_namespace_selector(r#"{"matchLabels":{"team":"a"}}"#).is_ok());
        assert_eq!(parse_namespace_selector("{}"), Ok(LabelSelector::default()));
        let not_json = parse_namespace_selector("team=a").expect_err("not JSON");
        assert!(
            not_json.starts_with("not a JSON LabelSelector"),
            "{not_json}"
        );
        let bad_operator = parse_namespace_selector(
            r#"{"matchExpressions":[{"key":"team","operator":"Near","values":["a"]}]}"#,
        )
        .expect_err("bad operator");
        assert!(bad_operator.contains("Near"), "{bad_operator}");
    }
}
