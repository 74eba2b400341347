//! kvpool's master: the metadata service that places objects on segments,
//! grants read leases, pins and evicts, and tracks client liveness. It never
//! touches payload bytes.
//!
//! The decisions live in pure modules ([`alloc`], [`placement`],
//! [`eviction`]) and in [`state::MasterState`], which takes the time as an
//! argument; this file is the thin shell around them: the configuration
//! and request dispatch, with `start.rs` binding the listeners and
//! spawning the servers and timers.

pub mod alloc;
pub mod events;
pub mod eviction;
pub mod ha;
pub mod http;
pub mod kv_events;
pub mod metrics;
pub mod placement;
pub mod refusals;
pub mod state;
pub mod status_page;

mod handlers;
mod http_auth;
mod start;
mod tasks;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kvpool_net::auth::{Role as PeerRole, Security};
use kvpool_net::capability::CapabilityKey;
use kvpool_net::server::{serve_control, ControlHandler, Peer, ReplyWait};
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

/// Has the C allocator map blocks of 64 KiB and more on their own, and
/// unmap them when freed, in a process that holds a master's metadata.
/// Left alone, glibc raises that threshold each time such a block is
/// freed, so the shards' key arenas, which grow in steps, end up in its
/// heap and every step leaves the block it outgrew resident: 10 bytes per
/// object at 10M objects. Called by `kvpool master` before it builds its
/// state; `kvpool up` leaves the allocator to its data path.
pub fn map_large_allocations() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's settings; any value is
    // accepted or refused by it.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
    }
}

pub use metrics::Metrics;
pub use refusals::{Refusal, Refusals};
pub use start::{run, start, MasterHandle};
pub use state::{ClientLimits, MasterState, Quota, StateConfig, TenantPolicy, Usage};

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
    /// Publish every commit and removal on a ZMQ PUB socket; `None`: off.
    pub kv_events: Option<kv_events::KvEventsConfig>,
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
            kv_events: None,
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
    /// Segments mounted over a protocol older than
    /// [`msg::Capability::KEY_SINCE`]: their stores cannot check grants
    /// bound to a key, so theirs are signed unbound (usually empty; kept
    /// until the segment is mounted by a newer store).
    unbound: parking_lot::RwLock<std::collections::HashSet<msg::SegmentId>>,
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
            unbound: Default::default(),
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
            // and is rejected when it is reconciled (evicted meanwhile, the
            // upsert leaves a tombstone that rejects it). Reads, removals,
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
/// request table, `kvpool_proto::requests`).
fn serving(op: Opcode) -> (Serves, Work) {
    use Opcode as O;
    match op {
        O::Status => (Serves::Always, Work::Long),
        O::RegisterClient | O::Heartbeat => (Serves::Membership, Work::Short),
        O::MountSegment | O::ReportObjects | O::UnmountSegment => (Serves::Membership, Work::Long),
        O::PutStart => (Serves::Writes, Work::MayEvict),
        O::PutEnd | O::PutRevoke => (Serves::Writes, Work::Short),
        // Walks every shard's puts in flight.
        O::PutCancel => (Serves::Writes, Work::Long),
        O::GetReplicaList
        | O::Exist
        | O::ExistLeased
        | O::Touch
        | O::Remove
        | O::DrainSegment
        | O::DrainOwn
        | O::ReplicaAdd
        | O::ReplicaCommit
        | O::ReplicaClear
        | O::TaskCreate
        | O::TaskUpdate
        | O::TaskQuery => (Serves::Objects, Work::Short),
        // ListKeys walks up to 64k slots: off the runtime's workers.
        O::RemoveByRegex | O::RemoveAll | O::ListKeys => (Serves::Objects, Work::Long),
        // Refused by `Opcode::admit` (another plane) before they get here.
        O::Hello
        | O::Auth
        | O::Write
        | O::Read
        | O::Invalidate
        | O::StoreAbout
        | O::TierMove
        | O::TierMoveCancel
        | O::EngineWrite
        | O::EngineRead
        | O::EngineNotify
        | O::EngineAbout
        | O::EngineWriteFrom
        | O::EngineReadInto => (Serves::Objects, Work::Short),
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
                let now = Instant::now();
                let look = w.next_look(now);
                tokio::select! {
                    r = sent.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep_until(look) => if look >= w.until { return },
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
        peer: &Peer,
        op: Opcode,
        meta: &[u8],
    ) -> (KvResult<Vec<u8>>, Option<ReplyWait>) {
        if let Err(e) = op.admit(Plane::Control, peer.role) {
            self.metrics.record(op, 1, 1);
            return (Err(e), None);
        }
        let mut fence: Option<state::FenceWait> = None;
        let start = std::time::Instant::now();
        let r = if self.may_take_long(op) {
            off_the_runtime(|| self.answer(op, peer, meta, &mut fence))
        } else {
            self.answer(op, peer, meta, &mut fence)
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

    /// Its `--tenant-quota` `connections`, if it has one.
    fn tenant_connections(&self, name: &str) -> Option<usize> {
        let n = self.state.config().tenants.quota(name).connections;
        (n != u64::MAX).then(|| usize::try_from(n).unwrap_or(usize::MAX))
    }
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

    /// Handles one request from a peer that proved `peer`; sets `fence` to
    /// the invalidation sequence number the reply must wait for, if any.
    fn answer(
        &self,
        op: Opcode,
        peer: &Peer,
        meta: &[u8],
        fence: &mut Option<state::FenceWait>,
    ) -> KvResult<Vec<u8>> {
        let now = Instant::now();
        let role = self.admit(op, now)?;
        let mut cx = Ctx {
            master: self,
            now,
            role,
            peer,
            fence: None,
        };
        let cx = &mut cx;
        let r = handle(cx, op, meta);
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

#[cfg(test)]
mod tests;
