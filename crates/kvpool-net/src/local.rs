//! Same-host sockets: a server that listens on TCP `addr` also listens on
//! a Unix socket in the abstract namespace named after that address (and
//! its kind: `kvpool-store`, `kvpool-engine`), so a peer in the same kernel
//! and network namespace that names it by that address finds it there and
//! moves bytes without the TCP stack.
//!
//! Only the same user is served or trusted on either side (`SO_PEERCRED`):
//! such a process could read and write the other's memory through ptrace
//! anyway. The handshake on top still proves the cluster secret.

use std::future::Future;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The kind of a store's data plane (and of a client lending a segment).
pub const STORE: &str = "kvpool-store";
/// The kind of a transfer engine.
pub const ENGINE: &str = "kvpool-engine";

/// The abstract socket name of the `kind` server reached at TCP `addr`.
fn socket_addr(kind: &str, addr: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("{kind}/{addr}").as_bytes())
}

/// This process's effective user.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Listens beside the `kind` server at TCP `addr`; `None` when the name is
/// taken (peers then use TCP).
pub fn listen(kind: &str, addr: &str) -> Option<UnixListener> {
    let bound = socket_addr(kind, addr)
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .and_then(|l| {
            l.set_nonblocking(true)?;
            UnixListener::from_std(l)
        });
    match bound {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::debug!(%kind, %addr, error = %e, "no same-host socket: peers on this host use TCP");
            None
        }
    }
}

/// Who connected to a same-host socket: `Some(pid)` for a process of this
/// user (the pid is `None` when the kernel cannot name it here, e.g. from
/// another pid namespace), `None` for another user, refused.
pub fn caller(stream: &UnixStream) -> Option<Option<i32>> {
    let cred = stream.peer_cred().ok()?;
    (cred.uid() == euid()).then(|| cred.pid().filter(|&p| p > 0))
}

/// Accepts this user's connections on `listener` until `shutdown`, at most
/// `max` served at once (more wait to be accepted), and runs `serve` on
/// each with the caller's pid (see [`caller`]) in a task of its own;
/// returns once those have finished.
pub async fn serve<F, Fut>(
    listener: UnixListener,
    max: usize,
    shutdown: CancellationToken,
    serve: F,
) where
    F: Fn(UnixStream, Option<i32>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(max));
    let tracker = TaskTracker::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!(error = %e, "same-host accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(pid) = caller(&stream) else {
            tracing::debug!("refused a same-host connection from another user");
            continue;
        };
        let served = serve(stream, pid);
        tracker.spawn(async move {
            served.await;
            drop(slot);
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// Connects to the same-host socket of the `kind` server at `peer`
/// (`ip:port`); `None` when nothing of this user listens there (the peer
/// is on another host or in another network namespace, or has it off).
pub fn connect(kind: &str, peer: &str) -> Option<UnixStream> {
    let addr = socket_addr(kind, peer).ok()?;
    // A connect to a listening Unix socket completes at once (or fails).
    let std = std::os::unix::net::UnixStream::connect_addr(&addr).ok()?;
    std.set_nonblocking(true).ok()?;
    let stream = UnixStream::from_std(std).ok()?;
    let cred = stream.peer_cred().ok()?;
    (cred.uid() == euid()).then_some(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener is found by its kind and address only, and answers as
    /// this user.
    #[tokio::test]
    async fn a_peer_finds_the_socket_by_kind_and_address() {
        let addr = format!("127.0.0.1:{}", std::process::id());
        let l = listen("kvpool-test", &addr).expect("the name is free");
        assert!(
            listen("kvpool-test", &addr).is_none(),
            "a name is bound once"
        );
        assert!(connect("kvpool-other", &addr).is_none());
        assert!(connect("kvpool-test", "127.0.0.1:1").is_none());
        let c = connect("kvpool-test", &addr).expect("same user, same namespace");
        let (s, _) = l.accept().await.unwrap();
        assert_eq!(caller(&s), Some(Some(std::process::id() as i32)));
        drop(c);
    }
}
