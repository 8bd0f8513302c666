//! The memory baseline: what a controller that caches every object's metadata holds. A kube-rs
//! reflector over the metadata of the Secrets of one namespace; prints `synced <n>` once it
//! holds `--expect` objects, then keeps watching until killed.

use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let [namespace, expected] =
        sharder_bench::helper_args::<2>("metadata-cache NAMESPACE EXPECTED")?;
    let expected: usize = expected.parse()?;
    let client = Client::try_default().await?;
    let api: Api<PartialObjectMeta<Secret>> = Api::namespaced(client, &namespace);
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default().page_size(500))
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    sharder_bench::hold_until_killed(stream, move || reader.state().len(), expected).await
}
