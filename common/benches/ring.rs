//! Ring lookup cost for 10 and 100 shards: `cargo bench -p sharder-common --bench ring`.
// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sharder_common::{ObjectKey, Ring};

fn lookups(c: &mut Criterion) {
    let keys: Vec<String> = (0..1024)
        .map(|i| {
            ObjectKey::main("", "Secret", Some("default"), &format!("object-{i}"))
                .map(|k| k.to_string())
                .unwrap_or_default()
        })
        .collect();
    for shards in [10, 100] {
        let ring = Ring::new((0..shards).map(|i| format!("shard-{i}")));
        let mut i = 0;
        c.bench_function(&format!("ring lookup/{shards} shards"), |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(ring.shard_for(black_box(&keys[i])))
            })
        });
    }
}

criterion_group!(benches, lookups);
criterion_main!(benches);
