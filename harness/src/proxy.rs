//! A TCP proxy standing in for a Kubernetes Service in front of webhook replicas: each
//! connection goes to the next backend that accepts it (TLS passes through untouched). Backends
//! can be replaced while it runs (a restarted replica binds a new port, as a new pod gets a new
//! IP behind the same Service).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

type Backends = Arc<RwLock<Vec<Option<SocketAddr>>>>;

/// A running proxy; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    backends: Backends,
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
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let candidates: Vec<SocketAddr> = shared
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .iter()
                    .flatten()
                    .copied()
                    .collect();
                let start = next.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    for i in 0..candidates.len() {
                        let backend = candidates[(start + i) % candidates.len()];
                        if let Ok(mut outbound) = TcpStream::connect(backend).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                            return;
                        }
                    }
                });
            }
        });
        Ok(Self {
            addr,
            backends,
            task,
        })
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
