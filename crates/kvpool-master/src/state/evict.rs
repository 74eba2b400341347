//! LRU eviction: choosing and dropping the least recently used evictable
//! objects when the pool fills up.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use kvpool_proto::msg::{SegmentId, Tier};
use tokio::time::Instant;

use parking_lot::MutexGuard;

use crate::eviction::{self, Candidate};

use super::table::{ObjectTable, SegNo, Slot};
use super::*;

/// Objects at the boundary rank that a pass sorts exactly (40 bytes each).
const MAX_EXACT: u64 = 1 << 20;

/// Outcome of an eviction pass.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    /// Objects evicted.
    pub objects: u64,
    /// Bytes freed.
    pub bytes: u64,
}

impl MasterState {
    /// Frees at least `need` bytes, and at least `eviction_ratio` of capacity,
    /// from the least recently used evictable objects.
    pub fn evict(&self, now: Instant, need: u64) -> Evicted {
        // Memory is what runs full: objects only on disk free none of it.
        let memory = self.tier_segments(Tier::Memory);
        self.evict_on(now, need, Some(&memory))
    }

    /// [`Self::evict`] limited to objects with a replica on `on`: evicting
    /// elsewhere frees nothing where the caller can allocate.
    pub(super) fn evict_on(&self, now: Instant, need: u64, on: Option<&[SegmentId]>) -> Evicted {
        let _pass = self.evicting.lock();
        self.free_expired_deferred(now);
        // A pass frees a share of what it evicts from.
        let cap = match on {
            None => self.usage().0,
            Some(on) => {
                let segs = self.segments.read();
                on.iter()
                    .filter_map(|id| segs.get(id))
                    .map(|s| s.alloc.lock().capacity())
                    .sum()
            }
        };
        let target = need.max((cap as f64 * self.cfg.eviction_ratio) as u64);
        let on: Option<HashSet<SegNo>> = on.map(|on| {
            let numbers = self.numbers.read();
            on.iter().filter_map(|&id| numbers.get(id)).collect()
        });
        // Once per pass, not per object: the scan visits every object.
        let at = self.tick(now);
        // What an object counts for in this pass, if it may go.
        let rank_of = |t: &ObjectTable, i: u32, v: &Slot| {
            if !Self::evictable(v, at)
                || on
                    .as_ref()
                    .is_some_and(|on| !t.replicas(i).any(|(s, _)| on.contains(&s)))
            {
                return None;
            }
            let soft = t.soft_pin_until(i) > at;
            let idle = at.0.saturating_sub(v.last_access.0);
            Some((eviction::rank(soft, idle), soft, idle))
        };
        // First scan: how many bytes stand at each place in eviction order.
        let mut histogram = eviction::Histogram::default();
        for shard in self.shards.iter() {
            let sh = shard.lock();
            for (i, v) in sh.objects.iter() {
                if let Some((rank, ..)) = rank_of(&sh.objects, i, v) {
                    histogram.add(rank, sh.objects.bytes(i));
                }
            }
        }
        let Some(boundary) = histogram.boundary(target) else {
            return Evicted::default();
        };
        // The objects at the boundary are sorted exactly, unless there are
        // so many that listing them would cost more memory than it is worth:
        // then they go in scan order (all within 1/8 of one idle time).
        let exact = boundary.objects <= MAX_EXACT;
        let mut need = boundary.need;
        let mut out = Evicted::default();
        let mut at_boundary = Vec::new();
        // Second scan: everything before the boundary goes.
        for (n, shard) in self.shards.iter().enumerate() {
            let sh = shard.lock();
            let mut going = Vec::new();
            for (i, v) in sh.objects.iter() {
                let Some((rank, soft, idle)) = rank_of(&sh.objects, i, v) else {
                    continue;
                };
                let bytes = sh.objects.bytes(i);
                if rank < boundary.rank {
                    going.push(i);
                } else if rank == boundary.rank && exact {
                    at_boundary.push(Candidate {
                        key: (n as u32, i),
                        generation: v.generation,
                        bytes,
                        soft_pinned: soft,
                        idle_ns: idle,
                    });
                } else if rank == boundary.rank && need > 0 {
                    need = need.saturating_sub(bytes);
                    going.push(i);
                }
            }
            self.evict_slots(sh, going, &mut out, now);
        }
        for c in eviction::choose(at_boundary, need) {
            let (n, i) = c.key;
            let sh = self.shards[n as usize].lock();
            // Re-check: the object may have been read or replaced since the scan.
            if sh
                .objects
                .occupied(i)
                .is_some_and(|v| v.generation == c.generation && Self::evictable(v, at))
            {
                self.evict_slots(sh, vec![i], &mut out, now);
            }
        }
        self.evictions.fetch_add(out.objects, Ordering::Relaxed);
        if out.objects > 0 {
            tracing::debug!(objects = out.objects, bytes = out.bytes, "evicted");
        }
        out
    }

    /// Evicts the objects in `slots` of a locked shard.
    fn evict_slots(
        &self,
        mut sh: MutexGuard<'_, Shard>,
        slots: Vec<u32>,
        out: &mut Evicted,
        now: Instant,
    ) {
        if slots.is_empty() {
            return;
        }
        let gone: Vec<(Box<str>, Version<SegNo>)> = slots
            .into_iter()
            .map(|i| (Box::from(sh.objects.key(i)), sh.objects.remove_at(i)))
            .collect();
        drop(sh);
        let unsettled = !self.recovery_settled();
        for (key, v) in gone {
            let v = self.unpack(v);
            out.objects += 1;
            out.bytes += v.replicas.iter().map(|(_, r)| r.len).sum::<u64>();
            tracing::trace!(target: "kvpool_keys", key = &*key, generation = v.generation, "evicted");
            let tomb = if unsettled {
                self.tombstone_eviction(&key, v.generation, now)
            } else {
                0
            };
            self.retire(&key, &v, true, tomb);
        }
    }

    pub(super) fn evictable(v: &Slot, at: Tick) -> bool {
        !v.hard_pinned() && v.lease_until <= at
    }

    /// Objects evicted since start.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}
