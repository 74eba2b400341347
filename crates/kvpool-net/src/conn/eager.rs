//! Reads a caller's own thread makes from a connection's socket while it
//! spins for an answer ([`read_eagerly`]).
//!
//! A connection's readiness reaches the runtime through its reactor: the
//! kernel wakes a worker parked in `epoll_wait`, and the worker wakes the
//! task. On a virtual machine a sleeping thread takes 20-30 us to wake, so a
//! caller that spins on its own thread still paid one such wake-up per
//! round trip (the client's worker) on top of the server's. Reading the
//! socket from the spinning thread takes the answer as soon as the kernel
//! has it; the worker's wake-up still happens, off the caller's path.

use std::cell::Cell;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::thread::Thread;

use socket2::SockRef;
use tokio::io::{AsyncRead, ReadBuf};

thread_local! {
    /// Set while this thread polls a caller's future in [`read_eagerly`].
    static EAGER: Cell<bool> = const { Cell::new(false) };
    /// Payload bytes certainly still to come on the connection this
    /// thread reads now (see [`payload_due`]).
    static DUE: Cell<usize> = const { Cell::new(0) };
}

/// Smallest and largest low-water mark a payload read asks for.
const LOWAT_MIN: usize = 64 << 10;
const LOWAT_MAX: usize = 512 << 10;

/// Runs `f` (a poll of a payload read) telling the read half that `due`
/// more bytes of the payload are certainly on their way. Read by a
/// caller's thread under [`read_eagerly`], the socket is then not reported
/// readable until that much (at most [`LOWAT_MAX`]) has arrived: a big
/// payload is read in a few large reads instead of many small ones, each
/// of which waited for the socket's lock while the sender's delivery held
/// it (the transfer engine's 4 MiB batch reads over loopback, alternating
/// with and without: 4.28 to 5.24 GB/s).
pub(super) fn payload_due<T>(due: usize, f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            DUE.with(|d| d.set(0));
        }
    }
    DUE.with(|d| d.set(due));
    let _reset = Reset;
    f()
}

/// Polls `f` with this thread reading the sockets of the connections that
/// future reads from itself, when the runtime has not seen them readable
/// yet. For a caller's own thread: the Python binding's `block_on` while
/// it spins, and the client's threads that each run one lane of a big
/// batch; the runtime's workers never set it.
pub fn read_eagerly<T>(f: impl FnOnce() -> T) -> T {
    /// Clears the flag even if `f` panics.
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            EAGER.with(|e| e.set(self.0));
        }
    }
    let _reset = Reset(EAGER.with(|e| e.replace(true)));
    f()
}

/// A spin length from the environment: `var` microseconds (0: never
/// spin), else `default_us`.
pub fn spin_from_env(var: &str, default_us: u64) -> std::time::Duration {
    let us = std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(default_us);
    std::time::Duration::from_micros(us)
}

/// One server task in this process spins at a time (see [`spin_first`]):
/// a second would hold another of the runtime's workers, and on a small
/// host the core the caller needs.
static SPINNING: AtomicBool = AtomicBool::new(false);

/// Awaits `fut`, first polling it on this thread for up to `spin`, reading
/// its sockets eagerly, before leaving it to the runtime. For a server
/// whose peer sends its next request within microseconds of the last
/// answer (a same-host caller's loop of small transfers): a worker parked
/// in `epoll_wait` takes 20-30 us to wake on a virtual machine, more than
/// such a request's whole work. Only one task of the process spins at a
/// time; the others, and this one once `spin` has passed, wait as usual.
/// The spin holds its worker thread, so `spin` must stay short.
pub async fn spin_first<F: std::future::Future>(spin: std::time::Duration, fut: F) -> F::Output {
    /// Lets the next task spin when this one is done (also on panic).
    struct Spinner;
    impl Drop for Spinner {
        fn drop(&mut self) {
            SPINNING.store(false, Ordering::Release);
        }
    }
    let mut fut = std::pin::pin!(fut);
    let mut first = !spin.is_zero();
    std::future::poll_fn(move |cx| {
        let spins = std::mem::take(&mut first)
            && SPINNING
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
        if !spins {
            return fut.as_mut().poll(cx);
        }
        let _spinner = Spinner;
        spin_poll(fut.as_mut(), cx, spin)
    })
    .await
}

/// Awaits `fut`, each poll spinning for up to `spin` on this thread,
/// reading its sockets eagerly, before it gives up the thread. For a
/// future a caller's thread drives with a runtime of its own (see
/// `kvpool_engine`'s caller-driven same-host connections): the spin keeps
/// the thread from parking between a request and its answer.
pub async fn spinning<F: std::future::Future>(spin: std::time::Duration, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx| spin_poll(fut.as_mut(), cx, spin)).await
}

/// Polls `fut` with eager reads until it is ready or `spin` has passed.
fn spin_poll<F: std::future::Future>(
    mut fut: Pin<&mut F>,
    cx: &mut Context<'_>,
    spin: std::time::Duration,
) -> Poll<F::Output> {
    let until = std::time::Instant::now() + spin;
    loop {
        let polled = read_eagerly(|| fut.as_mut().poll(cx));
        if polled.is_ready() || std::time::Instant::now() >= until {
            return polled;
        }
        std::hint::spin_loop();
    }
}

/// Wakes a caller's thread that polls a future itself (with
/// [`read_eagerly`]): sets a flag it checks, then unparks it in case it
/// sleeps, so a wake-up that comes before it parks is not lost.
#[derive(Debug)]
pub struct ThreadWaker {
    woken: AtomicBool,
    thread: Thread,
}

impl ThreadWaker {
    /// A waker for the calling thread.
    pub fn for_this_thread() -> Arc<ThreadWaker> {
        Arc::new(ThreadWaker {
            woken: AtomicBool::new(false),
            thread: std::thread::current(),
        })
    }

    /// Whether it was woken since the last call (clearing it).
    pub fn take(&self) -> bool {
        self.woken.swap(false, Ordering::AcqRel)
    }
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// The read half of a socket connection, whose socket can be read directly.
pub(super) trait SocketHalf: AsyncRead + Send + Unpin {
    /// The socket, to read from without the runtime.
    fn socket(&self) -> SockRef<'_>;
}

impl SocketHalf for tokio::net::tcp::OwnedReadHalf {
    fn socket(&self) -> SockRef<'_> {
        SockRef::from(self.as_ref())
    }
}

impl SocketHalf for tokio::net::unix::OwnedReadHalf {
    fn socket(&self) -> SockRef<'_> {
        SockRef::from(self.as_ref())
    }
}

/// A read half that, under [`read_eagerly`], reads its socket itself when
/// the runtime answers `Pending`, and sets its socket's low-water mark for
/// payloads (see [`payload_due`]).
pub(super) struct Eager<H> {
    half: H,
    /// The `SO_RCVLOWAT` its socket has now.
    lowat: usize,
}

impl<H> Eager<H> {
    pub(super) fn new(half: H) -> Eager<H> {
        Eager { half, lowat: 1 }
    }
}

impl<H: SocketHalf> AsyncRead for Eager<H> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let due = DUE.with(Cell::get);
        // Set by a caller's own thread (see `read_eagerly`), whose other
        // polls of the payload keep it: on the runtime's workers (stores,
        // the Rust client) the two calls per payload cost more than they
        // saved (`kvpool bench`, 2-4% slower). Never more than is certainly
        // coming: the mark must not wait for bytes the peer will not send.
        let want = match (due >= LOWAT_MIN, EAGER.with(Cell::get)) {
            (true, true) => due.min(LOWAT_MAX).min(buf.remaining()),
            (true, false) => self.lowat.min(due),
            (false, _) => 1,
        };
        self.mark(want);
        let before = buf.filled().len();
        let read = self.read_now(cx, buf);
        // The payload is in: back to 1 at once, so that the next frame's
        // arrival is reported however small it is, also when the next read
        // is much later (the connection idle in its pool meanwhile).
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() - before >= due {
            self.mark(1);
        }
        read
    }
}

impl<H: SocketHalf> Eager<H> {
    /// Sets the socket's low-water mark to `bytes` unless it is that.
    fn mark(&mut self, bytes: usize) {
        if bytes != self.lowat {
            // Best effort: a socket that refuses is read as before.
            let _ = set_rcvlowat(&self.half.socket(), bytes);
            self.lowat = bytes;
        }
    }

    /// Reads through the runtime, or (under [`read_eagerly`]) from the
    /// socket itself when the runtime has not seen it readable.
    fn read_now(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let half = &mut self.half;
        match Pin::new(&mut *half).poll_read(cx, buf) {
            // The runtime's socket is non-blocking, so this read cannot
            // wait; the waker stays registered by the poll above, so a
            // `Pending` here is still woken. Nobody else reads this half:
            // the bytes keep their order.
            Poll::Pending if EAGER.with(Cell::get) => {
                // SAFETY: `recv` only writes initialised bytes into the
                // slice, and only the `n` it returns are marked initialised.
                let dst: &mut [MaybeUninit<u8>] = unsafe { buf.unfilled_mut() };
                match half.socket().recv(dst) {
                    Ok(n) => {
                        // SAFETY: the kernel wrote `n` bytes at the start of
                        // the unfilled part (0 is the end of the stream).
                        unsafe { buf.assume_init(n) };
                        buf.advance(n);
                        Poll::Ready(Ok(()))
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) =>
                    {
                        Poll::Pending
                    }
                    Err(e) => Poll::Ready(Err(e)),
                }
            }
            other => other,
        }
    }
}

/// Sets `SO_RCVLOWAT` (socket2 has no setter for it).
fn set_rcvlowat(sock: &SockRef<'_>, bytes: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: a valid socket, and a c_int option value of its size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A runtime nobody drives: its reactor never learns of readiness.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A loopback connection in the entered runtime: its eager read half,
    /// its write half, and the plain socket of the other end.
    fn connected() -> (
        Eager<tokio::net::tcp::OwnedReadHalf>,
        tokio::net::tcp::OwnedWriteHalf,
        std::net::TcpStream,
    ) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let b = l.accept().unwrap().0;
        a.set_nonblocking(true).unwrap();
        let (r, w) = tokio::net::TcpStream::from_std(a).unwrap().into_split();
        (Eager::new(r), w, b)
    }

    /// Polls `fut` once on this thread, with or without eager reads.
    fn poll_once<F: std::future::Future + Unpin>(fut: &mut F, eager: bool) -> Poll<F::Output> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if eager {
            read_eagerly(|| Pin::new(&mut *fut).poll(&mut cx))
        } else {
            Pin::new(fut).poll(&mut cx)
        }
    }

    /// Bytes that reached the socket are read on the polling thread under
    /// `read_eagerly` before the runtime has seen them, in order, and the
    /// end of the stream reads as 0; without it the runtime's readiness
    /// decides.
    #[test]
    fn a_spinning_caller_reads_what_the_kernel_holds() {
        use std::io::Write;
        let rt = runtime();
        let _ctx = rt.enter();
        let (mut r, _w, mut b) = connected();
        let mut buf = [0u8; 8];
        // Registers the socket; nothing has arrived.
        assert!(poll_once(&mut Box::pin(r.read(&mut buf)), true).is_pending());
        // Nothing drives the runtime's reactor here, so it cannot learn
        // that the bytes arrived: only the eager read can take them.
        b.write_all(b"abc").unwrap();
        let wait = || std::thread::sleep(std::time::Duration::from_millis(20));
        wait();
        assert!(poll_once(&mut Box::pin(r.read(&mut buf)), false).is_pending());
        let Poll::Ready(n) = poll_once(&mut Box::pin(r.read(&mut buf)), true) else {
            panic!("the bytes in the socket were not read");
        };
        assert_eq!(&buf[..n.unwrap()], b"abc");
        assert!(poll_once(&mut Box::pin(r.read(&mut buf)), true).is_pending());
        drop(b);
        wait();
        let Poll::Ready(n) = poll_once(&mut Box::pin(r.read(&mut buf)), true) else {
            panic!("the end of the stream was not read");
        };
        assert_eq!(n.unwrap(), 0);
    }

    /// A payload read under a low-water mark gets every byte, in pieces as
    /// they come (the sender pauses mid-payload), the mark is back to 1
    /// once the payload is in, and a small message after it is read as soon
    /// as it arrives, not held back waiting for the mark.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_payload_read_under_a_mark_gets_every_byte_and_lets_the_next_message_through() {
        use std::io::Write;
        use tokio::io::AsyncReadExt;
        const LEN: usize = 300 << 10;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let writer = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            let payload: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
            s.write_all(&payload[..LEN / 3]).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            s.write_all(&payload[LEN / 3..]).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
            s.write_all(b"tail").unwrap();
            s
        });
        let (a, _) = l.accept().await.unwrap();
        let (r, _w) = a.into_split();
        let mut r = Eager::new(r);
        let mut dst = vec![0u8; LEN];
        let (mut at, mut marked) = (0, false);
        while at < LEN {
            let due = LEN - at;
            let n = std::future::poll_fn(|cx| {
                let mut buf = ReadBuf::new(&mut dst[at..]);
                let read =
                    read_eagerly(|| payload_due(due, || Pin::new(&mut r).poll_read(cx, &mut buf)));
                marked |= r.lowat > 1;
                read.map_ok(|()| buf.filled().len())
            })
            .await
            .unwrap();
            assert!(n > 0, "the stream ended mid-payload");
            at += n;
        }
        assert!(marked, "no mark was set while the payload came in pieces");
        assert!(dst.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        assert_eq!(r.lowat, 1, "the mark outlived its payload");
        let mut tail = [0u8; 4];
        tokio::time::timeout(std::time::Duration::from_secs(2), r.read_exact(&mut tail))
            .await
            .expect("the message after the payload was held back")
            .unwrap();
        assert_eq!(&tail, b"tail");
        drop(writer.join().unwrap());
    }

    /// A server spinning for its next request takes it within that one
    /// poll, although nothing drives the runtime's reactor: bytes sent
    /// while it spins are read by the spinning thread itself. Without a
    /// spin the first poll is a plain one.
    #[test]
    fn a_spinning_server_takes_a_request_sent_while_it_spins() {
        use std::io::Write;
        let rt = runtime();
        let _ctx = rt.enter();
        let (mut r, _w, mut b) = connected();
        let mut buf = [0u8; 8];
        let idle = spin_first(std::time::Duration::ZERO, r.read(&mut buf));
        assert!(poll_once(&mut Box::pin(idle), false).is_pending());
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            b.write_all(b"req").unwrap();
            b
        });
        // Far longer than the writer takes: the poll returns once it has
        // the bytes, or (broken) after a minute with nothing.
        let spun = spin_first(std::time::Duration::from_secs(60), r.read(&mut buf));
        let Poll::Ready(n) = poll_once(&mut Box::pin(spun), false) else {
            panic!("the request sent during the spin was not taken");
        };
        assert_eq!(&buf[..n.unwrap()], b"req");
        drop(writer.join().unwrap());
    }
}
