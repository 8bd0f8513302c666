//! The rebalancer's bulk clients against a real kube-apiserver: each speaks HTTP/1.1, carries many
//! requests at once, reads answers far larger than its read buffer, and reports the apiserver's
//! answers as kube's client does.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use sharder_harness::ControlPlane;
use sharder_reconciler::clients::{Reads, Transport, client_for};

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

#[tokio::test]
async fn each_transport_speaks_http1_and_carries_many_requests_at_once() {
    let cp = ControlPlane::shared().await.expect("control plane");
    for (transport, version) in [
        (Transport::WRITES, http::Version::HTTP_11),
        (Transport::LISTS, http::Version::HTTP_11),
    ] {
        let client = client_for(cp.config().await.expect("config"), transport).expect("client");
        let request = http::Request::get("/version")
            .body(kube::client::Body::empty())
            .expect("request");
        let response = client.send(request).await.expect("version");
        assert_eq!(response.version(), version, "{transport:?}");
        assert!(response.status().is_success(), "{:?}", response.status());

        let ns = cp.namespace("clients").await.expect("namespace");
        let api: Api<ConfigMap> = Api::namespaced(client, &ns);
        let created: Vec<String> = futures::stream::iter(0..64)
            .map(|i| {
                let api = api.clone();
                async move {
                    api.create(&PostParams::default(), &config_map(&format!("cm-{i}")))
                        .await
                        .map(|c| c.metadata.name.unwrap_or_default())
                }
            })
            .buffer_unordered(64)
            .try_collect()
            .await
            .expect("64 creates at once");
        assert_eq!(created.len(), 64, "{transport:?}");

        match api.get("missing").await {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 404),
            other => panic!("a missing object is a 404, got {other:?}"),
        }
        let again = api
            .create(&PostParams::default(), &config_map("cm-0"))
            .await;
        assert!(
            matches!(again, Err(kube::Error::Api(ref s)) if s.code == 409),
            "{again:?}"
        );
    }
}

#[tokio::test]
async fn answers_far_larger_than_the_read_buffer_arrive_whole() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.namespace("clients-large").await.expect("namespace");
    for (i, transport) in [Transport::WRITES, Transport::LISTS]
        .into_iter()
        .enumerate()
    {
        let (Reads::Exact(buffer) | Reads::Growing(buffer)) = transport.reads;
        assert!(buffer < 100 * 1024, "{transport:?}");
        let client = client_for(cp.config().await.expect("config"), transport).expect("client");
        let api: Api<ConfigMap> = Api::namespaced(client, &ns);
        let value: String = (0..100 * 1024)
            .map(|j| char::from(b'a' + (j % 26) as u8))
            .collect();
        let mut large = config_map(&format!("large-{i}"));
        large.metadata.annotations = Some([("bulk/note".to_owned(), value.clone())].into());
        large.data = Some([("blob".to_owned(), value.clone())].into());
        let created = api
            .create(&PostParams::default(), &large)
            .await
            .expect("create");
        let read = get_served(&api, &format!("large-{i}")).await;
        for object in [&created, &read] {
            assert_eq!(
                object.data.as_ref().and_then(|d| d.get("blob")),
                Some(&value),
                "{transport:?}"
            );
            assert_eq!(
                object
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("bulk/note")),
                Some(&value),
                "{transport:?}"
            );
        }
    }
}

/// `api.get(name)`, again (up to 3 times) while the apiserver answers with a server error (its
/// etcd read broke off: "unexpected EOF"): such an answer arrived whole, so it says nothing of
/// how the client reads; any other error fails at once.
async fn get_served(api: &Api<ConfigMap>, name: &str) -> ConfigMap {
    let mut tries = 1;
    loop {
        match api.get(name).await {
            Err(kube::Error::Api(status)) if status.code >= 500 && tries < 3 => {
                eprintln!("get {name}: the apiserver answered {status:?}; again");
                tries += 1;
            }
            read => return read.expect("get"),
        }
    }
}
