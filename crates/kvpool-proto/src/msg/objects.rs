//! Objects: put, get, exist, touch, remove, and the cluster status.

use serde::{Deserialize, Serialize};

use super::*;

/// Replication and pinning for a put (Mooncake's `ReplicateConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicateConfig {
    /// Replicas on distinct segments.
    pub replica_num: u32,
    /// Evict last, for `soft_pin_ttl_ms` (or the master default when `None`).
    pub with_soft_pin: bool,
    /// Soft pin duration.
    pub soft_pin_ttl_ms: Option<u64>,
    /// Never evict.
    pub with_hard_pin: bool,
    /// Segment names to place on first, in order.
    pub preferred_segments: Vec<String>,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        ReplicateConfig {
            replica_num: 1,
            with_soft_pin: false,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
        }
    }
}

/// Where one replica of an object lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    /// The segment.
    pub segment: SegmentId,
    /// `host:port` serving it.
    pub endpoint: String,
    /// Region start.
    pub offset: u64,
    /// Region length (object header + value, rounded up by the allocator).
    pub len: u64,
    /// Permission to read it (in a location) or write it (in a put
    /// grant); `None` from a master without a secret.
    pub cap: Option<Capability>,
    /// The segment's tier: a disk replica is read over TCP whatever the
    /// protocol.
    pub tier: Tier,
    /// The segment's fence when this was handed out (see
    /// [`MountSegment::fence`]).
    pub fence: u64,
}

impl Replica {
    /// The grant to send with a write of this replica's region, for the
    /// object version `generation`.
    pub fn grant(&self, generation: u64) -> Grant {
        Grant {
            offset: self.offset,
            len: self.len,
            generation,
            fence: self.fence,
            cap: self.cap,
        }
    }

    /// The grant to send with a read of this replica's region: only a
    /// signed one is worth its bytes (a store checks nothing else on reads).
    pub fn read_grant(&self, generation: u64) -> Option<Grant> {
        self.cap.is_some().then(|| self.grant(generation))
    }
}

/// One object of a [`PutStart`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutItem {
    /// The key.
    pub key: String,
    /// Value bytes.
    pub value_len: u64,
    /// Bytes to reserve per replica (object header + value).
    pub region_len: u64,
}

/// Reserve regions for new objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutStart {
    /// The writer; only it may end or revoke these puts.
    pub client_id: ClientId,
    /// The writer's operation, the same on each of its retries (a lost
    /// answer, another pass after a transient failure): a key whose put by
    /// this very operation is in flight gets the same regions back, and one
    /// whose put by another operation is in flight is busy, as for another
    /// writer.
    pub op: u64,
    /// The objects.
    pub items: Vec<PutItem>,
    /// Placement and pinning, for every item.
    pub config: ReplicateConfig,
    /// Replace existing objects instead of keeping them.
    pub upsert: bool,
}

/// Regions granted for one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PutGrant {
    /// Write the object into these regions, then `PutEnd`.
    Write {
        /// Written into the object header; readers check it.
        generation: u64,
        /// One region per replica.
        replicas: Vec<Replica>,
    },
    /// Insert of a key that is already committed: nothing to do (write-once).
    Exists,
}

/// One object of a [`PutEnd`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutEndItem {
    /// The key.
    pub key: String,
    /// The generation `PutStart` granted: a retried commit succeeds only if
    /// this very version is the committed one, never an older value.
    pub generation: u64,
}

/// Commit written objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutEnd {
    /// The writer.
    pub client_id: ClientId,
    /// Objects whose bytes are fully written.
    pub items: Vec<PutEndItem>,
}

/// Give up whole put operations (`PutStart::op`) whose caller stopped
/// waiting before it knew whether they started (protocol 11): their puts
/// in flight are revoked, and a `PutStart` of one that arrives later is
/// refused, so they cannot hold their keys until the put timeout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutCancel {
    /// The writer.
    pub client_id: ClientId,
    /// Its operations to give up.
    pub ops: Vec<u64>,
}

/// Abandon started puts and free their regions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutRevoke {
    /// The writer.
    pub client_id: ClientId,
    /// Keys to abandon.
    pub keys: Vec<String>,
}

/// Where a committed object lives, with a read lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectLocation {
    /// Value bytes.
    pub value_len: u64,
    /// Must match the object header.
    pub generation: u64,
    /// The read must finish within this many ms of the request being sent.
    pub lease_ms: u64,
    /// Readable replicas, preferred first.
    pub replicas: Vec<Replica>,
}

/// Locate objects for reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetReplicaList {
    /// Keys to read.
    pub keys: Vec<String>,
}

/// Existence and value size; does not refresh recency or leases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exist {
    /// Keys to check.
    pub keys: Vec<String>,
}

/// Existence and value size, taking a read lease on each object found as
/// a read does (Mooncake's `is_exist`), without locating its replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExistLeased {
    /// Keys to check.
    pub keys: Vec<String>,
}

/// One page of the committed keys starting with `prefix`, in the master's
/// table order (not sorted). Each call does bounded work: a page may come
/// back short, or empty, with a cursor to go on from. Keys put or removed
/// while a listing runs may be missed or listed twice; every key held
/// throughout is listed once, and a listing always ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListKeys {
    /// Only keys starting with this (a tenant's client sends its namespace
    /// in front).
    pub prefix: String,
    /// Where to go on from: empty to start, else a page's `cursor`.
    pub cursor: Vec<u8>,
    /// Most keys to answer (capped at [`crate::limits::MAX_LIST_KEYS`]).
    pub limit: u32,
}

/// A page of [`ListKeys`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPage {
    /// Keys with their value sizes.
    pub keys: Vec<(String, u64)>,
    /// Opaque position to ask from next; empty when the listing is done.
    pub cursor: Vec<u8>,
}

/// Objects a client read through its location cache, without asking the
/// master: each read counts as a `GetReplicaList` would (recency, and the
/// read lease runs from the read), reported late and in batches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Touch {
    /// The reads.
    pub items: Vec<TouchItem>,
}

/// One object read through a cached location.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TouchItem {
    /// The key.
    pub key: String,
    /// The version read; another version is not touched.
    pub generation: u64,
    /// How long before the request was sent the read was, in µs.
    pub age_us: u64,
}

/// Remove objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remove {
    /// Keys to remove.
    pub keys: Vec<String>,
    /// Remove even under a live read lease.
    pub force: bool,
}

/// Remove objects whose key matches a regex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveByRegex {
    /// Rust `regex` syntax, matched anywhere in the key.
    pub pattern: String,
    /// Remove even under a live read lease.
    pub force: bool,
}

/// Remove every object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveAll {
    /// Remove even under a live read lease.
    pub force: bool,
}

/// Ask for the cluster status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {}

/// One mounted segment in [`ClusterStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentStatus {
    /// The segment as mounted.
    pub info: SegmentInfo,
    /// Bytes reserved by objects (including puts in flight).
    pub used: u64,
    /// Regions in use.
    pub regions: u64,
    /// `live`, `suspect` (its store missed heartbeats: no new objects, its
    /// objects stay readable until the grace period ends), `draining`, or
    /// `recovering` (its inventory is being reported).
    pub state: String,
    /// The store's I/O on it (disk segments), as of its last heartbeat.
    pub io: Option<SegmentIo>,
}

/// The cluster as the master sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// `leader`, `recovering` (a new leader waiting for stores to re-mount)
    /// or `standby`.
    pub role: String,
    /// Mounted segments.
    pub segments: Vec<SegmentStatus>,
    /// Committed objects.
    pub keys: u64,
    /// Puts started but not ended.
    pub pending: u64,
    /// Sum of segment sizes.
    pub capacity: u64,
    /// Sum of used bytes.
    pub used: u64,
    /// Registered clients (stores included).
    pub clients: u64,
    /// Objects evicted since start.
    pub evictions: u64,
    /// Objects moved from memory to disk since start.
    pub demotions: u64,
    /// Objects moved from disk back to memory since start.
    pub promotions: u64,
    /// Replicas a remounted store no longer had (each logged with its key):
    /// found missing from its inventory and dropped, since start.
    pub replicas_lost: u64,
}
