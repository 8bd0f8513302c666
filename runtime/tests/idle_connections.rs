//! The bulk clients' connection cap against a real kube-apiserver: more requests in flight
//! than the cap open more connections for a while, and the extra ones are closed as they come
//! back, so a long run of writes does not collect connections.
//!
//! Its own test binary: it counts this process's sockets, which no other test may open
//! meanwhile.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use sharder_runtime::clients::{Transport, client_for};
use sharder_tests::ControlPlane;
use sharder_tests::procfs::open_sockets;

/// Sockets this process holds open.
fn sockets() -> usize {
    open_sockets(std::process::id()).expect("/proc/self/fd")
}

#[tokio::test]
async fn connections_beyond_the_idle_cap_are_closed_when_their_requests_are_done() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let config = cp.config().await.expect("config");
    let before = sockets();
    let client =
        client_for(config, Transport::WRITES.with_idle_connections(2)).expect("write client");

    // 16 at once, 20 times over; the connections open are counted as each answer arrives.
    let most = AtomicUsize::new(0);
    for _ in 0..20 {
        let answers: Vec<_> = futures::stream::iter(0..16)
            .map(|_| {
                let (client, most) = (client.clone(), &most);
                async move {
                    let request = http::Request::get("/version")
                        .body(kube::client::Body::empty())
                        .expect("request");
                    let answer = client.send(request).await.map(|r| r.status());
                    most.fetch_max(sockets().saturating_sub(before), Ordering::Relaxed);
                    answer
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for answer in answers {
            assert!(answer.expect("version").is_success());
        }
    }
    let most = most.into_inner();
    assert!(
        most > 2,
        "16 requests at once used {most} connections: the test shows nothing"
    );

    // Closed as they come back: at most the cap stays (polled, not slept on).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let open = sockets().saturating_sub(before);
        if open <= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{open} connections still open, cap 2 (at most {most} were open)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(client);
}
