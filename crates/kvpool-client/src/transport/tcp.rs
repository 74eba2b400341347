//! The TCP transport: pooled connections per store and the pipelined
//! exchanges of the data plane (`kvpool_transfer::data`) run on them, each
//! under the client's timeout. A batch's writes to one store are cut into
//! chunks, one pipelined connection each; its reads from one store wait in
//! one queue that several connections take from.
//!
//! A connection goes back to its pool only after a clean exchange; one that
//! failed or timed out is dropped, so a half-read answer is never seen by
//! the next caller. The pools also learn which stores are down or slow,
//! which reads use to order replicas.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvpool_format::sealed_header;
use kvpool_net::auth::Security;
use kvpool_net::{ConnPool, FramedConn};
use kvpool_proto::compat::STORES_SEAL;
use kvpool_proto::frame::Limits;
use kvpool_proto::msg::SegmentId;
use kvpool_proto::{Code, KvError, KvResult};
use kvpool_transfer::data::{read_regions_shared, write_regions, ReadOp, WriteOp};
use parking_lot::Mutex;
use tokio::time::Instant;

use super::{Dir, Job, Kind, Read, Share, Spread, Transport, Verify, Write};
use crate::fanout::{lanes, split, tcp_write_lanes};

/// Idle connections kept per store, enough for many concurrent callers.
const IDLE_CONNS_PER_STORE: usize = 64;

/// How long a store that lost a hedged read's race is read after its
/// peers: a store stalled for longer than a hedge is then skipped by
/// replicated reads instead of costing each of them the hedge delay.
const SLOW_FOR: Duration = Duration::from_secs(2);

/// What this client keeps per store: its connections, and until when it
/// ranks after its peers for losing a hedged read's race.
struct Store {
    pool: Arc<ConnPool>,
    slow_until: Option<Instant>,
}

/// The TCP transport: connection pools by store endpoint.
pub struct TcpTransport {
    stores: Mutex<HashMap<String, Store>>,
    connect_timeout: Duration,
    security: Security,
    /// Whether stores on this host are reached through their same-host
    /// socket ([`kvpool_net::local`]) when they have one.
    same_host: bool,
}

impl TcpTransport {
    /// No pools yet; connections get `connect_timeout` to connect and
    /// handshake, and connect with `security` (TLS, and the key stores ask
    /// for); with `same_host`, through a store's same-host socket where it
    /// has one here.
    pub fn new(connect_timeout: Duration, security: Security, same_host: bool) -> Self {
        TcpTransport {
            stores: Mutex::new(HashMap::new()),
            connect_timeout,
            security,
            same_host,
        }
    }

    /// Where reads try the store at `endpoint` among an object's replicas:
    /// 0 for a live one, 1 for one that lost a hedge race lately, 2 for one
    /// known to be down.
    pub(crate) fn rank(&self, endpoint: &str) -> u8 {
        let stores = self.stores.lock();
        match stores.get(endpoint) {
            Some(s) if s.pool.is_down() => 2,
            Some(s) => u8::from(s.slow_until.is_some_and(|t| Instant::now() < t)),
            None => 0,
        }
    }

    /// The pool for the store at `endpoint`, made on first use.
    fn pool(&self, endpoint: &str) -> Arc<ConnPool> {
        let mut stores = self.stores.lock();
        let store = stores.entry(endpoint.to_string()).or_insert_with(|| {
            let pool = ConnPool::new(
                endpoint,
                "client",
                Limits::default(),
                self.connect_timeout,
                IDLE_CONNS_PER_STORE,
            )
            .with_security(self.security.clone())
            .with_breaker();
            let pool = if self.same_host {
                pool.with_same_host(kvpool_net::local::STORE)
            } else {
                pool
            };
            Store {
                pool: Arc::new(pool),
                slow_until: None,
            }
        });
        store.pool.clone()
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> Kind {
        Kind::Tcp
    }

    /// Every store is reached over TCP (or found down by trying).
    fn reaches(&self, _segment: SegmentId, _dir: Dir) -> bool {
        true
    }

    fn write<'a>(&'a self, ops: Vec<Write<'a>>, spread: Spread) -> Vec<Job<'a, ()>> {
        let mut stores: HashMap<String, Vec<(usize, WriteOp<'a>)>> = HashMap::new();
        for w in ops {
            stores.entry(w.peer).or_default().push((w.item, w.op));
        }
        let mut jobs = Vec::new();
        for (peer, group) in stores {
            let bytes: u64 = group.iter().map(|(_, o)| parts_len(&o.parts)).sum();
            let pool = self.pool(&peer);
            let n = tcp_write_lanes(bytes, group.len(), spread.lanes_per_peer);
            for chunk in split(group, n) {
                jobs.push(write_job(pool.clone(), spread.timeout, chunk));
            }
        }
        jobs
    }

    fn read<'a>(
        &'a self,
        ops: Vec<Read<'a>>,
        verify: Verify<'a>,
        spread: Spread,
    ) -> Vec<Share<'a>> {
        let mut stores: HashMap<String, VecDeque<(usize, ReadOp<'a>)>> = HashMap::new();
        for r in ops {
            stores.entry(r.peer).or_default().push_back((r.item, r.op));
        }
        stores
            .into_iter()
            .map(|(peer, queue)| {
                let bytes: u64 = queue.iter().map(|(_, o)| o.req.len).sum();
                let n = lanes(bytes, queue.len(), spread.lanes_per_peer);
                let reads = Arc::new(StoreReads::new(self.pool(&peer), n, queue));
                let jobs = (0..n)
                    .map(|_| read_job(reads.clone(), verify, spread.timeout))
                    .collect();
                Share {
                    peer: Some(peer),
                    jobs,
                }
            })
            .collect()
    }

    /// Known down when its last connect failed (see [`kvpool_net::breaker`]).
    fn is_down(&self, peer: &str) -> bool {
        let stores = self.stores.lock();
        stores.get(peer).is_some_and(|s| s.pool.is_down())
    }

    fn outrun(&self, peer: &str) {
        if let Some(s) = self.stores.lock().get_mut(peer) {
            s.slow_until = Some(Instant::now() + SLOW_FOR);
        }
    }
}

/// Bytes of a write given as parts.
fn parts_len(parts: &[&[u8]]) -> u64 {
    parts.iter().map(|p| p.len() as u64).sum()
}

/// Runs one exchange on a pooled connection under `timeout`. `f` hands the
/// connection back (`Some`) only if the exchange completed cleanly; only
/// then is it pooled again.
async fn with_conn<F, Fut, T>(pool: &ConnPool, timeout: Duration, f: F) -> KvResult<T>
where
    F: FnOnce(FramedConn) -> Fut,
    Fut: Future<Output = (Option<FramedConn>, T)>,
{
    let run = async {
        let conn = pool.take().await?;
        let (back, t) = f(conn).await;
        match back {
            Some(conn) => pool.give(conn),
            // A store that broke one connection (it died or restarted) most
            // likely broke its idle ones too: each would cost the next
            // caller a failed exchange.
            None => pool.clear(),
        }
        Ok(t)
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(r) => r,
        Err(_) => {
            pool.stalled();
            Err(KvError::new(
                Code::RpcTimeout,
                format!("transfer with {} timed out", pool.addr()),
            ))
        }
    }
}

/// A job writing `chunk` (item index, op) pipelined on one connection.
fn write_job<'a>(
    pool: Arc<ConnPool>,
    timeout: Duration,
    chunk: Vec<(usize, WriteOp<'a>)>,
) -> Job<'a, ()> {
    Box::pin(async move {
        let (idx, ops): (Vec<usize>, Vec<WriteOp>) = chunk.into_iter().unzip();
        let r = with_conn(&pool, timeout, |mut c| async move {
            // A store before protocol 9 keeps the checksum a writer sends.
            let heads: Vec<Option<Vec<u8>>> = if c.version() < STORES_SEAL {
                ops.iter().map(|op| sealed_header(&op.parts)).collect()
            } else {
                Vec::new()
            };
            let sealed: Vec<WriteOp> = (ops.iter().zip(&heads))
                .map(|(op, head)| WriteOp {
                    req: op.req,
                    parts: match head {
                        Some(h) => [&h[..], &op.parts[0][h.len()..]]
                            .into_iter()
                            .chain(op.parts[1..].iter().copied())
                            .collect(),
                        None => op.parts.clone(),
                    },
                })
                .collect();
            let ops = if heads.is_empty() { &ops } else { &sealed };
            let r = write_regions(&mut c, ops).await;
            (r.is_ok().then_some(c), r)
        })
        .await
        .and_then(|r| r);
        spread(idx, r)
    })
}

/// Pairs per-op results with item indexes; a broken connection fails them all.
fn spread<T>(idx: Vec<usize>, r: KvResult<Vec<KvResult<T>>>) -> Vec<(usize, KvResult<T>)> {
    match r {
        Ok(v) => idx.into_iter().zip(v).collect(),
        Err(e) => {
            let e = KvError::new(
                if e.code == Code::RpcTimeout {
                    Code::RpcTimeout
                } else {
                    Code::TransferFail
                },
                e.message,
            );
            idx.into_iter().map(|i| (i, Err(e.clone()))).collect()
        }
    }
}

/// A broken connection's error as a transfer failure (retryable); error
/// answers from the store keep their own codes.
fn broken(e: KvError) -> KvError {
    match e.code {
        Code::RpcFail => KvError::new(Code::TransferFail, e.message),
        _ => e,
    }
}

/// One store's reads in a batch. They wait in one queue its connections
/// (lanes) take from, so one that runs ahead does more and none idles on a
/// tail; the last lane to end answers for the reads no lane took.
struct StoreReads<'a> {
    pool: Arc<ConnPool>,
    queue: Mutex<VecDeque<(usize, ReadOp<'a>)>>,
    /// Lanes not yet ended.
    running: AtomicUsize,
    /// Why a lane gave up, reported for the reads no lane took.
    failure: Mutex<Option<KvError>>,
}

impl<'a> StoreReads<'a> {
    /// `reads` for the store behind `pool`, over `lanes` connections.
    fn new(pool: Arc<ConnPool>, lanes: usize, reads: VecDeque<(usize, ReadOp<'a>)>) -> Self {
        StoreReads {
            pool,
            queue: Mutex::new(reads),
            running: AtomicUsize::new(lanes),
            failure: Mutex::new(None),
        }
    }

    /// One lane: takes reads from the queue on one connection until it is
    /// empty or the connection fails. Returns the reads it finished.
    async fn lane(&self, timeout: Duration) -> Vec<(usize, ReadOp<'a>, KvResult<u64>)> {
        let r = with_conn(&self.pool, timeout, |mut conn| async move {
            let (done, broke) = read_regions_shared(&mut conn, &self.queue).await;
            (broke.is_none().then_some(conn), done)
        })
        .await;
        r.unwrap_or_else(|e| {
            *self.failure.lock() = Some(e);
            Vec::new()
        })
    }

    /// The reads no lane took, each with the reason (emptying the queue).
    fn unread(&self) -> Vec<(usize, KvError)> {
        let why = self.failure.lock().clone().unwrap_or_else(|| {
            KvError::new(
                Code::TransferFail,
                format!("{} was not reached", self.pool.addr()),
            )
        });
        let left = std::mem::take(&mut *self.queue.lock());
        left.into_iter()
            .map(|(i, _)| (i, broken(why.clone())))
            .collect()
    }
}

/// One lane of a store's reads, each verified as it lands (so a big batch
/// checksums on every core); the last lane to end also answers for the
/// reads left in the queue.
fn read_job<'a>(
    reads: Arc<StoreReads<'a>>,
    verify: Verify<'a>,
    timeout: Duration,
) -> Job<'a, usize> {
    Box::pin(async move {
        let mut out: Vec<(usize, KvResult<usize>)> = reads
            .lane(timeout)
            .await
            .into_iter()
            .map(|(i, op, r)| (i, r.map_err(broken).and_then(|sum| verify(i, &op.dst, sum))))
            .collect();
        if reads.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            out.extend(reads.unread().into_iter().map(|(i, e)| (i, Err(e))));
        }
        out
    })
}
