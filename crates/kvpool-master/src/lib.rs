//! kvpool's master: the metadata service that places objects on segments,
//! grants read leases, pins and evicts, and tracks client liveness. It never
//! touches payload bytes.
//!
//! The decisions live in pure modules ([`alloc`], [`placement`],
//! [`eviction`]) and in [`state::MasterState`], which takes the time as an
//! argument; this file is the thin shell around them: request dispatch,
//! timers, and the listeners.

pub mod alloc;
pub mod events;
pub mod eviction;
pub mod ha;
pub mod http;
pub mod metrics;
pub mod placement;
pub mod refusals;
pub mod state;
pub mod status_page;

mod handlers;
mod http_auth;
mod tasks;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kvpool_net::auth::{Role as PeerRole, Security};
use kvpool_net::capability::CapabilityKey;
use kvpool_net::server::{serve_control, ControlHandler, ReplyWait};
use kvpool_proto::frame::{Limits, Opcode};
use kvpool_proto::msg;
use kvpool_proto::Plane;
use kvpool_proto::{Code, KvError, KvResult};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use handlers::{handle, Ctx};

pub use metrics::Metrics;
pub use refusals::{Refusal, Refusals};
pub use state::{ClientLimits, MasterState, StateConfig};

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
    /// Connection, timeout and size limits of the HTTP listeners.
    pub http: http::HttpLimits,
    /// Leases, pins, eviction and liveness.
    pub state: StateConfig,
    /// Leadership through etcd; `None` runs a single master.
    pub ha: Option<ha::HaConfig>,
    /// After taking over (or with this set, after any start), object calls
    /// wait this long for the stores to re-mount their inventories.
    pub recovery_grace: Duration,
    /// The cluster key peers must prove (admin: it verifies every role).
    pub security: Security,
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
            http: http::HttpLimits::default(),
            state: StateConfig::default(),
            ha: None,
            recovery_grace: Duration::ZERO,
            security: Security::default(),
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
    /// Newly leading: stores re-mount; object calls wait until the instant
    /// (and until every listed segment is back), except upserts (see
    /// `Master::admit`).
    Recovering(Instant),
    /// Another master leads: every call but `Status` is refused (retryable).
    Standby,
}

impl Role {
    /// The name status and metrics show: `leader`, `recovering` or `standby`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Recovering(_) => "recovering",
            Role::Standby => "standby",
        }
    }
}

/// The running master: state, metrics, and the eviction trigger.
pub struct Master {
    /// Object and segment metadata.
    pub state: MasterState,
    /// Counters and gauges.
    pub metrics: Metrics,
    /// The last minutes of rates, for the status page.
    pub history: status_page::History,
    /// Signs the regions handed out for data-plane access; `None` without
    /// a secret (stores then check nothing).
    grants: Option<CapabilityKey>,
    evict_soon: Notify,
    /// Wakes the invalidator when a reply waits on it.
    invalidate_now: Notify,
    /// The invalidation sequence number sent through, for waiting replies.
    invalidated: tokio::sync::watch::Sender<u64>,
    role: parking_lot::Mutex<Role>,
    /// With HA: the instant the leadership lease may lapse, after which
    /// another master may lead; nothing but `Status` is served past it.
    lead_until: parking_lot::Mutex<Option<Instant>>,
    /// A recovery past its grace waits for missing segments (said once).
    recovery_held: std::sync::atomic::AtomicBool,
    /// Itself, for timers that outlive a request (delayed unmounts).
    me: std::sync::Weak<Master>,
    /// Timers started by requests; waited for when the master stops.
    background: TaskTracker,
    /// Fires when the master stops.
    shutdown: CancellationToken,
}

impl Master {
    /// A master with empty state.
    pub fn new(cfg: StateConfig) -> Arc<Self> {
        Self::with_shutdown(cfg, None, CancellationToken::new())
    }

    /// A master with empty state, signing grants with `grants`, whose
    /// timers stop with `shutdown`.
    fn with_shutdown(
        cfg: StateConfig,
        grants: Option<CapabilityKey>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let state = MasterState::new(cfg);
        let metrics = Metrics::new(state.refusals());
        Arc::new_cyclic(|me| Master {
            state,
            metrics,
            history: Default::default(),
            grants,
            evict_soon: Notify::new(),
            invalidate_now: Notify::new(),
            invalidated: tokio::sync::watch::Sender::new(0),
            role: parking_lot::Mutex::new(Role::Leader),
            lead_until: parking_lot::Mutex::new(None),
            recovery_held: Default::default(),
            me: me.clone(),
            background: TaskTracker::new(),
            shutdown,
        })
    }

    /// Changes what this master serves.
    pub fn set_role(&self, role: Role) {
        *self.role.lock() = role;
        self.recovery_held
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets how long this master may be sure it leads (`None`: no HA, always).
    pub fn lead_until(&self, until: Option<Instant>) {
        *self.lead_until.lock() = until;
    }

    /// What this master serves now. A recovery ends as soon as every
    /// segment the previous leader listed is back, or when its grace is
    /// over in [`Master::recovery_tick`], which knows whether this master ran.
    pub fn role(&self, _now: Instant) -> Role {
        let mut role = self.role.lock();
        if matches!(*role, Role::Recovering(_)) && self.state.recovered() {
            info!("every segment mounted before the failover is back; serving objects");
            *role = Role::Leader;
        }
        *role
    }

    /// Ends a recovery whose grace is over. Time in which this master did
    /// not run (`stalled`: paused, starved of CPU) extends the grace: the
    /// stores could not re-mount with a master that did not answer, and
    /// serving before they did would answer "not found" for what they hold.
    ///
    /// Nor does it end while segments the previous leader listed are not
    /// back (see `state/membership.rs`); they are given up after the client
    /// TTL and the store grace, as silent stores are.
    pub(crate) fn recovery_tick(&self, now: Instant, stalled: Duration) {
        let mut role = self.role.lock();
        if let Role::Recovering(until) = *role {
            let until = until + stalled;
            let missing = self.state.expecting();
            if now >= until && missing == 0 {
                info!("recovery grace over; serving objects");
                *role = Role::Leader;
            } else {
                let held = now >= until;
                if held
                    && !self
                        .recovery_held
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!(missing, "recovery grace over, but segments mounted before the failover are not back; object calls wait for them (at most the client TTL and the store grace)");
                }
                *role = Role::Recovering(until);
            }
        }
    }

    /// Refuses what the current role does not serve; returns the role the
    /// request is served under.
    fn admit(&self, op: Opcode, now: Instant) -> KvResult<Role> {
        let (serves, _) = serving(op);
        // A leader cut off from etcd, or paused past its lease, must not
        // serve beside the master that took over: not even membership,
        // which would pull stores away from the real leader.
        if serves != Serves::Always && (*self.lead_until.lock()).is_some_and(|until| now >= until) {
            return Err(KvError::new(
                Code::UnavailableInCurrentStatus,
                "this master's leadership lease may have lapsed; the leader is published in etcd",
            ));
        }
        let role = self.role(now);
        match (role, serves) {
            (Role::Leader, _) | (_, Serves::Always) => Ok(role),
            (Role::Recovering(_), Serves::Membership) => Ok(role),
            // Upserts go as soon as one segment takes new objects: an
            // upsert's version is newer than any an earlier leader issued,
            // so the copy of the key a late segment brings back is older
            // and is rejected when it is reconciled. Reads, removals,
            // existence and write-once puts (refused in their handler) wait
            // for every segment: each would answer for a key a late segment
            // may still hold.
            (Role::Recovering(_), Serves::Writes) if self.state.takes_new_objects(now) => Ok(role),
            (Role::Recovering(_), _) => Err(KvError::new(
                Code::UnavailableInCurrentStatus,
                "new master leader: stores are re-mounting, retry shortly",
            )),
            (Role::Standby, _) => Err(KvError::new(
                Code::UnavailableInCurrentStatus,
                "this master is a standby; the leader is published in etcd",
            )),
        }
    }
}

/// When a master that is not a serving leader still answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serves {
    /// Always, standby included: status.
    Always,
    /// While recovering too: stores re-mount, clients register.
    Membership,
    /// While recovering once a segment takes new objects: puts (upserts).
    Writes,
    /// Only as the serving leader.
    Objects,
}

/// Whether a request's work grows with the number of keys (and so runs off
/// the runtime worker, see [`off_the_runtime`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// Short critical sections.
    Short,
    /// Grows with the keys or segments involved.
    Long,
    /// Long when the pool is above its watermark: it may evict inline.
    MayEvict,
}

/// How the master serves each request. One exhaustive match, so a new
/// request must decide both (the roles that may send it are in the
/// request table, `kvpool_proto::frame`).
fn serving(op: Opcode) -> (Serves, Work) {
    use Opcode as O;
    match op {
        O::Status => (Serves::Always, Work::Long),
        O::RegisterClient | O::Heartbeat => (Serves::Membership, Work::Short),
        O::MountSegment | O::ReportObjects | O::UnmountSegment => (Serves::Membership, Work::Long),
        O::PutStart => (Serves::Writes, Work::MayEvict),
        O::PutEnd | O::PutRevoke => (Serves::Writes, Work::Short),
        O::GetReplicaList
        | O::Exist
        | O::Touch
        | O::Remove
        | O::DrainSegment
        | O::ReplicaAdd
        | O::ReplicaCommit
        | O::ReplicaClear
        | O::TaskCreate
        | O::TaskUpdate
        | O::TaskQuery => (Serves::Objects, Work::Short),
        O::RemoveByRegex | O::RemoveAll => (Serves::Objects, Work::Long),
        // Refused by `permitted` before they get here.
        O::Hello | O::Auth | O::Write | O::Read | O::Invalidate | O::StoreAbout | O::TierMove => {
            (Serves::Objects, Work::Short)
        }
    }
}

impl Master {
    /// Waits until the invalidations `w` names were delivered, or its time
    /// is up (see [`MasterState::fence`]).
    fn wait_fence(&self, w: state::FenceWait) -> ReplyWait {
        let mut sent = self.invalidated.subscribe();
        self.invalidate_now.notify_one();
        let me = self.me.upgrade();
        Box::pin(async move {
            let Some(me) = me else { return };
            loop {
                if me.state.fence_done(&w, Instant::now()) {
                    return;
                }
                // Every invalidator pass sends on `invalidated`.
                tokio::select! {
                    r = sent.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep_until(w.until) => return,
                }
            }
        })
    }
}

impl ControlHandler for Master {
    /// The client whose heartbeats the connection carries.
    type Conn = Option<msg::ClientId>;

    /// A commit or a removal is reported once the key's old versions are
    /// destroyed on their stores, so no client's cached location can read
    /// them afterwards.
    fn handle(
        &self,
        conn: &mut Option<msg::ClientId>,
        peer: PeerRole,
        op: Opcode,
        meta: &[u8],
    ) -> (KvResult<Vec<u8>>, Option<ReplyWait>) {
        if let Err(e) = permitted(peer, op, meta) {
            self.metrics.record(op, 1, 1);
            return (Err(e), None);
        }
        let mut fence: Option<state::FenceWait> = None;
        let start = std::time::Instant::now();
        let r = if self.may_take_long(op) {
            off_the_runtime(|| self.answer(op, meta, &mut fence))
        } else {
            self.answer(op, meta, &mut fence)
        };
        self.metrics.observe_handling(op, start.elapsed());
        if op == Opcode::Heartbeat && conn.is_none() && r.is_ok() {
            *conn = msg::decode::<msg::Heartbeat>(meta)
                .ok()
                .map(|h| h.client_id);
        }
        let wait = fence.filter(|_| r.is_ok()).map(|w| self.wait_fence(w));
        (r, wait)
    }

    fn closed(&self, conn: Option<msg::ClientId>) {
        if let Some(id) = conn {
            self.state.hung_up(id);
        }
    }
}

/// Refuses a request the peer's role may not make, by the request table
/// (`kvpool_proto::frame`, closed by default), and a drain with a deadline
/// (a forced unmount), which takes the admin key.
fn permitted(peer: PeerRole, op: Opcode, meta: &[u8]) -> KvResult<()> {
    let forced_unmount = op == Opcode::DrainSegment
        && msg::decode::<msg::DrainSegment>(meta).map_or(true, |d| d.unmount_after_ms.is_some());
    if forced_unmount && peer < PeerRole::Admin {
        return Err(KvError::new(
            Code::Unauthorized,
            format!(
                "{} takes the admin key to unmount; this connection proved {peer}",
                op.name()
            ),
        ));
    }
    op.admit(Plane::Control, peer)
}

/// Runs `f`, which may take long, without holding up the other tasks of
/// this runtime worker (heartbeats above all): on a multi-threaded runtime
/// the worker hands its queue to another thread first.
pub(crate) fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl Master {
    /// Whether `op`'s work may grow with the number of keys now (see
    /// [`Work`]).
    fn may_take_long(&self, op: Opcode) -> bool {
        match serving(op).1 {
            Work::Short => false,
            Work::Long => true,
            Work::MayEvict => self.state.above_watermark(),
        }
    }

    /// Handles one request; sets `fence` to the invalidation sequence number
    /// the reply must wait for, if any.
    fn answer(
        &self,
        op: Opcode,
        meta: &[u8],
        fence: &mut Option<state::FenceWait>,
    ) -> KvResult<Vec<u8>> {
        let now = Instant::now();
        let role = self.admit(op, now)?;
        let mut cx = Ctx {
            master: self,
            now,
            role,
            fence: None,
        };
        let cx = &mut cx;
        let r = match op {
            Opcode::RegisterClient => handle::<msg::RegisterClient>(cx, meta),
            Opcode::Heartbeat => handle::<msg::Heartbeat>(cx, meta),
            Opcode::MountSegment => handle::<msg::MountSegment>(cx, meta),
            Opcode::ReportObjects => handle::<msg::ReportObjects>(cx, meta),
            Opcode::DrainSegment => handle::<msg::DrainSegment>(cx, meta),
            Opcode::UnmountSegment => handle::<msg::UnmountSegment>(cx, meta),
            Opcode::PutStart => handle::<msg::PutStart>(cx, meta),
            Opcode::PutEnd => handle::<msg::PutEnd>(cx, meta),
            Opcode::PutRevoke => handle::<msg::PutRevoke>(cx, meta),
            Opcode::GetReplicaList => handle::<msg::GetReplicaList>(cx, meta),
            Opcode::Exist => handle::<msg::Exist>(cx, meta),
            Opcode::Touch => handle::<msg::Touch>(cx, meta),
            Opcode::Remove => handle::<msg::Remove>(cx, meta),
            Opcode::RemoveByRegex => handle::<msg::RemoveByRegex>(cx, meta),
            Opcode::RemoveAll => handle::<msg::RemoveAll>(cx, meta),
            Opcode::Status => handle::<msg::Status>(cx, meta),
            Opcode::ReplicaAdd => handle::<msg::ReplicaAdd>(cx, meta),
            Opcode::ReplicaCommit => handle::<msg::ReplicaCommit>(cx, meta),
            Opcode::ReplicaClear => handle::<msg::ReplicaClear>(cx, meta),
            Opcode::TaskCreate => handle::<msg::TaskCreate>(cx, meta),
            Opcode::TaskUpdate => handle::<msg::TaskUpdate>(cx, meta),
            Opcode::TaskQuery => handle::<msg::TaskQuery>(cx, meta),
            // Other planes' requests: `permitted` refused them already.
            Opcode::Hello
            | Opcode::Auth
            | Opcode::Write
            | Opcode::Read
            | Opcode::Invalidate
            | Opcode::StoreAbout
            | Opcode::TierMove => Err(KvError::new(
                Code::NotSupported,
                format!("{} is not served by the master", op.name()),
            )),
        };
        *fence = cx.fence.take();
        if r.is_err() {
            self.metrics.record(op, 1, 1);
        }
        r
    }

    /// Unmounts `ids` after `delay` (a drain with a deadline), unless the
    /// master stops first.
    fn unmount_later(&self, ids: Vec<msg::SegmentId>, delay: Duration) {
        let Some(me) = self.me.upgrade() else { return };
        let stop = self.shutdown.clone();
        self.background.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(delay) => {
                    for id in ids {
                        me.state.unmount_admin(id);
                    }
                }
            }
        });
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
        self.master.background.close();
        self.master.background.wait().await;
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
    validate_config(&cfg)?;
    let listeners = bind_listeners(&cfg).await?;
    let (rpc_addr, admin_addr, metadata_addr) = (
        listeners.rpc_addr,
        listeners.admin_addr,
        listeners.metadata_addr,
    );
    // Losing leadership stops this master's servers, not the caller's token.
    let shutdown = shutdown.child_token();
    let master = new_master(&cfg, &shutdown);
    let ha = start_ha(&cfg, &master, rpc_addr, &shutdown)?;
    let tasks = TaskTracker::new();
    spawn_servers(&tasks, &cfg, &master, listeners, &shutdown);
    spawn_background_tasks(&tasks, &cfg, &master, &shutdown);
    tasks.close();
    info!(%rpc_addr, %admin_addr, metadata = ?metadata_addr, "master listening");
    #[cfg(feature = "planted-bugs")]
    kvpool_net::planted::announce();
    Ok(MasterHandle {
        rpc_addr,
        admin_addr,
        metadata_addr,
        master,
        tasks,
        ha,
    })
}

/// Refuses settings that would make the master misbehave, before anything is bound.
fn validate_config(cfg: &MasterConfig) -> Result<(), MasterError> {
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
    if !(st.demote_watermark > 0.0 && st.demote_watermark <= 1.0) {
        return Err(MasterError::Config(format!(
            "demote watermark {} not in (0, 1]",
            st.demote_watermark
        )));
    }
    if st.client_ttl.is_zero() || st.lease_ttl.is_zero() {
        return Err(MasterError::Config(
            "client TTL and lease TTL must be positive".into(),
        ));
    }
    let (l, h) = (&st.limits, &cfg.http);
    if l.max_clients == 0
        || l.max_segments_per_client == 0
        || l.max_pending_per_client == 0
        || h.max_connections == 0
        || h.metadata_max_keys == 0
        || h.header_read_timeout.is_zero()
        || h.request_timeout.is_zero()
    {
        return Err(MasterError::Config(
            "client, connection and metadata limits and HTTP timeouts must be positive".into(),
        ));
    }
    Ok(())
}

/// The master's bound listeners and the addresses they got (port 0 picks one).
struct Listeners {
    rpc: TcpListener,
    admin: TcpListener,
    metadata: Option<TcpListener>,
    rpc_addr: SocketAddr,
    admin_addr: SocketAddr,
    metadata_addr: Option<SocketAddr>,
}

/// Binds the RPC, admin and (when enabled) metadata listeners where `security` allows them.
async fn bind_listeners(cfg: &MasterConfig) -> Result<Listeners, MasterError> {
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
    for (addr, what) in [
        (rpc_addr, "the master RPC"),
        (admin_addr, "the admin HTTP API"),
    ] {
        cfg.security
            .check_listen(addr.ip(), what)
            .map_err(|e| MasterError::Config(e.message))?;
    }
    let metadata_addr = metadata.as_ref().map(local).transpose()?;
    Ok(Listeners {
        rpc,
        admin,
        metadata,
        rpc_addr,
        admin_addr,
        metadata_addr,
    })
}

/// Creates the master's state, holding object calls back for `recovery_grace` if one is set.
fn new_master(cfg: &MasterConfig, shutdown: &CancellationToken) -> Arc<Master> {
    let grants = cfg
        .security
        .credentials
        .as_ref()
        .and_then(CapabilityKey::new);
    let master = Master::with_shutdown(cfg.state.clone(), grants, shutdown.clone());
    if !cfg.recovery_grace.is_zero() {
        master.set_role(Role::Recovering(Instant::now() + cfg.recovery_grace));
    }
    master
}

/// With HA configured, stands the master by and runs the leader election until it ends.
fn start_ha(
    cfg: &MasterConfig,
    master: &Arc<Master>,
    rpc_addr: SocketAddr,
    shutdown: &CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<Result<(), MasterError>>>, MasterError> {
    let Some(ha_cfg) = cfg.ha.clone() else {
        return Ok(None);
    };
    if rpc_addr.ip().is_unspecified() {
        return Err(MasterError::Config(
            "--enable-ha needs a routable --rpc-address to publish, not 0.0.0.0".into(),
        ));
    }
    master.set_role(Role::Standby);
    let (m, token) = (master.clone(), shutdown.clone());
    let etcd_tls = cfg.security.etcd_tls.clone();
    let grace = if cfg.recovery_grace.is_zero() {
        // Two heartbeats or more (every TTL/4, at most 1 s apart): every
        // live store has re-mounted by then.
        cfg.state.client_ttl / 2
    } else {
        cfg.recovery_grace
    };
    Ok(Some(tokio::spawn(async move {
        let r = ha::run(
            m,
            ha_cfg,
            etcd_tls,
            rpc_addr.to_string(),
            grace,
            token.clone(),
        )
        .await;
        if r.is_err() {
            token.cancel();
        }
        r
    })))
}

/// Serves the RPC, admin HTTP and (when enabled) metadata HTTP listeners on `tasks`.
fn spawn_servers(
    tasks: &TaskTracker,
    cfg: &MasterConfig,
    master: &Arc<Master>,
    listeners: Listeners,
    shutdown: &CancellationToken,
) {
    let Listeners {
        rpc,
        admin,
        metadata,
        ..
    } = listeners;
    tasks.spawn(serve_control(
        rpc,
        master.clone(),
        "master",
        Limits::default(),
        cfg.security.clone(),
        shutdown.clone(),
    ));
    let keyring = cfg.security.credentials.as_ref();
    let router = http_auth::protect(
        http::admin_router(master.clone()),
        keyring,
        http_auth::admin_needs,
    );
    let https = (cfg.security.tls.as_ref()).and_then(|t| t.acceptor().cloned());
    let (token, m, limits, tls) = (
        shutdown.clone(),
        master.clone(),
        cfg.http.clone(),
        https.clone(),
    );
    tasks.spawn(async move {
        if let Err(e) = http::serve(admin, router, &limits, tls, m, token).await {
            tracing::error!(error = %e, "admin HTTP server failed");
        }
    });
    if let Some(l) = metadata {
        let (token, m, limits) = (shutdown.clone(), master.clone(), cfg.http.clone());
        let router = http_auth::protect(
            http::metadata_router(&limits, m.clone()),
            keyring,
            http_auth::metadata_needs,
        );
        tasks.spawn(async move {
            if let Err(e) = http::serve(l, router, &limits, https, m, token).await {
                tracing::error!(error = %e, "metadata HTTP server failed");
            }
        });
    }
}

/// Starts the sweeper, evictor, status sampler, invalidator and tierer on `tasks`.
fn spawn_background_tasks(
    tasks: &TaskTracker,
    cfg: &MasterConfig,
    master: &Arc<Master>,
    shutdown: &CancellationToken,
) {
    tasks.spawn(tasks::sweeper(master.clone(), shutdown.clone()));
    tasks.spawn(tasks::evictor(master.clone(), shutdown.clone()));
    tasks.spawn(status_page::sampler(master.clone(), shutdown.clone()));
    // Stores verify the store role at most: the master proves that one.
    let as_store = Security {
        credentials: (cfg.security.credentials.as_ref()).and_then(|c| c.derive(PeerRole::Store)),
        ..cfg.security.clone()
    };
    tasks.spawn(tasks::invalidator(
        master.clone(),
        as_store.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(tasks::tierer(master.clone(), as_store, shutdown.clone()));
}

/// Runs a master until `shutdown`.
pub async fn run(cfg: MasterConfig, shutdown: CancellationToken) -> Result<(), MasterError> {
    start(cfg, shutdown).await?.stopped().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpool_net::server::ControlHandler;
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
            tier: Default::default(),
        }
    }

    /// A store whose heartbeat connection closes (a crash closes it at once)
    /// takes no new objects until it is heard from again, long before its
    /// heartbeats would be missed.
    #[test]
    fn a_store_that_hangs_up_takes_no_new_objects_until_it_is_heard_from() {
        let master = Master::new(StateConfig::default());
        let s = &master.state;
        let (gone, other, writer) = (ClientId(1), ClientId(2), ClientId(3));
        for (id, name) in [(gone, "gone"), (other, "other"), (writer, "writer")] {
            s.register_client(id, name, Instant::now()).unwrap();
        }
        s.mount(gone, segment(1), 0, Instant::now()).unwrap();
        s.mount(other, segment(2), 0, Instant::now()).unwrap();
        let mut conn = None;
        let beat = msg::encode(&msg::Heartbeat {
            client_id: gone,
            io: Default::default(),
            held: Default::default(),
        });
        let (r, _) = master.handle(&mut conn, PeerRole::Admin, Opcode::Heartbeat, &beat);
        r.unwrap();
        assert_eq!(conn, Some(gone), "the connection carries its heartbeats");
        let placed = |key: &str| {
            let item = PutItem {
                key: key.into(),
                value_len: 10,
                region_len: 100,
            };
            let rc = ReplicateConfig {
                preferred_segments: vec!["s1".into()],
                ..Default::default()
            };
            match s
                .put_start(writer, &[item], &rc, false, Instant::now())
                .remove(0)
            {
                Ok(msg::PutGrant::Write { replicas, .. }) => replicas[0].segment,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(placed("a"), SegmentId(1));
        master.closed(conn);
        assert_eq!(
            placed("b"),
            SegmentId(2),
            "hung up: placed elsewhere at once"
        );
        assert!(s.heartbeat(gone, Instant::now()));
        assert_eq!(placed("c"), SegmentId(1), "heard from again: placeable");
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
        tokio::spawn(tasks::sweeper(master.clone(), shutdown.clone()));
        let s = &master.state;
        let (silent, alive) = (ClientId(1), ClientId(2));
        s.register_client(silent, "silent", Instant::now()).unwrap();
        s.register_client(alive, "alive", Instant::now()).unwrap();
        s.mount(silent, segment(1), 0, Instant::now()).unwrap();
        s.mount(alive, segment(2), 0, Instant::now()).unwrap();
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
        // Its region is reused only once its write grant has expired: a
        // write of the silent client may still be on its way.
        assert_eq!(
            st.used, 128,
            "revoked put's region (rounded up) held for the pending TTL"
        );
        assert!(!s.heartbeat(silent, Instant::now()));
        for _ in 0..61 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(s.heartbeat(alive, Instant::now()));
            // The invalidator's part: the region is destroyed once more
            // before it is reused.
            let (_, through) = s.take_invalidations();
            s.invalidations_sent(through);
        }
        assert_eq!(
            s.status().used,
            0,
            "revoked put's region freed after the pending TTL"
        );
        shutdown.cancel();
    }

    /// A drain's delayed unmount is a task of the master: it fires on time,
    /// and never after the master stopped.
    #[tokio::test(start_paused = true)]
    async fn a_drain_deadline_unmounts_unless_the_master_stopped() {
        for stop_first in [false, true] {
            let shutdown = CancellationToken::new();
            let master = Master::with_shutdown(StateConfig::default(), None, shutdown.clone());
            let c = ClientId(1);
            master
                .state
                .register_client(c, "c", Instant::now())
                .unwrap();
            master
                .state
                .mount(c, segment(1), 0, Instant::now())
                .unwrap();
            let drain = msg::encode(&msg::DrainSegment {
                segment: "s1".into(),
                unmount_after_ms: Some(10_000),
            });
            let (r, _) = master.handle(&mut None, PeerRole::Admin, Opcode::DrainSegment, &drain);
            r.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            if stop_first {
                shutdown.cancel();
            }
            tokio::time::sleep(Duration::from_secs(6)).await;
            let mounted = master.state.status().segments.len();
            assert_eq!(
                mounted,
                usize::from(stop_first),
                "stopped first: {stop_first}"
            );
            shutdown.cancel();
            master.background.close();
            master.background.wait().await;
        }
    }

    /// A remove-by-regex is refused before any walk when its pattern is
    /// over 4 KiB or compiles past the size limit; a plain one works.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn regex_removals_are_bounded_before_they_walk() {
        let master = Master::new(StateConfig::default());
        let remove = |pattern: String| {
            let req = msg::encode(&msg::RemoveByRegex {
                pattern,
                force: true,
            });
            master
                .handle(&mut None, PeerRole::Admin, Opcode::RemoveByRegex, &req)
                .0
        };
        let long = remove("a".repeat(4097)).unwrap_err();
        assert_eq!(long.code, Code::InvalidParams);
        assert!(long.message.contains("4096"), "{long}");
        // A few bytes that expand to megabytes of automaton.
        let bomb = remove(r"\w{1000}".into()).unwrap_err();
        assert_eq!(bomb.code, Code::InvalidParams);
        assert!(bomb.message.contains("compiles to more than"), "{bomb}");
        let r = master.state.refusals();
        assert_eq!(r.count(Refusal::RegexPattern), 1);
        assert_eq!(r.count(Refusal::RegexSize), 1);
        let bad = remove("(".into()).unwrap_err();
        assert!(bad.message.contains("bad regex"), "{bad}");
        assert_eq!(
            r.count(Refusal::RegexSize),
            1,
            "a syntax error is no refusal"
        );
        let ok = remove("^k-[0-9]+$".into()).expect("a plain regex");
        assert_eq!(msg::decode::<u64>(&ok).unwrap(), 0);
    }

    /// A batch over the item limit is refused from its length prefix,
    /// whatever its items; one at the limit is answered per key.
    #[test]
    fn batches_over_the_limit_are_refused_whole() {
        let master = Master::new(StateConfig::default());
        let keys = |n: usize| (0..n).map(|i| format!("k{i}")).collect::<Vec<_>>();
        let exist = |n| msg::encode(&msg::Exist { keys: keys(n) });
        let over = master.handle(
            &mut None,
            PeerRole::Admin,
            Opcode::Exist,
            &exist(kvpool_proto::MAX_BATCH_KEYS + 1),
        );
        let e = over.0.unwrap_err();
        assert_eq!(e.code, Code::InvalidParams);
        assert!(e.message.contains("16384"), "{e}");
        assert_eq!(master.state.refusals().count(Refusal::BatchKeys), 1);
        let at = master.handle(
            &mut None,
            PeerRole::Admin,
            Opcode::Exist,
            &exist(kvpool_proto::MAX_BATCH_KEYS),
        );
        let answers: Vec<msg::WireResult<u64>> = msg::decode(&at.0.unwrap()).unwrap();
        assert_eq!(answers.len(), kvpool_proto::MAX_BATCH_KEYS);
        // A claimed count is refused before the bytes for it are looked at.
        let mut lying = msg::encode(&msg::GetReplicaList { keys: keys(1) });
        lying[0] = 0xff;
        lying.insert(1, 0xff);
        let e = master
            .handle(&mut None, PeerRole::Admin, Opcode::GetReplicaList, &lying)
            .0
            .unwrap_err();
        assert!(e.message.contains("exceeds the limit"), "{e}");
    }

    /// A new leader that did not run for part of its recovery grace
    /// (paused, starved) gets that time back before it serves objects: the
    /// chaos harness saw a leader paused through its grace answer "not
    /// found" for objects whose stores had not re-mounted yet, and a put
    /// then replace an acknowledged value.
    #[test]
    fn a_stall_extends_the_recovery_grace() {
        let master = Master::new(StateConfig::default());
        let t0 = Instant::now();
        let s = Duration::from_secs;
        master.set_role(Role::Recovering(t0 + s(1)));
        let exist = msg::encode(&msg::Exist {
            keys: vec!["k".into()],
        });
        let refused = |m: &Master| {
            m.handle(&mut None, PeerRole::Admin, Opcode::Exist, &exist)
                .0
                .is_err_and(|e| e.code == Code::UnavailableInCurrentStatus)
        };
        assert!(refused(&master));
        // Paused for 2 s of the 1 s grace: 1 s of grace is still owed.
        master.recovery_tick(t0 + s(2), s(2));
        assert_eq!(master.role(t0), Role::Recovering(t0 + s(3)));
        assert!(refused(&master));
        master.recovery_tick(t0 + s(3), Duration::ZERO);
        assert_eq!(master.role(t0), Role::Leader);
        assert!(!refused(&master));
    }

    /// A new leader's recovery lasts until every segment its predecessor
    /// listed in etcd is back (and then ends at once, grace or not), or has
    /// been given up after the client TTL and the store grace. The chaos
    /// harness saw a new leader serve while a store was cut off: "not
    /// found" for its keys, old versions of keys whose new one it held, and
    /// removed keys back when it re-mounted with their second replica.
    #[test]
    fn recovery_waits_for_the_segments_the_previous_leader_listed() {
        let cfg = StateConfig {
            client_ttl: Duration::from_secs(2),
            store_grace: Duration::from_secs(30),
            ..StateConfig::default()
        };
        let master = Master::new(cfg);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let st = &master.state;
        st.expect_segments(Some(vec![SegmentId(1), SegmentId(2)]), t0);
        master.set_role(Role::Recovering(t0 + s(1)));
        master.recovery_tick(t0 + s(2), Duration::ZERO);
        assert!(
            matches!(master.role(t0), Role::Recovering(_)),
            "grace over, segments missing"
        );
        let c = ClientId(1);
        st.register_client(c, "store", t0).unwrap();
        st.mount(c, segment(1), 0, t0).unwrap();
        assert!(matches!(master.role(t0), Role::Recovering(_)));
        st.mount(c, segment(2), 0, t0).unwrap();
        assert_eq!(
            master.role(t0),
            Role::Leader,
            "every segment back: serving at once"
        );

        // Given up after TTL + grace.
        let master = Master::new(StateConfig {
            client_ttl: Duration::from_secs(2),
            store_grace: Duration::from_secs(30),
            ..StateConfig::default()
        });
        master.state.expect_segments(Some(vec![SegmentId(9)]), t0);
        master.set_role(Role::Recovering(t0 + s(1)));
        master.recovery_tick(t0 + s(31), Duration::ZERO);
        assert!(matches!(master.role(t0), Role::Recovering(_)));
        master.state.sweep(t0 + s(32));
        master.recovery_tick(t0 + s(32), Duration::ZERO);
        assert_eq!(master.role(t0), Role::Leader);
    }

    /// While a new leader waits for a segment its predecessor listed, it
    /// serves upserts into the segments already back (their versions beat
    /// any copy the late segment brings), and nothing that could answer for
    /// a key the late segment holds: write-once puts, existence, reads.
    #[test]
    fn a_recovering_leader_serves_upserts_once_a_segment_is_back() {
        let master = Master::new(StateConfig::default());
        let t0 = Instant::now();
        let st = &master.state;
        st.expect_segments(Some(vec![SegmentId(1), SegmentId(2)]), t0);
        master.set_role(Role::Recovering(t0));
        let c = ClientId(1);
        st.register_client(c, "client", t0).unwrap();
        let start = |upsert| {
            msg::encode(&msg::PutStart {
                client_id: c,
                op: if upsert { 3 } else { 5 },
                items: vec![msg::PutItem {
                    key: "k".into(),
                    value_len: 10,
                    region_len: 4096,
                }],
                config: Default::default(),
                upsert,
            })
        };
        let code = |op, meta: &[u8]| {
            let r = master.handle(&mut None, PeerRole::Admin, op, meta).0;
            r.err().map(|e| e.code)
        };
        let busy = Some(Code::UnavailableInCurrentStatus);
        assert_eq!(
            code(Opcode::PutStart, &start(true)),
            busy,
            "no segment back"
        );
        st.mount(c, segment(1), 0, t0).unwrap();
        assert!(matches!(master.role(t0), Role::Recovering(_)));
        assert_eq!(code(Opcode::PutStart, &start(true)), None, "an upsert goes");
        assert_eq!(code(Opcode::PutStart, &start(false)), busy, "a put waits");
        let exist = msg::encode(&msg::Exist {
            keys: vec!["k".into()],
        });
        assert_eq!(code(Opcode::Exist, &exist), busy);
        st.mount(c, segment(2), 0, t0).unwrap();
        assert_eq!(master.role(t0), Role::Leader);
        assert_eq!(code(Opcode::PutStart, &start(false)), None);
    }

    /// A leader whose etcd lease may have lapsed (etcd unreachable, or the
    /// leader paused) serves nothing but status, even before it notices and
    /// steps down: another master may lead by then. The chaos harness saw a
    /// leader cut off from etcd keep committing puts after a standby could
    /// have taken over.
    #[test]
    fn a_leader_past_its_lease_serves_only_status() {
        let master = Master::new(StateConfig::default());
        let exist = msg::encode(&msg::Exist {
            keys: vec!["k".into()],
        });
        let answer = |m: &Master, op, meta: &[u8]| m.handle(&mut None, PeerRole::Admin, op, meta).0;
        master.lead_until(Some(Instant::now() + Duration::from_secs(60)));
        assert!(answer(&master, Opcode::Exist, &exist).is_ok());
        master.lead_until(Some(Instant::now()));
        let e = answer(&master, Opcode::Exist, &exist).unwrap_err();
        assert_eq!(e.code, Code::UnavailableInCurrentStatus);
        assert!(e.message.contains("lease"), "{e}");
        let status = msg::encode(&msg::Status {});
        assert!(answer(&master, Opcode::Status, &status).is_ok());
        // Without HA there is no lease to lapse.
        master.lead_until(None);
        assert!(answer(&master, Opcode::Exist, &exist).is_ok());
    }

    /// A lease granted under paused time blocks remove until it runs out.
    #[tokio::test(start_paused = true)]
    async fn lease_expires_with_time() {
        let master = Master::new(StateConfig::default());
        let s = &master.state;
        let c = ClientId(7);
        s.register_client(c, "c", Instant::now()).unwrap();
        s.mount(c, segment(1), 0, Instant::now()).unwrap();
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
        let lease = StateConfig::default().lease_ttl;
        tokio::time::sleep(lease - Duration::from_secs(1)).await;
        let r = s.remove(&["k".into()], false, Instant::now());
        assert_eq!(r[0].as_ref().unwrap_err().code, Code::ObjectHasLease);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(s.remove(&["k".into()], false, Instant::now())[0].is_ok());
    }
}
