//! The superblock at the start of every segment: it names the segment (its id
//! survives restarts), says where the object area the master allocates in
//! begins, and holds the segment's proof of possession: a random secret the
//! master asks for before it lets anyone mount a segment id it knows, so no
//! other store can take a live segment over. A store writes it when it
//! creates a segment; a client on the same host reads it to make sure a path
//! really is the segment it was told about.
//!
//! ```text
//! offset size field
//!      0    8 magic          b"KVSEGMNT"
//!      8    4 format version u32 LE (2; 1 had no possession secret)
//!     12    4 reserved       0
//!     16   16 segment id     u128 LE
//!     32    8 file size      u64 LE
//!     40    8 data base      u64 LE, first byte of the object area
//!     48    8 checksum       xxh3-64 of bytes 0..48 (format 1: the last field)
//!     56   16 possession     random secret (format 2)
//!     72    8 checksum       xxh3-64 of bytes 0..72 (format 2)
//!     80    . zero up to the data base
//! ```
//!
//! A format-1 superblock still opens; the store rewrites it as format 2
//! with a fresh secret, leaving every object in place.

use crate::xxh3_64;
use kvpool_proto::msg::SegmentId;

/// Bytes reserved at the start of a segment for the superblock; the object
/// area starts here.
pub const DATA_BASE: u64 = 4096;
/// Magic at the start of every segment.
pub const SEGMENT_MAGIC: [u8; 8] = *b"KVSEGMNT";
/// Segment format written by this build.
pub const SEGMENT_FORMAT: u32 = 2;
/// Bytes of the superblock that carry fields (the rest up to [`DATA_BASE`] is zero).
pub const SUPERBLOCK_LEN: usize = 80;

/// What a valid superblock says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// The segment's id.
    pub id: SegmentId,
    /// The proof of possession; `None` in a format-1 superblock, which the
    /// store must rewrite with one.
    pub possession: Option<[u8; 16]>,
}

/// Reads superblock bytes `sb` (the segment's first bytes), if they are a
/// valid kvpool superblock (format 1 or 2) for a segment of `size` bytes;
/// never panics.
pub fn read_superblock(sb: &[u8], size: u64) -> Option<Superblock> {
    let head = sb.get(..56)?;
    let u64_at = |i: usize| u64::from_le_bytes(sb[i..i + 8].try_into().unwrap_or([0; 8]));
    if head[..8] != SEGMENT_MAGIC
        || xxh3_64(&head[..48]) != u64_at(48)
        || u64_at(32) != size
        || u64_at(40) != DATA_BASE
    {
        return None;
    }
    let id = SegmentId(u128::from_le_bytes(head[16..32].try_into().ok()?));
    match u32::from_le_bytes(head[8..12].try_into().ok()?) {
        1 => Some(Superblock {
            id,
            possession: None,
        }),
        2 => {
            let sb = sb.get(..SUPERBLOCK_LEN)?;
            (xxh3_64(&sb[..72]) == u64_at(72)).then(|| Superblock {
                id,
                possession: sb[56..72].try_into().ok(),
            })
        }
        _ => None,
    }
}

/// The id in superblock bytes `sb`, if they are valid for a segment of
/// `size` bytes (see [`read_superblock`]).
pub fn segment_id(sb: &[u8], size: u64) -> Option<SegmentId> {
    read_superblock(sb, size).map(|s| s.id)
}

/// Whether `sb` starts with the segment magic: a kvpool segment, though
/// maybe not a valid one (for telling "re-initializing" from "new").
pub fn has_segment_magic(sb: &[u8]) -> bool {
    sb.get(..8) == Some(&SEGMENT_MAGIC[..])
}

/// Writes a format-2 superblock naming `id` for a segment of `size` bytes,
/// with `possession`, into `sb`, zeroing all of `sb` first; the caller must
/// pass the whole superblock area (`DATA_BASE` bytes).
///
/// # Panics
/// If `sb` is shorter than [`SUPERBLOCK_LEN`].
pub fn write_superblock(sb: &mut [u8], id: SegmentId, size: u64, possession: [u8; 16]) {
    assert!(sb.len() >= SUPERBLOCK_LEN, "superblock area too small");
    sb.fill(0);
    sb[..8].copy_from_slice(&SEGMENT_MAGIC);
    sb[8..12].copy_from_slice(&SEGMENT_FORMAT.to_le_bytes());
    sb[16..32].copy_from_slice(&id.0.to_le_bytes());
    sb[32..40].copy_from_slice(&size.to_le_bytes());
    sb[40..48].copy_from_slice(&DATA_BASE.to_le_bytes());
    let c = xxh3_64(&sb[..48]);
    sb[48..56].copy_from_slice(&c.to_le_bytes());
    sb[56..72].copy_from_slice(&possession);
    let c = xxh3_64(&sb[..72]);
    sb[72..80].copy_from_slice(&c.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_superblock_names_its_segment_of_that_size_only() {
        let mut sb = vec![0xAA; DATA_BASE as usize];
        assert_eq!(segment_id(&sb, 1 << 20), None);
        assert!(!has_segment_magic(&sb));
        write_superblock(&mut sb, SegmentId(42), 1 << 20, [7; 16]);
        assert!(sb[SUPERBLOCK_LEN..].iter().all(|b| *b == 0));
        assert!(has_segment_magic(&sb));
        assert_eq!(
            read_superblock(&sb, 1 << 20),
            Some(Superblock {
                id: SegmentId(42),
                possession: Some([7; 16])
            })
        );
        assert_eq!(
            segment_id(&sb, 2 << 20),
            None,
            "another size is another segment"
        );
        for i in 0..SUPERBLOCK_LEN {
            let mut bad = sb.clone();
            bad[i] ^= 1;
            assert_eq!(segment_id(&bad, 1 << 20), None, "flipped byte {i}");
        }
        assert_eq!(segment_id(&sb[..SUPERBLOCK_LEN - 1], 1 << 20), None);
    }

    #[test]
    fn a_format_1_superblock_still_names_its_segment() {
        // Format 1 as written before the possession secret existed.
        let mut sb = vec![0u8; DATA_BASE as usize];
        sb[..8].copy_from_slice(&SEGMENT_MAGIC);
        sb[8..12].copy_from_slice(&1u32.to_le_bytes());
        sb[16..32].copy_from_slice(&9u128.to_le_bytes());
        sb[32..40].copy_from_slice(&(1u64 << 20).to_le_bytes());
        sb[40..48].copy_from_slice(&DATA_BASE.to_le_bytes());
        let c = xxh3_64(&sb[..48]);
        sb[48..56].copy_from_slice(&c.to_le_bytes());
        assert_eq!(
            read_superblock(&sb, 1 << 20),
            Some(Superblock {
                id: SegmentId(9),
                possession: None
            })
        );
        sb[8] = 3;
        assert_eq!(read_superblock(&sb, 1 << 20), None, "an unknown format");
    }
}
