//! The same-host path. An engine also listens on a Unix socket in the
//! abstract namespace named after its TCP address, so a peer in the same
//! kernel and network namespace that names it by that address finds it
//! there. On that socket the engine copies bytes between its registered
//! memory and the caller's own memory with `process_vm_readv`/`writev`: one
//! copy by the kernel, no bytes through a socket.
//!
//! Why this is safe to offer:
//! - both ends check the other's credentials (`SO_PEERCRED`): only the same
//!   user is served or trusted, which could read and write the other
//!   process's memory through ptrace anyway; the cluster secret is still
//!   proved in the handshake;
//! - the caller never names a process: the engine copies to and from the
//!   pid the kernel reports for the socket, so a caller can point it only at
//!   its own memory, and the engine touches only its own registered regions
//!   (checked as for every request);
//! - when the kernel refuses the copy (ptrace restrictions, another pid
//!   namespace), the engine answers `NOT_SUPPORTED` and the caller moves the
//!   bytes through the socket instead, still without TCP.
//!
//! `KVPOOL_ENGINE_SAME_HOST` chooses ([`SameHost::from_env`]): unset, the
//! socket with copies; `socket`, the socket with the bytes through it (for
//! hosts where processes must not reach each other's memory); `0`, TCP.

use std::io;

use kvpool_proto::{Code, KvError, KvResult};
use tokio::net::{UnixListener, UnixStream};

/// The variable that chooses the same-host path.
const ENV: &str = "KVPOOL_ENGINE_SAME_HOST";

/// How an engine treats peers on its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameHost {
    /// Over TCP, like any peer.
    Off,
    /// On the same-host socket, the bytes through it.
    Socket,
    /// On the same-host socket, copied straight between the processes.
    Copy,
}

impl SameHost {
    /// What `KVPOOL_ENGINE_SAME_HOST` asks for (`0`, `socket`, else copies).
    pub fn from_env() -> SameHost {
        match std::env::var(ENV).as_deref().map(str::trim) {
            Ok("0") | Ok("off") => SameHost::Off,
            Ok("socket") => SameHost::Socket,
            _ => SameHost::Copy,
        }
    }
}

/// Listens beside the engine serving TCP `addr`; `None` when the name is
/// taken (peers then use TCP).
pub fn listen(addr: &str) -> Option<UnixListener> {
    kvpool_net::local::listen(kvpool_net::local::ENGINE, addr)
}

/// Connects to the same-host socket of the engine at `peer` (`ip:port`);
/// `None` when nothing of this user listens there.
pub async fn connect(peer: &str) -> Option<UnixStream> {
    kvpool_net::local::connect(kvpool_net::local::ENGINE, peer)
}

/// Which way [`copy`] moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// From the caller's memory into the local slice.
    FromCaller,
    /// From the local slice into the caller's memory.
    IntoCaller,
}

/// Copies between `local` (this process) and `remote` in process `pid`.
/// `NOT_SUPPORTED` when the kernel will not let this process reach the
/// other's memory; `INVALID_PARAMS` when the remote range is not mapped
/// there (a part may have been copied).
///
/// # Safety
/// `local` must be valid for reads and, for [`Way::FromCaller`], writes of
/// `len` bytes for the whole call.
pub unsafe fn copy(pid: i32, way: Way, local: *mut u8, remote: u64, len: usize) -> KvResult<()> {
    let mut done = 0usize;
    while done < len {
        let local_iov = libc::iovec {
            // SAFETY: within `local`'s `len` bytes (the caller's promise).
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let remote_iov = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: one iovec each, describing memory the caller vouches for
        // locally; the kernel checks the remote one and fails with EFAULT.
        let n = unsafe {
            match way {
                Way::FromCaller => libc::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0),
                Way::IntoCaller => libc::process_vm_writev(pid, &local_iov, 1, &remote_iov, 1, 0),
            }
        };
        if n <= 0 {
            let e = if n == 0 {
                io::Error::from(io::ErrorKind::UnexpectedEof)
            } else {
                io::Error::last_os_error()
            };
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            let code = match e.raw_os_error() {
                Some(libc::EPERM | libc::ESRCH | libc::ENOSYS | libc::EACCES) => Code::NotSupported,
                _ => Code::InvalidParams,
            };
            return Err(KvError::new(
                code,
                format!("cannot copy {len} bytes at {remote:#x} of process {pid}: {e}"),
            ));
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_with_itself_and_refuses_unmapped_memory() {
        let pid = std::process::id() as i32;
        let src: Vec<u8> = (0..=255).cycle().take(1 << 20).collect();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: `dst` is valid for its length.
        unsafe {
            copy(
                pid,
                Way::FromCaller,
                dst.as_mut_ptr(),
                src.as_ptr() as u64,
                src.len(),
            )
        }
        .unwrap();
        assert_eq!(dst, src);
        let mut back = vec![0u8; 4096];
        // SAFETY: `src` is only read (copied into `back`'s memory by address).
        unsafe {
            copy(
                pid,
                Way::IntoCaller,
                src.as_ptr() as *mut u8,
                back.as_mut_ptr() as u64,
                4096,
            )
        }
        .unwrap();
        assert_eq!(&back[..], &src[..4096]);
        // SAFETY: as above; page 0 is never mapped.
        let err = unsafe { copy(pid, Way::FromCaller, dst.as_mut_ptr(), 16, 4096) }.unwrap_err();
        assert_eq!(err.code, Code::InvalidParams);
    }
}
