//! CREATE latency through kube-apiserver at a fixed rate, in interleaved rounds of: no webhook
//! registered, the floor webhook registered, the sharder webhook registered (the same
//! MutatingWebhookConfiguration, only the URL differs).

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use sharder_common::ClusterRing;
use sharder_reconciler::webhook_config::{
    WebhookSettings, WebhookTarget, configuration_name, webhook_configuration,
};
use sharder_tests::ControlPlane;

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
}

impl Mode {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "no webhook",
            Self::Floor => "floor webhook",
            Self::Sharder => "sharder webhook",
        }
    }
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
    let name = configuration_name(&setup.ns);
    let url = match mode {
        Mode::None => {
            let _ = api.delete(&name, &DeleteParams::default()).await;
            return Ok(());
        }
        Mode::Floor => format!("https://{}", webhooks.floor),
        Mode::Sharder => format!("https://{}", webhooks.sharder.addr),
    };
    let ring = Api::<ClusterRing>::all(setup.client.clone())
        .get(&setup.ns)
        .await?;
    let roles = ring.spec.roles().map_err(|e| Error::Setup(e.to_string()))?;
    let mut mwc = webhook_configuration(
        &ring,
        &roles,
        &WebhookSettings {
            target: WebhookTarget::Url(url),
            ca_bundle: webhooks.ca_pem.as_bytes().to_vec(),
            timeout_seconds: 10,
            excluded_namespaces: Vec::new(),
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

/// Waits until creates see `mode` (probe Secrets labelled by the floor, by the sharder, or not
/// at all).
async fn wait_effective(setup: &RingSetup, mode: Mode) -> Result<(), Error> {
    static PROBES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let api = setup.secrets();
    for _ in 0..600 {
        let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe = Secret {
            metadata: ObjectMeta {
                name: Some(format!("probe-{n}")),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        };
        let created = api.create(&PostParams::default(), &probe).await?;
        let labels = created.labels();
        let seen = if labels.contains_key("floor") {
            Mode::Floor
        } else if labels.contains_key(&setup.labels.shard) {
            Mode::Sharder
        } else {
            Mode::None
        };
        if seen == mode {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::Setup(format!("{} never took effect", mode.name())))
}

async fn round(
    setup: &RingSetup,
    mode: Mode,
    round: usize,
    n: usize,
    rate: f64,
    prefix: &str,
) -> Round {
    let api = setup.secrets();
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        ticker.tick().await;
        let api = api.clone();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(format!("{prefix}-{round}-{i}")),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        };
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let result = api.create(&PostParams::default(), &secret).await;
            (t.elapsed(), result.is_ok())
        }));
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
    cp: &ControlPlane,
    webhooks: &Webhooks,
    args: &Args,
) -> Result<CreateLatency, Error> {
    let setup = RingSetup::new(cp, "bench-create", false, 3).await?;
    let modes = [Mode::None, Mode::Floor, Mode::Sharder];
    let mut rounds = Vec::new();
    for mode in modes {
        register(&setup, webhooks, mode).await?;
        wait_effective(&setup, mode).await?;
        round(&setup, mode, 0, args.creates.min(100), args.rate, "warmup").await;
    }
    for r in 1..=args.rounds {
        for mode in modes {
            register(&setup, webhooks, mode).await?;
            wait_effective(&setup, mode).await?;
            let result = round(
                &setup,
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
