//! The master's metadata: objects (sharded by key hash, one lock per shard),
//! mounted segments with one offset allocator each, registered clients, and
//! regions waiting for a read lease to end before they can be reused.
//!
//! Every operation takes `now` from the caller, so leases, pins and client
//! expiry are tested with synthetic or paused time. Lock order, everywhere:
//! shard, then the segment map, then one segment's allocator; the client map
//! and the deferred-free list are only ever taken alone.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvpool_proto::msg::{
    ClientId, ClusterStatus, InventoryItem, InventoryVerdict, ObjectLocation, PutEndItem, PutGrant,
    PutItem, RegisterReply, Replica, ReplicateConfig, SegmentId, SegmentInfo, SegmentStatus,
    TouchItem,
};
use kvpool_proto::{validate_key, Code, KvError, KvResult};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use tokio::time::Instant;

use crate::alloc::{OffsetAllocator, Region};
use crate::eviction::{self, Candidate};
use crate::placement::{self, SegmentView};

const SHARDS: usize = 64;
/// Eviction passes one allocation may trigger before it gives up (each frees
/// `eviction_ratio` of capacity).
const MAX_EVICTION_ROUNDS: usize = 16;

/// Timing and eviction settings of the metadata state.
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// Read lease granted by each `GetReplicaList`.
    pub lease_ttl: Duration,
    /// Soft pin duration when a put asks for one without a TTL.
    pub soft_pin_ttl: Duration,
    /// Start evicting when used/capacity reaches this.
    pub high_watermark: f64,
    /// Fraction of capacity freed per eviction pass.
    pub eviction_ratio: f64,
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
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            lease_ttl: Duration::from_secs(10),
            soft_pin_ttl: Duration::from_secs(30 * 60),
            high_watermark: 0.95,
            eviction_ratio: 0.05,
            client_ttl: Duration::from_secs(10),
            store_grace: Duration::from_secs(30),
            pending_ttl: Duration::from_secs(60),
        }
    }
}

/// One written (or being written) copy set of an object.
struct Version {
    value_len: u64,
    generation: u64,
    replicas: Vec<(SegmentId, Region)>,
    lease_until: Instant,
    soft_pin_until: Option<Instant>,
    hard_pin: bool,
    last_access: Instant,
    /// When it was committed (or recovered).
    committed_at: Instant,
}

impl Version {
    fn bytes(&self) -> u64 {
        self.replicas.iter().map(|(_, r)| r.len).sum()
    }
}

struct Pending {
    owner: ClientId,
    started: Instant,
    version: Version,
}

/// A key's committed version, and a put of a new one in flight (at most one).
#[derive(Default)]
struct Entry {
    current: Option<Version>,
    pending: Option<Pending>,
}

#[derive(Default)]
struct Shard {
    objects: HashMap<String, Entry>,
    /// Keys with a put in flight; kept apart so sweeps need not scan all objects.
    pending: HashMap<String, ClientId>,
}

struct SegmentSlot {
    info: SegmentInfo,
    owner: ClientId,
    alloc: Mutex<OffsetAllocator>,
    /// Waiting for the rest of its inventory: takes no new objects yet.
    recovering: Option<Vec<InventoryItem>>,
    /// Shutting down or being emptied: takes no new objects.
    draining: bool,
    /// Versions committed after this are not expected in the inventory.
    scan_cutoff: Instant,
}

struct ClientEntry {
    last_seen: Instant,
    hostname: String,
    /// Silent past the TTL while lending segments: kept for the grace period.
    suspect: bool,
}

impl ClientEntry {
    /// Records a sign of life; true when a suspect store is live again.
    fn seen(&mut self, id: ClientId, now: Instant) -> bool {
        self.last_seen = self.last_seen.max(now);
        let back = std::mem::take(&mut self.suspect);
        if back {
            tracing::info!(client = %id, hostname = %self.hostname, "suspect store heartbeats again; its segments are live");
        }
        back
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

/// Freed regions of one segment to destroy on its store: the segment, its
/// data endpoint, and `(offset, generation)` pairs.
pub type Invalidations = (SegmentId, String, Vec<(u64, u64)>);

/// Outcome of an eviction pass.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    /// Objects evicted.
    pub objects: u64,
    /// Bytes freed.
    pub bytes: u64,
}

/// Freed or replaced versions whose headers the stores must destroy, so that
/// neither a restart nor a reader holding an old location (a client's
/// location cache) can see them again.
#[derive(Default)]
struct InvalidationQueue {
    /// `(offset, generation)` per segment.
    regions: HashMap<SegmentId, Vec<(u64, u64)>>,
    /// Sequence number of the last queued batch.
    seq: u64,
    /// Keys with an old version possibly still readable, and the sequence
    /// number whose delivery destroys it: a new value or a removal of the
    /// key is reported only after that (see [`MasterState::fence`]).
    fences: HashMap<String, u64>,
}

/// The master's metadata state. All methods are short critical sections.
pub struct MasterState {
    cfg: StateConfig,
    shards: Box<[Mutex<Shard>]>,
    segments: RwLock<HashMap<SegmentId, SegmentSlot>>,
    clients: Mutex<HashMap<ClientId, ClientEntry>>,
    deferred: Mutex<Vec<(Instant, SegmentId, Region)>>,
    /// Object headers to destroy on their stores, and the keys waiting for it.
    invalidations: Mutex<InvalidationQueue>,
    /// Invalidations up to this sequence number have been sent to stores.
    invalidated_through: AtomicU64,
    /// Serializes eviction passes so concurrent puts do not evict twice.
    evicting: Mutex<()>,
    next_generation: AtomicU64,
    evictions: AtomicU64,
    /// Clients marked suspect, so reads skip the suspect check when none is.
    suspect_count: std::sync::atomic::AtomicUsize,
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

impl MasterState {
    /// Empty state with `cfg`.
    pub fn new(cfg: StateConfig) -> Self {
        // Generations only need to differ between versions of one key; starting
        // from the wall clock keeps them increasing across master restarts.
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        MasterState {
            cfg,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            segments: RwLock::new(HashMap::new()),
            clients: Mutex::new(HashMap::new()),
            deferred: Mutex::new(Vec::new()),
            invalidations: Mutex::new(InvalidationQueue::default()),
            invalidated_through: AtomicU64::new(0),
            evicting: Mutex::new(()),
            next_generation: AtomicU64::new(start),
            evictions: AtomicU64::new(0),
            suspect_count: Default::default(),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &StateConfig {
        &self.cfg
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    // ------------------------------------------------------------ clients

    /// Registers (or refreshes) a client.
    pub fn register_client(&self, id: ClientId, hostname: &str, now: Instant) -> RegisterReply {
        let old = self.clients.lock().insert(
            id,
            ClientEntry {
                last_seen: now,
                hostname: hostname.to_string(),
                suspect: false,
            },
        );
        if old.is_some_and(|c| c.suspect) {
            self.suspect_count.fetch_sub(1, Ordering::Relaxed);
        }
        RegisterReply {
            heartbeat_interval_ms: ms(self.cfg.client_ttl / 4).max(1),
            client_ttl_ms: ms(self.cfg.client_ttl),
        }
    }

    /// Records a heartbeat; false when the client is unknown (it must register).
    pub fn heartbeat(&self, id: ClientId, now: Instant) -> bool {
        match self.clients.lock().get_mut(&id) {
            Some(c) => {
                if c.seen(id, now) {
                    self.suspect_count.fetch_sub(1, Ordering::Relaxed);
                }
                true
            }
            None => false,
        }
    }

    /// Adds `stall` to every client's silence allowance: the master itself did
    /// not run (paused, or starved of CPU) for that long, so heartbeats sent
    /// meanwhile could not be counted.
    pub fn forgive_stall(&self, stall: Duration, now: Instant) {
        for c in self.clients.lock().values_mut() {
            c.last_seen = (c.last_seen + stall).min(now);
        }
    }

    /// Client ids that are suspect stores now.
    fn suspects(&self) -> HashSet<ClientId> {
        if self.suspect_count.load(Ordering::Relaxed) == 0 {
            return HashSet::new();
        }
        self.clients
            .lock()
            .iter()
            .filter(|(_, c)| c.suspect)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Segments whose store is suspect now.
    fn suspect_segments(&self) -> HashSet<SegmentId> {
        let suspects = self.suspects();
        if suspects.is_empty() {
            return HashSet::new();
        }
        self.segments
            .read()
            .values()
            .filter(|s| suspects.contains(&s.owner))
            .map(|s| s.info.id)
            .collect()
    }

    /// Checks that `id` is registered; its call counts as a sign of life.
    fn require_client(&self, id: ClientId, now: Instant) -> KvResult<()> {
        if let Some(c) = self.clients.lock().get_mut(&id) {
            if c.seen(id, now) {
                self.suspect_count.fetch_sub(1, Ordering::Relaxed);
            }
            Ok(())
        } else {
            Err(KvError::new(
                Code::ClientNotFound,
                format!("client {id} is not registered"),
            ))
        }
    }

    // ------------------------------------------------------------ segments

    /// Lends a segment to the pool. `objects` > 0 announces an inventory
    /// (reported next with [`Self::report_objects`]): the segment takes no
    /// new objects until it is complete. A segment still mounted under
    /// another client is taken over: its store restarted within the TTL.
    pub fn mount(&self, client: ClientId, info: SegmentInfo, objects: u64) -> KvResult<()> {
        self.mount_scanned(client, info, objects, Duration::ZERO, Instant::now())
    }

    /// [`Self::mount`] for a store whose scan began `scan_age` ago: objects
    /// committed since then are missing from its inventory but not lost.
    pub fn mount_scanned(
        &self,
        client: ClientId,
        info: SegmentInfo,
        objects: u64,
        scan_age: Duration,
        now: Instant,
    ) -> KvResult<()> {
        self.require_client(client, now)?;
        // A margin for the time the mount message took to arrive.
        let cutoff = now
            .checked_sub(scan_age + Duration::from_secs(1))
            .unwrap_or(now);
        if info.size == 0 {
            return Err(KvError::new(
                Code::InvalidParams,
                "segment has no usable bytes",
            ));
        }
        let recovering = (objects > 0).then(Vec::new);
        let mut segs = self.segments.write();
        if let Some(s) = segs.get_mut(&info.id) {
            if (s.info.base, s.info.size) != (info.base, info.size) {
                return Err(KvError::new(
                    Code::SegmentAlreadyExists,
                    format!("segment {} is mounted with another size", info.id),
                ));
            }
            if s.owner == client && s.info == info && s.recovering.is_none() && recovering.is_none()
            {
                return Ok(());
            }
            // Its store restarted (maybe on another port) within the TTL.
            tracing::info!(segment = %info.id, endpoint = %info.endpoint, "segment remounted by a restarted store");
            s.info = info.clone();
            s.owner = client;
            s.recovering = recovering;
            s.draining = false;
            s.scan_cutoff = cutoff;
            drop(segs);
            if objects == 0 {
                // Nothing survived: every replica the master placed there is gone.
                self.reconcile_known(info.id, &[]);
            }
            return Ok(());
        }
        tracing::info!(segment = %info.id, name = %info.name, endpoint = %info.endpoint, size = info.size, objects, "segment mounted");
        segs.insert(
            info.id,
            SegmentSlot {
                alloc: Mutex::new(OffsetAllocator::new(info.base, info.size)),
                info,
                owner: client,
                recovering,
                draining: false,
                scan_cutoff: cutoff,
            },
        );
        Ok(())
    }

    /// Takes part of a remounted segment's inventory; on the last part,
    /// reconciles it with the object map and opens the segment.
    pub fn report_objects(
        &self,
        client: ClientId,
        id: SegmentId,
        items: Vec<InventoryItem>,
        last: bool,
        now: Instant,
    ) -> KvResult<InventoryVerdict> {
        // Reporting is a sign of life: a big inventory can outlast the TTL.
        self.require_client(client, now)?;
        let (all, fresh) = {
            let mut segs = self.segments.write();
            let s = segs.get_mut(&id).ok_or_else(|| {
                KvError::new(
                    Code::SegmentNotFound,
                    format!("segment {id} is not mounted"),
                )
            })?;
            if s.owner != client {
                return Err(KvError::new(
                    Code::IllegalClient,
                    format!("segment {id} belongs to another client"),
                ));
            }
            let Some(inv) = s.recovering.as_mut() else {
                return Err(KvError::new(
                    Code::InvalidParams,
                    format!("segment {id} announced no inventory"),
                ));
            };
            inv.extend(items);
            if !last {
                return Ok(InventoryVerdict::default());
            }
            let mut all = s.recovering.take().unwrap_or_default();
            // A part sent again (its answer was lost) reports the same regions.
            all.sort_unstable_by_key(|i| i.offset);
            all.dedup_by_key(|i| i.offset);
            // A segment that holds no live region yet was new to this master.
            let fresh = s.alloc.lock().live_regions() == 0;
            if fresh {
                let used = all.iter().map(|i| (i.offset, i.region_len));
                match OffsetAllocator::with_used(s.info.base, s.info.size, used) {
                    Ok(alloc) => *s.alloc.lock() = alloc,
                    Err(e) => {
                        // Never open it empty: new objects would overwrite the
                        // ones it holds. Unmounted, its store mounts it again.
                        drop(segs);
                        self.drop_segment(id);
                        tracing::error!(segment = %id, error = %e, "inventory rejected; segment unmounted");
                        return Err(KvError::new(
                            Code::InvalidParams,
                            format!("inventory of {id}: {e}"),
                        ));
                    }
                }
            }
            (all, fresh)
        };
        if let Some(max) = all.iter().map(|i| i.generation).max() {
            self.next_generation.fetch_max(max + 1, Ordering::Relaxed);
        }
        let verdict = if fresh {
            self.reconcile_fresh(id, all, now)
        } else {
            self.reconcile_known(id, &all)
        };
        tracing::info!(segment = %id, accepted = verdict.accepted, rejected = verdict.rejected.len(), "inventory reconciled");
        Ok(verdict)
    }

    /// A segment new to this master (after a master restart or failover, or a
    /// store back after its TTL): its objects become readable unless the map
    /// already has a newer version of the key. Every reported region is
    /// already reserved in the segment's allocator; rejected ones are freed.
    fn reconcile_fresh(
        &self,
        id: SegmentId,
        items: Vec<InventoryItem>,
        now: Instant,
    ) -> InventoryVerdict {
        let mut v = InventoryVerdict::default();
        for it in items {
            let region = Region {
                offset: it.offset,
                len: it.region_len,
            };
            let mut shard = self.shard(&it.key).lock();
            let e = shard.objects.entry(it.key.clone()).or_default();
            let current = e.current.as_ref().map(|c| c.generation);
            let keep = match current {
                Some(g) if g > it.generation => false,
                Some(g) if g == it.generation => {
                    if let Some(c) = e.current.as_mut() {
                        if !c.replicas.iter().any(|(s, _)| *s == id) {
                            c.replicas.push((id, region));
                        }
                    }
                    true
                }
                _ => {
                    let old = e.current.replace(Version {
                        value_len: it.value_len,
                        generation: it.generation,
                        replicas: vec![(id, region)],
                        lease_until: now,
                        soft_pin_until: None,
                        hard_pin: false,
                        last_access: now,
                        committed_at: now,
                    });
                    drop(shard);
                    if let Some(old) = old {
                        self.release(&it.key, old, now);
                    }
                    true
                }
            };
            if keep {
                v.accepted += 1;
            } else {
                self.free_now(&[(id, region)], None);
                v.rejected.push((it.offset, it.generation));
            }
        }
        self.open_segment(id);
        v
    }

    /// A segment this master still has, remounted by a restarted store: the
    /// map decides. Replicas whose bytes did not survive are dropped (unless
    /// committed after the store's scan began); objects the map does not hold
    /// there are rejected.
    fn reconcile_known(&self, id: SegmentId, items: &[InventoryItem]) -> InventoryVerdict {
        let cutoff = match self.segments.read().get(&id) {
            Some(s) => s.scan_cutoff,
            None => return InventoryVerdict::default(),
        };
        let reported: std::collections::HashSet<(u64, u64)> =
            items.iter().map(|i| (i.offset, i.generation)).collect();
        let mut kept = std::collections::HashSet::new();
        let mut in_flight = std::collections::HashSet::new();
        let mut lost = Vec::new();
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            sh.objects.retain(|_, e| {
                // Written but not committed yet: its writer decides, not the store.
                if let Some(p) = &e.pending {
                    for (s, r) in &p.version.replicas {
                        if *s == id {
                            in_flight.insert((r.offset, p.version.generation));
                        }
                    }
                }
                if let Some(v) = &mut e.current {
                    let gen = v.generation;
                    let recent = v.committed_at >= cutoff;
                    v.replicas.retain(|(s, r)| {
                        if *s != id {
                            return true;
                        }
                        if reported.contains(&(r.offset, gen)) {
                            kept.insert((r.offset, gen));
                            true
                        } else if recent {
                            true
                        } else {
                            lost.push(*r);
                            false
                        }
                    });
                    if v.replicas.is_empty() {
                        e.current = None;
                    }
                }
                e.current.is_some() || e.pending.is_some()
            });
        }
        self.free_now(&lost.into_iter().map(|r| (id, r)).collect::<Vec<_>>(), None);
        self.open_segment(id);
        InventoryVerdict {
            accepted: kept.len() as u64,
            rejected: reported
                .difference(&kept)
                .filter(|r| !in_flight.contains(r))
                .copied()
                .collect(),
        }
    }

    fn open_segment(&self, id: SegmentId) {
        if let Some(s) = self.segments.write().get_mut(&id) {
            s.recovering = None;
        }
    }

    /// Stops placing objects on the segments named `name` (or with that id in
    /// hex); returns their ids.
    pub fn drain(&self, name: &str) -> Vec<SegmentId> {
        let mut segs = self.segments.write();
        let mut out = Vec::new();
        for s in segs.values_mut() {
            if s.info.name == name || s.info.id.to_string() == name {
                s.draining = true;
                out.push(s.info.id);
            }
        }
        out
    }

    /// Unmounts a segment on an operator's request (after a drain).
    pub fn unmount_admin(&self, id: SegmentId) {
        self.drop_segment(id);
    }

    /// Withdraws a segment; only its owner may.
    pub fn unmount(&self, client: ClientId, id: SegmentId) -> KvResult<()> {
        match self.segments.read().get(&id) {
            None => {
                return Err(KvError::new(
                    Code::SegmentNotFound,
                    format!("segment {id} is not mounted"),
                ))
            }
            Some(s) if s.owner != client => {
                return Err(KvError::new(
                    Code::IllegalClient,
                    format!("segment {id} belongs to another client"),
                ))
            }
            Some(_) => {}
        }
        self.drop_segment(id);
        Ok(())
    }

    /// Forgets a segment and every replica on it. Objects left without a
    /// replica are gone; puts writing to it are revoked.
    fn drop_segment(&self, id: SegmentId) {
        if self.segments.write().remove(&id).is_none() {
            return;
        }
        tracing::info!(segment = %id, "segment unmounted");
        self.deferred.lock().retain(|(_, s, _)| *s != id);
        self.invalidations.lock().regions.remove(&id);
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            let sh = &mut *sh;
            let mut revoked = Vec::new();
            sh.objects.retain(|key, e| {
                if let Some(v) = &mut e.current {
                    v.replicas.retain(|(s, _)| *s != id);
                    if v.replicas.is_empty() {
                        e.current = None;
                    }
                }
                if e.pending
                    .as_ref()
                    .is_some_and(|p| p.version.replicas.iter().any(|(s, _)| *s == id))
                {
                    if let Some(p) = e.pending.take() {
                        revoked.push((key.clone(), p));
                    }
                }
                e.current.is_some() || e.pending.is_some()
            });
            for (key, p) in revoked {
                sh.pending.remove(&key);
                self.free_now(&p.version.replicas, Some(p.version.generation));
            }
        }
    }

    /// Returns regions to their allocators. With the generation of the
    /// object written there, also queues its destruction on the store.
    fn free_now(&self, replicas: &[(SegmentId, Region)], written: Option<u64>) {
        let segs = self.segments.read();
        let mut inv = written.map(|_| self.invalidations.lock());
        for (id, r) in replicas {
            if let Some(s) = segs.get(id) {
                s.alloc.lock().free(*r);
                if let (Some(inv), Some(gen)) = (inv.as_mut(), written) {
                    inv.regions.entry(*id).or_default().push((r.offset, gen));
                }
            }
        }
        if let Some(mut inv) = inv {
            inv.seq += 1;
        }
    }

    /// Frees the regions of `key`'s version `v`, which was removed or
    /// evicted, and fences the key until its headers are destroyed.
    fn retire(&self, key: &str, v: &Version) {
        self.free_now(&v.replicas, Some(v.generation));
        let mut inv = self.invalidations.lock();
        let seq = inv.seq;
        inv.fences.insert(key.to_string(), seq);
    }

    /// The invalidation sequence number a reply about `keys` must wait for
    /// (their old versions destroyed on the stores), if any is outstanding.
    pub fn fence<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> Option<u64> {
        let inv = self.invalidations.lock();
        if inv.fences.is_empty() {
            return None;
        }
        let done = self.invalidated_through.load(Ordering::Acquire);
        keys.into_iter()
            .filter_map(|k| inv.fences.get(k).copied())
            .filter(|&seq| seq > done)
            .max()
    }

    /// Whether any key waits for its old version to be destroyed.
    pub fn has_fences(&self) -> bool {
        !self.invalidations.lock().fences.is_empty()
    }

    /// The invalidation sequence number everything queued so far reaches,
    /// if not yet sent.
    pub fn fence_all(&self) -> Option<u64> {
        let seq = self.invalidations.lock().seq;
        (seq > self.invalidated_through.load(Ordering::Acquire)).then_some(seq)
    }

    /// Takes the queued invalidations, with each segment's data endpoint,
    /// and the sequence number they reach.
    pub fn take_invalidations(&self) -> (Vec<Invalidations>, u64) {
        let (queued, seq) = {
            let mut inv = self.invalidations.lock();
            (std::mem::take(&mut inv.regions), inv.seq)
        };
        let segs = self.segments.read();
        let out = queued
            .into_iter()
            .filter_map(|(id, regions)| {
                segs.get(&id)
                    .map(|s| (id, s.info.endpoint.clone(), regions))
            })
            .collect();
        (out, seq)
    }

    /// Records that every invalidation through `seq` was sent (delivered, or
    /// its store unreachable and retried later): waiting replies may go.
    pub fn invalidations_sent(&self, seq: u64) {
        self.invalidated_through.fetch_max(seq, Ordering::AcqRel);
        let mut inv = self.invalidations.lock();
        inv.fences.retain(|_, s| *s > seq);
    }

    /// Puts back invalidations that could not be delivered (store down),
    /// unless the segment is gone; its remount reconciles it anyway.
    pub fn requeue_invalidations(&self, id: SegmentId, regions: Vec<(u64, u64)>) {
        if self.segments.read().contains_key(&id) {
            self.invalidations
                .lock()
                .regions
                .entry(id)
                .or_default()
                .extend(regions);
        }
    }

    /// Retires `key`'s version `v`, replaced by a newer one: its headers are
    /// destroyed at once (a reader of the old location then asks the master
    /// again), and under a live read lease its regions are reused only when
    /// the lease ends, so a reader in flight never sees them rewritten.
    fn release(&self, key: &str, v: Version, now: Instant) {
        if v.lease_until > now {
            let mut inv = self.invalidations.lock();
            for (s, r) in &v.replicas {
                inv.regions
                    .entry(*s)
                    .or_default()
                    .push((r.offset, v.generation));
            }
            inv.seq += 1;
            let seq = inv.seq;
            inv.fences.insert(key.to_string(), seq);
            drop(inv);
            self.deferred
                .lock()
                .extend(v.replicas.into_iter().map(|(s, r)| (v.lease_until, s, r)));
        } else {
            self.retire(key, &v);
        }
    }

    fn describe(&self, replicas: &[(SegmentId, Region)]) -> Vec<Replica> {
        let segs = self.segments.read();
        replicas
            .iter()
            .filter_map(|(id, r)| {
                segs.get(id).map(|s| Replica {
                    segment: *id,
                    endpoint: s.info.endpoint.clone(),
                    offset: r.offset,
                    len: r.len,
                })
            })
            .collect()
    }

    /// Total and used bytes over all mounted segments.
    pub fn usage(&self) -> (u64, u64) {
        let segs = self.segments.read();
        segs.values().fold((0, 0), |(cap, used), s| {
            let a = s.alloc.lock();
            (cap + a.capacity(), used + a.used())
        })
    }

    /// Whether used bytes have reached the high watermark.
    pub fn above_watermark(&self) -> bool {
        let (cap, used) = self.usage();
        cap > 0 && used as f64 >= cap as f64 * self.cfg.high_watermark
    }

    /// Mounted segments big enough to ever hold a region of `len` bytes.
    /// Owners silent for half the client TTL: probably dead, so their
    /// segments get no new objects while the TTL runs out.
    fn late_owners(&self, now: Instant) -> std::collections::HashSet<ClientId> {
        let grace = self.cfg.client_ttl / 2;
        self.clients
            .lock()
            .iter()
            .filter(|(_, c)| now.saturating_duration_since(c.last_seen) > grace)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Segments that may take new objects now: not recovering an inventory,
    /// not draining, and with an owner that heartbeats.
    fn placeable(&self, now: Instant) -> HashSet<SegmentId> {
        let late = self.late_owners(now);
        self.segments
            .read()
            .values()
            .filter(|s| s.recovering.is_none() && !s.draining && !late.contains(&s.owner))
            .map(|s| s.info.id)
            .collect()
    }

    /// How many of `among` could ever hold a region of `len` bytes.
    fn fitting(&self, len: u64, among: Option<&HashSet<SegmentId>>) -> usize {
        self.segments
            .read()
            .values()
            .filter(|s| among.is_none_or(|a| a.contains(&s.info.id)))
            .filter(|s| s.alloc.lock().capacity() >= len)
            .count()
    }

    fn allocate(
        &self,
        region_len: u64,
        replica_num: usize,
        preferred: &[String],
        placeable: &HashSet<SegmentId>,
    ) -> Vec<(SegmentId, Region)> {
        let segs = self.segments.read();
        let views: Vec<SegmentView> = segs
            .values()
            .filter(|s| placeable.contains(&s.info.id))
            .map(|s| SegmentView {
                id: s.info.id,
                name: &s.info.name,
                free: s.alloc.lock().largest_free(),
            })
            .collect();
        let mut got = Vec::with_capacity(replica_num);
        for id in placement::order(&views, region_len, preferred) {
            if got.len() == replica_num {
                break;
            }
            if let Some(r) = segs.get(&id).and_then(|s| s.alloc.lock().alloc(region_len)) {
                got.push((id, r));
            }
        }
        got
    }

    // ------------------------------------------------------------ puts

    /// Reserves regions for each item; one result per item.
    pub fn put_start(
        &self,
        client: ClientId,
        items: &[PutItem],
        config: &ReplicateConfig,
        upsert: bool,
        now: Instant,
    ) -> Vec<KvResult<PutGrant>> {
        if let Err(e) = self.require_client(client, now) {
            return items.iter().map(|_| Err(e.clone())).collect();
        }
        let placeable = self.placeable(now);
        items
            .iter()
            .map(|item| self.put_start_one(client, item, config, upsert, &placeable, now))
            .collect()
    }

    /// What an existing entry means for a new put, if it decides the answer.
    fn existing_answer(
        &self,
        e: &Entry,
        client: ClientId,
        item: &PutItem,
        upsert: bool,
    ) -> Option<KvResult<PutGrant>> {
        if let Some(p) = &e.pending {
            // The same writer retrying (its answer was lost): hand back the same regions.
            if p.owner == client && p.version.value_len == item.value_len {
                return Some(Ok(PutGrant::Write {
                    generation: p.version.generation,
                    replicas: self.describe(&p.version.replicas),
                }));
            }
            return Some(Err(KvError::new(
                Code::ReplicaIsNotReady,
                format!("{:?} is being written by another client", item.key),
            )));
        }
        if e.current.is_some() && !upsert {
            return Some(Ok(PutGrant::Exists));
        }
        None
    }

    fn put_start_one(
        &self,
        client: ClientId,
        item: &PutItem,
        config: &ReplicateConfig,
        upsert: bool,
        placeable: &HashSet<SegmentId>,
        now: Instant,
    ) -> KvResult<PutGrant> {
        validate_key(&item.key)?;
        if item.region_len < item.value_len || item.region_len == 0 {
            return Err(KvError::new(
                Code::InvalidParams,
                "region length smaller than the value",
            ));
        }
        if config.replica_num == 0 {
            return Err(KvError::new(
                Code::InvalidParams,
                "replica_num must be at least 1",
            ));
        }
        if let Some(e) = self.shard(&item.key).lock().objects.get(&item.key) {
            if let Some(answer) = self.existing_answer(e, client, item, upsert) {
                return answer;
            }
        }
        // Allocate without holding the shard: eviction may need every shard.
        let want = config.replica_num as usize;
        let fit = self.fitting(item.region_len, Some(placeable));
        if fit == 0 && self.fitting(item.region_len, None) > 0 {
            // Room exists but not now: never evict for segments that cannot take
            // the object anyway; the caller retries.
            return Err(KvError::new(
                Code::UnavailableInCurrentStatus,
                "no segment takes new objects right now (recovering, draining or not heartbeating)",
            ));
        }
        let mut replicas =
            self.allocate(item.region_len, want, &config.preferred_segments, placeable);
        // Evict only for replicas that room could give: with fewer segments big
        // enough than `replica_num`, the put is best effort, not a reason to evict.
        let reachable = want.min(fit);
        // Freed bytes are not always a hole big enough (values of mixed sizes
        // fragment the segment), so evict more rounds until the region fits or
        // nothing evictable is left.
        let mut rounds = 0;
        while replicas.len() < reachable && rounds < MAX_EVICTION_ROUNDS {
            rounds += 1;
            self.free_now(&replicas, None);
            let need = item.region_len.saturating_mul(reachable as u64);
            let freed = self.evict_on(now, need, Some(placeable));
            replicas = self.allocate(item.region_len, want, &config.preferred_segments, placeable);
            if freed.objects == 0 {
                break;
            }
        }
        if replicas.is_empty() {
            let (cap, used) = self.usage();
            return Err(KvError::new(
                Code::NoAvailableHandle,
                format!(
                    "no segment has {} free bytes after eviction ({used} of {cap} bytes in use)",
                    item.region_len
                ),
            ));
        }
        let mut shard = self.shard(&item.key).lock();
        let e = shard.objects.entry(item.key.clone()).or_default();
        if let Some(answer) = self.existing_answer(e, client, item, upsert) {
            // Lost a race with another writer of the same key.
            self.free_now(&replicas, None);
            return answer;
        }
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let soft_pin_until = config.with_soft_pin.then(|| {
            now + config
                .soft_pin_ttl_ms
                .map(Duration::from_millis)
                .unwrap_or(self.cfg.soft_pin_ttl)
        });
        let described = self.describe(&replicas);
        e.pending = Some(Pending {
            owner: client,
            started: now,
            version: Version {
                value_len: item.value_len,
                generation,
                replicas,
                lease_until: now,
                soft_pin_until,
                hard_pin: config.with_hard_pin,
                last_access: now,
                committed_at: now,
            },
        });
        shard.pending.insert(item.key.clone(), client);
        Ok(PutGrant::Write {
            generation,
            replicas: described,
        })
    }

    /// Commits written objects; one result per key.
    pub fn put_end(
        &self,
        client: ClientId,
        items: &[PutEndItem],
        now: Instant,
    ) -> Vec<KvResult<()>> {
        items
            .iter()
            .map(|i| self.put_end_one(client, &i.key, i.generation, now))
            .collect()
    }

    fn take_pending(&self, shard: &mut Shard, client: ClientId, key: &str) -> KvResult<Pending> {
        let e = shard.objects.get_mut(key).ok_or_else(|| {
            KvError::new(Code::ObjectNotFound, format!("no put of {key:?} in flight"))
        })?;
        match &e.pending {
            None => {
                return Err(KvError::new(
                    Code::ObjectNotFound,
                    format!("no put of {key:?} in flight"),
                ))
            }
            Some(p) if p.owner != client => {
                return Err(KvError::new(
                    Code::IllegalClient,
                    format!("put of {key:?} belongs to another client"),
                ))
            }
            Some(_) => {}
        }
        shard.pending.remove(key);
        e.pending
            .take()
            .ok_or_else(|| KvError::from(Code::InternalError))
    }

    fn put_end_one(
        &self,
        client: ClientId,
        key: &str,
        generation: u64,
        now: Instant,
    ) -> KvResult<()> {
        let mut shard = self.shard(key).lock();
        let entry = shard.objects.get(key);
        let committed = entry.and_then(|e| e.current.as_ref()).map(|v| v.generation);
        let pending = entry
            .and_then(|e| e.pending.as_ref())
            .map(|p| p.version.generation);
        if pending != Some(generation) {
            // A retried PutEnd whose first attempt committed this very version.
            if committed == Some(generation) {
                return Ok(());
            }
            return Err(KvError::new(
                Code::ObjectNotFound,
                format!("no put of {key:?} generation {generation} in flight (revoked or expired)"),
            ));
        }
        let p = self.take_pending(&mut shard, client, key)?;
        let mut v = p.version;
        // A segment may have gone away while the bytes were being written.
        let live = self.segments.read();
        v.replicas.retain(|(s, _)| live.contains_key(s));
        drop(live);
        let Some(e) = shard.objects.get_mut(key) else {
            return Err(KvError::from(Code::InternalError));
        };
        if v.replicas.is_empty() {
            if e.current.is_none() {
                shard.objects.remove(key);
            }
            return Err(KvError::new(
                Code::WriteFail,
                format!("every segment of {key:?} went away"),
            ));
        }
        v.last_access = now;
        v.committed_at = now;
        if let Some(old) = e.current.replace(v) {
            drop(shard);
            self.release(key, old, now);
        }
        Ok(())
    }

    /// Abandons puts in flight; one result per key.
    pub fn put_revoke(&self, client: ClientId, keys: &[String]) -> Vec<KvResult<()>> {
        keys.iter()
            .map(|k| {
                let mut shard = self.shard(k).lock();
                let p = self.take_pending(&mut shard, client, k)?;
                if shard.objects.get(k).is_some_and(|e| e.current.is_none()) {
                    shard.objects.remove(k);
                }
                drop(shard);
                self.free_now(&p.version.replicas, Some(p.version.generation));
                Ok(())
            })
            .collect()
    }

    // ------------------------------------------------------------ reads

    /// Locates committed objects and grants each a read lease.
    pub fn get_replica_list(&self, keys: &[String], now: Instant) -> Vec<KvResult<ObjectLocation>> {
        let suspect = self.suspect_segments();
        keys.iter()
            .map(|k| {
                let mut shard = self.shard(k).lock();
                let v = shard
                    .objects
                    .get_mut(k.as_str())
                    .and_then(|e| e.current.as_mut())
                    .ok_or_else(|| {
                        KvError::new(Code::ObjectNotFound, format!("{k:?} not found"))
                    })?;
                v.lease_until = v.lease_until.max(now + self.cfg.lease_ttl);
                v.last_access = now;
                let mut replicas = self.describe(&v.replicas);
                if !suspect.is_empty() {
                    // Readers try replicas in order: live stores first.
                    replicas.sort_by_key(|r| suspect.contains(&r.segment));
                }
                Ok(ObjectLocation {
                    value_len: v.value_len,
                    generation: v.generation,
                    lease_ms: ms(self.cfg.lease_ttl),
                    replicas,
                })
            })
            .collect()
    }

    /// Counts reads a client made through cached locations as if located
    /// when they happened: recency, and a read lease from then. Per item,
    /// whether that version is still the current one.
    pub fn touch(&self, items: &[TouchItem], now: Instant) -> Vec<bool> {
        items
            .iter()
            .map(|it| {
                let at = now
                    .checked_sub(Duration::from_micros(it.age_us))
                    .unwrap_or(now);
                let mut shard = self.shard(&it.key).lock();
                let Some(v) = shard
                    .objects
                    .get_mut(it.key.as_str())
                    .and_then(|e| e.current.as_mut())
                    .filter(|v| v.generation == it.generation)
                else {
                    return false;
                };
                v.last_access = v.last_access.max(at);
                v.lease_until = v.lease_until.max(at + self.cfg.lease_ttl);
                true
            })
            .collect()
    }

    /// Value size of committed objects; does not touch recency or leases.
    pub fn exist(&self, keys: &[String]) -> Vec<KvResult<u64>> {
        keys.iter()
            .map(|k| {
                self.shard(k)
                    .lock()
                    .objects
                    .get(k.as_str())
                    .and_then(|e| e.current.as_ref())
                    .map(|v| v.value_len)
                    .ok_or_else(|| KvError::new(Code::ObjectNotFound, format!("{k:?} not found")))
            })
            .collect()
    }

    // ------------------------------------------------------------ removal

    fn remove_in(
        &self,
        shard: &mut Shard,
        key: &str,
        force: bool,
        now: Instant,
    ) -> KvResult<Version> {
        let e = shard
            .objects
            .get_mut(key)
            .filter(|e| e.current.is_some())
            .ok_or_else(|| KvError::new(Code::ObjectNotFound, format!("{key:?} not found")))?;
        if !force && e.current.as_ref().is_some_and(|v| v.lease_until > now) {
            return Err(KvError::new(
                Code::ObjectHasLease,
                format!("{key:?} has a live read lease"),
            ));
        }
        let v = e
            .current
            .take()
            .ok_or_else(|| KvError::from(Code::InternalError))?;
        if e.pending.is_none() {
            shard.objects.remove(key);
        }
        Ok(v)
    }

    /// Removes objects; one result per key.
    pub fn remove(&self, keys: &[String], force: bool, now: Instant) -> Vec<KvResult<()>> {
        keys.iter()
            .map(|k| {
                let v = self.remove_in(&mut self.shard(k).lock(), k, force, now)?;
                // A forced remove frees at once, as the caller asked; a reader still
                // in flight on it fails its header or checksum check, never returns
                // the new bytes.
                self.retire(k, &v);
                Ok(())
            })
            .collect()
    }

    /// Removes committed objects whose key `matches`; returns how many. Objects
    /// under a live lease are kept unless `force`.
    pub fn remove_matching(
        &self,
        matches: impl Fn(&str) -> bool,
        force: bool,
        now: Instant,
    ) -> u64 {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            let keys: Vec<String> = sh
                .objects
                .iter()
                .filter(|(k, e)| e.current.is_some() && matches(k))
                .map(|(k, _)| k.clone())
                .collect();
            let mut versions = Vec::new();
            for k in keys {
                if let Ok(v) = self.remove_in(&mut sh, &k, force, now) {
                    versions.push((k, v));
                }
            }
            drop(sh);
            removed += versions.len() as u64;
            for (k, v) in versions {
                self.retire(&k, &v);
            }
        }
        removed
    }

    // ------------------------------------------------------------ eviction

    /// Frees at least `need` bytes, and at least `eviction_ratio` of capacity,
    /// from the least recently used evictable objects.
    pub fn evict(&self, now: Instant, need: u64) -> Evicted {
        self.evict_on(now, need, None)
    }

    /// [`Self::evict`] limited to objects with a replica on `on`: evicting
    /// elsewhere frees nothing where the caller can allocate.
    fn evict_on(&self, now: Instant, need: u64, on: Option<&HashSet<SegmentId>>) -> Evicted {
        let _pass = self.evicting.lock();
        self.free_expired_deferred(now);
        let (cap, _) = self.usage();
        let target = need.max((cap as f64 * self.cfg.eviction_ratio) as u64);
        let mut candidates = Vec::new();
        for shard in self.shards.iter() {
            for (k, e) in shard.lock().objects.iter() {
                if let Some(v) = &e.current {
                    if !Self::evictable(v, now)
                        || on.is_some_and(|on| !v.replicas.iter().any(|(s, _)| on.contains(s)))
                    {
                        continue;
                    }
                    candidates.push(Candidate {
                        key: k.clone(),
                        generation: v.generation,
                        bytes: v.bytes(),
                        soft_pinned: v.soft_pin_until.is_some_and(|t| t > now),
                        idle: now.saturating_duration_since(v.last_access),
                    });
                }
            }
        }
        let mut out = Evicted::default();
        for c in eviction::choose(candidates, target) {
            let mut shard = self.shard(&c.key).lock();
            let Some(e) = shard.objects.get_mut(&c.key) else {
                continue;
            };
            // Re-check: the object may have been read or replaced since the scan.
            if !e
                .current
                .as_ref()
                .is_some_and(|v| v.generation == c.generation && Self::evictable(v, now))
            {
                continue;
            }
            let Some(v) = e.current.take() else { continue };
            if e.pending.is_none() {
                shard.objects.remove(&c.key);
            }
            drop(shard);
            out.objects += 1;
            out.bytes += v.bytes();
            self.retire(&c.key, &v);
        }
        self.evictions.fetch_add(out.objects, Ordering::Relaxed);
        if out.objects > 0 {
            tracing::debug!(objects = out.objects, bytes = out.bytes, "evicted");
        }
        out
    }

    fn evictable(v: &Version, now: Instant) -> bool {
        !v.hard_pin && v.lease_until <= now
    }

    /// Objects evicted since start.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    // ------------------------------------------------------------ timers

    fn free_expired_deferred(&self, now: Instant) {
        let due: Vec<_> = {
            let mut d = self.deferred.lock();
            let (due, keep): (Vec<_>, Vec<_>) = d.drain(..).partition(|(t, _, _)| *t <= now);
            *d = keep;
            due
        };
        // Their headers were destroyed when they were replaced.
        for (_, s, r) in due {
            self.free_now(&[(s, r)], None);
        }
    }

    /// Periodic upkeep: drops clients silent for `client_ttl` (their segments
    /// and puts in flight with them), revokes puts older than `pending_ttl`,
    /// and frees regions whose lease ended. Returns the clients dropped.
    pub fn sweep(&self, now: Instant) -> Vec<ClientId> {
        let lenders: HashSet<ClientId> = self.segments.read().values().map(|s| s.owner).collect();
        let (ttl, grace) = (self.cfg.client_ttl, self.cfg.store_grace);
        let dead: Vec<ClientId> = {
            let mut clients = self.clients.lock();
            let mut dead = Vec::new();
            for (id, c) in clients.iter_mut() {
                let silent = now.saturating_duration_since(c.last_seen);
                if silent <= ttl {
                    continue;
                }
                // A store's cache is worth a grace period: a store starved or
                // paused for a while comes back with nothing lost.
                if lenders.contains(id) && silent <= ttl + grace {
                    if !c.suspect {
                        c.suspect = true;
                        self.suspect_count.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(client = %id, hostname = %c.hostname, silent_ms = ms(silent), grace_ms = ms(grace),
                            "store missed its heartbeats: suspect; its segments take no new objects, its objects stay readable");
                    }
                    continue;
                }
                dead.push(*id);
            }
            for id in &dead {
                if let Some(c) = clients.remove(id) {
                    if c.suspect {
                        self.suspect_count.fetch_sub(1, Ordering::Relaxed);
                    }
                    tracing::warn!(client = %id, hostname = %c.hostname, "client expired");
                }
            }
            dead
        };
        if !dead.is_empty() {
            let owned: Vec<SegmentId> = self
                .segments
                .read()
                .values()
                .filter(|s| dead.contains(&s.owner))
                .map(|s| s.info.id)
                .collect();
            for id in owned {
                self.drop_segment(id);
            }
        }
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            let stale: Vec<(String, ClientId)> = sh
                .pending
                .iter()
                .filter(|(k, owner)| {
                    dead.contains(owner)
                        || sh
                            .objects
                            .get(k.as_str())
                            .and_then(|e| e.pending.as_ref())
                            .is_some_and(|p| {
                                now.saturating_duration_since(p.started) > self.cfg.pending_ttl
                            })
                })
                .map(|(k, c)| (k.clone(), *c))
                .collect();
            let mut freed = Vec::new();
            for (k, owner) in stale {
                if let Ok(p) = self.take_pending(&mut sh, owner, &k) {
                    if sh.objects.get(&k).is_some_and(|e| e.current.is_none()) {
                        sh.objects.remove(&k);
                    }
                    freed.push(p);
                }
            }
            drop(sh);
            for p in freed {
                self.free_now(&p.version.replicas, Some(p.version.generation));
            }
        }
        self.free_expired_deferred(now);
        dead
    }

    // ------------------------------------------------------------ status

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
                    }
                })
                .collect();
            v.sort_by(|a, b| a.info.name.cmp(&b.info.name));
            v
        };
        let (mut keys, mut pending) = (0, 0);
        for shard in self.shards.iter() {
            let sh = shard.lock();
            keys += sh.objects.values().filter(|e| e.current.is_some()).count() as u64;
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
        }
    }

    /// Everything known about one key, for the admin API.
    pub fn key_info(&self, key: &str, now: Instant) -> Option<KeyInfo> {
        let shard = self.shard(key).lock();
        let e = shard.objects.get(key)?;
        let v = e.current.as_ref()?;
        Some(KeyInfo {
            key: key.to_string(),
            value_len: v.value_len,
            generation: v.generation,
            replicas: self.describe(&v.replicas),
            lease_remaining_ms: ms(v.lease_until.saturating_duration_since(now)),
            soft_pin_remaining_ms: v
                .soft_pin_until
                .map(|t| ms(t.saturating_duration_since(now))),
            hard_pin: v.hard_pin,
            idle_ms: ms(now.saturating_duration_since(v.last_access)),
            put_in_flight: e.pending.is_some(),
        })
    }
}
