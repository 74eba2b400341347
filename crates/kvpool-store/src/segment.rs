//! A segment file in the store's data directory: a superblock that names the
//! segment (its id survives restarts; layout in `kvpool_format::superblock`),
//! then the object area the master allocates in. The directory is locked so
//! two stores cannot share it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvpool_format::superblock::{has_segment_magic, read_superblock, write_superblock, DATA_BASE};
use kvpool_proto::msg::SegmentId;
use kvpool_transfer::MappedRegion;
use tracing::{info, warn};

use crate::StoreError;

/// A new segment's id and proof of possession: a random secret and the id
/// derived from it ([`SegmentId::derived_from`]), so that only the holder of
/// the secret can mount the id, also on a master that never saw it.
pub(crate) fn new_identity() -> (SegmentId, [u8; 16]) {
    let possession = rand::random();
    (SegmentId::derived_from(&possession), possession)
}

/// Name of the segment file inside the data directory.
pub const SEGMENT_FILE: &str = "segment.kvp";

/// An open segment file.
pub struct SegmentFile {
    /// Stable id, kept across restarts.
    pub id: SegmentId,
    /// The secret that proves to the master this store holds the segment.
    pub possession: [u8; 16],
    /// The mapped file.
    pub region: Arc<MappedRegion>,
    /// Held for the life of the store: the data dir is ours alone.
    _lock: File,
}

impl SegmentFile {
    /// Opens (or creates) the segment of `size` bytes in `dir`. An existing
    /// segment of the same size keeps its id; anything else is re-initialized.
    pub fn open(dir: &Path, size: u64) -> Result<SegmentFile, StoreError> {
        if size <= DATA_BASE * 2 {
            return Err(StoreError::Config(format!(
                "segment size {size} too small (minimum {} bytes)",
                DATA_BASE * 2 + 1
            )));
        }
        let io = |p: &Path| {
            let p: PathBuf = p.to_path_buf();
            move |e| StoreError::Io(p, e)
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let lock_path = dir.join("LOCK");
        let lock = File::create(&lock_path).map_err(io(&lock_path))?;
        lock.try_lock().map_err(|_| {
            StoreError::Config(format!(
                "data dir {} is in use by another store",
                dir.display()
            ))
        })?;
        let path = dir.join(SEGMENT_FILE);
        let region = MappedRegion::open_file(&path, size).map_err(io(&path))?;
        // SAFETY: the superblock lies inside any segment larger than DATA_BASE,
        // and no connection is serving this region yet.
        let sb = unsafe { region.slice_mut(0, DATA_BASE) };
        let (id, possession) = match read_superblock(sb, size) {
            Some(found) => {
                info!(segment = %found.id, path = %path.display(), "reopened segment");
                let possession = found.possession.unwrap_or_else(|| {
                    // Format 1: same id, same objects, a secret added.
                    let p = rand::random();
                    write_superblock(sb, found.id, size, p);
                    info!(segment = %found.id, "superblock upgraded to format 2 (proof of possession)");
                    p
                });
                (found.id, possession)
            }
            None => {
                let (id, possession) = new_identity();
                if has_segment_magic(sb) {
                    warn!(path = %path.display(), "segment superblock does not match; re-initializing");
                }
                write_superblock(sb, id, size, possession);
                info!(segment = %id, path = %path.display(), size, "created segment");
                (id, possession)
            }
        };
        Ok(SegmentFile {
            id,
            possession,
            region: Arc::new(region),
            _lock: lock,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_survives_reopen_and_dir_is_locked() {
        let dir = tempfile::tempdir().unwrap();
        let a = SegmentFile::open(dir.path(), 1 << 20).unwrap();
        assert!(a.region.is_fresh());
        let id = a.id;
        assert!(matches!(
            SegmentFile::open(dir.path(), 1 << 20),
            Err(StoreError::Config(_))
        ));
        drop(a);
        let b = SegmentFile::open(dir.path(), 1 << 20).unwrap();
        assert_eq!((b.id, b.region.is_fresh()), (id, false));
        drop(b);
        // A different size is a different segment, on bytes that may still
        // hold objects: not fresh.
        let c = SegmentFile::open(dir.path(), 2 << 20).unwrap();
        assert_ne!(c.id, id);
        assert!(!c.region.is_fresh());
    }

    #[test]
    fn tiny_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            SegmentFile::open(dir.path(), 100),
            Err(StoreError::Config(_))
        ));
    }
}
