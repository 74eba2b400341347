//! One tokio runtime per process, rebuilt after `fork()`.
//!
//! A forked child inherits the parent's memory but none of its threads, so
//! the parent's runtime is a husk there: its workers do not exist and its
//! epoll instance is shared with the parent (deregistering anything from it
//! would break the parent's sockets). The child therefore never touches it —
//! it is leaked, never dropped — and builds a fresh runtime on first use.
//! Runtimes are leaked on purpose: at most one per process, so `&'static`
//! references can be handed out without reference counting, and nothing runs
//! a runtime destructor in a process that does not own its threads.
//!
//! Calls run on the caller's thread ([`block_on`]), which spins briefly
//! before it sleeps when it waits alone.

use std::future::Future;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use kvpool_proto::{Code, KvError, KvResult};

/// A runtime and the process it belongs to.
struct Entry {
    pid: u32,
    rt: tokio::runtime::Runtime,
}

/// The current process's runtime; null until first use. Lock-free, so a fork
/// that happens while another thread is here cannot leave a lock held in the
/// child.
static CURRENT: AtomicPtr<Entry> = AtomicPtr::new(std::ptr::null_mut());

/// Worker threads: `KVPOOL_RUNTIME_THREADS`, else min(4, CPUs). Callers'
/// requests run on the calling thread (`block_on`); workers serve heartbeats
/// and, when this process lends a segment, other clients' transfers.
fn worker_threads() -> usize {
    std::env::var("KVPOOL_RUNTIME_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| (1..=256).contains(n))
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .min(4)
        })
}

/// The runtime of this process, built on first use and again in a forked child.
pub fn get() -> KvResult<&'static tokio::runtime::Runtime> {
    let pid = std::process::id();
    let cur = CURRENT.load(Ordering::Acquire);
    // SAFETY: entries are leaked, so a non-null pointer stays valid forever.
    if let Some(e) = unsafe { cur.as_ref() } {
        if e.pid == pid {
            return Ok(&e.rt);
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads())
        .thread_name("kvpool-rt")
        .enable_all()
        .build()
        .map_err(|e| KvError::new(Code::InternalError, format!("cannot start runtime: {e}")))?;
    let fresh = Box::into_raw(Box::new(Entry { pid, rt }));
    match CURRENT.compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // `cur` (the parent's runtime, or null) is leaked, never dropped.
        // SAFETY: `fresh` was just leaked from a Box and is now published.
        Ok(_) => Ok(unsafe { &(*fresh).rt }),
        Err(winner) => {
            // Another thread of this process built one first: use it, and
            // shut ours down (its threads are ours, so dropping is sound).
            // SAFETY: `fresh` was never published; we own it.
            let mine = unsafe { Box::from_raw(fresh) };
            mine.rt.shutdown_background();
            // SAFETY: `winner` is a published, leaked entry.
            match unsafe { winner.as_ref() } {
                Some(e) if e.pid == pid => Ok(&e.rt),
                _ => Err(KvError::new(
                    Code::InternalError,
                    "runtime changed hands during fork",
                )),
            }
        }
    }
}

/// How long a caller waiting alone spins before it sleeps:
/// `KVPOOL_SPIN_US` microseconds (0: never spin), default 200, which
/// covers a round trip to a server that sleeps between requests (about
/// 40-50 us here) several times over: the 50 it was before left a 4 KiB
/// put waiting for wake-ups in about half its round trips.
fn spin_for() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| kvpool_net::conn::spin_from_env("KVPOOL_SPIN_US", 200))
}

/// Callers in [`block_on`] now, in this process.
static INSIDE: AtomicUsize = AtomicUsize::new(0);

/// Counts its caller in [`INSIDE`] while it lives.
struct Inside;

impl Inside {
    fn enter() -> Inside {
        INSIDE.fetch_add(1, Ordering::Relaxed);
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long a waiting caller may spin now: [`spin_for`] while it is the
/// only one waiting, else nothing.
fn spin_now() -> Duration {
    match INSIDE.load(Ordering::Relaxed) {
        1 => spin_for(),
        _ => Duration::ZERO,
    }
}

/// Runs `f` counted among the waiting callers, with how long it may spin
/// at each wait (see [`spin_now`]).
pub fn waiting<T>(f: impl FnOnce(Duration) -> T) -> T {
    let _inside = Inside::enter();
    f(spin_now())
}

/// Runs `fut` to completion on the calling thread, in `rt`'s context.
///
/// The runtime's workers drive the sockets, so an answer reaches a waiting
/// caller as a wake-up from another thread. A sleeping thread takes tens of
/// microseconds to wake on a virtual machine (about 30 here), several times
/// per call, so a caller waiting alone spins for up to [`spin_for`] before
/// it sleeps (a single-threaded 4 KiB put went from 185 to 83 us), and
/// while it spins it polls its future again with eager reads
/// ([`kvpool_net::conn::read_eagerly`]): it takes an answer from the socket
/// itself instead of waiting for the worker that the kernel wakes for it
/// (a repeat 4 KiB get from 49-69 to 43-47 us p50). Beside other waiting
/// callers nobody spins, since on a small machine the spinner would take a
/// core they and the servers need.
pub fn block_on<F: Future>(rt: &tokio::runtime::Runtime, fut: F) -> F::Output {
    let _ctx = rt.enter();
    let _inside = Inside::enter();
    let wake = kvpool_net::conn::ThreadWaker::for_this_thread();
    let waker = Waker::from(wake.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let spin = spin_now();
        let started = Instant::now();
        while !wake.take() {
            if started.elapsed() >= spin {
                std::thread::park();
            } else if let Poll::Ready(v) =
                kvpool_net::conn::read_eagerly(|| fut.as_mut().poll(&mut cx))
            {
                return v;
            }
        }
    }
}

/// Whether `pid` is this process (objects remember the pid that made them).
pub fn is_current(pid: u32) -> bool {
    pid == std::process::id()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_runtime_per_process() {
        let a = get().unwrap() as *const _;
        let b = get().unwrap() as *const _;
        assert_eq!(a, b);
        let v = block_on(get().unwrap(), async { 40 + 2 });
        assert_eq!(v, 42);
        assert!(is_current(std::process::id()));
    }

    #[test]
    fn from_many_threads() {
        let handles: Vec<_> = (0..8)
            .map(|_| std::thread::spawn(|| get().unwrap() as *const _ as usize))
            .collect();
        let ptrs: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(ptrs.windows(2).all(|w| w[0] == w[1]));
    }

    /// Wake-ups from the runtime's workers reach a spinning caller and a
    /// sleeping one alike (the timer fires on a worker after the spin).
    #[test]
    fn block_on_wakes_for_answers_from_other_threads() {
        let rt = get().unwrap();
        for wait in [
            Duration::ZERO,
            Duration::from_micros(20),
            Duration::from_millis(20),
        ] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            rt.spawn(async move {
                tokio::time::sleep(wait).await;
                let _ = tx.send(7);
            });
            assert_eq!(block_on(rt, rx).unwrap(), 7);
        }
        // Callers on several threads at once sleep instead, and still wake.
        let threads: Vec<_> = (0..4)
            .map(|i| {
                std::thread::spawn(move || {
                    let rt = get().unwrap();
                    block_on(rt, async move {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        i
                    })
                })
            })
            .collect();
        let got: Vec<i32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(got, [0, 1, 2, 3]);
    }
}
