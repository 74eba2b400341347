//! The TCP data plane: a server that moves bytes between sockets and segment
//! memory, and the client side that pipelines many region reads and writes on
//! one connection, straight from and into caller memory.
//!
//! A write's payload is read from the socket directly into the segment; a
//! read's payload is written to the socket directly from the segment. Neither
//! side copies through an intermediate buffer (payloads larger than the 64 KiB
//! I/O buffer bypass it).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvpool_format::FIXED_LEN;
use kvpool_net::auth::{Role, Security};
use kvpool_net::capability::{unix_ms, CapabilityKey};
use kvpool_net::conn::FramedConn;
use kvpool_net::server::{reject_and_close, serve_framed};
use kvpool_proto::frame::{FrameHeader, FrameKind, Limits, Opcode};
use kvpool_proto::limits::check_batch;
use kvpool_proto::msg::{
    self, Capability, Grant, InvalidateReq, ReadReq, Rpc, SegmentId, StoreAboutReply, TierMove,
    TierMoveReq, WriteReq,
};
use kvpool_proto::{Code, KvError, KvResult, Plane};
use parking_lot::{Mutex, RwLock};
use std::fs::File;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::disk::{DiskFile, DiskRead};
use crate::fence::{fresh_value, Claim, Fence, SharedFence};
use crate::mapped::MappedRegion;
use crate::metrics::DataMetrics;

/// Requests kept in flight per connection before waiting for a response;
/// bounds what either side must buffer so pipelining can never deadlock.
const WINDOW: usize = 64;

/// The segments a data server serves, by id: memory segments, and the
/// disk-tier segments behind them.
#[derive(Default)]
pub struct SegmentTable {
    map: RwLock<HashMap<SegmentId, Served>>,
    /// What a `StoreAbout` request is answered: the master and the
    /// segments as mounted (kept by the data node that owns the table).
    about: RwLock<StoreAboutReply>,
    disks: RwLock<HashMap<SegmentId, ServedDisk>>,
    /// Shared-memory writers of an earlier fence that were still in their
    /// copies when their segment was mounted again: their regions are held
    /// back from the pool until they finish or die.
    held: Mutex<HashMap<SegmentId, Vec<Claim>>>,
    /// Memory-segment invalidations: a write of a version the master
    /// invalidated is refused (it may still be on its way, or its grant
    /// kept after its object went). Every write looks here.
    revoked: RwLock<Revoked>,
    /// What the server of these segments counts (in the table so every
    /// handler reaches it).
    metrics: Arc<DataMetrics>,
}

/// A memory segment served here.
#[derive(Clone)]
struct Served {
    region: Arc<MappedRegion>,
    /// Start of the object area.
    base: u64,
    fence: Arc<Fence>,
    /// The segment file, for asking the kernel whether its shared-memory
    /// writers are alive; `None` for anonymous memory, which no other
    /// process maps.
    file: Option<Arc<File>>,
}

/// A disk-tier segment served here: its file, the start of its object
/// area, and its fence (tier moves into it are fenced like writes).
type ServedDisk = (Arc<DiskFile>, u64, Arc<Fence>);

/// How long a new mount waits for shared-memory writers of the old fence
/// to finish their copies before holding their regions back: a copy takes
/// microseconds to milliseconds unless its process is paused.
const STALE_WAIT: Duration = Duration::from_millis(200);

/// How long a store remembers an invalidation: well past the master's
/// default pending TTL (60 s), which is how long a write grant lasts.
const REVOKED_FOR: Duration = Duration::from_secs(600);

/// At most this many invalidations are remembered (oldest go first): about
/// 130 bytes each, 34 MiB at most; 10 minutes' worth up to ~440 removals
/// and evictions a second, a grant's lifetime up to ~4,000.
const REVOKED_MAX: usize = 1 << 18;

/// Versions the master invalidated, by region. A writer cut off from the
/// pool (its link down, its process paused) may deliver a put long after
/// the master gave the put up, and a writer may keep its grant after its
/// object was removed; either write must not land, since the region may
/// hold another object by then, and its object must not become findable,
/// or a scan (a restarted store, a new master leader rebuilding from
/// inventories) would bring back a value that was replaced or removed.
#[derive(Default)]
struct Revoked {
    /// `(segment, offset)` to the generations invalidated there.
    at: HashMap<(SegmentId, u64), Vec<u64>>,
    /// In the order they came, to forget the oldest.
    order: VecDeque<(Instant, SegmentId, u64, u64)>,
}

impl Revoked {
    fn insert(&mut self, segment: SegmentId, offset: u64, generation: u64, now: Instant) {
        while self.order.len() >= REVOKED_MAX
            || self
                .order
                .front()
                .is_some_and(|(t, ..)| now.duration_since(*t) > REVOKED_FOR)
        {
            let Some((_, s, o, g)) = self.order.pop_front() else {
                break;
            };
            self.forget(s, o, g);
        }
        self.at
            .entry((segment, offset))
            .or_default()
            .push(generation);
        self.order.push_back((now, segment, offset, generation));
    }

    fn forget(&mut self, segment: SegmentId, offset: u64, generation: u64) {
        if let Some(gens) = self.at.get_mut(&(segment, offset)) {
            gens.retain(|&g| g != generation);
            if gens.is_empty() {
                self.at.remove(&(segment, offset));
            }
        }
    }
}

impl SegmentTable {
    /// The counters of the server of these segments.
    pub fn metrics(&self) -> &Arc<DataMetrics> {
        &self.metrics
    }

    /// Starts serving the disk segment `file` as `id` (object area from
    /// `base`); it takes no writes over the wire, only its store's copies.
    pub fn insert_disk(&self, id: SegmentId, file: Arc<DiskFile>, base: u64) {
        (self.disks.write()).insert(id, (file, base, Arc::default()));
    }

    /// Stops serving the disk segment `id`.
    pub fn remove_disk(&self, id: SegmentId) -> Option<Arc<DiskFile>> {
        self.disks.write().remove(&id).map(|(f, ..)| f)
    }

    /// The disk segment `id`, if served here.
    pub fn get_disk(&self, id: SegmentId) -> Option<(Arc<DiskFile>, u64)> {
        let disks = self.disks.read();
        disks.get(&id).map(|(f, base, _)| (f.clone(), *base))
    }

    /// Where segment `id`'s bytes are, if it is served here.
    fn backing(&self, id: SegmentId) -> Option<Backing> {
        if let Some(s) = self.served(id) {
            return Some(Backing::Memory(s.region, s.base, s.fence));
        }
        let disks = self.disks.read();
        let (f, base, fence) = disks.get(&id)?;
        Some(Backing::Disk(f.clone(), *base, fence.clone()))
    }

    /// Starts serving `region` as `id`; bytes below `base` (the segment's own
    /// superblock) are never written over the wire. It takes no writes
    /// until its first [`Self::refence`].
    pub fn insert(&self, id: SegmentId, region: Arc<MappedRegion>, base: u64) {
        let file = region.path().and_then(|p| File::open(p).ok()).map(Arc::new);
        let fence = Arc::default();
        (self.map.write()).insert(
            id,
            Served {
                region,
                base,
                fence,
                file,
            },
        );
    }

    /// Stops serving `id`.
    pub fn remove(&self, id: SegmentId) -> Option<Arc<MappedRegion>> {
        self.held.lock().remove(&id);
        self.map.write().remove(&id).map(|s| s.region)
    }

    /// The region for `id` and the start of its object area.
    pub fn get(&self, id: SegmentId) -> Option<(Arc<MappedRegion>, u64)> {
        self.served(id).map(|s| (s.region, s.base))
    }

    fn served(&self, id: SegmentId) -> Option<Served> {
        self.map.read().get(&id).cloned()
    }

    /// Starts a new mount of segment `id` (see [`crate::fence`]): a fresh
    /// fence value, from which on nothing granted under an earlier one
    /// lands. Returns the value, and the regions `(offset, len)` to hold
    /// back from the pool: those of shared-memory writers of an earlier
    /// value still in their copies after [`STALE_WAIT`]. Blocks that long
    /// at most; `None` if `id` is not served here.
    pub fn refence(&self, id: SegmentId) -> Option<(u64, Vec<(u64, u64)>)> {
        let Some(s) = self.served(id) else {
            let fence = self.disks.read().get(&id)?.2.clone();
            let value = fresh_value(fence.value());
            fence.set(value);
            return Some((value, Vec::new()));
        };
        let value = fresh_value(s.fence.value());
        s.fence.set(value);
        let (Some(shared), Some(file)) = (SharedFence::new(&s.region), s.file.as_deref()) else {
            return Some((value, Vec::new()));
        };
        shared.publish(value);
        // Writers held back at an earlier mount that finished since left
        // objects the scan after this must not find.
        self.release_finished(id, &s, &shared, file);
        let mut claims = shared.stale(value);
        let until = Instant::now() + STALE_WAIT;
        loop {
            claims.retain(|c| shared.holds(c, file));
            if claims.is_empty() || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let regions = claims.iter().map(|c| (c.offset, c.len)).collect();
        if claims.is_empty() {
            self.held.lock().remove(&id);
        } else {
            tracing::warn!(segment = %id, regions = ?regions, "shared-memory writers of the previous mount are still copying (paused?): their regions are held back until they finish");
            self.held.lock().insert(id, claims);
        }
        Some((value, regions))
    }

    /// The regions still held back, as `(segment, offset, len)` (a store
    /// reports them with every heartbeat; the master releases what is no
    /// longer reported). A writer that finished its copy since has left an
    /// object of a put nobody will commit: it is destroyed first. Also
    /// frees the write slots of writers that died in a copy.
    pub fn held(&self) -> Vec<(SegmentId, u64, u64)> {
        let mut held = self.held.lock();
        let mut out = Vec::new();
        for (id, s) in self.map.read().iter() {
            let (Some(shared), Some(file)) = (SharedFence::new(&s.region), s.file.as_deref())
            else {
                continue;
            };
            if let Some(claims) = held.get_mut(id) {
                retain_holding(claims, s, &shared, file);
                out.extend(claims.iter().map(|c| (*id, c.offset, c.len)));
            }
            let reaped = shared.reap(file);
            if reaped > 0 {
                tracing::info!(segment = %id, reaped, "freed the write slots of shared-memory writers that died mid-copy");
            }
        }
        held.retain(|_, c| !c.is_empty());
        out
    }

    fn release_finished(&self, id: SegmentId, s: &Served, shared: &SharedFence, file: &File) {
        if let Some(claims) = self.held.lock().get_mut(&id) {
            retain_holding(claims, s, shared, file);
        }
    }

    /// Destroys an object that a write just put at `offset` if the master
    /// had already invalidated its version (see [`Revoked`]).
    fn landed(&self, segment: SegmentId, offset: u64, region: &MappedRegion) -> KvResult<()> {
        let destroyed = self
            .revoked
            .read()
            .at
            .get(&(segment, offset))
            .and_then(|gens| {
                gens.iter()
                    .copied()
                    .find(|&g| invalidate_object(region, offset, g))
            });
        let Some(generation) = destroyed else {
            return Ok(());
        };
        self.revoked.write().forget(segment, offset, generation);
        Err(KvError::new(
            Code::TransferFail,
            format!("the put of generation {generation} at {offset} was given up by the master before its bytes arrived"),
        ))
    }

    /// Changes what a `StoreAbout` request is answered.
    pub fn describe(&self, f: impl FnOnce(&mut StoreAboutReply)) {
        f(&mut self.about.write());
    }
}

/// A served segment's bytes, the start of its object area, and its fence.
enum Backing {
    Memory(Arc<MappedRegion>, u64, Arc<Fence>),
    Disk(Arc<DiskFile>, u64, Arc<Fence>),
}

fn not_served(segment: SegmentId) -> KvError {
    KvError::new(
        Code::SegmentNotFound,
        format!("segment {segment} not served here"),
    )
}

/// Checks that `offset+len` lies in the object area `[base, size)`.
fn in_object_area(offset: u64, len: u64, base: u64, size: u64) -> KvResult<()> {
    if offset < base {
        return Err(KvError::new(
            Code::InvalidParams,
            format!("offset {offset} is below the object area at {base}"),
        ));
    }
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(KvError::new(
            Code::InvalidParams,
            format!("range {offset}+{len} outside segment of {size} bytes"),
        ));
    }
    Ok(())
}

/// Turns a disk error into the code callers see (a transfer failure: try
/// another replica).
fn disk_error(e: std::io::Error) -> KvError {
    KvError::new(Code::TransferFail, format!("disk tier: {e}"))
}

/// Checks a write before any of its bytes land: the grant's signature
/// (by `signed`), that the write is one whole object at the start of its
/// granted region, under the segment's current fence, and that no newer
/// object lies there (the grant is stale). Returns the segment.
fn admit_write(
    table: &SegmentTable,
    req: &WriteReq,
    len: u64,
    signed: impl FnOnce() -> KvResult<()>,
) -> KvResult<Served> {
    signed()?;
    let (segment, g) = (req.segment, &req.grant);
    let s = table.served(segment).ok_or_else(|| {
        if table.get_disk(segment).is_some() {
            KvError::new(
                Code::InvalidParams,
                format!("segment {segment} is a disk-tier segment: it takes no writes"),
            )
        } else {
            not_served(segment)
        }
    })?;
    in_object_area(req.offset, len, s.base, s.region.len())?;
    if req.offset != g.offset || len > g.len || len < FIXED_LEN as u64 {
        return Err(KvError::new(
            Code::InvalidParams,
            format!(
                "a write is one whole object at the start of its granted region {}+{}, not {}+{len}",
                g.offset, g.len, req.offset
            ),
        ));
    }
    if !s.fence.admits(g.fence) {
        return Err(refused(&table.metrics, Refusal::Fence, segment, g));
    }
    // A version the master invalidated (see `Revoked`): its region may be
    // another object's by now.
    let revoked = table.revoked.read();
    if (revoked.at.get(&(segment, req.offset))).is_some_and(|gens| gens.contains(&g.generation)) {
        return Err(refused(&table.metrics, Refusal::Invalidated, segment, g));
    }
    drop(revoked);
    let span =
        (s.region.len() - req.offset).min(kvpool_format::header_len(u16::MAX as usize) as u64);
    // SAFETY: in bounds; the region is this grant's alone, so the header
    // there is the previous object's and nobody else's write.
    let there = unsafe { s.region.slice(req.offset, span) };
    if let Some((h, _)) = kvpool_format::scan::header_at(there) {
        if h.generation > g.generation {
            return Err(refused(
                &table.metrics,
                Refusal::Generation(h.generation),
                segment,
                g,
            ));
        }
    }
    Ok(s)
}

/// Why a write was refused by the fence checks.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// Granted under an earlier mount of the segment.
    Fence,
    /// A newer version (this generation) lies in the region.
    Generation(u64),
    /// The payload's header names another version than the grant.
    Header(Option<u64>),
    /// The master invalidated this version (removed, replaced, or given up
    /// before the write came).
    Invalidated,
}

/// Counts and logs a write refused by the fence checks; the error for it,
/// transient (the writer asks the master again).
fn refused(m: &DataMetrics, why: Refusal, segment: SegmentId, g: &Grant) -> KvError {
    let (reason, detail) = match why {
        Refusal::Fence => (
            "fence",
            format!(
                "the segment was mounted again since this grant (fence {:x})",
                g.fence
            ),
        ),
        Refusal::Generation(newer) => (
            "generation",
            format!("region holds a newer object (generation {newer})"),
        ),
        Refusal::Header(named) => (
            "generation",
            format!("the object written names generation {named:?}, not the one granted"),
        ),
        Refusal::Invalidated => (
            "invalidated",
            "the master invalidated this version (removed, replaced or given up)".to_string(),
        ),
    };
    m.write_refused(reason);
    tracing::warn!(%segment, offset = g.offset, generation = g.generation, reason, "{detail}");
    KvError::new(
        Code::TransferFail,
        format!(
            "write of generation {} refused: {detail}; ask the master again",
            g.generation
        ),
    )
}

/// Reads an admitted write's payload into the segment: the object header
/// first, checked to name the granted version, then the rest, every read
/// inside the segment's fence. A write refused midway has its payload read
/// to the end and is answered `Ok(Err(..))`; `Err` is a broken connection.
async fn write_object(
    conn: &mut FramedConn,
    table: &SegmentTable,
    s: &Served,
    req: &WriteReq,
    len: u64,
) -> KvResult<KvResult<()>> {
    let g = &req.grant;
    let mut head = [0u8; FIXED_LEN];
    conn.read_payload(&mut head).await?;
    let named = kvpool_format::scan::fixed_generation(&head);
    if named != Some(g.generation) {
        conn.discard_payload(len - FIXED_LEN as u64).await?;
        let why = Refusal::Header(named);
        return Ok(Err(refused(&table.metrics, why, req.segment, g)));
    }
    // SAFETY: range checked by admit_write; the master gave this region to
    // this grant alone, and every write into it happens inside the fence.
    let dst = unsafe { s.region.slice_mut(req.offset, len) };
    let landed = s
        .fence
        .enter(g.fence)
        .map(|_inside| dst[..FIXED_LEN].copy_from_slice(&head));
    if landed.is_none() {
        conn.discard_payload(len - FIXED_LEN as u64).await?;
    }
    let rest = &mut dst[FIXED_LEN..];
    if landed.is_none()
        || !conn
            .read_payload_fenced(rest, || s.fence.enter(g.fence))
            .await?
    {
        return Ok(Err(refused(&table.metrics, Refusal::Fence, req.segment, g)));
    }
    Ok(table.landed(req.segment, req.offset, &s.region))
}

/// Keeps the claims whose writers still copy; destroys what the others
/// left (a put of an earlier mount, which nobody will commit).
fn retain_holding(claims: &mut Vec<Claim>, s: &Served, shared: &SharedFence, file: &File) {
    claims.retain(|c| {
        let keep = shared.holds(c, file);
        if !keep {
            destroy_any(&s.region, c.offset);
        }
        keep
    });
}

/// Destroys whatever object starts at `offset` of `region` (one no
/// master will ever point to).
fn destroy_any(region: &MappedRegion, offset: u64) {
    if !region.contains(offset, FIXED_LEN as u64) {
        return;
    }
    // SAFETY: in bounds (checked above); the region is held back from the
    // pool, so nothing else writes it.
    let head = unsafe { region.slice(offset, FIXED_LEN as u64) };
    if let Some(generation) = kvpool_format::scan::fixed_generation(head) {
        invalidate_object(region, offset, generation);
    }
}

/// Reads `len` bytes at `offset` of `segment`: a region of mapped memory,
/// or a read of a disk segment, queued now for its I/O threads.
fn read_for(table: &SegmentTable, segment: SegmentId, offset: u64, len: u64) -> KvResult<Reply> {
    match table.backing(segment).ok_or_else(|| not_served(segment))? {
        Backing::Memory(region, base, _) => {
            in_object_area(offset, len, base, region.len())?;
            Ok(Reply::Region(region, offset, len))
        }
        Backing::Disk(file, base, _) => {
            in_object_area(offset, len, base, file.len())?;
            let read = file.submit(move |f| f.read(offset, len));
            Ok(Reply::Reading(
                Box::pin(async move {
                    read.await
                        .map_err(|e| KvError::new(Code::InternalError, e.to_string()))?
                        .map_err(disk_error)
                }),
                len,
            ))
        }
    }
}

/// Serves reads and writes of `table`'s segments until `shutdown`,
/// authenticating peers under `security`; with a key, a client's read or
/// write must carry the master's grant for it. A request being served when
/// the token fires is finished first.
pub async fn serve_data(
    listener: TcpListener,
    table: Arc<SegmentTable>,
    limits: Limits,
    security: Security,
    shutdown: CancellationToken,
) {
    let grants = (security.credentials.as_ref())
        .and_then(CapabilityKey::new)
        .map(Arc::new);
    #[cfg(feature = "planted-bugs")]
    kvpool_net::planted::announce();
    serve_framed(
        listener,
        "store",
        limits,
        security,
        shutdown,
        move |mut conn, token| {
            let table = table.clone();
            let grants = grants.clone();
            async move {
                let m = table.metrics.clone();
                m.connections_accepted.inc();
                m.connections_open.inc();
                if let Err(e) = data_conn(&mut conn, &table, grants.as_deref(), &token).await {
                    debug!(peer = conn.peer(), error = %e, "data connection closed");
                }
                m.connections_open.dec();
            }
        },
    )
    .await;
}

/// Requests one connection takes ahead while the oldest waits on the
/// disk, so a batch's disk reads reach the I/O threads together rather
/// than one after another.
const READ_AHEAD: usize = WINDOW;

/// Bytes of disk reads one connection keeps pending at most: their
/// buffers are held until sent.
const READ_AHEAD_BYTES: u64 = 4 << 20;

/// A request whose answer is not sent yet.
struct Answer {
    h: FrameHeader,
    t0: Instant,
    reply: KvResult<Reply>,
    /// Bytes of disk read it holds (or will).
    held: u64,
}

impl Answer {
    /// Whether it can be sent without waiting on the disk. Polls a pending
    /// read once; its waker is not kept (a later [`Self::wait`] polls again).
    fn ready(&mut self) -> bool {
        let Ok(Reply::Reading(read, _)) = &mut self.reply else {
            return true;
        };
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match read.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => {
                self.reply = r.map(Reply::Disk);
                true
            }
            std::task::Poll::Pending => false,
        }
    }

    /// Waits for its disk read, if it has one still pending.
    async fn wait(&mut self) {
        if let Ok(Reply::Reading(read, _)) = &mut self.reply {
            let r = read.await;
            self.reply = r.map(Reply::Disk);
        }
    }
}

/// Serves one connection. Answers leave in request order; while the oldest
/// waits on the disk, requests already pipelined behind it are taken (up
/// to [`READ_AHEAD`]), so their disk reads run meanwhile.
async fn data_conn(
    conn: &mut FramedConn,
    table: &SegmentTable,
    grants: Option<&CapabilityKey>,
    shutdown: &CancellationToken,
) -> KvResult<()> {
    let mut answers: VecDeque<Answer> = VecDeque::new();
    let mut held = 0u64;
    loop {
        let full = answers.len() >= READ_AHEAD || held >= READ_AHEAD_BYTES;
        if let Some(front) = answers.front_mut() {
            if front.ready() {
                let a = answers.pop_front().expect("a front answer");
                held -= a.held;
                respond(conn, table, a).await?;
                if answers.is_empty() {
                    conn.flush_if_idle().await?;
                }
                continue;
            }
            if full || !conn.has_buffered_input() {
                // Nothing to take meanwhile: what is sent leaves now.
                conn.flush().await?;
                front.wait().await;
                continue;
            }
        }
        // Only the wait for a new request with nothing left to answer is
        // cancellable: a request already started runs to completion so a
        // writer never sees a half-ack.
        let h = if answers.is_empty() {
            tokio::select! {
                _ = shutdown.cancelled() => return conn.flush().await,
                h = conn.next_request() => h,
            }
        } else {
            conn.next_request().await
        };
        let h = match h {
            Ok(Some(h)) => h,
            Ok(None) if answers.is_empty() => return Ok(()),
            Ok(None) => {
                // The peer finished sending: answer what it asked.
                while let Some(a) = answers.pop_front() {
                    respond(conn, table, a).await?;
                }
                return conn.flush().await;
            }
            Err(e) => return reject_and_close(conn, e).await,
        };
        let a = handle(conn, table, grants, h).await?;
        held += a.held;
        answers.push_back(a);
    }
}

/// Handles one request whose header was read: reads its message (and a
/// write's payload, into the segment) and works out its answer; a disk
/// read is queued for the I/O threads and answered later.
async fn handle(
    conn: &mut FramedConn,
    table: &SegmentTable,
    grants: Option<&CapabilityKey>,
    h: FrameHeader,
) -> KvResult<Answer> {
    let t0 = Instant::now();
    let peer_role = conn.peer_role();
    // Stores and the master hold the key grants are signed with; a
    // client may touch only what the master granted it.
    let check = |access, segment, grant: Option<&Grant>, range| match grants {
        Some(key) if peer_role < Role::Store => key.check(access, segment, grant, range, unix_ms()),
        _ => Ok(()),
    };
    let meta = conn.read_meta(h.meta_len).await?;
    let admitted = match h.kind {
        FrameKind::Request => h.opcode.admit(Plane::Data, peer_role),
        FrameKind::Response => Err(KvError::new(
            Code::InvalidParams,
            "expected a request frame",
        )),
    };
    let reply = match (admitted, h.opcode) {
        (Err(e), _) => Err(e),
        (Ok(()), Opcode::Write) => {
            match msg::decode::<WriteReq>(meta).and_then(|req| {
                let range = (req.offset, h.payload_len);
                let signed = || check(Capability::WRITE, req.segment, Some(&req.grant), range);
                admit_write(table, &req, h.payload_len, signed).map(|s| (s, req))
            }) {
                Ok((s, req)) => match write_object(conn, table, &s, &req, h.payload_len).await? {
                    Ok(()) => Ok(Reply::Ack),
                    Err(e) => Ok(Reply::Refused(e)),
                },
                Err(e) => Err(e),
            }
        }
        (Ok(()), _) if h.payload_len != 0 => Err(KvError::new(
            Code::InvalidParams,
            "only writes carry a payload",
        )),
        (Ok(()), Opcode::Read) => msg::decode::<ReadReq>(meta).and_then(|req| {
            let range = (req.offset, req.len);
            check(Capability::READ, req.segment, req.grant.as_ref(), range)?;
            read_for(table, req.segment, req.offset, req.len)
        }),
        (Ok(()), Opcode::StoreAbout) => msg::decode::<msg::StoreAbout>(meta)
            .map(|_| Reply::Message(msg::encode(&*table.about.read()))),
        (Ok(()), Opcode::TierMove) => {
            let req = TierMoveReq::batch_len(meta)
                .map_or(Ok(()), |n| check_batch("TierMove", n))
                .and_then(|()| msg::decode::<TierMoveReq>(meta));
            match req {
                Ok(req) => Ok(Reply::Message(msg::encode(&tier_moves(table, req).await))),
                Err(e) => Err(e),
            }
        }
        // More regions than a batch may carry are refused before decoding.
        (Ok(()), Opcode::Invalidate) => InvalidateReq::batch_len(meta)
            .map_or(Ok(()), |n| check_batch("Invalidate", n))
            .and_then(|()| msg::decode::<InvalidateReq>(meta))
            .and_then(|req| invalidate(table, req)),
        // `admit` refused every other plane's request.
        (Ok(()), op) => Err(KvError::new(
            Code::NotSupported,
            format!("{} is not served by the data plane", op.name()),
        )),
    };
    if reply.is_err() {
        // A refused request's payload is still on the wire: skip it.
        conn.discard_payload(h.payload_len).await?;
    }
    let held = match &reply {
        Ok(Reply::Reading(_, len)) => *len,
        _ => 0,
    };
    Ok(Answer { h, t0, reply, held })
}

/// Sends one answer, once its disk read (or its message) is done.
async fn respond(conn: &mut FramedConn, table: &SegmentTable, mut a: Answer) -> KvResult<()> {
    a.wait().await;
    let (bytes, error) = outcome(&a.h, &a.reply);
    let h = &a.h;
    match a.reply {
        Ok(Reply::Ack) => conn.send_response(h, &[], &[]).await?,
        Ok(Reply::Refused(e)) => conn.send_error(h, &e).await?,
        Ok(Reply::Region(region, offset, len)) => {
            // SAFETY: range checked by read_for.
            let src = unsafe { region.slice(offset, len) };
            conn.send_response(h, &[], &[src]).await?;
        }
        Ok(Reply::Disk(read)) => conn.send_response(h, &[], &[read.bytes()]).await?,
        Ok(Reply::Pending(answer)) => {
            let m = answer.await;
            conn.send_response(h, &m, &[]).await?;
        }
        Ok(Reply::Message(m)) => conn.send_response(h, &m, &[]).await?,
        // `wait` finished it.
        Ok(Reply::Reading(..)) => {
            conn.send_error(h, &KvError::from(Code::InternalError))
                .await?
        }
        Err(e) => conn.send_error(h, &e).await?,
    }
    (table.metrics).served(h.opcode, bytes, a.t0.elapsed(), error);
    Ok(())
}

/// Work an answer still waits on (disk I/O).
type Boxed<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// How the data plane answers a request that succeeded.
enum Reply {
    /// A write landed: an empty response.
    Ack,
    /// A write landed but was refused after (its payload is read).
    Refused(KvError),
    /// The bytes of a region (offset, length), sent straight from segment memory.
    Region(Arc<MappedRegion>, u64, u64),
    /// Bytes read from a disk segment.
    Disk(DiskRead),
    /// A disk read queued for the I/O threads, of this many bytes.
    Reading(Boxed<KvResult<DiskRead>>, u64),
    /// An encoded response message.
    Message(Vec<u8>),
    /// An encoded response message still being worked out (disk I/O).
    Pending(Boxed<Vec<u8>>),
}

/// The payload bytes a request moved and the code it failed with, for
/// [`DataMetrics::served`].
fn outcome(h: &FrameHeader, reply: &KvResult<Reply>) -> (u64, Option<Code>) {
    match reply {
        Ok(Reply::Ack) => (h.payload_len, None),
        Ok(Reply::Region(_, _, len)) => (*len, None),
        Ok(Reply::Disk(read)) => (read.bytes().len() as u64, None),
        Ok(Reply::Refused(e)) => (h.payload_len, Some(e.code)),
        Ok(_) => (0, None),
        Err(e) => (0, Some(e.code)),
    }
}

/// Destroys the objects `req` names, on memory at once or on disk by its
/// I/O threads; answers how many were destroyed.
fn invalidate(table: &SegmentTable, req: InvalidateReq) -> KvResult<Reply> {
    let m = table.metrics.clone();
    m.invalidations_received.inc_by(req.regions.len() as u64);
    let refused = || {
        m.invalidations_refused.inc();
        tracing::warn!(segment = %req.segment, fence = req.fence, regions = req.regions.len(),
            "invalidations from before the segment's last mount refused");
        KvError::new(
            Code::TransferFail,
            format!(
                "the segment was mounted again since these invalidations (fence {:x})",
                req.fence
            ),
        )
    };
    Ok(
        match table
            .backing(req.segment)
            .ok_or_else(|| not_served(req.segment))?
        {
            Backing::Memory(region, _, fence) => {
                // Held across the destruction: a remount (and the scan of
                // its inventory) waits for it, or it waits for the remount
                // and is refused.
                let _inside = fence.enter(req.fence).ok_or_else(refused)?;
                let now = Instant::now();
                // Under the lock a write checks after it lands (see
                // `SegmentTable::landed`): either this finds the object, or
                // the write finds this.
                let mut revoked = table.revoked.write();
                let mut n = 0u64;
                for &(off, gen) in &req.regions {
                    if invalidate_object(&region, off, gen) {
                        n += 1;
                    }
                    if region.contains(off, FIXED_LEN as u64) {
                        revoked.insert(req.segment, off, gen, now);
                    }
                }
                m.invalidations_applied.inc_by(n);
                Reply::Message(msg::encode(&n))
            }
            Backing::Disk(_, _, fence) if !fence.admits(req.fence) => return Err(refused()),
            Backing::Disk(file, ..) => Reply::Pending(Box::pin(async move {
                let n = file
                    .submit(move |f| f.invalidate_all(&req.regions) as u64)
                    .await
                    .unwrap_or(0);
                m.invalidations_applied.inc_by(n);
                msg::encode(&n)
            })),
        },
    )
}

/// Copies of one request queued at once for the disk's I/O threads: the
/// master keeps a few requests in flight, which keeps the device busy, and
/// clients' reads queued meanwhile wait behind a few copies, not a batch.
const MOVES_AT_ONCE: usize = 8;

/// Runs a batch of copies between this store's segments, several at a
/// time on the disk side's I/O threads; one code per move (0: copied).
async fn tier_moves(table: &SegmentTable, req: TierMoveReq) -> Vec<i32> {
    let mut out = Vec::with_capacity(req.moves.len());
    for group in req.moves.chunks(MOVES_AT_ONCE) {
        let mut jobs = Vec::with_capacity(group.len());
        for &m in group {
            let (from, to) = (table.backing(m.from), table.backing(m.to));
            let promote = matches!(from, Some(Backing::Disk(..)));
            let disk = [&from, &to].into_iter().find_map(|b| match b {
                Some(Backing::Disk(f, ..)) => Some(f.clone()),
                _ => None,
            });
            let job: Boxed<_> = match disk {
                Some(f) => Box::pin(f.submit(move |_| tier_move(from, to, &m))),
                // No disk side: refused without I/O.
                None => Box::pin(std::future::ready(Ok(tier_move(from, to, &m)))),
            };
            jobs.push((job, promote));
        }
        for (j, promote) in jobs {
            let code = match j.await {
                Ok(Ok(())) => Code::Ok,
                Ok(Err(e)) => {
                    debug!(error = %e, "tier move failed");
                    e.code
                }
                Err(_) => Code::InternalError,
            };
            table.metrics.tier_move(promote, code);
            out.push(code.as_i32());
        }
    }
    out
}

/// Copies one object between a memory and a disk segment of this store,
/// checking first that the source still holds that generation. The copy's
/// header is written last on either side.
fn tier_move(from: Option<Backing>, to: Option<Backing>, m: &TierMove) -> KvResult<()> {
    let gone = || KvError::new(Code::SegmentNotFound, "segment not served here");
    let (from, to) = (from.ok_or_else(gone)?, to.ok_or_else(gone)?);
    let gone_stale = || {
        KvError::new(
            Code::ObjectNotFound,
            format!(
                "no object of generation {} at {}",
                m.generation, m.from_offset
            ),
        )
    };
    // The whole copy is verified (header, generation, checksum) before it is
    // made durable: an object rewritten during the copy is refused, never torn.
    let holds = |bytes: &[u8]| kvpool_format::scan::intact(bytes, m.generation);
    // A move planned by a leader before the destination's last mount is
    // refused (that leader's regions are not the new one's).
    let refenced = || {
        KvError::new(
            Code::TransferFail,
            format!(
                "the segment was mounted again since this move (fence {:x})",
                m.fence
            ),
        )
    };
    match (from, to) {
        (Backing::Memory(src, sb, _), Backing::Disk(dst, db, fence)) => {
            in_object_area(m.from_offset, m.len, sb, src.len())?;
            in_object_area(m.to_offset, m.len, db, dst.len())?;
            // SAFETY: in range (checked above); the master froze this object
            // for the move (no writer owns its region).
            let bytes = unsafe { src.slice(m.from_offset, m.len) };
            let _inside = fence.enter(m.fence).ok_or_else(refenced)?;
            match dst.write_object(m.to_offset, bytes, holds) {
                Ok(true) => Ok(()),
                Ok(false) => Err(gone_stale()),
                Err(e) => Err(disk_error(e)),
            }
        }
        (Backing::Disk(src, sb, _), Backing::Memory(dst, db, fence)) => {
            in_object_area(m.from_offset, m.len, sb, src.len())?;
            in_object_area(m.to_offset, m.len, db, dst.len())?;
            let read = src.read(m.from_offset, m.len).map_err(disk_error)?;
            let bytes = read.bytes();
            if !holds(bytes) {
                return Err(gone_stale());
            }
            let _inside = fence.enter(m.fence).ok_or_else(refenced)?;
            // SAFETY: in range (checked above); the master reserved this
            // region for the move alone.
            let out = unsafe { dst.slice_mut(m.to_offset, m.len) };
            // Header last: a torn copy fails its header check on a scan.
            let split = FIXED_LEN.min(bytes.len());
            out[split..].copy_from_slice(&bytes[split..]);
            out[..split].copy_from_slice(&bytes[..split]);
            Ok(())
        }
        _ => Err(KvError::new(
            Code::InvalidParams,
            "a tier move goes between a memory and a disk segment",
        )),
    }
}

/// Destroys the object at `offset` of `region` if its header still carries
/// `generation` (see `kvpool_format::scan::invalidate`); false when there is
/// no such object or the offset is out of range.
pub fn invalidate_object(region: &MappedRegion, offset: u64, generation: u64) -> bool {
    if !region.contains(offset, FIXED_LEN as u64) {
        return false;
    }
    // SAFETY: in bounds (checked above). Only the magic is written: a
    // concurrent writer of a new object here rewrites the whole header after
    // this, and a reader of the old object then fails its header check.
    let header = unsafe { region.slice_mut(offset, FIXED_LEN as u64) };
    kvpool_format::scan::invalidate(header, generation)
}

/// One region write: the concatenation of `parts` goes to `req`'s region.
pub struct WriteOp<'a> {
    /// Where to write.
    pub req: WriteReq,
    /// Bytes to write, in order (e.g. object header, then the caller's value).
    pub parts: Vec<&'a [u8]>,
}

/// One region read: `req.len` bytes scattered over `dst`, in order.
pub struct ReadOp<'a> {
    /// What to read.
    pub req: ReadReq,
    /// Destination buffers; their lengths must add up to `req.len`.
    pub dst: Vec<&'a mut [u8]>,
}

/// Pipelines `ops` on `conn`. The outer error means the connection broke and
/// must be dropped (no item's outcome is known); otherwise one result per op.
pub async fn write_regions(
    conn: &mut FramedConn,
    ops: &[WriteOp<'_>],
) -> KvResult<Vec<KvResult<()>>> {
    let mut ids = Vec::with_capacity(ops.len());
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        if ids.len() - results.len() == WINDOW {
            conn.flush().await?;
            results.push(read_ack(conn, ids[results.len()]).await?);
        }
        ids.push(conn.send_request(&op.req, &op.parts).await?);
    }
    conn.flush().await?;
    while results.len() < ids.len() {
        results.push(read_ack(conn, ids[results.len()]).await?);
    }
    Ok(results)
}

/// Reads a response with no payload; an error status is a per-item result.
async fn read_ack(conn: &mut FramedConn, id: u64) -> KvResult<KvResult<()>> {
    match conn.read_response(id).await {
        Ok(h) if h.meta_len == 0 && h.payload_len == 0 => Ok(Ok(())),
        Ok(_) => Err(KvError::new(Code::RpcFail, "unexpected bytes in write ack")),
        Err(e) if e.code == Code::RpcFail => Err(e),
        Err(e) => Ok(Err(e)),
    }
}

/// Pipelines `ops` on `conn` alone, filling each op's buffers, in order.
/// Same error contract as [`write_regions`].
pub async fn read_regions(
    conn: &mut FramedConn,
    ops: Vec<ReadOp<'_>>,
) -> KvResult<Vec<KvResult<()>>> {
    let queue = Mutex::new(ops.into_iter().map(|op| ((), op)).collect());
    match read_regions_shared(conn, &queue).await {
        (_, Some(e)) => Err(e),
        (done, None) => Ok(done.into_iter().map(|(_, _, r)| r).collect()),
    }
}

/// Bytes one connection keeps requested ahead when it shares a batch of
/// reads with other connections: enough to keep the stream full, little
/// enough that a connection running ahead takes what the others have not.
const SHARED_AHEAD: u64 = 1 << 20;

/// Pipelines reads taken one at a time from `queue`, which other
/// connections to the same store take from too, so a faster connection
/// does more of the batch and none idles while another still has a tail.
/// Returns each op taken, with its tag and result. If the connection broke,
/// the ops it had in flight fail with that error (the rest stay queued) and
/// the error is returned too: drop the connection.
pub async fn read_regions_shared<'a, T>(
    conn: &mut FramedConn,
    queue: &Mutex<VecDeque<(T, ReadOp<'a>)>>,
) -> (Vec<(T, ReadOp<'a>, KvResult<()>)>, Option<KvError>) {
    let mut done = Vec::new();
    let mut inflight: VecDeque<(u64, T, ReadOp<'a>)> = VecDeque::new();
    let mut ahead = 0u64;
    let broke = 'conn: loop {
        // Bounded in count too: requests must fit the peer's receive buffer
        // while this side is not reading, or both would wait forever.
        while inflight.is_empty() || (ahead < SHARED_AHEAD && inflight.len() < WINDOW) {
            let Some((tag, op)) = queue.lock().pop_front() else {
                break;
            };
            if op.dst.iter().map(|d| d.len() as u64).sum::<u64>() != op.req.len {
                let e = KvError::new(
                    Code::InvalidParams,
                    "read buffers do not match the read length",
                );
                done.push((tag, op, Err(e)));
                continue;
            }
            match conn.send_request(&op.req, &[]).await {
                Ok(id) => {
                    ahead += op.req.len;
                    inflight.push_back((id, tag, op));
                }
                Err(e) => {
                    done.push((tag, op, Err(e.clone())));
                    break 'conn e;
                }
            }
        }
        let Some((id, tag, mut op)) = inflight.pop_front() else {
            return (done, None);
        };
        ahead -= op.req.len;
        let r = async {
            conn.flush().await?;
            let h = conn.read_response(id).await?;
            if h.meta_len != 0 || h.payload_len != op.req.len {
                return Err(KvError::new(
                    Code::RpcFail,
                    "read response of the wrong length",
                ));
            }
            for d in op.dst.iter_mut() {
                conn.read_payload(d).await?;
            }
            Ok(())
        }
        .await;
        match r {
            // A broken stream (not an error response) fails the rest.
            Err(e) if e.code == Code::RpcFail => {
                done.push((tag, op, Err(e.clone())));
                break e;
            }
            r => done.push((tag, op, r)),
        }
    };
    for (_, tag, op) in inflight {
        done.push((tag, op, Err(broke.clone())));
    }
    (done, Some(broke))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpool_net::conn::accept;

    /// The object `key` of version `generation` holding `value`: header and value.
    fn object(key: &str, generation: u64, value: &[u8]) -> Vec<u8> {
        let mut o = kvpool_format::ObjectHeader {
            key: key.into(),
            value_len: value.len() as u64,
            generation,
            checksum: kvpool_format::value_checksum(&[value]),
        }
        .encode();
        o.extend_from_slice(value);
        o
    }

    /// A write of the object `o` at `offset` of segment 7, granted under `fence`.
    fn write_op(offset: u64, generation: u64, fence: u64, o: &[u8]) -> WriteOp<'_> {
        let grant = Grant {
            offset,
            len: o.len() as u64,
            generation,
            fence,
            cap: None,
        };
        WriteOp {
            req: WriteReq {
                segment: SegmentId(7),
                offset,
                grant,
            },
            parts: vec![o],
        }
    }

    /// Segment 7's current fence in `table`.
    fn fence(table: &SegmentTable) -> u64 {
        table.served(SegmentId(7)).unwrap().fence.value()
    }

    async fn server() -> (String, Arc<SegmentTable>, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let table = Arc::new(SegmentTable::default());
        table.insert(
            SegmentId(7),
            Arc::new(MappedRegion::anonymous(1 << 20).unwrap()),
            0,
        );
        table.refence(SegmentId(7)).unwrap();
        let token = CancellationToken::new();
        tokio::spawn(serve_data(
            listener,
            table.clone(),
            Limits::default(),
            Security::default(),
            token.clone(),
        ));
        (addr, table, token)
    }

    #[tokio::test]
    async fn pipelined_writes_and_reads_round_trip() {
        let (addr, table, token) = server().await;
        let mut c = FramedConn::connect(&addr, "test", Limits::default())
            .await
            .unwrap();
        let values: Vec<Vec<u8>> = (0..200u32)
            .map(|i| object("k", i as u64 + 1, &vec![i as u8; 100 + i as usize]))
            .collect();
        let f = fence(&table);
        let writes: Vec<WriteOp> = values
            .iter()
            .enumerate()
            .map(|(i, v)| write_op(i as u64 * 512, i as u64 + 1, f, v))
            .collect();
        let r = write_regions(&mut c, &writes).await.unwrap();
        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
        let mut heads = vec![[0u8; 2]; values.len()];
        let mut bodies: Vec<Vec<u8>> = values.iter().map(|v| vec![0; v.len() - 2]).collect();
        let reads: Vec<ReadOp> = heads
            .iter_mut()
            .zip(bodies.iter_mut())
            .enumerate()
            .map(|(i, (h, b))| ReadOp {
                req: ReadReq {
                    segment: SegmentId(7),
                    offset: i as u64 * 512,
                    len: 2 + b.len() as u64,
                    grant: None,
                },
                dst: vec![&mut h[..], &mut b[..]],
            })
            .collect();
        let r = read_regions(&mut c, reads).await.unwrap();
        assert!(r.iter().all(|r| r.is_ok()));
        assert!(heads.iter().all(|h| h == b"KV"));
        for (b, v) in bodies.iter().zip(&values) {
            assert_eq!(b[..], v[2..]);
        }

        // Two connections sharing one queue read every op exactly once.
        let mut whole: Vec<Vec<u8>> = values.iter().map(|v| vec![0; v.len()]).collect();
        let queue = Mutex::new(
            whole
                .iter_mut()
                .enumerate()
                .map(|(i, b)| {
                    let req = ReadReq {
                        segment: SegmentId(7),
                        offset: i as u64 * 512,
                        len: b.len() as u64,
                        grant: None,
                    };
                    (
                        i,
                        ReadOp {
                            req,
                            dst: vec![&mut b[..]],
                        },
                    )
                })
                .collect(),
        );
        let mut d = FramedConn::connect(&addr, "test", Limits::default())
            .await
            .unwrap();
        let ((a, ea), (b, eb)) = tokio::join!(
            read_regions_shared(&mut c, &queue),
            read_regions_shared(&mut d, &queue)
        );
        assert!(ea.is_none() && eb.is_none());
        assert!(a.iter().chain(&b).all(|(_, _, r)| r.is_ok()));
        let mut seen: Vec<usize> = a.iter().chain(&b).map(|(i, _, _)| *i).collect();
        seen.sort();
        assert_eq!(seen, (0..values.len()).collect::<Vec<_>>());
        drop((a, b));
        assert_eq!(whole, values);

        token.cancel();

        // A connection that breaks fails what it took and leaves the rest:
        // this peer shakes hands, then hangs up.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hangs_up = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            accept(stream, "test", Limits::default(), &Security::default()).await;
        });
        let mut c = FramedConn::connect(&hangs_up, "test", Limits::default())
            .await
            .unwrap();
        let mut bufs = vec![vec![0u8; 600]; 8];
        let queue = Mutex::new(
            bufs.iter_mut()
                .map(|b| {
                    let req = ReadReq {
                        segment: SegmentId(7),
                        offset: 0,
                        len: 600,
                        grant: None,
                    };
                    (
                        (),
                        ReadOp {
                            req,
                            dst: vec![&mut b[..]],
                        },
                    )
                })
                .collect(),
        );
        let (taken, broke) = read_regions_shared(&mut c, &queue).await;
        assert!(broke.is_some(), "the server is gone");
        assert!(taken.iter().all(|(_, _, r)| r.is_err()));
        assert_eq!(taken.len() + queue.lock().len(), 8);
    }

    #[tokio::test]
    async fn bad_requests_get_errors_and_the_connection_survives() {
        let (addr, table, token) = server().await;
        let mut c = FramedConn::connect(&addr, "test", Limits::default())
            .await
            .unwrap();
        let big = object("k", 1, &[1u8; 4000]);
        let f = fence(&table);
        let mut elsewhere = write_op(0, 1, f, &big);
        elsewhere.req.segment = SegmentId(8);
        let writes = [
            write_op((1 << 20) - 10, 1, f, &big),
            elsewhere,
            write_op(0, 1, f, &big),
        ];
        let r = write_regions(&mut c, &writes).await.unwrap();
        assert_eq!(r[0].as_ref().unwrap_err().code, Code::InvalidParams);
        assert_eq!(r[1].as_ref().unwrap_err().code, Code::SegmentNotFound);
        assert!(r[2].is_ok());
        let mut buf = vec![0u8; big.len()];
        let reads = vec![ReadOp {
            req: ReadReq {
                segment: SegmentId(7),
                offset: 0,
                len: big.len() as u64,
                grant: None,
            },
            dst: vec![&mut buf[..]],
        }];
        assert!(read_regions(&mut c, reads).await.unwrap()[0].is_ok());
        assert_eq!(buf, big);
        token.cancel();
    }

    #[tokio::test]
    async fn invalidate_destroys_only_the_named_generation() {
        let (addr, table, token) = server().await;
        let (region, _) = table.get(SegmentId(7)).unwrap();
        let value = b"value";
        let head = kvpool_format::ObjectHeader {
            key: "k".into(),
            value_len: value.len() as u64,
            generation: 3,
            checksum: kvpool_format::value_checksum(&[value]),
        }
        .encode();
        for offset in [0, 4096] {
            // SAFETY: in bounds; nothing else touches these bytes yet.
            let dst = unsafe { region.slice_mut(offset, (head.len() + value.len()) as u64) };
            dst[..head.len()].copy_from_slice(&head);
            dst[head.len()..].copy_from_slice(value);
        }
        let mut c = FramedConn::connect(&addr, "test", Limits::default())
            .await
            .unwrap();
        // Decided under an earlier mount (a deposed leader): refused, and
        // nothing destroyed.
        let stale = InvalidateReq {
            segment: SegmentId(7),
            fence: fence(&table) ^ 1,
            regions: vec![(0, 3), (4096, 2), (1 << 20, 3)],
        };
        assert_eq!(c.call(&stale).await.unwrap_err().code, Code::TransferFail);
        let req = InvalidateReq {
            fence: fence(&table),
            ..stale
        };
        assert_eq!(c.call(&req).await.unwrap(), 1);
        // SAFETY: in bounds.
        let (found, _) = kvpool_format::scan::scan(unsafe { region.slice(0, region.len()) }, 0);
        assert_eq!(found.iter().map(|f| f.offset).collect::<Vec<_>>(), [4096]);
        let unknown = InvalidateReq {
            segment: SegmentId(8),
            fence: 1,
            regions: vec![(0, 3)],
        };
        assert_eq!(
            c.call(&unknown).await.unwrap_err().code,
            Code::SegmentNotFound
        );
        token.cancel();
    }

    #[tokio::test]
    async fn a_write_that_comes_after_its_invalidation_is_refused() {
        // A writer cut off from the pool has its frames delivered after the
        // master gave its put up and invalidated the region: the region may
        // hold another object by then, and the object it writes must not be
        // found by a later scan (a new leader would take it back from the
        // inventory, long after the key was removed).
        let (addr, table, token) = server().await;
        let (region, _) = table.get(SegmentId(7)).unwrap();
        let value = b"late value";
        let head = |generation| {
            kvpool_format::ObjectHeader {
                key: "k".into(),
                value_len: value.len() as u64,
                generation,
                checksum: kvpool_format::value_checksum(&[value]),
            }
            .encode()
        };
        let mut c = FramedConn::connect(&addr, "test", Limits::default())
            .await
            .unwrap();
        let req = InvalidateReq {
            segment: SegmentId(7),
            fence: fence(&table),
            regions: vec![(0, 3), (4096, 3)],
        };
        assert_eq!(c.call(&req).await.unwrap(), 0, "nothing written yet");
        let (late, other) = (head(3), head(4));
        let f = fence(&table);
        let writes = [(0, &late, 3), (4096, &other, 4)].map(|(offset, h, generation)| {
            let mut op = write_op(offset, generation, f, h);
            op.req.grant.len += value.len() as u64;
            op.parts.push(&value[..]);
            op
        });
        let r = write_regions(&mut c, &writes).await.unwrap();
        assert_eq!(r[0].as_ref().unwrap_err().code, Code::TransferFail);
        assert!(r[1].is_ok(), "another version in the same region is kept");
        // Refused before a byte landed: the region may be another object's.
        // SAFETY: in bounds.
        assert!(unsafe { region.slice(0, 4096) }.iter().all(|&b| b == 0));
        // SAFETY: in bounds.
        let (found, _) = kvpool_format::scan::scan(unsafe { region.slice(0, region.len()) }, 0);
        assert_eq!(
            found
                .iter()
                .map(|f| (f.offset, f.generation))
                .collect::<Vec<_>>(),
            [(4096, 4)]
        );
        // A grant kept after its object was destroyed writes nothing again.
        let req = InvalidateReq {
            segment: SegmentId(7),
            fence: fence(&table),
            regions: vec![(4096, 4)],
        };
        assert_eq!(c.call(&req).await.unwrap(), 1);
        let r = write_regions(&mut c, &writes[1..]).await.unwrap();
        assert_eq!(r[0].as_ref().unwrap_err().code, Code::TransferFail);
        token.cancel();
    }

    #[tokio::test]
    async fn only_the_granted_version_lands_and_only_under_the_current_fence() {
        let (addr, table, token) = server().await;
        let mut c = FramedConn::connect(&addr, "test", Limits::default())
            .await
            .unwrap();
        let (region, _) = table.get(SegmentId(7)).unwrap();
        let refused = |r: &KvResult<()>, what: &str| {
            let e = r.as_ref().expect_err(what);
            assert_eq!(e.code, Code::TransferFail, "{what}: {e}");
        };
        // Mounted again: the old fence's grants are void, the new one's land.
        let old = fence(&table);
        let (new, held) = table.refence(SegmentId(7)).unwrap();
        assert!(held.is_empty());
        assert_ne!(new, old);
        let o = object("k", 5, b"value");
        let r = write_regions(
            &mut c,
            &[write_op(0, 5, old, &o), write_op(4096, 5, new, &o)],
        )
        .await
        .unwrap();
        refused(&r[0], "a write granted under the previous mount");
        assert!(r[1].is_ok(), "{:?}", r[1]);
        // SAFETY: in bounds; nothing writes meanwhile.
        assert!(unsafe { region.slice(0, 4096) }.iter().all(|&b| b == 0));
        // A newer object in the region: an older grant's write is refused.
        let newer = object("k", 9, b"newer");
        let r = write_regions(
            &mut c,
            &[write_op(8192, 9, new, &newer), write_op(8192, 5, new, &o)],
        )
        .await
        .unwrap();
        assert!(r[0].is_ok());
        refused(&r[1], "a stale grant over a newer object");
        // SAFETY: in bounds.
        assert_eq!(
            unsafe { region.slice(8192, newer.len() as u64) },
            &newer[..]
        );
        // The object written must be the version granted.
        let r = write_regions(&mut c, &[write_op(12288, 6, new, &o)])
            .await
            .unwrap();
        refused(&r[0], "an object of another version than the grant's");
        // Not a whole object at the start of its region: a caller's error.
        let mut inside = write_op(16384, 5, new, &o);
        inside.req.offset += 64;
        let r = write_regions(&mut c, &[inside]).await.unwrap();
        assert_eq!(r[0].as_ref().unwrap_err().code, Code::InvalidParams);
        let count = |reason| {
            table
                .metrics
                .writes_refused
                .get_or_create(&crate::metrics::RefusedLabel { reason })
                .get()
        };
        assert_eq!((count("fence"), count("generation")), (1, 2));
        // The connection still works.
        let r = write_regions(&mut c, &[write_op(16384, 5, new, &o)])
            .await
            .unwrap();
        assert!(r[0].is_ok());
        token.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_in_flight_stops_landing_when_its_segment_is_mounted_again() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, table, token) = server().await;
        let (region, _) = table.get(SegmentId(7)).unwrap();
        let o = object("k", 5, &vec![0xA5u8; 256 << 10]);
        let req = write_op(0, 5, fence(&table), &o).req;
        let meta = msg::encode(&req);
        let h = FrameHeader::request(Opcode::Write, 1, meta.len() as u32, o.len() as u64);
        let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let hello = msg::encode(&msg::Hello {
            version: kvpool_proto::PROTOCOL_VERSION,
            min_version: kvpool_proto::frame::MIN_PROTOCOL_VERSION,
            role: "test".into(),
            nonce: [0; 16],
        });
        let hh = FrameHeader::request(Opcode::Hello, 0, hello.len() as u32, 0);
        raw.write_all(&hh.encode()).await.unwrap();
        raw.write_all(&hello).await.unwrap();
        let mut reply = [0u8; kvpool_proto::HEADER_LEN];
        raw.read_exact(&mut reply).await.unwrap();
        let rh = FrameHeader::decode(&reply, &Limits::default()).unwrap();
        let mut skip = vec![0u8; rh.meta_len as usize];
        raw.read_exact(&mut skip).await.unwrap();
        // The header, the message and half the object; then the writer stalls.
        let half = o.len() / 2;
        raw.write_all(&h.encode()).await.unwrap();
        raw.write_all(&meta).await.unwrap();
        raw.write_all(&o[..half]).await.unwrap();
        let t0 = Instant::now();
        // SAFETY: in bounds; read while the server writes: compared only.
        while unsafe { region.slice(0, half as u64) } != &o[..half] {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the first half never landed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        table.refence(SegmentId(7)).unwrap();
        // The rest arrives after the new mount: not one byte of it lands.
        raw.write_all(&o[half..]).await.unwrap();
        raw.read_exact(&mut reply).await.unwrap();
        let rh = FrameHeader::decode(&reply, &Limits::default()).unwrap();
        assert_eq!(rh.status, Code::TransferFail.as_i32());
        // SAFETY: in bounds; the server is done with this region.
        let rest = unsafe { region.slice(half as u64, (o.len() - half) as u64) };
        assert!(
            rest.iter().all(|&b| b == 0),
            "bytes landed after the fence moved"
        );
        token.cancel();
    }

    #[tokio::test]
    async fn garbage_header_is_answered_and_server_keeps_serving() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, _t, token) = server().await;
        let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
        raw.write_all(&[0xAB; 64]).await.unwrap();
        let mut resp = Vec::new();
        raw.read_to_end(&mut resp).await.unwrap();
        let h = kvpool_proto::frame::FrameHeader::decode(
            resp[..32].try_into().unwrap(),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(h.status, Code::InvalidParams.as_i32());
        // A fresh connection still works.
        assert!(FramedConn::connect(&addr, "test", Limits::default())
            .await
            .is_ok());
        token.cancel();
    }
}
