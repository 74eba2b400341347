//! What depends on the medium a segment is on, memory or disk: where its
//! bytes are ([`Backing`]), reads that answer from mapped memory or queue a
//! disk read, invalidations (destroyed at once in memory, by the I/O
//! threads on disk), and the copies between a store's two tiers.
//!
//! This is the one place the data plane branches on the medium to read,
//! copy or destroy a segment's bytes (the registry keeps memory and disk
//! segments in two maps, and the server refuses wire writes to a disk
//! segment, but neither touches their bytes): a `Medium` trait is to replace
//! the `Backing` enum here, leaving `table`, `serve` and `pipeline` as they
//! are.

use std::sync::Arc;
use std::time::Instant;

use kvpool_format::FIXED_LEN;
use kvpool_proto::msg::{self, InvalidateReq, SegmentId, TierMove, TierMoveReq};
use kvpool_proto::{Code, KvError, KvResult};
use tracing::debug;

use super::serve::{Boxed, Reply};
use super::table::SegmentTable;
use crate::disk::DiskFile;
use crate::fence::Fence;
use crate::mapped::MappedRegion;

impl SegmentTable {
    /// Where segment `id`'s bytes are, if it is served here.
    fn backing(&self, id: SegmentId) -> Option<Backing> {
        if let Some(s) = self.served(id) {
            return Some(Backing::Memory(s.region, s.base, s.fence));
        }
        let disks = self.disks.read();
        let (f, base, fence) = disks.get(&id)?;
        Some(Backing::Disk(f.clone(), *base, fence.clone()))
    }
}

/// A served segment's bytes, the start of its object area, and its fence.
enum Backing {
    Memory(Arc<MappedRegion>, u64, Arc<Fence>),
    Disk(Arc<DiskFile>, u64, Arc<Fence>),
}

/// The error for a segment this store does not serve.
pub(super) fn not_served(segment: SegmentId) -> KvError {
    KvError::new(
        Code::SegmentNotFound,
        format!("segment {segment} not served here"),
    )
}

/// Checks that `offset+len` lies in the object area `[base, size)`.
pub(super) fn in_object_area(offset: u64, len: u64, base: u64, size: u64) -> KvResult<()> {
    if offset < base {
        return Err(KvError::new(
            Code::InvalidParams,
            format!("offset {offset} is below the object area at {base}"),
        ));
    }
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(KvError::new(
            Code::InvalidParams,
            format!("range {offset}+{len} outside segment of {size} bytes"),
        ));
    }
    Ok(())
}

/// Turns a disk error into the code callers see (a transfer failure: try
/// another replica).
fn disk_error(e: std::io::Error) -> KvError {
    KvError::new(Code::TransferFail, format!("disk tier: {e}"))
}

/// Reads `len` bytes at `offset` of `segment`: a region of mapped memory,
/// or a read of a disk segment, queued now for its I/O threads.
pub(super) fn read_for(
    table: &SegmentTable,
    segment: SegmentId,
    offset: u64,
    len: u64,
) -> KvResult<Reply> {
    match table.backing(segment).ok_or_else(|| not_served(segment))? {
        Backing::Memory(region, base, _) => {
            in_object_area(offset, len, base, region.len())?;
            Ok(Reply::Region(region, offset, len))
        }
        Backing::Disk(file, base, _) => {
            in_object_area(offset, len, base, file.len())?;
            let read = file.submit(move |f| f.read(offset, len));
            Ok(Reply::Reading(
                Box::pin(async move {
                    read.await
                        .map_err(|e| KvError::new(Code::InternalError, e.to_string()))?
                        .map_err(disk_error)
                }),
                len,
            ))
        }
    }
}

/// Destroys the objects `req` names, on memory at once or on disk by its
/// I/O threads; answers how many were destroyed.
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
    Ok(
        match table
            .backing(req.segment)
            .ok_or_else(|| not_served(req.segment))?
        {
            Backing::Memory(region, _, fence) => {
                // Held across the destruction: a remount (and the scan of
                // its inventory) waits for it, or it waits for the remount
                // and is refused.
                let _inside = fence.enter(req.fence).ok_or_else(refused)?;
                let now = Instant::now();
                // Under the lock a write checks after it lands (see
                // `SegmentTable::landed`): either this finds the object, or
                // the write finds this.
                let mut revoked = table.revoked.write();
                let mut n = 0u64;
                for &(off, gen) in &req.regions {
                    if invalidate_object(&region, off, gen) {
                        n += 1;
                    }
                    if region.contains(off, FIXED_LEN as u64) {
                        revoked.insert(req.segment, off, gen, now);
                    }
                }
                m.invalidations_applied.inc_by(n);
                Reply::Message(msg::encode(&n))
            }
            Backing::Disk(_, _, fence) if !fence.admits(req.fence) => return Err(refused()),
            Backing::Disk(file, ..) => Reply::Pending(Box::pin(async move {
                let n = file
                    .submit(move |f| f.invalidate_all(&req.regions) as u64)
                    .await
                    .unwrap_or(0);
                m.invalidations_applied.inc_by(n);
                msg::encode(&n)
            })),
        },
    )
}

/// Copies of one request queued at once for the disk's I/O threads: the
/// master keeps a few requests in flight, which keeps the device busy, and
/// clients' reads queued meanwhile wait behind a few copies, not a batch.
const MOVES_AT_ONCE: usize = 8;

/// Runs a batch of copies between this store's segments, several at a
/// time on the disk side's I/O threads; one code per move (0: copied).
pub(super) async fn tier_moves(table: &SegmentTable, req: TierMoveReq) -> Vec<i32> {
    let mut out = Vec::with_capacity(req.moves.len());
    for group in req.moves.chunks(MOVES_AT_ONCE) {
        let mut jobs = Vec::with_capacity(group.len());
        for &m in group {
            let (from, to) = (table.backing(m.from), table.backing(m.to));
            let promote = matches!(from, Some(Backing::Disk(..)));
            let disk = [&from, &to].into_iter().find_map(|b| match b {
                Some(Backing::Disk(f, ..)) => Some(f.clone()),
                _ => None,
            });
            let job: Boxed<_> = match disk {
                Some(f) => Box::pin(f.submit(move |_| tier_move(from, to, &m))),
                // No disk side: refused without I/O.
                None => Box::pin(std::future::ready(Ok(tier_move(from, to, &m)))),
            };
            jobs.push((job, promote));
        }
        for (j, promote) in jobs {
            let code = match j.await {
                Ok(Ok(())) => Code::Ok,
                Ok(Err(e)) => {
                    debug!(error = %e, "tier move failed");
                    e.code
                }
                Err(_) => Code::InternalError,
            };
            table.metrics.tier_move(promote, code);
            out.push(code.as_i32());
        }
    }
    out
}

/// Copies one object between a memory and a disk segment of this store,
/// checking first that the source still holds that generation. The copy's
/// header is written last on either side.
fn tier_move(from: Option<Backing>, to: Option<Backing>, m: &TierMove) -> KvResult<()> {
    let gone = || KvError::new(Code::SegmentNotFound, "segment not served here");
    let (from, to) = (from.ok_or_else(gone)?, to.ok_or_else(gone)?);
    let gone_stale = || {
        KvError::new(
            Code::ObjectNotFound,
            format!(
                "no object of generation {} at {}",
                m.generation, m.from_offset
            ),
        )
    };
    // The whole copy is verified (header, generation, checksum) before it is
    // made durable: an object rewritten during the copy is refused, never torn.
    let holds = |bytes: &[u8]| kvpool_format::scan::intact(bytes, m.generation);
    // A move planned by a leader before the destination's last mount is
    // refused (that leader's regions are not the new one's).
    let refenced = || {
        KvError::new(
            Code::TransferFail,
            format!(
                "the segment was mounted again since this move (fence {:x})",
                m.fence
            ),
        )
    };
    match (from, to) {
        (Backing::Memory(src, sb, _), Backing::Disk(dst, db, fence)) => {
            in_object_area(m.from_offset, m.len, sb, src.len())?;
            in_object_area(m.to_offset, m.len, db, dst.len())?;
            // SAFETY: in range (checked above); the master froze this object
            // for the move (no writer owns its region).
            let bytes = unsafe { src.slice(m.from_offset, m.len) };
            let _inside = fence.enter(m.fence).ok_or_else(refenced)?;
            match dst.write_object(m.to_offset, bytes, holds) {
                Ok(true) => Ok(()),
                Ok(false) => Err(gone_stale()),
                Err(e) => Err(disk_error(e)),
            }
        }
        (Backing::Disk(src, sb, _), Backing::Memory(dst, db, fence)) => {
            in_object_area(m.from_offset, m.len, sb, src.len())?;
            in_object_area(m.to_offset, m.len, db, dst.len())?;
            let read = src.read(m.from_offset, m.len).map_err(disk_error)?;
            let bytes = read.bytes();
            if !holds(bytes) {
                return Err(gone_stale());
            }
            let _inside = fence.enter(m.fence).ok_or_else(refenced)?;
            // SAFETY: in range (checked above); the master reserved this
            // region for the move alone.
            let out = unsafe { dst.slice_mut(m.to_offset, m.len) };
            // Header last: a torn copy fails its header check on a scan.
            let split = FIXED_LEN.min(bytes.len());
            out[split..].copy_from_slice(&bytes[split..]);
            out[..split].copy_from_slice(&bytes[..split]);
            Ok(())
        }
        _ => Err(KvError::new(
            Code::InvalidParams,
            "a tier move goes between a memory and a disk segment",
        )),
    }
}

/// Destroys the object at `offset` of `region` if its header still carries
/// `generation` (see `kvpool_format::scan::invalidate`); false when there is
/// no such object or the offset is out of range.
pub fn invalidate_object(region: &MappedRegion, offset: u64, generation: u64) -> bool {
    if !region.contains(offset, FIXED_LEN as u64) {
        return false;
    }
    // SAFETY: in bounds (checked above). Only the magic is written: a
    // concurrent writer of a new object here rewrites the whole header after
    // this, and a reader of the old object then fails its header check.
    let header = unsafe { region.slice_mut(offset, FIXED_LEN as u64) };
    kvpool_format::scan::invalidate(header, generation)
}
