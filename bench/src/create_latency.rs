//! Section 1: CREATE latency through kube-apiserver at a fixed rate, in interleaved rounds of: no
//! webhook registered, the floor webhook registered, the sharder webhook registered (the same
//! MutatingWebhookConfiguration, only the URL differs); and for controlled objects (ConfigMaps
//! with a controller Secret) and a level below them (ConfigMaps controlled by such a ConfigMap:
//! a chain), no webhook and the sharder webhook, which reads each new child's direct owner so
//! the child lands where the owner is held now; and Secrets with the placement policy of a ring
//! keyed by namespace (`sharder_common::placement_policy`) in place of any webhook.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use sharder_common::placement_policy::{
    Table, binding_resource, placement_policy, policy_resource,
};
use sharder_common::webhook_configuration::{
    WebhookSettings, WebhookTarget, webhook_configuration,
};
use sharder_common::{ClusterRing, Ring, RingObject};
use sharder_harness::ControlPlane;
use sharder_harness::fixtures::{child_of, secret};

use crate::progress::progress;
use crate::report::{goals, table};
use crate::stats::{median_at, ms, percentile};
use crate::webhooks::Webhooks;
use crate::{Args, Error, RingSetup, apply_policy, delete_if_there};

/// The webhook a round registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hook {
    None,
    Floor,
    Sharder,
    /// The placement policy and its table, no webhook.
    Policy,
}

/// The shard the policy's table gives the bench's namespace: no shard of the ring has the
/// name, so a probe tells the policy's assignment from the webhook's.
const POLICY_SHARD: &str = "policy";

/// What a round creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// Secrets (main objects).
    Main,
    /// ConfigMaps controlled by a Secret on its shard.
    Child,
    /// ConfigMaps controlled by such a ConfigMap on its shard (a level of a chain).
    Grandchild,
}

/// The rounds' modes, in the order run: the report's name, the webhook registered, and what is
/// created; each mode adds latency to the first of its level.
const MODES: [(&str, Hook, Level); 8] = [
    ("no webhook", Hook::None, Level::Main),
    ("floor webhook", Hook::Floor, Level::Main),
    ("sharder webhook", Hook::Sharder, Level::Main),
    ("no webhook, children", Hook::None, Level::Child),
    ("sharder webhook, children", Hook::Sharder, Level::Child),
    ("no webhook, grandchildren", Hook::None, Level::Grandchild),
    (
        "sharder webhook, grandchildren",
        Hook::Sharder,
        Level::Grandchild,
    ),
    ("sharder policy", Hook::Policy, Level::Main),
];

/// Registers `hook` (or none) for the ring of `setup`; whatever else assigned is taken away.
async fn register(setup: &RingSetup, webhooks: &Webhooks, hook: Hook) -> Result<(), Error> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(setup.client.clone());
    let name = sharder_common::RingId::cluster_ring(&setup.ns).configuration_name();
    let ring = RingObject::cluster_ring(
        Api::<ClusterRing>::all(setup.client.clone())
            .get(&setup.ns)
            .await?,
    );
    let roles = ring.roles().map_err(|e| Error::Setup(e.to_string()))?;
    let apply = PatchParams::apply("sharder-bench").force();
    let policies = Api::<DynamicObject>::all_with(setup.client.clone(), &policy_resource());
    let bindings = Api::<DynamicObject>::all_with(setup.client.clone(), &binding_resource());
    if hook != Hook::Policy {
        delete_if_there(&bindings, &name).await?;
        delete_if_there(&policies, &name).await?;
    }
    let url = match hook {
        Hook::None => return delete_if_there(&api, &name).await,
        Hook::Policy => {
            delete_if_there(&api, &name).await?;
            // The table in `default`, outside the ring's namespace.
            let table = Table::of(&ring, "default");
            let mut entries = ConfigMap::default();
            entries.metadata.name = Some(table.name.clone());
            entries.data = Some([(setup.ns.clone(), POLICY_SHARD.to_owned())].into());
            Api::<ConfigMap>::namespaced(setup.client.clone(), &table.namespace)
                .patch(&table.name, &apply, &Patch::Apply(&entries))
                .await?;
            let (policy, binding) =
                placement_policy(&ring, &roles, &table, &LabelSelector::default());
            return apply_policy((&policies, &policy), (&bindings, &binding), &name).await;
        }
        Hook::Floor => format!("https://{}", webhooks.floor),
        Hook::Sharder => format!("https://{}", webhooks.sharder.addr),
    };
    let settings = WebhookSettings {
        target: WebhookTarget::Url(url),
        ca_bundle: webhooks.ca_pem.as_bytes().to_vec(),
        timeout_seconds: 10,
        namespace_selector: Default::default(),
    };
    let mut mwc = webhook_configuration(&ring, &roles, &settings);
    mwc.metadata.managed_fields = None;
    api.patch(&name, &apply, &Patch::Apply(&mwc)).await?;
    Ok(())
}

/// Creates the objects of the rounds: Secrets, or ConfigMaps each controlled by one of the
/// owners (Secrets already on their shards) or by one of the parents (ConfigMaps controlled by
/// an owner, on its shard).
#[derive(Clone)]
pub(crate) struct Creator {
    secrets: Api<Secret>,
    configmaps: Api<ConfigMap>,
    owners: Arc<[Secret]>,
    parents: Arc<[ConfigMap]>,
}

impl Creator {
    /// Creates Secrets (main objects only) in namespace `ns`.
    pub(crate) fn of_secrets(client: &kube::Client, ns: &str) -> Self {
        Self {
            secrets: Api::namespaced(client.clone(), ns),
            configmaps: Api::namespaced(client.clone(), ns),
            owners: Arc::from([]),
            parents: Arc::from([]),
        }
    }

    /// Creates object `name` of `level`, controlled by the owner or parent `i` picks; the
    /// labels it came back with.
    async fn create(
        &self,
        level: Level,
        name: &str,
        i: usize,
    ) -> Result<BTreeMap<String, String>, kube::Error> {
        let post = PostParams::default();
        let created = match level {
            Level::Main => self.secrets.create(&post, &secret(name)).await?.metadata,
            Level::Child => {
                let child = child_of(&self.owners[i % self.owners.len()], name);
                self.configmaps.create(&post, &child).await?.metadata
            }
            Level::Grandchild => {
                let parent = &self.parents[i % self.parents.len()];
                let mut grandchild = ConfigMap::default();
                grandchild.metadata.name = Some(name.to_owned());
                grandchild.metadata.owner_references =
                    parent.controller_owner_ref(&()).map(|r| vec![r]);
                self.configmaps.create(&post, &grandchild).await?.metadata
            }
        };
        Ok(created.labels.unwrap_or_default())
    }

    /// Registers the webhook of `mode` and waits until creates see it (probes labelled by it,
    /// or not at all).
    async fn switch(
        &self,
        setup: &RingSetup,
        webhooks: &Webhooks,
        (name, hook, child): (&str, Hook, Level),
    ) -> Result<(), Error> {
        register(setup, webhooks, hook).await?;
        static PROBES: AtomicUsize = AtomicUsize::new(0);
        for _ in 0..600 {
            let n = PROBES.fetch_add(1, Ordering::Relaxed);
            let labels = self.create(child, &format!("probe-{n}"), n).await?;
            let seen = match (
                labels.contains_key("floor"),
                labels.get(&setup.labels.shard).map(String::as_str),
            ) {
                (true, _) => Hook::Floor,
                (_, Some(POLICY_SHARD)) => Hook::Policy,
                (_, Some(_)) => Hook::Sharder,
                _ => Hook::None,
            };
            if seen == hook {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::Setup(format!("{name} never took effect")))
    }

    /// One round of `n` creates at `rate`: p50, p90, p99 (ms), creates per second achieved and
    /// failed creates.
    pub(crate) async fn round(&self, level: Level, prefix: &str, n: usize, rate: f64) -> [f64; 5] {
        let (latencies, achieved, errors) = self.samples(level, prefix, n, rate).await;
        let p = |q| ms(percentile(&latencies, q));
        [p(50.0), p(90.0), p(99.0), achieved, errors as f64]
    }

    /// One round of `n` creates at `rate`: every successful create's latency (sorted), creates
    /// per second achieved and failed creates.
    pub(crate) async fn samples(
        &self,
        level: Level,
        prefix: &str,
        n: usize,
        rate: f64,
    ) -> (Vec<Duration>, f64, usize) {
        paced(n, rate, |i| {
            let (creator, name) = (self.clone(), format!("{prefix}-{i}"));
            async move { creator.create(level, &name, i).await.map(|_| ()) }
        })
        .await
    }
}

/// `n` requests at `rate` per second, each started on its tick whether or not the ones before
/// have been answered: every successful request's latency (sorted), requests per second
/// achieved and failed requests.
pub(crate) async fn paced<F, R>(n: usize, rate: f64, request: F) -> (Vec<Duration>, f64, usize)
where
    F: Fn(usize) -> R,
    R: std::future::Future<Output = Result<(), kube::Error>> + Send + 'static,
{
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        ticker.tick().await;
        let request = request(i);
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            request.await.map(|_| t.elapsed())
        }));
    }
    let mut latencies = Vec::with_capacity(n);
    for task in tasks {
        if let Ok(Ok(latency)) = task.await {
            latencies.push(latency);
        }
    }
    let achieved = n as f64 / started.elapsed().as_secs_f64();
    let errors = n - latencies.len();
    latencies.sort();
    (latencies, achieved, errors)
}

/// Runs a warm-up per mode, then `args.rounds` rounds of each mode, interleaved; the section's
/// text.
pub(crate) async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<String, Error> {
    let setup = RingSetup::new(cp, "bench-create", true, 3).await?;
    // Ten owners, each already on the shard the ring picks (settled: the common case).
    let ring = Ring::new((0..3).map(|i| format!("shard-{i}")));
    setup.create_assigned(0..10, &ring).await?;
    let owners: Vec<Secret> = setup.secrets().list(&ListParams::default()).await?.items;
    let owners: Arc<[Secret]> = owners
        .into_iter()
        .filter(|s| s.name_any().starts_with("object-"))
        .collect();
    // Ten parents, each a child of an owner on the owner's shard.
    let mut parents = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        let mut parent = child_of(owner, &format!("parent-{i}"));
        parent.metadata.labels = owner.metadata.labels.clone();
        parents.push(
            setup
                .configmaps()
                .create(&PostParams::default(), &parent)
                .await?,
        );
    }
    let creator = Creator {
        secrets: setup.secrets(),
        configmaps: setup.configmaps(),
        owners,
        parents: parents.into(),
    };
    for mode in MODES {
        creator.switch(&setup, webhooks, mode).await?;
        creator
            .round(mode.2, "warmup", args.creates.min(100), args.rate)
            .await;
    }
    let mut rounds = Vec::new();
    for r in 1..=args.rounds {
        for (i, mode) in MODES.into_iter().enumerate() {
            creator.switch(&setup, webhooks, mode).await?;
            let figures = creator
                .round(mode.2, &format!("r{r}-{i}"), args.creates, args.rate)
                .await;
            progress!("  round {r} {}: p50 {:.2} ms", mode.0, figures[0]);
            rounds.push((mode.0, figures));
        }
    }
    register(&setup, webhooks, Hook::None).await?;
    let guard = crate::guard::run(&setup, args).await?;
    Ok(markdown(&rounds, args) + &guard)
}

/// The section's text from the rounds in the order run (mode, then p50/p90/p99 ms, achieved/s,
/// errors).
fn markdown(rounds: &[(&str, [f64; 5])], args: &Args) -> String {
    let mut out = format!(
        "Secrets created through kube-apiserver at {}/s, {} per round, rounds interleaved: no webhook registered, the floor webhook (parses the review, answers a fixed one-label patch: the transport cost any webhook pays) and the sharder webhook, each its own process serving TLS on loopback, registered with the same MutatingWebhookConfiguration (only the URL differs). Then controlled objects (ConfigMaps with a controller Secret already on its shard) with no webhook and with the sharder webhook, which reads each new child's owner (one metadata GET) so the child lands on the shard holding the owner now, never ahead of it; and grandchildren (ConfigMaps controlled by such a ConfigMap: a level of a chain), for which the webhook reads the direct owner alike. Last, Secrets with no webhook but the placement policy of a ring keyed by namespace (a MutatingAdmissionPolicy bound to a table ConfigMap that gives the namespace its shard: assignment inside the apiserver). Added latency: against no webhook for the same level.\n\n",
        args.rate, args.creates
    );
    out += &table(
        "round | mode | p50 ms | p90 ms | p99 ms | achieved/s | errors",
        rounds
            .iter()
            .enumerate()
            .map(|(i, (m, [p50, p90, p99, rate, errors]))| {
                let r = i / MODES.len() + 1;
                format!("{r} | {m} | {p50:.2} | {p90:.2} | {p99:.2} | {rate:.0} | {errors}")
            }),
    );
    let median = |mode: &str, i: usize| median_at(rounds, mode, i);
    let base = |mode: &str| {
        MODES
            .iter()
            .find(|m| m.0 == mode)
            .map_or("", |m| match m.2 {
                Level::Main => MODES[0].0,
                Level::Child => MODES[3].0,
                Level::Grandchild => MODES[5].0,
            })
    };
    let added = |mode: &str, i: usize| median(mode, i) - median(base(mode), i);
    out += &table(
        "median over rounds | p50 ms | p90 ms | p99 ms | added p50 ms | added p90 ms",
        MODES.map(|(m, ..)| {
            let (p50, p90, p99, a50, a90) = (
                median(m, 0),
                median(m, 1),
                median(m, 2),
                added(m, 0),
                added(m, 1),
            );
            format!(
                "{m} | {p50:.2} | {p90:.2} | {p99:.2} | {} | {}",
                difference(a50),
                difference(a90)
            )
        }),
    );
    let owner_read = added(MODES[4].0, 0) - added(MODES[2].0, 0);
    out += &format!(
        "The owner read of a child costs {} ms at p50 (a child's added latency against a main object's).\n\n",
        difference(owner_read)
    );
    // A ratio of two small differences is meaningless when the floor adds ~nothing: the bound
    // is the floor's added latency with a 0.1 ms allowance, under what one mode's p50 moves
    // between rounds (the section's table of rounds shows how much).
    let bound = "<= 1.2x the floor's added + 0.1 ms (a mode's p50 moves more between rounds)";
    let goal = |what: &str, i: usize| {
        let (sharder, floor) = (added(MODES[2].0, i), added(MODES[1].0, i));
        let figure = format!(
            "{} ms (floor {} ms)",
            difference(sharder),
            difference(floor)
        );
        (
            what.to_owned(),
            figure,
            bound,
            sharder <= 1.2 * floor.max(0.0) + 0.1,
        )
    };
    let (grandchild, child) = (added(MODES[6].0, 0), added(MODES[4].0, 0));
    let behind_child = grandchild - child;
    let unit = if behind_child >= 0.0 { " ms" } else { "" };
    let grandchild = (
        "a grandchild's added CREATE latency against a child's, p50".to_owned(),
        format!(
            "{}{unit} (grandchild {} ms, child {} ms)",
            difference(behind_child),
            difference(grandchild),
            difference(child)
        ),
        "<= +1 ms",
        behind_child <= 1.0,
    );
    // Paired by round, as both ran in it: a slow spell of the machine between rounds weighs on
    // both (a mode's p50 moves by more than the difference from round to round).
    let p50s = |mode: &'static str| -> Vec<f64> {
        rounds
            .iter()
            .filter(|r| r.0 == mode)
            .map(|r| r.1[0])
            .collect()
    };
    let behind_webhook = crate::stats::median(
        p50s(MODES[7].0)
            .iter()
            .zip(p50s(MODES[2].0))
            .map(|(policy, webhook)| policy - webhook)
            .collect(),
    );
    let policy = (
        "CREATE latency the placement policy adds against the sharder webhook's, p50 (median of each round's own difference)".to_owned(),
        format!(
            "{:.2} ms {} (added: policy {} ms, webhook {} ms)",
            behind_webhook.abs(),
            if behind_webhook < 0.0 { "below" } else { "above" },
            difference(added(MODES[7].0, 0)),
            difference(added(MODES[2].0, 0))
        ),
        "below the webhook's",
        behind_webhook < 0.0,
    );
    out + &goals(&[
        goal("CREATE latency the sharder webhook adds, p50", 0),
        goal("the same at p90", 1),
        grandchild,
        policy,
    ])
}

/// A difference of two latencies as the report prints it: signed at or above zero; below zero
/// (the slower mode's rounds came out faster: noise) nothing measurable, never a negative figure.
pub(crate) fn difference(ms: f64) -> String {
    if ms >= 0.0 {
        format!("{ms:+.2}")
    } else {
        "none measurable".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_below_zero_is_nothing_measurable_not_a_negative_figure() {
        assert_eq!(difference(1.234), "+1.23");
        assert_eq!(difference(0.0), "+0.00");
        assert_eq!(difference(-1.57), "none measurable");
    }

    #[test]
    fn the_latency_added_is_held_against_the_floors_and_the_owner_read_against_a_main_objects() {
        // p50s of 2, 3 (floor), 3.1 (sharder), 2, 4 (children), 2, 5.5 (grandchildren), 2.3
        // (policy) ms; p90s 1 ms above.
        let rounds: Vec<(&str, [f64; 5])> = MODES
            .iter()
            .zip([2.0, 3.0, 3.1, 2.0, 4.0, 2.0, 5.5, 2.3])
            .map(|(m, p50)| (m.0, [p50, p50 + 1.0, 9.0, 150.0, 0.0]))
            .collect();
        let args = <Args as clap::Parser>::parse_from(["sharder-bench"]);
        let text = markdown(&rounds, &args);
        assert!(
            text.contains("| sharder webhook | 3.10 | 4.10 | 9.00 | +1.10 | +1.10 |"),
            "{text}"
        );
        assert!(
            text.contains("The owner read of a child costs +0.90 ms at p50"),
            "{text}"
        );
        assert!(text.contains("| +1.10 ms (floor +1.00 ms) | <= 1.2x the floor's added + 0.1 ms (a mode's p50 moves more between rounds) | met |"), "{text}");
        assert!(
            text.contains(
                "| +1.50 ms (grandchild +3.50 ms, child +2.00 ms) | <= +1 ms | **missed** |"
            ),
            "a grandchild 1.5 ms behind a child: {text}"
        );
        assert!(
            text.contains(
                "| 0.80 ms below (added: policy +0.30 ms, webhook +1.10 ms) | below the webhook's | met |"
            ),
            "{text}"
        );
        let slower: Vec<(&str, [f64; 5])> = rounds
            .iter()
            .map(|(m, f)| {
                (
                    *m,
                    if *m == "sharder policy" {
                        [3.5, 4.5, 9.0, 150.0, 0.0]
                    } else {
                        *f
                    },
                )
            })
            .collect();
        let text = markdown(&slower, &args);
        assert!(
            text.contains(
                "| 0.40 ms above (added: policy +1.50 ms, webhook +1.10 ms) | below the webhook's | **missed** |"
            ),
            "a policy slower than the webhook: {text}"
        );
    }

    #[test]
    fn the_policy_is_held_against_the_webhook_of_its_own_round() {
        // Webhook p50s 2, 3, 4 ms; the policy 0.1 ms below it in two rounds and 1.5 ms above in
        // the other: its median (3.9) is above the webhook's (3.0), its own rounds say below.
        let (webhook, policy) = ([2.0, 3.0, 4.0], [1.9, 4.5, 3.9]);
        let rounds: Vec<(&str, [f64; 5])> = (0..3)
            .flat_map(|r| {
                MODES.iter().map(move |m| {
                    let p50 = match m.0 {
                        "sharder webhook" => webhook[r],
                        "sharder policy" => policy[r],
                        _ => 1.0,
                    };
                    (m.0, [p50, p50 + 1.0, 9.0, 150.0, 0.0])
                })
            })
            .collect();
        let args = <Args as clap::Parser>::parse_from(["sharder-bench"]);
        let text = markdown(&rounds, &args);
        assert!(
            text.contains(
                "| 0.10 ms below (added: policy +2.90 ms, webhook +2.00 ms) | below the webhook's | met |"
            ),
            "{text}"
        );
    }
}
