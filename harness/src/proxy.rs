//! A TCP proxy standing in for a Kubernetes Service in front of webhook replicas: each
//! connection goes to the next backend that accepts it (TLS passes through untouched). Backends
//! can be replaced while it runs (a restarted replica binds a new port, as a new pod gets a new
//! IP behind the same Service).
//!
//! It also stands for the network between a component and the apiserver: [`Proxy::blackhole`]
//! stops every byte in both directions (connections stay open, new ones are accepted and hang,
//! as behind a partition) until it is lifted; what was sent meanwhile is delivered then, as TCP
//! retransmission would once a partition heals; a client's end of stream held that way reaches
//! the backend only after the backend answered (or [`LINGER`] passed), so a request its client
//! gave up on is still processed, and [`Proxy::late_answers`] counts such exchanges.
//! [`Proxy::throttle`] slows what the backend sends (a congested link), so that a large answer
//! takes as long as a test needs.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

type Backends = Arc<RwLock<Vec<Option<SocketAddr>>>>;

/// How long a client's end of stream, held by a blackhole, waits for the backend's answer
/// before it is passed on.
pub const LINGER: Duration = Duration::from_secs(10);

/// One connection's exchange across a blackhole.
#[derive(Debug, Default)]
struct Exchange {
    /// Some of the client's bytes (or its connection) waited for a blackhole to lift.
    held: AtomicBool,
    /// The backend's side of the connection ended, or its answer could not be passed on.
    answered: Notify,
}

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    backends: Backends,
    connections: Arc<AtomicUsize>,
    late: Arc<AtomicUsize>,
    open: watch::Sender<bool>,
    rate: watch::Sender<Option<u64>>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a loopback port of its own choosing and forwards to `slots` backends,
    /// round-robin, skipping empty slots and backends that refuse the connection (a killed
    /// replica).
    pub async fn start(slots: usize) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let backends: Backends = Arc::new(RwLock::new(vec![None; slots]));
        let shared = Arc::clone(&backends);
        let next = Arc::new(AtomicUsize::new(0));
        let (open, passing) = watch::channel(true);
        let (rate, limit) = watch::channel(None);
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        let late = Arc::new(AtomicUsize::new(0));
        let late_counted = Arc::clone(&late);
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let candidates: Vec<SocketAddr> = shared
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .iter()
                    .flatten()
                    .copied()
                    .collect();
                let start = next.fetch_add(1, Ordering::Relaxed);
                let mut passing = passing.clone();
                let limit = limit.clone();
                let counted = Arc::clone(&counted);
                let late = Arc::clone(&late_counted);
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let exchange = Exchange::default();
                    exchange.held.store(!*passing.borrow(), Ordering::Relaxed);
                    if passing.wait_for(|open| *open).await.is_ok() {
                        for i in 0..candidates.len() {
                            let backend = candidates[(start + i) % candidates.len()];
                            if let Ok(outbound) = TcpStream::connect(backend).await {
                                let (in_read, in_write) = inbound.into_split();
                                let (out_read, out_write) = outbound.into_split();
                                let (to_backend, from_backend) = tokio::join!(
                                    pipe(in_read, out_write, passing.clone(), None, &exchange),
                                    pipe(out_read, in_write, passing, Some(limit), &exchange),
                                );
                                if exchange.held.load(Ordering::Relaxed)
                                    && to_backend > 0
                                    && from_backend > 0
                                {
                                    late.fetch_add(1, Ordering::Relaxed);
                                }
                                break;
                            }
                        }
                    }
                    counted.fetch_sub(1, Ordering::Relaxed);
                });
            }
        });
        Ok(Self {
            addr,
            backends,
            connections,
            late,
            open,
            rate,
            task,
        })
    }

    /// A proxy with one backend (the apiserver, for a component whose network is to fail).
    pub async fn to(backend: SocketAddr) -> std::io::Result<Self> {
        let proxy = Self::start(1).await?;
        proxy.set_backend(0, Some(backend));
        Ok(proxy)
    }

    /// Blackholes the proxy (`true`): no byte passes in either direction and new connections
    /// hang; `false` heals it and delivers what waited.
    pub fn blackhole(&self, on: bool) {
        self.open.send_replace(!on);
    }

    /// Lets the backend's bytes pass at most `bytes_per_second` on each connection (`None`: as
    /// fast as they come), from the next read on.
    pub fn throttle(&self, bytes_per_second: Option<u64>) {
        self.rate.send_replace(bytes_per_second.map(|r| r.max(1)));
    }

    /// Points slot `i` at `backend` (`None`: no backend in that slot).
    pub fn set_backend(&self, i: usize, backend: Option<SocketAddr>) {
        let mut backends = self
            .backends
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if i >= backends.len() {
            backends.resize(i + 1, None);
        }
        backends[i] = backend;
    }

    /// Connections accepted and not yet ended in both directions.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Connections ended so far on which the client's bytes waited for a blackhole to lift, then
    /// reached the backend, and the backend answered them: requests that arrived late.
    pub fn late_answers(&self) -> usize {
        self.late.load(Ordering::Relaxed)
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` while the proxy lets bytes pass (holding them, and the end of the
/// stream, while it is blackholed), at most at the rate `limit` names, if any. The client's side
/// (`limit` `None`) marks `exchange` held when it read bytes during a blackhole and, once held,
/// passes its end of stream on only after the backend's side ended or [`LINGER`]. Returns the
/// bytes it read once the exchange was held (all of them, for a connection accepted during a
/// blackhole).
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut passing: watch::Receiver<bool>,
    limit: Option<watch::Receiver<Option<u64>>>,
    exchange: &Exchange,
) -> usize {
    let client = limit.is_none();
    let mut after_hold = 0;
    let mut buffer = vec![0; 16 * 1024];
    loop {
        // A throttled link reads little at a time, so a lifted throttle takes effect at once.
        let rate = limit.as_ref().and_then(|l| *l.borrow());
        let size = rate.map_or(buffer.len(), |r| {
            (r / 10).clamp(1, buffer.len() as u64) as usize
        });
        let read = from.read(&mut buffer[..size]).await;
        if client && !*passing.borrow() && matches!(read, Ok(n) if n > 0) {
            exchange.held.store(true, Ordering::Relaxed);
        }
        if passing.wait_for(|open| *open).await.is_err() {
            break;
        }
        match read {
            Ok(n) if n > 0 => {
                if let Some(rate) = limit.as_ref().and_then(|l| *l.borrow()) {
                    tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
                }
                if exchange.held.load(Ordering::Relaxed) {
                    after_hold += n;
                }
                if to.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
            }
            _ => {
                if client && exchange.held.load(Ordering::Relaxed) {
                    let _ = tokio::time::timeout(LINGER, exchange.answered.notified()).await;
                }
                let _ = to.shutdown().await;
                break;
            }
        }
    }
    if !client {
        exchange.answered.notify_one();
    }
    after_hold
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// An echo server on loopback.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.into_split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> Vec<u8> {
        stream.write_all(message).await.expect("write");
        let mut answer = vec![0; message.len()];
        stream.read_exact(&mut answer).await.expect("read");
        answer
    }

    #[tokio::test]
    async fn a_throttled_proxy_passes_the_backends_bytes_no_faster_than_its_rate() {
        let proxy = Proxy::to(echo().await).await.expect("proxy");
        let mut stream = TcpStream::connect(proxy.addr()).await.expect("connect");
        assert_eq!(round_trip(&mut stream, b"warm").await, b"warm");
        let rate = 20_000;
        proxy.throttle(Some(rate));
        let message = vec![7u8; 10_000];
        let started = std::time::Instant::now();
        assert_eq!(round_trip(&mut stream, &message).await, message);
        // All but the first read's worth (a tenth of the rate) waited for the rate.
        let least = (message.len() as f64 - rate as f64 / 10.0) / rate as f64;
        assert!(
            started.elapsed().as_secs_f64() >= least,
            "{:?} for {} bytes at {rate}/s",
            started.elapsed(),
            message.len()
        );
        proxy.throttle(None);
        assert_eq!(round_trip(&mut stream, b"fast").await, b"fast");
    }

    #[tokio::test]
    async fn a_blackholed_proxy_holds_every_byte_until_it_heals() {
        let proxy = Proxy::to(echo().await).await.expect("proxy");
        let mut before = TcpStream::connect(proxy.addr()).await.expect("connect");
        assert_eq!(round_trip(&mut before, b"one").await, b"one");

        proxy.blackhole(true);
        before.write_all(b"two").await.expect("write");
        let mut during = TcpStream::connect(proxy.addr()).await.expect("accepted");
        during.write_all(b"three").await.expect("write");
        let (mut a, mut b) = ([0; 1], [0; 1]);
        let held = tokio::time::timeout(Duration::from_millis(300), async {
            tokio::select! {
                r = before.read(&mut a) => r,
                r = during.read(&mut b) => r,
            }
        })
        .await;
        assert!(held.is_err(), "a byte passed the blackhole: {held:?}");

        proxy.blackhole(false);
        let mut answer = [0; 3];
        before.read_exact(&mut answer).await.expect("held bytes");
        assert_eq!(&answer, b"two");
        let mut answer = [0; 5];
        during
            .read_exact(&mut answer)
            .await
            .expect("held connection");
        assert_eq!(&answer, b"three");
    }

    /// A backend that, as Go's HTTP server does, drops a request whose client's end of stream
    /// arrives before the answer (after 200 ms): the requests it answered.
    async fn abandoning() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let answered = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&answered);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let mut request = [0; 4];
                    if stream.read_exact(&mut request).await.is_err() {
                        return;
                    }
                    let mut more = [0; 1];
                    let abandoned =
                        tokio::time::timeout(Duration::from_millis(200), stream.read(&mut more))
                            .await;
                    if abandoned.is_err() && stream.write_all(&request).await.is_ok() {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        (addr, answered)
    }

    #[tokio::test]
    async fn a_request_its_client_gave_up_on_during_a_blackhole_is_answered_after_the_heal() {
        let (backend, answered) = abandoning().await;
        let proxy = Proxy::to(backend).await.expect("proxy");
        let mut before = TcpStream::connect(proxy.addr()).await.expect("connect");
        proxy.blackhole(true);
        before.write_all(b"late").await.expect("write");
        before.shutdown().await.expect("end of stream");
        // Let the proxy read the request and the end of stream while blackholed.
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(before);
        assert_eq!(proxy.late_answers(), 0);

        proxy.blackhole(false);
        let deadline = tokio::time::Instant::now() + LINGER;
        while proxy.late_answers() == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no late answer; the backend answered {}",
                answered.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(answered.load(Ordering::Relaxed), 1);
        assert_eq!(proxy.late_answers(), 1);
    }
}
