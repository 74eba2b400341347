//! The engine's server: peers write into and read from this process's
//! registered memory (Mooncake's TCP transport, receiving side).
//!
//! One loop per connection answers pipelined requests in order. Each
//! request's range is checked against [`Regions`] before a byte moves; a
//! range outside them is answered `InvalidParams` (a write's payload is read
//! and thrown away), and the connection goes on. A write's payload goes
//! straight from the socket into the region, a read's straight from the
//! region to the socket (through a host buffer for GPU memory), each while
//! holding the region's pin so an unregister cannot free the memory under
//! it.
//!
//! After each answer a connection spins for the next request ([`spin`])
//! before it parks: a caller's loop of small transfers sends it
//! microseconds after the last answer, and a parked thread takes longer
//! than that to wake (20-30 us on a virtual machine).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kvpool_net::auth::Security;
use kvpool_net::conn::FramedConn;
use kvpool_net::conn::{accept_unix, spin_first, spin_from_env};
use kvpool_net::server::{reject_and_close, serve_framed};
use kvpool_proto::frame::{FrameHeader, FrameKind, Limits, Opcode};
use kvpool_proto::msg::{self, EngineAboutReply, EngineReadReq, EngineWriteReq};
use kvpool_proto::{Code, KvError, KvResult, Plane, Request};
use tokio::net::TcpListener;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::cuda::Memory;
use crate::local::{self, SameHost, Way};
use crate::notifies::{Notifies, Notify};
use crate::regions::Regions;

/// A running engine server; stops when dropped or [`Self::shutdown`].
#[derive(Debug)]
pub struct EngineServer {
    addr: SocketAddr,
    shutdown: CancellationToken,
}

impl EngineServer {
    /// Binds `addr` (`host:port`, port 0 picks one) and serves `regions`
    /// (and queues peers' notifies in `notifies`) to peers that pass the
    /// handshake under `security`, peers on this host as `same_host` says
    /// (with a cluster
    /// secret, only peers that prove it). Refuses to serve off loopback
    /// without a secret unless `security` is marked insecure: anyone who
    /// can connect could write this process's registered memory.
    pub async fn bind(
        addr: &str,
        regions: Arc<Regions>,
        notifies: Arc<Notifies>,
        security: Security,
        same_host: SameHost,
    ) -> KvResult<EngineServer> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| KvError::new(Code::InvalidParams, format!("bind {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| KvError::new(Code::InternalError, format!("bind {addr}: {e}")))?;
        security.check_listen(local.ip(), "the transfer engine")?;
        let shutdown = CancellationToken::new();
        let unix = (same_host != SameHost::Off)
            .then(|| local::listen(&local.to_string()))
            .flatten();
        if let Some(unix) = unix {
            let copies = same_host == SameHost::Copy;
            let served = serve_unix(
                unix,
                copies,
                regions.clone(),
                notifies.clone(),
                security.clone(),
                shutdown.clone(),
            );
            tokio::spawn(served);
        }
        let serve = serve_framed(
            listener,
            "engine",
            Limits::default(),
            security,
            shutdown.clone(),
            None,
            move |mut conn, token| {
                let (regions, notifies) = (regions.clone(), notifies.clone());
                async move {
                    let served = engine_conn(&mut conn, &regions, &notifies, None, &token).await;
                    if let Err(e) = served {
                        debug!(peer = conn.peer(), error = %e, "engine connection closed");
                    }
                }
            },
        );
        tokio::spawn(serve);
        Ok(EngineServer {
            addr: local,
            shutdown,
        })
    }

    /// The address it listens on (the port picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and closes idle connections; a request being served
    /// is finished first.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

impl Drop for EngineServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Connections served at once on the same-host socket; more wait to be
/// accepted (only this user's processes can connect there).
const MAX_UNIX_CONNS: usize = 1024;

/// Serves same-host peers on the engine's Unix socket (see [`local`]):
/// the same requests as over TCP, plus copies straight between their
/// memory and the registered regions.
///
/// Each connection runs on a thread of its own, with a runtime of its own
/// that only it drives. A request arriving on a socket registered with the
/// shared runtime woke a parked worker of it, although the connection's
/// task was spinning for that very request and took it: on two cores that
/// third thread took the core of one of the two spinning (the caller, or
/// this server), once or more a round trip. A thread that drives its own
/// runtime is woken only when it parked, and it does not park while it
/// spins.
async fn serve_unix(
    listener: UnixListener,
    copies: bool,
    regions: Arc<Regions>,
    notifies: Arc<Notifies>,
    security: Security,
    shutdown: CancellationToken,
) {
    let security = Arc::new(security);
    let token = shutdown.clone();
    kvpool_net::local::serve(listener, MAX_UNIX_CONNS, shutdown, move |stream, pid| {
        // Without copies the caller's pid is not needed: its copy requests
        // are refused and it sends the bytes instead.
        let pid = pid.filter(|_| copies);
        let (regions, notifies) = (regions.clone(), notifies.clone());
        let (security, token) = (security.clone(), token.clone());
        // Off the shared runtime's reactor (see above); the task waits for
        // the thread, so shutdown still waits for a request in progress.
        let stream = stream.into_std();
        async move {
            let stream = match stream {
                Ok(s) => s,
                Err(e) => return debug!(error = %e, "same-host connection dropped"),
            };
            let (done, finished) = tokio::sync::oneshot::channel::<()>();
            let serve = move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let Ok(rt) = rt else { return };
                rt.block_on(async move {
                    let Ok(stream) = tokio::net::UnixStream::from_std(stream) else {
                        return;
                    };
                    let peer = format!("pid {}", pid.unwrap_or(0));
                    let limits = Limits::default();
                    let accepted = accept_unix(stream, peer, "engine", limits, &security).await;
                    let Some(mut conn) = accepted else { return };
                    let served = engine_conn(&mut conn, &regions, &notifies, pid, &token).await;
                    if let Err(e) = served {
                        debug!(peer = conn.peer(), error = %e, "engine connection closed");
                    }
                });
                drop(done);
            };
            let thread = std::thread::Builder::new()
                .name("kvpool-engine-peer".into())
                .stack_size(LOCAL_THREAD_STACK)
                .spawn(serve);
            match thread {
                Ok(_) => {
                    let _ = finished.await;
                }
                Err(e) => debug!(error = %e, "no thread for a same-host connection"),
            }
        }
    })
    .await;
}

/// Stack of a same-host connection's thread: its runtime and one
/// connection's futures (requests are served in place, no deep calls).
const LOCAL_THREAD_STACK: usize = 512 << 10;

/// How long a connection's server spins for the next request after each
/// answer: `KVPOOL_ENGINE_SPIN_US` microseconds (0: never), default 100,
/// a few of a caller's turns between transfers. One connection of the
/// process spins at a time ([`spin_first`]).
fn spin() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| spin_from_env("KVPOOL_ENGINE_SPIN_US", 100))
}

/// Least rate a peer must read a read's payload at, so a peer that stops
/// reading cannot hold a region pinned (and its unregister waiting) for
/// ever: the connection is closed instead.
const SEND_BYTES_PER_SEC: u64 = 1 << 20;

/// Slack on top of [`SEND_BYTES_PER_SEC`] for any read.
const SEND_SLACK: Duration = Duration::from_secs(10);

/// Serves one connection until the peer closes it, it breaks, or shutdown;
/// after each answer it spins up to [`spin`] for the next request.
async fn engine_conn(
    conn: &mut FramedConn,
    regions: &Regions,
    notifies: &Notifies,
    caller: Option<i32>,
    shutdown: &CancellationToken,
) -> KvResult<()> {
    loop {
        // Only the wait for a new request is cancellable: a transfer that
        // started runs to its answer.
        let h = tokio::select! {
            _ = shutdown.cancelled() => return conn.flush().await,
            h = spin_first(spin(), conn.next_request()) => h,
        };
        let h = match h {
            Ok(Some(h)) => h,
            Ok(None) => return conn.flush().await,
            Err(e) => return reject_and_close(conn, e).await,
        };
        serve_one(conn, regions, notifies, caller, &h).await?;
        conn.flush_if_idle().await?;
    }
}

/// Reads one request (and a write's payload) and queues its answer. `Err`
/// only when the connection broke.
async fn serve_one(
    conn: &mut FramedConn,
    regions: &Regions,
    notifies: &Notifies,
    caller: Option<i32>,
    h: &FrameHeader,
) -> KvResult<()> {
    let role = conn.peer_role();
    let meta = conn.read_meta(h.meta_len).await?;
    let admitted = match h.kind {
        FrameKind::Request => h.opcode.admit(Plane::Data, role),
        FrameKind::Response => Err(KvError::new(
            Code::InvalidParams,
            "expected a request frame",
        )),
    };
    let decoded = admitted.and_then(|()| match h.opcode {
        Opcode::EngineWrite => Request::decode(h.opcode, meta),
        _ if h.payload_len != 0 => Err(KvError::new(
            Code::InvalidParams,
            format!("{} carries no payload", h.opcode.name()),
        )),
        op => Request::decode(op, meta),
    });
    let refused = match decoded {
        Err(e) => e,
        Ok((Request::EngineWrite(req), _)) => return write(conn, regions, h, req).await,
        Ok((Request::EngineRead(req), _)) => return read(conn, regions, h, req).await,
        Ok((Request::EngineNotify(req), _)) => {
            let queued = notifies.push(Notify {
                name: req.name,
                msg: req.msg,
            });
            return ack(conn, h, queued).await;
        }
        Ok((Request::EngineWriteFrom(r), _)) => {
            let copy = (Way::FromCaller, r.addr, r.len, r.caller_addr);
            return ack(conn, h, copy_with_caller(regions, caller, copy).await).await;
        }
        Ok((Request::EngineReadInto(r), _)) => {
            let copy = (Way::IntoCaller, r.addr, r.len, r.caller_addr);
            return ack(conn, h, copy_with_caller(regions, caller, copy).await).await;
        }
        Ok((Request::EngineAbout(_), _)) => {
            let about = EngineAboutReply {
                first_buffer: regions.first().map(|(start, _)| start),
            };
            return conn.send_response(h, &msg::encode(&about), &[]).await;
        }
        Ok((other, _)) => KvError::new(
            Code::NotSupported,
            format!(
                "{} is not served by the transfer engine",
                other.opcode().name()
            ),
        ),
    };
    // The payload of a refused request is still on the wire: skip it.
    conn.discard_payload(h.payload_len).await?;
    conn.send_error(h, &refused).await
}

/// Copies between `[addr, addr + len)` of registered memory and
/// `caller_addr` in the caller's process (known only on the same-host
/// socket), holding the region's pin throughout.
async fn copy_with_caller(
    regions: &Regions,
    caller: Option<i32>,
    (way, addr, len, caller_addr): (Way, u64, u64, u64),
) -> KvResult<()> {
    let Some(pid) = caller else {
        return Err(KvError::new(
            Code::NotSupported,
            "copies with the caller's memory need the engine's same-host socket",
        ));
    };
    let region = regions.check(addr, len, "the peer's")?;
    if region.memory() != Memory::Host {
        // The kernel's copy cannot reach GPU memory: the caller sends the
        // bytes through the socket instead.
        return Err(KvError::new(
            Code::NotSupported,
            "GPU memory is not copied between processes",
        ));
    }
    let Some(_pin) = region.pin().await else {
        return Err(KvError::new(
            Code::TransferFail,
            format!("{addr:#x}+{len} was unregistered"),
        ));
    };
    // SAFETY: inside the region (checked above), which `_pin` keeps
    // registered for the whole copy.
    let bytes = unsafe { region.bytes_mut(addr, len) };
    // SAFETY: `bytes` is valid for reads and writes of its length.
    unsafe { local::copy(pid, way, bytes.as_mut_ptr(), caller_addr, bytes.len()) }
}

/// Answers a request that carries nothing back: an empty response, or
/// its error.
async fn ack(conn: &mut FramedConn, h: &FrameHeader, done: KvResult<()>) -> KvResult<()> {
    match done {
        Ok(()) => conn.send_response(h, &[], &[]).await,
        Err(e) => conn.send_error(h, &e).await,
    }
}

/// Lands a write's payload in registered memory, or refuses it whole.
async fn write(
    conn: &mut FramedConn,
    regions: &Regions,
    h: &FrameHeader,
    req: EngineWriteReq,
) -> KvResult<()> {
    let region = match (req.len == h.payload_len)
        .then_some(())
        .ok_or_else(|| {
            KvError::new(
                Code::InvalidParams,
                format!(
                    "write of {} bytes carries {} bytes of payload",
                    req.len, h.payload_len
                ),
            )
        })
        .and_then(|()| regions.check(req.addr, req.len, "the peer's"))
    {
        Ok(r) => r,
        Err(e) => {
            conn.discard_payload(h.payload_len).await?;
            return conn.send_error(h, &e).await;
        }
    };
    // SAFETY: inside the region (checked above).
    let landed = unsafe { region.land(conn, req.addr, req.len) }.await?;
    ack(conn, h, landed).await
}

/// Sends registered memory as a read's payload, or refuses the read.
async fn read(
    conn: &mut FramedConn,
    regions: &Regions,
    h: &FrameHeader,
    req: EngineReadReq,
) -> KvResult<()> {
    let region = match regions.check(req.addr, req.len, "the peer's") {
        Ok(r) => r,
        Err(e) => return conn.send_error(h, &e).await,
    };
    let Some(pin) = region.pin().await else {
        let e = KvError::new(
            Code::TransferFail,
            format!("{:#x}+{} was unregistered", req.addr, req.len),
        );
        return conn.send_error(h, &e).await;
    };
    let mut staging = Vec::new();
    // SAFETY: inside the region (checked above), which `pin` keeps
    // registered until the bytes are queued or sent.
    let src = match unsafe { region.load(req.addr, req.len, &mut staging) } {
        Ok(src) => src,
        Err(e) => return conn.send_error(h, &e).await,
    };
    let within = SEND_SLACK + Duration::from_secs(req.len / SEND_BYTES_PER_SEC);
    let sent = tokio::time::timeout(within, conn.send_response(h, &[], &[src])).await;
    drop(pin);
    match sent {
        Ok(r) => r,
        Err(_) => Err(KvError::new(
            Code::RpcTimeout,
            format!("{} stopped reading a read's payload", conn.peer()),
        )),
    }
}
