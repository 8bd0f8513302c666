//! A shard's cache of its share, for the memory of range mode beside label mode: a kube-rs
//! reflector over the whole Secrets of one namespace that a label selector or a `shardSelector`
//! selects, as a shard's controller caches them; prints `synced <n>` once it holds `EXPECTED`
//! objects, then keeps watching until killed.

use k8s_openapi::api::core::v1::Secret;
use kube::api::ApiResource;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use sharder_common::ranges::ShardSelector;
use sharder_runtime::sharded::selecting_client;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let [namespace, expected, labels, selector] = sharder_bench::helper_args::<4>(
        "share-cache NAMESPACE EXPECTED LABEL_SELECTOR|- SHARD_SELECTOR|-",
    )?;
    let expected: usize = expected.parse()?;
    let mut client = Client::try_default().await?;
    if selector != "-" {
        let selector: ShardSelector = selector.parse()?;
        client = selecting_client(&client, &selector, &[ApiResource::erase::<Secret>(&())]);
    }
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let mut config = watcher::Config::default().page_size(500);
    if labels != "-" {
        config = config.labels(&labels);
    }
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    sharder_bench::hold_until_killed(stream, move || reader.state().len(), expected).await
}
