//! Tiers below memory: a store that lends a disk segment beside its
//! memory segments gets its memory kept below the demotion watermark by
//! moving the least recently used objects to disk instead of dropping
//! them, and an object read twice while on disk is moved back to memory.
//!
//! Tiers are an ordered list ([`Tier::ALL`], fastest first): each tier of
//! a store demotes into the next one it lends, the last one evicts when it
//! is full, and promotions go back to the first. A new tier is a `Tier`
//! variant in its place in that list and its region unit in [`unit`].
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
    /// The allocator it was reserved in (see [`MasterState::allocator_of`]).
    allocator: u64,
}

/// What the tier keeps between planning rounds.
#[derive(Default)]
pub(super) struct TierState {
    /// Keys with a move in flight: never planned twice.
    pub(super) moving: HashSet<Box<str>>,
    /// Keys read twice on disk, waiting to be promoted.
    promote: std::collections::VecDeque<Box<str>>,
    queued: HashSet<Box<str>>,
}

/// A store that lends more than one tier: its segments per tier, fastest
/// first (`levels[i]` holds those of `Tier::ALL[i]`; a tier it does not
/// lend, or whose segments take no objects now, is empty).
struct Group {
    levels: Vec<Vec<(SegmentId, SegNo)>>,
    endpoint: String,
}

impl Group {
    /// The level (index into `Tier::ALL`) of segment `no`, if it is this
    /// store's.
    fn level_of(&self, no: SegNo) -> Option<usize> {
        (self.levels.iter()).position(|l| l.iter().any(|&(_, n)| n == no))
    }

    /// The segment ids of level `i`.
    fn ids(&self, i: usize) -> impl Iterator<Item = SegmentId> + '_ {
        self.levels[i].iter().map(|&(id, _)| id)
    }
}

/// The unit regions on `tier` start at and span: O_DIRECT reads disk
/// regions in whole blocks.
pub(super) fn unit(tier: Tier) -> u64 {
    match tier {
        Tier::Memory => ALIGN,
        Tier::Disk => DISK_BLOCK,
    }
}

/// `len` rounded up to whole units of `tier`.
fn in_units(len: u64, tier: Tier) -> u64 {
    len.div_ceil(unit(tier)) * unit(tier)
}

/// The bytes a move copies: the object's header (40 bytes and the key) and
/// its value. The master links no format crate, so this one layout fact is
/// restated from `kvpool_format::header_len`.
fn object_len(key: &str, value_len: u64) -> u64 {
    40 + key.len() as u64 + value_len
}

impl MasterState {
    /// Logs the keys with a tier move in flight (the first 32 of them), for
    /// a leader that stops leading: a move straddling a leader change is
    /// where chaos findings 24 and 25 point, and nothing else names the
    /// keys.
    pub fn log_moves_in_flight(&self) {
        const NAMED: usize = 32;
        let tier = self.tier.lock();
        let keys: Vec<&str> = tier.moving.iter().take(NAMED).map(|k| &**k).collect();
        tracing::warn!(
            moves = tier.moving.len(),
            ?keys,
            "tier moves in flight as this master stops leading (the first {NAMED} named)"
        );
    }

    /// Whether any store lends a tier below memory (the tier task idles
    /// otherwise).
    pub fn has_disk_tier(&self) -> bool {
        self.segments
            .read()
            .values()
            .any(|s| s.info.tier != Tier::ALL[0])
    }

    /// Stores that lend memory and a tier below it that takes objects now,
    /// with their segments per tier.
    fn groups(&self, now: Instant) -> Vec<Group> {
        let open: Vec<HashSet<SegmentId>> = (Tier::ALL[1..].iter())
            .map(|&t| self.open_segments(now, t))
            .collect();
        let segs = self.segments.read();
        let numbers = self.numbers.read();
        let mut by_owner: HashMap<ClientId, Group> = HashMap::new();
        for s in segs.values() {
            let Some(level) = Tier::ALL.iter().position(|&t| t == s.info.tier) else {
                continue;
            };
            // First-tier segments count whatever their state (objects move
            // off them); a lower tier only while it takes objects.
            if level > 0 && !open[level - 1].contains(&s.info.id) {
                continue;
            }
            let Some(no) = numbers.get(s.info.id) else {
                continue;
            };
            let g = by_owner.entry(s.owner).or_insert_with(|| Group {
                levels: vec![Vec::new(); Tier::ALL.len()],
                endpoint: s.info.endpoint.clone(),
            });
            g.levels[level].push((s.info.id, no));
        }
        by_owner
            .into_values()
            .filter(|g| !g.levels[0].is_empty() && g.levels[1..].iter().any(|l| !l.is_empty()))
            .collect()
    }

    /// Plans the next round of moves: demotions for every tier of a store
    /// that is above the demotion watermark, into the next tier it lends,
    /// and the promotions queued by reads. Regions are reserved on both
    /// sides; every ticket must be handed back to
    /// [`Self::finish_tier_moves`]. Grouped by the data endpoint of the
    /// store that does them.
    pub fn plan_tier_moves(&self, now: Instant) -> Vec<(String, Vec<MoveTicket>)> {
        let groups = self.groups(now);
        if groups.is_empty() {
            return Vec::new();
        }
        let mut out: HashMap<String, Vec<MoveTicket>> = HashMap::new();
        for g in &groups {
            let lent: Vec<usize> = (0..g.levels.len())
                .filter(|&i| !g.levels[i].is_empty())
                .collect();
            for pair in lent.windows(2) {
                let tickets = self.plan_demotions(g, (pair[0], pair[1]), now);
                if !tickets.is_empty() {
                    out.entry(g.endpoint.clone()).or_default().extend(tickets);
                }
            }
        }
        for (endpoint, t) in self.plan_promotions(&groups, now) {
            out.entry(endpoint).or_default().push(t);
        }
        out.into_iter().collect()
    }

    /// Bytes to move off `g`'s segments of level `from` now: down to a
    /// ratio below the watermark (by the eviction ratio), so rounds are few
    /// and large.
    fn demotion_need(&self, g: &Group, from: usize) -> HashMap<SegmentId, u64> {
        let wm = self.cfg.demote_watermark;
        let low = (wm - self.cfg.eviction_ratio).max(0.0);
        let segs = self.segments.read();
        g.ids(from)
            .filter_map(|id| {
                let a = segs.get(&id)?.alloc.lock();
                let (cap, used) = (a.capacity() as f64, a.used() as f64);
                (cap > 0.0 && used >= cap * wm).then_some((id, (used - cap * low) as u64))
            })
            .collect()
    }

    /// Chooses the least recently used movable objects on `g`'s segments of
    /// level `from` that are above the watermark, and reserves their
    /// regions on level `to` (evicting there when it is full).
    fn plan_demotions(
        &self,
        g: &Group,
        (from, to): (usize, usize),
        now: Instant,
    ) -> Vec<MoveTicket> {
        let need = self.demotion_need(g, from);
        if need.is_empty() {
            return Vec::new();
        }
        let target: u64 = need.values().sum::<u64>().min(ROUND_BYTES);
        let sources: HashMap<SegNo, SegmentId> = {
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
            let mut source = None;
            for (s, r) in t.replicas(i) {
                if g.level_of(s).is_some_and(|l| l >= to) {
                    // A copy is on this store's lower tier already.
                    return None;
                }
                if sources.contains_key(&s) {
                    source = Some((s, r));
                }
            }
            source
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
                if moving.contains(&*key) {
                    continue;
                }
                if rank == boundary.rank {
                    at_boundary = at_boundary.saturating_sub(r.len);
                }
                chosen.push((Box::from(key), v.generation, v.value_len, sources[&s], r));
            }
        }
        let mut tickets = Vec::with_capacity(chosen.len());
        let below: Vec<SegmentId> = g.ids(to).collect();
        for (key, generation, value_len, source, region) in chosen {
            let len = object_len(&key, value_len);
            let want = in_units(len, Tier::ALL[to]);
            let mut dest = self.allocate_among(&g.levels[to], want);
            // The lower tier is full: its least recently used objects go,
            // unless as much is on its way back already. A region there is
            // reused only once its store has destroyed the object in it, so
            // evicting again before then would empty the tier a pass at a
            // time for one round's worth of room.
            if dest.is_none() && below.iter().map(|&d| self.freeing(d)).sum::<u64>() < want {
                self.evict_on(now, want, Some(&below));
                dest = self.allocate_among(&g.levels[to], want);
            }
            let Some((dest, to_region)) = dest else {
                break;
            };
            if !self.tier.lock().moving.insert(key.clone()) {
                self.free_now(&[(dest, to_region)], None);
                continue;
            }
            tickets.push(MoveTicket {
                key: key.into(),
                promote: false,
                mv: TierMove {
                    from: source,
                    from_offset: region.offset,
                    len,
                    to: dest,
                    to_offset: to_region.offset,
                    generation,
                    fence: self.fence_of(dest),
                },
                to: to_region,
                allocator: self.allocator_of(dest),
            });
        }
        tickets
    }

    /// Reserves `len` bytes on the first of `segments` that has them.
    fn allocate_among(
        &self,
        segments: &[(SegmentId, SegNo)],
        len: u64,
    ) -> Option<(SegmentId, Region)> {
        (segments.iter()).find_map(|&(id, _)| Some((id, self.allocate_on(id, len)?)))
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
        let all_below = {
            let numbers = self.numbers.read();
            objects
                .replicas(i)
                .all(|(s, _)| numbers.tier(s) != Tier::ALL[0])
        };
        if !all_below || !objects.read_on_disk(i) {
            return;
        }
        let mut tier = self.tier.lock();
        let key = objects.key(i);
        if tier.queued.len() < PROMOTE_QUEUE && !tier.queued.contains(&*key) {
            tier.queued.insert(Box::from(&*key));
            tier.promote.push_back(Box::from(key));
        }
    }

    /// Plans promotions of queued objects into a segment of their store's
    /// first tier (memory) that has room below the demotion watermark.
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
            let (generation, value_len, no, region) = {
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
            let Some((g, from)) = groups.iter().find_map(|g| {
                let level = g.level_of(no).filter(|&l| l > 0)?;
                let id = g.levels[level].iter().find(|&&(_, n)| n == no)?.0;
                Some((g, id))
            }) else {
                continue;
            };
            let len = object_len(&key, value_len);
            let want = in_units(len, Tier::ALL[0]);
            // The emptiest first-tier segment of the store with room to spare.
            let target = {
                let segs = self.segments.read();
                g.ids(0)
                    .filter(|id| placeable.contains(id))
                    .filter_map(|id| {
                        let a = segs.get(&id)?.alloc.lock();
                        let after = (a.used() + want) as f64;
                        (after < a.capacity() as f64 * wm).then(|| (a.free_bytes(), id))
                    })
                    .max()
                    .map(|(_, id)| id)
            };
            let Some(dest) = target else {
                continue;
            };
            let Some(to) = self.allocate_on(dest, want) else {
                continue;
            };
            if !self.tier.lock().moving.insert(key.clone()) {
                self.free_now(&[(dest, to)], None);
                continue;
            }
            out.push((
                g.endpoint.clone(),
                MoveTicket {
                    key: key.into(),
                    promote: true,
                    mv: TierMove {
                        from,
                        from_offset: region.offset,
                        len,
                        to: dest,
                        to_offset: to.offset,
                        generation,
                        fence: self.fence_of(dest),
                    },
                    to,
                    allocator: self.allocator_of(dest),
                },
            ));
        }
        out
    }

    /// Finishes planned moves with what their stores answered: a copy made
    /// of the version still current takes its replica's place (the region
    /// left behind is destroyed and freed); any other copy is destroyed.
    ///
    /// A copy is taken only if its destination was not mounted again since
    /// the move was planned. The new mount's scan may have found it, and
    /// its inventory, which the map did not hold there yet, had it
    /// destroyed: taken then, with its source destroyed as moved, the
    /// object would be on no store (the chaos harness lost acknowledged
    /// objects that way when a move's answer came back late, after a
    /// partition healed, behind its store's remount).
    pub fn finish_tier_moves(&self, done: Vec<(MoveTicket, KvResult<()>)>, now: Instant) {
        for (t, result) in done {
            self.tier.lock().moving.remove(t.key.as_str());
            let (from_no, to_no) = {
                let numbers = self.numbers.read();
                (numbers.get(t.mv.from), numbers.get(t.mv.to))
            };
            let same_mount = self.fence_of(t.mv.to) == t.mv.fence;
            if result.is_ok() && !same_mount {
                tracing::info!(key = t.key, segment = %t.mv.to, offset = t.to.offset,
                    "tier move answered after its destination was mounted again: copy not taken");
            }
            let moved = match (result, from_no, to_no) {
                (Ok(()), Some(from_no), Some(to_no)) if same_mount => {
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
                    tracing::trace!(target: "kvpool_keys", key = t.key, generation = t.mv.generation,
                        from = %t.mv.from, from_offset = t.mv.from_offset, to = %t.mv.to,
                        to_offset = t.to.offset, "moved");
                    let counter = if t.promote {
                        &self.promotions
                    } else {
                        &self.demotions
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let from = (t.mv.from, left);
                    self.leave_region(&t.key, from, t.mv.generation, lease_until, now);
                }
                // Replaced, removed, evicted, failed or its destination
                // mounted again meanwhile: the copy goes, and its region
                // once that is done. Unless the segment has another
                // allocator since, rebuilt from an inventory, which knows
                // whether anything is there.
                None if self.allocator_of(t.mv.to) == t.allocator => {
                    self.destroy_move_copy(&t.key, (t.mv.to, t.to), t.mv.generation)
                }
                None => {}
            }
        }
        // Versions held back behind a move that is over now.
        self.release_held_back();
    }

    /// Frees the region an object moved away from, and destroys the copy
    /// there at once. Under a live read lease the region's reuse waits for
    /// the lease to end (a reader in flight there then misses and asks
    /// again, and never meets another object's bytes), but the copy is
    /// destroyed now all the same: a reader holding the old location in
    /// its cache reads it without asking this master, and once the version
    /// is replaced or removed, which destroys only the replicas the master
    /// lists, a copy left intact here would still be served (the chaos
    /// harness read replaced and removed versions that way).
    fn leave_region(
        &self,
        key: &str,
        (seg, r): (SegmentId, Region),
        generation: u64,
        lease_until: Tick,
        now: Instant,
    ) {
        if lease_until > self.tick(now) {
            let young = self.young_until_lease(lease_until);
            self.queue_destruction(key, (seg, r), generation, young);
            self.note_moved_leased(key, young);
            let until = self.instant(lease_until);
            // Destroyed again before reuse, which a disk block must wait for.
            self.deferred.lock().push((until, seg, r, Some(generation)));
        } else {
            self.free_after_invalidation(&[(seg, r, generation)]);
        }
    }

    /// Records that a client may read `key`'s copy a move just left, through
    /// a location cached before the move, until `young` (when every such
    /// location's lease stops being young).
    fn note_moved_leased(&self, key: &str, young: Instant) {
        let h = self.key_hash(key);
        let mut moved = self.moved_leased.lock();
        let until = moved.entry(h).or_insert(young);
        *until = (*until).max(young);
        self.any_moved_leased.store(true, Ordering::Release);
    }

    /// Whether a read at `at` of the key hashed `h`, through a cached
    /// location, may have used the copy a tier move left: the location may
    /// be from before the move. Such a read renews no lease
    /// ([`Self::renewable`]). The move's fence holds the next write of the
    /// key while a location cached before the move is young, and only while
    /// the copy's store has not destroyed it; a renewal would keep that
    /// location young past the fence, so a client could read the left copy
    /// (intact on a store that is cut off from this master but not from the
    /// client) after the write is answered. A read after every such
    /// location stopped being young was through one the master handed out
    /// since, which names the new place.
    pub(super) fn read_left_copy(&self, h: u64, at: Instant) -> bool {
        self.any_moved_leased.load(Ordering::Acquire)
            && (self.moved_leased.lock().get(&h)).is_some_and(|young| at < *young)
    }

    /// Forgets moves whose left copies no renewal can reach any more: a
    /// read before `young` renewed after `young` plus half a lease would be
    /// young no longer.
    pub(super) fn expire_moved_leased(&self, now: Instant) {
        if self.any_moved_leased.load(Ordering::Acquire) {
            let half = self.cfg.lease_ttl / 2;
            let mut moved = self.moved_leased.lock();
            moved.retain(|_, young| now < *young + half);
            self.any_moved_leased
                .store(!moved.is_empty(), Ordering::Release);
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
