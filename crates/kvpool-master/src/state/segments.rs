//! Mounted segments: mounting, inventories reported by (re)started stores
//! and their reconciliation with the object map, draining and unmounting,
//! and the allocation of regions for new objects.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kvpool_proto::msg::{
    ClientId, InventoryItem, Replica, SegmentId, SegmentInfo, SegmentIo, Tier,
};
use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::alloc::{normalize_len, OffsetAllocator, Region, ALIGN};
use crate::placement::{self, SegmentView};
use crate::refusals::Refusal;

use super::*;

/// Where a remounted segment's inventory stands.
pub(super) enum Recovery {
    /// Parts reported so far; more to come.
    Reporting(Vec<InventoryItem>),
    /// Every part arrived and the whole is being reconciled (see
    /// `report_objects`): a mount or a part sent again meanwhile is refused.
    Reconciling,
}

/// The memory segments a batch of puts may take, with their largest free
/// blocks, read once for the batch. Read for every object, they locked
/// and searched every segment's allocator per object: batches of 32 puts
/// over 256 segments cost the master 17 µs an object, 7-9 read once
/// (`kvpool bench-meta --segments 256`).
pub(super) struct Candidates {
    /// The segments that may take new objects now (see
    /// [`MasterState::placeable`]), by id.
    pub(super) ids: Vec<SegmentId>,
    /// Their largest free blocks: exact for what the batch placed, maybe
    /// stale for what others placed or freed meanwhile.
    free: Vec<u64>,
}

/// A mounted segment: who lends it, its allocator, and its state.
pub(super) struct SegmentSlot {
    pub(super) info: SegmentInfo,
    pub(super) owner: ClientId,
    pub(super) alloc: Mutex<OffsetAllocator>,
    /// Its inventory, while it is reported and reconciled: takes no new
    /// objects until both are done.
    pub(super) recovering: Option<Recovery>,
    /// Objects its inventory announced: the parts reported may not hold
    /// many more (a part sent again after a lost answer counts twice).
    pub(super) announced: u64,
    /// Shutting down or being emptied: takes no new objects.
    pub(super) draining: bool,
    /// Its store's I/O on it (disk segments), as of the last heartbeat.
    pub(super) io: Option<SegmentIo>,
    /// Versions committed after this are not expected in the inventory.
    pub(super) scan_cutoff: Instant,
    /// The secret a re-mount of this id must prove.
    possession: [u8; 16],
    /// The fence value of its latest mount, named in every grant for it.
    pub(super) fence: u64,
    /// Regions its store holds back (shared-memory writers of an earlier
    /// fence still copying): reserved here until the store stops reporting
    /// them. Those of a mount whose inventory is still coming are `wanted`.
    pub(super) held: Vec<Region>,
    pub(super) wanted: Vec<(u64, u64)>,
    /// Which allocator it has (see [`MasterState::allocator_of`]).
    pub(super) allocator: u64,
}

/// What a store says when it mounts a segment, besides the segment.
#[derive(Debug, Clone, Default)]
pub struct MountSpec {
    /// Objects its inventory will report.
    pub objects: u64,
    /// How long before the mount its scan began.
    pub scan_age: Duration,
    /// The segment's secret.
    pub possession: [u8; 16],
    /// The mount's fence value (see `MountSegment::fence`).
    pub fence: u64,
    /// Regions to hold back (see `MountSegment::held`).
    pub held: Vec<(u64, u64)>,
}

impl MasterState {
    /// Lends a segment to the pool. `objects` > 0 announces an inventory
    /// (reported next with [`Self::report_objects`]): the segment takes no
    /// new objects until it is complete. A segment still mounted under
    /// another client is taken over: its store restarted within the TTL.
    /// (For tools and tests: every segment proves the same zero secret, and
    /// its fence is 1.)
    pub fn mount(
        &self,
        client: ClientId,
        info: SegmentInfo,
        objects: u64,
        now: Instant,
    ) -> KvResult<()> {
        let spec = MountSpec {
            objects,
            fence: 1,
            ..MountSpec::default()
        };
        self.mount_scanned(client, info, spec, now)
    }

    /// [`Self::mount`] as a store says it: a scan that began `scan_age` ago
    /// (objects committed since then are missing from its inventory but not
    /// lost), a secret, a fence, and regions to hold back.
    pub fn mount_scanned(
        &self,
        client: ClientId,
        info: SegmentInfo,
        spec: MountSpec,
        now: Instant,
    ) -> KvResult<()> {
        let MountSpec {
            objects,
            scan_age,
            possession,
            fence,
            held,
        } = spec;
        self.require_client(client, now)?;
        // An id derived from its proof needs that proof, also on a master
        // that never saw the segment (after a restart, before its store is
        // back); a random id of an older store only the secret seen first.
        if info.id.proved_by(&possession) == Some(false) {
            return Err(KvError::new(
                Code::Unauthorized,
                format!(
                    "segment {} is not this store's: its proof of possession does not match its id",
                    info.id
                ),
            ));
        }
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
        let unit = super::tiers::unit(info.tier);
        if info.tier != Tier::ALL[0] && !info.base.is_multiple_of(unit) {
            return Err(KvError::new(
                Code::InvalidParams,
                format!(
                    "a {} segment's object area must start at a multiple of {unit}",
                    info.tier.name()
                ),
            ));
        }
        // Every object takes at least one aligned region.
        if objects > info.size / ALIGN {
            return Err(self.refusals.refuse(
                Refusal::Inventory,
                KvError::new(
                    Code::InvalidParams,
                    format!(
                        "segment {} of {} bytes cannot hold the {objects} objects announced",
                        info.id, info.size
                    ),
                ),
            ));
        }
        let recovering = (objects > 0).then(|| Recovery::Reporting(Vec::new()));
        let segs = self.segments.read();
        let max = self.cfg.limits.max_segments_per_client;
        if segs.get(&info.id).is_none_or(|s| s.owner != client)
            && segs.values().filter(|s| s.owner == client).count() >= max
        {
            drop(segs);
            return Err(self.refusals.refuse(
                Refusal::SegmentsPerClient,
                KvError::new(
                    Code::InvalidParams,
                    format!(
                        "client {client} lends {max} segments, the limit: segment {} refused",
                        info.id
                    ),
                ),
            ));
        }
        // Numbered only once it is admitted: numbers are never given back.
        drop(segs);
        self.numbers.write().number(info.id, info.tier);
        if info.tier != Tier::ALL[0] {
            self.disk_tier.store(true, Ordering::Relaxed);
        }
        let mut segs = self.segments.write();
        if let Some(s) = segs.get_mut(&info.id) {
            if !same_secret(&s.possession, &possession) {
                return Err(KvError::new(
                    Code::Unauthorized,
                    format!(
                        "segment {} is mounted and this store cannot prove it holds it",
                        info.id
                    ),
                ));
            }
            if (s.info.base, s.info.size, s.info.tier) != (info.base, info.size, info.tier) {
                return Err(KvError::new(
                    Code::SegmentAlreadyExists,
                    format!("segment {} is mounted with another size", info.id),
                ));
            }
            if matches!(s.recovering, Some(Recovery::Reconciling)) {
                return Err(reconciling(info.id));
            }
            // Grants from now on name the new fence; the old ones' writes are
            // refused by the store. This master's own records of them (puts
            // in flight, abandoned puts' regions) keep their regions reserved
            // until they can no longer land: held regions add nothing here.
            s.fence = fence;
            if s.owner == client && s.info == info && s.recovering.is_none() && recovering.is_none()
            {
                return Ok(());
            }
            // Its store restarted (maybe on another port) within the TTL.
            tracing::info!(segment = %info.id, endpoint = %info.endpoint, "segment remounted by a restarted store");
            s.info = info.clone();
            s.owner = client;
            s.recovering = recovering;
            s.announced = objects;
            s.draining = false;
            s.scan_cutoff = cutoff;
            drop(segs);
            if objects == 0 {
                // Nothing survived: every replica the master placed there is gone.
                self.reconcile_known(info.id, &[]);
                self.arrived(info.id);
            }
            return Ok(());
        }
        tracing::info!(segment = %info.id, name = %info.name, endpoint = %info.endpoint, size = info.size, objects, held = held.len(), "segment mounted");
        // With an inventory to come, held regions are reserved with it.
        let (alloc, held, wanted) = if objects == 0 {
            let (alloc, _, held) = rebuild(&info, &[], &held).map_err(|e| {
                KvError::new(
                    Code::InvalidParams,
                    format!("held regions of {}: {e}", info.id),
                )
            })?;
            (alloc, held, Vec::new())
        } else {
            (OffsetAllocator::new(info.base, info.size), Vec::new(), held)
        };
        if objects == 0 {
            // Empty: nothing to wait for.
            self.arrived(info.id);
        }
        segs.insert(
            info.id,
            SegmentSlot {
                alloc: Mutex::new(alloc),
                info,
                owner: client,
                recovering,
                announced: objects,
                draining: false,
                io: None,
                scan_cutoff: cutoff,
                possession,
                fence,
                held,
                wanted,
                allocator: self.allocators.fetch_add(1, Ordering::Relaxed) + 1,
            },
        );
        Ok(())
    }

    pub(super) fn open_segment(&self, id: SegmentId) {
        if let Some(s) = self.segments.write().get_mut(&id) {
            s.recovering = None;
        }
        self.arrived(id);
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

    /// Drains a segment for the store that proves it holds it (the
    /// secret it mounted with); nobody else's proof drains it.
    pub fn drain_own(&self, id: SegmentId, possession: &[u8; 16]) -> KvResult<()> {
        let mut segs = self.segments.write();
        let Some(s) = segs.get_mut(&id) else {
            return Err(KvError::new(
                Code::SegmentNotFound,
                format!("segment {id} is not mounted"),
            ));
        };
        if !same_secret(&s.possession, possession) {
            return Err(KvError::new(
                Code::Unauthorized,
                format!("segment {id} is not this store's: its proof of possession does not match"),
            ));
        }
        s.draining = true;
        Ok(())
    }

    /// Unmounts a segment on an operator's request (after a drain).
    pub fn unmount_admin(&self, id: SegmentId) {
        self.drop_segment(id, None);
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
        self.drop_segment(id, None);
        Ok(())
    }

    /// Forgets a segment and every replica on it. Objects left without a
    /// replica are gone; puts writing to it are revoked. Given up (at
    /// `given_up`, its store silent), returns the hashes
    /// ([`Self::key_hash`]) of the keys that had a replica on it, and fences
    /// those a client may still read there (see [`Self::fence_gone_copy`]).
    pub(super) fn drop_segment(&self, id: SegmentId, given_up: Option<Instant>) -> HashSet<u64> {
        let mut held = HashSet::new();
        if self.segments.write().remove(&id).is_none() {
            return held;
        }
        tracing::info!(segment = %id, "segment unmounted");
        self.deferred.lock().retain(|(_, s, _, _)| *s != id);
        self.after_invalidation.lock().retain(|(_, s, _)| *s != id);
        // Copies to it in flight: their regions are no allocator's now.
        self.copies.lock().retain(|(_, s), _| *s != id);
        self.forget_segment_copies(id);
        let no = self.numbers.read().get(id);
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            let sh = &mut *sh;
            if let Some(no) = no {
                if let Some(now) = given_up {
                    for (i, v) in sh.objects.iter() {
                        if sh.objects.replicas(i).any(|(s, _)| s == no) {
                            let key = sh.objects.key(i);
                            held.insert(self.key_hash(&key));
                            self.fence_gone_copy(&key, id, v.lease_until, now);
                        }
                    }
                }
                sh.objects.retain_replicas(|_, s, _| s != no);
            }
            let mut revoked = Vec::new();
            sh.pending.retain(|key, p| {
                let on = p.version.replicas.iter().any(|(s, _)| *s == id);
                if on {
                    self.forget_pending(key, p);
                    revoked.push((p.version.replicas.clone(), p.version.generation));
                }
                !on
            });
            for (replicas, generation) in revoked {
                self.free_now(&replicas, Some(generation));
            }
        }
        held
    }

    /// Total and used bytes over all mounted memory segments: what the
    /// high watermark and eviction are about (the disk tier has its own).
    pub fn usage(&self) -> (u64, u64) {
        self.tier_usage(Tier::Memory)
    }

    /// Total and used bytes over all mounted segments of `tier`.
    pub fn tier_usage(&self, tier: Tier) -> (u64, u64) {
        let segs = self.segments.read();
        segs.values()
            .filter(|s| s.info.tier == tier)
            .fold((0, 0), |(cap, used), s| {
                let a = s.alloc.lock();
                (cap + a.capacity(), used + a.used())
            })
    }

    /// The mounted segments of `tier`.
    pub(super) fn tier_segments(&self, tier: Tier) -> Vec<SegmentId> {
        self.segments
            .read()
            .values()
            .filter(|s| s.info.tier == tier)
            .map(|s| s.info.id)
            .collect()
    }

    /// Releases the regions held back on `client`'s segments that its store
    /// no longer reports as held (`held`: `(segment, offset, len)`); the
    /// store destroyed what the late writer left there first.
    pub fn record_held(&self, client: ClientId, held: &[(SegmentId, u64, u64)]) {
        // Every heartbeat comes here: the common case takes no write lock.
        let segs = self.segments.read();
        if !(segs.values()).any(|s| s.owner == client && !s.held.is_empty()) {
            return;
        }
        drop(segs);
        let mut released = Vec::new();
        {
            let mut segs = self.segments.write();
            for (id, s) in segs.iter_mut() {
                if s.owner != client || s.held.is_empty() {
                    continue;
                }
                s.held.retain(|r| {
                    let keep = held.iter().any(|&(h, o, _)| h == *id && o == r.offset);
                    if !keep {
                        released.push((*id, *r));
                    }
                    keep
                });
            }
        }
        if !released.is_empty() {
            tracing::info!(regions = ?released, "held regions released: their late writers finished or died");
            self.free_now(&released, None);
        }
    }

    /// Records a store's report of its I/O on its segments.
    pub fn record_io(&self, client: ClientId, io: &[SegmentIo]) {
        if io.is_empty() {
            return;
        }
        let mut segs = self.segments.write();
        for r in io {
            if let Some(s) = segs.get_mut(&r.segment).filter(|s| s.owner == client) {
                s.io = Some(*r);
            }
        }
    }

    /// Whether used bytes have reached the high watermark.
    pub fn above_watermark(&self) -> bool {
        let (cap, used) = self.usage();
        cap > 0 && used as f64 >= cap as f64 * self.cfg.high_watermark
    }

    /// Whether any memory segment may take new objects now.
    pub fn takes_new_objects(&self, now: Instant) -> bool {
        !self.placeable(now).is_empty()
    }

    /// Memory segments that may take new objects now: not recovering an
    /// inventory, not draining, with an owner that heartbeats, and (with HA)
    /// named by the segment list in etcd.
    pub(super) fn placeable(&self, now: Instant) -> HashSet<SegmentId> {
        self.open_segments(now, Tier::Memory)
    }

    /// Segments of `tier` that may take new objects now (see [`Self::placeable`]).
    pub(super) fn open_segments(&self, now: Instant, tier: Tier) -> HashSet<SegmentId> {
        self.map_open(now, tier, |s| s.info.id)
    }

    /// `f` of each segment of `tier` that may take new objects now, in id order.
    fn map_open<R, C: FromIterator<R>>(
        &self,
        now: Instant,
        tier: Tier,
        f: impl FnMut(&SegmentSlot) -> R,
    ) -> C {
        let owners: HashSet<ClientId> = self.segments.read().values().map(|s| s.owner).collect();
        let late = self.late_owners(owners, now);
        let segs = self.segments.read();
        let listed = self.listing();
        segs.values()
            .filter(|s| {
                s.info.tier == tier
                    && s.recovering.is_none()
                    && !s.draining
                    && !late.contains(&s.owner)
                    && listed(&s.info.id)
            })
            .map(f)
            .collect()
    }

    /// How many of `among` could ever hold a region of `len` bytes.
    pub(super) fn fitting(&self, len: u64, among: Option<&[SegmentId]>) -> usize {
        let segs = self.segments.read();
        let fits = |s: &&SegmentSlot| s.alloc.lock().capacity() >= len;
        match among {
            None => segs.values().filter(fits).count(),
            Some(ids) => ids
                .iter()
                .filter_map(|id| segs.get(id))
                .filter(fits)
                .count(),
        }
    }

    /// The segments a batch of puts may take now, read once for the batch.
    pub(super) fn candidates(&self, now: Instant) -> Candidates {
        let (ids, free) = self.map_open(now, Tier::Memory, |s| {
            (s.info.id, s.alloc.lock().largest_free())
        });
        Candidates { ids, free }
    }

    /// Reserves a region of `region_len` bytes on up to `replica_num`
    /// distinct segments among `cands`, placed by [`placement::order`].
    pub(super) fn allocate(
        &self,
        region_len: u64,
        replica_num: usize,
        preferred: &[String],
        cands: &mut Candidates,
    ) -> Vec<(SegmentId, Region)> {
        let segs = self.segments.read();
        // `replica_num` is the caller's: never reserve room beyond the segments.
        let mut got: Vec<(SegmentId, Region)> =
            Vec::with_capacity(replica_num.min(cands.ids.len()));
        let seed = self
            .placements
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The batch's view of free space is exact for what it placed itself
        // but not for what others placed or freed since: falling short on
        // it, look again before the caller counts and evicts.
        for fresh in [false, true] {
            if fresh {
                for (id, free) in cands.ids.iter().zip(&mut cands.free) {
                    *free = segs.get(id).map_or(0, |s| s.alloc.lock().largest_free());
                }
            }
            // Names only matter to preferred segments.
            let name = |id| {
                let slot = (!preferred.is_empty()).then(|| segs.get(id)).flatten();
                slot.map_or("", |s: &SegmentSlot| s.info.name.as_str())
            };
            let views: Vec<SegmentView> = (cands.ids.iter().zip(&cands.free))
                .filter(|(id, _)| !got.iter().any(|(g, _)| g == *id))
                .map(|(id, free)| SegmentView {
                    id: *id,
                    name: name(id),
                    free: *free,
                })
                .collect();
            let mut order = placement::order(&views, region_len, preferred, seed);
            let mut seen = Vec::new();
            while got.len() < replica_num {
                let Some(id) = order.next() else { break };
                let Some(s) = segs.get(&id) else { continue };
                let mut alloc = s.alloc.lock();
                if let Some(r) = alloc.alloc(region_len) {
                    got.push((id, r));
                }
                seen.push((id, alloc.largest_free()));
            }
            for (id, free) in seen {
                if let Ok(i) = cands.ids.binary_search(&id) {
                    cands.free[i] = free;
                }
            }
            if got.len() >= replica_num {
                break;
            }
        }
        got
    }

    /// [`Self::describe`] for replicas named by segment number.
    pub(super) fn describe_numbered(
        &self,
        replicas: impl Iterator<Item = (SegNo, Region)>,
    ) -> Vec<Replica> {
        let named: Vec<(SegmentId, Region)> = {
            let numbers = self.numbers.read();
            replicas.map(|(no, r)| (numbers.id(no), r)).collect()
        };
        self.describe(&named)
    }

    pub(super) fn describe(&self, replicas: &[(SegmentId, Region)]) -> Vec<Replica> {
        let segs = self.segments.read();
        replicas
            .iter()
            .filter_map(|(id, r)| {
                segs.get(id).map(|s| Replica {
                    segment: *id,
                    endpoint: s.info.endpoint.clone(),
                    offset: r.offset,
                    len: r.len,
                    cap: None,
                    tier: s.info.tier,
                    fence: s.fence,
                })
            })
            .collect()
    }
}

impl MasterState {
    /// The fence value of segment `id`'s latest mount (0 if not mounted).
    pub fn fence_of(&self, id: SegmentId) -> u64 {
        self.segments.read().get(&id).map_or(0, |s| s.fence)
    }

    /// Which allocator segment `id` has (0 if not mounted): a new one when
    /// the segment is mounted anew or rebuilt from an inventory. A region
    /// reserved in another one is not this one's to free.
    pub(super) fn allocator_of(&self, id: SegmentId) -> u64 {
        self.segments.read().get(&id).map_or(0, |s| s.allocator)
    }
}

/// An allocator for `info`'s segment with `items`' regions and the `held`
/// ones in use; returns it with the items' regions (in offset order, as
/// the items must be) and the held ones.
pub(super) fn rebuild(
    info: &SegmentInfo,
    items: &[InventoryItem],
    held: &[(u64, u64)],
) -> Result<(OffsetAllocator, Vec<Region>, Vec<Region>), String> {
    let used = items.iter().map(|i| (i.offset, i.region_len));
    let alloc = OffsetAllocator::with_used(info.base, info.size, used.chain(held.iter().copied()))
        .map_err(|e| e.to_string())?;
    // `with_used` checked every length: none overflows when rounded.
    let region = |(offset, len): (u64, u64)| Region {
        offset,
        len: normalize_len(len).unwrap_or(len),
    };
    let items = items.iter().map(|i| region((i.offset, i.region_len)));
    Ok((
        alloc,
        items.collect(),
        held.iter().copied().map(region).collect(),
    ))
}

/// Compares two secrets in time that does not depend on where they differ.
fn same_secret(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The answer to a store that mounts or reports a segment again while the
/// master reconciles its inventory (a big one takes seconds): the store's
/// call timed out and was sent again. Retryable: once the reconcile ends,
/// a new mount reports the whole inventory again. Serving it meanwhile
/// would reconcile the part sent again alone, rejecting every object in
/// it that the running reconcile has not reached yet (and the store then
/// destroys them), and open the segment before its objects are known.
pub(super) fn reconciling(id: SegmentId) -> KvError {
    KvError::new(
        Code::UnavailableInCurrentStatus,
        format!("the inventory of segment {id} is being reconciled; mount it again once that ends"),
    )
}
