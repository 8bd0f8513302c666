//! The multiplexed client against a real kube-apiserver: it speaks HTTP/2, carries many
//! requests at once on it, and reports the apiserver's answers as kube's client does.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use sharder_tests::ControlPlane;

#[tokio::test]
async fn the_multiplexed_client_speaks_http2_and_carries_many_requests_at_once() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = sharder_runtime::multiplexed::client_for(cp.config().await.expect("config"))
        .expect("client");

    let request = http::Request::get("/version")
        .body(kube::client::Body::empty())
        .expect("request");
    let response = client.send(request).await.expect("version");
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert!(response.status().is_success(), "{:?}", response.status());

    let ns = cp.namespace("multiplexed").await.expect("namespace");
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let created: Vec<String> = futures::stream::iter(0..64)
        .map(|i| {
            let api = api.clone();
            async move {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("cm-{i}")),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                };
                api.create(&PostParams::default(), &cm)
                    .await
                    .map(|c| c.metadata.name.unwrap_or_default())
            }
        })
        .buffer_unordered(64)
        .try_collect()
        .await
        .expect("64 creates at once");
    assert_eq!(created.len(), 64);

    match api.get("missing").await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 404),
        other => panic!("a missing object is a 404, got {other:?}"),
    }
    let again = api
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("cm-0".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await;
    assert!(
        matches!(again, Err(kube::Error::Api(ref s)) if s.code == 409),
        "{again:?}"
    );
}
