//! What a data node lends, whatever the medium: how a lent segment is
//! handed to the data plane, scanned for its objects at mount, and rid of
//! the objects the master rejects, and what the node reports about it.
//! Memory (a mapped file or anonymous memory) and the disk tier implement
//! [`LentMedium`]; a new medium is one implementation here (and its
//! `kvpool_transfer` medium for the data plane).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use kvpool_format::scan::{Found, ScanStats};
use kvpool_proto::msg::{SegmentId, SegmentIo, Tier};
use kvpool_transfer::data::{invalidate_object, SegmentTable};
use kvpool_transfer::{DiskFile, MappedRegion};

/// The number of objects an invalidation destroyed, once it has run.
pub(crate) type Invalidated = Pin<Box<dyn Future<Output = usize> + Send>>;

/// A medium a data node lends as a segment.
pub(crate) trait LentMedium: Send + Sync {
    /// The tier the master places it in.
    fn tier(&self) -> Tier;
    /// Bytes in the segment.
    fn len(&self) -> u64;
    /// Its file, when clients on this host may map it (memory only).
    fn path(&self) -> Option<String>;
    /// Starts serving it on the data plane as segment `id`, object area
    /// from `base`.
    fn serve(self: Arc<Self>, table: &SegmentTable, id: SegmentId, base: u64);
    /// The intact objects in it (blocking: runs off the runtime).
    fn scan(&self, base: u64) -> std::io::Result<(Vec<Found>, ScanStats)>;
    /// Destroys each object `(offset, generation)` still of that generation.
    fn invalidate(self: Arc<Self>, rejected: Vec<(u64, u64)>) -> Invalidated;
    /// Whether it holds only the zeroes it was created with: its first
    /// mount need not scan it.
    fn fresh(&self) -> bool {
        false
    }
    /// Its I/O counters, for a medium that keeps them.
    fn io(&self, _id: SegmentId) -> Option<SegmentIo> {
        None
    }
    /// Whether an I/O error took it offline.
    fn failed(&self) -> bool {
        false
    }
}

impl LentMedium for MappedRegion {
    fn tier(&self) -> Tier {
        Tier::Memory
    }

    fn len(&self) -> u64 {
        MappedRegion::len(self)
    }

    fn path(&self) -> Option<String> {
        (MappedRegion::path(self))
            .and_then(|p| std::fs::canonicalize(p).ok())
            .map(|p| p.to_string_lossy().into_owned())
    }

    fn serve(self: Arc<Self>, table: &SegmentTable, id: SegmentId, base: u64) {
        table.insert(id, self, base);
    }

    fn fresh(&self) -> bool {
        self.is_fresh()
    }

    fn scan(&self, base: u64) -> std::io::Result<(Vec<Found>, ScanStats)> {
        // SAFETY: the whole region is in bounds. Bytes another connection
        // writes meanwhile may be seen torn; the scan checks every header
        // and value checksum, so it only ever takes intact objects.
        let bytes = unsafe { self.slice(0, MappedRegion::len(self)) };
        Ok(kvpool_format::scan::scan(bytes, base))
    }

    fn invalidate(self: Arc<Self>, rejected: Vec<(u64, u64)>) -> Invalidated {
        let n = (rejected.iter())
            .filter(|(off, gen)| invalidate_object(&self, *off, *gen))
            .count();
        Box::pin(std::future::ready(n))
    }
}

impl LentMedium for DiskFile {
    fn tier(&self) -> Tier {
        Tier::Disk
    }

    fn len(&self) -> u64 {
        DiskFile::len(self)
    }

    /// Disk regions are read with O_DIRECT by the store alone.
    fn path(&self) -> Option<String> {
        None
    }

    fn serve(self: Arc<Self>, table: &SegmentTable, id: SegmentId, base: u64) {
        table.insert_disk(id, self, base);
    }

    fn scan(&self, base: u64) -> std::io::Result<(Vec<Found>, ScanStats)> {
        crate::disk::scan_disk(self, base)
    }

    /// Through the disk's I/O queue, as every invalidation is.
    fn invalidate(self: Arc<Self>, rejected: Vec<(u64, u64)>) -> Invalidated {
        let done = self.submit(move |f| f.invalidate_all(&rejected));
        Box::pin(async move { done.await.unwrap_or(0) })
    }

    fn io(&self, id: SegmentId) -> Option<SegmentIo> {
        Some(DiskFile::io(self, id))
    }

    fn failed(&self) -> bool {
        DiskFile::failed(self)
    }
}
