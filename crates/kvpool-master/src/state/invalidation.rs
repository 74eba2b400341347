//! Freed regions: returning them to their allocators, queueing the
//! destruction of their object headers on the stores, the per-key fences a
//! reply waits on, and regions whose reuse waits for a read lease to end.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

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
    /// Keys with an old version possibly still readable, and the sequence
    /// number whose delivery destroys it: a new value or a removal of the
    /// key is reported only after that (see [`MasterState::fence`]).
    pub(super) fences: HashMap<String, u64>,
}

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
                    inv.regions.entry(*id).or_default().push((r.offset, gen));
                    if s.info.tier == Tier::Disk {
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

    /// Frees the regions of `key`'s version `v`, which was removed or
    /// evicted, and fences the key until its headers are destroyed.
    pub(super) fn retire(&self, key: &str, v: &Version) {
        self.free_now(&v.replicas, Some(v.generation));
        let mut inv = self.invalidations.lock();
        let seq = inv.seq;
        inv.fences.insert(key.to_string(), seq);
    }

    /// Retires `key`'s version `v`, replaced by a newer one: its headers are
    /// destroyed at once (a reader of the old location then asks the master
    /// again), and under a live read lease its regions are reused only when
    /// the lease ends, so a reader in flight never sees them rewritten.
    pub(super) fn release(&self, key: &str, v: Version, now: Instant) {
        if v.lease_until > self.tick(now) {
            let mut inv = self.invalidations.lock();
            for (s, r) in &v.replicas {
                inv.regions
                    .entry(*s)
                    .or_default()
                    .push((r.offset, v.generation));
            }
            inv.seq += 1;
            let seq = inv.seq;
            inv.fences.insert(key.to_string(), seq);
            drop(inv);
            let until = self.instant(v.lease_until);
            self.deferred
                .lock()
                .extend(v.replicas.into_iter().map(|(s, r)| (until, s, r, None)));
        } else {
            self.retire(key, &v);
        }
    }

    /// The invalidation sequence number a reply about `keys` must wait for
    /// (their old versions destroyed on the stores), if any is outstanding.
    pub fn fence<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> Option<u64> {
        let inv = self.invalidations.lock();
        if inv.fences.is_empty() {
            return None;
        }
        let done = self.invalidated_through.load(Ordering::Acquire);
        keys.into_iter()
            .filter_map(|k| inv.fences.get(k).copied())
            .filter(|&seq| seq > done)
            .max()
    }

    /// Whether any key waits for its old version to be destroyed.
    pub fn has_fences(&self) -> bool {
        !self.invalidations.lock().fences.is_empty()
    }

    /// The invalidation sequence number everything queued so far reaches,
    /// if not yet sent.
    pub fn fence_all(&self) -> Option<u64> {
        let seq = self.invalidations.lock().seq;
        (seq > self.invalidated_through.load(Ordering::Acquire)).then_some(seq)
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
    /// its store unreachable and retried later): waiting replies may go.
    pub fn invalidations_sent(&self, seq: u64) {
        self.invalidated_through.fetch_max(seq, Ordering::AcqRel);
        let mut inv = self.invalidations.lock();
        inv.fences.retain(|_, s| *s > seq);
        drop(inv);
        let due: Vec<(SegmentId, Region)> = {
            let mut waiting = self.after_invalidation.lock();
            let (due, keep): (Vec<_>, Vec<_>) = waiting.drain(..).partition(|(s, ..)| *s <= seq);
            *waiting = keep;
            due.into_iter().map(|(_, seg, r)| (seg, r)).collect()
        };
        self.free_now(&due, None);
    }

    /// Destroys the copy of `generation` at `r` of `seg` on its store, and
    /// frees the region once that has been sent (not before: the same
    /// version may be copied there again, which the destruction would hit).
    pub(super) fn free_after_invalidation(&self, seg: SegmentId, r: Region, generation: u64) {
        let mut inv = self.invalidations.lock();
        inv.regions
            .entry(seg)
            .or_default()
            .push((r.offset, generation));
        inv.seq += 1;
        let seq = inv.seq;
        drop(inv);
        self.after_invalidation.lock().push((seq, seg, r));
    }

    /// Puts back invalidations that could not be delivered (store down),
    /// unless the segment is gone; its remount reconciles it anyway.
    pub fn requeue_invalidations(&self, id: SegmentId, regions: Vec<(u64, u64)>) {
        if !self.segments.read().contains_key(&id) {
            return;
        }
        let mut inv = self.invalidations.lock();
        let offsets: std::collections::HashSet<u64> = regions.iter().map(|(o, _)| *o).collect();
        inv.regions.entry(id).or_default().extend(regions);
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

    pub(super) fn free_expired_deferred(&self, now: Instant) {
        let due: Vec<_> = {
            let mut d = self.deferred.lock();
            let (due, keep): (Vec<_>, Vec<_>) = d.drain(..).partition(|(t, ..)| *t <= now);
            *d = keep;
            due
        };
        // Replaced versions' headers were destroyed when they were replaced;
        // a moved object's old copy is destroyed now.
        for (_, s, r, generation) in due {
            match generation {
                None => self.free_now(&[(s, r)], None),
                Some(g) => self.free_after_invalidation(s, r, g),
            }
        }
    }
}
