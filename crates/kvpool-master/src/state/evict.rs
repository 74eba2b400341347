//! LRU eviction: choosing and dropping the least recently used evictable
//! objects when the pool fills up.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use kvpool_proto::msg::SegmentId;
use tokio::time::Instant;

use crate::eviction::{self, Candidate};

use super::*;

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
        self.evict_on(now, need, None)
    }

    /// [`Self::evict`] limited to objects with a replica on `on`: evicting
    /// elsewhere frees nothing where the caller can allocate.
    pub(super) fn evict_on(
        &self,
        now: Instant,
        need: u64,
        on: Option<&HashSet<SegmentId>>,
    ) -> Evicted {
        let _pass = self.evicting.lock();
        self.free_expired_deferred(now);
        let (cap, _) = self.usage();
        let target = need.max((cap as f64 * self.cfg.eviction_ratio) as u64);
        let mut candidates = Vec::new();
        // Once per pass, not per object: the scan visits every object.
        let at = self.tick(now);
        for shard in self.shards.iter() {
            for (k, v) in shard.lock().objects.iter() {
                if !Self::evictable(v, at)
                    || on.is_some_and(|on| !v.replicas.iter().any(|(s, _)| on.contains(s)))
                {
                    continue;
                }
                candidates.push(Candidate {
                    key: k.to_string(),
                    generation: v.generation,
                    bytes: v.bytes(),
                    soft_pinned: v.soft_pin_until > at,
                    idle: Duration::from_nanos(at.0.saturating_sub(v.last_access.0)),
                });
            }
        }
        let mut out = Evicted::default();
        for c in eviction::choose(candidates, target) {
            let mut shard = self.shard(&c.key).lock();
            // Re-check: the object may have been read or replaced since the scan.
            if !shard
                .objects
                .get(c.key.as_str())
                .is_some_and(|v| v.generation == c.generation && Self::evictable(v, at))
            {
                continue;
            }
            let Some(v) = shard.objects.remove(c.key.as_str()) else {
                continue;
            };
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

    pub(super) fn evictable(v: &Version, at: Tick) -> bool {
        !v.hard_pin && v.lease_until <= at
    }

    /// Objects evicted since start.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}
