//! A pool of HTTP/1.1 connections to one apiserver that never holds more than a given number of
//! connections, busy or idle.
//!
//! hyper-util's pool opens a new connection whenever a request finds no idle one, even when
//! another request's connection is about to come back (its answer was read, but the task that
//! returns it has not run yet): it then keeps both. With as many writes in flight as the pool
//! may keep idle, a long rebalance ends up with more connections than writes in flight (163
//! for 128 at the peak of the benchmarks' scale-out, heaptrack), each holding about 30 KiB
//! (TLS and HTTP buffers, hyper's request channel). Here a request that finds no idle
//! connection opens one only below the cap, and otherwise waits for the next one to come back.
//!
//! hyper hands every request to its connection through an unbounded channel whose memory comes
//! in blocks of 32 requests; a connection that carried more holds a second block (8.5 KiB) for
//! the rest of its life. So once a connection carried [`super::REQUESTS_PER_CHANNEL`] requests
//! and its answer was read (it is idle), its hyper state is taken apart and started again on
//! the same TCP and TLS connection: a new channel, no new handshake with the apiserver.
//!
//! Otherwise it does what hyper-util's pool does for one host: a request takes the most
//! recently used idle connection; a connection goes back once its answer's body was read; idle
//! connections are closed after [`super::IDLE_TIMEOUT`]; a connection whose request failed or
//! was dropped, or that the apiserver closed, is closed and makes room for a new one.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};

use http::uri::{Authority, PathAndQuery};
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceExt as _};

use super::IDLE_TIMEOUT;

/// HTTP/1.1 connections, at most `max` of them (see the module documentation).
pub(crate) struct CappedPool<C, B> {
    shared: Arc<Shared<C, B>>,
}

impl<C, B> Clone for CappedPool<C, B> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

/// What opens a pool's connections (hyper-rustls' connector): a URI in, a TLS stream out.
pub(crate) trait Connector:
    Service<Uri, Error = BoxError, Response = Self::Io, Future = Self::Connecting>
    + Clone
    + Send
    + Sync
    + 'static
{
    /// The stream it opens.
    type Io: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static;
    /// Its connecting future.
    type Connecting: Future<Output = Result<Self::Io, BoxError>> + Send;
}

impl<C> Connector for C
where
    C: Service<Uri, Error = BoxError> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    C::Future: Send,
{
    type Io = C::Response;
    type Connecting = C::Future;
}

/// The body of the requests a pool sends (kube's).
pub(crate) trait RequestBody:
    Body<Data = Self::Chunk, Error = Self::Failure> + Send + 'static
{
    /// Its pieces.
    type Chunk: hyper::body::Buf + Send;
    /// Its errors.
    type Failure: Into<BoxError>;
}

impl<B> RequestBody for B
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Chunk = B::Data;
    type Failure = B::Error;
}

/// What every clone of a pool and every connection's task share.
struct Shared<C, B> {
    connector: C,
    builder: http1::Builder,
    max: usize,
    state: Mutex<State<B>>,
    /// Woken when a connection comes back or closes.
    changed: Notify,
}

/// The pool's connections.
struct State<B> {
    /// Idle connections, most recently used last.
    idle: Vec<Pooled<B>>,
    /// Connections open or being opened, busy or idle.
    open: usize,
    /// Whether a task closes expired idle connections.
    reaping: bool,
}

impl<B> State<B> {
    /// Drops the idle connections the apiserver closed or that were idle for
    /// [`IDLE_TIMEOUT`]: dropping a sender ends its connection's task, which frees its place.
    fn drop_stale(&mut self, now: Instant) {
        self.idle
            .retain(|p| !p.sender.is_closed() && now - p.idle_since < IDLE_TIMEOUT);
    }
}

/// One connection's sending side, between two requests.
struct Pooled<B> {
    authority: Authority,
    sender: http1::SendRequest<B>,
    /// Requests carried since hyper's state was last started on the connection.
    carried: usize,
    /// Set before `sender` is dropped for a renewal: the connection's task then starts hyper's
    /// HTTP/1.1 state again on the same stream instead of closing it.
    renew: Arc<AtomicBool>,
    idle_since: Instant,
}

/// Counts a connection as open until dropped (its task ended, or it failed to open).
struct Slot<C, B> {
    shared: Weak<Shared<C, B>>,
}

impl<C, B> Drop for Slot<C, B> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.state().open -= 1;
            shared.changed.notify_one();
        }
    }
}

impl<C, B> CappedPool<C, B> {
    /// A pool connecting with `connector` and `builder`, holding at most `max` connections (at
    /// least 1).
    pub(crate) fn new(connector: C, builder: http1::Builder, max: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                connector,
                builder,
                max: max.max(1),
                state: Mutex::new(State {
                    idle: Vec::new(),
                    open: 0,
                    reaping: false,
                }),
                changed: Notify::new(),
            }),
        }
    }
}

impl<C, B> Shared<C, B> {
    fn state(&self) -> MutexGuard<'_, State<B>> {
        // Nothing panics while holding the lock; a poisoned one still holds valid connections.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a request gets from the pool.
enum Checkout<C, B> {
    /// An idle connection.
    Idle(Pooled<B>),
    /// Room for a new connection.
    Open(Slot<C, B>),
}

impl<C, B> Shared<C, B>
where
    C: Connector,
    B: RequestBody,
{
    /// The most recently used idle connection to `authority`, or room for a new one; waits
    /// while neither is there.
    async fn checkout(self: &Arc<Self>, authority: &Authority) -> Checkout<C, B> {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.state();
                state.drop_stale(Instant::now());
                if let Some(at) = state.idle.iter().rposition(|p| &p.authority == authority) {
                    return Checkout::Idle(state.idle.remove(at));
                }
                if state.open < self.max {
                    state.open += 1;
                    return Checkout::Open(Slot {
                        shared: Arc::downgrade(self),
                    });
                }
            }
            changed.await;
        }
    }

    /// Takes `pooled` back after a request (its answer read); once it carried
    /// [`super::REQUESTS_PER_CHANNEL`] requests, its task renews hyper's state first.
    fn checkin(self: &Arc<Self>, mut pooled: Pooled<B>) {
        if pooled.carried >= super::REQUESTS_PER_CHANNEL {
            pooled.renew.store(true, Ordering::Release);
            return;
        }
        pooled.idle_since = Instant::now();
        {
            let mut state = self.state();
            state.idle.push(pooled);
            if !state.reaping {
                state.reaping = true;
                tokio::spawn(reap(Arc::downgrade(self)));
            }
        }
        self.changed.notify_one();
    }

    /// Opens a connection to `uri`'s authority in `slot`; its task serves it until it closes.
    async fn connect(
        &self,
        uri: Uri,
        authority: Authority,
        slot: Slot<C, B>,
    ) -> Result<Pooled<B>, BoxError> {
        let io = self.connector.clone().oneshot(uri).await?;
        let (sender, connection) = self.builder.handshake(io).await?;
        let renew = Arc::new(AtomicBool::new(false));
        tokio::spawn(serve(slot, connection, authority.clone(), renew.clone()));
        Ok(Pooled {
            authority,
            sender,
            carried: 0,
            renew,
            idle_since: Instant::now(),
        })
    }

    /// Sends `request` (absolute URI) on an idle or new connection.
    async fn send(
        self: Arc<Self>,
        mut request: Request<B>,
    ) -> Result<Response<Incoming>, BoxError> {
        let uri = request.uri().clone();
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| BoxError::from(format!("request URI {uri} has no host")))?;
        let mut pooled = loop {
            match self.checkout(&authority).await {
                Checkout::Idle(mut pooled) => {
                    // Closed meanwhile (by the apiserver): dropped, and another one taken.
                    if pooled.sender.ready().await.is_ok() {
                        break pooled;
                    }
                }
                Checkout::Open(slot) => {
                    break self.connect(uri.clone(), authority.clone(), slot).await?;
                }
            }
        };
        if !request.headers().contains_key(http::header::HOST) {
            let host = HeaderValue::from_str(authority.as_str())?;
            request.headers_mut().insert(http::header::HOST, host);
        }
        *request.uri_mut() = uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"))
            .into();
        let answer = pooled.sender.send_request(request).await?;
        pooled.carried += 1;
        // Back to the pool once the answer's body was read (hyper's connection is ready
        // again); a body dropped unread, or a connection the apiserver closed, never gets
        // ready: the connection closes and frees its place.
        let shared = self.clone();
        tokio::spawn(async move {
            if pooled.sender.ready().await.is_ok() {
                shared.checkin(pooled);
            }
        });
        Ok(answer)
    }
}

/// Serves one connection in `slot`: whenever its sending side was dropped for a renewal,
/// takes hyper's HTTP/1.1 state apart and starts it again on the same stream, giving the new
/// sending side to the pool; otherwise (closed by the pool or the apiserver, an error, the
/// pool gone) the stream is dropped, which closes it, and the slot with it.
async fn serve<C, B, T>(
    slot: Slot<C, B>,
    mut connection: http1::Connection<T, B>,
    authority: Authority,
    renew: Arc<AtomicBool>,
) where
    C: Connector,
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: RequestBody,
{
    loop {
        // Errors end the connection; the request that saw them reports them.
        let Ok(parts) = connection.without_shutdown().await else {
            return;
        };
        if !renew.swap(false, Ordering::AcqRel) || !parts.read_buf.is_empty() {
            return;
        }
        let Some(pool) = slot.shared.upgrade() else {
            return;
        };
        let Ok((sender, next)) = pool.builder.handshake(parts.io).await else {
            return;
        };
        connection = next;
        pool.checkin(Pooled {
            authority: authority.clone(),
            sender,
            carried: 0,
            renew: renew.clone(),
            idle_since: Instant::now(),
        });
    }
}

/// Closes idle connections past [`IDLE_TIMEOUT`] while the pool lives, looking every half of
/// it; ends when the pool is gone or holds no idle connection.
async fn reap<C, B>(shared: Weak<Shared<C, B>>) {
    loop {
        tokio::time::sleep(IDLE_TIMEOUT / 2).await;
        let Some(pool) = shared.upgrade() else {
            return;
        };
        let mut state = pool.state();
        state.drop_stale(Instant::now());
        if state.idle.is_empty() {
            state.reaping = false;
            return;
        }
    }
}

impl<C, B> Service<Request<B>> for CappedPool<C, B>
where
    C: Connector,
    B: RequestBody,
{
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        Box::pin(self.shared.clone().send(request))
    }
}
