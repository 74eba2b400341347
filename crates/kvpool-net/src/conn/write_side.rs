//! The write side of a connection, and sending a file's pages on it.
//!
//! On a plain socket (TCP or Unix) a payload that lies in a file can leave
//! with `sendfile`: the kernel hands the socket references to the file's
//! pages instead of copying the bytes into socket buffers, so the sender
//! never touches them. That pays where the pages are big (a huge-page
//! tmpfs); on 4 KiB pages the kernel's lookup of each costs about what
//! copying it does (docs/performance.md), so callers lend only the former.
//! TLS encrypts in user space, so its side always copies.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncWrite, Interest};
use tokio::net::{tcp, unix};

/// The write half of a connection.
pub(super) enum WriteSide {
    /// A plain TCP socket's.
    Tcp(tcp::OwnedWriteHalf),
    /// A Unix socket's.
    Unix(unix::OwnedWriteHalf),
    /// A stream that transforms its bytes (TLS): no file pages pass it.
    Other(Box<dyn AsyncWrite + Send + Unpin>),
}

/// Runs `$body` with `$w` bound to the pinned inner writer of `$side`.
macro_rules! each_side {
    ($side:expr, $w:ident => $body:expr) => {
        match $side.get_mut() {
            WriteSide::Tcp(w) => {
                let $w = Pin::new(w);
                $body
            }
            WriteSide::Unix(w) => {
                let $w = Pin::new(w);
                $body
            }
            WriteSide::Other(w) => {
                let $w = Pin::new(w);
                $body
            }
        }
    };
}

/// Runs the non-blocking socket call `$call` on `$stream` once the socket
/// is writable, until it does not answer `WouldBlock`.
macro_rules! when_writable {
    ($stream:expr, $call:expr) => {{
        let stream = $stream;
        let fd = stream.as_raw_fd();
        loop {
            stream.writable().await?;
            match stream.try_io(Interest::WRITABLE, || $call(fd)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => break r,
            }
        }
    }};
}

impl WriteSide {
    /// Whether file pages can be handed to this side ([`Self::send_file`]).
    pub(super) fn takes_files(&self) -> bool {
        !matches!(self, WriteSide::Other(_))
    }

    /// Runs `call` with the socket's fd once it is writable, until it does
    /// not answer `WouldBlock`. `Unsupported` on a side with no plain socket.
    async fn on_socket<T>(
        &mut self,
        mut call: impl FnMut(RawFd) -> io::Result<T>,
    ) -> io::Result<T> {
        match self {
            WriteSide::Tcp(w) => when_writable!(w.as_ref(), call),
            WriteSide::Unix(w) => when_writable!(w.as_ref(), call),
            WriteSide::Other(_) => Err(io::ErrorKind::Unsupported.into()),
        }
    }

    /// Sends all of a frame's header, telling the kernel its payload
    /// follows at once (`MSG_MORE`): the header then leaves in the same
    /// segment as the payload's pages, not in one of its own.
    pub(super) async fn send_header(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let n = self
                .on_socket(|fd| {
                    // SAFETY: `bytes` is valid for its length; `fd` is this
                    // side's socket, open while `self` lives.
                    let n = unsafe {
                        libc::send(
                            fd,
                            bytes.as_ptr().cast(),
                            bytes.len(),
                            libc::MSG_MORE | libc::MSG_NOSIGNAL,
                        )
                    };
                    usize::try_from(n).map_err(|_| io::Error::last_os_error())
                })
                .await?;
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// Sends up to `len` bytes of `file` from `offset` with `sendfile`;
    /// answers how many left. `Ok(0)`: the file system lends no pages (or
    /// the file is shorter): the caller sends the bytes itself.
    pub(super) async fn send_file(
        &mut self,
        file: BorrowedFd<'_>,
        offset: u64,
        len: u64,
    ) -> io::Result<u64> {
        let mut off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        // Linux sends at most this much per call anyway.
        let count = len.min(0x7fff_f000) as usize;
        let sent = self
            .on_socket(|fd| {
                // SAFETY: both fds are open while their owners live; `off`
                // is a local the kernel advances.
                let n = unsafe { libc::sendfile(fd, file.as_raw_fd(), &mut off, count) };
                u64::try_from(n).map_err(|_| io::Error::last_os_error())
            })
            .await;
        match sent {
            // Files whose file system cannot splice its pages (hugetlbfs).
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => Ok(0),
            r => r,
        }
    }
}

impl AsyncWrite for WriteSide {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each_side!(self, w => w.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each_side!(self, w => w.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteSide::Tcp(w) => w.is_write_vectored(),
            WriteSide::Unix(w) => w.is_write_vectored(),
            WriteSide::Other(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_side!(self, w => w.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_side!(self, w => w.poll_shutdown(cx))
    }
}
