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
use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::{Mutex, RwLock};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::disk::{DiskFile, DiskRead};
use crate::mapped::MappedRegion;
use crate::metrics::DataMetrics;

/// Requests kept in flight per connection before waiting for a response;
/// bounds what either side must buffer so pipelining can never deadlock.
const WINDOW: usize = 64;

/// The segments a data server serves, by id: memory segments, and the
/// disk-tier segments behind them.
#[derive(Default)]
pub struct SegmentTable {
    map: RwLock<HashMap<SegmentId, (Arc<MappedRegion>, u64)>>,
    /// What a `StoreAbout` request is answered: the master and the
    /// segments as mounted (kept by the data node that owns the table).
    about: RwLock<StoreAboutReply>,
    disks: RwLock<HashMap<SegmentId, (Arc<DiskFile>, u64)>>,
    /// Memory-segment invalidations that found no object of their
    /// generation: the write of that version may still be on its way.
    /// Every write looks here, under the shared lock.
    revoked: RwLock<Revoked>,
    /// What the server of these segments counts (in the table so every
    /// handler reaches it).
    metrics: Arc<DataMetrics>,
}

/// How long a store remembers an invalidation that came before its write:
/// well past the master's default pending TTL (60 s), after which the
/// master invalidates an abandoned put's region again anyway.
const REVOKED_FOR: Duration = Duration::from_secs(600);

/// At most this many such invalidations are remembered (oldest go first);
/// each is a put abandoned before it wrote, which is rare.
const REVOKED_MAX: usize = 1 << 18;

/// Versions the master invalidated before their bytes arrived. A writer cut
/// off from the pool (its link down, its process paused) may deliver a put
/// long after the master gave the put up; its object must not become
/// findable then, or a scan (a restarted store, a new master leader
/// rebuilding from inventories) would bring back a value that was replaced
/// or removed since.
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
        self.disks.write().insert(id, (file, base));
    }

    /// Stops serving the disk segment `id`.
    pub fn remove_disk(&self, id: SegmentId) -> Option<Arc<DiskFile>> {
        self.disks.write().remove(&id).map(|(f, _)| f)
    }

    /// The disk segment `id`, if served here.
    pub fn get_disk(&self, id: SegmentId) -> Option<(Arc<DiskFile>, u64)> {
        self.disks.read().get(&id).cloned()
    }

    /// Where segment `id`'s bytes are, if it is served here.
    fn backing(&self, id: SegmentId) -> Option<Backing> {
        if let Some((r, base)) = self.get(id) {
            return Some(Backing::Memory(r, base));
        }
        self.get_disk(id).map(|(f, base)| Backing::Disk(f, base))
    }

    /// Starts serving `region` as `id`; bytes below `base` (the segment's own
    /// superblock) are never written over the wire.
    pub fn insert(&self, id: SegmentId, region: Arc<MappedRegion>, base: u64) {
        self.map.write().insert(id, (region, base));
    }

    /// Stops serving `id`.
    pub fn remove(&self, id: SegmentId) -> Option<Arc<MappedRegion>> {
        self.map.write().remove(&id).map(|(r, _)| r)
    }

    /// The region for `id` and the start of its object area.
    pub fn get(&self, id: SegmentId) -> Option<(Arc<MappedRegion>, u64)> {
        self.map.read().get(&id).cloned()
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

/// A served segment's bytes, and the start of its object area.
enum Backing {
    Memory(Arc<MappedRegion>, u64),
    Disk(Arc<DiskFile>, u64),
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

fn region_for(
    table: &SegmentTable,
    segment: SegmentId,
    offset: u64,
    len: u64,
) -> KvResult<Arc<MappedRegion>> {
    let (region, base) = table.get(segment).ok_or_else(|| {
        if table.get_disk(segment).is_some() {
            KvError::new(
                Code::InvalidParams,
                format!("segment {segment} is a disk-tier segment: it takes no writes"),
            )
        } else {
            not_served(segment)
        }
    })?;
    in_object_area(offset, len, base, region.len())?;
    Ok(region)
}

/// Reads `len` bytes at `offset` of `segment`: a region of mapped memory,
/// or a read of a disk segment, queued now for its I/O threads.
fn read_for(table: &SegmentTable, segment: SegmentId, offset: u64, len: u64) -> KvResult<Reply> {
    match table.backing(segment).ok_or_else(|| not_served(segment))? {
        Backing::Memory(region, base) => {
            in_object_area(offset, len, base, region.len())?;
            Ok(Reply::Region(region, offset, len))
        }
        Backing::Disk(file, base) => {
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
    let reply = match (h.kind, h.opcode) {
        (FrameKind::Request, Opcode::Write) => {
            match msg::decode::<WriteReq>(meta).and_then(|req| {
                let range = (req.offset, h.payload_len);
                check(Capability::WRITE, req.segment, req.grant.as_ref(), range)?;
                region_for(table, req.segment, req.offset, h.payload_len).map(|r| (r, req))
            }) {
                Ok((region, req)) => {
                    // SAFETY: range checked by region_for; the master gave this region
                    // to exactly one writer (see MappedRegion).
                    let dst = unsafe { region.slice_mut(req.offset, h.payload_len) };
                    conn.read_payload(dst).await?;
                    match table.landed(req.segment, req.offset, &region) {
                        Ok(()) => Ok(Reply::Ack),
                        Err(e) => Ok(Reply::Refused(e)),
                    }
                }
                Err(e) => Err(e),
            }
        }
        (FrameKind::Request, _) if h.payload_len != 0 => Err(KvError::new(
            Code::InvalidParams,
            "only writes carry a payload",
        )),
        (FrameKind::Request, Opcode::Read) => msg::decode::<ReadReq>(meta).and_then(|req| {
            let range = (req.offset, req.len);
            check(Capability::READ, req.segment, req.grant.as_ref(), range)?;
            read_for(table, req.segment, req.offset, req.len)
        }),
        // Not secret: an engine on this host learns where to attach.
        (FrameKind::Request, Opcode::StoreAbout) => msg::decode::<msg::StoreAbout>(meta)
            .map(|_| Reply::Message(msg::encode(&*table.about.read()))),
        // Copies between a store's own segments are the master's.
        (FrameKind::Request, Opcode::TierMove) if peer_role < Role::Store => Err(KvError::new(
            Code::Unauthorized,
            "only the master may move objects between tiers",
        )),
        (FrameKind::Request, Opcode::TierMove) => {
            let req = TierMoveReq::batch_len(meta)
                .map_or(Ok(()), |n| check_batch("TierMove", n))
                .and_then(|()| msg::decode::<TierMoveReq>(meta));
            match req {
                Ok(req) => Ok(Reply::Message(msg::encode(&tier_moves(table, req).await))),
                Err(e) => Err(e),
            }
        }
        // Destroying objects is the master's (which proves the store role).
        (FrameKind::Request, Opcode::Invalidate) if peer_role < Role::Store => Err(KvError::new(
            Code::Unauthorized,
            "only the master may invalidate objects",
        )),
        // More regions than a batch may carry are refused before decoding.
        (FrameKind::Request, Opcode::Invalidate) => InvalidateReq::batch_len(meta)
            .map_or(Ok(()), |n| check_batch("Invalidate", n))
            .and_then(|()| msg::decode::<InvalidateReq>(meta))
            .and_then(|req| invalidate(table, req)),
        _ => Err(KvError::new(
            Code::NotSupported,
            format!("{} is not served on the data plane", h.opcode.name()),
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
    Ok(
        match table
            .backing(req.segment)
            .ok_or_else(|| not_served(req.segment))?
        {
            Backing::Memory(region, _) => {
                let now = Instant::now();
                // Under the lock a write checks after it lands (see
                // `SegmentTable::landed`): either this finds the object, or
                // the write finds this.
                let mut revoked = table.revoked.write();
                let mut n = 0u64;
                for &(off, gen) in &req.regions {
                    if invalidate_object(&region, off, gen) {
                        n += 1;
                    } else if region.contains(off, FIXED_LEN as u64) {
                        revoked.insert(req.segment, off, gen, now);
                    }
                }
                m.invalidations_applied.inc_by(n);
                Reply::Message(msg::encode(&n))
            }
            Backing::Disk(file, _) => Reply::Pending(Box::pin(async move {
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
                Some(Backing::Disk(f, _)) => Some(f.clone()),
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
    let stale = || {
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
    match (from, to) {
        (Backing::Memory(src, sb), Backing::Disk(dst, db)) => {
            in_object_area(m.from_offset, m.len, sb, src.len())?;
            in_object_area(m.to_offset, m.len, db, dst.len())?;
            // SAFETY: in range (checked above); the master froze this object
            // for the move (no writer owns its region).
            let bytes = unsafe { src.slice(m.from_offset, m.len) };
            match dst.write_object(m.to_offset, bytes, holds) {
                Ok(true) => Ok(()),
                Ok(false) => Err(stale()),
                Err(e) => Err(disk_error(e)),
            }
        }
        (Backing::Disk(src, sb), Backing::Memory(dst, db)) => {
            in_object_area(m.from_offset, m.len, sb, src.len())?;
            in_object_area(m.to_offset, m.len, db, dst.len())?;
            let read = src.read(m.from_offset, m.len).map_err(disk_error)?;
            let bytes = read.bytes();
            if !holds(bytes) {
                return Err(stale());
            }
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

    async fn server() -> (String, Arc<SegmentTable>, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let table = Arc::new(SegmentTable::default());
        table.insert(
            SegmentId(7),
            Arc::new(MappedRegion::anonymous(1 << 20).unwrap()),
            0,
        );
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
        let (addr, _t, token) = server().await;
        let mut c = FramedConn::connect(&addr, "test", Limits::default())
            .await
            .unwrap();
        let values: Vec<Vec<u8>> = (0..200u32)
            .map(|i| vec![i as u8; 100 + i as usize])
            .collect();
        let writes: Vec<WriteOp> = values
            .iter()
            .enumerate()
            .map(|(i, v)| WriteOp {
                req: WriteReq {
                    segment: SegmentId(7),
                    offset: i as u64 * 512,
                    grant: None,
                },
                parts: vec![b"hd", v],
            })
            .collect();
        let r = write_regions(&mut c, &writes).await.unwrap();
        assert!(r.iter().all(|r| r.is_ok()));
        let mut heads = vec![[0u8; 2]; values.len()];
        let mut bodies: Vec<Vec<u8>> = values.iter().map(|v| vec![0; v.len()]).collect();
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
        assert!(heads.iter().all(|h| h == b"hd"));
        assert_eq!(bodies, values);

        // Two connections sharing one queue read every op exactly once.
        let mut whole: Vec<Vec<u8>> = values.iter().map(|v| vec![0; 2 + v.len()]).collect();
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
        for (w, v) in whole.iter().zip(&values) {
            assert_eq!((&w[..2], &w[2..]), (&b"hd"[..], &v[..]));
        }

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
        let (addr, _t, token) = server().await;
        let mut c = FramedConn::connect(&addr, "test", Limits::default())
            .await
            .unwrap();
        let big = vec![1u8; 4096];
        let writes = [
            WriteOp {
                req: WriteReq {
                    segment: SegmentId(7),
                    offset: (1 << 20) - 10,
                    grant: None,
                },
                parts: vec![&big],
            },
            WriteOp {
                req: WriteReq {
                    segment: SegmentId(8),
                    offset: 0,
                    grant: None,
                },
                parts: vec![&big],
            },
            WriteOp {
                req: WriteReq {
                    segment: SegmentId(7),
                    offset: 0,
                    grant: None,
                },
                parts: vec![&big],
            },
        ];
        let r = write_regions(&mut c, &writes).await.unwrap();
        assert_eq!(r[0].as_ref().unwrap_err().code, Code::InvalidParams);
        assert_eq!(r[1].as_ref().unwrap_err().code, Code::SegmentNotFound);
        assert!(r[2].is_ok());
        let mut buf = vec![0u8; 4096];
        let reads = vec![ReadOp {
            req: ReadReq {
                segment: SegmentId(7),
                offset: 0,
                len: 4096,
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
        let req = InvalidateReq {
            segment: SegmentId(7),
            regions: vec![(0, 3), (4096, 2), (1 << 20, 3)],
        };
        assert_eq!(c.call(&req).await.unwrap(), 1);
        // SAFETY: in bounds.
        let (found, _) = kvpool_format::scan::scan(unsafe { region.slice(0, region.len()) }, 0);
        assert_eq!(found.iter().map(|f| f.offset).collect::<Vec<_>>(), [4096]);
        let unknown = InvalidateReq {
            segment: SegmentId(8),
            regions: vec![(0, 3)],
        };
        assert_eq!(
            c.call(&unknown).await.unwrap_err().code,
            Code::SegmentNotFound
        );
        token.cancel();
    }

    #[tokio::test]
    async fn a_write_that_lands_after_its_invalidation_is_destroyed() {
        // A writer cut off from the pool has its frames delivered after the
        // master gave its put up and invalidated the region: the object it
        // writes must not be found by a later scan (a new leader would take
        // it back from the inventory, long after the key was removed).
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
            regions: vec![(0, 3), (4096, 3)],
        };
        assert_eq!(c.call(&req).await.unwrap(), 0, "nothing written yet");
        let (late, other) = (head(3), head(4));
        let writes = [(0, &late), (4096, &other)].map(|(offset, h)| WriteOp {
            req: WriteReq {
                segment: SegmentId(7),
                offset,
                grant: None,
            },
            parts: vec![&h[..], &value[..]],
        });
        let r = write_regions(&mut c, &writes).await.unwrap();
        assert_eq!(r[0].as_ref().unwrap_err().code, Code::TransferFail);
        assert!(r[1].is_ok(), "another version in the same region is kept");
        // SAFETY: in bounds.
        let (found, _) = kvpool_format::scan::scan(unsafe { region.slice(0, region.len()) }, 0);
        assert_eq!(
            found
                .iter()
                .map(|f| (f.offset, f.generation))
                .collect::<Vec<_>>(),
            [(4096, 4)]
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
