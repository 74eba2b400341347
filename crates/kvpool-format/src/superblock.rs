//! The superblock at the start of every segment: it names the segment (its id
//! survives restarts) and says where the object area the master allocates in
//! begins. A store writes it once when it creates a segment; a client on the
//! same host reads it to make sure a path really is the segment it was told
//! about.
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
//!     56    . zero up to the data base
//! ```

use kvpool_proto::msg::SegmentId;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes reserved at the start of a segment for the superblock; the object
/// area starts here.
pub const DATA_BASE: u64 = 4096;
/// Magic at the start of every segment.
pub const SEGMENT_MAGIC: [u8; 8] = *b"KVSEGMNT";
/// Segment format written by this build.
pub const SEGMENT_FORMAT: u32 = 1;
/// Bytes of the superblock that carry fields (the rest up to [`DATA_BASE`] is zero).
pub const SUPERBLOCK_LEN: usize = 56;

/// The id in superblock bytes `sb` (the segment's first bytes), if they are a
/// valid kvpool superblock for a segment of `size` bytes; never panics.
pub fn segment_id(sb: &[u8], size: u64) -> Option<SegmentId> {
    let sb = sb.get(..SUPERBLOCK_LEN)?;
    let u64_at = |i: usize| u64::from_le_bytes(sb[i..i + 8].try_into().unwrap_or([0; 8]));
    if sb[..8] != SEGMENT_MAGIC
        || u32::from_le_bytes(sb[8..12].try_into().ok()?) != SEGMENT_FORMAT
        || xxh3_64(&sb[..48]) != u64_at(48)
        || u64_at(32) != size
        || u64_at(40) != DATA_BASE
    {
        return None;
    }
    Some(SegmentId(u128::from_le_bytes(sb[16..32].try_into().ok()?)))
}

/// Whether `sb` starts with the segment magic: a kvpool segment, though
/// maybe not a valid one (for telling "re-initializing" from "new").
pub fn has_segment_magic(sb: &[u8]) -> bool {
    sb.get(..8) == Some(&SEGMENT_MAGIC[..])
}

/// Writes a superblock naming `id` for a segment of `size` bytes into `sb`,
/// zeroing all of `sb` first; the caller must pass the whole superblock area
/// (`DATA_BASE` bytes).
///
/// # Panics
/// If `sb` is shorter than [`SUPERBLOCK_LEN`].
pub fn write_superblock(sb: &mut [u8], id: SegmentId, size: u64) {
    assert!(sb.len() >= SUPERBLOCK_LEN, "superblock area too small");
    sb.fill(0);
    sb[..8].copy_from_slice(&SEGMENT_MAGIC);
    sb[8..12].copy_from_slice(&SEGMENT_FORMAT.to_le_bytes());
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
    fn written_superblock_names_its_segment_of_that_size_only() {
        let mut sb = vec![0xAA; DATA_BASE as usize];
        assert_eq!(segment_id(&sb, 1 << 20), None);
        assert!(!has_segment_magic(&sb));
        write_superblock(&mut sb, SegmentId(42), 1 << 20);
        assert!(sb[SUPERBLOCK_LEN..].iter().all(|b| *b == 0));
        assert!(has_segment_magic(&sb));
        assert_eq!(segment_id(&sb, 1 << 20), Some(SegmentId(42)));
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
}
