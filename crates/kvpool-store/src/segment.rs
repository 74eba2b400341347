//! A segment file in the store's data directory: a superblock that names the
//! segment (its id survives restarts), then the object area the master
//! allocates in. The directory is locked so two stores cannot share it.
//!
//! ```text
//! offset size field
//!      0    8 magic          b"KVSEGMNT"
//!      8    4 format version u32 LE (1)
//!     12    4 reserved       0
//!     16   16 segment id     u128 LE
//!     32    8 file size      u64 LE
//!     40    8 data base      u64 LE, first byte of the object area
//!     48    8 checksum       xxh3-64 of bytes 0..48
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvpool_proto::msg::SegmentId;
use kvpool_transfer::MappedRegion;
use tracing::{info, warn};
use xxhash_rust::xxh3::xxh3_64;

use crate::StoreError;

/// Bytes reserved at the start of a segment for the superblock.
pub const DATA_BASE: u64 = 4096;
const MAGIC: [u8; 8] = *b"KVSEGMNT";
const FORMAT: u32 = 1;
/// Name of the segment file inside the data directory.
pub const SEGMENT_FILE: &str = "segment.kvp";

/// An open segment file.
pub struct SegmentFile {
    /// Stable id, kept across restarts.
    pub id: SegmentId,
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
        let id = match read_superblock(sb, size) {
            Some(id) => {
                info!(segment = %id, path = %path.display(), "reopened segment");
                id
            }
            None => {
                let id = SegmentId(rand::random::<u128>());
                if sb[..8] == MAGIC {
                    warn!(path = %path.display(), "segment superblock does not match; re-initializing");
                }
                write_superblock(sb, id, size);
                info!(segment = %id, path = %path.display(), size, "created segment");
                id
            }
        };
        Ok(SegmentFile {
            id,
            region: Arc::new(region),
            _lock: lock,
        })
    }
}

/// The id in a mapped segment's superblock, if it is a valid kvpool segment
/// of the mapping's size (how a client on the same host makes sure a path
/// really is the segment it was told about).
pub fn segment_id(region: &MappedRegion) -> Option<SegmentId> {
    if region.len() < DATA_BASE {
        return None;
    }
    // SAFETY: in bounds (checked above); the superblock is written once at creation.
    read_superblock(unsafe { region.slice(0, DATA_BASE) }, region.len())
}

fn read_superblock(sb: &[u8], size: u64) -> Option<SegmentId> {
    let u64_at = |i: usize| u64::from_le_bytes(sb[i..i + 8].try_into().unwrap_or([0; 8]));
    if sb[..8] != MAGIC
        || u32::from_le_bytes(sb[8..12].try_into().ok()?) != FORMAT
        || xxh3_64(&sb[..48]) != u64_at(48)
        || u64_at(32) != size
        || u64_at(40) != DATA_BASE
    {
        return None;
    }
    Some(SegmentId(u128::from_le_bytes(sb[16..32].try_into().ok()?)))
}

fn write_superblock(sb: &mut [u8], id: SegmentId, size: u64) {
    sb[..DATA_BASE as usize].fill(0);
    sb[..8].copy_from_slice(&MAGIC);
    sb[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    sb[16..32].copy_from_slice(&id.0.to_le_bytes());
    sb[32..40].copy_from_slice(&size.to_le_bytes());
    sb[40..48].copy_from_slice(&DATA_BASE.to_le_bytes());
    let c = xxh3_64(&sb[..48]);
    sb[48..56].copy_from_slice(&c.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_survives_reopen_and_dir_is_locked() {
        let dir = tempfile::tempdir().unwrap();
        let a = SegmentFile::open(dir.path(), 1 << 20).unwrap();
        let id = a.id;
        assert!(matches!(
            SegmentFile::open(dir.path(), 1 << 20),
            Err(StoreError::Config(_))
        ));
        drop(a);
        assert_eq!(SegmentFile::open(dir.path(), 1 << 20).unwrap().id, id);
        // A different size is a different segment.
        assert_ne!(SegmentFile::open(dir.path(), 2 << 20).unwrap().id, id);
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
