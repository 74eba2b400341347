//! The data plane: a store's reads, writes, invalidations and tier moves of
//! segment regions, and the master's grants for them.

use serde::{Deserialize, Serialize};

use super::*;

/// A master's signed permission to read or write one region, valid until
/// `expires_ms` (Unix time, in ms); handed out with each replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Capability {
    /// When it stops being honoured, in ms since the Unix epoch.
    pub expires_ms: u64,
    /// What it allows: [`Capability::READ`], [`Capability::WRITE`] or both,
    /// and whether it is bound to one key ([`Capability::KEY`]).
    pub access: u8,
    /// MAC over the region, generation, fence, access and expiry, and with
    /// [`Capability::KEY`] the object's key.
    pub mac: [u8; 16],
}

impl Capability {
    /// Access bit: reading the region.
    pub const READ: u8 = 1;
    /// Access bit: writing the region.
    pub const WRITE: u8 = 2;
    /// Binding bit: the MAC also covers the key of the object granted, so
    /// the store serves the grant only for an object of that key at the
    /// region's start (the header a write carries, the header a read
    /// finds). A client key cannot write a header naming another key.
    pub const KEY: u8 = 4;
    /// The protocol version from which stores check [`Capability::KEY`];
    /// a master binds grants only to segments mounted at this version.
    pub const KEY_SINCE: u32 = 7;
}

/// What the master granted a read or write for, sent with each data-plane
/// request so a store can check it: the request's bytes must lie inside
/// the granted region, and a write must be the object version it names,
/// under the segment's current fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Granted region's start.
    pub offset: u64,
    /// Granted region's length.
    pub len: u64,
    /// The object version it was granted for.
    pub generation: u64,
    /// The segment's fence when the master granted it (see
    /// [`MountSegment::fence`]): a store refuses a write under another.
    pub fence: u64,
    /// The master's signature over all of the above; `None` from a master
    /// without a secret.
    pub cap: Option<Capability>,
}

/// Write the frame's payload at `offset` in a segment: one whole object
/// (header, then value) at the start of its granted region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReq {
    /// Target segment.
    pub segment: SegmentId,
    /// Byte offset in the segment.
    pub offset: u64,
    /// What the master granted: the region, version and fence the store
    /// checks, and its signature (required by a store with a secret).
    pub grant: Grant,
}

/// Read `len` bytes at `offset`; the response's payload holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadReq {
    /// Source segment.
    pub segment: SegmentId,
    /// Byte offset in the segment.
    pub offset: u64,
    /// Bytes to read.
    pub len: u64,
    /// The master's read permission; required by a store with a secret.
    pub grant: Option<Grant>,
}

/// Destroy freed objects: each `(offset, generation)` is invalidated only if
/// the object there still carries that generation (the region may already
/// hold a newer object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidateReq {
    /// The segment.
    pub segment: SegmentId,
    /// The mount of the segment the master decided under (see
    /// [`Grant::fence`]): a store mounted again since refuses, because a
    /// master that does not know the new mount (a leader deposed meanwhile)
    /// may destroy objects the new leader took from the inventory.
    pub fence: u64,
    /// Regions freed by the master.
    pub regions: Vec<(u64, u64)>,
}

/// One object copied by its store between two of its own segments (a
/// demotion from memory to disk, or a promotion back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierMove {
    /// Segment the object is in now.
    pub from: SegmentId,
    /// Its region there.
    pub from_offset: u64,
    /// Region bytes to copy (header and value, as written).
    pub len: u64,
    /// Segment to copy to.
    pub to: SegmentId,
    /// The region reserved there.
    pub to_offset: u64,
    /// The object's generation: the copy is refused unless the source
    /// header still carries it.
    pub generation: u64,
    /// The destination segment's fence (see [`MountSegment::fence`]): a
    /// move planned under an earlier mount (a deposed leader's) is refused.
    pub fence: u64,
}

/// Master → store: copy objects between the store's segments. The copy's
/// header is written last, so a copy cut short by a crash is never found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierMoveReq {
    /// The copies, done in parallel.
    pub moves: Vec<TierMove>,
}

/// Master → store (protocol 11): tier move requests the master stopped
/// waiting for, named by the [`RequestId`] each was sent with. Once
/// this is answered no move of theirs writes anything (one copying now has
/// finished, any later one is refused, however late its request arrives),
/// so the master may give the regions it reserved for them to other
/// objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierMoveCancel {
    /// The requests' ids.
    pub requests: Vec<RequestId>,
}
