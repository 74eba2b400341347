//! Memory as a storage medium: a segment of mapped memory (a tmpfs file
//! or anonymous memory). Reads answer straight from the mapping, and every
//! operation runs at once: there is no I/O to wait for. Memory segments are
//! the ones that also take writes over the wire (`serve.rs`).

use kvpool_format::FIXED_LEN;
use kvpool_proto::msg::Tier;
use kvpool_proto::KvResult;

use super::media::invalidate_object;
use super::medium::{Copied, Medium};
use super::serve::Reply;
use super::table::Served;
use crate::fence::Fence;

impl Medium for Served {
    fn tier(&self) -> Tier {
        Tier::Memory
    }

    fn len(&self) -> u64 {
        self.region.len()
    }

    fn base(&self) -> u64 {
        self.base
    }

    fn fence(&self) -> &Fence {
        &self.fence
    }

    fn spawn_io(&self, job: Box<dyn FnOnce() + Send>) {
        job()
    }

    fn read(&self, offset: u64, len: u64) -> Reply {
        Reply::Region(self.region.clone(), offset, len)
    }

    fn invalidate(&self, regions: &[(u64, u64)]) -> u64 {
        let destroyed = regions
            .iter()
            .filter(|&&(offset, generation)| invalidate_object(&self.region, offset, generation));
        destroyed.count() as u64
    }

    fn copy_out(&self, offset: u64, len: u64) -> KvResult<Copied<'_>> {
        // SAFETY: the caller checked the range is in the object area; the
        // master froze this object for the copy (no writer owns its region).
        Ok(Copied::Borrowed(unsafe { self.region.slice(offset, len) }))
    }

    fn copy_in(&self, offset: u64, bytes: &[u8], holds: &dyn Fn(&[u8]) -> bool) -> KvResult<bool> {
        if !holds(bytes) {
            return Ok(false);
        }
        // SAFETY: the caller checked the range is in the object area; the
        // master reserved this region for the copy alone.
        let out = unsafe { self.region.slice_mut(offset, bytes.len() as u64) };
        // Header last: a torn copy fails its header check on a scan.
        let split = FIXED_LEN.min(bytes.len());
        out[split..].copy_from_slice(&bytes[split..]);
        out[..split].copy_from_slice(&bytes[..split]);
        self.starts.wrote(offset, bytes.len() as u64);
        Ok(true)
    }
}
