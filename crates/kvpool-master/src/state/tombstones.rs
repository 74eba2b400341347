//! Removals a store has not heard of yet. A removed version stays on a
//! store that is down or cut off until its destruction is delivered; if the
//! store comes back to a master that never saw the removal (a new leader)
//! or that forgot the segment (back after the client TTL and store grace),
//! its inventory would hand the key back. A tombstone (key, generation)
//! makes every inventory copy of that version or an older one a rejected
//! object instead.
//!
//! An eviction during a new leader's recovery leaves one too, until the
//! recovery settles: see [`MasterState::tombstone_eviction`]. A removal's
//! is kept that long too, delivered or not: a segment the recovery gave up
//! but etcd's list still names may hold a copy this master never saw
//! (chaos finding 28). And a segment
//! given up is remembered with the keys it held until they are written
//! ([`MasterState::give_up_segment`]), for the same reason.
//!
//! With HA the leader keeps its tombstones in etcd beside the segment list
//! (see `ha.rs`), and a removal whose destruction is not delivered is
//! reported once its tombstone is written there: the removal is then
//! durable without waiting for the store (before, the reply waited up to
//! the client TTL plus the store grace, longer than any client waits, so a
//! remove the master had made answered a timeout).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use kvpool_proto::msg::SegmentId;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::MasterState;

/// How long a tombstone is kept at least: a store may come back with its
/// inventory long after its segment was forgotten.
const LIFE: Duration = Duration::from_secs(600);

/// Most bytes of tombstones written to etcd (an etcd value is limited to
/// about 1.5 MiB); removals beyond it wait for their stores as before.
const WRITTEN_BYTES: usize = 512 << 10;

/// A removed version as kept in etcd: inventory copies of `key` at
/// `generation` or older are rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// The removed key.
    pub key: String,
    /// The removed version's generation.
    pub generation: u64,
}

/// One tombstone held here.
#[derive(Debug)]
struct Tomb {
    generation: u64,
    /// Numbered when added, so replies wait for "written through `seq`".
    seq: u64,
    /// The invalidation batch that destroys the version (0: not known, as
    /// for one loaded from etcd: kept for its whole life).
    destroyed_by: u64,
    segments: Vec<SegmentId>,
    until: Instant,
    /// An eviction's, not a removal's: kept only until the recovery it
    /// happened in settles (see [`MasterState::tombstone_eviction`]).
    evicted: bool,
}

/// A segment given up: the keys it held that nobody wrote since, by
/// [`MasterState::key_hash`].
#[derive(Debug)]
pub(super) struct GivenUp {
    unwritten: HashSet<u64>,
    /// A read through a cached location before this instant may have used
    /// a copy on the segment: it renews no lease (see
    /// [`MasterState::renewable`]).
    young_until: Instant,
    until: Instant,
}

/// The tombstones of this master.
#[derive(Debug, Default)]
pub(super) struct Tombstones {
    by_key: HashMap<String, Tomb>,
    /// Sequence number of the last tombstone added.
    seq: u64,
    /// Bumped on every change, so the writer knows when to write.
    version: u64,
}

impl MasterState {
    /// Records that `key`'s version `generation` on `segments` was removed
    /// and is destroyed by invalidation batch `destroyed_by`; returns the
    /// tombstone's number (see [`Self::removal_durable`]).
    pub(super) fn tombstone(
        &self,
        key: &str,
        generation: u64,
        segments: Vec<SegmentId>,
        destroyed_by: u64,
        now: Instant,
    ) -> u64 {
        self.add_tombstone(key, generation, segments, destroyed_by, false, now)
    }

    /// Records that `key`'s version `generation` was evicted while this
    /// master's recovery has not settled: a segment not back yet (or given
    /// up but still on etcd's list), or a copy a returned one brought that
    /// is not destroyed yet, may hold an older version of the key, and with
    /// the evicted one gone nothing newer would refuse it. An upsert
    /// answered during the recovery would then be undone (chaos finding
    /// 25). Kept until the recovery settles, and in etcd meanwhile for a
    /// leader that takes over before that. Returns the tombstone's number.
    pub(super) fn tombstone_eviction(&self, key: &str, generation: u64, now: Instant) -> u64 {
        self.add_tombstone(key, generation, Vec::new(), 0, true, now)
    }

    fn add_tombstone(
        &self,
        key: &str,
        generation: u64,
        segments: Vec<SegmentId>,
        destroyed_by: u64,
        evicted: bool,
        now: Instant,
    ) -> u64 {
        let until = now + LIFE.max(self.cfg.client_ttl + self.cfg.store_grace);
        let mut t = self.tombstones.lock();
        t.seq += 1;
        t.version += 1;
        let seq = t.seq;
        let tomb = Tomb {
            generation,
            seq,
            destroyed_by,
            segments,
            until,
            evicted,
        };
        match t.by_key.get_mut(key) {
            Some(old) if old.generation > generation => {}
            Some(old) => *old = tomb,
            None => {
                t.by_key.insert(key.to_string(), tomb);
            }
        }
        seq
    }

    /// Whether an inventory copy of `key` at `generation` was removed.
    pub(super) fn tombstoned(&self, key: &str, generation: u64) -> bool {
        let t = self.tombstones.lock();
        t.by_key
            .get(key)
            .is_some_and(|t| generation <= t.generation)
    }

    /// Whether the removal numbered `seq` survives a failover: always
    /// without HA (no other master can take over), with HA once its
    /// tombstone is in etcd.
    pub(super) fn removal_durable(&self, seq: u64) -> bool {
        seq == 0
            || !self.tombstones_in_etcd.load(Ordering::Acquire)
            || self.tombstones_written.load(Ordering::Acquire) >= seq
    }

    /// Starts keeping tombstones in etcd (HA), with those `loaded` from
    /// the previous leader.
    pub fn keep_tombstones(&self, loaded: Vec<Tombstone>, now: Instant) {
        self.tombstones_in_etcd.store(true, Ordering::Release);
        if loaded.is_empty() {
            return;
        }
        tracing::info!(
            tombstones = loaded.len(),
            "removals from before the failover are kept"
        );
        for l in loaded {
            self.tombstone(&l.key, l.generation, Vec::new(), 0, now);
        }
    }

    /// The tombstones to keep in etcd, if they changed since `version`:
    /// `(version, written through, tombstones)`. Those destroyed on every
    /// store once the recovery settled (or past their life) are dropped
    /// first; beyond
    /// [`WRITTEN_BYTES`], the newest are left out.
    pub fn tombstones_to_write(
        &self,
        version: u64,
        now: Instant,
    ) -> Option<(u64, u64, Vec<Tombstone>)> {
        // Called every 100 ms by the HA loop: nothing to prune or write is
        // the usual case, and costs no copy of the owing set.
        {
            let t = self.tombstones.lock();
            if t.by_key.is_empty() && t.version == version {
                return None;
            }
        }
        let sent = self.invalidated_through.load(Ordering::Acquire);
        let settled = self.recovery_settled();
        let (owing, mounted) = {
            let inv = self.invalidations.lock();
            let segs = self.segments.read();
            (inv.owing.clone(), segs.keys().copied().collect::<Vec<_>>())
        };
        let mut t = self.tombstones.lock();
        let before = t.by_key.len();
        t.by_key.retain(|_, tomb| {
            let delivered = tomb.destroyed_by != 0
                && tomb.destroyed_by <= sent
                && tomb
                    .segments
                    .iter()
                    .all(|s| mounted.contains(s) && !owing.contains(s));
            now < tomb.until && !(delivered && settled) && !(tomb.evicted && settled)
        });
        if t.by_key.len() != before {
            t.version += 1;
        }
        if t.version == version {
            return None;
        }
        let mut all: Vec<(&String, &Tomb)> = t.by_key.iter().collect();
        all.sort_unstable_by_key(|(_, tomb)| tomb.seq);
        let (mut bytes, mut through, mut out) = (0, t.seq, Vec::new());
        for (key, tomb) in all {
            bytes += key.len() + 40;
            if bytes > WRITTEN_BYTES {
                through = tomb.seq - 1;
                break;
            }
            out.push(Tombstone {
                key: key.clone(),
                generation: tomb.generation,
            });
        }
        Some((t.version, through, out))
    }

    /// Gives up segment `id`, whose store was silent past the client TTL
    /// and the store grace: its replicas are forgotten, and the keys it
    /// held are remembered (for as long as a tombstone lives) until
    /// somebody writes them. If the store comes back with the segment, a
    /// copy of a key written meanwhile and since evicted is not taken: it
    /// is a version the write replaced, and with the newer one gone nothing
    /// else would refuse it (the gap finding 25 closed for a recovery).
    pub(super) fn give_up_segment(&self, id: SegmentId, now: Instant) {
        let unwritten = self.drop_segment(id, Some(now));
        self.record_given_up(id, unwritten, now);
    }

    /// Remembers segment `id`, given up now, with the keys it held that
    /// nobody wrote since (`unwritten`, by hash).
    pub(super) fn record_given_up(&self, id: SegmentId, unwritten: HashSet<u64>, now: Instant) {
        let until = now + LIFE.max(self.cfg.client_ttl + self.cfg.store_grace);
        let young_until = now.max(*self.term_start.lock()) + self.cfg.lease_ttl / 2;
        let g = GivenUp {
            unwritten,
            young_until,
            until,
        };
        self.given_up.lock().insert(id, g);
        self.any_given_up.store(true, Ordering::Release);
    }

    /// Forgets given-up segments past a tombstone's life: back after that,
    /// a segment's inventory is taken as is.
    pub(super) fn expire_given_up(&self, now: Instant) {
        if self.any_given_up.load(Ordering::Acquire) {
            let mut given_up = self.given_up.lock();
            given_up.retain(|_, g| now < g.until);
            self.any_given_up
                .store(!given_up.is_empty(), Ordering::Release);
        }
    }

    /// `key` was written or removed: a copy of it on a given-up segment is
    /// older than that.
    pub(super) fn written(&self, key: &str) {
        if !self.any_given_up.load(Ordering::Acquire) {
            return;
        }
        let h = self.key_hash(key);
        for g in self.given_up.lock().values_mut() {
            g.unwritten.remove(&h);
        }
    }

    /// Whether a read of `key` through a cached location at `at` may renew
    /// its lease. Not if the key had a copy on a segment given up since the
    /// location was cached, unless the read came after every location
    /// cached before the give-up stopped being young: the location may
    /// name that copy, which the master no longer knows and cannot fence,
    /// while its store, cut off from the master alone, still serves it.
    /// Renewed, the location would be read after a write of the key is
    /// answered (chaos finding 27). Nor if a tier move of the key finished
    /// since, for the same reason (see [`Self::read_left_copy`]).
    pub(super) fn renewable(&self, key: &str, at: Instant) -> bool {
        let given_up = self.any_given_up.load(Ordering::Acquire);
        if !given_up && !self.any_moved_leased.load(Ordering::Acquire) {
            return true;
        }
        let h = self.key_hash(key);
        !self.read_left_copy(h, at)
            && (!given_up
                || (self.given_up.lock().values())
                    .all(|g| at >= g.young_until || !g.unwritten.contains(&h)))
    }

    /// The keys segment `id` held when it was given up that nobody wrote
    /// since, if it was given up (within a tombstone's life); forgotten
    /// here, as the segment is back.
    pub(super) fn take_given_up(&self, id: SegmentId, now: Instant) -> Option<HashSet<u64>> {
        let mut given_up = self.given_up.lock();
        let g = given_up.remove(&id).filter(|g| now < g.until);
        self.any_given_up
            .store(!given_up.is_empty(), Ordering::Release);
        g.map(|g| g.unwritten)
    }

    /// Records that etcd holds every tombstone through `through`.
    pub fn tombstones_written(&self, through: u64) {
        self.tombstones_written.fetch_max(through, Ordering::AcqRel);
        // Evictions held back for their tombstones may go now.
        self.release_held_back();
    }
}
