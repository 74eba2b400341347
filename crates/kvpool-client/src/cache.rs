//! The location cache: where objects this client read lately live, so a
//! repeat read goes straight to a replica (one round trip over TCP, none
//! over shared memory) instead of asking the master first.
//!
//! An entry is used only under the read lease the master granted with it,
//! and only in the first half of that lease, so a cached read keeps every
//! guarantee of a located one: the object cannot be evicted or removed
//! (without force) meanwhile. It is still never trusted: every read checks
//! the object header and the value checksum, and a location that fails is
//! dropped and the master asked. An upsert, a forced remove or a put after
//! eviction answers only once the old version's headers are destroyed on
//! its stores, so a cached location cannot serve a replaced value.
//!
//! After a master restart or failover (the client registers again) every
//! lease held becomes a hint ([`LocationCache::follow`]).
//!
//! A location without a live lease is still a hint: where this client just
//! wrote an object, or where a lease ran out. A read through a hint goes to
//! the replica while the master is asked to confirm it (and grant the
//! lease), so it costs one round trip instead of two.
//!
//! Reads served from the cache are reported to the master in batches
//! ([`LocationCache::take_touched`]); it counts them for its LRU and extends
//! their leases from the time of the read, and the entry's lease with them
//! ([`LocationCache::renewed`]). An object read steadily stays cached.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use indexmap::IndexMap;
use kvpool_net::capability::unix_ms;
use kvpool_proto::msg::{ObjectLocation, TouchItem};
use parking_lot::Mutex;
use tokio::time::Instant;

const SHARDS: usize = 16;
/// Most reads waiting to be reported; more are not reported (their entries
/// then simply age out), so the set stays bounded if the master is away.
const MAX_TOUCHED: usize = 1 << 16;

/// A location is not used this close to its grants' expiry: the read
/// might reach the store after it.
const GRANT_MARGIN_MS: u64 = 2_000;

/// A cached location and when its read lease began (`None`: a hint).
type Entry = (ObjectLocation, Option<Instant>);

/// One shard: indexed, so a full shard can evict a uniformly random entry
/// in O(1) (a `HashMap` can only drop the entry its iteration finds first,
/// which under churn is the one inserted last: the cache then kept old
/// entries and lost every new one).
type Shard = IndexMap<String, Entry, RandomState>;

/// Bounded map of key → location under a read lease.
pub struct LocationCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    hasher: RandomState,
    hits: AtomicU64,
    stale: AtomicU64,
    /// Reads to report: key → (generation, when read).
    touched: Mutex<HashMap<String, (u64, Instant)>>,
    /// The master link's registrations when the leases here were granted
    /// (see [`Self::follow`]).
    registrations: AtomicU64,
}

/// How the location cache has served reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Reads that went straight to a replica from a cached location.
    pub hits: u64,
    /// Cached locations that failed verification and were dropped.
    pub stale: u64,
}

impl LocationCache {
    /// A cache of at most about `entries` keys (0 disables it).
    pub fn new(entries: usize) -> Self {
        LocationCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: entries.div_ceil(SHARDS),
            hasher: RandomState::new(),
            hits: AtomicU64::new(0),
            stale: AtomicU64::new(0),
            touched: Mutex::new(HashMap::new()),
            registrations: AtomicU64::new(0),
        }
    }

    /// The client registered `registrations` times so far: after a new
    /// registration (a master that did not know it: a restart or a
    /// failover) every lease held is demoted to a hint. A new leader may
    /// commit a new version of a key whose old one sits on a store not yet
    /// back with it; it cannot destroy that one, so the read is confirmed
    /// with the master instead (a leader of this build also holds such a
    /// commit's answer until the leases could have been used alone; one
    /// of an earlier build does not).
    pub fn follow(&self, registrations: u64) {
        // Every read passes here: a load, not a write, when nothing changed.
        if self.registrations.load(Ordering::Acquire) == registrations
            || self.registrations.swap(registrations, Ordering::AcqRel) == registrations
        {
            return;
        }
        for s in &self.shards {
            for (_, from) in s.lock().values_mut() {
                *from = None;
            }
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// The location of `key`, with the start of its lease if that is in its
    /// first half (the read is then recorded for the master), or as a hint.
    pub fn get(&self, key: &str) -> Option<Entry> {
        if self.per_shard == 0 {
            return None;
        }
        let mut shard = self.shard(key).lock();
        let (loc, from) = shard.get(key)?;
        if grants_run_out(loc) {
            // Its stores would refuse it: ask the master for fresh grants.
            shard.swap_remove(key);
            return None;
        }
        let Some(from) = from.filter(|f| f.elapsed() < Duration::from_millis(loc.lease_ms / 2))
        else {
            return Some((loc.clone(), None));
        };
        let hit = (loc.clone(), Some(from));
        drop(shard);
        self.hits.fetch_add(1, Ordering::Relaxed);
        let mut touched = self.touched.lock();
        if touched.len() < MAX_TOUCHED || touched.contains_key(key) {
            touched.insert(key.to_string(), (hit.0.generation, Instant::now()));
        }
        Some(hit)
    }

    /// Records where `key` is, under a lease that began at `from` (`None`:
    /// a hint); an older generation never replaces a newer one, so
    /// concurrent lookups cannot move a key back.
    pub fn insert(&self, key: &str, location: ObjectLocation, from: Option<Instant>) {
        if self.per_shard == 0 || location.replicas.is_empty() {
            return;
        }
        let mut shard = self.shard(key).lock();
        if let Some((old, _)) = shard.get(key) {
            if old.generation > location.generation {
                return;
            }
        } else if shard.len() >= self.per_shard {
            // Full: drop a random entry, so what was read or written last is
            // as likely to stay as anything else.
            let victim = rand::random::<usize>() % shard.len();
            shard.swap_remove_index(victim);
        }
        shard.insert(key.to_string(), (location, from));
    }

    /// Reads since the last call, as the master's `Touch` wants them, with
    /// when each happened (for [`Self::renewed`]).
    pub fn take_touched(&self) -> (Vec<TouchItem>, Vec<Instant>) {
        std::mem::take(&mut *self.touched.lock())
            .into_iter()
            .map(|(key, (generation, at))| {
                let age_us = at.elapsed().as_micros() as u64;
                (
                    TouchItem {
                        key,
                        generation,
                        age_us,
                    },
                    at,
                )
            })
            .unzip()
    }

    /// The master extended `key`'s lease (version `generation`) from `from`.
    pub fn renewed(&self, key: &str, generation: u64, from: Instant) {
        if let Some((loc, f)) = self.shard(key).lock().get_mut(key) {
            if loc.generation == generation {
                *f = (*f).max(Some(from));
            }
        }
    }

    /// Drops `key`'s location.
    pub fn forget(&self, key: &str) {
        if self.per_shard > 0 {
            self.shard(key).lock().swap_remove(key);
        }
    }

    /// Drops `key`'s location, which failed verification.
    pub fn stale(&self, key: &str) {
        self.stale.fetch_add(1, Ordering::Relaxed);
        self.forget(key);
    }

    /// Counters since the client started.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
        }
    }

    /// Drops every location.
    pub fn clear(&self) {
        for s in &self.shards {
            s.lock().clear();
        }
    }
}

/// Whether some replica's grant expires within [`GRANT_MARGIN_MS`].
fn grants_run_out(loc: &ObjectLocation) -> bool {
    let mut caps = loc.replicas.iter().filter_map(|r| r.cap).peekable();
    if caps.peek().is_none() {
        return false;
    }
    let soon = unix_ms().saturating_add(GRANT_MARGIN_MS);
    caps.any(|c| c.expires_ms < soon)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpool_proto::msg::{Replica, SegmentId};

    fn loc(generation: u64) -> ObjectLocation {
        ObjectLocation {
            value_len: 1,
            generation,
            lease_ms: 10_000,
            replicas: vec![Replica {
                segment: SegmentId(1),
                endpoint: "e".into(),
                offset: 0,
                len: 1,
                cap: None,
                tier: Default::default(),
                fence: 1,
            }],
        }
    }

    #[test]
    fn newer_generations_win_and_capacity_holds() {
        let c = LocationCache::new(32);
        c.insert("k", loc(5), Some(Instant::now()));
        c.insert("k", loc(3), Some(Instant::now()));
        assert_eq!(c.get("k").map(|l| l.0.generation), Some(5));
        c.insert("hint", loc(1), None);
        assert!(c.get("hint").is_some_and(|(_, from)| from.is_none()));
        let (items, _) = c.take_touched();
        assert_eq!((items[0].key.as_str(), items[0].generation), ("k", 5));
        assert!(c.take_touched().0.is_empty());
        c.get("hint");
        assert!(c.take_touched().0.is_empty(), "hints are not reported");
        c.insert("k", loc(7), Some(Instant::now()));
        assert_eq!(c.get("k").map(|l| l.0.generation), Some(7));
        c.forget("k");
        assert!(c.get("k").is_none());
        for i in 0..1000 {
            c.insert(&format!("k{i}"), loc(1), Some(Instant::now()));
        }
        let n: usize = c.shards.iter().map(|s| s.lock().len()).sum();
        assert!(n <= 32, "{n} entries in a cache of 32");
    }

    /// A location is dropped once its grants are about to run out: its
    /// stores would refuse the read.
    #[test]
    fn locations_with_expiring_grants_are_dropped() {
        // Room for both in any shard (16 entries are one per shard: the two
        // keys shared one 1 time in 16, and the second pushed out the first).
        let c = LocationCache::new(1024);
        let granted = |expires_ms| {
            let mut l = loc(1);
            l.replicas[0].cap = Some(kvpool_proto::msg::Capability {
                expires_ms,
                access: kvpool_proto::msg::Capability::READ,
                mac: [0; 16],
            });
            l
        };
        c.insert("fresh", granted(unix_ms() + 60_000), Some(Instant::now()));
        c.insert("old", granted(unix_ms() + GRANT_MARGIN_MS / 2), None);
        assert!(c.get("fresh").is_some());
        assert!(c.get("old").is_none());
        assert!(c.get("old").is_none(), "and forgotten");
    }

    /// A full cache keeps what it was given last: eviction is random, not
    /// the first entry a map's iteration finds (which under churn is the
    /// newest, so fresh locations were lost at once).
    #[test]
    fn a_full_cache_keeps_new_entries() {
        let c = LocationCache::new(4096);
        for i in 0..100_000 {
            c.insert(&format!("old{i}"), loc(1), None);
        }
        let fresh: Vec<String> = (0..100).map(|i| format!("fresh{i}")).collect();
        for k in &fresh {
            c.insert(k, loc(1), Some(Instant::now()));
        }
        let kept = fresh.iter().filter(|k| c.get(k).is_some()).count();
        assert!(kept >= 90, "{kept} of 100 fresh entries kept");
        let n: usize = c.shards.iter().map(|s| s.lock().len()).sum();
        assert!(n <= 4096, "{n} entries in a cache of 4096");
    }

    #[test]
    fn disabled_cache_keeps_nothing() {
        let c = LocationCache::new(0);
        c.insert("k", loc(1), Some(Instant::now()));
        assert!(c.get("k").is_none());
    }

    /// Entries serve the first half of their lease; a renewal of the same
    /// version extends that, of another version does not.
    #[tokio::test(start_paused = true)]
    async fn entries_live_half_their_lease_unless_renewed() {
        let c = LocationCache::new(16);
        c.insert("k", loc(1), Some(Instant::now()));
        tokio::time::advance(Duration::from_millis(4_000)).await;
        assert!(c.get("k").is_some());
        c.renewed("k", 2, Instant::now());
        tokio::time::advance(Duration::from_millis(1_000)).await;
        let leased = |c: &LocationCache| c.get("k").is_some_and(|(_, f)| f.is_some());
        assert!(!leased(&c), "half the lease is over: only a hint");
        c.renewed("k", 1, Instant::now());
        assert!(leased(&c), "renewed from now");
    }
}
