//! Section 1, the label guard's part: what the ring's ValidatingAdmissionPolicy
//! (`sharder_common::label_guard`, on by default where the apiserver serves it) adds to requests
//! of the ring's objects. It matches UPDATEs only: its match condition is evaluated on every
//! UPDATE, its validation on those that change the ring's labels; CREATEs are not looked at.
//! Rounds interleave the guard off and on, no webhook registered, each timing CREATEs, UPDATEs of
//! an object's data and UPDATEs moving its shard label (admitted: the bench is the policy's
//! reconciler, as the reconciler is for its own moves).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use sharder_common::label_guard::{GuardSettings, label_guard};
use sharder_common::{ClusterRing, RingObject};
use sharder_harness::control_plane::ADMIN_USER;
use sharder_harness::fixtures::secret;

use crate::create_latency::{difference, paced};
use crate::progress::progress;
use crate::report::{Goal, goals, table};
use crate::stats::{Spread, median_at, ms, percentile};
use crate::{Args, Error, RingSetup, apply_policy, delete_if_there};

/// The requests timed, in the order run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Request {
    /// A new Secret.
    Create,
    /// A merge patch of a Secret's data (the policy's match condition says no).
    Data,
    /// A merge patch moving a Secret's shard label to the other of two shards (the policy
    /// validates it and admits it: the bench is its reconciler).
    Label,
}

/// The requests' names in the report.
const REQUESTS: [(&str, Request); 3] = [
    ("CREATE", Request::Create),
    ("UPDATE of the data", Request::Data),
    ("UPDATE of the shard label", Request::Label),
];

/// The guard's states, in the order run within a round.
const STATES: [(&str, bool); 2] = [("off", false), ("on", true)];

/// Who probes whether the guard is in force: a user other than the policy's reconciler (in
/// `system:masters`, so RBAC lets it), whose relabel the guard denies.
const OUTSIDER: &str = "sharder-bench-outsider";

/// What the guard's denials say.
const DENIED: &str = "are the sharder's";

/// The Secrets the UPDATE rounds change.
const TARGET: &str = "guarded";

/// One round's figures of one request with the guard in one state: p50, p90, p99 (ms),
/// requests per second achieved, failed requests.
type Row = ((Request, bool), [f64; 5]);

/// The guard's policy and binding for the ring of `setup` (the bench as its reconciler), applied
/// (`on`) or deleted, then probed until the apiserver acts on it.
async fn switch(setup: &RingSetup, outsider: &Api<Secret>, on: bool) -> Result<(), Error> {
    let client = &setup.client;
    let policies = Api::<ValidatingAdmissionPolicy>::all(client.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
    let name = setup.id().configuration_name();
    if on {
        let ring = RingObject::cluster_ring(
            Api::<ClusterRing>::all(client.clone())
                .get(&setup.ns)
                .await?,
        );
        let roles = ring.roles().map_err(|e| Error::Setup(e.to_string()))?;
        let settings = GuardSettings {
            reconciler: ADMIN_USER.to_owned(),
            acknowledgers: Vec::new(),
            namespace_selector: Default::default(),
        };
        let (policy, binding) = label_guard(&ring, &roles, &settings);
        apply_policy((&policies, &policy), (&bindings, &binding), &name).await?;
    } else {
        delete_if_there(&bindings, &name).await?;
        delete_if_there(&policies, &name).await?;
    }
    static PROBES: AtomicUsize = AtomicUsize::new(0);
    for _ in 0..600 {
        let shard = format!("shard-{}", PROBES.fetch_add(1, Ordering::Relaxed) % 2);
        let patch = json!({ "metadata": { "labels": { &setup.labels.shard: shard } } });
        let denied = match outsider
            .patch("probe", &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => false,
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(DENIED) => true,
            Err(e) => return Err(e.into()),
        };
        if denied == on {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::Setup(format!(
        "the label guard never turned {}",
        if on { "on" } else { "off" }
    )))
}

/// The Secrets of `setup` as user [`OUTSIDER`].
async fn outsider(setup: &RingSetup) -> Result<Api<Secret>, Error> {
    let mut config = setup.cp.config().await?;
    config.auth_info.impersonate = Some(OUTSIDER.to_owned());
    config.auth_info.impersonate_groups = Some(vec!["system:masters".to_owned()]);
    let client = Client::try_from(config)?;
    Ok(Api::namespaced(client, &setup.ns))
}

/// `n` requests of `request` at `rate` (the `pass`-th of its kind: UPDATEs of the shard label
/// move every target to `shard-<pass % 2>`); its figures.
async fn round(setup: &RingSetup, request: Request, pass: usize, n: usize, rate: f64) -> [f64; 5] {
    let secrets = setup.secrets();
    let label = setup.labels.shard.clone();
    let (latencies, achieved, errors) = paced(n, rate, |i| {
        let (secrets, label) = (secrets.clone(), label.clone());
        let name = format!("{TARGET}-{i}");
        async move {
            let patch = match request {
                Request::Create => {
                    let created = secret(&format!("{TARGET}-p{pass}-{i}"));
                    return secrets
                        .create(&PostParams::default(), &created)
                        .await
                        .map(|_| ());
                }
                Request::Data => json!({ "stringData": { "value": format!("pass-{pass}") } }),
                Request::Label => {
                    json!({ "metadata": { "labels": { label: format!("shard-{}", pass % 2) } } })
                }
            };
            secrets
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
    })
    .await;
    let p = |q| ms(percentile(&latencies, q));
    [p(50.0), p(90.0), p(99.0), achieved, errors as f64]
}

/// Creates the UPDATE rounds' targets and the probe (each on `shard-0`), then runs a warm-up
/// pass per state and request and `args.rounds` rounds, the states interleaved; the guard is
/// off after. The section's text.
pub(crate) async fn run(setup: &RingSetup, args: &Args) -> Result<String, Error> {
    let secrets = setup.secrets();
    let post = PostParams::default();
    for name in (0..args.creates)
        .map(|i| format!("{TARGET}-{i}"))
        .chain(["probe".to_owned()])
    {
        let mut object = secret(&name);
        object
            .metadata
            .labels
            .get_or_insert_default()
            .insert(setup.labels.shard.clone(), "shard-0".into());
        secrets.create(&post, &object).await?;
    }
    let outsider = outsider(setup).await?;
    let mut passes = [0usize; REQUESTS.len()];
    let mut rows: Vec<Row> = Vec::new();
    for r in 0..=args.rounds {
        for (state, on) in STATES {
            switch(setup, &outsider, on).await?;
            for (k, (name, request)) in REQUESTS.into_iter().enumerate() {
                passes[k] += 1;
                let n = if r == 0 {
                    args.creates.min(100)
                } else {
                    args.creates
                };
                let figures = round(setup, request, passes[k], n, args.rate).await;
                if r > 0 {
                    progress!(
                        "  round {r} {name}, guard {state}: p50 {:.2} ms",
                        figures[0]
                    );
                    rows.push(((request, on), figures));
                }
            }
        }
    }
    switch(setup, &outsider, false).await?;
    Ok(markdown(&rows, args))
}

/// The part's text from the rounds in the order run.
fn markdown(rows: &[Row], args: &Args) -> String {
    let name = |request: Request| REQUESTS.iter().find(|r| r.1 == request).map_or("", |r| r.0);
    let state = |on: bool| if on { "on" } else { "off" };
    let mut out = format!(
        "### The label guard\n\nThe ring's label guard (its ValidatingAdmissionPolicy and binding, as the reconciler keeps them; on by default where the apiserver serves the API) off and on, rounds interleaved, no webhook registered: {} requests per round at {}/s of each kind, CREATEs of Secrets (the policy matches UPDATEs only), merge patches of a Secret's data (its match condition is evaluated and says no) and merge patches moving a Secret's shard label between two shards (validated and admitted: the bench is the policy's reconciler, as the reconciler is for its moves).\n\n",
        args.creates, args.rate
    );
    let per_request = STATES.len() * REQUESTS.len();
    out += &table(
        "round | request | guard | p50 ms | p90 ms | p99 ms | achieved/s | errors",
        rows.iter()
            .enumerate()
            .map(|(i, ((request, on), [p50, p90, p99, rate, errors]))| {
                format!(
                    "{} | {} | {} | {p50:.2} | {p90:.2} | {p99:.2} | {rate:.0} | {errors}",
                    i / per_request + 1,
                    name(*request),
                    state(*on)
                )
            }),
    );
    let median = |key: (Request, bool), i: usize| median_at(rows, key, i);
    out += &table(
        "median over rounds | p50 off ms | p50 on ms | added p50 ms | p99 off ms | p99 on ms",
        REQUESTS.map(|(n, request)| {
            let (off, on) = ((request, false), (request, true));
            format!(
                "{n} | {:.2} | {:.2} | {} | {:.2} | {:.2}",
                median(off, 0),
                median(on, 0),
                difference(median(on, 0) - median(off, 0)),
                median(off, 2),
                median(on, 2)
            )
        }),
    );
    out + &goals(&REQUESTS.map(|(n, request)| goal(rows, n, request)))
}

/// The goal of one request: the p50 the guard adds (the medians' difference) at most 0.1 ms,
/// or within what the p50 of the guard-off rounds moves from round to round (then the rounds
/// cannot tell the guard from nothing).
fn goal(rows: &[Row], name: &str, request: Request) -> Goal {
    let p50s = |on: bool| Spread::of(rows.iter().filter(|r| r.0 == (request, on)).map(|r| r.1[0]));
    let (added, spread) = match (p50s(true), p50s(false)) {
        (Some(on), Some(off)) => (on.median - off.median, off.high - off.low),
        _ => (f64::NAN, 0.0),
    };
    (
        format!("p50 the label guard adds: {name}"),
        format!(
            "{}{} (the off rounds' p50 move by {spread:.2} ms)",
            difference(added),
            if added >= 0.0 { " ms" } else { "" }
        ),
        "<= 0.1 ms, or within what the off rounds' p50 moves",
        added <= 0.1_f64.max(spread),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of p50s for `request`: `off` with the guard off, `on` with it on, in rounds.
    fn rows(request: Request, off: &[f64], on: &[f64]) -> Vec<Row> {
        off.iter()
            .zip(on)
            .flat_map(|(&a, &b)| {
                [
                    ((request, false), [a, a, a, 150.0, 0.0]),
                    ((request, true), [b, b, b, 150.0, 0.0]),
                ]
            })
            .collect()
    }

    #[test]
    fn the_guard_is_within_bounds_when_it_adds_at_most_a_tenth_of_a_millisecond() {
        let met = goal(
            &rows(Request::Label, &[2.0, 2.02], &[2.1, 2.1]),
            "x",
            Request::Label,
        );
        assert!(met.3, "{met:?}");
        assert!(met.1.starts_with("+0.09 ms"), "{met:?}");
    }

    #[test]
    fn more_than_the_rounds_move_is_a_missed_goal_and_less_a_tie_within_the_noise() {
        let missed = goal(
            &rows(Request::Data, &[2.0, 2.1], &[2.5, 2.5]),
            "x",
            Request::Data,
        );
        assert!(!missed.3, "{missed:?}");
        let tie = goal(
            &rows(Request::Data, &[2.0, 2.5], &[2.6, 2.6]),
            "x",
            Request::Data,
        );
        assert!(tie.3, "within the off rounds' 0.5 ms: {tie:?}");
    }
}
