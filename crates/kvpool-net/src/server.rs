//! Server loops: accepting connections under a shutdown token, and the
//! request/response loop of the control plane (master). The data-plane loop
//! lives in `kvpool_transfer::data`, which builds on these.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvpool_proto::frame::{FrameHeader, FrameKind, Limits, Opcode};
use kvpool_proto::{Code, KvError, KvResult};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::admission::{BudgetLimits, Budgets, Refused, TenantCap};
use crate::auth::{Role, Security};
use crate::conn::{accept, FramedConn};

/// A wait that must end before a reply is sent.
pub type ReplyWait = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Answers control-plane requests. Handlers are synchronous: the master's
/// work is short critical sections, never I/O.
pub trait ControlHandler: Send + Sync + 'static {
    /// What the handler remembers about one connection between its
    /// requests (the master: whose heartbeats it carries).
    type Conn: Default + Send;

    /// Handles one request's message: the response message, and what the
    /// reply must wait for, if anything (the master: old versions destroyed
    /// on their stores before a new value or a removal is reported). Only
    /// that connection waits.
    /// `peer` is what the peer proved in the handshake and the protocol
    /// version the connection speaks.
    fn handle(
        &self,
        conn: &mut Self::Conn,
        peer: &Peer,
        opcode: Opcode,
        meta: &[u8],
    ) -> (KvResult<Vec<u8>>, Option<ReplyWait>);

    /// The connection ended: closed or reset by the peer, broken, or shut
    /// down.
    fn closed(&self, conn: Self::Conn);

    /// The most authenticated connections tenant `name` may hold on this
    /// server (its quota); `None`: as many as one address
    /// ([`MAX_CONNECTIONS_PER_IP`]).
    fn tenant_connections(&self, _name: &str) -> Option<usize> {
        None
    }
}

/// Who is on the other end of an accepted connection, as its handshake
/// proved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The role proved (every role on a server without a secret).
    pub role: Role,
    /// The tenant whose key was proved, if any.
    pub tenant: Option<Arc<str>>,
    /// The protocol version the connection speaks.
    pub version: u32,
}

impl Peer {
    /// What `conn`'s handshake proved.
    pub fn of(conn: &FramedConn) -> Peer {
        Peer {
            role: conn.peer_role(),
            tenant: conn.peer_tenant().cloned(),
            version: conn.version(),
        }
    }
}

/// Most authenticated connections one server keeps open; more are closed
/// once their handshake finishes (or at accept, when the server is full
/// already), so a flood of sockets cannot exhaust descriptors and memory.
/// Connections still in their handshake have a budget of their own
/// ([`PREAUTH_TOTAL`]).
pub const MAX_CONNECTIONS: usize = 8192;

/// Most authenticated connections one peer IP address may hold on one
/// server, so a single host cannot take every slot of [`MAX_CONNECTIONS`]
/// and lock everyone else out. Loopback is one address like any other:
/// every client of a single-host deployment shares it. A client keeps a
/// few connections to the master (calls, heartbeats) and a few per store,
/// so 1,024 leaves room for hundreds of clients on one host. Set
/// `KVPOOL_MAX_CONNECTIONS_PER_IP` in a process's environment to change it
/// (0: no per-address cap). A tenant's connections count against the
/// same number for that tenant instead, from whatever address. Connections
/// that have not finished their handshake do not count here
/// ([`PREAUTH_PER_IP`]).
pub const MAX_CONNECTIONS_PER_IP: usize = 1024;

pub use crate::admission::{PREAUTH_PER_IP, PREAUTH_TOTAL};

/// Environment variable that overrides [`MAX_CONNECTIONS_PER_IP`].
pub const MAX_CONNECTIONS_PER_IP_ENV: &str = "KVPOOL_MAX_CONNECTIONS_PER_IP";

/// Connections this process's accept loops closed because their address
/// (or their tenant) held its share already (read by the master's
/// `/metrics`).
pub static REFUSED_CONNECTIONS_PER_IP: AtomicU64 = AtomicU64::new(0);

/// Connections this process's accept loops closed at [`MAX_CONNECTIONS`].
pub static REFUSED_CONNECTIONS: AtomicU64 = AtomicU64::new(0);

/// Connections still in their handshake that this process's accept loops
/// closed to make room for a newer one ([`PREAUTH_PER_IP`],
/// [`PREAUTH_TOTAL`]).
pub static PREAUTH_EVICTED: AtomicU64 = AtomicU64::new(0);

/// Least time between two log lines about refused connections.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

/// The budgets an accept loop applies: [`MAX_CONNECTIONS_PER_IP`] (or its
/// environment variable), [`MAX_CONNECTIONS`], [`PREAUTH_PER_IP`] and
/// [`PREAUTH_TOTAL`].
pub fn budget_limits() -> BudgetLimits {
    let per_ip = std::env::var(MAX_CONNECTIONS_PER_IP_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(MAX_CONNECTIONS_PER_IP);
    BudgetLimits {
        per_ip: if per_ip == 0 { usize::MAX } else { per_ip },
        total: MAX_CONNECTIONS,
        preauth_per_ip: PREAUTH_PER_IP,
        preauth_total: PREAUTH_TOTAL,
    }
}

/// Logs a refused or evicted connection, at most once a second per process
/// (with how many went since the last line).
fn log_refusal(peer: SocketAddr, why: &str) {
    static LAST: parking_lot::Mutex<(Option<Instant>, u64)> = parking_lot::Mutex::new((None, 0));
    let mut last = LAST.lock();
    last.1 += 1;
    if last.0.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY) {
        warn!(%peer, refused = last.1, "{why}; closing (logged at most once a second)");
        *last = (Some(Instant::now()), 0);
    }
}

/// What a connection's handshake proved that the authenticated budget
/// counts by: the tenant, if any (else the peer's address is used).
pub trait Proved {
    /// The tenant whose key the peer proved.
    fn tenant(&self) -> Option<Arc<str>>;
}

impl Proved for FramedConn {
    fn tenant(&self) -> Option<Arc<str>> {
        self.peer_tenant().cloned()
    }
}

/// A bare stream proves no tenant (servers without kvpool's handshake).
impl Proved for TcpStream {
    fn tenant(&self) -> Option<Arc<str>> {
        None
    }
}

/// Counts and logs a connection refused a slot.
fn refused(peer: SocketAddr, why: Refused, limits: &BudgetLimits) {
    match why {
        Refused::PerIp(n) => {
            REFUSED_CONNECTIONS_PER_IP.fetch_add(1, Ordering::Relaxed);
            log_refusal(
                peer,
                &format!(
                    "{} (or its tenant) holds {n} connections, its limit",
                    peer.ip()
                ),
            );
        }
        Refused::Total => {
            REFUSED_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
            log_refusal(
                peer,
                &format!("connection limit of {} reached", limits.total),
            );
        }
        // Counted, and logged, when it was evicted.
        Refused::Evicted => {}
    }
}

/// Accepts connections until `shutdown`: each runs `handshake` under a
/// slot of the handshake budget, then, once that yields a connection,
/// `serve` under a slot of the authenticated budget (see
/// [`crate::admission`]); returns after every connection task has
/// finished (they watch the same token). A connection whose handshake is
/// still running when a newer one needs its slot is closed; one refused
/// its authenticated slot is closed after its handshake (its tenant, else
/// its address, holds [`MAX_CONNECTIONS_PER_IP`]), or at accept when the
/// server holds [`MAX_CONNECTIONS`] already. Refusals and evictions are
/// counted and logged at most once a second.
pub async fn accept_loop<H, HFut, T, S, SFut>(
    listener: TcpListener,
    shutdown: CancellationToken,
    tenant_cap: Option<TenantCap>,
    handshake: H,
    serve: S,
) where
    H: Fn(TcpStream) -> HFut,
    HFut: Future<Output = Option<T>> + Send + 'static,
    T: Proved + Send + 'static,
    S: Fn(T) -> SFut + Send + Sync + 'static,
    SFut: Future<Output = ()> + Send + 'static,
{
    accept_within(
        listener,
        shutdown,
        budget_limits(),
        tenant_cap,
        handshake,
        serve,
    )
    .await
}

/// [`accept_loop`] under budgets of the given sizes.
pub async fn accept_within<H, HFut, T, S, SFut>(
    listener: TcpListener,
    shutdown: CancellationToken,
    limits: BudgetLimits,
    tenant_cap: Option<TenantCap>,
    handshake: H,
    serve: S,
) where
    H: Fn(TcpStream) -> HFut,
    HFut: Future<Output = Option<T>> + Send + 'static,
    T: Proved + Send + 'static,
    S: Fn(T) -> SFut + Send + Sync + 'static,
    SFut: Future<Output = ()> + Send + 'static,
{
    let tracker = TaskTracker::new();
    let budgets = Budgets::new(limits, tenant_cap);
    let serve = Arc::new(serve);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let (slot, evicted) = match budgets.arrive(peer.ip()) {
                        Ok(s) => s,
                        Err(why) => {
                            // Dropping the stream closes it.
                            refused(peer, why, &limits);
                            continue;
                        }
                    };
                    if evicted > 0 {
                        PREAUTH_EVICTED.fetch_add(evicted as u64, Ordering::Relaxed);
                        log_refusal(peer, "too many connections in their handshake: the oldest is dropped for this one");
                    }
                    debug!(%peer, "accepted");
                    let handshake = handshake(stream);
                    let (serve, stop) = (serve.clone(), shutdown.clone());
                    tracker.spawn(async move {
                        let conn = tokio::select! {
                            c = handshake => c,
                            _ = slot.evicted() => None,
                            _ = stop.cancelled() => None,
                        };
                        let Some(conn) = conn else { return };
                        match slot.admit(conn.tenant()) {
                            Ok(admitted) => {
                                serve(conn).await;
                                drop(admitted);
                            }
                            Err(why) => refused(peer, why, &limits),
                        }
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
    tracker.close();
    tracker.wait().await;
}

/// Accepts framed connections until `shutdown` (see [`accept_loop`]): each
/// one that completes TLS and the handshake under `security`, answering as
/// `name`, goes to `serve` with a clone of the shutdown token, which the
/// connection must watch. `tenant_cap` sets tenants' shares of the
/// connections, where the server knows their quotas.
pub async fn serve_framed<F, Fut>(
    listener: TcpListener,
    name: &'static str,
    limits: Limits,
    security: Security,
    shutdown: CancellationToken,
    tenant_cap: Option<TenantCap>,
    serve: F,
) where
    F: Fn(FramedConn, CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let token = shutdown.clone();
    let security = Arc::new(security);
    accept_loop(
        listener,
        shutdown,
        tenant_cap,
        move |stream| {
            let security = security.clone();
            async move { accept(stream, name, limits, &security).await }
        },
        move |conn| serve(conn, token.clone()),
    )
    .await;
}

/// Serves the control protocol on `listener` with `handler` until
/// `shutdown`, authenticating peers under `security`.
pub async fn serve_control<H: ControlHandler>(
    listener: TcpListener,
    handler: Arc<H>,
    name: &'static str,
    limits: Limits,
    security: Security,
    shutdown: CancellationToken,
) {
    let h = handler.clone();
    let cap: TenantCap = Arc::new(move |name| h.tenant_connections(name));
    serve_framed(
        listener,
        name,
        limits,
        security,
        shutdown,
        Some(cap),
        move |mut conn, token| {
            let handler = handler.clone();
            async move {
                let mut state = H::Conn::default();
                tokio::select! {
                    _ = token.cancelled() => {}
                    r = control_conn(&mut conn, &*handler, &mut state) => {
                        if let Err(e) = r {
                            debug!(peer = conn.peer(), error = %e, "control connection closed");
                        }
                    }
                }
                handler.closed(state);
            }
        },
    )
    .await;
}

async fn control_conn<H: ControlHandler>(
    conn: &mut FramedConn,
    handler: &H,
    state: &mut H::Conn,
) -> KvResult<()> {
    let peer = Peer::of(conn);
    loop {
        let h = match conn.next_request().await {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(()),
            Err(e) => return reject_and_close(conn, e).await,
        };
        // Consume the whole frame first so the stream stays in sync whatever the answer.
        conn.read_meta(h.meta_len).await?;
        conn.discard_payload(h.payload_len).await?;
        let result = if h.kind != FrameKind::Request {
            Err(KvError::new(
                Code::InvalidParams,
                "expected a request frame",
            ))
        } else if h.payload_len != 0 {
            Err(KvError::new(
                Code::InvalidParams,
                "control requests carry no payload",
            ))
        } else {
            let (result, wait) = handler.handle(state, &peer, h.opcode, conn.last_meta());
            if let Some(wait) = wait {
                wait.await;
            }
            result
        };
        send_result(conn, &h, result).await?;
    }
}

/// Answers a header that could not be decoded and closes: the stream cannot
/// be trusted to be in sync any more.
pub async fn reject_and_close(conn: &mut FramedConn, e: KvError) -> KvResult<()> {
    warn!(peer = conn.peer(), error = %e, "bad frame, closing connection");
    conn.reject(&e).await;
    Err(e)
}

async fn send_result(
    conn: &mut FramedConn,
    req: &FrameHeader,
    r: KvResult<Vec<u8>>,
) -> KvResult<()> {
    match r {
        Ok(meta) => conn.send_response(req, &meta, &[]).await?,
        Err(e) => conn.send_error(req, &e).await?,
    }
    conn.flush_if_idle().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Whether the peer closed `s` within `within`.
    async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
        let mut b = [0u8; 16];
        loop {
            match tokio::time::timeout(within, s.read(&mut b)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// A server whose "handshake" is one byte `h` and which then echoes
    /// every byte, under small budgets.
    async fn echo_server(limits: BudgetLimits) -> (String, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stop = CancellationToken::new();
        let handshake = |mut s: TcpStream| async move {
            let mut b = [0u8; 1];
            (s.read_exact(&mut b).await.is_ok() && b[0] == b'h').then_some(s)
        };
        let serve = |mut s: TcpStream| async move {
            let mut b = [0u8; 1];
            while s.read_exact(&mut b).await.is_ok() {
                if s.write_all(&b).await.is_err() {
                    break;
                }
            }
        };
        let token = stop.clone();
        tokio::spawn(accept_within(
            listener, token, limits, None, handshake, serve,
        ));
        (addr, stop)
    }

    async fn handshaken(addr: &str) -> TcpStream {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"h").await.unwrap();
        s.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.expect("served");
        assert_eq!(&b, b"x");
        s
    }

    #[tokio::test]
    async fn a_flood_of_handshakes_that_never_finish_evicts_only_its_oldest() {
        let limits = BudgetLimits {
            per_ip: 4,
            total: 100,
            preauth_per_ip: 8,
            preauth_total: 100,
        };
        let (addr, stop) = echo_server(limits).await;
        let served = handshaken(&addr).await;
        let before = PREAUTH_EVICTED.load(Ordering::Relaxed);
        let mut flood = Vec::new();
        for _ in 0..40 {
            flood.push(TcpStream::connect(&addr).await.unwrap());
        }
        // A newcomer still gets in, and the served connection is untouched.
        let mut newcomer = handshaken(&addr).await;
        let mut closed = 0;
        for s in &mut flood {
            closed += closed_within(s, Duration::from_millis(200)).await as usize;
        }
        // The newcomer took the slot of one more flooder.
        assert_eq!(closed, 40 + 1 - 8, "flooders closed");
        assert!(PREAUTH_EVICTED.load(Ordering::Relaxed) - before >= 33);
        newcomer.write_all(b"y").await.unwrap();
        let mut b = [0u8; 1];
        newcomer.read_exact(&mut b).await.unwrap();
        drop(served);
        stop.cancel();
    }

    #[tokio::test]
    async fn authenticated_connections_keep_their_own_per_address_cap() {
        let limits = BudgetLimits {
            per_ip: 3,
            total: 100,
            preauth_per_ip: 8,
            preauth_total: 100,
        };
        let (addr, stop) = echo_server(limits).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(handshaken(&addr).await);
        }
        // The fourth is closed once its handshake says whose it is.
        let mut fourth = TcpStream::connect(&addr).await.unwrap();
        fourth.write_all(b"h").await.unwrap();
        assert!(closed_within(&mut fourth, Duration::from_secs(2)).await);
        // One leaves: another gets in.
        drop(held.pop());
        let mut again = None;
        for _ in 0..50 {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            let _ = s.write_all(b"hz").await;
            let mut b = [0u8; 1];
            let r = tokio::time::timeout(Duration::from_millis(200), s.read_exact(&mut b)).await;
            if matches!(r, Ok(Ok(_))) {
                again = Some(s);
                break;
            }
        }
        assert!(
            again.is_some(),
            "a slot freed by a closed connection is reused"
        );
        stop.cancel();
    }
}
