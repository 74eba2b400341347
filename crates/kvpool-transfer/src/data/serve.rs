//! The data server: one loop per connection that reads pipelined requests,
//! admits each for its plane and the peer's role, checks a write's grant
//! (signature, mount fence, version) before a byte of it lands, reads its
//! payload straight into segment memory, and answers in request order while
//! later disk reads run meanwhile.
//!
//! What a request does to a segment's bytes depends on its medium and lives
//! in `media`; the segments themselves are looked up in `table`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use kvpool_format::{publish_generation, seal, value_start, ValueHasher, FIXED_LEN};
use kvpool_net::auth::{Role, Security};
use kvpool_net::capability::{unix_ms, CapabilityKey};
use kvpool_net::conn::{accept_unix, FramedConn};
use kvpool_net::request_id;
use kvpool_net::server::{reject_and_close, serve_framed};
use kvpool_proto::frame::{FrameHeader, FrameKind, Limits, Opcode};
use kvpool_proto::msg::{self, Capability, Grant, RequestId, SegmentId, WriteReq};
use kvpool_proto::{Code, KvError, KvResult, Plane, Request};
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;
use tracing::{debug, Instrument};

use super::media::{cancel_moves, invalidate, not_served, read_for, tier_moves};
use super::medium::in_object_area;
use super::table::{SegmentTable, Served};
use super::WINDOW;
use crate::disk::DiskRead;
use crate::mapped::MappedRegion;
use crate::metrics::DataMetrics;

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
    let grants = grant_key(&security);
    #[cfg(feature = "planted-bugs")]
    kvpool_net::planted::announce();
    serve_framed(
        listener,
        "store",
        limits,
        security,
        shutdown,
        None,
        move |conn, token| {
            let (table, grants) = (table.clone(), grants.clone());
            async move { serve_conn(conn, &table, grants.as_deref(), &token).await }
        },
    )
    .await;
}

/// Connections served at once on the same-host socket; more wait to be
/// accepted (only this user's processes can connect there).
const MAX_UNIX_CONNS: usize = 1024;

/// Serves `table`'s segments to same-host peers on the Unix socket beside
/// the TCP listener ([`kvpool_net::local`]): the same requests, handshake
/// and grants as over TCP, without the TCP stack (no TLS: the kernel
/// carries the bytes). Until `shutdown`; the requests being served then
/// are finished first.
pub async fn serve_data_unix(
    listener: UnixListener,
    table: Arc<SegmentTable>,
    limits: Limits,
    security: Security,
    shutdown: CancellationToken,
) {
    let grants = grant_key(&security);
    let security = Arc::new(security);
    let token = shutdown.clone();
    kvpool_net::local::serve(listener, MAX_UNIX_CONNS, shutdown, move |stream, pid| {
        let (table, grants) = (table.clone(), grants.clone());
        let (security, token) = (security.clone(), token.clone());
        async move {
            let peer = format!("pid {}", pid.unwrap_or(0));
            if let Some(conn) = accept_unix(stream, peer, "store", limits, &security).await {
                table.metrics.same_host_connections.inc();
                serve_conn(conn, &table, grants.as_deref(), &token).await;
            }
        }
    })
    .await;
}

/// The key grants are checked with, when `security` holds a secret.
fn grant_key(security: &Security) -> Option<Arc<CapabilityKey>> {
    (security.credentials.as_ref())
        .and_then(CapabilityKey::new)
        .map(Arc::new)
}

/// Serves one handshaken connection until it closes, counted in the
/// table's metrics.
async fn serve_conn(
    mut conn: FramedConn,
    table: &SegmentTable,
    grants: Option<&CapabilityKey>,
    shutdown: &CancellationToken,
) {
    let m = &table.metrics;
    m.connections_accepted.inc();
    m.connections_open.inc();
    if let Err(e) = data_conn(&mut conn, table, grants, shutdown).await {
        debug!(peer = conn.peer(), error = %e, "data connection closed");
    }
    m.connections_open.dec();
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
            if full || !conn.has_input().await {
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

/// Decodes an admitted request's message (`Request::decode` refuses an
/// oversized batch first), and the request id a v6 peer sends after it.
fn decode(h: &FrameHeader, meta: &[u8]) -> KvResult<(Request, RequestId)> {
    if h.opcode != Opcode::Write && h.payload_len != 0 {
        return Err(KvError::new(
            Code::InvalidParams,
            "only writes carry a payload",
        ));
    }
    let (req, trailer) = Request::decode(h.opcode, meta)?;
    Ok((req, trailer.id))
}

/// Handles one request whose header was read: reads its message (and a
/// write's payload, into the segment) and works out its answer, in a
/// `request` span with the peer's request id; a disk read is queued for
/// the I/O threads and answered later.
async fn handle(
    conn: &mut FramedConn,
    table: &SegmentTable,
    grants: Option<&CapabilityKey>,
    h: FrameHeader,
) -> KvResult<Answer> {
    let t0 = Instant::now();
    let peer_role = conn.peer_role();
    // Stores and the master hold the key grants are signed with; a
    // client may touch only what the master granted it. `Some(key)`: the
    // grant is bound to an object's key, still to check.
    let grants = grants.filter(|_| peer_role < Role::Store);
    let admit = |access, segment, grant: Option<&Grant>, range| match grants {
        Some(key) => Ok(key
            .admit(access, segment, grant, range, unix_ms())?
            .then_some(key)),
        None => Ok(None),
    };
    let meta = conn.read_meta(h.meta_len).await?;
    let admitted = match h.kind {
        FrameKind::Request => h.opcode.admit(Plane::Data, peer_role),
        FrameKind::Response => Err(KvError::new(
            Code::InvalidParams,
            "expected a request frame",
        )),
    };
    let decoded = admitted.and_then(|()| decode(&h, meta));
    let id = decoded.as_ref().map_or(RequestId::NONE, |(_, id)| *id);
    // The outer error breaks the connection; the inner one answers the request.
    let reply = async {
        KvResult::Ok(match decoded.map(|(req, _)| req) {
            Err(e) => Err(e),
            Ok(Request::Write(req)) => {
                let range = (req.offset, h.payload_len);
                let signed = || admit(Capability::WRITE, req.segment, Some(&req.grant), range);
                match admit_write(table, &req, h.payload_len, signed) {
                    Ok((s, bound)) => {
                        let len = h.payload_len;
                        match write_object(conn, table, (&s, bound), &req, len).await? {
                            Ok(()) => Ok(Reply::Ack),
                            Err(e) => Ok(Reply::Refused(e)),
                        }
                    }
                    Err(e) => Err(e),
                }
            }
            Ok(Request::Read(req)) => {
                let range = (req.offset, req.len);
                admit(Capability::READ, req.segment, req.grant.as_ref(), range)
                    .and_then(|bound| match (bound, &req.grant) {
                        (Some(key), Some(g)) => key_in_region(table, req.segment, g.offset, |k| {
                            key.check_key(req.segment, g, k)
                        }),
                        _ => Ok(()),
                    })
                    .and_then(|()| read_for(table, req.segment, req.offset, req.len))
            }
            Ok(Request::StoreAbout(_)) => Ok(Reply::Message(msg::encode(&*table.about.read()))),
            Ok(Request::TierMove(req)) => Ok(Reply::Message(msg::encode(
                &tier_moves(table, req, id).await,
            ))),
            Ok(Request::TierMoveCancel(req)) => Ok(cancel_moves(table, req)),
            Ok(Request::Invalidate(req)) => invalidate(table, req),
            // `admit` refused every other plane's request; the transfer
            // engine's are served by engines, not stores.
            Ok(other) => Err(KvError::new(
                Code::NotSupported,
                format!("{} is not served by the data plane", other.opcode().name()),
            )),
        })
    }
    .instrument(request_id::span(id, h.opcode))
    .await?;
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
            let lent = conn
                .send_response_from(h, src, region.lent_file().map(|f| (f, offset)))
                .await?;
            table.metrics.bytes_from_file.inc_by(lent);
        }
        Ok(Reply::Disk(read)) => conn.send_response(h, &[], &[read.bytes()]).await?,
        Ok(Reply::Owned(bytes)) => conn.send_response(h, &[], &[&bytes]).await?,
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
pub(super) type Boxed<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// How the data plane answers a request that succeeded.
pub(super) enum Reply {
    /// A write landed: an empty response.
    Ack,
    /// A write landed but was refused after (its payload is read).
    Refused(KvError),
    /// The bytes of a region (offset, length), sent straight from segment memory.
    Region(Arc<MappedRegion>, u64, u64),
    /// Bytes read from a disk segment.
    Disk(DiskRead),
    /// Bytes a medium read into a buffer of its own (no shipped medium
    /// does yet; the conformance suite's file medium does).
    #[cfg_attr(not(test), allow(dead_code))]
    Owned(Vec<u8>),
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
        Ok(Reply::Owned(bytes)) => (bytes.len() as u64, None),
        Ok(Reply::Refused(e)) => (h.payload_len, Some(e.code)),
        Ok(_) => (0, None),
        Err(e) => (0, Some(e.code)),
    }
}

/// Checks a write before any of its payload is read: the grant (by
/// `signed`; but for the key of a grant bound to one, which the payload's
/// header carries), that the write is one whole object at the start of its
/// granted region, under the segment's current fence, and that no newer
/// object lies there (the grant is stale). Returns the segment, and the
/// signer still to check the key with in [`write_object`].
fn admit_write<'k>(
    table: &SegmentTable,
    req: &WriteReq,
    len: u64,
    signed: impl FnOnce() -> KvResult<Option<&'k CapabilityKey>>,
) -> KvResult<(Arc<Served>, Option<&'k CapabilityKey>)> {
    let bound = signed()?;
    let (segment, g) = (req.segment, &req.grant);
    let s = table.served(segment).ok_or_else(|| {
        if table.elsewhere(segment) {
            KvError::new(
                Code::InvalidParams,
                format!("segment {segment} is a disk-tier segment: it takes no writes"),
            )
        } else {
            not_served(segment)
        }
    })?;
    in_object_area(&*s, req.offset, len)?;
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
    // A newer object at the range's start or inside it: the grant outlived
    // its object (the store may have forgotten, or not yet heard, that it
    // went; see `starts`).
    for at in std::iter::once(req.offset).chain(s.starts.inside(req.offset, len)) {
        let there = header_bytes(&s, at).and_then(kvpool_format::scan::header_at);
        if let Some((h, _)) = there.filter(|(h, _)| h.generation > g.generation) {
            let why = Refusal::Newer {
                at,
                generation: h.generation,
            };
            return Err(refused(&table.metrics, why, segment, g));
        }
    }
    Ok((s, bound))
}

/// Runs `check` on the key of the object at `offset` of a served segment
/// (`None` when no header is there, or the segment is not served here).
fn key_in_region(
    table: &SegmentTable,
    segment: SegmentId,
    offset: u64,
    check: impl FnOnce(Option<&[u8]>) -> KvResult<()>,
) -> KvResult<()> {
    let Some(s) = table.served(segment) else {
        return check(None);
    };
    // A torn key fails the signature, which is all it is used for.
    check(header_bytes(&s, offset).and_then(kvpool_format::scan::key_at))
}

/// The bytes a header at `offset` of `s` may take (up to the segment's
/// end), `None` past it. A writer may be changing them: only checks that a
/// torn header fails may read them (its checksum, a grant's signature).
fn header_bytes(s: &Served, offset: u64) -> Option<&[u8]> {
    let max = kvpool_format::header_len(u16::MAX as usize) as u64;
    let span = s.region.len().checked_sub(offset)?.min(max);
    // SAFETY: in bounds (checked above).
    Some(unsafe { s.region.slice(offset, span) })
}

/// Why a write was refused by the fence checks.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// Granted under an earlier mount of the segment.
    Fence,
    /// A newer version starts at the range's start or inside it.
    Newer {
        /// Where it starts.
        at: u64,
        /// Its generation.
        generation: u64,
    },
    /// The payload's header names another version than the grant.
    Header(Option<u64>),
    /// The master invalidated this version (removed, replaced, or given up
    /// before the write came).
    Invalidated,
    /// The header did not check when the value was in (sent so, or
    /// damaged meanwhile), so it could not be sealed.
    Damaged,
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
        Refusal::Newer { at, generation } if at == g.offset => (
            "generation",
            format!("region holds a newer object (generation {generation})"),
        ),
        Refusal::Newer { at, generation } => (
            "generation",
            format!("a newer object (generation {generation}) starts inside the range, at {at}"),
        ),
        Refusal::Header(named) => (
            "generation",
            format!("the object written names generation {named:?}, not the one granted"),
        ),
        Refusal::Invalidated => (
            "invalidated",
            "the master invalidated this version (removed, replaced or given up)".to_string(),
        ),
        Refusal::Damaged => (
            "damaged",
            "the object's header does not check (sent so, or damaged while the value came)"
                .to_string(),
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
/// first, checked to name the granted version (and with a grant bound to a
/// key, that key), then the rest, every read inside the segment's fence. A write refused midway has its payload read
/// to the end and is answered `Ok(Err(..))`; `Err` is a broken connection.
async fn write_object(
    conn: &mut FramedConn,
    table: &SegmentTable,
    (s, bound): (&Served, Option<&CapabilityKey>),
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
    // A grant bound to a key writes only a header naming that key.
    let mut key = Vec::new();
    if let Some(signer) = bound {
        let key_len = u64::from(u16::from_le_bytes([head[6], head[7]]));
        key.resize(key_len.min(len - FIXED_LEN as u64) as usize, 0);
        conn.read_payload(&mut key).await?;
        if let Err(e) = signer.check_key(req.segment, g, Some(&key)) {
            conn.discard_payload(len - (FIXED_LEN + key.len()) as u64)
                .await?;
            return Ok(Err(e));
        }
    }
    let head_len = FIXED_LEN + key.len();
    // SAFETY: range checked by admit_write; the master gave this region to
    // this grant alone, and every write into it happens inside the fence.
    let dst = unsafe { s.region.slice_mut(req.offset, len) };
    let landed = s.fence.enter(g.fence).map(|_inside| {
        dst[..FIXED_LEN].copy_from_slice(&head);
        publish_generation(dst, g.generation);
        dst[FIXED_LEN..head_len].copy_from_slice(&key);
    });
    if landed.is_none() {
        conn.discard_payload(len - head_len as u64).await?;
    }
    // The header is sealed with the checksum of the value bytes as they
    // landed here, not the writer's: a source changed mid-write (or a
    // writer's wrong sum) still leaves an object that reads back. The key
    // bytes not read above come first in the rest.
    let mut sum = ValueHasher::new();
    let mut key_left = value_start(&head).map_or(0, |v| v.saturating_sub(head_len));
    let mut hash = |b: &[u8]| {
        let k = key_left.min(b.len());
        key_left -= k;
        sum.update(&b[k..]);
    };
    if landed.is_none()
        || !conn
            .read_payload_fenced(&mut dst[head_len..], || s.fence.enter(g.fence), &mut hash)
            .await?
    {
        return Ok(Err(refused(&table.metrics, Refusal::Fence, req.segment, g)));
    }
    let sealed = s
        .fence
        .enter(g.fence)
        .map(|_inside| seal(dst, sum.digest()));
    if sealed != Some(true) {
        // Unsealed (a header that does not check): nothing would read it.
        let why = sealed.map_or(Refusal::Fence, |_| Refusal::Damaged);
        return Ok(Err(refused(&table.metrics, why, req.segment, g)));
    }
    s.starts.wrote(req.offset, len);
    Ok(table.landed(req.segment, req.offset, &s.region))
}
