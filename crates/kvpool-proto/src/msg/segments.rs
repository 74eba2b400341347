//! Members of the pool: clients and stores registering and pinging, and the
//! segments stores lend, report and withdraw.

use serde::{Deserialize, Serialize};

use super::*;

/// A client or store announces itself; repeated after the master forgot it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterClient {
    /// Chosen by the client, stable for its process life.
    pub client_id: ClientId,
    /// For humans and placement by name.
    pub hostname: String,
}

/// Timing the master expects from a registered client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterReply {
    /// How often to heartbeat.
    pub heartbeat_interval_ms: u64,
    /// Silence after which the client is dropped.
    pub client_ttl_ms: u64,
}

/// Liveness ping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The pinging client.
    pub client_id: ClientId,
    /// I/O of the disk segments a store lends, since it started (empty for
    /// engines and memory-only stores): the master shows it in its status
    /// and metrics.
    pub io: Vec<SegmentIo>,
    /// Regions a store still holds back from the pool (see
    /// [`MountSegment::held`]), as `(segment, offset, len)`; a region held
    /// at a mount and missing here is released.
    pub held: Vec<(SegmentId, u64, u64)>,
}

/// Cumulative I/O one store did on one of its segments since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentIo {
    /// The segment.
    pub segment: SegmentId,
    /// Reads from the device (client reads, promotions, scans).
    pub read_ops: u64,
    /// Bytes read from the device.
    pub read_bytes: u64,
    /// Time spent in those reads, in microseconds.
    pub read_us: u64,
    /// Writes to the device (demotions, invalidations).
    pub write_ops: u64,
    /// Bytes written to the device.
    pub write_bytes: u64,
    /// Time spent in those writes, in microseconds.
    pub write_us: u64,
    /// I/O errors; the first takes the disk tier offline.
    pub errors: u64,
}

/// Answer to [`Heartbeat`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatReply {
    /// False when the master no longer knows the client: it must register and
    /// mount its segments again.
    pub known: bool,
}

/// A segment as lent to the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    /// Stable id.
    pub id: SegmentId,
    /// Name used by `preferred_segments` (defaults to the store's address).
    pub name: String,
    /// `host:port` of the data plane serving this segment.
    pub endpoint: String,
    /// First usable byte offset (after the segment's own superblock).
    pub base: u64,
    /// Usable bytes from `base`.
    pub size: u64,
    /// Absolute path of the segment file, for clients on the same host to
    /// map it (shared-memory transport); `None` for in-process memory and
    /// for disk segments.
    pub path: Option<String>,
    /// The medium: memory segments take new objects, disk segments the
    /// objects memory had to make room for.
    pub tier: Tier,
}

/// Disk-tier regions start at multiples of this and span whole blocks of
/// it, as O_DIRECT requires.
pub const DISK_BLOCK: u64 = 4096;

/// Where a segment's bytes live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Tier {
    /// RAM (a tmpfs file or process memory): placement puts new objects here.
    #[default]
    Memory,
    /// A file on a local SSD: objects demoted from memory, read with O_DIRECT.
    Disk,
}

impl Tier {
    /// Every tier, fastest first: placement puts new objects on the first,
    /// and each tier's overflow moves to the next one a store lends.
    pub const ALL: [Tier; 2] = [Tier::Memory, Tier::Disk];

    /// Lower-case name, for status and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Memory => "memory",
            Tier::Disk => "disk",
        }
    }
}

/// Lend a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSegment {
    /// The lending client; the segment goes away when it does.
    pub client_id: ClientId,
    /// The segment.
    pub segment: SegmentInfo,
    /// Objects the segment already holds, reported next with
    /// [`ReportObjects`]; the segment takes no new objects until the last
    /// report. 0 for a new or empty segment.
    pub objects: u64,
    /// How long before this message the store began scanning the segment:
    /// objects committed after that (written through shared memory while
    /// the store was down or scanning) are not in the inventory but intact.
    pub scan_age_ms: u64,
    /// The segment's secret (from its superblock): a segment id the master
    /// knows is mounted again only by whoever proves the same secret.
    pub possession: [u8; 16],
    /// A value the store chose for this mount, fresh at every mount: the
    /// store writes a region only for a grant naming it, so no grant from
    /// before (a previous leader's, or this master's before it gave the
    /// segment up) can land on a region handed out again.
    pub fence: u64,
    /// Regions `(offset, len)` that a writer of an earlier fence may still
    /// be copying into through shared memory (a paused process): the master
    /// hands them out to nobody until the store stops reporting them (see
    /// [`Heartbeat::held`]).
    pub held: Vec<(u64, u64)>,
}

/// An object found in a segment by a store's scan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryItem {
    /// The key.
    pub key: String,
    /// Generation from its header.
    pub generation: u64,
    /// Value bytes.
    pub value_len: u64,
    /// Region start.
    pub offset: u64,
    /// Region length (rounded up to the allocator's alignment).
    pub region_len: u64,
}

/// Part of a remounted segment's inventory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportObjects {
    /// The lending client.
    pub client_id: ClientId,
    /// The segment.
    pub segment: SegmentId,
    /// Objects found.
    pub objects: Vec<InventoryItem>,
    /// This is the last part: the master reconciles and opens the segment.
    pub last: bool,
}

/// The master's verdict on a segment's inventory (on the last report).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryVerdict {
    /// Objects readable again.
    pub accepted: u64,
    /// `(offset, generation)` of objects the store must invalidate: removed,
    /// replaced by a newer version, or never committed.
    pub rejected: Vec<(u64, u64)>,
}

/// Stop placing new objects on segments (a store shutting down for a
/// restart, or an operator emptying a node); optionally unmount them after a
/// grace period, which drops the objects that have no other replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainSegment {
    /// Segment name, or id in hex.
    pub segment: String,
    /// Unmount this many ms from now; `None` keeps the segment mounted.
    pub unmount_after_ms: Option<u64>,
}

/// A store stops the master placing new objects on a segment of its own
/// (before a restart), proving it holds the segment with the secret from
/// its superblock; the objects stay (protocol 7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainOwn {
    /// The segment.
    pub segment: SegmentId,
    /// The segment's proof of possession (see [`MountSegment::possession`]).
    pub possession: [u8; 16],
}

/// Withdraw a segment; objects with no other replica are dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmountSegment {
    /// The lending client.
    pub client_id: ClientId,
    /// The segment.
    pub segment: SegmentId,
}
