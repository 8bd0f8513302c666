//! A TCP proxy standing in for a Kubernetes Service in front of webhook replicas: each
//! connection goes to the next backend that accepts it (TLS passes through untouched).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running proxy; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `backends` round-robin, skipping backends
    /// that refuse the connection (a killed replica).
    pub async fn start(backends: Vec<SocketAddr>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let backends = Arc::new(backends);
        let next = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let backends = Arc::clone(&backends);
                let start = next.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    for i in 0..backends.len() {
                        let backend = backends[(start + i) % backends.len()];
                        if let Ok(mut outbound) = TcpStream::connect(backend).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                            return;
                        }
                    }
                });
            }
        });
        Ok(Self { addr, task })
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
