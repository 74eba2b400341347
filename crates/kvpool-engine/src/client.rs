//! The engine's client side: batches of writes into and reads from a
//! peer's registered memory, pipelined on one pooled connection per call.
//!
//! As in Mooncake, the local buffer of every transfer must lie inside memory
//! this engine registered (so a bad local pointer is refused, never
//! dereferenced), and each item gets its own result. At most [`WINDOW`]
//! requests are in flight on a connection, so neither side ever buffers
//! more than that and pipelining cannot deadlock. The whole call is bounded
//! by the engine's timeout; a connection that broke or timed out is
//! dropped, one that finished cleanly goes back to its pool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kvpool_net::auth::Security;
use kvpool_net::conn::{ConnPool, FramedConn};
use kvpool_proto::frame::Limits;
use kvpool_proto::msg::{EngineReadReq, EngineWriteReq};
use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::Mutex;

use crate::regions::{Region, Regions};

/// Requests kept in flight per connection before waiting for an answer.
pub const WINDOW: usize = 64;

/// A transfer's timeout when `MC_TRANSFER_TIMEOUT` is not set.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Mooncake's variable for the transfer timeout, in seconds.
const TIMEOUT_ENV: &str = "MC_TRANSFER_TIMEOUT";

/// How long a connect to a peer may take (part of the transfer timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle connections kept per peer.
const MAX_IDLE: usize = 4;

/// One item of a batch: `len` bytes between `local` (in this process's
/// registered memory) and `remote` (in the peer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Address in this process, inside a region this engine registered.
    pub local: u64,
    /// Absolute address in the peer process.
    pub remote: u64,
    /// Bytes to move.
    pub len: u64,
}

/// Which way a batch moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Local memory to the peer's.
    Write,
    /// The peer's memory to local.
    Read,
}

/// A transfer timeout of `secs` seconds, or `None` unless it is positive
/// and at most a billion seconds (a larger one would overflow the
/// deadlines computed from it).
pub fn timeout_secs(secs: f64) -> Option<Duration> {
    (secs.is_finite() && secs > 0.0 && secs <= 1e9).then(|| Duration::from_secs_f64(secs))
}

/// The transfer timeout the environment asks for: `MC_TRANSFER_TIMEOUT`
/// seconds when [`timeout_secs`] takes it, else [`DEFAULT_TIMEOUT`].
fn timeout_from_env() -> Duration {
    std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(timeout_secs)
        .unwrap_or(DEFAULT_TIMEOUT)
}

/// Moves bytes between this process's registered memory and peers'.
pub struct Engine {
    regions: Arc<Regions>,
    security: Security,
    timeout: Duration,
    /// One pool per peer session id (`host:port`).
    peers: Mutex<HashMap<String, Arc<ConnPool>>>,
}

impl Engine {
    /// An engine whose local buffers must lie in `regions`, connecting to
    /// peers under `security`, with the timeout of [`timeout_from_env`].
    pub fn new(regions: Arc<Regions>, security: Security) -> Engine {
        Engine {
            regions,
            security,
            timeout: timeout_from_env(),
            peers: Mutex::default(),
        }
    }

    /// The same engine with another timeout per call.
    pub fn with_timeout(mut self, timeout: Duration) -> Engine {
        self.timeout = timeout;
        self
    }

    /// Writes each item's local bytes to the peer `peer` (`host:port`);
    /// one result per item, in order.
    pub async fn write(&self, peer: &str, items: &[Transfer]) -> Vec<KvResult<()>> {
        self.transfer(peer, Direction::Write, items).await
    }

    /// Reads each item's bytes from the peer into local memory; one result
    /// per item, in order.
    pub async fn read(&self, peer: &str, items: &[Transfer]) -> Vec<KvResult<()>> {
        self.transfer(peer, Direction::Read, items).await
    }

    /// Runs a batch: local ranges checked first (a bad one fails that item
    /// alone), then everything else pipelined on one connection within
    /// the timeout. Items the connection or the timeout cut off fail with
    /// that error.
    pub async fn transfer(
        &self,
        peer: &str,
        dir: Direction,
        items: &[Transfer],
    ) -> Vec<KvResult<()>> {
        let mut results: Vec<Option<KvResult<()>>> = vec![None; items.len()];
        let mut locals = Vec::with_capacity(items.len());
        for (t, slot) in items.iter().zip(results.iter_mut()) {
            let local = if t.len == 0 {
                *slot = Some(Ok(()));
                None
            } else {
                match self.regions.check(t.local, t.len, "this engine's") {
                    Ok(r) => Some(r),
                    Err(e) => {
                        *slot = Some(Err(e));
                        None
                    }
                }
            };
            locals.push(local);
        }
        if results.iter().any(Option::is_none) {
            let deadline = tokio::time::Instant::now() + self.timeout;
            let pool = self.pool(peer);
            let run = async {
                let mut conn = pool.take().await?;
                pipeline(&mut conn, dir, items, &locals, &mut results).await?;
                pool.give(conn);
                Ok::<(), KvError>(())
            };
            let failed = match tokio::time::timeout_at(deadline, run).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(KvError::new(
                    Code::RpcTimeout,
                    format!("transfer with {peer} timed out after {:?}", self.timeout),
                )),
            };
            if let Some(e) = failed {
                for slot in results.iter_mut().filter(|s| s.is_none()) {
                    *slot = Some(Err(e.clone()));
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(KvError::from(Code::InternalError))))
            .collect()
    }

    /// The connection pool for `peer`, made on first use.
    fn pool(&self, peer: &str) -> Arc<ConnPool> {
        let mut peers = self.peers.lock();
        peers
            .entry(peer.to_string())
            .or_insert_with(|| {
                let pool =
                    ConnPool::new(peer, "engine", Limits::default(), CONNECT_TIMEOUT, MAX_IDLE);
                Arc::new(pool.with_security(self.security.clone()))
            })
            .clone()
    }
}

/// Pipelines the items still without a result on `conn`, filling their
/// results. `Err` when the connection broke (it must be dropped); items
/// it had in flight are left without a result for the caller to fail.
async fn pipeline(
    conn: &mut FramedConn,
    dir: Direction,
    items: &[Transfer],
    locals: &[Option<Arc<Region>>],
    results: &mut [Option<KvResult<()>>],
) -> KvResult<()> {
    let mut inflight: std::collections::VecDeque<(usize, u64, &Region)> =
        std::collections::VecDeque::with_capacity(WINDOW);
    for (i, t) in items.iter().enumerate() {
        let Some(local) = &locals[i] else { continue };
        if inflight.len() == WINDOW {
            conn.flush().await?;
            if let Some((j, id, at)) = inflight.pop_front() {
                results[j] = Some(answer(conn, dir, &items[j], at, id).await?);
            }
        }
        let id = match dir {
            Direction::Write => {
                let Some(_pin) = local.pin().await else {
                    results[i] = Some(Err(unregistered(t)));
                    continue;
                };
                // SAFETY: inside the local region (checked by `transfer`),
                // which `_pin` keeps registered until the bytes are queued
                // or sent.
                let src = unsafe { local.bytes(t.local, t.len) };
                let req = EngineWriteReq {
                    addr: t.remote,
                    len: t.len,
                };
                conn.send_request(&req, &[src]).await?
            }
            Direction::Read => {
                let req = EngineReadReq {
                    addr: t.remote,
                    len: t.len,
                };
                conn.send_request(&req, &[]).await?
            }
        };
        inflight.push_back((i, id, local));
    }
    conn.flush().await?;
    while let Some((j, id, at)) = inflight.pop_front() {
        results[j] = Some(answer(conn, dir, &items[j], at, id).await?);
    }
    Ok(())
}

/// Reads the answer to one item (a read's bytes into local memory). The
/// outer `Err` is a broken connection; the inner one this item's failure.
async fn answer(
    conn: &mut FramedConn,
    dir: Direction,
    t: &Transfer,
    local: &Region,
    id: u64,
) -> KvResult<KvResult<()>> {
    if dir == Direction::Write {
        return conn.read_ack(id).await;
    }
    let h = match conn.read_answer(id).await? {
        Ok(h) => h,
        Err(e) => return Ok(Err(e)),
    };
    if h.meta_len != 0 || h.payload_len != t.len {
        // Out of step with the peer: nothing after this can be trusted.
        return Err(KvError::new(
            Code::RpcFail,
            format!("{}: answer of the wrong length", conn.peer()),
        ));
    }
    // SAFETY: inside the local region (checked by `transfer`); every read
    // into it runs under a pin the fenced read takes, so nothing lands once
    // an unregister is under way.
    let dst = unsafe { local.bytes_mut(t.local, t.len) };
    if conn
        .read_payload_fenced(dst, || local.try_pin(), |_| {})
        .await?
    {
        Ok(Ok(()))
    } else {
        Ok(Err(unregistered(t)))
    }
}

/// The error of an item whose local buffer was unregistered mid-transfer.
fn unregistered(t: &Transfer) -> KvError {
    KvError::new(
        Code::TransferFail,
        format!(
            "local buffer {:#x}+{} was unregistered during the transfer",
            t.local, t.len
        ),
    )
}
