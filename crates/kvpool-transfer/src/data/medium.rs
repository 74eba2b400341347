//! The storage-medium interface: what the data plane does to a served
//! segment's bytes besides wire writes (reads, invalidations, copies
//! between tiers), whatever the bytes live on. Memory (`memory.rs`, the
//! segments that also take wire writes) and disk (`on_disk.rs`) implement
//! it; a third medium (remote object store, CXL memory) is one new file and
//! a `SegmentTable::insert_medium`. The reads, invalidations and tier
//! copies in `media.rs` are written once against this trait.

use std::sync::Arc;

use kvpool_proto::msg::Tier;
use kvpool_proto::{Code, KvError, KvResult};

use super::serve::{Boxed, Reply};
use crate::fence::Fence;

/// One medium a served segment's bytes live on. Methods that may block
/// (`invalidate`, `copy_out`, `copy_in`) run where [`Medium::spawn_io`]
/// puts them.
pub(super) trait Medium: Send + Sync + 'static {
    /// The tier the master places it in and moves objects between.
    fn tier(&self) -> Tier;
    /// Bytes in the segment.
    fn len(&self) -> u64;
    /// Start of the object area.
    fn base(&self) -> u64;
    /// The fence of its current mount: copies into it and invalidations
    /// of it are refused when they were planned under an earlier one.
    fn fence(&self) -> &Fence;
    /// Runs `job` where blocking I/O on this medium belongs: its I/O
    /// threads (disk), or at once (memory).
    fn spawn_io(&self, job: Box<dyn FnOnce() + Send>);
    /// The answer to a read of `len` bytes at `offset` (inside the object
    /// area): the bytes, or their read queued for the I/O threads.
    fn read(&self, offset: u64, len: u64) -> Reply;
    /// Destroys each object `(offset, generation)` still of that
    /// generation; how many were.
    fn invalidate(&self, regions: &[(u64, u64)]) -> u64;
    /// The `len` bytes of the object at `offset`, to copy elsewhere.
    fn copy_out(&self, offset: u64, len: u64) -> KvResult<Copied<'_>>;
    /// Writes a copy of an object (`bytes`) at `offset` if `holds` accepts
    /// the bytes about to be written, header last; false if it did not.
    fn copy_in(&self, offset: u64, bytes: &[u8], holds: &dyn Fn(&[u8]) -> bool) -> KvResult<bool>;
}

/// An object's bytes on their way to another medium: borrowed where they
/// lie (memory), or read into a buffer (disk).
pub(super) enum Copied<'a> {
    /// The bytes in place.
    Borrowed(&'a [u8]),
    /// The bytes read from a disk.
    Read(crate::disk::DiskRead),
    /// The bytes read into a buffer of their own (no shipped medium does
    /// yet; the conformance suite's file medium does).
    #[cfg_attr(not(test), allow(dead_code))]
    Owned(Vec<u8>),
}

impl Copied<'_> {
    /// The object's bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Copied::Borrowed(b) => b,
            Copied::Read(r) => r.bytes(),
            Copied::Owned(b) => b,
        }
    }
}

/// Checks that `offset+len` lies in `m`'s object area.
pub(super) fn in_object_area(m: &dyn Medium, offset: u64, len: u64) -> KvResult<()> {
    let (base, size) = (m.base(), m.len());
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

/// Runs `f` on `m` where its blocking I/O belongs (see
/// [`Medium::spawn_io`]); fails only if `f` panicked.
pub(super) fn on_io<T: Send + 'static>(
    m: Arc<dyn Medium>,
    f: impl FnOnce(&dyn Medium) -> T + Send + 'static,
) -> Boxed<KvResult<T>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let medium = m.clone();
    m.spawn_io(Box::new(move || {
        let _ = tx.send(f(&*medium));
    }));
    Box::pin(async move {
        rx.await
            .map_err(|_| KvError::new(Code::InternalError, "an I/O job on the medium panicked"))
    })
}
