//! The segment registry: which memory and disk segments this store serves,
//! each with its mount fence, and what the table keeps for every handler —
//! the server's counters, the versions the master invalidated (so a late
//! write of one is refused), and the regions of shared-memory writers of an
//! earlier mount that are still held back from the pool.
//!
//! Nothing here moves payload bytes: the server (`serve`) and the
//! medium-specific code (`media`) look segments up here.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvpool_format::FIXED_LEN;
use kvpool_proto::msg::{SegmentId, StoreAboutReply};
use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::{Mutex, RwLock};

use super::media::invalidate_object;
use super::medium::Medium;
use super::on_disk::DiskSegment;
use super::starts::Starts;
use crate::disk::DiskFile;
use crate::fence::{fresh_value, Claim, Fence, SharedFence};
use crate::mapped::MappedRegion;
use crate::metrics::DataMetrics;

/// The segments a data server serves, by id: memory segments, and the
/// segments of other media (the disk tier) behind them.
#[derive(Default)]
pub struct SegmentTable {
    map: RwLock<HashMap<SegmentId, Arc<Served>>>,
    /// What a `StoreAbout` request is answered: the master and the
    /// segments as mounted (kept by the data node that owns the table).
    pub(super) about: RwLock<StoreAboutReply>,
    /// Segments on other media than memory (they take no wire writes).
    media: RwLock<HashMap<SegmentId, Arc<dyn Medium>>>,
    /// Shared-memory writers of an earlier fence that were still in their
    /// copies when their segment was mounted again: their regions are held
    /// back from the pool until they finish or die.
    held: Mutex<HashMap<SegmentId, Vec<Claim>>>,
    /// Memory-segment invalidations: a write of a version the master
    /// invalidated is refused (it may still be on its way, or its grant
    /// kept after its object went). Every write looks here.
    pub(super) revoked: RwLock<Revoked>,
    /// Tier move requests running, and those the master gave up.
    pub(super) moves: Mutex<super::media::MoveBook>,
    /// What the server of these segments counts (in the table so every
    /// handler reaches it).
    pub(super) metrics: Arc<DataMetrics>,
}

/// A memory segment served here.
pub(super) struct Served {
    pub(super) region: Arc<MappedRegion>,
    /// Start of the object area.
    pub(super) base: u64,
    pub(super) fence: Fence,
    /// The segment file, for asking the kernel whether its shared-memory
    /// writers are alive; `None` for anonymous memory, which no other
    /// process maps.
    pub(super) file: Option<Arc<File>>,
    /// Where the objects this store wrote start (see `starts`).
    pub(super) starts: Starts,
}

/// How long a new mount waits for shared-memory writers of the old fence
/// to finish their copies before holding their regions back: a copy takes
/// microseconds to milliseconds unless its process is paused.
const STALE_WAIT: Duration = Duration::from_millis(200);

/// How long a store remembers an invalidation: well past the master's
/// default pending TTL (60 s), which is how long a write grant lasts.
const REVOKED_FOR: Duration = Duration::from_secs(600);

/// At most this many invalidations are remembered by default (oldest go
/// first): about 130 bytes each, 34 MiB at most; 10 minutes' worth up to
/// ~440 removals and evictions a second, a grant's lifetime up to ~4,000.
/// Past that a stale grant is still refused wherever a newer object starts
/// in its range (see `starts`).
pub const INVALIDATIONS_KEPT: usize = 1 << 18;

/// Environment variable that overrides [`INVALIDATIONS_KEPT`] (at least 1).
pub const INVALIDATIONS_KEPT_ENV: &str = "KVPOOL_INVALIDATIONS_KEPT";

/// [`INVALIDATIONS_KEPT`], or its environment variable's value.
fn revoked_max() -> usize {
    static KEPT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *KEPT.get_or_init(|| {
        std::env::var(INVALIDATIONS_KEPT_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(INVALIDATIONS_KEPT, |n| n.max(1))
    })
}

/// Versions the master invalidated, by region. A writer cut off from the
/// pool (its link down, its process paused) may deliver a put long after
/// the master gave the put up, and a writer may keep its grant after its
/// object was removed; either write must not land, since the region may
/// hold another object by then, and its object must not become findable,
/// or a scan (a restarted store, a new master leader rebuilding from
/// inventories) would bring back a value that was replaced or removed.
#[derive(Default)]
pub(super) struct Revoked {
    /// `(segment, offset)` to the generations invalidated there.
    pub(super) at: HashMap<(SegmentId, u64), Vec<u64>>,
    /// In the order they came, to forget the oldest.
    order: VecDeque<(Instant, SegmentId, u64, u64)>,
}

impl Revoked {
    pub(super) fn insert(
        &mut self,
        segment: SegmentId,
        offset: u64,
        generation: u64,
        now: Instant,
    ) {
        while self.order.len() >= revoked_max()
            || self
                .order
                .front()
                .is_some_and(|(t, ..)| now.duration_since(*t) > REVOKED_FOR)
        {
            let Some((_, s, o, g)) = self.order.pop_front() else {
                break;
            };
            self.forget(s, o, g);
        }
        self.at
            .entry((segment, offset))
            .or_default()
            .push(generation);
        self.order.push_back((now, segment, offset, generation));
    }

    fn forget(&mut self, segment: SegmentId, offset: u64, generation: u64) {
        if let Some(gens) = self.at.get_mut(&(segment, offset)) {
            gens.retain(|&g| g != generation);
            if gens.is_empty() {
                self.at.remove(&(segment, offset));
            }
        }
    }
}

impl SegmentTable {
    /// The counters of the server of these segments.
    pub fn metrics(&self) -> &Arc<DataMetrics> {
        &self.metrics
    }

    /// Starts serving the disk segment `file` as `id` (object area from
    /// `base`); it takes no writes over the wire, only its store's copies.
    pub fn insert_disk(&self, id: SegmentId, file: Arc<DiskFile>, base: u64) {
        let fence = Fence::default();
        self.insert_medium(id, Arc::new(DiskSegment { file, base, fence }));
    }

    /// Starts serving `medium` as `id`: a segment that takes no writes
    /// over the wire, only its store's copies.
    pub(super) fn insert_medium(&self, id: SegmentId, medium: Arc<dyn Medium>) {
        self.media.write().insert(id, medium);
    }

    /// Stops serving the disk (or other non-memory) segment `id`; whether
    /// it was served.
    pub fn remove_disk(&self, id: SegmentId) -> bool {
        self.media.write().remove(&id).is_some()
    }

    /// The medium segment `id` is on, if it is served here.
    pub(super) fn medium(&self, id: SegmentId) -> Option<Arc<dyn Medium>> {
        if let Some(s) = self.served(id) {
            return Some(s);
        }
        self.media.read().get(&id).cloned()
    }

    /// Whether `id` is a segment on another medium than memory (it takes no
    /// wire writes).
    pub(super) fn elsewhere(&self, id: SegmentId) -> bool {
        self.media.read().contains_key(&id)
    }

    /// Starts serving `region` as `id`; bytes below `base` (the segment's own
    /// superblock) are never written over the wire. It takes no writes
    /// until its first [`Self::refence`].
    pub fn insert(&self, id: SegmentId, region: Arc<MappedRegion>, base: u64) {
        let file = region.path().and_then(|p| File::open(p).ok()).map(Arc::new);
        let fence = Fence::default();
        (self.map.write()).insert(
            id,
            Arc::new(Served {
                starts: Starts::new(region.len()),
                region,
                base,
                fence,
                file,
            }),
        );
    }

    /// Stops serving `id`.
    pub fn remove(&self, id: SegmentId) -> Option<Arc<MappedRegion>> {
        self.held.lock().remove(&id);
        self.map.write().remove(&id).map(|s| s.region.clone())
    }

    /// The region for `id` and the start of its object area.
    pub fn get(&self, id: SegmentId) -> Option<(Arc<MappedRegion>, u64)> {
        self.served(id).map(|s| (s.region.clone(), s.base))
    }

    /// The memory segment `id`, if served here.
    pub(super) fn served(&self, id: SegmentId) -> Option<Arc<Served>> {
        self.map.read().get(&id).cloned()
    }

    /// Starts a new mount of segment `id` (see [`crate::fence`]): a fresh
    /// fence value, from which on nothing granted under an earlier one
    /// lands. Returns the value, and the regions `(offset, len)` to hold
    /// back from the pool: those of shared-memory writers of an earlier
    /// value still in their copies after [`STALE_WAIT`]. Blocks that long
    /// at most; `None` if `id` is not served here.
    pub fn refence(&self, id: SegmentId) -> Option<(u64, Vec<(u64, u64)>)> {
        let Some(s) = self.served(id) else {
            let medium = self.media.read().get(&id)?.clone();
            let value = fresh_value(medium.fence().value());
            medium.fence().set(value);
            return Some((value, Vec::new()));
        };
        let value = fresh_value(s.fence.value());
        s.fence.set(value);
        let (Some(shared), Some(file)) = (SharedFence::new(&s.region), s.file.as_deref()) else {
            return Some((value, Vec::new()));
        };
        shared.publish(value);
        // Writers held back at an earlier mount that finished since left
        // objects the scan after this must not find.
        self.release_finished(id, &s, &shared, file);
        let mut claims = shared.stale(value);
        let until = Instant::now() + STALE_WAIT;
        loop {
            claims.retain(|c| shared.holds(c, file));
            if claims.is_empty() || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let regions = claims.iter().map(|c| (c.offset, c.len)).collect();
        if claims.is_empty() {
            self.held.lock().remove(&id);
        } else {
            tracing::warn!(segment = %id, regions = ?regions, "shared-memory writers of the previous mount are still copying (paused?): their regions are held back until they finish");
            self.held.lock().insert(id, claims);
        }
        Some((value, regions))
    }

    /// The regions still held back, as `(segment, offset, len)` (a store
    /// reports them with every heartbeat; the master releases what is no
    /// longer reported). A writer that finished its copy since has left an
    /// object of a put nobody will commit: it is destroyed first. Also
    /// frees the write slots of writers that died in a copy.
    pub fn held(&self) -> Vec<(SegmentId, u64, u64)> {
        let mut held = self.held.lock();
        let mut out = Vec::new();
        for (id, s) in self.map.read().iter() {
            let (Some(shared), Some(file)) = (SharedFence::new(&s.region), s.file.as_deref())
            else {
                continue;
            };
            if let Some(claims) = held.get_mut(id) {
                retain_holding(claims, s, &shared, file);
                out.extend(claims.iter().map(|c| (*id, c.offset, c.len)));
            }
            let reaped = shared.reap(file);
            if reaped > 0 {
                tracing::info!(segment = %id, reaped, "freed the write slots of shared-memory writers that died mid-copy");
            }
        }
        held.retain(|_, c| !c.is_empty());
        out
    }

    fn release_finished(&self, id: SegmentId, s: &Served, shared: &SharedFence, file: &File) {
        if let Some(claims) = self.held.lock().get_mut(&id) {
            retain_holding(claims, s, shared, file);
        }
    }

    /// Destroys an object that a write just put at `offset` if the master
    /// had already invalidated its version (see [`Revoked`]).
    pub(super) fn landed(
        &self,
        segment: SegmentId,
        offset: u64,
        region: &MappedRegion,
    ) -> KvResult<()> {
        let destroyed = self
            .revoked
            .read()
            .at
            .get(&(segment, offset))
            .and_then(|gens| {
                gens.iter()
                    .copied()
                    .find(|&g| invalidate_object(region, offset, g))
            });
        let Some(generation) = destroyed else {
            return Ok(());
        };
        self.revoked.write().forget(segment, offset, generation);
        Err(KvError::new(
            Code::TransferFail,
            format!("the put of generation {generation} at {offset} was given up by the master before its bytes arrived"),
        ))
    }

    /// Changes what a `StoreAbout` request is answered.
    pub fn describe(&self, f: impl FnOnce(&mut StoreAboutReply)) {
        f(&mut self.about.write());
    }
}

/// Keeps the claims whose writers still copy; destroys what the others
/// left (a put of an earlier mount, which nobody will commit).
fn retain_holding(claims: &mut Vec<Claim>, s: &Served, shared: &SharedFence, file: &File) {
    claims.retain(|c| {
        let keep = shared.holds(c, file);
        if !keep {
            destroy_any(&s.region, c.offset);
        }
        keep
    });
}

/// Destroys whatever object starts at `offset` of `region` (one no
/// master will ever point to).
fn destroy_any(region: &MappedRegion, offset: u64) {
    if !region.contains(offset, FIXED_LEN as u64) {
        return;
    }
    // SAFETY: in bounds (checked above); the region is held back from the
    // pool, so nothing else writes it.
    let head = unsafe { region.slice(offset, FIXED_LEN as u64) };
    if let Some(generation) = kvpool_format::scan::fixed_generation(head) {
        invalidate_object(region, offset, generation);
    }
}
