//! A framed TCP connection (buffered halves, request ids, handshake) and a
//! pool of idle connections per peer.
//!
//! Connections are checked out for a whole exchange and given back only when
//! the exchange finished cleanly; a call that fails or is cancelled by a
//! timeout drops its connection, so a half-read response can never be seen by
//! the next caller.

use std::io;
use std::os::fd::BorrowedFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use kvpool_proto::compat;
use kvpool_proto::compat::Trailer;
use kvpool_proto::frame::{
    FrameHeader, FrameKind, Limits, Opcode, HEADER_LEN, MIN_PROTOCOL_VERSION,
};
use kvpool_proto::msg::{
    self, Auth, AuthReply, AuthTenant, Challenge, Hello, HelloReply, RequestTrailer,
};
use kvpool_proto::Rpc;
use kvpool_proto::{Code, KvError, KvResult, PROTOCOL_VERSION};
use parking_lot::Mutex;

use crate::auth::{Credentials, Role, Security, SECRET_FILE_ENV};
use crate::breaker::{Admit, Breaker};
use crate::tls::{Tls, TLS_HANDSHAKE_BYTE};
use tokio::io::{
    AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter, ReadBuf,
};
use tokio::net::TcpStream;

/// Socket buffer size asked of the kernel; large so bulk transfers are not
/// throttled by the window on loopback and fast links.
const SOCKET_BUFFER: usize = 4 << 20;
/// Userspace buffer per direction. Payloads bypass the read buffer once
/// it is empty, and frames of this size or more the write buffer.
const IO_BUFFER: usize = 64 << 10;
/// A frame whose payload is this big makes its connection bulk (see
/// [`Capped`]).
const BULK: usize = 32 << 10;
/// Most bytes one buffer fill of a bulk connection takes: a frame's
/// header and message fit, and little of the payload behind them comes
/// through the buffer.
const HEAD_READ: usize = 2 << 10;
/// Smallest payload [`FramedConn::send_response_from`] sends from its
/// file. Below it the extra calls (a flush, the header on its own) cost
/// more than the copy: batches of 64 KiB reads ran at 1.3-1.5 GB/s from
/// the file against 2.0-2.3 copied; 512 KiB came out even (2026-12-02).
pub const SEND_FILE_MIN: usize = 1 << 20;

/// A message (meta) must arrive whole within this long once its header has:
/// a peer that declares a big message and stalls loses its connection.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// A server closes a connection on which no request starts for this long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// A payload must arrive at least this fast ([`PROGRESS_BYTES`] per
/// [`PROGRESS_TIMEOUT`]), however big it is.
pub const PROGRESS_BYTES: usize = 1 << 20;
/// See [`PROGRESS_BYTES`].
pub const PROGRESS_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes [`FramedConn::read_payload_seen`] reads before showing them:
/// well inside a core's L2 cache.
const SEEN_PIECE: usize = 256 << 10;
/// The handshake must be complete this long after accept.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest message accepted before the handshake.
pub const MAX_HELLO: u32 = 4 << 10;
/// A message buffer larger than this is given back after use, so one big
/// message does not pin its memory for the connection's life.
const KEEP_META: usize = 1 << 20;
/// What a server connection's message buffers may keep while it waits for
/// a request: larger ones are given back once it has been idle for
/// [`SHRINK_AFTER`], so a connection that once carried a 16 MiB message
/// does not hold 16 MiB while it idles.
pub const IDLE_BUFFER: usize = IO_BUFFER;
/// How long a server connection holding buffers over [`IDLE_BUFFER`] waits
/// for its next request before giving them back (back-to-back big
/// requests reuse them).
pub const SHRINK_AFTER: Duration = Duration::from_secs(1);

/// Maps an I/O failure to the stable code callers retry on.
pub fn io_error(context: &str, e: io::Error) -> KvError {
    KvError::new(Code::RpcFail, format!("{context}: {e}"))
}

/// The read side of a connection: a TCP half, or a TLS stream's.
type ReadSide = Box<dyn AsyncRead + Send + Unpin>;

/// The read side under a connection's buffer, each read bounded to `cap`
/// bytes: [`HEAD_READ`] while the connection is bulk (its last frame
/// carried [`BULK`] or more, so the next likely does too), else
/// unbounded. A buffer fill for a header would otherwise take up to
/// [`IO_BUFFER`] of the payload behind it, and each of those bytes would
/// be copied twice (a 64 KiB put went through the buffer almost whole);
/// payloads themselves are read past the bound ([`poll_payload`]).
struct Capped {
    side: ReadSide,
    /// Most bytes one read takes.
    cap: usize,
}

impl Capped {
    /// Whether the last frame read was bulk (see [`Capped`]).
    fn bulk(&self) -> bool {
        self.cap == HEAD_READ
    }
}

impl AsyncRead for Capped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        if buf.remaining() <= me.cap {
            return Pin::new(&mut me.side).poll_read(cx, buf);
        }
        let mut part = buf.take(me.cap);
        let read = Pin::new(&mut me.side).poll_read(cx, &mut part);
        let n = part.filled().len();
        // SAFETY: the side filled (so initialised) the first `n` bytes of
        // `buf`'s unfilled part, which `part` is.
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        read
    }
}

/// Reads payload bytes into `buf`: from the connection's buffer while it
/// holds some, else straight from the socket, unbounded, so those bytes
/// are copied once (and the read, asking no more than the payload, takes
/// nothing of the next frame).
fn poll_payload(
    reader: &mut BufReader<Capped>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    if reader.buffer().is_empty() {
        Pin::new(&mut reader.get_mut().side).poll_read(cx, buf)
    } else {
        Pin::new(reader).poll_read(cx, buf)
    }
}

/// Fills `dst` with payload bytes (see [`poll_payload`]).
async fn fill_payload(reader: &mut BufReader<Capped>, dst: &mut [u8]) -> io::Result<()> {
    let mut at = 0;
    while at < dst.len() {
        let n = std::future::poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut dst[at..]);
            poll_payload(reader, cx, &mut buf).map_ok(|()| buf.filled().len())
        })
        .await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        at += n;
    }
    Ok(())
}

/// One TCP (or TLS over TCP) connection speaking kvpool frames.
pub struct FramedConn {
    reader: BufReader<Capped>,
    writer: BufWriter<WriteSide>,
    next_id: u64,
    limits: Limits,
    meta_buf: Vec<u8>,
    /// Outgoing messages are encoded here: no allocation per request.
    out_buf: Vec<u8>,
    peer: String,
    /// What the peer proved in the handshake (servers only).
    peer_role: Role,
    /// The tenant whose key the peer proved, if any (servers only).
    peer_tenant: Option<Arc<str>>,
    /// The most the peer may prove: the client role over TLS without a
    /// client certificate (servers only).
    ceiling: Role,
    /// Set on connections from a pool with a breaker: see [`Silence`].
    silence: Option<Silence>,
    /// The protocol version both sides agreed in the handshake; until then
    /// the oldest, whose shapes every peer reads.
    version: u32,
}

/// How long a peer behind a breaker may take to start an answer. A peer
/// that says nothing for that long (paused, cut off, wedged) is taken for
/// gone: the connection fails and the breaker opens, so callers learn it
/// within this instead of within their whole call's timeout. Sized to the
/// network (a multiple of the connect timeout), not to the transfer: only
/// the start of each answer is timed; its bytes have their own progress
/// limit ([`PROGRESS_TIMEOUT`]).
struct Silence {
    within: Duration,
    breaker: Arc<Mutex<Breaker>>,
}

/// How long the caller that triggers a breaker's probe waits for it: a
/// peer back from a restart connects within it; a silent one is left to
/// the probe, which reports to the breaker when its connect times out.
const PROBE_WAIT: Duration = Duration::from_millis(100);

/// A peer's answer must start within this many connect timeouts.
const ANSWER_CONNECT_TIMEOUTS: u32 = 2;

impl FramedConn {
    /// Connects to `addr` and performs the version handshake as `role`,
    /// holding no secret: for servers that do not authenticate.
    pub async fn connect(addr: &str, role: &str, limits: Limits) -> KvResult<Self> {
        FramedConn::connect_with(addr, role, limits, &Security::default()).await
    }

    /// Connects to `addr` (over TLS when `security` has it) and performs
    /// the handshake as `role` (a name for logs), proving its credentials
    /// when the server asks. A process that holds a secret refuses a server
    /// that does not ask, or that cannot prove the same secret: it would be
    /// talking to an impostor.
    pub async fn connect_with(
        addr: &str,
        role: &str,
        limits: Limits,
        security: &Security,
    ) -> KvResult<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| io_error(&format!("connect {addr}"), e))?;
        let mut conn = match &security.tls {
            None => FramedConn::from_stream(stream, limits)?,
            Some(tls) => {
                tune_socket(&stream);
                let (r, w) = tokio::io::split(tls.connect(addr, stream).await?);
                let w = WriteSide::Other(Box::new(w));
                FramedConn::from_halves(Box::new(r), w, String::new(), limits)
            }
        };
        conn.peer = addr.to_string();
        conn.client_handshake(addr, role, security).await
    }

    /// Performs the handshake as `role` over a connected Unix socket
    /// (`name` for errors and logs): no TLS (the kernel carries the bytes),
    /// the same version agreement and proof of the secret as over TCP.
    pub async fn connect_unix(
        stream: tokio::net::UnixStream,
        name: &str,
        role: &str,
        limits: Limits,
        security: &Security,
    ) -> KvResult<Self> {
        let conn = FramedConn::from_unix(stream, name.to_string(), limits);
        conn.client_handshake(name, role, security).await
    }

    /// Wraps a connected or accepted Unix socket (no handshake).
    pub fn from_unix(stream: tokio::net::UnixStream, peer: String, limits: Limits) -> Self {
        // Unix sockets buffer little by default: bulk payloads would move
        // a few hundred KiB per wake-up.
        let sock = socket2::SockRef::from(&stream);
        let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
        let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
        let (r, w) = stream.into_split();
        FramedConn::from_halves(Box::new(Eager::new(r)), WriteSide::Unix(w), peer, limits)
    }

    /// The client's side of the handshake on a fresh connection to `addr`.
    async fn client_handshake(
        mut self,
        addr: &str,
        role: &str,
        security: &Security,
    ) -> KvResult<Self> {
        let conn = &mut self;
        let credentials = security.credentials.as_ref();
        let nonce: [u8; 16] = rand::random();
        let reply = conn
            .call(&Hello {
                version: PROTOCOL_VERSION,
                min_version: MIN_PROTOCOL_VERSION,
                role: role.to_string(),
                nonce,
            })
            .await?;
        // The server picks from the range we offered; anything else is a
        // peer that does not follow the protocol.
        if !compat::SUPPORTED.contains(&reply.version) {
            return Err(KvError::new(
                Code::InvalidVersion,
                format!(
                    "{addr} chose protocol {}, which this build does not speak \
                     ({MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION})",
                    reply.version
                ),
            ));
        }
        match (reply.challenge, credentials) {
            (None, None) => {}
            (None, Some(_)) => {
                return Err(KvError::new(
                    Code::Unauthorized,
                    format!(
                        "{addr} does not authenticate its peers but this process holds a \
                         secret: refusing a server that cannot prove it (start it with the \
                         same secret)"
                    ),
                ))
            }
            (Some(_), None) => {
                return Err(KvError::new(
                    Code::Unauthorized,
                    format!(
                        "{addr} requires authentication: set {SECRET_FILE_ENV} (or \
                         --secret-file) to a key of its cluster"
                    ),
                ))
            }
            (Some(challenge), Some(own)) => {
                let most = Role::from_u8(challenge.max_role).unwrap_or(Role::Client);
                if most < own.role() && security.tls.as_ref().is_some_and(|t| !t.has_cert()) {
                    tracing::warn!(
                        server = %addr,
                        "acting as {most}, not {}: over TLS that role needs a client \
                         certificate (--tls-cert, --tls-key)",
                        own.role()
                    );
                }
                let key = own.derive(own.role().min(most)).ok_or_else(|| {
                    KvError::new(Code::Unauthorized, format!("{addr}: no usable role"))
                })?;
                if key.tenant().is_some() && reply.version < AuthTenant::SINCE {
                    return Err(KvError::new(
                        Code::InvalidVersion,
                        format!(
                            "{addr} speaks protocol {}, too old for tenant keys ({} and \
                             newer): upgrade it first",
                            reply.version,
                            AuthTenant::SINCE
                        ),
                    ));
                }
                let auth = Auth {
                    role: key.role().as_u8(),
                    proof: key.client_proof(&nonce, &challenge.nonce),
                };
                let tenant = AuthTenant {
                    tenant: key.tenant().map(str::to_string),
                };
                let reply = conn.authenticate(&auth, &tenant, reply.version).await?;
                if !key.verify(true, &nonce, &challenge.nonce, &reply.proof) {
                    return Err(KvError::new(
                        Code::Unauthorized,
                        format!("{addr} could not prove the cluster secret: not our server"),
                    ));
                }
            }
        }
        // Only now: the handshake (Auth included) stays in the oldest shape.
        conn.version = reply.version;
        Ok(self)
    }

    /// Wraps an accepted or connected plaintext stream (no handshake).
    pub fn from_stream(stream: TcpStream, limits: Limits) -> KvResult<Self> {
        let peer = peer_of(&stream);
        tune_socket(&stream);
        let (r, w) = stream.into_split();
        Ok(FramedConn::from_halves(
            Box::new(Eager::new(r)),
            WriteSide::Tcp(w),
            peer,
            limits,
        ))
    }

    fn from_halves(r: ReadSide, w: WriteSide, peer: String, limits: Limits) -> Self {
        FramedConn {
            reader: BufReader::with_capacity(
                IO_BUFFER,
                Capped {
                    side: r,
                    cap: usize::MAX,
                },
            ),
            writer: BufWriter::with_capacity(IO_BUFFER, w),
            next_id: 1,
            limits,
            meta_buf: Vec::new(),
            out_buf: Vec::new(),
            peer,
            peer_role: Role::Client,
            peer_tenant: None,
            ceiling: Role::Admin,
            silence: None,
            version: MIN_PROTOCOL_VERSION,
        }
    }

    /// Wraps a connection a server accepted, completing TLS first when
    /// `tls` is set (a plaintext peer is told that TLS is required, then
    /// dropped). `None` when the peer must be disconnected. The caller
    /// bounds the time this takes.
    pub async fn accept(stream: TcpStream, limits: Limits, tls: Option<&Tls>) -> Option<Self> {
        let Some(tls) = tls else {
            return FramedConn::from_stream(stream, limits).ok();
        };
        let mut first = [0u8; 1];
        if stream.peek(&mut first).await.ok()? == 0 {
            return None;
        }
        if first[0] != TLS_HANDSHAKE_BYTE {
            let mut conn = FramedConn::from_stream(stream, limits).ok()?;
            refuse_plaintext(&mut conn).await;
            return None;
        }
        let peer = peer_of(&stream);
        tune_socket(&stream);
        let accepted = match tls.accept(stream).await {
            Ok(a) => a,
            Err(e) => {
                refused_auth(&peer, &e.message);
                return None;
            }
        };
        let (r, w) = tokio::io::split(accepted.stream);
        let w = WriteSide::Other(Box::new(w));
        let mut conn = FramedConn::from_halves(Box::new(r), w, peer, limits);
        conn.ceiling = accepted.ceiling;
        Some(conn)
    }

    /// The peer's address, for errors and logs.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The role the peer proved in the handshake; every role when the
    /// server holds no secret. Only meaningful on accepted connections.
    pub fn peer_role(&self) -> Role {
        self.peer_role
    }

    /// The tenant whose key the peer proved, if any (accepted connections).
    pub fn peer_tenant(&self) -> Option<&Arc<str>> {
        self.peer_tenant.as_ref()
    }

    /// The protocol version agreed in the handshake (the highest both sides
    /// speak): what this side sends is in that version's shape. The oldest
    /// supported version on a connection that had no handshake.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The limits this side enforces on incoming frames.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A fresh request id.
    pub fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    /// Whether bytes of a next frame are already here (more pipelined
    /// requests are waiting, so a response flush can be deferred): in the
    /// buffer, or on a bulk connection, whose payload reads leave the
    /// buffer empty, in the socket (taken by a read the next header needs
    /// anyway).
    pub async fn has_input(&mut self) -> bool {
        if !self.reader.buffer().is_empty() {
            return true;
        }
        if !self.reader.get_ref().bulk() {
            return false;
        }
        // A read error is met again (or as the end of the stream) by the
        // next read.
        std::future::poll_fn(|cx| {
            let filled = Pin::new(&mut self.reader).poll_fill_buf(cx);
            Poll::Ready(matches!(filled, Poll::Ready(Ok(b)) if !b.is_empty()))
        })
        .await
    }

    fn send_failed(&self, e: io::Error) -> KvError {
        io_error(&format!("send to {}", self.peer), e)
    }

    /// Queues a frame: header, message, then each payload part (no flush).
    pub async fn send_frame(
        &mut self,
        header: &FrameHeader,
        meta: &[u8],
        payload: &[&[u8]],
    ) -> KvResult<()> {
        let r = write_frame(&mut self.writer, header, meta, payload).await;
        r.map_err(|e| self.send_failed(e))
    }

    /// Queues more payload bytes of the frame sent last, which declared more
    /// than its parts held (a payload streamed in pieces).
    pub async fn send_more(&mut self, payload: &[u8]) -> KvResult<()> {
        let r = self.writer.write_all(payload).await;
        r.map_err(|e| self.send_failed(e))
    }

    /// Queues a request (its message encoded into a reused buffer, with the
    /// [`RequestTrailer`] of the call in force when the connection speaks
    /// protocol 6, see [`crate::request_id`]) followed by `payload`; returns
    /// its frame id. A request newer than the connection's version is
    /// refused here, `NOT_SUPPORTED`, and nothing is sent: the older peer
    /// would close the connection on it.
    pub async fn send_request<R: Rpc>(&mut self, req: &R, payload: &[&[u8]]) -> KvResult<u64> {
        if R::OPCODE.since() > self.version {
            return Err(KvError::new(
                Code::NotSupported,
                format!(
                    "{} needs protocol {}; {} speaks {}",
                    R::OPCODE.name(),
                    R::OPCODE.since(),
                    self.peer,
                    self.version
                ),
            ));
        }
        let id = self.next_id();
        msg::encode_to(req, &mut self.out_buf);
        let trailer = RequestTrailer {
            id: crate::request_id::current(),
        };
        compat::append(&mut self.out_buf, self.version, &trailer);
        let len: u64 = payload.iter().map(|p| p.len() as u64).sum();
        let h = FrameHeader::request(R::OPCODE, id, self.out_buf.len() as u32, len);
        let r = write_frame(&mut self.writer, &h, &self.out_buf, payload).await;
        r.map_err(|e| self.send_failed(e))?;
        Ok(id)
    }

    /// Queues a success response to `req`.
    pub async fn send_response(
        &mut self,
        req: &FrameHeader,
        meta: &[u8],
        payload: &[&[u8]],
    ) -> KvResult<()> {
        let len: u64 = payload.iter().map(|p| p.len() as u64).sum();
        let h = FrameHeader::response(req, 0, meta.len() as u32, len);
        self.send_frame(&h, meta, payload).await
    }

    /// Sends a success response to `req` whose payload is `bytes`, which
    /// `file` also holds from `offset` (a segment's mapping and its file);
    /// answers how many payload bytes left from the file. On a plain
    /// socket a payload of [`SEND_FILE_MIN`] bytes or more leaves with
    /// `sendfile`: the kernel takes the file's pages, this side copies
    /// nothing. Until the receiver has read them the socket holds those
    /// pages, not a copy, so a writer that reuses the region meanwhile
    /// changes what is read; the reader's checksum of the value catches
    /// that, as it does a write racing a copy. Otherwise, and for what the
    /// file system will not lend, the bytes are copied as by
    /// [`Self::send_response`].
    pub async fn send_response_from(
        &mut self,
        req: &FrameHeader,
        bytes: &[u8],
        file: Option<(BorrowedFd<'_>, u64)>,
    ) -> KvResult<u64> {
        let (file, offset) = match file {
            Some(f) if bytes.len() >= SEND_FILE_MIN && self.writer.get_ref().takes_files() => f,
            _ => return self.send_response(req, &[], &[bytes]).await.map(|()| 0),
        };
        let h = FrameHeader::response(req, 0, 0, bytes.len() as u64);
        // Frames queued before this one leave first.
        self.flush().await?;
        let side = self.writer.get_mut();
        let sent = async {
            side.send_header(&h.encode()).await?;
            let mut at = 0;
            while at < bytes.len() as u64 {
                match side
                    .send_file(file, offset + at, bytes.len() as u64 - at)
                    .await?
                {
                    0 => break,
                    n => at += n,
                }
            }
            Ok::<_, io::Error>(at)
        };
        let at = sent.await.map_err(|e| self.send_failed(e))?;
        self.send_more(&bytes[at as usize..]).await?;
        Ok(at)
    }

    /// Queues an error response to `req` with a message.
    pub async fn send_error(&mut self, req: &FrameHeader, err: &KvError) -> KvResult<()> {
        let meta = err.message.as_bytes();
        let h = FrameHeader::response(req, err.code.as_i32(), meta.len() as u32, 0);
        self.send_frame(&h, meta, &[]).await
    }

    /// Flushes queued frames to the socket.
    pub async fn flush(&mut self) -> KvResult<()> {
        let r = self.writer.flush().await;
        r.map_err(|e| self.send_failed(e))
    }

    /// Answers a frame that could not be decoded (its request id is unknown,
    /// so the answer carries 0), best effort: the caller closes next.
    pub async fn reject(&mut self, e: &KvError) {
        let unknown = FrameHeader::request(Opcode::Hello, 0, 0, 0);
        if self.send_error(&unknown, e).await.is_ok() {
            let _ = self.flush().await;
        }
    }

    /// Flushes unless more pipelined requests are already buffered: their
    /// responses then leave in one write.
    pub async fn flush_if_idle(&mut self) -> KvResult<()> {
        if self.has_input().await {
            return Ok(());
        }
        self.flush().await
    }

    /// Reads the next frame header. `Ok(None)` on a clean end of stream.
    pub async fn read_header(&mut self) -> KvResult<Option<FrameHeader>> {
        let mut b = [0u8; HEADER_LEN];
        match self.reader.read_exact(&mut b).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(io_error(&format!("read from {}", self.peer), e)),
        }
        let h = FrameHeader::decode(&b, &self.limits)?;
        let bulk = h.payload_len >= BULK as u64;
        self.reader.get_mut().cap = if bulk { HEAD_READ } else { usize::MAX };
        Ok(Some(h))
    }

    /// Reads a frame's message into a reused buffer. The buffer grows as
    /// bytes arrive, never to the declared length up front: a header that
    /// declares 64 MiB and sends nothing costs nothing. The message must
    /// arrive within [`MESSAGE_TIMEOUT`].
    pub async fn read_meta(&mut self, len: u32) -> KvResult<&[u8]> {
        if self.meta_buf.capacity() > KEEP_META && len as usize <= KEEP_META {
            self.meta_buf = Vec::new();
        }
        self.meta_buf.clear();
        self.meta_buf.reserve((len as usize).min(IO_BUFFER));
        let mut body = (&mut self.reader).take(u64::from(len));
        let read = body.read_to_end(&mut self.meta_buf);
        let n = match tokio::time::timeout(MESSAGE_TIMEOUT, read).await {
            Ok(r) => r.map_err(|e| io_error(&format!("read from {}", self.peer), e))?,
            Err(_) => {
                return Err(KvError::new(
                    Code::RpcTimeout,
                    format!("{} sent a message too slowly", self.peer),
                ))
            }
        };
        if n != len as usize {
            return Err(KvError::new(
                Code::RpcFail,
                format!("{} closed the connection mid-message", self.peer),
            ));
        }
        Ok(&self.meta_buf)
    }

    /// Reads the next request header on a server: `Ok(None)` on a clean end
    /// of stream, or when no request started within [`IDLE_TIMEOUT`].
    /// Message buffers over [`IDLE_BUFFER`] are given back once no request
    /// started for [`SHRINK_AFTER`].
    pub async fn next_request(&mut self) -> KvResult<Option<FrameHeader>> {
        let deadline = tokio::time::Instant::now() + IDLE_TIMEOUT;
        let big = self.meta_buf.capacity().max(self.out_buf.capacity()) > IDLE_BUFFER;
        if big && self.reader.buffer().is_empty() {
            // Waits for input without taking any (a dropped `fill_buf`
            // loses nothing): an end or error is left to read_header.
            use tokio::io::AsyncBufReadExt;
            if tokio::time::timeout(SHRINK_AFTER, self.reader.fill_buf())
                .await
                .is_err()
            {
                self.shrink_buffers();
            }
        }
        match tokio::time::timeout_at(deadline, self.read_header()).await {
            Ok(r) => r,
            Err(_) => {
                tracing::debug!(peer = %self.peer, "idle connection closed");
                Ok(None)
            }
        }
    }

    /// Waits until the peer closes this idle connection or sends on it
    /// unasked: either way it cannot carry another exchange. Cancel-safe:
    /// dropped before then, it has read nothing.
    pub async fn closed(&mut self) {
        use tokio::io::AsyncBufReadExt;
        let _ = self.reader.fill_buf().await;
    }

    /// Bytes this connection holds in buffers of its own (reads, writes,
    /// messages), however much of them is in use.
    pub fn buffered_bytes(&self) -> usize {
        2 * IO_BUFFER + self.meta_buf.capacity() + self.out_buf.capacity()
    }

    /// Gives back message buffers over [`IDLE_BUFFER`] (the read and write
    /// buffers are [`IDLE_BUFFER`] each and stay).
    pub fn shrink_buffers(&mut self) {
        if self.meta_buf.capacity() > IDLE_BUFFER {
            self.meta_buf = Vec::new();
        }
        if self.out_buf.capacity() > IDLE_BUFFER {
            self.out_buf = Vec::new();
        }
    }

    /// The message read by the last [`Self::read_meta`].
    pub fn last_meta(&self) -> &[u8] {
        &self.meta_buf
    }

    /// Reads exactly `dst.len()` payload bytes straight into `dst`, at
    /// least [`PROGRESS_BYTES`] every [`PROGRESS_TIMEOUT`]: a peer that
    /// declares a big payload and trickles it cannot hold the connection.
    pub async fn read_payload(&mut self, dst: &mut [u8]) -> KvResult<()> {
        self.read_payload_seen(dst, |_| {}).await
    }

    /// [`Self::read_payload`], giving `seen` each piece of `dst` (at most
    /// [`SEEN_PIECE`]) as it lands, while it is still in the cache: a
    /// checksum over the pieces then costs no second pass over memory.
    pub async fn read_payload_seen(
        &mut self,
        dst: &mut [u8],
        mut seen: impl FnMut(&[u8]),
    ) -> KvResult<()> {
        for window in dst.chunks_mut(PROGRESS_BYTES) {
            let (reader, seen) = (&mut self.reader, &mut seen);
            let read = async move {
                for piece in window.chunks_mut(SEEN_PIECE) {
                    fill_payload(reader, piece).await?;
                    seen(piece);
                }
                Ok::<_, std::io::Error>(())
            };
            match tokio::time::timeout(PROGRESS_TIMEOUT, read).await {
                Ok(r) => r.map_err(|e| io_error(&format!("read from {}", self.peer), e))?,
                Err(_) => return Err(self.too_slow()),
            };
        }
        Ok(())
    }

    /// [`Self::read_payload`] into memory that may stop being ours midway:
    /// each read into `dst` runs inside the guard `enter` gives, and once it
    /// gives none, nothing more lands in `dst`: the rest of the payload is
    /// read and thrown away, and the answer is `Ok(false)`. `seen` is given
    /// each piece of `dst` as it lands, while it is still in cache.
    pub async fn read_payload_fenced<G>(
        &mut self,
        dst: &mut [u8],
        enter: impl Fn() -> Option<G>,
        mut seen: impl FnMut(&[u8]),
    ) -> KvResult<bool> {
        let mut at = 0;
        let mut window = (0, tokio::time::Instant::now());
        while at < dst.len() {
            if at >= window.0 {
                window = (
                    at + PROGRESS_BYTES,
                    tokio::time::Instant::now() + PROGRESS_TIMEOUT,
                );
            }
            let end = window.0.min(dst.len());
            let due = dst.len() - at;
            let (reader, chunk) = (&mut self.reader, &mut dst[at..end]);
            let read = std::future::poll_fn(|cx| {
                let Some(_inside) = enter() else {
                    return Poll::Ready(Ok(None));
                };
                let mut buf = ReadBuf::new(chunk);
                eager::payload_due(due, || poll_payload(reader, cx, &mut buf))
                    .map_ok(|()| Some(buf.filled().len()))
            });
            match tokio::time::timeout_at(window.1, read).await {
                Err(_) => return Err(self.too_slow()),
                Ok(Err(e)) => return Err(io_error(&format!("read from {}", self.peer), e)),
                Ok(Ok(Some(0))) => {
                    return Err(KvError::new(Code::RpcFail, "connection closed mid-payload"))
                }
                Ok(Ok(Some(n))) => {
                    seen(&dst[at..at + n]);
                    at += n;
                }
                Ok(Ok(None)) => {
                    self.discard_payload((dst.len() - at) as u64).await?;
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Reads and throws away `len` payload bytes, keeping the stream in sync
    /// after a request that was refused; as fast as [`Self::read_payload`].
    pub async fn discard_payload(&mut self, mut len: u64) -> KvResult<()> {
        // Unbounded meanwhile: the bytes are not kept, so going through
        // the buffer costs nothing, and small reads would.
        let cap = std::mem::replace(&mut self.reader.get_mut().cap, usize::MAX);
        while len > 0 {
            let step = len.min(PROGRESS_BYTES as u64);
            let (mut take, mut sink) = ((&mut self.reader).take(step), tokio::io::sink());
            let copy = tokio::io::copy(&mut take, &mut sink);
            let n = match tokio::time::timeout(PROGRESS_TIMEOUT, copy).await {
                Ok(r) => r.map_err(|e| io_error("discard payload", e))?,
                Err(_) => return Err(self.too_slow()),
            };
            if n != step {
                return Err(KvError::new(Code::RpcFail, "connection closed mid-payload"));
            }
            len -= step;
        }
        self.reader.get_mut().cap = cap;
        Ok(())
    }

    fn too_slow(&self) -> KvError {
        KvError::new(
            Code::RpcTimeout,
            format!(
                "{} sent a payload slower than {} KiB per {}s",
                self.peer,
                PROGRESS_BYTES >> 10,
                PROGRESS_TIMEOUT.as_secs()
            ),
        )
    }

    /// Reads a response header for request `id`, turning an error status into
    /// an `Err` (its message is consumed).
    pub async fn read_response(&mut self, id: u64) -> KvResult<FrameHeader> {
        self.read_answer(id).await?
    }

    /// Reads the answer to request `id`. The outer `Err`: the connection is
    /// broken or out of step (nothing after it can be trusted, whatever its
    /// code); the inner one: the error status the peer answered with (its
    /// message consumed, the connection still in step for the next answer).
    pub async fn read_answer(&mut self, id: u64) -> KvResult<KvResult<FrameHeader>> {
        let header = match self.silence.as_ref().map(|s| s.within) {
            None => self.read_header().await,
            Some(within) => match tokio::time::timeout(within, self.read_header()).await {
                Ok(h) => h,
                Err(_) => {
                    if let Some(s) = &self.silence {
                        s.breaker.lock().failed(tokio::time::Instant::now());
                    }
                    return Err(KvError::new(
                        Code::RpcFail,
                        format!("{} sent no answer within {within:?}", self.peer),
                    ));
                }
            },
        };
        let h = header?.ok_or_else(|| {
            KvError::new(
                Code::RpcFail,
                format!("{} closed the connection", self.peer),
            )
        })?;
        if h.kind != FrameKind::Response || h.request_id != id {
            return Err(KvError::new(
                Code::RpcFail,
                format!(
                    "{}: expected response to {id}, got {:?} {}",
                    self.peer, h.kind, h.request_id
                ),
            ));
        }
        if h.status != 0 {
            let msg = String::from_utf8_lossy(self.read_meta(h.meta_len).await?).into_owned();
            self.discard_payload(h.payload_len).await?;
            return Ok(Err(KvError::new(Code::from_i32(h.status), msg)));
        }
        Ok(Ok(h))
    }

    /// Reads the answer to a request answered with nothing (a write): as
    /// [`Self::read_answer`], and an answer that carries bytes is out of step.
    pub async fn read_ack(&mut self, id: u64) -> KvResult<KvResult<()>> {
        Ok(match self.read_answer(id).await? {
            Ok(h) if h.meta_len == 0 && h.payload_len == 0 => Ok(()),
            Ok(_) => {
                return Err(KvError::new(
                    Code::RpcFail,
                    format!("{}: unexpected bytes in an acknowledgement", self.peer),
                ))
            }
            Err(e) => Err(e),
        })
    }

    /// One typed request/response exchange with no payload.
    pub async fn call<R: Rpc>(&mut self, req: &R) -> KvResult<R::Response> {
        self.exchange(req).await?
    }

    /// [`Self::call`], with the errors split as [`Self::read_answer`]
    /// splits them: the inner `Err` (an error status, or an answer that
    /// does not decode) leaves the connection in step.
    pub async fn exchange<R: Rpc>(&mut self, req: &R) -> KvResult<KvResult<R::Response>> {
        let id = self.send_request(req, &[]).await?;
        self.answer_to::<R>(id).await
    }

    /// Sends `auth` in the handshake's own shape (no request trailer),
    /// with the tenant fields after it where `version` has them.
    async fn authenticate(
        &mut self,
        auth: &Auth,
        tenant: &AuthTenant,
        version: u32,
    ) -> KvResult<AuthReply> {
        let id = self.next_id();
        msg::encode_to(auth, &mut self.out_buf);
        compat::append(&mut self.out_buf, version, tenant);
        let h = FrameHeader::request(Opcode::Auth, id, self.out_buf.len() as u32, 0);
        let r = write_frame(&mut self.writer, &h, &self.out_buf, &[]).await;
        r.map_err(|e| self.send_failed(e))?;
        self.answer_to::<Auth>(id).await?
    }

    /// Flushes and reads the control answer to request `id`.
    async fn answer_to<R: Rpc>(&mut self, id: u64) -> KvResult<KvResult<R::Response>> {
        self.flush().await?;
        let rh = match self.read_answer(id).await? {
            Ok(h) => h,
            Err(e) => return Ok(Err(e)),
        };
        if rh.payload_len != 0 {
            return Err(KvError::new(
                Code::RpcFail,
                "unexpected payload in control response",
            ));
        }
        let meta = self.read_meta(rh.meta_len).await?;
        Ok(msg::decode(meta))
    }
}

async fn write_frame(
    w: &mut BufWriter<WriteSide>,
    header: &FrameHeader,
    meta: &[u8],
    payload: &[&[u8]],
) -> io::Result<()> {
    let head = header.encode();
    let total = payload.iter().map(|p| p.len()).sum::<usize>() + meta.len();
    if total < IO_BUFFER {
        w.write_all(&head).await?;
        w.write_all(meta).await?;
        for part in payload {
            w.write_all(part).await?;
        }
        return Ok(());
    }
    // A big frame leaves in vectored writes straight from its parts: the
    // frame header travels with the payload, not as a tiny segment of its
    // own (which costs the receiver a wakeup per frame).
    let mut slices: Vec<io::IoSlice> = Vec::with_capacity(2 + payload.len());
    slices.push(io::IoSlice::new(&head));
    slices.extend(
        std::iter::once(meta)
            .chain(payload.iter().copied())
            .filter(|p| !p.is_empty())
            .map(io::IoSlice::new),
    );
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = w.write_vectored(rest).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

fn peer_of(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn tune_socket(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let sock = socket2::SockRef::from(stream);
    let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
    let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
    if same_host(stream) {
        // A host whose default is BBR paces every connection at the rate it
        // has estimated, and a request/response connection is mostly idle,
        // so a batch's burst is paced out: on loopback, batches of 32 x 64
        // KiB read at 1.2-1.3 GB/s under BBR and 2.3 under CUBIC (2026-12-02).
        // Nothing between two sockets of one host needs pacing. Across
        // hosts the host's choice stands.
        let _ = sock
            .set_tcp_congestion(SAME_HOST_CONGESTION)
            .or_else(|_| sock.set_tcp_congestion(b"reno"));
    }
}

/// The congestion control of connections between two sockets of one host.
const SAME_HOST_CONGESTION: &[u8] = b"cubic";

/// Whether the peer is this host: a loopback address, or the address this
/// end is bound to (a pod or host IP the kernel routes over loopback).
fn same_host(stream: &TcpStream) -> bool {
    match (stream.local_addr(), stream.peer_addr()) {
        (Ok(local), Ok(peer)) => peer.ip().is_loopback() || peer.ip() == local.ip(),
        _ => false,
    }
}

mod eager;
mod handshake;
mod pool;
mod write_side;

use eager::Eager;
pub use eager::{read_eagerly, spin_first, spin_from_env, spinning, ThreadWaker};
pub use handshake::{accept, accept_unix};
use handshake::{refuse_plaintext, refused_auth};
pub use pool::ConnPool;
use write_side::WriteSide;

#[cfg(test)]
mod tests;
