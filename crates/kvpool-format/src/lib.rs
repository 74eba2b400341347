//! The bytes kvpool keeps in segment memory: the object header every region
//! starts with ([`header`]), value checksums, the segment superblock that
//! names a segment ([`superblock`]), and finding and destroying objects in an
//! object area ([`scan`]).
//!
//! Clients write objects and stores recover them, so both sides must agree on
//! these bytes exactly; they import this one crate rather than each other.
//! It does no I/O: every function takes byte slices, so the format is tested
//! on its own, and memory mapping, files and sockets stay with the callers.

mod fused;
pub mod header;
pub mod scan;
pub mod superblock;

pub use header::{
    copy_sealed, copy_summed, header_len, publish_generation, seal, sealed_header, value_checksum,
    value_start, ObjectHeader, ValueHasher, FIXED_LEN, GENERATION_AT, OBJECT_FORMAT, OBJECT_MAGIC,
};
pub use scan::{Found, ScanStats, REGION_ALIGN};
pub use superblock::{
    read_superblock, segment_id, write_superblock, Superblock, DATA_BASE, SEGMENT_FORMAT,
    SEGMENT_MAGIC,
};

/// xxh3-64 of `bytes` (seed 0), the checksum of every format here, with
/// its vector code picked at run time (see [`ValueHasher`]).
pub fn xxh3_64(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Segments, headers and peers of earlier builds were checksummed by
        /// another implementation: the results must be the same, whole or
        /// in pieces.
        #[test]
        fn checksums_match_the_reference_xxh3(
            bytes in proptest::collection::vec(any::<u8>(), 0..20_000),
            cut in 1usize..5_000,
        ) {
            let reference = xxhash_rust::xxh3::xxh3_64(&bytes);
            prop_assert_eq!(xxh3_64(&bytes), reference);
            let mut h = ValueHasher::new();
            for piece in bytes.chunks(cut) {
                h.update(piece);
            }
            prop_assert_eq!(h.digest(), reference);
        }
    }

    #[test]
    fn the_empty_checksum_is_xxh3s() {
        assert_eq!(xxh3_64(b""), 0x2D06_8005_38D3_94C2);
        assert_eq!(ValueHasher::new().digest(), 0x2D06_8005_38D3_94C2);
    }
}
