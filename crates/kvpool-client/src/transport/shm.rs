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
//! unsynchronised copies safe to report. A big batch's copies are spread
//! over the cores.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use kvpool_format::{copy_sealed, copy_summed};
use kvpool_proto::msg::{Grant, SegmentId, SegmentInfo};
use kvpool_proto::{Code, KvError, KvResult};
use kvpool_transfer::fence::{SharedFence, ShmWriter};
use kvpool_transfer::MappedRegion;
use parking_lot::Mutex;

use super::{Dir, Job, Kind, Read, Share, Spread, Transport, Verify, Write};
use crate::fanout::{cores, lanes, split};

/// A store's segment file mapped into this process.
struct ShmMap {
    region: MappedRegion,
    /// Start of the object area; nothing below it is ever written.
    base: u64,
    path: PathBuf,
    /// This process's writer id on the segment, taken at the first write
    /// (`None`: none free, writes go over TCP).
    writer: OnceLock<Option<ShmWriter>>,
    /// One bit per [`CHUNK`] of the mapping whose page tables this process
    /// has built.
    populated: Box<[AtomicU64]>,
}

/// How much of a segment's mapping a first touch populates at once.
///
/// Populating a whole mapping up front (a background pass over 8 GiB) held
/// the process's memory-map lock while transfers waited: 256 KiB puts over
/// shared memory ran at 1.3-1.4 GB/s until it ended, against 2.8-3.1 GB/s
/// faulting page by page. A chunk populated when first touched costs one
/// call instead of 512 faults, and nothing for chunks never touched.
const CHUNK: u64 = 2 << 20;

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

    /// Builds the page tables of the chunks `[offset, offset + len)` covers
    /// that this process has not touched yet, and of the chunk after them
    /// in the background: the master places objects one after another, so
    /// the next transfer here likely starts there, and finds it built.
    fn populate(self: &Arc<Self>, offset: u64, len: u64) {
        let (first, last) = (offset / CHUNK, (offset + len).saturating_sub(1) / CHUNK);
        for chunk in first..=last {
            self.populate_chunk(chunk);
        }
        let next = last + 1;
        if next * CHUNK < self.region.len() && !self.claimed(next) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let map = self.clone();
                rt.spawn_blocking(move || map.populate_chunk(next));
            }
        }
    }

    /// The word of [`Self::populated`] that holds `chunk`'s bit, and the bit.
    fn bit(&self, chunk: u64) -> (&AtomicU64, u64) {
        (&self.populated[(chunk / 64) as usize], 1u64 << (chunk % 64))
    }

    /// Whether this process built (or is building) `chunk`'s page tables.
    fn claimed(&self, chunk: u64) -> bool {
        let (word, bit) = self.bit(chunk);
        word.load(Ordering::Relaxed) & bit != 0
    }

    /// Builds `chunk`'s page tables unless this process has claimed it
    /// already. A transfer that meets a chunk still being built goes on and
    /// faults in the pages it needs itself.
    fn populate_chunk(&self, chunk: u64) {
        let (word, bit) = self.bit(chunk);
        if word.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            let at = chunk * CHUNK;
            self.region.populate(at, CHUNK.min(self.region.len() - at));
        }
    }

    /// Whether this process can write the segment (it holds a writer id,
    /// taken now if not yet).
    fn writable(&self) -> bool {
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
    fn write(self: &Arc<Self>, offset: u64, parts: &[&[u8]], grant: &Grant) -> KvResult<()> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        self.check(offset, len)?;
        let (Some(writer), Some(fence)) = (self.writer(), SharedFence::new(&self.region)) else {
            return Err(KvError::new(
                Code::TransferFail,
                "no shared-memory writer id for this segment",
            ));
        };
        self.populate(offset, len);
        // SAFETY: in bounds (checked); the master gave this region to this
        // put alone, and the copy runs only under its grant's fence.
        let dst = unsafe { self.region.slice_mut(offset, len) };
        // Sealed with the checksum of the bytes as copied, as a store does
        // with what it receives: a source changed meanwhile still reads back.
        let mut sealed = false;
        let copy = || sealed = copy_sealed(dst, parts);
        (writer.write(&fence, grant.fence, (offset, len), copy))
            .map_err(|r| KvError::new(Code::TransferFail, r.0))?;
        if !sealed {
            return Err(KvError::new(
                Code::TransferFail,
                "the object's header was damaged while its value was copied",
            ));
        }
        Ok(())
    }

    /// Fills `dst` in order from `offset` (an object: its header, then its
    /// value), returning the checksum of the value bytes as copied.
    fn read(self: &Arc<Self>, offset: u64, dst: &mut [&mut [u8]]) -> KvResult<u64> {
        let len: u64 = dst.iter().map(|d| d.len() as u64).sum();
        self.check(offset, len)?;
        self.populate(offset, len);
        // SAFETY: in bounds (checked); a concurrent rewrite of the region is
        // caught by the header and checksum verification that follows.
        let src = unsafe { self.region.slice(offset, len) };
        Ok(copy_summed(dst, src))
    }
}

/// The shared-memory transport: every segment this client has tried to
/// map, and the result (`None`: not mappable here).
#[derive(Default)]
pub struct ShmTransport(Mutex<HashMap<SegmentId, Option<Arc<ShmMap>>>>);

impl ShmTransport {
    /// Whether any of `wanted` has not been tried yet.
    pub fn unknown(&self, wanted: &[SegmentId]) -> bool {
        let known = self.0.lock();
        wanted.iter().any(|s| !known.contains_key(s))
    }

    /// Tries to map each of `wanted` not tried yet, described by `infos`
    /// (segments missing from `infos` are tried again next time).
    pub fn map_new(&self, wanted: &[SegmentId], infos: &[SegmentInfo]) {
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

    /// The mapping of `segment`, if it is mapped here.
    fn get(&self, segment: SegmentId) -> Option<Arc<ShmMap>> {
        self.0.lock().get(&segment).cloned().flatten()
    }

    /// `items` (each with the segment it is for and its bytes) paired
    /// with their mappings, cut into one chunk per core when big; an item
    /// whose segment is not mapped fails with `Err` at once.
    #[allow(clippy::type_complexity)]
    fn plan<T>(
        &self,
        items: Vec<(usize, SegmentId, u64, T)>,
    ) -> (Vec<Vec<(usize, Arc<ShmMap>, T)>>, Vec<(usize, SegmentId)>) {
        let (mut mapped, mut missing, mut bytes) = (Vec::new(), Vec::new(), 0);
        {
            let known = self.0.lock();
            for (i, segment, len, t) in items {
                match known.get(&segment).cloned().flatten() {
                    Some(m) => {
                        bytes += len;
                        mapped.push((i, m, t));
                    }
                    None => missing.push((i, segment)),
                }
            }
        }
        // Copies (and checksums) are CPU work: big batches use every core.
        let n = lanes(bytes, mapped.len(), cores());
        (split(mapped, n), missing)
    }
}

impl Transport for ShmTransport {
    fn kind(&self) -> Kind {
        Kind::Shm
    }

    /// A segment mapped here; for writes, one this process also holds a
    /// writer id for.
    fn reaches(&self, segment: SegmentId, dir: Dir) -> bool {
        self.get(segment)
            .is_some_and(|m| dir == Dir::Read || m.writable())
    }

    fn write<'a>(&'a self, ops: Vec<Write<'a>>, _spread: Spread) -> Vec<Job<'a, ()>> {
        let items = ops
            .into_iter()
            .map(|w| {
                let len = w.op.parts.iter().map(|p| p.len() as u64).sum();
                (w.item, w.op.req.segment, len, w.op)
            })
            .collect();
        let (chunks, missing) = self.plan(items);
        let mut jobs: Vec<Job<()>> = chunks
            .into_iter()
            .map(|chunk| -> Job<()> {
                Box::pin(async move {
                    chunk
                        .into_iter()
                        .map(|(i, map, op)| (i, map.write(op.req.offset, &op.parts, &op.req.grant)))
                        .collect()
                })
            })
            .collect();
        if !missing.is_empty() {
            jobs.push(Box::pin(async move { not_mapped(missing) }));
        }
        jobs
    }

    fn read<'a>(
        &'a self,
        ops: Vec<Read<'a>>,
        verify: Verify<'a>,
        _spread: Spread,
    ) -> Vec<Share<'a>> {
        let items = ops
            .into_iter()
            .map(|r| (r.item, r.op.req.segment, r.op.req.len, r.op))
            .collect();
        let (chunks, missing) = self.plan(items);
        let mut jobs: Vec<Job<usize>> = chunks
            .into_iter()
            .map(|chunk| -> Job<usize> {
                Box::pin(async move {
                    chunk
                        .into_iter()
                        .map(|(i, map, mut op)| {
                            let len: u64 = op.dst.iter().map(|d| d.len() as u64).sum();
                            if len != op.req.len {
                                let e = "read buffers do not match the read length";
                                return (i, Err(KvError::new(Code::InvalidParams, e)));
                            }
                            let r = map
                                .read(op.req.offset, &mut op.dst)
                                .and_then(|sum| verify(i, &op.dst, sum));
                            (i, r)
                        })
                        .collect()
                })
            })
            .collect();
        if !missing.is_empty() {
            jobs.push(Box::pin(async move { not_mapped(missing) }));
        }
        vec![Share { peer: None, jobs }]
    }
}

/// Failures for items whose segment is not mapped here.
fn not_mapped<T>(items: Vec<(usize, SegmentId)>) -> Vec<(usize, KvResult<T>)> {
    items
        .into_iter()
        .map(|(i, s)| (i, Err(super::unreachable(s))))
        .collect()
}

/// Maps `info`'s segment file if it opens here and is that segment.
fn map(info: &SegmentInfo) -> Option<Arc<ShmMap>> {
    let path = info.path.as_deref()?;
    let region = MappedRegion::open_existing(Path::new(path))
        .map_err(|e| tracing::debug!(%path, error = %e, "segment not mappable; using tcp"))
        .ok()?;
    (mapped_segment_id(&region) == Some(info.id)).then(|| {
        tracing::debug!(segment = %info.id, %path, "reaching segment through shared memory");
        let chunks = region.len().div_ceil(CHUNK).div_ceil(64) as usize;
        Arc::new(ShmMap {
            region,
            base: info.base,
            path: path.into(),
            writer: OnceLock::new(),
            populated: (0..chunks).map(|_| AtomicU64::new(0)).collect(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A mapping of `chunks` chunks, none built yet.
    fn mapping(chunks: u64) -> Arc<ShmMap> {
        let region = MappedRegion::anonymous(chunks * CHUNK).unwrap();
        Arc::new(ShmMap {
            populated: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            region,
            base: 0,
            path: PathBuf::new(),
            writer: OnceLock::new(),
        })
    }

    /// A transfer builds the chunks it touches itself and the one after
    /// them in the background; nothing past that, nothing past the end,
    /// and nothing in the background without a runtime.
    #[test]
    fn a_transfer_builds_its_chunks_and_the_next_one_meanwhile() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let map = mapping(4);
        rt.block_on(async { map.populate(CHUNK - 10, 20) });
        assert!(map.claimed(0) && map.claimed(1));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !map.claimed(2) {
            assert!(
                std::time::Instant::now() < deadline,
                "the next chunk was not built"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!map.claimed(3));
        // The last chunk has no next one.
        rt.block_on(async { map.populate(3 * CHUNK, 10) });
        assert!(map.claimed(3));

        let bare = mapping(2);
        bare.populate(0, 10);
        std::thread::sleep(Duration::from_millis(20));
        assert!(bare.claimed(0) && !bare.claimed(1));
    }
}
