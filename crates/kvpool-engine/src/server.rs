//! The engine's server: peers write into and read from this process's
//! registered memory (Mooncake's TCP transport, receiving side).
//!
//! One loop per connection answers pipelined requests in order. Each
//! request's range is checked against [`Regions`] before a byte moves; a
//! range outside them is answered `InvalidParams` (a write's payload is read
//! and thrown away), and the connection goes on. A write's payload goes
//! straight from the socket into the region, a read's straight from the
//! region to the socket, each while holding the region's pin so an
//! unregister cannot free the memory under it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kvpool_net::auth::Security;
use kvpool_net::conn::FramedConn;
use kvpool_net::server::{reject_and_close, serve_framed};
use kvpool_proto::frame::{FrameHeader, FrameKind, Limits, Opcode};
use kvpool_proto::msg::{EngineReadReq, EngineWriteReq};
use kvpool_proto::{Code, KvError, KvResult, Plane, Request};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::regions::Regions;

/// A running engine server; stops when dropped or [`Self::shutdown`].
#[derive(Debug)]
pub struct EngineServer {
    addr: SocketAddr,
    shutdown: CancellationToken,
}

impl EngineServer {
    /// Binds `addr` (`host:port`, port 0 picks one) and serves `regions`
    /// to peers that pass the handshake under `security` (with a cluster
    /// secret, only peers that prove it). Refuses to serve off loopback
    /// without a secret unless `security` is marked insecure: anyone who
    /// can connect could write this process's registered memory.
    pub async fn bind(
        addr: &str,
        regions: Arc<Regions>,
        security: Security,
    ) -> KvResult<EngineServer> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| KvError::new(Code::InvalidParams, format!("bind {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| KvError::new(Code::InternalError, format!("bind {addr}: {e}")))?;
        security.check_listen(local.ip(), "the transfer engine")?;
        let shutdown = CancellationToken::new();
        let serve = serve_framed(
            listener,
            "engine",
            Limits::default(),
            security,
            shutdown.clone(),
            move |mut conn, token| {
                let regions = regions.clone();
                async move {
                    if let Err(e) = engine_conn(&mut conn, &regions, &token).await {
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

/// Least rate a peer must read a read's payload at, so a peer that stops
/// reading cannot hold a region pinned (and its unregister waiting) for
/// ever: the connection is closed instead.
const SEND_BYTES_PER_SEC: u64 = 1 << 20;

/// Slack on top of [`SEND_BYTES_PER_SEC`] for any read.
const SEND_SLACK: Duration = Duration::from_secs(10);

/// Serves one connection until the peer closes it, it breaks, or shutdown.
async fn engine_conn(
    conn: &mut FramedConn,
    regions: &Regions,
    shutdown: &CancellationToken,
) -> KvResult<()> {
    loop {
        // Only the wait for a new request is cancellable: a transfer that
        // started runs to its answer.
        let h = tokio::select! {
            _ = shutdown.cancelled() => return conn.flush().await,
            h = conn.next_request() => h,
        };
        let h = match h {
            Ok(Some(h)) => h,
            Ok(None) => return conn.flush().await,
            Err(e) => return reject_and_close(conn, e).await,
        };
        serve_one(conn, regions, &h).await?;
        conn.flush_if_idle().await?;
    }
}

/// Reads one request (and a write's payload) and queues its answer. `Err`
/// only when the connection broke.
async fn serve_one(conn: &mut FramedConn, regions: &Regions, h: &FrameHeader) -> KvResult<()> {
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
        Opcode::EngineRead if h.payload_len != 0 => Err(KvError::new(
            Code::InvalidParams,
            "a read carries no payload",
        )),
        op => Request::decode(op, meta),
    });
    let refused = match decoded {
        Err(e) => e,
        Ok((Request::EngineWrite(req), _)) => return write(conn, regions, h, req).await,
        Ok((Request::EngineRead(req), _)) => return read(conn, regions, h, req).await,
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
    // SAFETY: inside the region (checked above); every read into it runs
    // under a pin (the fenced read below takes one per read), so nothing
    // lands once an unregister is under way.
    let dst = unsafe { region.bytes_mut(req.addr, req.len) };
    let landed = conn
        .read_payload_fenced(dst, || region.try_pin(), |_| {})
        .await?;
    if landed {
        conn.send_response(h, &[], &[]).await
    } else {
        let e = KvError::new(
            Code::TransferFail,
            format!(
                "{:#x}+{} was unregistered during the write",
                req.addr, req.len
            ),
        );
        conn.send_error(h, &e).await
    }
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
    // SAFETY: inside the region (checked above), which `pin` keeps
    // registered until the bytes are queued or sent.
    let src = unsafe { region.bytes(req.addr, req.len) };
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
