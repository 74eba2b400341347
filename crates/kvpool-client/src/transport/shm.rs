//! The shared-memory transport: a store's segment file mapped into this
//! process, read and written with `memcpy` (no socket, no store process on
//! the data path).
//!
//! A segment is mapped only if its file opens here and its superblock names
//! that very segment, which is what makes it the same host, whatever the
//! host names say. Writes land in regions the master reserved for this put
//! alone, under the segment's write fence (`kvpool_transfer::fence`: a
//! put granted before the segment's last mount never lands); reads are
//! verified by header and checksum afterwards, which is what makes the
//! unsynchronised copies safe to report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use kvpool_proto::msg::{Grant, SegmentId, SegmentInfo};
use kvpool_proto::{Code, KvError, KvResult};
use kvpool_transfer::fence::{SharedFence, ShmWriter};
use kvpool_transfer::MappedRegion;
use parking_lot::Mutex;

/// A store's segment file mapped into this process.
pub(crate) struct ShmMap {
    region: Arc<MappedRegion>,
    /// Start of the object area; nothing below it is ever written.
    base: u64,
    path: PathBuf,
    /// This process's writer id on the segment, taken at the first write
    /// (`None`: none free, writes go over TCP).
    writer: OnceLock<Option<ShmWriter>>,
}

impl ShmMap {
    fn check(&self, offset: u64, len: u64) -> KvResult<()> {
        if offset < self.base || !self.region.contains(offset, len) {
            return Err(KvError::new(
                Code::InvalidParams,
                format!("range {offset}+{len} outside the mapped segment"),
            ));
        }
        Ok(())
    }

    /// Whether this process can write the segment (it holds a writer id,
    /// taken now if not yet).
    pub(crate) fn writable(&self) -> bool {
        self.writer().is_some()
    }

    fn writer(&self) -> Option<&ShmWriter> {
        self.writer
            .get_or_init(|| {
                let fence = SharedFence::new(&self.region)?;
                ShmWriter::acquire(&self.path, &fence)
                    .map_err(|e| tracing::info!(path = %self.path.display(), error = %e, "no shared-memory writer id; writing over tcp"))
                    .ok()
            })
            .as_ref()
    }

    /// Copies the concatenation of `parts` to `offset`, the start of the
    /// region `grant` is for, if the segment's fence is still the grant's.
    pub(crate) fn write(&self, offset: u64, parts: &[&[u8]], grant: &Grant) -> KvResult<()> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        self.check(offset, len)?;
        let (Some(writer), Some(fence)) = (self.writer(), SharedFence::new(&self.region)) else {
            return Err(KvError::new(
                Code::TransferFail,
                "no shared-memory writer id for this segment",
            ));
        };
        // SAFETY: in bounds (checked); the master gave this region to this
        // put alone, and the copy runs only under its grant's fence.
        let dst = unsafe { self.region.slice_mut(offset, len) };
        let copy = || {
            let mut at = 0;
            for p in parts {
                dst[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
        };
        (writer.write(&fence, grant.fence, (offset, len), copy))
            .map_err(|r| KvError::new(Code::TransferFail, r.0))
    }

    /// Fills `dst` in order from `offset`.
    pub(crate) fn read(&self, offset: u64, dst: &mut [&mut [u8]]) -> KvResult<()> {
        let len: u64 = dst.iter().map(|d| d.len() as u64).sum();
        self.check(offset, len)?;
        // SAFETY: in bounds (checked); a concurrent rewrite of the region is
        // caught by the header and checksum verification that follows.
        let src = unsafe { self.region.slice(offset, len) };
        let mut at = 0;
        for d in dst.iter_mut() {
            d.copy_from_slice(&src[at..at + d.len()]);
            at += d.len();
        }
        Ok(())
    }
}

/// Segments and their mapping here (`None`: not mappable, use TCP).
pub(crate) type ShmMaps = HashMap<SegmentId, Option<Arc<ShmMap>>>;

/// Every segment this client has tried to map, and the result.
#[derive(Default)]
pub(crate) struct Mappings(Mutex<ShmMaps>);

impl Mappings {
    /// Whether any of `wanted` has not been tried yet.
    pub(crate) fn unknown(&self, wanted: &[SegmentId]) -> bool {
        let known = self.0.lock();
        wanted.iter().any(|s| !known.contains_key(s))
    }

    /// Tries to map each of `wanted` not tried yet, described by `infos`
    /// (segments missing from `infos` are tried again next time).
    pub(crate) fn map_new(&self, wanted: &[SegmentId], infos: &[SegmentInfo]) {
        // Held while mapping, so two callers never map one segment twice.
        let mut known = self.0.lock();
        for id in wanted {
            if known.contains_key(id) {
                continue;
            }
            let Some(info) = infos.iter().find(|s| s.id == *id) else {
                continue;
            };
            known.insert(*id, map(info));
        }
    }

    /// The mappings of `wanted` as known now.
    pub(crate) fn get(&self, wanted: Vec<SegmentId>) -> ShmMaps {
        let known = self.0.lock();
        wanted
            .into_iter()
            .map(|id| (id, known.get(&id).cloned().flatten()))
            .collect()
    }
}

/// Maps `info`'s segment file if it opens here and is that segment.
fn map(info: &SegmentInfo) -> Option<Arc<ShmMap>> {
    let path = info.path.as_deref()?;
    let region = MappedRegion::open_existing(Path::new(path))
        .map_err(|e| tracing::debug!(%path, error = %e, "segment not mappable; using tcp"))
        .ok()?;
    (mapped_segment_id(&region) == Some(info.id)).then(|| {
        tracing::debug!(segment = %info.id, %path, "reaching segment through shared memory");
        let region = Arc::new(region);
        let r = region.clone();
        // Faulting the pages in up front keeps first reads at memcpy speed.
        std::thread::spawn(move || r.prefault());
        Arc::new(ShmMap {
            region,
            base: info.base,
            path: path.into(),
            writer: OnceLock::new(),
        })
    })
}

/// The id in a mapped segment's superblock, if it is a valid kvpool segment
/// of the mapping's size (how a path is known to be the segment it was
/// named for before any object is read or written through it).
fn mapped_segment_id(region: &MappedRegion) -> Option<SegmentId> {
    if region.len() < kvpool_format::DATA_BASE {
        return None;
    }
    // SAFETY: in bounds (checked above); the superblock is written once when
    // the store creates the segment.
    let sb = unsafe { region.slice(0, kvpool_format::DATA_BASE) };
    kvpool_format::segment_id(sb, region.len())
}
