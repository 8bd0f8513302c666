//! The bulk clients' connections against a real kube-apiserver, counted as the established
//! connections this process holds to the apiserver that were not there before the client: an
//! HTTP/1.1 client opens more than its idle cap while more requests are in flight and closes
//! the extra ones as they come back; an HTTP/1.1 client with a connection cap (the writes')
//! never holds more, and its connections carry any number of requests; HTTP/2 writes end on
//! as many connections as the transport names, however many requests are in flight.
//!
//! The tests take turns (a lock): each counts the connections the other would open.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use sharder_runtime::clients::{Transport, client_for};
use sharder_tests::ControlPlane;
use sharder_tests::procfs::connections_to;
use tokio::sync::{Mutex, MutexGuard};

/// One test at a time.
static TURN: Mutex<()> = Mutex::const_new(());

/// The apiserver's connections of a client made after it was created.
struct Counter {
    port: u16,
    before: HashSet<String>,
}

impl Counter {
    fn new(cp: &ControlPlane) -> Self {
        let port = http::Uri::try_from(cp.url())
            .expect("apiserver url")
            .port_u16()
            .expect("apiserver port");
        // Connections opened before are not the client's (though they may close meanwhile).
        let before = connections_to(std::process::id(), port).expect("/proc/self");
        Self { port, before }
    }

    /// The client's connections (socket inodes).
    fn current(&self) -> HashSet<String> {
        connections_to(std::process::id(), self.port)
            .expect("/proc/self")
            .difference(&self.before)
            .cloned()
            .collect()
    }

    fn open(&self) -> usize {
        self.current().len()
    }

    /// Waits until `want(open)` holds (polled, not slept on; 10 s at most).
    async fn until(&self, what: &str, want: impl Fn(usize) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let open = self.open();
            if want(open) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{open} connections open, {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `rounds` times `at_once` GETs of /version at once; every answer must be a success in
/// `version`. Returns the most connections open as the answers arrived.
async fn bursts(
    client: &kube::Client,
    counter: &Counter,
    rounds: usize,
    at_once: usize,
    version: http::Version,
) -> usize {
    let most = AtomicUsize::new(0);
    for _ in 0..rounds {
        let answers: Vec<_> = futures::stream::iter(0..at_once)
            .map(|_| {
                let most = &most;
                async move {
                    let request = http::Request::get("/version")
                        .body(kube::client::Body::empty())
                        .expect("request");
                    let answer = client.send(request).await;
                    most.fetch_max(counter.open(), Ordering::Relaxed);
                    answer
                }
            })
            .buffer_unordered(at_once)
            .collect()
            .await;
        for answer in answers {
            let answer = answer.expect("version");
            assert!(answer.status().is_success(), "{:?}", answer.status());
            assert_eq!(answer.version(), version);
        }
    }
    most.into_inner()
}

/// Waits for this test's turn, then a client with `transport` and a counter of its
/// connections.
async fn client_in_turn(transport: Transport) -> (MutexGuard<'static, ()>, kube::Client, Counter) {
    let turn = TURN.lock().await;
    let cp = ControlPlane::shared().await.expect("control plane");
    let config = cp.config().await.expect("config");
    let counter = Counter::new(cp);
    let client = client_for(config, transport).expect("client");
    (turn, client, counter)
}

#[tokio::test]
async fn connections_beyond_the_idle_cap_are_closed_when_their_requests_are_done() {
    let (_turn, client, counter) = client_in_turn(Transport::LISTS.with_idle_connections(2)).await;

    let most = bursts(&client, &counter, 20, 16, http::Version::HTTP_11).await;
    assert!(
        most > 2,
        "16 requests at once used {most} connections: the test shows nothing"
    );
    counter
        .until(&format!("cap 2 (at most {most} were open)"), |open| {
            open <= 2
        })
        .await;
}

#[tokio::test]
async fn http2_writes_use_as_many_connections_as_the_transport_names() {
    let (_turn, client, counter) = client_in_turn(Transport::http2_writes(3)).await;

    let most = bursts(&client, &counter, 10, 64, http::Version::HTTP_2).await;
    assert!(
        most >= 3,
        "64 requests at once over 3 HTTP/2 pools used {most} connections"
    );
    // Connections opened while ALPN was not known yet are closed: 3 stay.
    counter
        .until(&format!("3 named (at most {most} were open)"), |open| {
            open == 3
        })
        .await;
}

#[tokio::test]
async fn capped_writes_never_hold_more_connections_than_their_cap() {
    let (_turn, client, counter) = client_in_turn(Transport::WRITES.with_connections(3)).await;

    let most = bursts(&client, &counter, 20, 16, http::Version::HTTP_11).await;
    assert!(
        (1..=3).contains(&most),
        "16 requests at once with a cap of 3 used {most} connections"
    );
    assert!(
        counter.open() <= 3,
        "{} open after the bursts",
        counter.open()
    );
}

#[tokio::test]
async fn a_capped_connection_carries_many_more_requests_than_one_channel_holds() {
    let (_turn, client, counter) = client_in_turn(Transport::WRITES.with_connections(1)).await;

    // One request at a time: every one on the same connection (the same socket), its hyper
    // state renewed every REQUESTS_PER_CHANNEL requests without a new TCP or TLS connection.
    bursts(&client, &counter, 1, 1, http::Version::HTTP_11).await;
    let first = counter.current();
    assert_eq!(first.len(), 1, "one request opened {first:?}");
    let requests = 5 * sharder_runtime::clients::REQUESTS_PER_CHANNEL + 3;
    let most = bursts(&client, &counter, requests, 1, http::Version::HTTP_11).await;
    assert_eq!(
        most, 1,
        "{requests} requests one after another used {most} connections"
    );
    assert_eq!(counter.current(), first, "the connection was replaced");
}
