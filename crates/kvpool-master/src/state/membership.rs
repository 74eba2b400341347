//! Membership across failovers. etcd holds leadership and, beside it, the
//! list of segments that may hold objects; never the object map. A new
//! leader reads the list and expects those segments back, and its recovery
//! lasts until each has re-mounted with its inventory (or stayed silent
//! past the client TTL and the store grace, as a silent store would be
//! dropped). Until then object calls answer the retryable
//! `UNAVAILABLE_IN_CURRENT_STATUS`: a missing segment may hold any key, a
//! newer version of a key another segment holds, or a copy of a key that
//! would come back after a removal, and nothing short of its inventory
//! tells which. Once every segment is back the recovery ends at once,
//! without waiting out `--recovery-grace`.
//!
//! The leader writes the list before it places anything on a new segment
//! (see [`MasterState::placeable`]), so every segment that holds objects is
//! always on the list the next leader reads.
//!
//! The chaos harness found why: a store cut off from the pool (or paused,
//! or restarting) while the leader changed was unknown to the new leader,
//! which answered "not found" for its keys and let write-once puts create
//! new versions of them (when the store came back the newer versions won:
//! acknowledged writes lost), served an old version of a key whose new one
//! was on the missing store (a stale read), and removed keys whose second
//! replica was there (back when it re-mounted).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use kvpool_proto::msg::SegmentId;
use tokio::time::Instant;

use super::MasterState;

/// What this master knows of the segments its predecessors had.
#[derive(Debug, Default)]
pub(super) struct Membership {
    /// The segments the list in etcd names now; `None` without HA (no list
    /// is kept, and every mounted segment takes objects).
    persisted: Option<HashSet<SegmentId>>,
    /// Segments the previous leader listed that have not re-mounted here,
    /// and until when they may still come back.
    expected: HashMap<SegmentId, Instant>,
    /// The previous leader's list, as read (`None`: there was none). Once
    /// every segment on it is back, the recovery is complete.
    listed_at_start: Option<HashSet<SegmentId>>,
}

impl Membership {
    /// Whether the list in etcd names `id` (never without HA).
    pub(super) fn names(&self, id: SegmentId) -> bool {
        (self.persisted.as_ref()).is_some_and(|p| p.contains(&id))
    }
}

impl MasterState {
    /// Starts leading with the segment list read from etcd (`None`: there
    /// was none, as for the first leader of a pool, or one written by an
    /// older kvpool). Segments on it that are not mounted are expected until
    /// a client TTL plus the store grace from `now`.
    pub fn expect_segments(&self, listed: Option<Vec<SegmentId>>, now: Instant) {
        let deadline = now + self.cfg.client_ttl + self.cfg.store_grace;
        // Only segments whose inventory is reconciled are back: one that
        // re-mounted while the list was being read (this master serves
        // mounts from its election on) may still be reporting what it
        // holds, and until then its keys are unknown here.
        let mounted: HashSet<SegmentId> = (self.segments.read().iter())
            .filter(|(_, s)| s.recovering.is_none())
            .map(|(id, _)| *id)
            .collect();
        let seq = self.invalidations.lock().seq;
        let mut m = self.membership.lock();
        m.listed_at_start = listed.as_ref().map(|l| l.iter().copied().collect());
        let listed = listed.unwrap_or_default();
        m.persisted = Some(listed.iter().copied().collect());
        m.expected = listed
            .into_iter()
            .filter(|id| !mounted.contains(id))
            .map(|id| (id, deadline))
            .collect();
        if !m.expected.is_empty() {
            tracing::info!(
                expected = m.expected.len(),
                "segments mounted before the failover are expected back"
            );
        }
        self.expecting_now(&m, seq);
    }

    /// Publishes how many segments are still expected. Once none is, first
    /// which invalidation batch (`seq`, the latest queued before) destroys
    /// the copies the returned segments brought that this master rejected
    /// (see [`MasterState::recovery_settled`]), so that no reader sees none
    /// expected without it.
    fn expecting_now(&self, m: &Membership, seq: u64) {
        let left = m.expected.len();
        let through = if left == 0 { seq } else { u64::MAX };
        self.settled_through.store(through, Ordering::Release);
        self.expecting.store(left, Ordering::Release);
    }

    /// The segments the list in etcd should name: every mounted one, and
    /// those still expected back.
    pub fn membership(&self) -> Vec<SegmentId> {
        let mut ids: Vec<SegmentId> = self.segments.read().keys().copied().collect();
        ids.extend(self.membership.lock().expected.keys().copied());
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Records that the list in etcd now names `ids`: those may take objects.
    pub fn membership_written(&self, ids: &[SegmentId]) {
        {
            let mut m = self.membership.lock();
            m.persisted = Some(ids.iter().copied().collect());
            self.unlisted(ids);
        }
        // What waited for those segments to leave the list may go.
        self.release_held_back();
    }

    /// Whether every segment the previous leader listed is back.
    pub fn recovered(&self) -> bool {
        let m = self.membership.lock();
        m.listed_at_start.is_some() && m.expected.is_empty()
    }

    /// Whether a segment may take objects: without HA always, with HA once
    /// the list in etcd names it (one lock for as many segments as asked).
    pub(super) fn listing(&self) -> impl Fn(&SegmentId) -> bool + '_ {
        let m = self.membership.lock();
        move |id| m.persisted.as_ref().is_none_or(|p| p.contains(id))
    }

    /// A segment is back with its objects (reconciled, or none): no longer
    /// expected, nor away if it was dropped while etcd's list named it.
    pub(super) fn arrived(&self, id: SegmentId) {
        self.back_from_away(id);
        if self.expecting.load(Ordering::Acquire) == 0 {
            return;
        }
        // Its rejected copies' destructions are queued by now.
        let seq = self.invalidations.lock().seq;
        let mut m = self.membership.lock();
        if m.expected.remove(&id).is_some() {
            tracing::info!(segment = %id, left = m.expected.len(), "a segment mounted before the failover is back");
            self.expecting_now(&m, seq);
        }
    }

    /// Gives up on expected segments whose time ran out: their objects are
    /// gone, as a store's are when it stays silent past its grace.
    pub(super) fn expire_expected(&self, now: Instant) {
        if self.expecting.load(Ordering::Acquire) == 0 {
            return;
        }
        let seq = self.invalidations.lock().seq;
        let mut m = self.membership.lock();
        let mut gone = Vec::new();
        m.expected.retain(|id, until| {
            let keep = now < *until;
            if !keep {
                tracing::warn!(segment = %id, "a segment mounted before the failover did not come back within TTL + grace; its objects are gone");
                gone.push(*id);
            }
            keep
        });
        self.expecting_now(&m, seq);
        let listed = gone.iter().copied().filter(|id| m.names(*id));
        self.invalidations.lock().away.extend(listed);
        drop(m);
        // Given up with nothing known of its keys: back later, it brings
        // none this master holds no version of.
        for id in gone {
            self.record_given_up(id, HashSet::new(), now);
        }
    }

    /// Whether segment `id`, mounting here with objects, was given up
    /// before this master led: with HA, a segment with objects that the
    /// list this master started from does not name was dropped from it by
    /// an earlier leader (the leader lists a segment before placing
    /// anything on it). Nothing tells which of its keys were written since.
    pub(super) fn given_up_before(&self, id: SegmentId) -> bool {
        let m = self.membership.lock();
        (m.listed_at_start.as_ref()).is_some_and(|l| !l.contains(&id))
    }

    /// How many segments listed by the previous leader are not back yet.
    pub fn expecting(&self) -> usize {
        self.expecting.load(Ordering::Acquire)
    }
}
