//! kvpool's master: the metadata service that places objects on segments,
//! grants read leases, pins and evicts, and tracks client liveness. It never
//! touches payload bytes.
//!
//! The decisions live in pure modules ([`alloc`], [`placement`],
//! [`eviction`]) and in [`state::MasterState`], which takes the time as an
//! argument; this file is the thin shell around them: request dispatch,
//! timers, and the listeners.

pub mod alloc;
pub mod eviction;
pub mod ha;
pub mod http;
pub mod metrics;
pub mod placement;
pub mod state;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kvpool_proto::frame::{Limits, Opcode};
use kvpool_proto::msg::{self, Rpc};
use kvpool_proto::{msg::to_wire, Code, KvError, KvResult};
use kvpool_transfer::server::{serve_control, ControlHandler, ReplyWait};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

pub use metrics::Metrics;
pub use state::{MasterState, StateConfig};

/// Settings of `kvpool master` (flags are defined by the binary).
#[derive(Debug, Clone)]
pub struct MasterConfig {
    /// IP for the RPC listener.
    pub rpc_address: String,
    /// RPC port (Mooncake's default 50051; 0 picks one).
    pub rpc_port: u16,
    /// IP for the metrics/admin HTTP listener.
    pub metrics_address: String,
    /// Metrics/admin port (default 9003; 0 picks one).
    pub metrics_port: u16,
    /// Serve Mooncake's transfer-metadata HTTP service too.
    pub enable_http_metadata_server: bool,
    /// Port of the metadata service (default 8080).
    pub http_metadata_server_port: u16,
    /// Leases, pins, eviction and liveness.
    pub state: StateConfig,
    /// Leadership through etcd; `None` runs a single master.
    pub ha: Option<ha::HaConfig>,
    /// After taking over (or with this set, after any start), object calls
    /// wait this long for the stores to re-mount their inventories.
    pub recovery_grace: Duration,
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            rpc_address: "127.0.0.1".into(),
            rpc_port: 50051,
            metrics_address: "127.0.0.1".into(),
            metrics_port: 9003,
            enable_http_metadata_server: false,
            http_metadata_server_port: 8080,
            state: StateConfig::default(),
            ha: None,
            recovery_grace: Duration::ZERO,
        }
    }
}

/// Why the master could not start.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Bad configuration.
    #[error("{0}")]
    Config(String),
    /// This master led and can no longer be sure it does.
    #[error("lost master leadership: {0}")]
    LostLeadership(String),
}

/// What this master does with requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Serves everything.
    Leader,
    /// Newly leading: stores re-mount; object calls wait until the instant.
    Recovering(Instant),
    /// Another master leads: every call but `Status` is refused (retryable).
    Standby,
}

/// The running master: state, metrics, and the eviction trigger.
pub struct Master {
    /// Object and segment metadata.
    pub state: MasterState,
    /// Counters and gauges.
    pub metrics: Metrics,
    evict_soon: Notify,
    /// Wakes the invalidator when a reply waits on it.
    invalidate_now: Notify,
    /// The invalidation sequence number sent through, for waiting replies.
    invalidated: tokio::sync::watch::Sender<u64>,
    role: parking_lot::Mutex<Role>,
    /// Itself, for timers that outlive a request (delayed unmounts).
    me: std::sync::Weak<Master>,
}

impl Master {
    /// A master with empty state.
    pub fn new(cfg: StateConfig) -> Arc<Self> {
        Arc::new_cyclic(|me| Master {
            state: MasterState::new(cfg),
            metrics: Metrics::default(),
            evict_soon: Notify::new(),
            invalidate_now: Notify::new(),
            invalidated: tokio::sync::watch::Sender::new(0),
            role: parking_lot::Mutex::new(Role::Leader),
            me: me.clone(),
        })
    }

    /// Changes what this master serves.
    pub fn set_role(&self, role: Role) {
        *self.role.lock() = role;
    }

    /// What this master serves now (a finished recovery reads as leader).
    pub fn role(&self) -> Role {
        let mut role = self.role.lock();
        if matches!(*role, Role::Recovering(until) if Instant::now() >= until) {
            info!("recovery grace over; serving objects");
            *role = Role::Leader;
        }
        *role
    }

    /// Refuses what the current role does not serve.
    fn admit(&self, op: Opcode) -> KvResult<()> {
        let membership = matches!(
            op,
            Opcode::Status
                | Opcode::RegisterClient
                | Opcode::Heartbeat
                | Opcode::MountSegment
                | Opcode::ReportObjects
                | Opcode::UnmountSegment
        );
        match self.role() {
            Role::Leader => Ok(()),
            Role::Recovering(_) if membership => Ok(()),
            Role::Recovering(_) => Err(KvError::new(
                Code::UnavailableInCurrentStatus,
                "new master leader: stores are re-mounting, retry shortly",
            )),
            Role::Standby if op == Opcode::Status => Ok(()),
            Role::Standby => Err(KvError::new(
                Code::UnavailableInCurrentStatus,
                "this master is a standby; the leader is published in etcd",
            )),
        }
    }
}

/// Decodes `meta` as `R`, runs `f`, encodes the answer.
fn typed<R: Rpc>(meta: &[u8], f: impl FnOnce(R) -> R::Response) -> KvResult<Vec<u8>> {
    let req: R = msg::decode(meta)?;
    Ok(msg::encode(&f(req)))
}

fn wire<T>(v: Vec<KvResult<T>>) -> Vec<msg::WireResult<T>> {
    v.into_iter().map(to_wire).collect()
}

fn failed<T>(v: &[KvResult<T>]) -> usize {
    v.iter().filter(|r| r.is_err()).count()
}

impl Master {
    /// Waits (at most [`FENCE_WAIT`]) until invalidations through `seq` were sent.
    fn wait_invalidated(&self, seq: u64) -> ReplyWait {
        let mut sent = self.invalidated.subscribe();
        self.invalidate_now.notify_one();
        Box::pin(async move {
            let _ = tokio::time::timeout(FENCE_WAIT, sent.wait_for(|&s| s >= seq)).await;
        })
    }
}

/// Longest a reply waits for old versions to be destroyed; a store that
/// slow is unreachable, and the master retries it in the background.
const FENCE_WAIT: Duration = Duration::from_secs(2);

impl ControlHandler for Master {
    /// A commit or a removal is reported once the key's old versions are
    /// destroyed on their stores, so no client's cached location can read
    /// them afterwards.
    fn handle(&self, op: Opcode, meta: &[u8]) -> (KvResult<Vec<u8>>, Option<ReplyWait>) {
        let mut fence = None;
        let start = std::time::Instant::now();
        let r = if self.may_take_long(op) {
            off_the_runtime(|| self.answer(op, meta, &mut fence))
        } else {
            self.answer(op, meta, &mut fence)
        };
        self.metrics.observe_handling(op, start.elapsed());
        let wait = fence
            .filter(|_| r.is_ok())
            .map(|seq| self.wait_invalidated(seq));
        (r, wait)
    }
}

/// Runs `f`, which may take long, without holding up the other tasks of
/// this runtime worker (heartbeats above all): on a multi-threaded runtime
/// the worker hands its queue to another thread first.
fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl Master {
    /// Requests whose work grows with the number of keys: inventories,
    /// unmounts, bulk removals, status, and puts that may evict inline.
    fn may_take_long(&self, op: Opcode) -> bool {
        match op {
            Opcode::ReportObjects
            | Opcode::MountSegment
            | Opcode::UnmountSegment
            | Opcode::RemoveAll
            | Opcode::RemoveByRegex
            | Opcode::Status => true,
            Opcode::PutStart => self.state.above_watermark(),
            _ => false,
        }
    }

    /// Handles one request; sets `fence` to the invalidation sequence number
    /// the reply must wait for, if any.
    fn answer(&self, op: Opcode, meta: &[u8], fence: &mut Option<u64>) -> KvResult<Vec<u8>> {
        self.admit(op)?;
        let now = Instant::now();
        let s = &self.state;
        let m = &self.metrics;
        let r = match op {
            Opcode::RegisterClient => typed(meta, |r: msg::RegisterClient| {
                info!(client = %r.client_id, hostname = %r.hostname, "client registered");
                m.record(op, 0, 0);
                s.register_client(r.client_id, &r.hostname, now)
            }),
            Opcode::Heartbeat => typed(meta, |r: msg::Heartbeat| msg::HeartbeatReply {
                known: s.heartbeat(r.client_id, now),
            }),
            Opcode::MountSegment => {
                let r: msg::MountSegment = msg::decode(meta)?;
                let age = Duration::from_millis(r.scan_age_ms);
                s.mount_scanned(r.client_id, r.segment, r.objects, age, now)
                    .map(|()| msg::encode(&()))
            }
            Opcode::ReportObjects => {
                let r: msg::ReportObjects = msg::decode(meta)?;
                s.report_objects(r.client_id, r.segment, r.objects, r.last, now)
                    .map(|v| msg::encode(&v))
            }
            Opcode::DrainSegment => {
                let r: msg::DrainSegment = msg::decode(meta)?;
                let ids = s.drain(&r.segment);
                if ids.is_empty() {
                    return Err(KvError::new(
                        Code::SegmentNotFound,
                        format!("no segment named {:?}", r.segment),
                    ));
                }
                info!(segment = %r.segment, unmount_after_ms = ?r.unmount_after_ms, "segment draining");
                if let (Some(ms), Some(me)) = (r.unmount_after_ms, self.me.upgrade()) {
                    let ids = ids.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        for id in ids {
                            me.state.unmount_admin(id);
                        }
                    });
                }
                Ok(msg::encode(&ids))
            }
            Opcode::UnmountSegment => {
                let r: msg::UnmountSegment = msg::decode(meta)?;
                s.unmount(r.client_id, r.segment).map(|()| msg::encode(&()))
            }
            Opcode::PutStart => {
                let out = typed(meta, |r: msg::PutStart| {
                    let v = s.put_start(r.client_id, &r.items, &r.config, r.upsert, now);
                    m.record(op, v.len(), failed(&v));
                    wire(v)
                });
                if s.above_watermark() {
                    self.evict_soon.notify_one();
                }
                out
            }
            Opcode::PutEnd => typed(meta, |r: msg::PutEnd| {
                let v = s.put_end(r.client_id, &r.items, now);
                *fence = s.fence(r.items.iter().map(|i| i.key.as_str()));
                m.record(op, v.len(), failed(&v));
                wire(v)
            }),
            Opcode::PutRevoke => typed(meta, |r: msg::PutRevoke| {
                let v = s.put_revoke(r.client_id, &r.keys);
                m.record(op, v.len(), failed(&v));
                wire(v)
            }),
            Opcode::GetReplicaList => typed(meta, |r: msg::GetReplicaList| {
                let v = s.get_replica_list(&r.keys, now);
                m.record(op, v.len(), failed(&v));
                wire(v)
            }),
            Opcode::Exist => typed(meta, |r: msg::Exist| {
                let v = s.exist(&r.keys);
                m.record(op, v.len(), 0);
                wire(v)
            }),
            Opcode::Touch => typed(meta, |r: msg::Touch| {
                let v = s.touch(&r.items, now);
                // A touch of a replaced version is no failure: the client just
                // stops using that location.
                m.record(op, v.len(), 0);
                v
            }),
            Opcode::Remove => typed(meta, |r: msg::Remove| {
                let v = s.remove(&r.keys, r.force, now);
                *fence = s.fence(r.keys.iter().map(String::as_str));
                m.record(op, v.len(), failed(&v));
                wire(v)
            }),
            Opcode::RemoveByRegex => {
                let r: msg::RemoveByRegex = msg::decode(meta)?;
                let re = regex::Regex::new(&r.pattern)
                    .map_err(|e| KvError::new(Code::InvalidParams, format!("bad regex: {e}")))?;
                m.record(op, 0, 0);
                let removed = s.remove_matching(|k| re.is_match(k), r.force, now);
                *fence = s.fence_all();
                Ok(msg::encode(&removed))
            }
            Opcode::RemoveAll => typed(meta, |r: msg::RemoveAll| {
                m.record(op, 0, 0);
                let removed = s.remove_matching(|_| true, r.force, now);
                *fence = s.fence_all();
                removed
            }),
            Opcode::Status => typed(meta, |_: msg::Status| {
                let mut st = s.status();
                st.role = match self.role() {
                    Role::Leader => "leader",
                    Role::Recovering(_) => "recovering",
                    Role::Standby => "standby",
                }
                .into();
                st
            }),
            Opcode::Hello => Err(KvError::new(Code::InvalidParams, "handshake already done")),
            Opcode::Write | Opcode::Read | Opcode::Invalidate => Err(KvError::new(
                Code::NotSupported,
                "the master does not serve data; write to the segment's endpoint",
            )),
        };
        if r.is_err() {
            m.record(op, 1, 1);
        }
        r
    }
}

/// A started master: where it listens, and a way to wait for it to stop.
pub struct MasterHandle {
    /// RPC listener address.
    pub rpc_addr: SocketAddr,
    /// Metrics/admin HTTP address.
    pub admin_addr: SocketAddr,
    /// Transfer-metadata HTTP address, when enabled.
    pub metadata_addr: Option<SocketAddr>,
    /// The master itself (for in-process use and tests).
    pub master: Arc<Master>,
    tasks: TaskTracker,
    ha: Option<tokio::task::JoinHandle<Result<(), MasterError>>>,
}

impl MasterHandle {
    /// Waits until every listener and timer has stopped (after shutdown, or
    /// after leadership was lost, which is the error returned).
    pub async fn stopped(self) -> Result<(), MasterError> {
        let ha = match self.ha {
            Some(h) => h
                .await
                .unwrap_or_else(|e| Err(MasterError::Config(e.to_string()))),
            None => Ok(()),
        };
        self.tasks.wait().await;
        ha
    }
}

async fn bind(ip: &str, port: u16) -> Result<TcpListener, MasterError> {
    TcpListener::bind((ip, port))
        .await
        .map_err(|source| MasterError::Bind {
            addr: format!("{ip}:{port}"),
            source,
        })
}

/// Binds every listener and starts serving until `shutdown`.
pub async fn start(
    cfg: MasterConfig,
    shutdown: CancellationToken,
) -> Result<MasterHandle, MasterError> {
    let st = &cfg.state;
    if !(st.high_watermark > 0.0 && st.high_watermark <= 1.0) {
        return Err(MasterError::Config(format!(
            "eviction high watermark ratio {} not in (0, 1]",
            st.high_watermark
        )));
    }
    if !(st.eviction_ratio > 0.0 && st.eviction_ratio <= 1.0) {
        return Err(MasterError::Config(format!(
            "eviction ratio {} not in (0, 1]",
            st.eviction_ratio
        )));
    }
    if st.client_ttl.is_zero() || st.lease_ttl.is_zero() {
        return Err(MasterError::Config(
            "client TTL and lease TTL must be positive".into(),
        ));
    }
    let rpc = bind(&cfg.rpc_address, cfg.rpc_port).await?;
    let admin = bind(&cfg.metrics_address, cfg.metrics_port).await?;
    let metadata = if cfg.enable_http_metadata_server {
        Some(bind(&cfg.rpc_address, cfg.http_metadata_server_port).await?)
    } else {
        None
    };
    let local = |l: &TcpListener| {
        l.local_addr()
            .map_err(|e| MasterError::Config(e.to_string()))
    };
    let rpc_addr = local(&rpc)?;
    let admin_addr = local(&admin)?;
    let metadata_addr = metadata.as_ref().map(local).transpose()?;

    let master = Master::new(cfg.state.clone());
    if !cfg.recovery_grace.is_zero() {
        master.set_role(Role::Recovering(Instant::now() + cfg.recovery_grace));
    }
    // Losing leadership stops this master's servers, not the caller's token.
    let shutdown = shutdown.child_token();
    let ha = match cfg.ha.clone() {
        None => None,
        Some(ha_cfg) => {
            if rpc_addr.ip().is_unspecified() {
                return Err(MasterError::Config(
                    "--enable-ha needs a routable --rpc-address to publish, not 0.0.0.0".into(),
                ));
            }
            master.set_role(Role::Standby);
            let (m, token) = (master.clone(), shutdown.clone());
            let grace = if cfg.recovery_grace.is_zero() {
                // Two heartbeats: every live store has re-mounted by then.
                cfg.state.client_ttl / 2
            } else {
                cfg.recovery_grace
            };
            Some(tokio::spawn(async move {
                let r = ha::run(m, ha_cfg, rpc_addr.to_string(), grace, token.clone()).await;
                if r.is_err() {
                    token.cancel();
                }
                r
            }))
        }
    };
    let tasks = TaskTracker::new();
    tasks.spawn(serve_control(
        rpc,
        master.clone(),
        "master",
        Limits::default(),
        shutdown.clone(),
    ));
    let router = http::admin_router(master.clone());
    let token = shutdown.clone();
    tasks.spawn(async move {
        if let Err(e) = http::serve(admin, router, token).await {
            tracing::error!(error = %e, "admin HTTP server failed");
        }
    });
    if let Some(l) = metadata {
        let token = shutdown.clone();
        tasks.spawn(async move {
            if let Err(e) = http::serve(l, http::metadata_router(), token).await {
                tracing::error!(error = %e, "metadata HTTP server failed");
            }
        });
    }
    tasks.spawn(sweeper(master.clone(), shutdown.clone()));
    tasks.spawn(evictor(master.clone(), shutdown.clone()));
    tasks.spawn(invalidator(master.clone(), shutdown.clone()));
    tasks.close();
    info!(%rpc_addr, %admin_addr, metadata = ?metadata_addr, "master listening");
    Ok(MasterHandle {
        rpc_addr,
        admin_addr,
        metadata_addr,
        master,
        tasks,
        ha,
    })
}

/// Runs a master until `shutdown`.
pub async fn run(cfg: MasterConfig, shutdown: CancellationToken) -> Result<(), MasterError> {
    start(cfg, shutdown).await?.stopped().await
}

/// Expires silent clients, stale puts and ended leases. A tick that comes
/// late means this master did not run (paused, or starved of CPU): the
/// heartbeats sent meanwhile wait unread in its sockets, so that time is
/// not counted as the clients' silence.
async fn sweeper(master: Arc<Master>, shutdown: CancellationToken) {
    let period = (master.state.config().client_ttl / 8)
        .clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let late = now.saturating_duration_since(last).saturating_sub(period);
        last = now;
        if late > period {
            tracing::warn!(
                late_ms = late.as_millis() as u64,
                "master stalled; not counting the stall against clients"
            );
            master.state.forgive_stall(late, now);
        }
        master.state.sweep(now);
    }
}

/// Delivers freed and replaced versions to their stores, which destroy the
/// objects there so that neither a restart nor a cached location can bring
/// them back. Runs every 20 ms, or at once when a reply waits on it. A
/// store that cannot be reached gets them again later (or reconciles on
/// remount).
async fn invalidator(master: Arc<Master>, shutdown: CancellationToken) {
    let mut pools: HashMap<String, Arc<kvpool_transfer::ConnPool>> = HashMap::new();
    let mut backoff: HashMap<msg::SegmentId, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            _ = master.invalidate_now.notified() => {}
        }
        let now = Instant::now();
        backoff.retain(|_, until| *until > now);
        let (batches, through) = master.state.take_invalidations();
        let mut sends = Vec::new();
        for (id, endpoint, regions) in batches {
            if backoff.contains_key(&id) {
                master.state.requeue_invalidations(id, regions);
                continue;
            }
            let pool = pools
                .entry(endpoint.clone())
                .or_insert_with(|| {
                    Arc::new(kvpool_transfer::ConnPool::new(
                        &endpoint,
                        "master",
                        Limits::default(),
                        Duration::from_secs(2),
                        2,
                    ))
                })
                .clone();
            sends.push(async move {
                let req = msg::InvalidateReq {
                    segment: id,
                    regions,
                };
                let sent = tokio::time::timeout(Duration::from_secs(2), pool.call(&req)).await;
                (matches!(sent, Ok(Ok(_))), req)
            });
        }
        for (ok, req) in futures::future::join_all(sends).await {
            if !ok {
                tracing::debug!(segment = %req.segment, "invalidation not delivered; will retry");
                master.state.requeue_invalidations(req.segment, req.regions);
                backoff.insert(req.segment, now + Duration::from_secs(1));
            }
        }
        master.state.invalidations_sent(through);
        let _ = master.invalidated.send(through);
    }
}

/// Evicts in the background once usage crosses the high watermark, so puts
/// rarely have to evict inline.
async fn evictor(master: Arc<Master>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = master.evict_soon.notified() => {}
        }
        if master.state.above_watermark() {
            let m = master.clone();
            let _ = tokio::task::spawn_blocking(move || m.state.evict(Instant::now(), 0)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpool_proto::msg::{
        ClientId, PutEndItem, PutGrant, PutItem, ReplicateConfig, SegmentId, SegmentInfo,
    };

    fn segment(id: u128) -> SegmentInfo {
        SegmentInfo {
            id: SegmentId(id),
            name: format!("s{id}"),
            endpoint: "127.0.0.1:1".into(),
            base: 4096,
            size: 1 << 20,
            path: None,
        }
    }

    /// The sweeper task, driven by paused tokio time, drops a silent client's
    /// segment and revokes its put, while a heartbeating client survives.
    #[tokio::test(start_paused = true)]
    async fn sweeper_expires_silent_clients_on_paused_time() {
        let cfg = StateConfig {
            client_ttl: Duration::from_secs(10),
            store_grace: Duration::ZERO,
            ..StateConfig::default()
        };
        let master = Master::new(cfg);
        let shutdown = CancellationToken::new();
        tokio::spawn(sweeper(master.clone(), shutdown.clone()));
        let s = &master.state;
        let (silent, alive) = (ClientId(1), ClientId(2));
        s.register_client(silent, "silent", Instant::now());
        s.register_client(alive, "alive", Instant::now());
        s.mount(silent, segment(1), 0).unwrap();
        s.mount(alive, segment(2), 0).unwrap();
        let item = PutItem {
            key: "k".into(),
            value_len: 10,
            region_len: 100,
        };
        let rc = ReplicateConfig {
            preferred_segments: vec!["s2".into()],
            ..Default::default()
        };
        assert!(s.put_start(silent, &[item], &rc, false, Instant::now())[0].is_ok());
        assert_eq!(s.status().pending, 1);

        for _ in 0..9 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(s.heartbeat(alive, Instant::now()));
        }
        // Not yet past the TTL: both still mounted.
        assert_eq!(s.status().segments.len(), 2);
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(s.heartbeat(alive, Instant::now()));
        }
        let st = s.status();
        assert_eq!(st.segments.len(), 1, "silent client's segment must be gone");
        assert_eq!(st.segments[0].info.id, SegmentId(2));
        assert_eq!(st.pending, 0, "silent client's put must be revoked");
        assert_eq!(st.used, 0, "revoked put's region must be freed");
        assert!(!s.heartbeat(silent, Instant::now()));
        shutdown.cancel();
    }

    /// A lease granted under paused time blocks remove until it runs out.
    #[tokio::test(start_paused = true)]
    async fn lease_expires_with_time() {
        let master = Master::new(StateConfig::default());
        let s = &master.state;
        let c = ClientId(7);
        s.register_client(c, "c", Instant::now());
        s.mount(c, segment(1), 0).unwrap();
        let item = PutItem {
            key: "k".into(),
            value_len: 10,
            region_len: 100,
        };
        let grant = s.put_start(
            c,
            &[item],
            &ReplicateConfig::default(),
            false,
            Instant::now(),
        );
        let Ok(PutGrant::Write { generation, .. }) = grant[0] else {
            panic!("{grant:?}");
        };
        let end = PutEndItem {
            key: "k".into(),
            generation,
        };
        s.put_end(c, &[end], Instant::now())[0].as_ref().unwrap();
        s.get_replica_list(&["k".into()], Instant::now())[0]
            .as_ref()
            .unwrap();
        tokio::time::sleep(Duration::from_secs(9)).await;
        let r = s.remove(&["k".into()], false, Instant::now());
        assert_eq!(r[0].as_ref().unwrap_err().code, Code::ObjectHasLease);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(s.remove(&["k".into()], false, Instant::now())[0].is_ok());
    }
}
