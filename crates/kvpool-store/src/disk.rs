//! The disk tier of a store: one segment file on a local SSD
//! (`--disk-dir`, `--disk-size`) that takes the objects the memory segment
//! must make room for (the master decides which, and when), and finding
//! them again after a restart.
//!
//! The file has the same superblock as a memory segment and holds the same
//! objects, each in whole 4 KiB blocks. Copies reach it verified and header
//! last (see `kvpool_transfer::disk`), so the restart scan reads headers
//! only: it walks the file in big sequential reads and jumps over every
//! object it finds.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvpool_format::scan::{header_at, Found, ScanStats};
use kvpool_format::superblock::{has_segment_magic, read_superblock, write_superblock, DATA_BASE};
use kvpool_format::FIXED_LEN;
use kvpool_proto::msg::{SegmentId, DISK_BLOCK};
use kvpool_proto::MAX_KEY_LEN;
use kvpool_transfer::disk::AlignedBuf;
use kvpool_transfer::DiskFile;
use tracing::{info, warn};

use crate::StoreError;

/// Name of the disk-tier file inside the disk directory.
pub const DISK_FILE: &str = "disk.kvp";

/// Bytes one step of the restart scan reads.
const SCAN_CHUNK: usize = 4 << 20;

/// An open disk-tier segment.
pub struct DiskSegment {
    /// Stable id, kept across restarts.
    pub id: SegmentId,
    /// The secret that proves to the master this store holds the segment.
    pub possession: [u8; 16],
    /// The file.
    pub file: Arc<DiskFile>,
    /// Held for the life of the store: the directory's disk tier is ours alone.
    _lock: File,
}

impl DiskSegment {
    /// Opens (or creates) the disk segment of `size` bytes (rounded down to
    /// whole blocks) in `dir`, keeping at most `queue_depth` requests in
    /// flight to it. An existing one of the same size keeps its id and
    /// objects; anything else is re-initialized.
    pub fn open(dir: &Path, size: u64, queue_depth: usize) -> Result<DiskSegment, StoreError> {
        let size = size / DISK_BLOCK * DISK_BLOCK;
        if size <= DATA_BASE * 2 {
            return Err(StoreError::Config(format!(
                "disk size {size} too small (minimum {} bytes)",
                DATA_BASE * 2 + DISK_BLOCK
            )));
        }
        let io = |p: &Path| {
            let p: PathBuf = p.to_path_buf();
            move |e| StoreError::Io(p, e)
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let lock_path = dir.join("LOCK.disk");
        let lock = File::create(&lock_path).map_err(io(&lock_path))?;
        lock.try_lock().map_err(|_| {
            StoreError::Config(format!(
                "disk dir {} is in use by another store",
                dir.display()
            ))
        })?;
        let path = dir.join(DISK_FILE);
        let file = DiskFile::open(&path, size, queue_depth).map_err(io(&path))?;
        let mut sb = AlignedBuf::new(DATA_BASE as usize);
        file.read_blocks(0, &mut sb, DATA_BASE as usize)
            .map_err(io(&path))?;
        let (id, possession) = match read_superblock(&sb, size) {
            Some(found) => {
                let possession = match found.possession {
                    Some(p) => p,
                    None => {
                        let p = rand::random();
                        write_superblock(&mut sb, found.id, size, p);
                        file.write_blocks(0, &sb).map_err(io(&path))?;
                        p
                    }
                };
                info!(segment = %found.id, path = %path.display(), "reopened disk segment");
                (found.id, possession)
            }
            None => {
                if has_segment_magic(&sb) {
                    warn!(path = %path.display(), "disk segment superblock does not match; re-initializing");
                }
                let (id, possession) = crate::segment::new_identity();
                write_superblock(&mut sb, id, size, possession);
                file.write_blocks(0, &sb).map_err(io(&path))?;
                info!(segment = %id, path = %path.display(), size, direct = file.direct(), "created disk segment");
                (id, possession)
            }
        };
        Ok(DiskSegment {
            id,
            possession,
            file: Arc::new(file),
            _lock: lock,
        })
    }
}

/// Every object whose header is intact in `file` from `base` on, in offset
/// order; reads the file sequentially in big steps, skipping over values.
pub fn scan_disk(file: &DiskFile, base: u64) -> std::io::Result<(Vec<Found>, ScanStats)> {
    let block = DISK_BLOCK as usize;
    let mut found = Vec::new();
    let mut stats = ScanStats::default();
    let mut buf = AlignedBuf::new(SCAN_CHUNK);
    let mut off = base.div_ceil(DISK_BLOCK) * DISK_BLOCK;
    let size = file.len();
    while off < size {
        let len = (size - off).min(SCAN_CHUNK as u64) as usize;
        file.read_blocks(off, &mut buf, len)?;
        let mut at = 0usize;
        let mut next = off + len as u64;
        while at < len {
            let rest = &buf[at..len];
            // A long key's header may run past this chunk: read it again
            // from its own start (unless it already starts the chunk).
            if at > 0 && rest.len() < FIXED_LEN + MAX_KEY_LEN && rest.starts_with(b"KVOB") {
                next = off + at as u64;
                break;
            }
            let Some((h, total)) = header_at(rest) else {
                at += block;
                continue;
            };
            let region_len = total.div_ceil(DISK_BLOCK) * DISK_BLOCK;
            let start = off + at as u64;
            if start.checked_add(region_len).is_none_or(|end| end > size) {
                // A header claiming bytes past the end: not an object we wrote.
                stats.torn += 1;
                at += block;
                continue;
            }
            stats.objects += 1;
            stats.bytes += region_len;
            found.push(Found {
                key: h.key,
                generation: h.generation,
                value_len: h.value_len,
                offset: start,
                region_len,
            });
            let end = start + region_len;
            if end >= off + len as u64 {
                next = end;
                break;
            }
            at += region_len as usize;
        }
        off = next;
    }
    Ok((found, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpool_format::{value_checksum, ObjectHeader};

    fn object(key: &str, generation: u64, value: &[u8]) -> Vec<u8> {
        let mut b = ObjectHeader {
            key: key.into(),
            value_len: value.len() as u64,
            generation,
            checksum: value_checksum(&[value]),
        }
        .encode();
        b.extend_from_slice(value);
        b
    }

    fn disk_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("kvpool-disk-store-test")
            .tempdir_in(std::env::temp_dir())
            .unwrap()
    }

    #[test]
    fn id_survives_reopen_and_objects_are_found_again() {
        let dir = disk_dir();
        let size = 12 << 20;
        let seg = DiskSegment::open(dir.path(), size, 4).unwrap();
        let id = seg.id;
        assert!(
            DiskSegment::open(dir.path(), size, 4).is_err(),
            "the directory is locked"
        );
        // Objects across the scan's chunk boundaries, one with a long key.
        let long_key = "k".repeat(3000);
        // The scan reads 4 MiB from 4096 on: the long key's header starts in
        // the last block of the second chunk and runs into the third.
        let placed = [
            (DATA_BASE, "a", 1u64, vec![1u8; 100]),
            (8192, "b", 2, vec![2; 6 << 20]),
            (8 << 20, long_key.as_str(), 3, vec![3; 10]),
            (11 << 20, "d", 4, vec![4; 8000]),
        ];
        let offsets: Vec<u64> = placed.iter().map(|p| p.0).collect();
        for (at, key, gen, value) in &placed {
            assert!(seg
                .file
                .write_object(*at, &object(key, *gen, value), |_| true)
                .unwrap());
        }
        // "a" is destroyed.
        assert!(seg.file.invalidate(DATA_BASE, 1).unwrap());
        drop(seg);
        let seg = DiskSegment::open(dir.path(), size, 4).unwrap();
        assert_eq!(seg.id, id);
        let (found, stats) = scan_disk(&seg.file, DATA_BASE).unwrap();
        let keys: Vec<(&str, u64)> = found.iter().map(|f| (&f.key[..1], f.offset)).collect();
        assert_eq!(
            keys,
            [("b", offsets[1]), ("k", offsets[2]), ("d", offsets[3])]
        );
        assert_eq!(stats.objects, 3);
        assert_eq!(
            found[0].region_len,
            ((6 << 20) + 41u64).div_ceil(4096) * 4096
        );
        assert_eq!(found[1].key, long_key);
    }

    #[test]
    fn a_smaller_file_is_a_new_segment() {
        let dir = disk_dir();
        let id = DiskSegment::open(dir.path(), 1 << 20, 4).unwrap().id;
        assert_ne!(DiskSegment::open(dir.path(), 2 << 20, 4).unwrap().id, id);
        assert!(DiskSegment::open(dir.path(), 4096, 4).is_err());
    }
}
