//! Server loops: accepting connections under a shutdown token, and the
//! request/response loop of the control plane (master). The data-plane loop
//! lives in `kvpool_transfer::data`, which builds on these.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvpool_proto::frame::{FrameHeader, FrameKind, Limits, Opcode};
use kvpool_proto::{Code, KvError, KvResult};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

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
    /// `role` is what the peer proved in the handshake.
    fn handle(
        &self,
        conn: &mut Self::Conn,
        role: Role,
        opcode: Opcode,
        meta: &[u8],
    ) -> (KvResult<Vec<u8>>, Option<ReplyWait>);

    /// The connection ended: closed or reset by the peer, broken, or shut
    /// down.
    fn closed(&self, conn: Self::Conn);
}

/// Most connections one server keeps open; more are closed on accept, so a
/// flood of sockets cannot exhaust descriptors and memory.
pub const MAX_CONNECTIONS: usize = 8192;

/// Most connections one peer IP address may hold on one server, so a single
/// host cannot take every slot of [`MAX_CONNECTIONS`] and lock everyone else
/// out. Loopback is one address like any other: every client of a
/// single-host deployment shares it. A client keeps a few connections to
/// the master (calls, heartbeats) and a few per store, so 1,024 leaves room
/// for hundreds of clients on one host. Set `KVPOOL_MAX_CONNECTIONS_PER_IP`
/// in a process's environment to change it (0: no per-address cap).
pub const MAX_CONNECTIONS_PER_IP: usize = 1024;

/// Environment variable that overrides [`MAX_CONNECTIONS_PER_IP`].
pub const MAX_CONNECTIONS_PER_IP_ENV: &str = "KVPOOL_MAX_CONNECTIONS_PER_IP";

/// Connections this process's accept loops closed because their address
/// held its share already (read by the master's `/metrics`).
pub static REFUSED_CONNECTIONS_PER_IP: AtomicU64 = AtomicU64::new(0);

/// Connections this process's accept loops closed at [`MAX_CONNECTIONS`].
pub static REFUSED_CONNECTIONS: AtomicU64 = AtomicU64::new(0);

/// Least time between two log lines about refused connections.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

/// Accepts connections until `shutdown`, running `serve` for each; returns
/// after every connection task has finished (they watch the same token).
/// A connection beyond [`MAX_CONNECTIONS`], or beyond its peer address's
/// share ([`MAX_CONNECTIONS_PER_IP`]), is closed at once; refusals are
/// counted and logged at most once a second.
pub async fn accept_loop<F, Fut>(listener: TcpListener, shutdown: CancellationToken, serve: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let per_ip = std::env::var(MAX_CONNECTIONS_PER_IP_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(MAX_CONNECTIONS_PER_IP);
    let per_ip = if per_ip == 0 { usize::MAX } else { per_ip };
    let tracker = TaskTracker::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    // Open connections per peer address; an entry goes when its last does.
    let by_ip: Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    let mut last_warned: Option<Instant> = None;
    let mut unlogged = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let ip = peer.ip();
                    let refused = {
                        let mut open = by_ip.lock();
                        let n = open.get(&ip).copied().unwrap_or(0);
                        if n >= per_ip {
                            REFUSED_CONNECTIONS_PER_IP.fetch_add(1, Ordering::Relaxed);
                            Some(format!("{ip} holds {n} connections, its limit"))
                        } else {
                            match slots.clone().try_acquire_owned() {
                                Ok(slot) => {
                                    *open.entry(ip).or_default() += 1;
                                    debug!(%peer, "accepted");
                                    let conn = serve(stream);
                                    let by_ip = by_ip.clone();
                                    tracker.spawn(async move {
                                        conn.await;
                                        drop(slot);
                                        let mut open = by_ip.lock();
                                        if let Some(n) = open.get_mut(&ip) {
                                            *n -= 1;
                                            if *n == 0 {
                                                open.remove(&ip);
                                            }
                                        }
                                    });
                                    None
                                }
                                Err(_) => {
                                    REFUSED_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
                                    Some(format!("connection limit of {MAX_CONNECTIONS} reached"))
                                }
                            }
                        }
                    };
                    // Dropping the stream closes it (outside the lock).
                    if let Some(why) = refused {
                        unlogged += 1;
                        if last_warned.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY) {
                            warn!(%peer, refused = unlogged, "{why}; closing (logged at most once a second)");
                            last_warned = Some(Instant::now());
                            unlogged = 0;
                        }
                    }
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
/// connection must watch.
pub async fn serve_framed<F, Fut>(
    listener: TcpListener,
    name: &'static str,
    limits: Limits,
    security: Security,
    shutdown: CancellationToken,
    serve: F,
) where
    F: Fn(FramedConn, CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let token = shutdown.clone();
    let serve = Arc::new(serve);
    let security = Arc::new(security);
    accept_loop(listener, shutdown, move |stream| {
        let serve = serve.clone();
        let token = token.clone();
        let security = security.clone();
        async move {
            if let Some(conn) = accept(stream, name, limits, &security).await {
                serve(conn, token).await;
            }
        }
    })
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
    serve_framed(
        listener,
        name,
        limits,
        security,
        shutdown,
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
            let (result, wait) =
                handler.handle(state, conn.peer_role(), h.opcode, conn.last_meta());
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
