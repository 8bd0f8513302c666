//! The webhook's pure path, review bytes to response bytes, beside the floor (parse the review,
//! answer a fixed patch) in the same run. `cargo bench -p sharder-bench --bench review`.
// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use sharder_bench::floor::floor_review;
use sharder_common::OwnerState;
use sharder_webhook::admission::{RingSnapshot, review};

fn body(controlled: bool) -> Vec<u8> {
    let (resource, kind, owners) = if controlled {
        (
            "configmaps",
            "ConfigMap",
            json!([{"apiVersion": "v1", "kind": "Secret", "name": "owner", "uid": "u", "controller": true}]),
        )
    } else {
        ("secrets", "Secret", json!(null))
    };
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "name": "object-1234",
            "namespace": "project-a",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:project-a:deployer", "groups": ["system:authenticated"]},
            "object": {
                "apiVersion": "v1", "kind": kind,
                "metadata": {"name": "object-1234", "namespace": "project-a",
                    "labels": {"app": "web", "tier": "frontend"}, "ownerReferences": owners},
                "data": {"config.yaml": "a: 1\nb: 2\n", "key": "dmFsdWU="}
            },
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    }))
    .expect("json")
}

fn bench(c: &mut Criterion) {
    let spec = sharder_harness::fixtures::secrets_ring("example", None).spec;
    let id = sharder_common::RingId::cluster_ring("example");
    let ring = RingSnapshot::new(&id, &spec, (0..10).map(|i| format!("shard-{i}")));
    let main = body(false);
    let controlled = body(true);
    let mut group = c.benchmark_group("review");
    group.bench_function("floor", |b| b.iter(|| floor_review(black_box(&main))));
    group.bench_function("sharder_main_object", |b| {
        b.iter(|| {
            review(black_box(&main), Some(&ring), &OwnerState::NotSharded)
                .map(|(_, _, bytes)| bytes)
        })
    });
    group.bench_function("sharder_controlled_object", |b| {
        b.iter(|| {
            review(black_box(&controlled), Some(&ring), &OwnerState::NotSharded)
                .map(|(_, _, bytes)| bytes)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
