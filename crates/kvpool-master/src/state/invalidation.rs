//! Freed regions: returning them to their allocators, queueing the
//! destruction of their object headers on the stores, the per-key fences a
//! reply waits on, and regions whose reuse waits for a read lease to end.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;

use kvpool_proto::msg::{SegmentId, Tier};
use tokio::time::Instant;

use crate::alloc::Region;

use super::*;

/// Freed regions of one segment to destroy on its store: the segment, its
/// data endpoint, and `(offset, generation)` pairs.
pub type Invalidations = (SegmentId, String, Vec<(u64, u64)>);

/// Freed or replaced versions whose headers the stores must destroy, so that
/// neither a restart nor a reader holding an old location (a client's
/// location cache) can see them again.
#[derive(Default)]
pub(super) struct InvalidationQueue {
    /// `(offset, generation)` per segment.
    pub(super) regions: HashMap<SegmentId, Vec<(u64, u64)>>,
    /// Sequence number of the last queued batch.
    pub(super) seq: u64,
    /// Keys with an old version possibly still readable, and what its
    /// destruction waits on: a new value or a removal of the key is
    /// reported only after that (see [`MasterState::fence`]).
    pub(super) fences: HashMap<String, KeyFence>,
    /// Segments whose invalidations could not be delivered (store down, or
    /// cut off from this master while clients may still reach it): a
    /// fence over them holds until they are delivered.
    pub(super) owing: HashSet<SegmentId>,
    /// Segments dropped that the list in etcd still names: a store given
    /// up, or a segment expected back after a failover that did not come
    /// back in time. A leader taking over now would expect them back and
    /// take their copies as they are, so what they owe stays owed, versions
    /// held back behind their copies stay held (chaos finding 26), and the
    /// recovery has not settled (finding 28), until the list drops them or
    /// they are back. Added and dropped under the membership lock, which a
    /// list write holds too, so a write cannot miss one.
    pub(super) away: HashSet<SegmentId>,
    /// Segments given up, and until when a client may still read the
    /// copies they held through a young cached location: their store may
    /// still serve them (cut off from this master, not from its clients)
    /// and no destruction reaches it, so fences over them hold until then
    /// (chaos finding 27).
    gone: HashMap<SegmentId, Instant>,
    /// Keys with a destroyed version whose destruction is not delivered yet
    /// (not sent, or its segment owes it): unlike a fence, this stays until
    /// delivery, however long (see [`MasterState::retire_last`]).
    older: HashMap<String, Older>,
    /// Destructions of keys' last versions waiting for an older version's.
    held_back: HashMap<String, Copies>,
    /// Of those, evictions during a recovery that also wait for their
    /// tombstone to be durable (see [`MasterState::retire_last`]).
    held_for_tomb: HashMap<String, u64>,
    /// `(segment, offset)` to the generation last queued for destruction
    /// there, the newest [`RECENT_MAX`]: a store refuses a later write of
    /// that generation at that offset (it cannot tell it from a late one),
    /// so a copy of the same version is placed elsewhere
    /// (see [`MasterState::invalidated_at`]).
    recent: HashMap<(SegmentId, u64), u64>,
    recent_order: VecDeque<(SegmentId, u64)>,
}

/// Destructions remembered for [`InvalidationQueue::recent`].
const RECENT_MAX: usize = 1 << 16;

/// Copies of a version to destroy: `(segment, region, generation)`.
type Copies = Vec<(SegmentId, Region, u64)>;

/// Where an older version of a key still waits to be destroyed.
#[derive(Debug, Clone)]
struct Older {
    /// The invalidation batch that destroys it.
    seq: u64,
    /// The segments it lies on.
    segments: Vec<SegmentId>,
}

impl InvalidationQueue {
    /// Queues the destruction of the object of `generation` at `offset` of
    /// segment `s`.
    fn queue(&mut self, s: SegmentId, offset: u64, generation: u64) {
        self.regions
            .entry(s)
            .or_default()
            .push((offset, generation));
        if self.recent.insert((s, offset), generation).is_none() {
            self.recent_order.push_back((s, offset));
            if self.recent_order.len() > RECENT_MAX {
                if let Some(old) = self.recent_order.pop_front() {
                    self.recent.remove(&old);
                }
            }
        }
    }

    /// Whether `key` has a version whose destruction is not delivered yet,
    /// with batches through `sent` sent.
    fn older_pending(&self, key: &str, sent: u64) -> bool {
        (self.older.get(key)).is_some_and(|o| o.seq > sent || self.owes(&o.segments))
    }

    /// Whether a destruction on one of `segments` is not delivered yet, or
    /// cannot be relied on as done (see [`Self::away`]).
    fn owes(&self, segments: &[SegmentId]) -> bool {
        (segments.iter()).any(|s| self.owing.contains(s) || self.away.contains(s))
    }

    /// Whether a fence over `segments` waits on one of them at `now`: it
    /// owes an invalidation, or it was given up while its copies may still
    /// be read (see [`Self::gone`]).
    fn fence_owes(&self, segments: &[SegmentId], now: Instant) -> bool {
        segments
            .iter()
            .any(|s| self.owing.contains(s) || self.gone.get(s).is_some_and(|until| now < *until))
    }

    /// Forgets the older versions whose destruction is delivered, with
    /// batches through `sent` sent.
    fn forget_delivered_older(&mut self, sent: u64) {
        let mut older = std::mem::take(&mut self.older);
        older.retain(|_, o| o.seq > sent || self.owes(&o.segments));
        self.older = older;
    }

    /// Forgets the copies segment `id` held of older versions: none is
    /// waited for there any more.
    fn forget_older_on(&mut self, id: SegmentId) {
        for o in self.older.values_mut() {
            o.segments.retain(|s| *s != id);
        }
    }

    /// Records that `key`'s copies on `segments` are destroyed by batch `seq`.
    fn note_older(&mut self, key: &str, seq: u64, segments: impl Iterator<Item = SegmentId>) {
        let o = (self.older.entry(key.to_string())).or_insert(Older {
            seq,
            segments: Vec::new(),
        });
        o.seq = o.seq.max(seq);
        for s in segments {
            if !o.segments.contains(&s) {
                o.segments.push(s);
            }
        }
    }
}

/// What must happen before a reply about a key with a replaced or removed
/// version may go.
#[derive(Debug, Clone)]
pub(super) struct KeyFence {
    /// The invalidation batch that destroys the old version.
    seq: u64,
    /// The segments it lies on.
    segments: Vec<SegmentId>,
    /// Until then a client may read the old version through a cached
    /// location under the first half of a read lease, without asking this
    /// master: the fence holds at least that long if it is not delivered.
    young_until: Instant,
    /// For a removal: its tombstone's number; the fence also holds until
    /// the removal is durable (see [`MasterState::removal_durable`]).
    durable: u64,
    /// For a removal during a tier move: the reply waits for `durable`
    /// even once the replicas' destruction is delivered, since the move's
    /// copy outlives them until the move finishes, and a leader that dies
    /// first leaves only the tombstone to refuse it (chaos finding 24).
    durable_first: bool,
    /// The fence holds no longer than this.
    hard_until: Instant,
}

/// What a reply waits for (see [`MasterState::fence_done`]).
#[derive(Debug, Clone)]
pub struct FenceWait {
    seq: u64,
    segments: Vec<SegmentId>,
    /// Undelivered, the reply goes from this instant once its removals are
    /// durable.
    young: Instant,
    /// Tombstones it waits to be durable through.
    durable: u64,
    /// Tombstones that must be durable before the reply, delivered or not
    /// (see `KeyFence::durable_first`), unless `until` passed.
    durable_first: u64,
    /// The reply goes at this instant whatever happened.
    pub until: Instant,
    /// Nor before this instant, unless the recovery it waits out settled
    /// (see [`MasterState::recovery_wait`]).
    pub not_before: Option<Instant>,
    /// Keys whose last version was held back behind an older one (see
    /// [`MasterState::retire_last`]): its destruction is queued only once
    /// the older one's is delivered, in a batch numbered after `seq`, so
    /// their fences are read again until then.
    held: Vec<String>,
}

impl FenceWait {
    /// A wait for invalidation batch `seq` to be sent, for at most
    /// [`FENCE_WAIT`] from `now`; the fences it covers widen it.
    fn sent_through(seq: u64, now: Instant) -> FenceWait {
        FenceWait {
            seq,
            not_before: None,
            ..FenceWait::at(now + FENCE_WAIT)
        }
    }

    /// A wait for nothing but the instant `t`.
    pub fn at(t: Instant) -> FenceWait {
        FenceWait {
            seq: 0,
            segments: Vec::new(),
            young: t,
            durable: 0,
            durable_first: 0,
            until: t,
            not_before: Some(t),
            held: Vec::new(),
        }
    }

    /// This wait, and not over before `t`.
    pub fn not_before(mut self, t: Instant) -> FenceWait {
        self.not_before = Some(self.not_before.map_or(t, |n| n.max(t)));
        self.until = self.until.max(t);
        self
    }

    /// When the waiter should look again if nothing is sent meanwhile.
    pub fn next_look(&self, now: Instant) -> Instant {
        match self.not_before {
            Some(t) if now < t => t,
            _ => self.until,
        }
    }
}

/// Longest a reply waits for a reachable store to destroy an old version
/// nobody holds a young lease on; a store that slow is retried later.
pub const FENCE_WAIT: Duration = Duration::from_secs(2);

impl MasterState {
    /// Returns regions to their allocators. With the generation of the
    /// object written there, also queues its destruction on the store; a
    /// disk-tier region then goes back only once that is done, because a
    /// store destroys a header on disk by rewriting its whole block, which
    /// must not race a new object's copy into the same block.
    pub(super) fn free_now(&self, replicas: &[(SegmentId, Region)], written: Option<u64>) {
        let segs = self.segments.read();
        let mut inv = written.map(|_| self.invalidations.lock());
        let mut later = Vec::new();
        for (id, r) in replicas {
            let Some(s) = segs.get(id) else { continue };
            match (inv.as_mut(), written) {
                (Some(inv), Some(gen)) => {
                    inv.queue(*id, r.offset, gen);
                    if s.info.tier != Tier::ALL[0] {
                        later.push((*id, *r));
                    } else {
                        s.alloc.lock().free(*r);
                    }
                }
                _ => s.alloc.lock().free(*r),
            }
        }
        if let Some(mut inv) = inv {
            inv.seq += 1;
            let seq = inv.seq;
            drop(inv);
            if !later.is_empty() {
                let mut waiting = self.after_invalidation.lock();
                waiting.extend(later.into_iter().map(|(id, r)| (seq, id, r)));
            }
        }
    }

    /// Until when a client may read version `v` through a cached location
    /// without asking this master: the first half of its read lease, and
    /// of any lease an earlier leader granted before this term began.
    fn young_until(&self, v: &Version) -> Instant {
        self.young_until_lease(v.lease_until)
    }

    /// [`Self::young_until`] of a version leased until `lease_until`.
    pub(super) fn young_until_lease(&self, lease_until: Tick) -> Instant {
        let half = self.cfg.lease_ttl / 2;
        let lease = self.instant(lease_until);
        let leased = lease.checked_sub(half).unwrap_or(lease);
        leased.max(*self.term_start.lock() + half)
    }

    /// Fences `key` until the invalidation batch `seq` of its copies on
    /// `segments` is delivered, or until `young_until` if it cannot be. A
    /// fence the key already has is widened, not replaced: an older version,
    /// or a copy a move left, may still be undelivered when a newer one is
    /// replaced in turn.
    fn fence_key(
        &self,
        inv: &mut InvalidationQueue,
        key: &str,
        segments: impl IntoIterator<Item = SegmentId>,
        seq: u64,
        young_until: Instant,
    ) {
        let segments = segments.into_iter();
        match inv.fences.get_mut(key) {
            Some(f) => {
                f.seq = f.seq.max(seq);
                for s in segments {
                    if !f.segments.contains(&s) {
                        f.segments.push(s);
                    }
                }
                f.young_until = f.young_until.max(young_until);
                f.hard_until = f.hard_until.max(young_until);
            }
            None => {
                let fence = KeyFence {
                    seq,
                    segments: segments.collect(),
                    young_until,
                    durable: 0,
                    durable_first: false,
                    hard_until: young_until,
                };
                inv.fences.insert(key.to_string(), fence);
            }
        }
    }

    /// Gives back the regions of a put in flight that will never commit
    /// (revoked, expired, or its writer dropped). Their headers are
    /// destroyed now, but the regions are reused only once every write
    /// grant on them could have expired (a pending TTL from `now`): a write
    /// may still be on its way (a writer cut off from the pool has its TCP
    /// frames retransmitted when its link comes back), and it would land on
    /// whatever object was placed there meanwhile. The chaos harness lost
    /// acknowledged objects that way. Then they are destroyed once more
    /// before reuse: a late write the store could not refuse (one through
    /// shared memory) would otherwise leave an object that a scan finds, and
    /// a new leader would take the key back after it was removed.
    pub(super) fn abandon(&self, replicas: &[(SegmentId, Region)], generation: u64, now: Instant) {
        {
            let mut inv = self.invalidations.lock();
            for (s, r) in replicas {
                inv.queue(*s, r.offset, generation);
            }
            inv.seq += 1;
        }
        let until = now + self.cfg.pending_ttl;
        self.deferred.lock().extend(
            replicas
                .iter()
                .map(|(s, r)| (until, *s, *r, Some(generation))),
        );
    }

    /// Frees the regions of `key`'s version `v`, which was evicted or
    /// replaced without a live lease, and fences the key until its headers
    /// are destroyed. `last`: nothing newer of the key stays (see
    /// [`Self::retire_last`]); `tomb`: its eviction's tombstone, if any.
    pub(super) fn retire(&self, key: &str, v: &Version, last: bool, tomb: u64) {
        let young = self.young_until(v);
        if last && self.retire_last(key, v, young, true, tomb) {
            tracing::trace!(target: "kvpool_keys", key, generation = v.generation, tomb,
                "destruction held back");
            return;
        }
        self.free_now(&v.replicas, Some(v.generation));
        let mut inv = self.invalidations.lock();
        let seq = inv.seq;
        self.fence_key(&mut inv, key, v.segments(), seq, young);
        inv.note_older(key, seq, v.segments());
    }

    /// Frees the regions of `key`'s version `v`, removed by a client, and
    /// fences the key until its headers are destroyed on every store, or
    /// until young leases are over and its tombstone makes the removal
    /// durable. A removal must not be reported done while a copy survives
    /// on an unreachable store and nothing else records it: a new leader,
    /// which knows nothing of the removal, would take the key back from
    /// that store's inventory (see `tombstones.rs`). Without a durable
    /// tombstone (etcd unreachable) the fence holds as long as the store
    /// may come back: the client TTL plus the store grace.
    pub(super) fn retire_removed(&self, key: &str, v: &Version, now: Instant) {
        let young = self.young_until(v);
        // Held back behind an older version, it is destroyed by a batch not
        // numbered yet: its tombstone is kept for its whole life (0).
        let seq = if self.retire_last(key, v, young, false, 0) {
            0
        } else {
            self.free_now(&v.replicas, Some(v.generation));
            let mut inv = self.invalidations.lock();
            let seq = inv.seq;
            self.fence_key(&mut inv, key, v.segments(), seq, young);
            inv.note_older(key, seq, v.segments());
            seq
        };
        // The tombstone stays until every copy the fence waits for is
        // destroyed, copies left by moves included.
        let segments: Vec<SegmentId> = (self.invalidations.lock().fences.get(key))
            .map_or_else(|| v.segments().collect(), |f| f.segments.clone());
        // A copy a tier move is making of it may land after this, and is
        // destroyed only when the move finishes: the tombstone must not go
        // with the replicas' destruction, so it is kept for its whole life.
        // While the recovery has not settled, a segment still expected, or
        // given up but on etcd's list, may hold a copy this master never
        // saw, which a leader taking over would take back: the reply waits
        // for the tombstone to be in etcd, and it stays there until the
        // recovery settles (see `tombstones_to_write`; chaos finding 28).
        let moving = self.tier.lock().moving.contains(key);
        let unsettled = !self.recovery_settled();
        let destroyed_by = if moving { 0 } else { seq };
        let tomb = self.tombstone(key, v.generation, segments, destroyed_by, now);
        let hard = now + self.cfg.client_ttl + self.cfg.store_grace;
        if let Some(f) = self.invalidations.lock().fences.get_mut(key) {
            f.durable = f.durable.max(tomb);
            f.durable_first |= moving || unsettled;
            f.hard_until = f.hard_until.max(hard);
        }
    }

    /// Retires `key`'s last version `v` (removed, evicted: nothing newer of
    /// the key stays) after any older version of the key whose destruction
    /// is not delivered yet: until then `v` keeps its regions and its bytes,
    /// and the key is fenced until `until`. Destroyed first, `v` would leave
    /// the older version the newest on the stores, and a new leader
    /// rebuilding from their inventories would serve it, a value replaced
    /// long before (chaos finding 13: a store holding the older version was
    /// cut off, the newer one was removed, then the leader died). An
    /// eviction during a recovery also waits for its tombstone (`tomb`) to
    /// be durable: a segment the recovery gave up may hold an older
    /// version, and a leader taking over before the tombstone is in etcd
    /// would take it back (chaos finding 28). Returns false when nothing
    /// waits, and `v` is retired as usual.
    pub(super) fn retire_last(
        &self,
        key: &str,
        v: &Version,
        until: Instant,
        behind_moves: bool,
        tomb: u64,
    ) -> bool {
        // With `behind_moves` (no tombstone will refuse the key's older
        // versions: an eviction), a move in flight of the key, which leaves
        // a copy destroyed only when it finishes, holds `v` back too
        // (chaos finding 25).
        let moving = behind_moves && self.tier.lock().moving.contains(key);
        let sent = self.invalidated_through.load(Ordering::Acquire);
        let undurable = !self.removal_durable(tomb);
        let mut inv = self.invalidations.lock();
        if !moving && !undurable && !inv.older_pending(key, sent) {
            return false;
        }
        if undurable {
            let t = inv.held_for_tomb.entry(key.to_string()).or_insert(tomb);
            *t = (*t).max(tomb);
        }
        let older = inv.older.get(key).cloned();
        let copies = v.replicas.iter().map(|(s, r)| (*s, *r, v.generation));
        inv.held_back
            .entry(key.to_string())
            .or_default()
            .extend(copies);
        let seq = older.as_ref().map_or(inv.seq, |o| o.seq);
        self.fence_key(&mut inv, key, v.segments(), seq, until);
        if let (Some(f), Some(older)) = (inv.fences.get_mut(key), older) {
            for s in older.segments {
                if !f.segments.contains(&s) {
                    f.segments.push(s);
                }
            }
        }
        true
    }

    /// Retires the versions held back behind older ones that are destroyed
    /// now (see [`Self::retire_last`]).
    pub(super) fn release_held_back(&self) {
        if self.invalidations.lock().held_back.is_empty() {
            return;
        }
        let sent = self.invalidated_through.load(Ordering::Acquire);
        // Settled, an eviction's tombstone has done its work, written or
        // not (an unwritten one is dropped then).
        let settled = self.recovery_settled();
        let ready: Vec<(String, Copies)> = {
            let mut inv = self.invalidations.lock();
            // The tier's move list is a leaf lock (see the lock order).
            let tier = self.tier.lock();
            let keys: Vec<String> = (inv.held_back.keys())
                .filter(|k| {
                    !inv.older_pending(k, sent)
                        && !tier.moving.contains(k.as_str())
                        && (settled
                            || (inv.held_for_tomb.get(k.as_str()))
                                .is_none_or(|t| self.removal_durable(*t)))
                })
                .cloned()
                .collect();
            drop(tier);
            for k in &keys {
                inv.held_for_tomb.remove(k);
            }
            (keys.into_iter())
                .filter_map(|k| inv.held_back.remove(&k).map(|c| (k, c)))
                .collect()
        };
        for (key, copies) in ready {
            for &(s, r, generation) in &copies {
                self.free_now(&[(s, r)], Some(generation));
            }
            let mut inv = self.invalidations.lock();
            let seq = inv.seq;
            inv.note_older(&key, seq, copies.iter().map(|c| c.0));
            if let Some(f) = inv.fences.get_mut(&key) {
                f.seq = f.seq.max(seq);
            }
        }
    }

    /// Forgets what segment `id` owed and held back: it is gone, and its
    /// copies with it. While the list in etcd still names it, the copies it
    /// held of older versions still count as undestroyed (see
    /// [`InvalidationQueue::away`]).
    pub(super) fn forget_segment_copies(&self, id: SegmentId) {
        {
            let m = self.membership.lock();
            let listed = m.names(id);
            let mut inv = self.invalidations.lock();
            inv.regions.remove(&id);
            inv.owing.remove(&id);
            if listed {
                inv.away.insert(id);
            } else {
                inv.forget_older_on(id);
            }
            for copies in inv.held_back.values_mut() {
                copies.retain(|c| c.0 != id);
            }
            inv.held_back.retain(|_, c| !c.is_empty());
            let InvalidationQueue {
                held_back,
                held_for_tomb,
                ..
            } = &mut *inv;
            held_for_tomb.retain(|k, _| held_back.contains_key(k));
        }
        self.release_held_back();
    }

    /// Fences `key`, whose copy on segment `id`, given up at `now`, was
    /// leased until `lease_until`, while a client may still read that copy
    /// through its cached location (see [`InvalidationQueue::gone`]).
    pub(super) fn fence_gone_copy(
        &self,
        key: &str,
        id: SegmentId,
        lease_until: Tick,
        now: Instant,
    ) {
        let young = self.young_until_lease(lease_until);
        if young > now {
            let mut inv = self.invalidations.lock();
            let until = inv.gone.entry(id).or_insert(young);
            *until = (*until).max(young);
            let seq = inv.seq;
            self.fence_key(&mut inv, key, [id], seq, young);
        }
    }

    /// The list in etcd names `listed` now: segments dropped while it
    /// named them are gone for a leader taking over too. Called under the
    /// membership lock.
    pub(super) fn unlisted(&self, listed: &[SegmentId]) {
        let mut inv = self.invalidations.lock();
        let gone: Vec<SegmentId> = (inv.away.iter())
            .filter(|s| !listed.contains(s))
            .copied()
            .collect();
        for id in gone {
            inv.away.remove(&id);
            inv.forget_older_on(id);
        }
    }

    /// Segment `id`, dropped while listed, is back with its inventory
    /// reconciled (or empty): the copies it brought of older versions are
    /// rejected, and destroyed by the latest batch queued. Mounted, it is
    /// listed again, so only this takes it off [`InvalidationQueue::away`];
    /// the recovery then settles once that batch is sent.
    pub(super) fn back_from_away(&self, id: SegmentId) {
        let mut inv = self.invalidations.lock();
        if inv.away.remove(&id) {
            let seq = inv.seq;
            for o in inv.older.values_mut() {
                if o.segments.contains(&id) {
                    o.seq = o.seq.max(seq);
                }
            }
            let through = self.settled_through.load(Ordering::Acquire);
            if through != u64::MAX {
                self.settled_through
                    .store(through.max(seq), Ordering::Release);
            }
        }
    }

    /// Retires `key`'s version `v`, replaced by a newer one: its headers are
    /// destroyed at once (a reader of the old location then asks the master
    /// again), and under a live read lease its regions are reused only when
    /// the lease ends, so a reader in flight never sees them rewritten.
    pub(super) fn release(&self, key: &str, v: Version, now: Instant) {
        if v.lease_until > self.tick(now) {
            let mut inv = self.invalidations.lock();
            for (s, r) in &v.replicas {
                inv.queue(*s, r.offset, v.generation);
            }
            inv.seq += 1;
            let seq = inv.seq;
            let young = self.young_until(&v);
            self.fence_key(&mut inv, key, v.segments(), seq, young);
            inv.note_older(key, seq, v.segments());
            drop(inv);
            let until = self.instant(v.lease_until);
            self.deferred
                .lock()
                .extend(v.replicas.into_iter().map(|(s, r)| (until, s, r, None)));
        } else {
            self.retire(key, &v, false, 0);
        }
    }

    /// The offsets of segment `id` where an object of `generation` was
    /// queued for destruction lately (see [`InvalidationQueue::recent`]).
    pub(super) fn invalidated_at(&self, id: SegmentId, generation: u64) -> HashSet<u64> {
        let inv = self.invalidations.lock();
        (inv.recent.iter())
            .filter(|((s, _), g)| *s == id && **g == generation)
            .map(|((_, offset), _)| *offset)
            .collect()
    }

    /// What a reply about `keys` must wait for, if anything: their old
    /// versions destroyed on the stores. It waits at most [`FENCE_WAIT`]
    /// for a delivery, and where one fails, until no client can read the
    /// old version through a young cached location (at most half a lease).
    pub fn fence<'a>(
        &self,
        keys: impl IntoIterator<Item = &'a str>,
        now: Instant,
    ) -> Option<FenceWait> {
        let inv = self.invalidations.lock();
        if inv.fences.is_empty() {
            return None;
        }
        let done = self.invalidated_through.load(Ordering::Acquire);
        let mut wait: Option<FenceWait> = None;
        for (k, f) in keys
            .into_iter()
            .filter_map(|k| inv.fences.get(k).map(|f| (k, f)))
        {
            // A held-back version is as undelivered as the older one it waits for.
            let held = inv.held_back.contains_key(k);
            let owing = held || inv.fence_owes(&f.segments, now);
            let durable = self.removal_durable(f.durable);
            let first = f.durable_first && !durable;
            if f.seq <= done && !(owing && (now < f.young_until || !durable)) && !first {
                continue;
            }
            let w = wait.get_or_insert_with(|| FenceWait::sent_through(0, now));
            if held {
                w.held.push(k.to_string());
            }
            w.seq = w.seq.max(f.seq);
            w.segments.extend_from_slice(&f.segments);
            w.young = w.young.max(f.young_until);
            w.durable = w.durable.max(f.durable);
            if f.durable_first {
                w.durable_first = w.durable_first.max(f.durable);
            }
            w.until = w.until.max(f.young_until).max(f.hard_until);
        }
        wait
    }

    /// Whether a reply waiting on `w` may go at `now`: every batch through
    /// its sequence number was sent and none of its segments still owes an
    /// invalidation, and each held-back version of its keys was released and
    /// its own destruction sent too; or its time is up.
    pub fn fence_done(&self, w: &FenceWait, now: Instant) -> bool {
        if w.not_before.is_some_and(|t| now < t) && !self.recovery_settled() {
            return false;
        }
        if now < w.until && !self.removal_durable(w.durable_first) {
            return false;
        }
        if now >= w.until || (now >= w.young && self.removal_durable(w.durable)) {
            return true;
        }
        let sent = self.invalidated_through.load(Ordering::Acquire);
        if sent < w.seq {
            return false;
        }
        let inv = self.invalidations.lock();
        let owes = |segments: &[SegmentId]| inv.fence_owes(segments, now);
        !owes(&w.segments)
            && !w.held.iter().any(|k| {
                inv.held_back.contains_key(k)
                    || inv
                        .fences
                        .get(k)
                        .is_some_and(|f| f.seq > sent || owes(&f.segments))
            })
    }

    /// Until when a commit may not be reported while segments mounted
    /// before a failover are still expected back: one of them may hold the
    /// key's last version before the failover, which this master has not
    /// seen and so cannot fence, and a client holding a read lease an
    /// earlier leader granted reads it through its cached location, without
    /// asking, for the lease's first half. That holds for a key known here
    /// too: a segment back already may have brought an older version (one
    /// whose destruction its store missed), the chaos harness's finding 23.
    /// Every such lease was granted before this term began, so that half is
    /// over by `term start + lease / 2`. `None` once that instant passed,
    /// or the recovery settled (see [`Self::recovery_settled`]).
    pub fn recovery_wait(&self, now: Instant) -> Option<Instant> {
        let t = *self.term_start.lock() + self.cfg.lease_ttl / 2;
        (now < t && !self.recovery_settled()).then_some(t)
    }

    /// Whether no segment expected back after a failover is still away and
    /// the copies the returned ones brought that this master rejected are
    /// destroyed on their stores, as this master's own invalidations
    /// confirm (their stores destroy them on the verdict, but nothing told
    /// this master when); true without a failover. No segment then holds a
    /// version older than the one known here that a lease an earlier
    /// leader granted could read, so commits no longer wait for those
    /// leases ([`Self::recovery_wait`]). A store that owes an invalidation
    /// keeps them waiting, and so does a segment dropped that etcd's list
    /// still names (a next leader would take its copies back).
    pub fn recovery_settled(&self) -> bool {
        if self.expecting() != 0 {
            return false;
        }
        let through = self.settled_through.load(Ordering::Acquire);
        let inv = self.invalidations.lock();
        inv.away.is_empty()
            && (through == u64::MAX
                || (self.invalidated_through.load(Ordering::Acquire) >= through
                    && inv.owing.is_empty()))
    }

    /// Whether any key waits for its old version to be destroyed.
    pub fn has_fences(&self) -> bool {
        !self.invalidations.lock().fences.is_empty()
    }

    /// What a bulk removal's reply waits for: everything queued so far
    /// sent, for at most [`FENCE_WAIT`].
    pub fn fence_all(&self, now: Instant) -> Option<FenceWait> {
        let seq = self.invalidations.lock().seq;
        (seq > self.invalidated_through.load(Ordering::Acquire))
            .then(|| FenceWait::sent_through(seq, now))
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
    /// its store unreachable and retried later). Fences over segments that
    /// still owe an invalidation stay, and so do fences of versions held
    /// back (their own destruction is not even queued yet), until
    /// [`MasterState::expire_fences`].
    pub fn invalidations_sent(&self, seq: u64) {
        self.invalidated_through.fetch_max(seq, Ordering::AcqRel);
        let mut inv = self.invalidations.lock();
        inv.forget_delivered_older(seq);
        let InvalidationQueue {
            fences,
            owing,
            gone,
            held_back,
            ..
        } = &mut *inv;
        // A fence over a given-up segment goes with `expire_fences`.
        let owes = |segments: &[SegmentId]| {
            (segments.iter()).any(|s| owing.contains(s) || gone.contains_key(s))
        };
        fences.retain(|k, f| f.seq > seq || held_back.contains_key(k) || owes(&f.segments));
        drop(inv);
        self.release_held_back();
        let due: Vec<(SegmentId, Region)> = {
            let mut waiting = self.after_invalidation.lock();
            let (due, keep): (Vec<_>, Vec<_>) = waiting.drain(..).partition(|(s, ..)| *s <= seq);
            *waiting = keep;
            due.into_iter().map(|(_, seg, r)| (seg, r)).collect()
        };
        self.free_now(&due, None);
    }

    /// Records that everything queued for segment `id` was delivered.
    pub fn invalidations_delivered(&self, id: SegmentId) {
        let sent = self.invalidated_through.load(Ordering::Acquire);
        let mut inv = self.invalidations.lock();
        if inv.owing.remove(&id) {
            inv.forget_delivered_older(sent);
            drop(inv);
            self.release_held_back();
        }
    }

    /// Bytes of regions on `seg` freed as soon as their invalidations are
    /// delivered.
    pub(super) fn freeing(&self, seg: SegmentId) -> u64 {
        self.after_invalidation
            .lock()
            .iter()
            .filter(|(_, s, _)| *s == seg)
            .map(|(_, _, r)| r.len)
            .sum()
    }

    /// Queues the destruction of the copy of `key`'s version `generation`
    /// at `r` of `seg` on its store, keeping the region reserved, and
    /// fences the key until it is delivered or `young_until`: a reader
    /// holding that location reads it without asking this master, so a
    /// replacement or removal of the key must wait for it as for the
    /// replicas listed (chaos finding 25).
    pub(super) fn queue_destruction(
        &self,
        key: &str,
        (seg, r): (SegmentId, Region),
        generation: u64,
        young_until: Instant,
    ) {
        let mut inv = self.invalidations.lock();
        inv.queue(seg, r.offset, generation);
        inv.seq += 1;
        let seq = inv.seq;
        self.fence_key(&mut inv, key, [seg], seq, young_until);
    }

    /// Destroys each copy (segment, region, generation) on its store, and
    /// frees its region once that has been sent (not before: the same
    /// version may be copied there again, which the destruction would hit).
    /// One invalidation batch for them all.
    pub(super) fn free_after_invalidation(&self, copies: &[(SegmentId, Region, u64)]) -> u64 {
        if copies.is_empty() {
            return 0;
        }
        let mut inv = self.invalidations.lock();
        for &(seg, r, generation) in copies {
            inv.regions
                .entry(seg)
                .or_default()
                .push((r.offset, generation));
        }
        inv.seq += 1;
        let seq = inv.seq;
        drop(inv);
        let mut waiting = self.after_invalidation.lock();
        waiting.extend(copies.iter().map(|&(seg, r, _)| (seq, seg, r)));
        seq
    }

    /// Destroys the copy a tier move of `key` made that was not taken
    /// (its version replaced, removed or evicted meanwhile, or the move
    /// failed), and frees its region once that is sent. A version of the
    /// key held back behind it is destroyed only after it (see
    /// [`Self::retire_last`]).
    pub(super) fn destroy_move_copy(
        &self,
        key: &str,
        (seg, r): (SegmentId, Region),
        generation: u64,
    ) {
        let seq = self.free_after_invalidation(&[(seg, r, generation)]);
        self.invalidations
            .lock()
            .note_older(key, seq, [seg].into_iter());
    }

    /// Puts back invalidations that could not be delivered (store down),
    /// unless the segment is gone; its remount reconciles it anyway. The
    /// segment owes them: replies fenced on it wait (see [`MasterState::fence`]).
    pub fn requeue_invalidations(&self, id: SegmentId, regions: Vec<(u64, u64)>) {
        let mounted = self.segments.read().contains_key(&id);
        let mut inv = self.invalidations.lock();
        if !mounted {
            inv.owing.remove(&id);
            return;
        }
        let offsets: HashSet<u64> = regions.iter().map(|(o, _)| *o).collect();
        inv.regions.entry(id).or_default().extend(regions);
        inv.owing.insert(id);
        // Regions waiting for these invalidations wait for their next send.
        inv.seq += 1;
        let seq = inv.seq;
        drop(inv);
        for w in self.after_invalidation.lock().iter_mut() {
            if w.1 == id && offsets.contains(&w.2.offset) {
                w.0 = seq;
            }
        }
    }

    /// Drops fences whose old versions can no longer be read without
    /// asking this master.
    pub(super) fn expire_fences(&self, now: Instant) {
        let done = self.invalidated_through.load(Ordering::Acquire);
        let mut inv = self.invalidations.lock();
        inv.gone.retain(|_, until| now < *until);
        inv.fences.retain(|_, f| {
            f.seq > done
                || now < f.young_until
                || (now < f.hard_until && !self.removal_durable(f.durable))
        });
    }

    pub(super) fn free_expired_deferred(&self, now: Instant) {
        let due: Vec<_> = {
            let mut d = self.deferred.lock();
            let (due, keep): (Vec<_>, Vec<_>) = d.drain(..).partition(|(t, ..)| *t <= now);
            *d = keep;
            due
        };
        // Replaced versions' headers were destroyed when they were replaced;
        // an abandoned put's region and a moved object's old copy are
        // destroyed now.
        let mut destroy = Vec::new();
        for (_, s, r, generation) in due {
            match generation {
                None => self.free_now(&[(s, r)], None),
                Some(g) => destroy.push((s, r, g)),
            }
        }
        self.free_after_invalidation(&destroy);
    }
}
