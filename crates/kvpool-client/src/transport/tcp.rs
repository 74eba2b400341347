//! The TCP transport: pooled connections per store and the pipelined
//! exchanges of the data plane (`kvpool_transfer::data`) run on them, each
//! under the client's timeout.
//!
//! A connection goes back to its pool only after a clean exchange; one that
//! failed or timed out is dropped, so a half-read answer is never seen by
//! the next caller.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kvpool_net::auth::Security;
use kvpool_net::{ConnPool, FramedConn};
use kvpool_proto::frame::Limits;
use kvpool_proto::{Code, KvError, KvResult};
use kvpool_transfer::data::{read_regions_shared, write_regions, ReadOp, WriteOp};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::fanout::Job;

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

/// Connection pools by store endpoint.
pub(crate) struct Pools {
    stores: Mutex<HashMap<String, Store>>,
    connect_timeout: Duration,
    security: Security,
}

impl Pools {
    /// No pools yet; connections get `connect_timeout` to connect and
    /// handshake, and connect with `security` (TLS, and the key stores ask
    /// for).
    pub(crate) fn new(connect_timeout: Duration, security: Security) -> Self {
        Pools {
            stores: Mutex::new(HashMap::new()),
            connect_timeout,
            security,
        }
    }

    /// Whether the store at `endpoint` is known to be unreachable now (its
    /// last connect failed; see [`kvpool_net::breaker`]).
    pub(crate) fn is_down(&self, endpoint: &str) -> bool {
        let stores = self.stores.lock();
        stores.get(endpoint).is_some_and(|s| s.pool.is_down())
    }

    /// The store at `endpoint` lost a hedged read's race (its reads were
    /// dropped for another replica's answer).
    pub(crate) fn outrun(&self, endpoint: &str) {
        if let Some(s) = self.stores.lock().get_mut(endpoint) {
            s.slow_until = Some(Instant::now() + SLOW_FOR);
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
    pub(crate) fn pool(&self, endpoint: &str) -> Arc<ConnPool> {
        let mut stores = self.stores.lock();
        let store = stores.entry(endpoint.to_string()).or_insert_with(|| Store {
            pool: Arc::new(
                ConnPool::new(
                    endpoint,
                    "client",
                    Limits::default(),
                    self.connect_timeout,
                    IDLE_CONNS_PER_STORE,
                )
                .with_security(self.security.clone())
                .with_breaker(),
            ),
            slow_until: None,
        });
        store.pool.clone()
    }
}

/// Runs one exchange on a pooled connection under `timeout`. `f` hands the
/// connection back (`Some`) only if the exchange completed cleanly; only
/// then is it pooled again.
pub(crate) async fn with_conn<F, Fut, T>(pool: &ConnPool, timeout: Duration, f: F) -> KvResult<T>
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
pub(crate) fn write_job<'a>(
    pool: Arc<ConnPool>,
    timeout: Duration,
    chunk: Vec<(usize, WriteOp<'a>)>,
) -> Job<'a, ()> {
    Box::pin(async move {
        let (idx, ops): (Vec<usize>, Vec<WriteOp>) = chunk.into_iter().unzip();
        let r = with_conn(&pool, timeout, |mut c| async move {
            let r = write_regions(&mut c, &ops).await;
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
pub(crate) fn broken(e: KvError) -> KvError {
    match e.code {
        Code::RpcFail => KvError::new(Code::TransferFail, e.message),
        _ => e,
    }
}

/// One store's reads in a round. They wait in one queue its connections
/// (lanes) take from, so one that runs ahead does more and none idles on a
/// tail. `T` tags each read for its caller.
pub(crate) struct StoreReads<'a, T> {
    pool: Arc<ConnPool>,
    /// Connections reading from the queue at once.
    pub(crate) lanes: usize,
    queue: Mutex<VecDeque<(T, ReadOp<'a>)>>,
    /// Why a lane gave up, reported for the reads no lane took.
    failure: Mutex<Option<KvError>>,
}

impl<'a, T> StoreReads<'a, T> {
    /// `reads` for the store behind `pool`, over `lanes` connections.
    pub(crate) fn new(pool: Arc<ConnPool>, lanes: usize, reads: VecDeque<(T, ReadOp<'a>)>) -> Self {
        StoreReads {
            pool,
            lanes,
            queue: Mutex::new(reads),
            failure: Mutex::new(None),
        }
    }

    /// One lane: takes reads from the queue on one connection until it is
    /// empty or the connection fails. Returns the reads it finished.
    pub(crate) async fn lane(&self, timeout: Duration) -> Vec<(T, ReadOp<'a>, KvResult<()>)> {
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

    /// The store's address.
    pub(crate) fn addr(&self) -> &str {
        self.pool.addr()
    }

    /// The reads no lane took, each with the reason.
    pub(crate) fn unread(self) -> Vec<(T, KvError)> {
        let why = self.failure.into_inner().unwrap_or_else(|| {
            KvError::new(
                Code::TransferFail,
                format!("{} was not reached", self.pool.addr()),
            )
        });
        self.queue
            .into_inner()
            .into_iter()
            .map(|(t, _)| (t, broken(why.clone())))
            .collect()
    }
}
