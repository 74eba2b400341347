//! The engine's client side: batches of writes into and reads from a
//! peer's registered memory, pipelined on one pooled connection per call.
//!
//! A peer on this host is reached on its same-host socket when it has one
//! ([`crate::local`]): there each item asks the peer to copy straight
//! between its memory and this process's (`EngineWriteFrom` /
//! `EngineReadInto`), and once the peer says it cannot, the bytes go
//! through the socket instead. Other peers are reached over TCP.
//!
//! As in Mooncake, the local buffer of every transfer must lie inside memory
//! this engine registered (so a bad local pointer is refused, never
//! dereferenced), and each item gets its own result. At most [`WINDOW`]
//! requests are in flight on a connection, so neither side ever buffers
//! more than that and pipelining cannot deadlock. The whole call is bounded
//! by the engine's timeout; a connection that broke or timed out is
//! dropped, one that finished cleanly goes back to its pool.
//!
//! A synchronous caller can instead run a batch on its own thread
//! ([`Engine::transfer_blocking`]), on connections whose sockets only that
//! thread watches, once the shared path has reached the peer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvpool_net::auth::Security;
use kvpool_net::conn::{spinning, ConnPool, FramedConn};
use kvpool_proto::frame::Limits;
use kvpool_proto::msg::{
    EngineAbout, EngineAboutReply, EngineNotifyReq, EngineReadIntoReq, EngineReadReq,
    EngineWriteFromReq, EngineWriteReq,
};
use kvpool_proto::{Code, KvError, KvResult, Rpc};
use parking_lot::Mutex;

use crate::cuda::Memory;
use crate::local;
use crate::regions::{unregistered, Pin, Region, Regions};

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

/// Idle caller-driven connections kept per peer: one per thread that
/// transfers at once (an engine's TP workers each call from their own),
/// since making one costs a runtime and a handshake (and, on the
/// same-host socket, a thread in the peer).
const MAX_OWNED_IDLE: usize = 16;

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
    /// How each peer is reached, by session id (`host:port`).
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    /// Whether peers' same-host sockets are tried.
    same_host: bool,
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
            same_host: true,
        }
    }

    /// The same engine reaching every peer over TCP when `same_host` is
    /// false (`KVPOOL_ENGINE_SAME_HOST=0`).
    pub fn with_same_host(mut self, same_host: bool) -> Engine {
        self.same_host = same_host;
        self
    }

    /// How `peer` was last reached: `"copy"` (same host, copied straight
    /// between the processes), `"socket"` (same host, through the socket),
    /// `"tcp"`, or `"unknown"` before the first call.
    pub fn link(&self, peer: &str) -> &'static str {
        let Some(p) = self.peers.lock().get(peer).cloned() else {
            return "unknown";
        };
        let unix = p.unix.lock();
        match &*unix {
            Unix::Untried => "unknown",
            Unix::Absent => "tcp",
            Unix::Idle(_) if p.copies.load(Ordering::Relaxed) => "copy",
            Unix::Idle(_) => "socket",
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
        let (mut results, locals) = self.check_locals(items);
        if results.iter().any(Option::is_none) {
            let deadline = tokio::time::Instant::now() + self.timeout;
            let link = self.peer(peer);
            let run = async {
                let (mut conn, unix) = link.take(&self.security).await?;
                link.run(&mut conn, unix, dir, items, &locals, &mut results)
                    .await?;
                link.give(conn, unix);
                Ok::<(), KvError>(())
            };
            let ran = tokio::time::timeout_at(deadline, run).await;
            link.reachable
                .store(matches!(ran, Ok(Ok(()))), Ordering::Relaxed);
            self.fail_rest(peer, ran, &mut results);
        }
        finish(results)
    }

    /// Runs a batch as [`Self::transfer`] does, on the calling thread;
    /// `None` (nothing done) unless the last call to `peer` through the
    /// shared runtime went through (so a peer that is down or unknown
    /// meets that path's circuit breaker, never a connect here), or when
    /// this thread is inside a runtime. The connection's socket is
    /// watched by a runtime of its own that only the caller drives,
    /// spinning up to `spin` at each wait: on the shared runtime each
    /// answer also woke one of its parked workers, a thread more than the
    /// round trip needs (on two cores, one that took the caller's core).
    pub fn transfer_blocking(
        &self,
        peer: &str,
        dir: Direction,
        items: &[Transfer],
        spin: Duration,
    ) -> Option<Vec<KvResult<()>>> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return None;
        }
        let link = self.peers.lock().get(peer).cloned()?;
        if !link.reachable.load(Ordering::Relaxed) {
            return None;
        }
        let unix = matches!(*link.unix.lock(), Unix::Idle(_));
        let (mut results, locals) = self.check_locals(items);
        if results.iter().all(Option::is_some) {
            return Some(finish(results));
        }
        let deadline = std::time::Instant::now() + self.timeout;
        let pooled = link.owned.lock().pop().filter(|o| o.unix == unix);
        let Some(mut owned) = pooled.or_else(|| Owned::connect(&link.name, unix, &self.security))
        else {
            link.reachable.store(false, Ordering::Relaxed);
            return None;
        };
        let Owned { conn, rt, .. } = &mut owned;
        let rt = rt.as_ref()?;
        let ran = rt.block_on(async {
            let run = link.run(conn, unix, dir, items, &locals, &mut results);
            tokio::time::timeout_at(deadline.into(), spinning(spin, run)).await
        });
        if matches!(ran, Ok(Ok(()))) {
            let mut idle = link.owned.lock();
            if idle.len() < MAX_OWNED_IDLE {
                idle.push(owned);
            }
        } else {
            // Back to the shared path until a call there goes through.
            link.reachable.store(false, Ordering::Relaxed);
        }
        self.fail_rest(peer, ran, &mut results);
        Some(finish(results))
    }

    /// Each item's result where its local range already decides it (empty,
    /// or outside this engine's registered memory), and the region of
    /// each item still to move.
    #[allow(clippy::type_complexity)]
    fn check_locals(
        &self,
        items: &[Transfer],
    ) -> (Vec<Option<KvResult<()>>>, Vec<Option<Arc<Region>>>) {
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
        (results, locals)
    }

    /// Fails the items still without a result with what cut the batch
    /// short: the connection's error, or the timeout.
    fn fail_rest(
        &self,
        peer: &str,
        ran: Result<KvResult<()>, tokio::time::error::Elapsed>,
        results: &mut [Option<KvResult<()>>],
    ) {
        let failed = match ran {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(_) => KvError::new(
                Code::RpcTimeout,
                format!("transfer with {peer} timed out after {:?}", self.timeout),
            ),
        };
        for slot in results.iter_mut().filter(|s| s.is_none()) {
            *slot = Some(Err(failed.clone()));
        }
    }

    /// Queues a notification in the peer's inbox (its `get_notifies`).
    pub async fn notify(&self, peer: &str, name: &str, msg: &str) -> KvResult<()> {
        let req = EngineNotifyReq {
            name: name.to_string(),
            msg: msg.to_string(),
        };
        self.bounded(peer, self.peer(peer).call(&self.security, &req))
            .await
    }

    /// What the peer's engine holds; a fresh round trip, so also a probe
    /// that the peer is there and speaks to us.
    pub async fn about(&self, peer: &str) -> KvResult<EngineAboutReply> {
        let peer_link = self.peer(peer);
        self.bounded(peer, peer_link.call(&self.security, &EngineAbout {}))
            .await
    }

    /// `call` within the engine's timeout.
    async fn bounded<T>(
        &self,
        peer: &str,
        call: impl std::future::Future<Output = KvResult<T>>,
    ) -> KvResult<T> {
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| {
                Err(KvError::new(
                    Code::RpcTimeout,
                    format!("{peer} did not answer within {:?}", self.timeout),
                ))
            })
    }

    /// How `peer` is reached, made on first use.
    fn peer(&self, peer: &str) -> Arc<Peer> {
        let mut peers = self.peers.lock();
        peers
            .entry(peer.to_string())
            .or_insert_with(|| {
                let pool =
                    ConnPool::new(peer, "engine", Limits::default(), CONNECT_TIMEOUT, MAX_IDLE);
                Arc::new(Peer {
                    name: peer.to_string(),
                    tcp: pool.with_security(self.security.clone()),
                    unix: Mutex::new(if self.same_host {
                        Unix::Untried
                    } else {
                        Unix::Absent
                    }),
                    copies: AtomicBool::new(true),
                    owned: Mutex::default(),
                    reachable: AtomicBool::new(false),
                })
            })
            .clone()
    }
}

/// How one peer is reached.
struct Peer {
    /// Its session id, `host:port`.
    name: String,
    /// Its TCP connections.
    tcp: ConnPool,
    /// Its same-host socket.
    unix: Mutex<Unix>,
    /// Whether the peer copies with this process's memory (until it says
    /// it cannot).
    copies: AtomicBool,
    /// Idle connections driven by callers' threads.
    owned: Mutex<Vec<Owned>>,
    /// Whether the last call through the shared runtime went through:
    /// callers' threads connect on their own only then.
    reachable: AtomicBool,
}

/// What is known of a peer's same-host socket.
enum Unix {
    /// Not tried yet.
    Untried,
    /// There is none (another host or namespace, another user, or off).
    Absent,
    /// It answers; idle connections on it.
    Idle(Vec<FramedConn>),
}

impl Peer {
    /// A connection to the peer, and whether it is on the same-host socket.
    async fn take(&self, security: &Security) -> KvResult<(FramedConn, bool)> {
        let try_unix = match &mut *self.unix.lock() {
            Unix::Absent => false,
            Unix::Untried => true,
            Unix::Idle(idle) => match idle.pop() {
                Some(conn) => return Ok((conn, true)),
                None => true,
            },
        };
        if try_unix {
            if let Some(stream) = local::connect(&self.name).await {
                let limits = Limits::default();
                let conn = FramedConn::connect_unix(stream, &self.name, "engine", limits, security)
                    .await?;
                let mut unix = self.unix.lock();
                if matches!(*unix, Unix::Untried) {
                    *unix = Unix::Idle(Vec::new());
                }
                return Ok((conn, true));
            }
            // Gone, or never there: TCP from now on.
            *self.unix.lock() = Unix::Absent;
        }
        Ok((self.tcp.take().await?, false))
    }

    /// Pipelines a batch's items on `conn` (on the same-host socket when
    /// `unix`): copies with this process's memory while the peer makes
    /// them, the bytes through the connection once it says it cannot.
    async fn run(
        &self,
        conn: &mut FramedConn,
        unix: bool,
        dir: Direction,
        items: &[Transfer],
        locals: &[Option<Arc<Region>>],
        results: &mut [Option<KvResult<()>>],
    ) -> KvResult<()> {
        let copy = unix && self.copies.load(Ordering::Relaxed);
        pipeline(conn, dir, copy, items, locals, results).await?;
        if copy && refused_copies(results) {
            // The peer cannot reach this process's memory: send the bytes
            // through the socket, now and from now on.
            self.copies.store(false, Ordering::Relaxed);
            pipeline(conn, dir, false, items, locals, results).await?;
        }
        Ok(())
    }

    /// Gives back a connection that finished cleanly.
    fn give(&self, conn: FramedConn, unix: bool) {
        if !unix {
            return self.tcp.give(conn);
        }
        if let Unix::Idle(idle) = &mut *self.unix.lock() {
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
    }

    /// Runs one typed call on a connection to the peer.
    async fn call<R: Rpc>(&self, security: &Security, req: &R) -> KvResult<R::Response> {
        let (mut conn, unix) = self.take(security).await?;
        let r = conn.exchange(req).await;
        // An error status leaves the stream in step; a broken one goes.
        if r.is_ok() {
            self.give(conn, unix);
        }
        r?
    }
}

/// Every item's result (one left without is an internal error).
fn finish(results: Vec<Option<KvResult<()>>>) -> Vec<KvResult<()>> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(KvError::from(Code::InternalError))))
        .collect()
}

/// A same-host connection driven by its caller's thread (see
/// [`Engine::transfer_blocking`]), with the runtime that watches its
/// socket (always `Some` until dropped).
struct Owned {
    conn: FramedConn,
    /// Whether `conn` is on the same-host socket (else TCP).
    unix: bool,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        // The engine, and with it its idle connections, may be dropped on
        // a runtime's thread, where a runtime cannot be dropped as usual.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Owned {
    /// Connects to `peer` (on its same-host socket when `unix`, else over
    /// TCP) on a runtime of its own; `None` when that fails.
    fn connect(peer: &str, unix: bool, security: &Security) -> Option<Owned> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        let conn = rt.block_on(async {
            let limits = Limits::default();
            let connect = async {
                if !unix {
                    return FramedConn::connect_with(peer, "engine", limits, security).await;
                }
                let stream = local::connect(peer)
                    .await
                    .ok_or_else(|| KvError::from(Code::RpcFail))?;
                FramedConn::connect_unix(stream, peer, "engine", limits, security).await
            };
            tokio::time::timeout(CONNECT_TIMEOUT, connect)
                .await
                .ok()?
                .ok()
        })?;
        Some(Owned {
            conn,
            unix,
            rt: Some(rt),
        })
    }
}

/// Clears the results of items the peer refused to copy with this
/// process's memory (`NOT_SUPPORTED`), so they go again another way;
/// whether there were any.
fn refused_copies(results: &mut [Option<KvResult<()>>]) -> bool {
    let mut any = false;
    for r in results.iter_mut() {
        if matches!(r, Some(Err(e)) if e.code == Code::NotSupported) {
            *r = None;
            any = true;
        }
    }
    any
}

/// Pipelines the items still without a result on `conn`, filling their
/// results; with `copy`, asking the peer to copy with this process's
/// memory (the same-host socket) instead of carrying the bytes. `Err` when
/// the connection broke (it must be dropped); items it had in flight are
/// left without a result for the caller to fail.
async fn pipeline(
    conn: &mut FramedConn,
    dir: Direction,
    copy: bool,
    items: &[Transfer],
    locals: &[Option<Arc<Region>>],
    results: &mut [Option<KvResult<()>>],
) -> KvResult<()> {
    // A copied item keeps its local region pinned until the peer answered:
    // the peer reads or writes that memory until then.
    let mut inflight: std::collections::VecDeque<(usize, u64, &Region, Option<Pin<'_>>)> =
        std::collections::VecDeque::with_capacity(WINDOW);
    // Host copies of GPU memory on their way out, reused item to item.
    let mut staging = Vec::new();
    for (i, t) in items.iter().enumerate() {
        let Some(local) = locals[i].as_deref().filter(|_| results[i].is_none()) else {
            continue;
        };
        if inflight.len() == WINDOW {
            conn.flush().await?;
            if let Some((j, id, at, pin)) = inflight.pop_front() {
                results[j] = Some(answer(conn, dir, pin.is_some(), &items[j], at, id).await?);
            }
        }
        let (id, pin) = if copy && local.memory() == Memory::Host {
            // Not `pin().await`: an unregister waiting for a pin this loop
            // holds would wait for ever behind it.
            let Some(pin) = local.try_pin() else {
                results[i] = Some(Err(unregistered(t.local, t.len)));
                continue;
            };
            let id = match dir {
                Direction::Write => {
                    let req = EngineWriteFromReq {
                        addr: t.remote,
                        len: t.len,
                        caller_addr: t.local,
                    };
                    conn.send_request(&req, &[]).await?
                }
                Direction::Read => {
                    let req = EngineReadIntoReq {
                        addr: t.remote,
                        len: t.len,
                        caller_addr: t.local,
                    };
                    conn.send_request(&req, &[]).await?
                }
            };
            (id, Some(pin))
        } else {
            let id = match dir {
                Direction::Write => {
                    let Some(_pin) = local.pin().await else {
                        results[i] = Some(Err(unregistered(t.local, t.len)));
                        continue;
                    };
                    // SAFETY: inside the local region (checked by
                    // `transfer`), which `_pin` keeps registered until the
                    // bytes are queued or sent.
                    let src = match unsafe { local.load(t.local, t.len, &mut staging) } {
                        Ok(src) => src,
                        Err(e) => {
                            results[i] = Some(Err(e));
                            continue;
                        }
                    };
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
            (id, None)
        };
        inflight.push_back((i, id, local, pin));
    }
    conn.flush().await?;
    while let Some((j, id, at, pin)) = inflight.pop_front() {
        results[j] = Some(answer(conn, dir, pin.is_some(), &items[j], at, id).await?);
    }
    Ok(())
}

/// Reads the answer to one item (a read's bytes into local memory, unless
/// the peer `copied` them). The outer `Err` is a broken connection; the
/// inner one this item's failure.
async fn answer(
    conn: &mut FramedConn,
    dir: Direction,
    copied: bool,
    t: &Transfer,
    local: &Region,
    id: u64,
) -> KvResult<KvResult<()>> {
    if dir == Direction::Write || copied {
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
    // SAFETY: inside the local region (checked by `transfer`).
    unsafe { local.land(conn, t.local, t.len) }.await
}
