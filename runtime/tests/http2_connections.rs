//! Writes over HTTP/2 against a real kube-apiserver: spread over the transport's connections,
//! as many as it names, however many requests are in flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use sharder_runtime::clients::{Transport, client_for};
use sharder_tests::ControlPlane;
use sharder_tests::procfs::connections_to;

#[tokio::test]
async fn http2_writes_use_as_many_connections_as_the_transport_names() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let port = http::Uri::try_from(cp.url())
        .expect("apiserver url")
        .port_u16()
        .expect("apiserver port");
    let config = cp.config().await.expect("config");
    // Connections opened before the client are not its own (though they may close meanwhile).
    let before = connections_to(std::process::id(), port).expect("/proc/self");
    let connections = || {
        connections_to(std::process::id(), port)
            .expect("/proc/self")
            .difference(&before)
            .count()
    };

    let client = client_for(config, Transport::http2_writes(3)).expect("write client");

    // 64 at once, 10 times over; the connections open are counted as each answer arrives.
    let most = AtomicUsize::new(0);
    for _ in 0..10 {
        let answers: Vec<_> = futures::stream::iter(0..64)
            .map(|_| {
                let (client, most) = (client.clone(), &most);
                async move {
                    let request = http::Request::get("/version")
                        .body(kube::client::Body::empty())
                        .expect("request");
                    let answer = client.send(request).await;
                    most.fetch_max(connections(), Ordering::Relaxed);
                    answer
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        for answer in answers {
            let answer = answer.expect("version");
            assert!(answer.status().is_success(), "{:?}", answer.status());
            assert_eq!(answer.version(), http::Version::HTTP_2);
        }
    }
    let most = most.into_inner();
    assert!(
        most >= 3,
        "64 requests at once over 3 HTTP/2 pools used {most} connections"
    );

    // Connections opened while ALPN was not known yet are closed: 3 stay (polled, not slept
    // on).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let open = connections();
        if open == 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{open} connections open, 3 named (at most {most} were open)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(client);
}
