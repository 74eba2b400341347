//! A local disk (SSD) as a storage medium: a segment file read and written
//! with O_DIRECT by its own I/O threads ([`crate::disk`]). It takes no
//! writes over the wire, only its store's tier copies; reads and
//! invalidations are queued for its I/O threads and answered when done.

use std::sync::Arc;

use kvpool_proto::msg::Tier;
use kvpool_proto::{Code, KvError, KvResult};

use super::medium::{Copied, Medium};
use super::serve::Reply;
use crate::disk::DiskFile;
use crate::fence::Fence;

/// A disk-tier segment served here.
pub(super) struct DiskSegment {
    pub(super) file: Arc<DiskFile>,
    /// Start of the object area.
    pub(super) base: u64,
    pub(super) fence: Fence,
}

/// Turns a disk error into the code callers see (a transfer failure: try
/// another replica).
fn disk_error(e: std::io::Error) -> KvError {
    KvError::new(Code::TransferFail, format!("disk tier: {e}"))
}

impl Medium for DiskSegment {
    fn tier(&self) -> Tier {
        Tier::Disk
    }

    fn len(&self) -> u64 {
        self.file.len()
    }

    fn base(&self) -> u64 {
        self.base
    }

    fn fence(&self) -> &Fence {
        &self.fence
    }

    fn spawn_io(&self, job: Box<dyn FnOnce() + Send>) {
        // Queued now; the job reports through its own channel.
        drop(self.file.submit(move |_| job()));
    }

    fn read(&self, offset: u64, len: u64) -> Reply {
        let read = self.file.submit(move |f| f.read(offset, len));
        Reply::Reading(
            Box::pin(async move {
                read.await
                    .map_err(|e| KvError::new(Code::InternalError, e.to_string()))?
                    .map_err(disk_error)
            }),
            len,
        )
    }

    fn invalidate(&self, regions: &[(u64, u64)]) -> u64 {
        self.file.invalidate_all(regions) as u64
    }

    fn copy_out(&self, offset: u64, len: u64) -> KvResult<Copied<'_>> {
        self.file
            .read(offset, len)
            .map(Copied::Read)
            .map_err(disk_error)
    }

    fn copy_in(&self, offset: u64, bytes: &[u8], holds: &dyn Fn(&[u8]) -> bool) -> KvResult<bool> {
        self.file
            .write_object(offset, bytes, holds)
            .map_err(disk_error)
    }
}
