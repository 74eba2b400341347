//! The bytes kvpool keeps in segment memory: the object header every region
//! starts with ([`header`]), value checksums, the segment superblock that
//! names a segment ([`superblock`]), and finding and destroying objects in an
//! object area ([`scan`]).
//!
//! Clients write objects and stores recover them, so both sides must agree on
//! these bytes exactly; they import this one crate rather than each other.
//! It does no I/O: every function takes byte slices, so the format is tested
//! on its own, and memory mapping, files and sockets stay with the callers.

pub mod header;
pub mod scan;
pub mod superblock;

pub use header::{
    copy_sealed, header_len, seal, sealed_header, value_checksum, value_start, ObjectHeader,
    ValueHasher, FIXED_LEN, OBJECT_FORMAT, OBJECT_MAGIC,
};
pub use scan::{Found, ScanStats, REGION_ALIGN};
pub use superblock::{
    read_superblock, segment_id, write_superblock, Superblock, DATA_BASE, SEGMENT_FORMAT,
    SEGMENT_MAGIC,
};
