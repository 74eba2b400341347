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
use std::task::{Context, Poll};

use socket2::SockRef;
use tokio::io::{AsyncRead, ReadBuf};

thread_local! {
    /// Set while this thread polls a caller's future in [`read_eagerly`].
    static EAGER: Cell<bool> = const { Cell::new(false) };
}

/// Polls `f` with this thread reading the sockets of the connections that
/// future reads from itself, when the runtime has not seen them readable
/// yet. For a caller that spins on its own thread (the Python binding's
/// `block_on`); the runtime's workers never set it.
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
/// the runtime answers `Pending`.
pub(super) struct Eager<H>(pub(super) H);

impl<H: SocketHalf> AsyncRead for Eager<H> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let half = &mut self.0;
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

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
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _ctx = rt.enter();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut b = l.accept().unwrap().0;
        a.set_nonblocking(true).unwrap();
        let (r, _w) = tokio::net::TcpStream::from_std(a).unwrap().into_split();
        let mut r = Eager(r);
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
}
