//! Reads, invalidations and tier copies, written once against the
//! [`Medium`] trait: whether a segment is memory or disk (or another
//! medium) decides only where its bytes come from and on which threads the
//! work runs, never the checks (object area, fences, generations).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use kvpool_format::FIXED_LEN;
use kvpool_proto::msg::{
    self, InvalidateReq, RequestId, SegmentId, Tier, TierMove, TierMoveCancel, TierMoveReq,
};
use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::Mutex;
use tracing::debug;

use super::medium::{in_object_area, on_io, Medium};
use super::serve::{Boxed, Reply};
use super::table::SegmentTable;
use crate::mapped::MappedRegion;

/// The error for a segment this store does not serve.
pub(super) fn not_served(segment: SegmentId) -> KvError {
    KvError::new(
        Code::SegmentNotFound,
        format!("segment {segment} not served here"),
    )
}

/// Reads `len` bytes at `offset` of `segment`, from whatever medium it is
/// on.
pub(super) fn read_for(
    table: &SegmentTable,
    segment: SegmentId,
    offset: u64,
    len: u64,
) -> KvResult<Reply> {
    let m = table.medium(segment).ok_or_else(|| not_served(segment))?;
    in_object_area(&*m, offset, len)?;
    Ok(m.read(offset, len))
}

/// Destroys the objects `req` names; answers how many were destroyed.
/// On a segment that takes wire writes (memory) it happens at once, inside
/// the segment's fence, and each version is remembered so that a late
/// write of it is refused; elsewhere it is queued for the medium's I/O.
pub(super) fn invalidate(table: &SegmentTable, req: InvalidateReq) -> KvResult<Reply> {
    let m = table.metrics.clone();
    m.invalidations_received.inc_by(req.regions.len() as u64);
    let refused = || {
        m.invalidations_refused.inc();
        tracing::warn!(segment = %req.segment, fence = req.fence, regions = req.regions.len(),
            "invalidations from before the segment's last mount refused");
        KvError::new(
            Code::TransferFail,
            format!(
                "the segment was mounted again since these invalidations (fence {:x})",
                req.fence
            ),
        )
    };
    if let Some(s) = table.served(req.segment) {
        // Held across the destruction: a remount (and the scan of its
        // inventory) waits for it, or it waits for the remount and is
        // refused.
        let _inside = s.fence.enter(req.fence).ok_or_else(refused)?;
        let now = Instant::now();
        // Under the lock a write checks after it lands (see
        // `SegmentTable::landed`): either this finds the object, or the
        // write finds this.
        let mut revoked = table.revoked.write();
        let n = s.invalidate(&req.regions);
        for &(off, gen) in &req.regions {
            if s.region.contains(off, FIXED_LEN as u64) {
                revoked.insert(req.segment, off, gen, now);
            }
        }
        m.invalidations_applied.inc_by(n);
        return Ok(Reply::Message(msg::encode(&n)));
    }
    let medium = table
        .medium(req.segment)
        .ok_or_else(|| not_served(req.segment))?;
    if !medium.fence().admits(req.fence) {
        return Err(refused());
    }
    let done = on_io(medium, move |md| md.invalidate(&req.regions));
    Ok(Reply::Pending(Box::pin(async move {
        let n = done.await.unwrap_or(0);
        m.invalidations_applied.inc_by(n);
        msg::encode(&n)
    })))
}

/// Copies of one request queued at once for the disk's I/O threads: the
/// master keeps a few requests in flight, which keeps the device busy, and
/// clients' reads queued meanwhile wait behind a few copies, not a batch.
const MOVES_AT_ONCE: usize = 8;

/// Tier move requests given up by the master that are remembered, so that
/// one arriving after its cancellation is refused: cancellations are rare
/// (a move answered in no time at all), and a request is delayed at most
/// as long as its store is paused.
const CANCELLED_KEPT: usize = 4096;

/// Whether a running tier move request was given up. Its moves write
/// their copies holding this lock, so a cancellation, which takes it,
/// waits for a copy being written and no copy starts after it.
type GivenUp = Arc<Mutex<bool>>;

/// The tier move requests running here and those the master gave up, by
/// the request id each came with.
#[derive(Default)]
pub(super) struct MoveBook {
    /// Running requests, with how many run under that id (a request sent
    /// again after a lost connection may overlap its first run).
    running: HashMap<RequestId, (GivenUp, usize)>,
    cancelled: HashSet<RequestId>,
    /// [`Self::cancelled`] in the order they came, to forget the oldest.
    cancel_order: VecDeque<RequestId>,
}

impl MoveBook {
    /// Starts request `id`: its flag, set already when it was given up
    /// before it came (then its moves are refused as they start).
    fn begin(&mut self, id: RequestId) -> GivenUp {
        if self.cancelled.contains(&id) {
            return Arc::new(Mutex::new(true));
        }
        let (given_up, n) = self.running.entry(id).or_default();
        *n += 1;
        given_up.clone()
    }

    /// Ends one run of request `id`.
    fn end(&mut self, id: RequestId) {
        if let Entry::Occupied(mut e) = self.running.entry(id) {
            e.get_mut().1 -= 1;
            if e.get().1 == 0 {
                e.remove();
            }
        }
    }

    /// Gives request `id` up: it is refused if it comes later; returns its
    /// flag if it runs now.
    fn cancel(&mut self, id: RequestId) -> Option<GivenUp> {
        if self.cancelled.insert(id) {
            self.cancel_order.push_back(id);
            if self.cancel_order.len() > CANCELLED_KEPT {
                if let Some(old) = self.cancel_order.pop_front() {
                    self.cancelled.remove(&old);
                }
            }
        }
        self.running.get(&id).map(|(given_up, _)| given_up.clone())
    }
}

/// The error of a move whose request the master gave up.
fn given_up() -> KvError {
    KvError::new(
        Code::TransferFail,
        "the master gave this tier move up (it stopped waiting for the answer)",
    )
}

/// Gives up the tier move requests `req` names (see [`TierMoveCancel`]):
/// answered once none of their moves can write anything any more.
pub(super) fn cancel_moves(table: &SegmentTable, req: TierMoveCancel) -> Reply {
    let running: Vec<GivenUp> = {
        let mut book = table.moves.lock();
        (req.requests.iter())
            .filter(|&&id| id != RequestId::NONE)
            .filter_map(|&id| book.cancel(id))
            .collect()
    };
    // Taking a flag waits for a copy being written, on a disk perhaps: off
    // the event loop.
    let done = tokio::task::spawn_blocking(move || {
        for f in running {
            *f.lock() = true;
        }
    });
    Reply::Pending(Box::pin(async move {
        let _ = done.await;
        msg::encode(&())
    }))
}

/// Runs a batch of copies between this store's segments, several at a
/// time, on the I/O threads of the side that has them (the disk); one code
/// per move (0: copied). `id` is the request's, by which the master may
/// give it up ([`cancel_moves`]); a request of a master that sends none
/// cannot be given up.
pub(super) async fn tier_moves(table: &SegmentTable, req: TierMoveReq, id: RequestId) -> Vec<i32> {
    let flag = (id != RequestId::NONE).then(|| table.moves.lock().begin(id));
    let mut out = Vec::with_capacity(req.moves.len());
    for group in req.moves.chunks(MOVES_AT_ONCE) {
        let mut jobs = Vec::with_capacity(group.len());
        for &m in group {
            let (from, to) = (table.medium(m.from), table.medium(m.to));
            let promote = to.as_ref().is_some_and(|t| t.tier() == Tier::Memory);
            let job: Boxed<KvResult<()>> = match (from, to) {
                (Some(from), Some(to)) => {
                    // Where the blocking side's I/O runs: the slower tier's.
                    let io = if from.tier() == Tier::Memory {
                        to.clone()
                    } else {
                        from.clone()
                    };
                    let flag = flag.clone();
                    let copy = on_io(io, move |_| tier_move(&*from, &*to, &m, flag.as_deref()));
                    Box::pin(async move { copy.await.and_then(|r| r) })
                }
                _ => Box::pin(std::future::ready(Err(KvError::new(
                    Code::SegmentNotFound,
                    "segment not served here",
                )))),
            };
            jobs.push((job, promote));
        }
        for (j, promote) in jobs {
            let code = match j.await {
                Ok(()) => Code::Ok,
                Err(e) => {
                    debug!(error = %e, "tier move failed");
                    e.code
                }
            };
            table.metrics.tier_move(promote, code);
            out.push(code.as_i32());
        }
    }
    if id != RequestId::NONE {
        table.moves.lock().end(id);
    }
    out
}

/// Copies one object between two tiers of this store, checking that the
/// copy still holds that generation before it is written (an object
/// rewritten during the copy is refused, never torn), and that its request
/// was not given up (`given_up`, held while the copy is written). The
/// copy's header is written last.
pub(super) fn tier_move(
    from: &dyn Medium,
    to: &dyn Medium,
    m: &TierMove,
    given_up: Option<&Mutex<bool>>,
) -> KvResult<()> {
    if from.tier() == to.tier() {
        return Err(KvError::new(
            Code::InvalidParams,
            "a tier move goes between a memory and a disk segment",
        ));
    }
    in_object_area(from, m.from_offset, m.len)?;
    in_object_area(to, m.to_offset, m.len)?;
    let holds = |bytes: &[u8]| kvpool_format::scan::intact(bytes, m.generation);
    let copied = from.copy_out(m.from_offset, m.len)?;
    // A move planned by a leader before the destination's last mount is
    // refused (that leader's regions are not the new one's).
    let _inside = to.fence().enter(m.fence).ok_or_else(|| {
        KvError::new(
            Code::TransferFail,
            format!(
                "the segment was mounted again since this move (fence {:x})",
                m.fence
            ),
        )
    })?;
    // Past this the master may have freed the destination region and
    // given it to another object: the copy is written under the flag or
    // not at all.
    let flag = given_up.map(Mutex::lock);
    if flag.as_deref() == Some(&true) {
        return Err(self::given_up());
    }
    if to.copy_in(m.to_offset, copied.bytes(), &holds)? {
        return Ok(());
    }
    Err(KvError::new(
        Code::ObjectNotFound,
        format!(
            "no object of generation {} at {}",
            m.generation, m.from_offset
        ),
    ))
}

/// Destroys the object at `offset` of `region` if its header still carries
/// `generation` (see `kvpool_format::scan::invalidate`); false when there is
/// no such object or the offset is out of range.
pub fn invalidate_object(region: &MappedRegion, offset: u64, generation: u64) -> bool {
    if !region.contains(offset, FIXED_LEN as u64) {
        return false;
    }
    // SAFETY: in bounds (checked above). Only the generation changes, with
    // one compare-and-swap, which a concurrent writer of a new object here
    // cannot lose its header to (see `kvpool_format::scan::invalidate`).
    let header = unsafe { region.slice_mut(offset, FIXED_LEN as u64) };
    kvpool_format::scan::invalidate(header, generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancellation_reaches_every_run_of_its_request_and_every_later_one() {
        let mut book = MoveBook::default();
        let (a, b) = (RequestId(1), RequestId(2));
        let first = book.begin(a);
        let again = book.begin(a);
        let other = book.begin(b);
        let flag = book.cancel(a).expect("a runs");
        *flag.lock() = true;
        assert!(*first.lock() && *again.lock() && !*other.lock());
        assert!(*book.begin(a).lock(), "a later run of a cancelled request");
        book.end(a);
        book.end(a);
        book.end(b);
        assert!(book.running.is_empty());
        // The oldest cancellations are forgotten past the bound.
        for n in 3..3 + CANCELLED_KEPT as u64 {
            assert!(book.cancel(RequestId(n)).is_none());
        }
        assert!(!*book.begin(a).lock(), "forgotten");
        assert!(*book.begin(RequestId(3)).lock());
    }
}
