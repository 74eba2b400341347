//! The master's metadata: objects (sharded by key hash, one lock per shard),
//! mounted segments with one offset allocator each, registered clients, and
//! regions waiting for a read lease to end before they can be reused.
//!
//! Every operation takes `now` from the caller, so leases, pins and client
//! expiry are tested with synthetic or paused time. Lock order, everywhere:
//! shard, then the segment map, then one segment's allocator; the client map
//! and the deferred-free list are only ever taken alone; the ledger, the
//! tier's move list and the regions waiting for their invalidation are
//! taken last (under a shard, never the other way).
//!
//! One file per concern: `clients` (liveness, the suspect state, expiry),
//! `segments` (mounts, inventories, placement), `objects` (puts, reads,
//! removals), `evict` (LRU eviction), `tiers` (moves between a store's
//! memory and disk), `invalidation` (freed regions and the destruction of
//! their headers on the stores), `ledger` (what each client holds against
//! its limits, and each tenant against its quota: `tenants`) and `membership` (the segments a new leader expects back
//! after a failover).
//!
//! Limits on what one client may hold (registrations, segments, puts in
//! flight, hard-pinned bytes) are checked before anything is reserved, and
//! every refusal is counted in [`Refusals`].

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use kvpool_proto::msg::{ClientId, ClusterStatus, Replica, SegmentId, SegmentStatus};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use tokio::time::Instant;

use crate::alloc::Region;
use crate::refusals::Refusals;

mod clients;
mod evict;
mod invalidation;
mod inventory;
mod keys;
mod ledger;
mod membership;
mod objects;
mod replicas;
mod segments;
mod table;
mod tenants;
mod tiers;
mod tombstones;

use clients::ClientEntry;
pub use clients::ClientInfo;
pub use evict::Evicted;
use invalidation::InvalidationQueue;
pub use invalidation::{FenceWait, Invalidations, FENCE_WAIT};
use ledger::Ledger;
pub use objects::ListPos;
use objects::{Shard, Tick, Version};
pub use segments::MountSpec;
use segments::SegmentSlot;
use table::{SegNo, SegNumbers};
pub use tenants::{Quota, TenantPolicy, Usage};
pub use tiers::MoveTicket;
use tiers::TierState;
pub use tombstones::Tombstone;

/// Enough shards that one holds few keys even at 100M: growing a shard's
/// table copies it under its lock, so its size bounds the longest wait.
const SHARDS: usize = 4096;

/// Timing and eviction settings of the metadata state.
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// Read lease granted by each `GetReplicaList` (Mooncake's default, 5 s:
    /// memory read within a lease cannot be reused, so it bounds how fast a
    /// full segment turns over).
    pub lease_ttl: Duration,
    /// Soft pin duration when a put asks for one without a TTL.
    pub soft_pin_ttl: Duration,
    /// Start evicting when used/capacity reaches this.
    pub high_watermark: f64,
    /// Fraction of capacity freed per eviction pass.
    pub eviction_ratio: f64,
    /// Memory segments of a store with a disk tier are kept below this fill
    /// ratio by moving their least recently used objects to disk (in rounds
    /// of `eviction_ratio` of their capacity).
    pub demote_watermark: f64,
    /// Move an object read twice while on disk back to memory.
    pub promote: bool,
    /// How long the tierer waits for a store's answer to a batch of tier
    /// moves before giving it up (and cancelling it on the store).
    pub tier_move_timeout: Duration,
    /// Silence after which a client is dropped, and a store (a client that
    /// lends segments) becomes suspect: its segments take no new objects,
    /// but its objects stay indexed and readable.
    pub client_ttl: Duration,
    /// How long a suspect store keeps its objects indexed before its
    /// segments are dropped; a heartbeat within it makes it live again with
    /// nothing lost or re-mounted.
    pub store_grace: Duration,
    /// A put not ended within this long is revoked.
    pub pending_ttl: Duration,
    /// What one client may hold.
    pub limits: ClientLimits,
    /// Tenants' quotas and shared namespaces.
    pub tenants: TenantPolicy,
}

/// Limits on what clients may hold, so that no client (or flood of client
/// ids) can exhaust the master; a request beyond one is refused before
/// anything is reserved for it.
#[derive(Debug, Clone)]
pub struct ClientLimits {
    /// Most registered clients (stores included): a new client id beyond it
    /// is refused (`UNAVAILABLE_IN_CURRENT_STATUS`, retryable: stores retry
    /// until a slot frees); registered ones keep working.
    pub max_clients: usize,
    /// Most segments one client may lend (`INVALID_PARAMS` beyond).
    pub max_segments_per_client: usize,
    /// Most puts one client may have started and not ended
    /// (`NO_AVAILABLE_HANDLE` per key beyond).
    pub max_pending_per_client: u64,
    /// Most bytes of hard-pinned objects (committed or in flight, all
    /// replicas) one client may hold (`NO_AVAILABLE_HANDLE` beyond).
    pub max_hard_pinned_per_client: u64,
    /// Most of the memory tier's capacity hard-pinned objects of all
    /// clients together may take (`NO_AVAILABLE_HANDLE` beyond): the rest
    /// stays evictable, so pins (of one client, or of many client ids one
    /// holder registered) can never leave the pool without room for puts.
    pub max_hard_pinned_ratio: f64,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            max_clients: 10_000,
            max_segments_per_client: 64,
            max_pending_per_client: 1_000_000,
            max_hard_pinned_per_client: 64 << 30,
            max_hard_pinned_ratio: 0.5,
        }
    }
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            lease_ttl: Duration::from_secs(5),
            soft_pin_ttl: Duration::from_secs(30 * 60),
            high_watermark: 0.95,
            eviction_ratio: 0.05,
            demote_watermark: 0.9,
            tier_move_timeout: Duration::from_secs(60),
            promote: true,
            client_ttl: Duration::from_secs(10),
            store_grace: Duration::from_secs(30),
            pending_ttl: Duration::from_secs(60),
            limits: ClientLimits::default(),
            tenants: TenantPolicy::default(),
        }
    }
}

/// What `/api/keys/{key}` shows about one object.
#[derive(Debug, Clone, Serialize)]
pub struct KeyInfo {
    /// The key.
    pub key: String,
    /// Value bytes.
    pub value_len: u64,
    /// Put generation.
    pub generation: u64,
    /// Where it lives.
    pub replicas: Vec<Replica>,
    /// Milliseconds left on the read lease (0 = none).
    pub lease_remaining_ms: u64,
    /// Milliseconds left on a soft pin, if any.
    pub soft_pin_remaining_ms: Option<u64>,
    /// Never evicted.
    pub hard_pin: bool,
    /// Milliseconds since written or last read.
    pub idle_ms: u64,
    /// A newer version is being written.
    pub put_in_flight: bool,
}

/// The master's metadata state. All methods are short critical sections.
pub struct MasterState {
    cfg: StateConfig,
    shards: Box<[Mutex<Shard>]>,
    /// By id, so placement reads them in the order it draws from.
    segments: RwLock<BTreeMap<SegmentId, SegmentSlot>>,
    /// The numbers objects name segments by; taken alone, or last.
    numbers: RwLock<SegNumbers>,
    /// The KV event stream every shard's table tells.
    kv_events: Arc<crate::kv_events::KvEvents>,
    clients: Mutex<HashMap<ClientId, ClientEntry>>,
    /// Registered clients whose peer proved only the client role.
    engine_ids: std::sync::atomic::AtomicUsize,
    deferred: Mutex<Vec<Deferred>>,
    /// Regions reused only once the invalidation numbered with them is
    /// sent: the same version may be copied there again (a tier move), and
    /// a late invalidation would destroy that copy.
    after_invalidation: Mutex<Vec<(u64, SegmentId, Region)>>,
    /// Object headers to destroy on their stores, and the keys waiting for it.
    invalidations: Mutex<InvalidationQueue>,
    /// Invalidations up to this sequence number have been sent to stores.
    invalidated_through: AtomicU64,
    /// Once every segment expected back after a failover is back: the
    /// invalidation batch that destroys the last copies they brought back
    /// and this master rejected (see [`Self::recovery_settled`]); `u64::MAX`
    /// while some are expected, or none ever was. Stored before
    /// `expecting` (in `membership.rs`).
    settled_through: AtomicU64,
    /// Segment allocators made so far (see [`Self::allocator_of`]).
    allocators: AtomicU64,
    /// Removals stores may not have heard of (see `tombstones.rs`).
    tombstones: Mutex<tombstones::Tombstones>,
    /// Segments given up, with the keys they held that nobody wrote since
    /// (see [`MasterState::give_up_segment`]).
    given_up: Mutex<HashMap<SegmentId, tombstones::GivenUp>>,
    /// Whether `given_up` holds anything: a commit looks here first.
    any_given_up: AtomicBool,
    /// Keys (by [`Self::key_hash`]) whose tier move finished under a live
    /// read lease, and until when a read through a location cached before
    /// the move may have used the copy it left (see `tiers.rs`).
    moved_leased: Mutex<HashMap<u64, Instant>>,
    /// Whether `moved_leased` holds anything: a touch looks here first.
    any_moved_leased: AtomicBool,
    /// etcd holds the tombstones through this number.
    tombstones_written: AtomicU64,
    /// Tombstones are kept in etcd (HA): a removal waits for its own.
    tombstones_in_etcd: AtomicBool,
    /// Serializes eviction passes so concurrent puts do not evict twice.
    evicting: Mutex<()>,
    /// Generations start at the wall clock in nanoseconds when a master
    /// starts leading and count up by one per put, so every generation ever
    /// issued is below the clock (give or take skew).
    next_generation: AtomicU64,
    /// The first generation of this master's term as leader: a version at or
    /// above it was issued here, so an inventory cannot claim a newer one.
    first_generation: AtomicU64,
    evictions: AtomicU64,
    /// Replicas dropped because a remounted store no longer had them.
    replicas_lost: AtomicU64,
    /// Segments earlier leaders had, and which of them the list in etcd names.
    membership: Mutex<membership::Membership>,
    /// Segments expected back after a failover (a lock-free fast path).
    expecting: std::sync::atomic::AtomicUsize,
    /// Placements so far: each draws its segment order from the next value
    /// (a counter, not an OS random source, so a replay places alike).
    placements: AtomicU64,
    /// Moves between tiers: planned, in flight, and waiting promotions.
    tier: Mutex<TierState>,
    /// A disk segment was ever mounted (reads then note disk-only objects).
    disk_tier: std::sync::atomic::AtomicBool,
    demotions: AtomicU64,
    promotions: AtomicU64,
    /// Clients marked suspect, so reads skip the suspect check when none is.
    suspect_count: std::sync::atomic::AtomicUsize,
    /// Time zero of the [`Tick`]s objects carry.
    epoch: Instant,
    /// When this master began to lead (its start, without HA): read leases
    /// granted by an earlier leader may be in use until half a lease later.
    term_start: Mutex<Instant>,
    /// Picks a key's shard.
    shard_hasher: foldhash::fast::RandomState,
    /// Puts in flight and hard pins per client, against their limits.
    ledger: Arc<Ledger>,
    /// Requests refused by a limit.
    refusals: Refusals,
    /// Replica copies in flight (regions reserved for them); taken alone.
    copies: Mutex<replicas::Copies>,
    /// Replica copy and move tasks; taken alone.
    tasks: Mutex<replicas::TaskTable>,
}

/// A region freed when a read lease ends (the instant), with the generation
/// whose header is destroyed then (`None`: destroyed already).
type Deferred = (Instant, SegmentId, Region, Option<u64>);

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

impl MasterState {
    /// Starts a term as leader at `now`: generations issued from now on are
    /// above every one issued before (by this process or a previous leader).
    pub fn begin_term(&self, now: Instant) {
        *self.term_start.lock() = now;
        let now = wall_nanos();
        use std::sync::atomic::Ordering::Relaxed;
        self.next_generation.fetch_max(now, Relaxed);
        let first = self.next_generation.load(Relaxed);
        self.first_generation.store(first, Relaxed);
    }

    /// The KV event stream of this state's commits and removals.
    pub fn kv_events(&self) -> &Arc<crate::kv_events::KvEvents> {
        &self.kv_events
    }

    /// The tier of segment number `no` (numbers never change meaning).
    pub(crate) fn tier_of(&self, no: u32) -> kvpool_proto::msg::Tier {
        self.numbers.read().tier_of(no)
    }

    /// Empty state with `cfg`.
    pub fn new(cfg: StateConfig) -> Self {
        // Generations only need to differ between versions of one key; starting
        // from the wall clock keeps them increasing across master restarts.
        let start = wall_nanos();
        let ledger = Arc::new(Ledger::default());
        let kv_events = Arc::new(crate::kv_events::KvEvents::default());
        MasterState {
            cfg,
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::new(ledger.clone(), kv_events.clone())))
                .collect(),
            kv_events,
            segments: RwLock::new(BTreeMap::new()),
            numbers: Default::default(),
            clients: Mutex::new(HashMap::new()),
            engine_ids: Default::default(),
            deferred: Mutex::new(Vec::new()),
            after_invalidation: Mutex::new(Vec::new()),
            invalidations: Mutex::new(InvalidationQueue::default()),
            invalidated_through: AtomicU64::new(0),
            settled_through: AtomicU64::new(u64::MAX),
            allocators: AtomicU64::new(0),
            tombstones: Default::default(),
            given_up: Default::default(),
            any_given_up: AtomicBool::new(false),
            moved_leased: Default::default(),
            any_moved_leased: AtomicBool::new(false),
            tombstones_written: AtomicU64::new(0),
            tombstones_in_etcd: AtomicBool::new(false),
            evicting: Mutex::new(()),
            next_generation: AtomicU64::new(start),
            first_generation: AtomicU64::new(start),
            evictions: AtomicU64::new(0),
            replicas_lost: AtomicU64::new(0),
            placements: AtomicU64::new(0),
            membership: Default::default(),
            expecting: Default::default(),
            tier: Mutex::new(TierState::default()),
            disk_tier: Default::default(),
            demotions: AtomicU64::new(0),
            promotions: AtomicU64::new(0),
            suspect_count: Default::default(),
            epoch: Instant::now(),
            term_start: Mutex::new(Instant::now()),
            shard_hasher: Default::default(),
            ledger,
            refusals: Refusals::default(),
            copies: Mutex::default(),
            tasks: Mutex::default(),
        }
    }

    /// Requests refused by a limit, counted per reason.
    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// What `client` holds against its limits: puts in flight, and bytes of
    /// hard-pinned objects (in flight or committed).
    pub fn held_by(&self, client: ClientId) -> (u64, u64) {
        let h = self.ledger.held(client);
        (h.pending, h.pinned)
    }

    /// `t` as a [`Tick`] (times before the epoch count as the epoch).
    fn tick(&self, t: Instant) -> Tick {
        Tick(t.saturating_duration_since(self.epoch).as_nanos() as u64)
    }

    /// The instant a [`Tick`] stands for.
    fn instant(&self, t: Tick) -> Instant {
        self.epoch + Duration::from_nanos(t.0)
    }

    /// How long from `t` to `now` (zero if `t` is later).
    fn since(&self, t: Tick, now: Instant) -> Duration {
        now.saturating_duration_since(self.instant(t))
    }

    /// `v` with its replicas named by number, less those on segments no
    /// longer mounted.
    fn pack(&self, v: Version) -> Version<SegNo> {
        let live = self.segments.read();
        let numbers = self.numbers.read();
        v.map_segments(|(s, r)| {
            live.contains_key(&s)
                .then(|| numbers.get(s))
                .flatten()
                .map(|no| (no, r))
        })
    }

    /// `v` with its replicas named by segment id.
    fn unpack(&self, v: Version<SegNo>) -> Version {
        let numbers = self.numbers.read();
        v.map_segments(|(no, r)| Some((numbers.id(no), r)))
    }

    /// The settings in force.
    pub fn config(&self) -> &StateConfig {
        &self.cfg
    }

    /// What tenant `name` holds against its quota.
    pub fn tenant_usage(&self, name: &str) -> Usage {
        self.ledger.tenant_usage(name)
    }

    /// What every tenant that holds something holds, by name.
    pub fn tenants(&self) -> Vec<(String, Usage)> {
        self.ledger.tenants()
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[self.shard_of(key)]
    }

    /// The index of `key`'s shard.
    fn shard_of(&self, key: &str) -> usize {
        (self.key_hash(key) as usize) % SHARDS
    }

    /// `key`'s 64-bit hash under this master's seed.
    fn key_hash(&self, key: &str) -> u64 {
        // Its own seed: the shard tables hash with others, so the keys of
        // one shard do not all share the low bits their table indexes by.
        self.shard_hasher.hash_one(key)
    }

    /// The cluster as seen now.
    pub fn status(&self) -> ClusterStatus {
        let suspects = self.suspects();
        let segments: Vec<SegmentStatus> = {
            let segs = self.segments.read();
            let mut v: Vec<SegmentStatus> = segs
                .values()
                .map(|s| {
                    let a = s.alloc.lock();
                    let state = if s.recovering.is_some() {
                        "recovering"
                    } else if suspects.contains(&s.owner) {
                        "suspect"
                    } else if s.draining {
                        "draining"
                    } else {
                        "live"
                    };
                    SegmentStatus {
                        info: s.info.clone(),
                        used: a.used(),
                        regions: a.live_regions() as u64,
                        state: state.into(),
                        io: s.io,
                    }
                })
                .collect();
            v.sort_by(|a, b| a.info.name.cmp(&b.info.name));
            v
        };
        let (mut keys, mut pending) = (0, 0);
        for shard in self.shards.iter() {
            let sh = shard.lock();
            keys += sh.objects.len() as u64;
            pending += sh.pending.len() as u64;
        }
        ClusterStatus {
            role: "leader".into(),
            capacity: segments.iter().map(|s| s.info.size).sum(),
            used: segments.iter().map(|s| s.used).sum(),
            segments,
            keys,
            pending,
            clients: self.clients.lock().len() as u64,
            evictions: self.evictions(),
            demotions: self.demotions(),
            promotions: self.promotions(),
            replicas_lost: self
                .replicas_lost
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Everything known about one key, for the admin API.
    pub fn key_info(&self, key: &str, now: Instant) -> Option<KeyInfo> {
        let shard = self.shard(key).lock();
        let i = shard.objects.find(key)?;
        let v = shard.objects.at(i);
        let soft_pin_until = shard.objects.soft_pin_until(i);
        Some(KeyInfo {
            key: key.to_string(),
            value_len: v.value_len,
            generation: v.generation,
            replicas: self.describe_numbered(shard.objects.replicas(i)),
            lease_remaining_ms: ms(self.instant(v.lease_until).saturating_duration_since(now)),
            soft_pin_remaining_ms: (soft_pin_until > Tick(0))
                .then(|| ms(self.instant(soft_pin_until).saturating_duration_since(now))),
            hard_pin: v.hard_pinned(),
            idle_ms: ms(self.since(v.last_access, now)),
            put_in_flight: shard.pending.contains_key(key),
        })
    }
}

/// The wall clock in nanoseconds since the Unix epoch (1 if it is before).
pub(super) fn wall_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}
