//! Typed messages carried in a frame's meta section, one request type and one
//! response type per [`Opcode`]. Batch forms are the only forms: a single-key
//! call is a batch of one, and every batch answers **per key**, so partial
//! success is never hidden behind one code.
//!
//! Long (over 800 lines) because every plane's messages are here, each
//! beside its `Rpc` impl; a split by plane (handshake, control, data) is
//! the next step once the transfer engine's messages have landed.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::code::{Code, KvError, KvResult};
use crate::frame::Opcode;

/// A request type and the response it gets back.
pub trait Rpc: Serialize + DeserializeOwned + Send + 'static {
    /// Opcode that carries this request.
    const OPCODE: Opcode;
    /// The response message.
    type Response: Serialize + DeserializeOwned + Send + 'static;

    /// For a batch request, how many items its encoded form `meta` carries,
    /// read from the front of the bytes without decoding the rest: a
    /// receiver refuses a batch over [`crate::limits::MAX_BATCH_KEYS`]
    /// before allocating for it. `None` for a request that is no batch (or
    /// bytes too short to tell; decoding then fails anyway).
    fn batch_len(_meta: &[u8]) -> Option<u64> {
        None
    }
}

/// The length of the sequence that follows the fields `P` at the front of
/// an encoded message (postcard writes a sequence's length as a varint,
/// the encoding of a `u64`).
fn seq_len_after<P: DeserializeOwned>(meta: &[u8]) -> Option<u64> {
    postcard::take_from_bytes::<(P, u64)>(meta)
        .ok()
        .map(|((_, n), _)| n)
}

/// Encodes a message for a frame's meta section.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_to(msg, &mut buf);
    buf
}

/// Encodes a message into `buf` (cleared first), reusing its allocation.
pub fn encode_to<T: Serialize>(msg: &T, buf: &mut Vec<u8>) {
    let mut v = std::mem::take(buf);
    v.clear();
    // Serializing into a Vec cannot fail for these plain-data types.
    *buf = postcard::to_extend(msg, v).unwrap_or_default();
}

/// Decodes a frame's meta section; malformed bytes are an error, never a panic.
pub fn decode<T: DeserializeOwned>(meta: &[u8]) -> KvResult<T> {
    postcard::from_bytes(meta)
        .map_err(|e| KvError::new(Code::InvalidParams, format!("malformed message: {e}")))
}

/// A per-key outcome on the wire: a value or an error code.
pub type WireResult<T> = Result<T, i32>;

/// Converts a per-key wire result into a typed one.
pub fn from_wire<T>(r: WireResult<T>) -> KvResult<T> {
    r.map_err(|c| KvError::from(Code::from_i32(c)))
}

/// Converts a typed per-key result into its wire form.
pub fn to_wire<T>(r: KvResult<T>) -> WireResult<T> {
    r.map_err(|e| e.code.as_i32())
}

/// Identifies a segment for its whole life, across store restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SegmentId(pub u128);

impl std::fmt::Display for SegmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Identifies a client (or store) process to the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClientId(pub u128);

impl std::fmt::Display for ClientId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Follows one client call across processes: chosen by the client, sent
/// with each of its requests (see [`RequestTrailer`]) and logged by the
/// master and stores in their `request` spans. 0 means none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestId(pub u64);

impl RequestId {
    /// No id: a request from a v5 peer, or from a process that set none.
    pub const NONE: RequestId = RequestId(0);
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Fields every request carries after its message since protocol 6 (see
/// [`crate::compat`]); left out on connections that speak 5.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestTrailer {
    /// The client call this request is part of.
    pub id: RequestId,
}

impl crate::compat::Trailer for RequestTrailer {
    const SINCE: u32 = 6;
}

// ---------------------------------------------------------------- handshake

/// First frame on a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Newest version the sender speaks.
    pub version: u32,
    /// Oldest version the sender speaks.
    pub min_version: u32,
    /// Who is calling, for logs ("client", "store", "cli").
    pub role: String,
    /// Fresh randomness from the caller, bound into both proofs of [`Auth`].
    pub nonce: [u8; 16],
}

/// Answer to [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloReply {
    /// Version both sides will speak.
    pub version: u32,
    /// What answered ("master", "store").
    pub server: String,
    /// Present when the server requires an [`Auth`] before anything else.
    pub challenge: Option<Challenge>,
}

/// A server's demand for proof of a role key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// Fresh randomness from the server.
    pub nonce: [u8; 16],
    /// The highest role this server can verify (its own key's role).
    pub max_role: u8,
}

impl Rpc for Hello {
    const OPCODE: Opcode = Opcode::Hello;
    type Response = HelloReply;
}

/// Proof that the caller holds the key of `role`: a MAC over both nonces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auth {
    /// The role claimed (1 client, 2 store, 3 admin).
    pub role: u8,
    /// The caller's proof.
    pub proof: [u8; 32],
}

/// Answer to [`Auth`]: the server's own proof of the same key, so a caller
/// never talks to a server that does not hold the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthReply {
    /// The server's proof.
    pub proof: [u8; 32],
}

impl Rpc for Auth {
    const OPCODE: Opcode = Opcode::Auth;
    type Response = AuthReply;
}

// ---------------------------------------------------------------- data plane

/// A master's signed permission to read or write one region, valid until
/// `expires_ms` (Unix time, in ms); handed out with each replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Capability {
    /// When it stops being honoured, in ms since the Unix epoch.
    pub expires_ms: u64,
    /// What it allows: [`Capability::READ`], [`Capability::WRITE`] or both.
    pub access: u8,
    /// MAC over the region, generation, fence, access and expiry.
    pub mac: [u8; 16],
}

impl Capability {
    /// Access bit: reading the region.
    pub const READ: u8 = 1;
    /// Access bit: writing the region.
    pub const WRITE: u8 = 2;
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

impl Rpc for WriteReq {
    const OPCODE: Opcode = Opcode::Write;
    type Response = ();
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

impl Rpc for ReadReq {
    const OPCODE: Opcode = Opcode::Read;
    type Response = ();
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

impl Rpc for InvalidateReq {
    const OPCODE: Opcode = Opcode::Invalidate;
    /// How many objects were destroyed.
    type Response = u64;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<(SegmentId, u64)>(meta)
    }
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

impl Rpc for TierMoveReq {
    const OPCODE: Opcode = Opcode::TierMove;
    /// Per move: 0, or the error code it failed with.
    type Response = Vec<i32>;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<()>(meta)
    }
}

// ---------------------------------------------------------------- liveness

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

impl Rpc for RegisterClient {
    const OPCODE: Opcode = Opcode::RegisterClient;
    type Response = RegisterReply;
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

impl Rpc for Heartbeat {
    const OPCODE: Opcode = Opcode::Heartbeat;
    type Response = HeartbeatReply;
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

impl Rpc for MountSegment {
    const OPCODE: Opcode = Opcode::MountSegment;
    type Response = ();
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

impl Rpc for ReportObjects {
    const OPCODE: Opcode = Opcode::ReportObjects;
    type Response = InventoryVerdict;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<(ClientId, SegmentId)>(meta)
    }
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

impl Rpc for DrainSegment {
    const OPCODE: Opcode = Opcode::DrainSegment;
    /// The segments now draining.
    type Response = Vec<SegmentId>;
}

/// Withdraw a segment; objects with no other replica are dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmountSegment {
    /// The lending client.
    pub client_id: ClientId,
    /// The segment.
    pub segment: SegmentId,
}

impl Rpc for UnmountSegment {
    const OPCODE: Opcode = Opcode::UnmountSegment;
    type Response = ();
}

// ---------------------------------------------------------------- objects

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

impl Rpc for PutStart {
    const OPCODE: Opcode = Opcode::PutStart;
    type Response = Vec<WireResult<PutGrant>>;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<(ClientId, u64)>(meta)
    }
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

impl Rpc for PutEnd {
    const OPCODE: Opcode = Opcode::PutEnd;
    type Response = Vec<WireResult<()>>;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<ClientId>(meta)
    }
}

/// Abandon started puts and free their regions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutRevoke {
    /// The writer.
    pub client_id: ClientId,
    /// Keys to abandon.
    pub keys: Vec<String>,
}

impl Rpc for PutRevoke {
    const OPCODE: Opcode = Opcode::PutRevoke;
    type Response = Vec<WireResult<()>>;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<ClientId>(meta)
    }
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

impl Rpc for GetReplicaList {
    const OPCODE: Opcode = Opcode::GetReplicaList;
    type Response = Vec<WireResult<ObjectLocation>>;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<()>(meta)
    }
}

/// Existence and value size; does not refresh recency or leases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exist {
    /// Keys to check.
    pub keys: Vec<String>,
}

impl Rpc for Exist {
    const OPCODE: Opcode = Opcode::Exist;
    /// Per key: the value size, or `OBJECT_NOT_FOUND`.
    type Response = Vec<WireResult<u64>>;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<()>(meta)
    }
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

impl Rpc for Touch {
    const OPCODE: Opcode = Opcode::Touch;
    /// Per item: whether that version is still current (and now leased).
    type Response = Vec<bool>;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<()>(meta)
    }
}

/// Remove objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remove {
    /// Keys to remove.
    pub keys: Vec<String>,
    /// Remove even under a live read lease.
    pub force: bool,
}

impl Rpc for Remove {
    const OPCODE: Opcode = Opcode::Remove;
    type Response = Vec<WireResult<()>>;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<()>(meta)
    }
}

/// Remove objects whose key matches a regex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveByRegex {
    /// Rust `regex` syntax, matched anywhere in the key.
    pub pattern: String,
    /// Remove even under a live read lease.
    pub force: bool,
}

impl Rpc for RemoveByRegex {
    const OPCODE: Opcode = Opcode::RemoveByRegex;
    /// Number of objects removed.
    type Response = u64;
}

/// Remove every object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveAll {
    /// Remove even under a live read lease.
    pub force: bool,
}

impl Rpc for RemoveAll {
    const OPCODE: Opcode = Opcode::RemoveAll;
    /// Number of objects removed.
    type Response = u64;
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

impl Rpc for Status {
    const OPCODE: Opcode = Opcode::Status;
    type Response = ClusterStatus;
}

// ---------------------------------------------------------------- replicas and tasks

/// Regions on more segments for the current version of an object, so a
/// client can copy it there (a replica copy or move): it reads the object
/// from a source replica, writes it into each target region, and then
/// sends [`ReplicaCommit`]. Extends the object's read lease like a read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaAdd {
    /// The copying client; only it may commit these regions.
    pub client_id: ClientId,
    /// The object.
    pub key: String,
    /// Segment names (or ids in hex) to copy to.
    pub targets: Vec<String>,
}

/// Where to copy an object from and to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaPlan {
    /// Value bytes.
    pub value_len: u64,
    /// The version being copied; the commit must name it.
    pub generation: u64,
    /// The object's read lease, as in [`ObjectLocation`].
    pub lease_ms: u64,
    /// Its replicas now, to read from (with read grants).
    pub sources: Vec<Replica>,
    /// Per target: a region to write (with a write grant), `None` when the
    /// object already has a replica there, or the error for that target.
    pub targets: Vec<WireResult<Option<Replica>>>,
}

impl Rpc for ReplicaAdd {
    const OPCODE: Opcode = Opcode::ReplicaAdd;
    type Response = ReplicaPlan;
}

/// The end of a copy: attaches the written regions as replicas (when the
/// object is still the version copied), frees the failed ones, and drops
/// the object's replicas on `drop` (a move) as long as one stays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaCommit {
    /// The copying client.
    pub client_id: ClientId,
    /// The object.
    pub key: String,
    /// The version copied.
    pub generation: u64,
    /// Segments whose region was written in full.
    pub written: Vec<SegmentId>,
    /// Segments whose region was not written.
    pub failed: Vec<SegmentId>,
    /// Segments whose replica to drop once the written ones are attached.
    pub drop: Vec<SegmentId>,
}

impl Rpc for ReplicaCommit {
    const OPCODE: Opcode = Opcode::ReplicaCommit;
    type Response = ();
}

/// Drops the replicas of `keys` on `segment` (all of them, so the whole
/// object, when `None`); an object losing its last replica is removed.
/// Objects under a live read lease are left alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaClear {
    /// The objects.
    pub keys: Vec<String>,
    /// Segment name (or id in hex); `None` for every replica.
    pub segment: Option<String>,
}

impl Rpc for ReplicaClear {
    const OPCODE: Opcode = Opcode::ReplicaClear;
    /// Per key: whether something was dropped.
    type Response = Vec<bool>;

    fn batch_len(meta: &[u8]) -> Option<u64> {
        seq_len_after::<()>(meta)
    }
}

/// A replica task's kind (Mooncake's `TaskType`).
pub mod task_kind {
    /// Copy an object to more segments.
    pub const COPY: u8 = 0;
    /// Move an object's replica from one segment to another.
    pub const MOVE: u8 = 1;
}

/// A replica task's state (Mooncake's `TaskStatus` numbers).
pub mod task_status {
    /// Recorded, not started.
    pub const PENDING: u8 = 0;
    /// Being carried out.
    pub const PROCESSING: u8 = 1;
    /// Ended in failure; the message says why.
    pub const FAILED: u8 = 2;
    /// Done.
    pub const SUCCESS: u8 = 3;
}

/// Records a replica copy or move of `key`, carried out by the calling
/// client; checked first (the key exists, the segments are mounted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCreate {
    /// The client that carries the task out.
    pub client_id: ClientId,
    /// [`task_kind`].
    pub kind: u8,
    /// The object.
    pub key: String,
    /// For a move: the segment to move from.
    pub source: String,
    /// Segments to copy or move to.
    pub targets: Vec<String>,
}

impl Rpc for TaskCreate {
    const OPCODE: Opcode = Opcode::TaskCreate;
    /// The task id.
    type Response = u128;
}

/// Progress of a task, from the client carrying it out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskUpdate {
    /// The client carrying it out.
    pub client_id: ClientId,
    /// The task.
    pub id: u128,
    /// [`task_status`].
    pub status: u8,
    /// What happened, for people.
    pub message: String,
}

impl Rpc for TaskUpdate {
    const OPCODE: Opcode = Opcode::TaskUpdate;
    type Response = ();
}

/// Asks for a task's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskQuery {
    /// The task.
    pub id: u128,
}

/// A task as the master knows it (Mooncake's `QueryTaskResponse`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// The task.
    pub id: u128,
    /// [`task_kind`].
    pub kind: u8,
    /// [`task_status`].
    pub status: u8,
    /// When it was recorded, ms since the Unix epoch.
    pub created_ms: u64,
    /// When its state last changed, ms since the Unix epoch.
    pub updated_ms: u64,
    /// The client carrying it out.
    pub assigned_client: ClientId,
    /// What happened, for people.
    pub message: String,
}

impl Rpc for TaskQuery {
    const OPCODE: Opcode = Opcode::TaskQuery;
    type Response = TaskInfo;
}

/// Asks a data server what it serves and which master it answers to (an
/// engine attaching to a storage process on its host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreAbout {}

/// What a data server serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreAboutReply {
    /// The master its segments are mounted on (as the store was told it).
    pub master: String,
    /// Its segments.
    pub segments: Vec<SegmentInfo>,
}

impl Rpc for StoreAbout {
    const OPCODE: Opcode = Opcode::StoreAbout;
    type Response = StoreAboutReply;
}

/// Transfer engine: write the frame's payload (exactly `len` bytes) at
/// the absolute address `addr` of the peer process. The peer refuses it,
/// touching nothing, unless `[addr, addr + len)` lies inside one memory
/// region it registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineWriteReq {
    /// Absolute address in the peer process.
    pub addr: u64,
    /// Bytes to write; must equal the frame's payload length.
    pub len: u64,
}

impl Rpc for EngineWriteReq {
    const OPCODE: Opcode = Opcode::EngineWrite;
    type Response = ();
}

/// Transfer engine: read `len` bytes at the absolute address `addr` of the
/// peer process into the response payload, under the same check as
/// [`EngineWriteReq`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineReadReq {
    /// Absolute address in the peer process.
    pub addr: u64,
    /// Bytes to read.
    pub len: u64,
}

impl Rpc for EngineReadReq {
    const OPCODE: Opcode = Opcode::EngineRead;
    type Response = ();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let m = PutStart {
            client_id: ClientId(u128::MAX - 3),
            op: 1,
            items: vec![PutItem {
                key: "k".repeat(100),
                value_len: 4096,
                region_len: 4200,
            }],
            config: ReplicateConfig {
                replica_num: 2,
                preferred_segments: vec!["a".into()],
                ..Default::default()
            },
            upsert: true,
        };
        assert_eq!(decode::<PutStart>(&encode(&m)).unwrap(), m);
        let r: <PutStart as Rpc>::Response = vec![
            Ok(PutGrant::Write {
                generation: 9,
                replicas: vec![Replica {
                    segment: SegmentId(1 << 100),
                    endpoint: "127.0.0.1:1".into(),
                    offset: 4096,
                    len: 4224,
                    cap: Some(Capability {
                        expires_ms: 1_700_000_000_000,
                        access: Capability::READ | Capability::WRITE,
                        mac: [7; 16],
                    }),
                    tier: Tier::Memory,
                    fence: u64::MAX,
                }],
            }),
            Err(Code::NoAvailableHandle.as_i32()),
        ];
        assert_eq!(
            decode::<<PutStart as Rpc>::Response>(&encode(&r)).unwrap(),
            r
        );
    }

    /// The count read from the front of each batch message is its item
    /// count: a field added before the items must update `batch_len`.
    #[test]
    fn batch_lengths_are_read_without_decoding() {
        fn check<R: Rpc>(m: &R, n: u64) {
            let meta = encode(m);
            assert_eq!(R::batch_len(&meta), Some(n), "{}", R::OPCODE.name());
            assert_eq!(R::batch_len(&[]), None);
        }
        let id = ClientId(u128::MAX - 1);
        let seg = SegmentId(u128::MAX / 3);
        let keys = |n: usize| (0..n).map(|i| format!("key-{i}")).collect::<Vec<_>>();
        for n in [0usize, 1, 127, 128, 300, 20_000] {
            let nn = n as u64;
            check(
                &InvalidateReq {
                    segment: seg,
                    fence: u64::MAX,
                    regions: vec![(u64::MAX, 7); n],
                },
                nn,
            );
            let item = InventoryItem {
                key: "k".into(),
                generation: u64::MAX,
                value_len: 1,
                offset: 2,
                region_len: 3,
            };
            let objects = vec![item; n];
            check(
                &ReportObjects {
                    client_id: id,
                    segment: seg,
                    objects,
                    last: true,
                },
                nn,
            );
            let items = keys(n)
                .into_iter()
                .map(|key| PutItem {
                    key,
                    value_len: 5,
                    region_len: 9,
                })
                .collect();
            let config = ReplicateConfig::default();
            check(
                &PutStart {
                    client_id: id,
                    op: 1,
                    items,
                    config,
                    upsert: true,
                },
                nn,
            );
            let items = keys(n)
                .into_iter()
                .map(|key| PutEndItem { key, generation: 3 })
                .collect();
            check(
                &PutEnd {
                    client_id: id,
                    items,
                },
                nn,
            );
            check(
                &PutRevoke {
                    client_id: id,
                    keys: keys(n),
                },
                nn,
            );
            check(&GetReplicaList { keys: keys(n) }, nn);
            check(
                &ReplicaClear {
                    keys: keys(n),
                    segment: Some("s".into()),
                },
                nn,
            );
            check(&Exist { keys: keys(n) }, nn);
            let items = keys(n)
                .into_iter()
                .map(|key| TouchItem {
                    key,
                    generation: 1,
                    age_us: 2,
                })
                .collect();
            check(&Touch { items }, nn);
            check(
                &Remove {
                    keys: keys(n),
                    force: true,
                },
                nn,
            );
        }
        assert_eq!(Status::batch_len(&encode(&Status {})), None);
    }

    /// A request from a v6 peer (trailer) and one from a v5 peer (none)
    /// both decode, to the same message and the id or none; the released
    /// decoder reads the v6 one as the v5 message.
    #[test]
    fn request_ids_follow_the_message_from_protocol_6() {
        use crate::compat::{append, decode_with};
        let req = ReadReq {
            segment: SegmentId(u128::MAX - 5),
            offset: 1 << 40,
            len: 4096,
            grant: None,
        };
        for (version, id) in [(5, 0), (6, 1), (6, u64::MAX), (7, 42)] {
            let mut buf = encode(&req);
            append(&mut buf, version, &RequestTrailer { id: RequestId(id) });
            let (m, t) = decode_with::<ReadReq, RequestTrailer>(&buf).unwrap();
            assert_eq!((m, t.id), (req, RequestId(id)), "v{version}");
            assert_eq!(decode::<ReadReq>(&buf).unwrap(), req);
        }
        assert_eq!(RequestId(0xab).to_string(), "00000000000000ab");
    }

    #[test]
    fn garbage_is_an_error() {
        let e = decode::<PutStart>(&[0xff; 7]).unwrap_err();
        assert_eq!(e.code, Code::InvalidParams);
    }
}
