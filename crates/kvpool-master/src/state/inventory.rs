//! Restart recovery: the inventories remounted segments report, taken in
//! parts and reconciled with the object map (objects the master knows,
//! objects it forgot, versions it superseded meanwhile).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvpool_proto::msg::{ClientId, InventoryItem, InventoryVerdict, SegmentId};
use kvpool_proto::{Code, KvError, KvResult};
use tokio::time::Instant;

use crate::alloc::Region;
use crate::refusals::Refusal;

use super::segments::{rebuild, Recovery};
use super::table::ObjectTable;
use super::*;

/// Replicas a reconcile names one by one in the log; the rest are counted.
const LOST_LOGGED: usize = 100;

/// Inventories from this many objects are reconciled by several threads.
const PARALLEL_FROM: usize = 50_000;

// Shard numbers are kept as u16 while the items are sorted by shard.
const _: () = assert!(SHARDS <= 1 << 16);

/// Threads one reconcile uses at most.
const MAX_THREADS: usize = 8;

/// Objects a reconcile takes under one lock of a shard, so that calls on
/// that shard wait for no more than these.
const PER_LOCK: usize = 256;

/// What the threads of one fresh reconcile share.
struct Run<'a> {
    id: SegmentId,
    no: SegNo,
    now: Instant,
    at: Tick,
    /// The highest generation an item may claim.
    bound: u64,
    items: &'a [InventoryItem],
    regions: &'a [Region],
    /// Indexes of `items` by shard: shard `s`'s are `order[starts[s]..starts[s + 1]]`.
    order: &'a [u32],
    starts: &'a [usize],
    /// Rejections logged so far, of [`LOST_LOGGED`].
    logged: AtomicUsize,
    /// For a segment given up: the keys it held then that nobody wrote
    /// since (see [`MasterState::give_up_segment`]; none known if another
    /// leader gave it up, [`MasterState::given_up_before`]).
    given_up: Option<HashSet<u64>>,
}

/// What one thread of a fresh reconcile decided.
#[derive(Default)]
struct Part {
    accepted: u64,
    /// `(offset, generation)` of each rejected item, and its region.
    rejected: Vec<((u64, u64), Region)>,
}

/// Hands the memory the allocator holds free back to the system. A big
/// inventory's keys (about 130 B an object) are freed only once the
/// reconcile is done, when the objects they became have taken memory of
/// their own, so the allocator would keep them as free memory for good:
/// 1.1 GB more resident after a reconcile of 10M objects.
fn give_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory; it has no other effect.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl MasterState {
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
        let (mut all, fresh, info, wanted) = {
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
            let inv = match s.recovering.as_mut() {
                Some(Recovery::Reporting(inv)) => inv,
                Some(Recovery::Reconciling) => return Err(super::segments::reconciling(id)),
                None => {
                    return Err(KvError::new(
                        Code::InvalidParams,
                        format!("segment {id} announced no inventory"),
                    ))
                }
            };
            let reported = (inv.len() + items.len()) as u64;
            if reported > s.announced.saturating_mul(2) {
                let announced = s.announced;
                drop(segs);
                return Err(self.refusals.refuse(
                    Refusal::Inventory,
                    KvError::new(
                        Code::InvalidParams,
                        format!(
                            "inventory of {id}: {reported} objects reported, {announced} announced"
                        ),
                    ),
                ));
            }
            inv.extend(items);
            if !last {
                return Ok(InventoryVerdict::default());
            }
            // Still recovering until reconciled: it takes no new objects
            // while the rest runs without the segment lock.
            let all = std::mem::take(inv);
            s.recovering = Some(Recovery::Reconciling);
            // A segment that holds no live region yet was new to this master.
            let fresh = s.alloc.lock().live_regions() == 0;
            (all, fresh, s.info.clone(), std::mem::take(&mut s.wanted))
        };
        // A part sent again (its answer was lost) reports the same regions.
        all.sort_unstable_by_key(|i| i.offset);
        all.dedup_by_key(|i| i.offset);
        // The regions of a fresh segment's inventory, in its (offset) order.
        let mut regions = Vec::new();
        if fresh {
            let alloc = rebuild(&info, &all, &wanted).map(|(alloc, items, held)| {
                regions = items;
                (alloc, held)
            });
            let mut segs = self.segments.write();
            let slot = segs
                .get_mut(&id)
                .filter(|s| s.owner == client && s.recovering.is_some());
            match (slot, alloc) {
                (Some(s), Ok((alloc, held))) => {
                    *s.alloc.lock() = alloc;
                    s.allocator = self.allocators.fetch_add(1, Ordering::Relaxed) + 1;
                    s.held = held;
                }
                (None, _) => {
                    return Err(KvError::new(
                        Code::SegmentNotFound,
                        format!("segment {id} was unmounted or taken over during its inventory"),
                    ))
                }
                (Some(_), Err(e)) => {
                    // Never open it empty: new objects would overwrite the
                    // ones it holds. Unmounted, its store mounts it again.
                    drop(segs);
                    self.drop_segment(id, None);
                    tracing::error!(segment = %id, error = %e, "inventory rejected; segment unmounted");
                    return Err(KvError::new(
                        Code::InvalidParams,
                        format!("inventory of {id}: {e}"),
                    ));
                }
            }
        }
        let bound = self.generation_bound();
        if let Some(max) = all
            .iter()
            .map(|i| i.generation)
            .filter(|&g| g <= bound)
            .max()
        {
            self.next_generation.fetch_max(max + 1, Ordering::Relaxed);
        }
        let started = std::time::Instant::now();
        let verdict = if fresh {
            self.reconcile_fresh(id, all, regions, now)
        } else {
            self.reconcile_known(id, &all)
        };
        tracing::info!(segment = %id, accepted = verdict.accepted, rejected = verdict.rejected.len(),
            fresh, reconcile_ms = started.elapsed().as_millis() as u64, "inventory reconciled");
        Ok(verdict)
    }

    /// The highest generation an inventory may claim: what this master will
    /// issue next or the wall clock, plus a minute for clocks that differ
    /// between the masters of a pool (or were stepped back).
    fn generation_bound(&self) -> u64 {
        const SKEW_NS: u64 = 60_000_000_000;
        let issued = self.next_generation.load(Ordering::Relaxed);
        issued.max(super::wall_nanos()).saturating_add(SKEW_NS)
    }

    /// A segment new to this master (after a master restart or failover, or a
    /// store back after its TTL): its objects become readable unless the map
    /// already has a newer version of the key. Every reported region is
    /// already reserved in the segment's allocator; rejected ones are freed.
    ///
    /// It sets how long a failover lasts (about 2 µs an object on one core,
    /// most of it cache misses in a table bigger than the caches), so a big
    /// inventory is split by shard over several threads.
    pub(super) fn reconcile_fresh(
        &self,
        id: SegmentId,
        items: Vec<InventoryItem>,
        regions: Vec<Region>,
        now: Instant,
    ) -> InventoryVerdict {
        let Some(no) = self.numbers.read().get(id) else {
            return InventoryVerdict::default();
        };
        debug_assert_eq!(items.len(), regions.len());
        let big = items.len() >= PARALLEL_FROM;
        let threads = if !big {
            1
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS))
        };
        // The items in shard order (a counting sort): each thread takes
        // whole shards, and each shard's lock once per run of its items.
        // Hashing the keys is the first read of each one (a cache miss
        // each), so that is split over the threads too.
        let mut shard_of = vec![0u16; items.len()];
        let hash = |its: &[InventoryItem], out: &mut [u16]| {
            for (it, s) in its.iter().zip(out) {
                *s = self.shard_of(&it.key) as u16;
            }
        };
        let per = items.len().div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            let mut parts = items.chunks(per).zip(shard_of.chunks_mut(per));
            let mine = parts.next();
            for (its, out) in parts {
                scope.spawn(move || hash(its, out));
            }
            if let Some((its, out)) = mine {
                hash(its, out);
            }
        });
        let mut starts = vec![0usize; SHARDS + 1];
        for &s in &shard_of {
            starts[usize::from(s) + 1] += 1;
        }
        for s in 0..SHARDS {
            starts[s + 1] += starts[s];
        }
        let mut next = starts.clone();
        let mut order = vec![0u32; items.len()];
        for (i, &s) in shard_of.iter().enumerate() {
            order[next[usize::from(s)]] = i as u32;
            next[usize::from(s)] += 1;
        }
        drop((shard_of, next));
        let run = Run {
            id,
            no,
            now,
            at: self.tick(now),
            bound: self.generation_bound(),
            items: &items,
            regions: &regions,
            order: &order,
            starts: &starts,
            logged: AtomicUsize::new(0),
            given_up: (self.take_given_up(id, now))
                .or_else(|| self.given_up_before(id).then(HashSet::new)),
        };
        let parts: Vec<Part> = std::thread::scope(|scope| {
            let run = &run;
            let spawned: Vec<_> = (1..threads)
                .map(|t| {
                    let shards = SHARDS * t / threads..SHARDS * (t + 1) / threads;
                    scope.spawn(move || self.reconcile_shards(run, shards))
                })
                .collect();
            let mut parts = vec![self.reconcile_shards(run, 0..SHARDS / threads)];
            for h in spawned {
                parts.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            }
            parts
        });
        drop((order, starts, items, regions));
        if big {
            give_back_free_memory();
        }
        let mut v = InventoryVerdict::default();
        let mut destroy = Vec::new();
        for p in parts {
            v.accepted += p.accepted;
            for ((offset, generation), r) in p.rejected {
                v.rejected.push((offset, generation));
                destroy.push((id, r, generation));
            }
        }
        v.rejected.sort_unstable();
        // The store destroys them on this verdict; this master destroys them
        // too, to learn when that is done (a new leader's commits wait for
        // it, see `recovery_settled`). The regions are reused only then.
        self.free_after_invalidation(&destroy);
        self.open_segment(id);
        v
    }

    /// Reconciles the items of `shards` (see [`reconcile_fresh`](Self::reconcile_fresh)).
    fn reconcile_shards(&self, run: &Run<'_>, shards: std::ops::Range<usize>) -> Part {
        let mut part = Part::default();
        let mut replaced = Vec::new();
        for s in shards {
            let mine = &run.order[run.starts[s]..run.starts[s + 1]];
            for (n, chunk) in mine.chunks(PER_LOCK).enumerate() {
                let mut shard = self.shards[s].lock();
                if n == 0 {
                    shard.objects.reserve(mine.len());
                }
                for &i in chunk {
                    let (it, region) = (&run.items[i as usize], run.regions[i as usize]);
                    match self.take_item(&mut shard.objects, run, it, region) {
                        Ok(old) => {
                            tracing::trace!(target: "kvpool_keys", key = it.key, generation = it.generation,
                                segment = %run.id, offset = it.offset,
                                replaced = ?old.as_ref().map(|o| o.generation), "taken from an inventory");
                            part.accepted += 1;
                            replaced.extend(old.map(|old| (i, old)));
                        }
                        Err(why) => {
                            if run.logged.fetch_add(1, Ordering::Relaxed) < LOST_LOGGED {
                                let held = shard.objects.get(&it.key).map(|s| s.generation);
                                tracing::info!(segment = %run.id, key = it.key, generation = it.generation,
                                    offset = it.offset, known = ?held, "inventory object not taken: {why}");
                            }
                            part.rejected.push(((it.offset, it.generation), region));
                        }
                    }
                }
                drop(shard);
                for (i, old) in replaced.drain(..) {
                    self.release(&run.items[i as usize].key, self.unpack(old), run.now);
                }
            }
        }
        part
    }

    /// One reported object, taken into `objects` (its shard's table): the
    /// version it replaced, if any, or why it was not taken.
    fn take_item(
        &self,
        objects: &mut ObjectTable,
        run: &Run<'_>,
        it: &InventoryItem,
        region: Region,
    ) -> Result<Option<Version<SegNo>>, &'static str> {
        let first = self.first_generation.load(Ordering::Relaxed);
        let found = objects.find(&it.key);
        match found {
            // Never issued by anyone: forged (or a clock far off).
            _ if it.generation > run.bound => Err("never issued"),
            // Removed while its store was away.
            _ if self.tombstoned(&it.key, it.generation) => {
                Err("removed, or older than a version evicted during a recovery")
            }
            Some(i) if objects.at(i).generation > it.generation => {
                Err("older than the version known")
            }
            // This master issued the version it holds, so it would have
            // issued the newer one too, and committed it: forged, or a put
            // that never committed.
            Some(i)
                if objects.at(i).generation >= first
                    && it.generation > objects.at(i).generation =>
            {
                Err("newer than this master's own version: never committed")
            }
            Some(i) if objects.at(i).generation == it.generation => {
                objects.add_replica(i, run.no, region);
                Ok(None)
            }
            // Written or removed since its segment was given up, and gone
            // since: this copy is a version that write or removal ended.
            None if run
                .given_up
                .as_ref()
                .is_some_and(|keys| !keys.contains(&self.key_hash(&it.key))) =>
            {
                Err("written or removed since its segment was given up")
            }
            found => {
                let v = Version {
                    value_len: it.value_len,
                    generation: it.generation,
                    replicas: vec![(run.no, region)],
                    lease_until: run.at,
                    soft_pin_until: Tick(0),
                    last_access: run.at,
                    committed_at: run.at,
                    hard_pin: None,
                };
                Ok(match found {
                    Some(_) => objects.insert(&it.key, v),
                    None => {
                        objects.insert_new(&it.key, v);
                        None
                    }
                })
            }
        }
    }

    /// A segment this master still has, remounted by a restarted store: the
    /// map decides. Replicas whose bytes did not survive are dropped (unless
    /// committed after the store's scan began); objects the map does not hold
    /// there are rejected.
    pub(super) fn reconcile_known(
        &self,
        id: SegmentId,
        items: &[InventoryItem],
    ) -> InventoryVerdict {
        let cutoff = match self.segments.read().get(&id) {
            Some(s) => self.tick(s.scan_cutoff),
            None => return InventoryVerdict::default(),
        };
        let Some(no) = self.numbers.read().get(id) else {
            return InventoryVerdict::default();
        };
        // One read-only pass collects what the map holds on this segment;
        // a sort and a merge with the inventory (sorted by offset) decide,
        // with no set as large as the segment.
        let mut held: Vec<(u64, u64, bool, u32)> = Vec::new();
        let mut in_flight = HashSet::new();
        for (n, shard) in self.shards.iter().enumerate() {
            let sh = shard.lock();
            // Written but not committed yet: its writer decides, not the store.
            for p in sh.pending.values() {
                for (s, r) in &p.version.replicas {
                    if *s == id {
                        in_flight.insert((r.offset, p.version.generation));
                    }
                }
            }
            for (i, v) in sh.objects.iter() {
                for (s, r) in sh.objects.replicas(i) {
                    if s == no {
                        held.push((r.offset, v.generation, v.committed_at() >= cutoff, n as u32));
                    }
                }
            }
        }
        held.sort_unstable_by_key(|h| h.0);
        let mut reported = vec![false; items.len()];
        let mut lost = Vec::new();
        let mut i = 0;
        for (offset, generation, recent, shard) in held {
            while i < items.len() && items[i].offset < offset {
                i += 1;
            }
            let found = items
                .get(i)
                .filter(|it| it.offset == offset && it.generation == generation);
            match found {
                Some(_) => reported[i] = true,
                // Committed after the scan began: missing from it, not lost.
                None if recent => {}
                None => lost.push((shard, offset, generation)),
            }
        }
        // Replicas whose bytes did not survive, one pass per shard that has
        // any. Each is named in the log (the first LOST_LOGGED of them): an
        // acknowledged object may be gone.
        lost.sort_unstable();
        let mut freed = Vec::new();
        let mut logged = 0;
        for group in lost.chunk_by(|a, b| a.0 == b.0) {
            let gone: HashSet<(u64, u64)> = group.iter().map(|&(_, o, g)| (o, g)).collect();
            let mut sh = self.shards[group[0].0 as usize].lock();
            for (i, v) in sh.objects.iter() {
                for (s, r) in sh.objects.replicas(i) {
                    if logged < LOST_LOGGED && s == no && gone.contains(&(r.offset, v.generation)) {
                        logged += 1;
                        let key = sh.objects.key(i);
                        tracing::warn!(segment = %id, key = &*key, offset = r.offset, generation = v.generation,
                            "replica lost: missing from its remounted store's inventory");
                    }
                }
            }
            self.replicas_lost
                .fetch_add(group.len() as u64, Ordering::Relaxed);
            sh.objects.retain_replicas(|v, s, r| {
                let lost = s == no && gone.contains(&(r.offset, v.generation));
                if lost {
                    freed.push((id, r));
                }
                !lost
            });
        }
        if lost.len() > LOST_LOGGED {
            tracing::warn!(segment = %id, lost = lost.len(), "replicas lost in all (the first {LOST_LOGGED} named above)");
        }
        self.free_now(&freed, None);
        self.open_segment(id);
        let rejected: Vec<&InventoryItem> = (items.iter().zip(&reported))
            .filter(|(it, &r)| !r && !in_flight.contains(&(it.offset, it.generation)))
            .map(|(it, _)| it)
            .collect();
        // Its store destroys them: named in the log, as lost replicas are,
        // so that an object gone from every store can be traced.
        for it in rejected.iter().take(LOST_LOGGED) {
            let held = self
                .shard(&it.key)
                .lock()
                .objects
                .get(&it.key)
                .map(|v| v.generation);
            tracing::info!(segment = %id, key = it.key, generation = it.generation, offset = it.offset,
                known = ?held, "inventory object not taken: not where the map holds it");
        }
        InventoryVerdict {
            accepted: reported.iter().filter(|&&r| r).count() as u64,
            rejected: rejected
                .iter()
                .map(|it| (it.offset, it.generation))
                .collect(),
        }
    }
}
