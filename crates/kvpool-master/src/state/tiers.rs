//! The disk tier: a store that lends a disk segment beside its memory
//! segments gets its memory kept below the demotion watermark by moving
//! the least recently used objects to disk instead of dropping them, and
//! an object read twice while on disk is moved back to memory.
//!
//! A move is planned here (regions reserved on both sides, the key marked
//! as moving), carried out by the store (`TierMove`: it copies, verifies
//! and writes the header last), and finished here: only if the object is
//! still the same version with the same replica does the replica switch to
//! the copy; otherwise the copy is destroyed. Until then readers use the
//! original, so a move never makes an object unreadable. The region left
//! behind is destroyed on its store and reused once its read lease ends,
//! like the region of a replaced version.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use kvpool_proto::msg::{ClientId, SegmentId, Tier, TierMove, DISK_BLOCK};
use kvpool_proto::KvResult;
use tokio::time::Instant;

use crate::alloc::{Region, ALIGN};
use crate::eviction::{self, Histogram};

use super::table::{ObjectTable, SegNo, Slot};
use super::*;

/// Bytes of objects one planning round moves to disk per store, at most:
/// a round's copies finish in a second or two on a plain SSD.
const ROUND_BYTES: u64 = 256 << 20;
/// Objects one planning round moves per store, at most.
const ROUND_OBJECTS: usize = 16_384;
/// Promotions waiting at most; reads beyond are not promoted.
const PROMOTE_QUEUE: usize = 4096;
/// Promotions planned per round.
const ROUND_PROMOTIONS: usize = 1024;

/// One object to copy between a store's tiers, as planned.
#[derive(Debug, Clone)]
pub struct MoveTicket {
    /// The object.
    pub key: String,
    /// Back to memory (else to disk).
    pub promote: bool,
    /// What the store is asked to do.
    pub mv: TierMove,
    /// The region reserved for the copy.
    to: Region,
}

/// What the tier keeps between planning rounds.
#[derive(Default)]
pub(super) struct TierState {
    /// Keys with a move in flight: never planned twice.
    moving: HashSet<Box<str>>,
    /// Keys read twice on disk, waiting to be promoted.
    promote: std::collections::VecDeque<Box<str>>,
    queued: HashSet<Box<str>>,
}

/// A store with a disk tier: its disk segment and its memory segments.
struct Group {
    disk: SegmentId,
    disk_no: SegNo,
    memory: Vec<SegmentId>,
    endpoint: String,
}

/// The bytes a move copies: the object's header (40 bytes and the key) and
/// its value. The master links no format crate, so this one layout fact is
/// restated from `kvpool_format::header_len`.
fn object_len(key: &str, value_len: u64) -> u64 {
    40 + key.len() as u64 + value_len
}

impl MasterState {
    /// Whether any store lends a disk tier (the tier task idles otherwise).
    pub fn has_disk_tier(&self) -> bool {
        self.segments
            .read()
            .values()
            .any(|s| s.info.tier == Tier::Disk)
    }

    /// Stores whose disk tier takes objects now, with their memory segments.
    fn groups(&self, now: Instant) -> Vec<Group> {
        let open_disks = self.open_segments(now, Tier::Disk);
        let segs = self.segments.read();
        let numbers = self.numbers.read();
        let mut by_owner: HashMap<ClientId, Group> = HashMap::new();
        for s in segs.values() {
            if s.info.tier == Tier::Disk && open_disks.contains(&s.info.id) {
                let Some(no) = numbers.get(s.info.id) else {
                    continue;
                };
                by_owner.insert(
                    s.owner,
                    Group {
                        disk: s.info.id,
                        disk_no: no,
                        memory: Vec::new(),
                        endpoint: s.info.endpoint.clone(),
                    },
                );
            }
        }
        for s in segs.values() {
            if s.info.tier == Tier::Memory {
                if let Some(g) = by_owner.get_mut(&s.owner) {
                    g.memory.push(s.info.id);
                }
            }
        }
        by_owner
            .into_values()
            .filter(|g| !g.memory.is_empty())
            .collect()
    }

    /// Plans the next round of moves: demotions for every store whose
    /// memory is above the demotion watermark, and the promotions queued
    /// by reads. Regions are reserved on both sides; every ticket must be
    /// handed back to [`Self::finish_tier_moves`]. Grouped by the data
    /// endpoint of the store that does them.
    pub fn plan_tier_moves(&self, now: Instant) -> Vec<(String, Vec<MoveTicket>)> {
        let groups = self.groups(now);
        if groups.is_empty() {
            return Vec::new();
        }
        let mut out: HashMap<String, Vec<MoveTicket>> = HashMap::new();
        for g in &groups {
            let tickets = self.plan_demotions(g, now);
            if !tickets.is_empty() {
                out.entry(g.endpoint.clone()).or_default().extend(tickets);
            }
        }
        for (endpoint, t) in self.plan_promotions(&groups, now) {
            out.entry(endpoint).or_default().push(t);
        }
        out.into_iter().collect()
    }

    /// Bytes to move off `g`'s memory segments now: down to a ratio below
    /// the watermark (by the eviction ratio), so rounds are few and large.
    fn demotion_need(&self, g: &Group) -> HashMap<SegmentId, u64> {
        let wm = self.cfg.demote_watermark;
        let low = (wm - self.cfg.eviction_ratio).max(0.0);
        let segs = self.segments.read();
        g.memory
            .iter()
            .filter_map(|id| {
                let a = segs.get(id)?.alloc.lock();
                let (cap, used) = (a.capacity() as f64, a.used() as f64);
                (cap > 0.0 && used >= cap * wm).then_some((*id, (used - cap * low) as u64))
            })
            .collect()
    }

    /// Chooses `g`'s least recently used movable objects on its memory
    /// segments that are above the watermark, and reserves their disk
    /// regions (evicting from the disk tier when it is full).
    fn plan_demotions(&self, g: &Group, now: Instant) -> Vec<MoveTicket> {
        let need = self.demotion_need(g);
        if need.is_empty() {
            return Vec::new();
        }
        let target: u64 = need.values().sum::<u64>().min(ROUND_BYTES);
        let from: HashMap<SegNo, SegmentId> = {
            let numbers = self.numbers.read();
            need.keys()
                .filter_map(|&id| numbers.get(id).map(|no| (no, id)))
                .collect()
        };
        let at = self.tick(now);
        // A copy, not the lock: reads take the tier lock under a shard's.
        let moving = self.tier.lock().moving.clone();
        // The replica a demotion would move, if the object may move.
        let movable = |t: &ObjectTable, i: u32, v: &Slot| -> Option<(SegNo, Region)> {
            if !Self::evictable(v, at) {
                return None;
            }
            let mut on_memory = None;
            for (s, r) in t.replicas(i) {
                if s == g.disk_no {
                    // A copy is on this store's disk already.
                    return None;
                }
                if from.contains_key(&s) {
                    on_memory = Some((s, r));
                }
            }
            on_memory
        };
        // First pass: how many bytes stand at each place in LRU order.
        let mut histogram = Histogram::default();
        for shard in self.shards.iter() {
            let sh = shard.lock();
            for (i, v) in sh.objects.iter() {
                if let Some((_, r)) = movable(&sh.objects, i, v) {
                    let soft = sh.objects.soft_pin_until(i) > at;
                    let idle = at.0.saturating_sub(v.last_access.0);
                    histogram.add(eviction::rank(soft, idle), r.len);
                }
            }
        }
        let Some(boundary) = histogram.boundary(target) else {
            return Vec::new();
        };
        // Second pass: every object before the boundary, and of those at
        // it, enough for the rest in scan order (all within 1/8 of one idle
        // time of each other).
        let mut chosen: Vec<(Box<str>, u64, u64, SegmentId, Region)> = Vec::new();
        let mut at_boundary = boundary.need;
        'shards: for shard in self.shards.iter() {
            let sh = shard.lock();
            for (i, v) in sh.objects.iter() {
                if chosen.len() >= ROUND_OBJECTS {
                    break 'shards;
                }
                let Some((s, r)) = movable(&sh.objects, i, v) else {
                    continue;
                };
                let soft = sh.objects.soft_pin_until(i) > at;
                let idle = at.0.saturating_sub(v.last_access.0);
                let rank = eviction::rank(soft, idle);
                if rank > boundary.rank || (rank == boundary.rank && at_boundary == 0) {
                    continue;
                }
                let key = sh.objects.key(i);
                if moving.contains(key) {
                    continue;
                }
                if rank == boundary.rank {
                    at_boundary = at_boundary.saturating_sub(r.len);
                }
                chosen.push((Box::from(key), v.generation, v.value_len, from[&s], r));
            }
        }
        let mut tickets = Vec::with_capacity(chosen.len());
        let disk = HashSet::from([g.disk]);
        for (key, generation, value_len, mem, region) in chosen {
            let len = object_len(&key, value_len);
            let want = len.div_ceil(DISK_BLOCK) * DISK_BLOCK;
            let mut to = self.allocate_on(g.disk, want);
            // The disk tier is full: its least recently used objects go,
            // unless as much is on its way back already. A disk region is
            // reused only once its store has destroyed the object there, so
            // evicting again before then would empty the disk tier a pass
            // at a time for one round's worth of room.
            if to.is_none() && self.freeing(g.disk) < want {
                self.evict_on(now, want, Some(&disk));
                to = self.allocate_on(g.disk, want);
            }
            let Some(to) = to else {
                break;
            };
            if !self.tier.lock().moving.insert(key.clone()) {
                self.free_now(&[(g.disk, to)], None);
                continue;
            }
            tickets.push(MoveTicket {
                key: key.into(),
                promote: false,
                mv: TierMove {
                    from: mem,
                    from_offset: region.offset,
                    len,
                    to: g.disk,
                    to_offset: to.offset,
                    generation,
                    fence: self.fence_of(g.disk),
                },
                to,
            });
        }
        tickets
    }

    /// Reserves `len` bytes on segment `id`, if it has them.
    fn allocate_on(&self, id: SegmentId, len: u64) -> Option<Region> {
        self.segments.read().get(&id)?.alloc.lock().alloc(len)
    }

    /// Notes a read of an object that is on disk only (`i` in a locked
    /// shard); the second such read queues its promotion.
    pub(super) fn read_on_disk(&self, objects: &mut ObjectTable, i: u32) {
        if !self.cfg.promote || !self.disk_tier.load(Ordering::Relaxed) {
            return;
        }
        let all_disk = {
            let numbers = self.numbers.read();
            objects.replicas(i).all(|(s, _)| numbers.is_disk(s))
        };
        if !all_disk || !objects.read_on_disk(i) {
            return;
        }
        let mut tier = self.tier.lock();
        let key = objects.key(i);
        if tier.queued.len() < PROMOTE_QUEUE && !tier.queued.contains(key) {
            tier.queued.insert(Box::from(key));
            tier.promote.push_back(Box::from(key));
        }
    }

    /// Plans promotions of queued objects into a memory segment of their
    /// store that has room below the demotion watermark.
    fn plan_promotions(&self, groups: &[Group], now: Instant) -> Vec<(String, MoveTicket)> {
        let queued: Vec<Box<str>> = {
            let mut tier = self.tier.lock();
            let n = tier.promote.len().min(ROUND_PROMOTIONS);
            let keys: Vec<Box<str>> = tier.promote.drain(..n).collect();
            for k in &keys {
                tier.queued.remove(k);
            }
            keys
        };
        if queued.is_empty() {
            return Vec::new();
        }
        let placeable = self.placeable(now);
        // Only into room below the demotion watermark (demotions leave a
        // band of `eviction_ratio` there): a promotion never makes a put
        // evict, nor starts a demotion of its own.
        let wm = self.cfg.demote_watermark;
        let mut out = Vec::new();
        for key in queued {
            let (generation, value_len, disk_no, region) = {
                let sh = self.shard(&key).lock();
                let Some(i) = sh.objects.find(&key) else {
                    continue;
                };
                let v = sh.objects.at(i);
                let mut replicas = sh.objects.replicas(i);
                let Some((s, r)) = replicas.next() else {
                    continue;
                };
                (v.generation, v.value_len, s, r)
            };
            let Some(g) = groups.iter().find(|g| g.disk_no == disk_no) else {
                continue;
            };
            let len = object_len(&key, value_len);
            let want = len.div_ceil(ALIGN) * ALIGN;
            // The emptiest memory segment of the store with room to spare.
            let target = {
                let segs = self.segments.read();
                g.memory
                    .iter()
                    .filter(|id| placeable.contains(id))
                    .filter_map(|id| {
                        let a = segs.get(id)?.alloc.lock();
                        let after = (a.used() + want) as f64;
                        (after < a.capacity() as f64 * wm).then(|| (a.free_bytes(), *id))
                    })
                    .max()
                    .map(|(_, id)| id)
            };
            let Some(mem) = target else {
                continue;
            };
            let Some(to) = self.allocate_on(mem, want) else {
                continue;
            };
            if !self.tier.lock().moving.insert(key.clone()) {
                self.free_now(&[(mem, to)], None);
                continue;
            }
            out.push((
                g.endpoint.clone(),
                MoveTicket {
                    key: key.into(),
                    promote: true,
                    mv: TierMove {
                        from: g.disk,
                        from_offset: region.offset,
                        len,
                        to: mem,
                        to_offset: to.offset,
                        generation,
                        fence: self.fence_of(mem),
                    },
                    to,
                },
            ));
        }
        out
    }

    /// Finishes planned moves with what their stores answered: a copy made
    /// of the version still current takes its replica's place (the region
    /// left behind is destroyed and freed); any other copy is destroyed.
    pub fn finish_tier_moves(&self, done: Vec<(MoveTicket, KvResult<()>)>, now: Instant) {
        for (t, result) in done {
            self.tier.lock().moving.remove(t.key.as_str());
            let (from_no, to_no) = {
                let numbers = self.numbers.read();
                (numbers.get(t.mv.from), numbers.get(t.mv.to))
            };
            let moved = match (result, from_no, to_no) {
                (Ok(()), Some(from_no), Some(to_no)) => {
                    let mut sh = self.shard(&t.key).lock();
                    sh.objects
                        .find(&t.key)
                        .filter(|&i| sh.objects.at(i).generation == t.mv.generation)
                        .and_then(|i| {
                            let lease = sh.objects.at(i).lease_until;
                            sh.objects
                                .move_replica(i, (from_no, t.mv.from_offset), (to_no, t.to))
                                .map(|left| (left, lease))
                        })
                }
                _ => None,
            };
            match moved {
                Some((left, lease_until)) => {
                    let counter = if t.promote {
                        &self.promotions
                    } else {
                        &self.demotions
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    self.leave_region(t.mv.from, left, t.mv.generation, lease_until, now);
                }
                // Replaced, removed, evicted or failed meanwhile: the copy goes.
                None => self.free_after_invalidation(t.mv.to, t.to, t.mv.generation),
            }
        }
    }

    /// Frees the region an object moved away from, and destroys the copy
    /// there. Under a live read lease both wait for it to end: the copy is
    /// the same version, so a reader holding the old location still reads
    /// it intact.
    fn leave_region(
        &self,
        seg: SegmentId,
        r: Region,
        generation: u64,
        lease_until: Tick,
        now: Instant,
    ) {
        if lease_until > self.tick(now) {
            let until = self.instant(lease_until);
            self.deferred.lock().push((until, seg, r, Some(generation)));
        } else {
            self.free_after_invalidation(seg, r, generation);
        }
    }

    /// Objects moved to disk since start.
    pub fn demotions(&self) -> u64 {
        self.demotions.load(Ordering::Relaxed)
    }

    /// Objects moved back to memory since start.
    pub fn promotions(&self) -> u64 {
        self.promotions.load(Ordering::Relaxed)
    }
}
