//! CREATE latency through kube-apiserver at a fixed rate, in interleaved rounds of: no webhook
//! registered, the floor webhook registered, the sharder webhook registered (the same
//! MutatingWebhookConfiguration, only the URL differs); and for controlled objects (ConfigMaps
//! with a controller Secret), no webhook and the sharder webhook, which reads each new child's
//! owner so the child lands where the owner is held now.

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use sharder_common::webhook_configuration::{
    WebhookSettings, WebhookTarget, webhook_configuration,
};
use sharder_common::{ClusterRing, Ring};
use sharder_harness::ControlPlane;
use sharder_harness::fixtures::{child_of, secret};

use crate::stats::{median, ms, percentile};
use crate::webhooks::Webhooks;
use crate::{Args, Error, RingSetup};

/// What is registered during a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No webhook configuration.
    None,
    /// The floor webhook.
    Floor,
    /// The sharder webhook.
    Sharder,
    /// No webhook configuration, controlled objects created.
    NoneChild,
    /// The sharder webhook, controlled objects created (it reads each one's owner).
    SharderChild,
}

impl Mode {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "no webhook",
            Self::Floor => "floor webhook",
            Self::Sharder => "sharder webhook",
            Self::NoneChild => "no webhook, children",
            Self::SharderChild => "sharder webhook, children",
        }
    }

    /// Whether the mode creates controlled objects.
    pub fn children(self) -> bool {
        matches!(self, Self::NoneChild | Self::SharderChild)
    }

    /// Every mode, in the order rounds run.
    pub const ALL: [Mode; 5] = [
        Self::None,
        Self::Floor,
        Self::Sharder,
        Self::NoneChild,
        Self::SharderChild,
    ];
}

/// One round's latencies.
#[derive(Clone, Debug)]
pub struct Round {
    /// Which mode.
    pub mode: Mode,
    /// Round number (1-based).
    pub round: usize,
    /// Percentiles.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Failed creates.
    pub errors: usize,
    /// Creates per second achieved.
    pub achieved_rate: f64,
}

/// The benchmark's result.
#[derive(Clone, Debug)]
pub struct CreateLatency {
    /// Every measured round, in order.
    pub rounds: Vec<Round>,
    /// Creates per round.
    pub creates: usize,
    /// Target rate.
    pub rate: f64,
}

impl CreateLatency {
    /// The median over rounds of a mode's percentile `f`, in ms.
    pub fn median_ms(&self, mode: Mode, f: fn(&Round) -> Duration) -> f64 {
        median(
            self.rounds
                .iter()
                .filter(|r| r.mode == mode)
                .map(|r| ms(f(r)))
                .collect(),
        )
    }
}

async fn register(setup: &RingSetup, webhooks: &Webhooks, mode: Mode) -> Result<(), Error> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(setup.client.clone());
    let name = sharder_common::RingId::cluster_ring(&setup.ns).configuration_name();
    let url = match mode {
        Mode::None | Mode::NoneChild => {
            let _ = api.delete(&name, &DeleteParams::default()).await;
            return Ok(());
        }
        Mode::Floor => format!("https://{}", webhooks.floor),
        Mode::Sharder | Mode::SharderChild => format!("https://{}", webhooks.sharder.addr),
    };
    let ring = sharder_common::RingObject::cluster_ring(
        Api::<ClusterRing>::all(setup.client.clone())
            .get(&setup.ns)
            .await?,
    );
    let roles = ring.roles().map_err(|e| Error::Setup(e.to_string()))?;
    let mut mwc = webhook_configuration(
        &ring,
        &roles,
        &WebhookSettings {
            target: WebhookTarget::Url(url),
            ca_bundle: webhooks.ca_pem.as_bytes().to_vec(),
            timeout_seconds: 10,
            namespace_selector: Default::default(),
        },
    );
    mwc.metadata.managed_fields = None;
    api.patch(
        &name,
        &PatchParams::apply("sharder-bench").force(),
        &Patch::Apply(&mwc),
    )
    .await?;
    Ok(())
}

/// The owners of the controlled objects the child rounds create.
struct Owners(Vec<Secret>);

impl Owners {
    fn controlled(&self, name: String, i: usize) -> ConfigMap {
        child_of(&self.0[i % self.0.len()], &name)
    }
}

/// Waits until creates see `mode` (probes labelled by the floor, by the sharder, or not at
/// all).
async fn wait_effective(setup: &RingSetup, owners: &Owners, mode: Mode) -> Result<(), Error> {
    static PROBES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    for _ in 0..600 {
        let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let labels = if mode.children() {
            setup
                .configmaps()
                .create(
                    &PostParams::default(),
                    &owners.controlled(format!("probe-{n}"), n),
                )
                .await?
                .metadata
                .labels
        } else {
            setup
                .secrets()
                .create(&PostParams::default(), &secret(&format!("probe-{n}")))
                .await?
                .metadata
                .labels
        }
        .unwrap_or_default();
        let seen = if labels.contains_key("floor") {
            Mode::Floor
        } else if labels.contains_key(&setup.labels.shard) {
            Mode::Sharder
        } else {
            Mode::None
        };
        let want = match mode {
            Mode::NoneChild => Mode::None,
            Mode::SharderChild => Mode::Sharder,
            other => other,
        };
        if seen == want {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::Setup(format!("{} never took effect", mode.name())))
}

async fn round(
    setup: &RingSetup,
    owners: &Owners,
    mode: Mode,
    round: usize,
    n: usize,
    rate: f64,
    prefix: &str,
) -> Round {
    let (secrets, configmaps) = (setup.secrets(), setup.configmaps());
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        ticker.tick().await;
        let name = format!("{prefix}-{round}-{i}");
        let create = if mode.children() {
            let (api, child) = (configmaps.clone(), owners.controlled(name, i));
            tokio::spawn(async move {
                let t = Instant::now();
                let result = api.create(&PostParams::default(), &child).await;
                (t.elapsed(), result.is_ok())
            })
        } else {
            let (api, object) = (secrets.clone(), secret(&name));
            tokio::spawn(async move {
                let t = Instant::now();
                let result = api.create(&PostParams::default(), &object).await;
                (t.elapsed(), result.is_ok())
            })
        };
        tasks.push(create);
    }
    let mut latencies = Vec::with_capacity(n);
    let mut errors = 0;
    for task in tasks {
        match task.await {
            Ok((latency, true)) => latencies.push(latency),
            _ => errors += 1,
        }
    }
    let achieved_rate = n as f64 / started.elapsed().as_secs_f64();
    latencies.sort();
    Round {
        mode,
        round,
        p50: percentile(&latencies, 50.0),
        p90: percentile(&latencies, 90.0),
        p99: percentile(&latencies, 99.0),
        errors,
        achieved_rate,
    }
}

/// Runs the rounds: a warm-up per mode, then `args.rounds` rounds of each mode, interleaved.
pub async fn run(
    cp: &'static ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<CreateLatency, Error> {
    let setup = RingSetup::new(cp, "bench-create", true, 3).await?;
    // Ten owners, each already on the shard the ring picks (settled: the common case).
    let ring = Ring::new((0..3).map(|i| format!("shard-{i}")));
    setup.create_assigned(0..10, &ring).await?;
    let owners = Owners(
        setup
            .secrets()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|s| s.name_any().starts_with("object-"))
            .collect(),
    );
    let mut rounds = Vec::new();
    for mode in Mode::ALL {
        register(&setup, webhooks, mode).await?;
        wait_effective(&setup, &owners, mode).await?;
        round(
            &setup,
            &owners,
            mode,
            0,
            args.creates.min(100),
            args.rate,
            "warmup",
        )
        .await;
    }
    for r in 1..=args.rounds {
        for mode in Mode::ALL {
            register(&setup, webhooks, mode).await?;
            wait_effective(&setup, &owners, mode).await?;
            let result = round(
                &setup,
                &owners,
                mode,
                r,
                args.creates,
                args.rate,
                &format!("{mode:?}").to_lowercase(),
            )
            .await;
            eprintln!(
                "[bench]   round {r} {}: p50 {:.2} ms p90 {:.2} ms p99 {:.2} ms, {} errors",
                mode.name(),
                ms(result.p50),
                ms(result.p90),
                ms(result.p99),
                result.errors
            );
            rounds.push(result);
        }
    }
    register(&setup, webhooks, Mode::None).await?;
    Ok(CreateLatency {
        rounds,
        creates: args.creates,
        rate: args.rate,
    })
}
