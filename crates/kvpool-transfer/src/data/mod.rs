//! The TCP data plane: a server that moves bytes between sockets and segment
//! memory, and the client side that pipelines many region reads and writes on
//! one connection, straight from and into caller memory.
//!
//! A write's payload is read from the socket directly into the segment; a
//! read's payload is written to the socket directly from the segment. Neither
//! side copies through an intermediate buffer (payloads larger than the 64 KiB
//! I/O buffer bypass it).
//!
//! By concern:
//! - `table`: the segment registry ([`SegmentTable`]): the memory and disk
//!   segments served, their mount fences, the versions the master
//!   invalidated, and the regions held back from an earlier mount;
//! - `medium`: the storage-medium interface (`Medium`): what the data
//!   plane does to a segment's bytes besides wire writes; `memory` and
//!   `on_disk` implement it, one file per medium;
//! - `media`: reads, invalidations ([`invalidate_object`]) and the copies
//!   between a store's tiers, written once against `Medium`;
//! - `serve`: the server ([`serve_data`], and [`serve_data_unix`] for
//!   same-host peers): per-connection dispatch, the
//!   plane and role checks, and the admission of writes against their grants;
//! - `pipeline`: the client side ([`write_regions`], [`read_regions`],
//!   [`read_regions_shared`]).
//!
//! The submodules are private: every item is used through this module's
//! paths, as before the split.

#[cfg(test)]
mod conformance;
mod media;
mod medium;
mod memory;
mod on_disk;
mod pipeline;
mod serve;
mod starts;
mod table;
#[cfg(test)]
mod tests;

pub use media::invalidate_object;
pub use pipeline::{read_regions, read_regions_shared, write_regions, ReadOp, WriteOp};
pub use serve::{serve_data, serve_data_unix};
pub use table::SegmentTable;
pub use table::{INVALIDATIONS_KEPT, INVALIDATIONS_KEPT_ENV};

/// Requests kept in flight per connection before waiting for a response;
/// bounds what either side must buffer so pipelining can never deadlock.
/// Shared: the client side pipelines this many, and the server takes as many
/// ahead while a disk read is pending.
const WINDOW: usize = 64;
