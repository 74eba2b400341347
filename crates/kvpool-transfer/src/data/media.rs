//! Reads, invalidations and tier copies, written once against the
//! [`Medium`] trait: whether a segment is memory or disk (or another
//! medium) decides only where its bytes come from and on which threads the
//! work runs, never the checks (object area, fences, generations).

use std::time::Instant;

use kvpool_format::FIXED_LEN;
use kvpool_proto::msg::{self, InvalidateReq, SegmentId, Tier, TierMove, TierMoveReq};
use kvpool_proto::{Code, KvError, KvResult};
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

/// Runs a batch of copies between this store's segments, several at a
/// time, on the I/O threads of the side that has them (the disk); one code
/// per move (0: copied).
pub(super) async fn tier_moves(table: &SegmentTable, req: TierMoveReq) -> Vec<i32> {
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
                    let copy = on_io(io, move |_| tier_move(&*from, &*to, &m));
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
    out
}

/// Copies one object between two tiers of this store, checking that the
/// copy still holds that generation before it is written (an object
/// rewritten during the copy is refused, never torn). The copy's header is
/// written last.
pub(super) fn tier_move(from: &dyn Medium, to: &dyn Medium, m: &TierMove) -> KvResult<()> {
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
