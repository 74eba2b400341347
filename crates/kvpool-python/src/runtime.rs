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

use std::sync::atomic::{AtomicPtr, Ordering};

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
        let v = get().unwrap().block_on(async { 40 + 2 });
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
}
