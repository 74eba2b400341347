//! Fan-out: how a batch is cut into jobs (per store, per connection, per
//! core) and how the jobs run, concurrently on the caller's task or, for a
//! big batch that is alone, each on its own thread.
//!
//! The planning ([`lanes`], [`split`]) is pure and unit-tested; the
//! runners only execute what was planned.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::join_all;

use crate::Client;

/// Batches whose share for one store reaches this many bytes are spread
/// over several connections to it (and over cores for shared-memory copies
/// and checksums).
pub(crate) const SPREAD_BYTES: u64 = 1 << 20;

/// A big batch alone runs each lane on a thread of its own only from this
/// many bytes: below it the threads' start and wake-ups cost more than the
/// parallel copies and checksums give. On 2 cores (2026-11-30, one caller,
/// 32 values a batch) 2 MiB batches on threads read 40% slower over TCP
/// and copied 15-25% slower over shared memory than on the caller's task;
/// 16 MiB batches gained 5-25% from them.
pub(crate) const THREAD_BYTES: u64 = 4 << 20;

/// TCP writes of values this big on average keep to one connection a
/// store: the store takes in one stream with fewer wake-ups than four. On
/// 2 cores 32 x 512 KiB batch puts ran 25-40% faster on one connection;
/// 32 x 64 KiB ones 10% faster on four (the store's per-value work then
/// runs on both cores).
pub(crate) const ONE_STREAM_VALUE: u64 = 256 << 10;

/// Parallel lanes (connections or threads) for `items` items of `bytes`
/// bytes: up to `max` when the bytes pay for parallelism, else one.
pub(crate) fn lanes(bytes: u64, items: usize, max: usize) -> usize {
    if bytes >= SPREAD_BYTES {
        max.clamp(1, items.max(1))
    } else {
        1
    }
}

/// [`lanes`] for TCP writes: values of [`ONE_STREAM_VALUE`] or more on
/// average keep to one connection.
pub(crate) fn tcp_write_lanes(bytes: u64, items: usize, max: usize) -> usize {
    if bytes >= ONE_STREAM_VALUE.saturating_mul(items as u64) {
        1
    } else {
        lanes(bytes, items, max)
    }
}

/// Cuts a group into `n` chunks (at least one, at most one an item) of
/// nearly equal count, in order.
pub(crate) fn split<T>(group: Vec<T>, n: usize) -> Vec<Vec<T>> {
    let n = n.clamp(1, group.len().max(1));
    let per = group.len().div_ceil(n).max(1);
    let mut out = Vec::with_capacity(n);
    let mut it = group.into_iter().peekable();
    while it.peek().is_some() {
        out.push(it.by_ref().take(per).collect());
    }
    out
}

/// Cores this process may use, asked once: the answer reads cgroup files,
/// far too slow for every call.
pub(crate) fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl Client {
    /// [`run_jobs_on`], in parallel only for a big batch that is alone: with
    /// several in flight the callers already keep the cores busy, and
    /// threads on top of them only contend (4 concurrent callers' 512 KiB
    /// batch gets were 20% slower with them).
    pub(crate) async fn run_jobs<F>(&self, jobs: Vec<F>, big: bool) -> Vec<F::Output>
    where
        F: Future + Send,
        F::Output: Send,
    {
        if !big {
            return run_jobs_on(jobs, false).await;
        }
        /// Counts a big batch in flight until dropped (also when cancelled).
        struct InFlight<'a>(&'a AtomicUsize);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let alone = self.inner.big_calls.fetch_add(1, Ordering::AcqRel) == 0;
        let _in_flight = InFlight(&self.inner.big_calls);
        run_jobs_on(jobs, alone).await
    }
}

/// Runs transfer jobs to completion. With `parallel` and a multi-thread
/// runtime, each job gets its own thread, so one caller's big batch moves
/// and verifies bytes on every core rather than one. The jobs borrow the
/// caller's buffers; scoped threads (under `block_in_place`) have all ended
/// when this returns, and nothing here can be dropped half-way, so no
/// transfer ever writes into memory its caller stopped waiting for.
pub(crate) async fn run_jobs_on<F>(jobs: Vec<F>, parallel: bool) -> Vec<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    let handle = Handle::current();
    if jobs.len() < 2 || !parallel || handle.runtime_flavor() != RuntimeFlavor::MultiThread {
        return join_all(jobs).await;
    }
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            let running: Vec<_> = jobs
                .into_iter()
                .map(|job| {
                    let handle = &handle;
                    s.spawn(move || block_on_eagerly(handle, job))
                })
                .collect();
            running
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    })
}

/// Runs `fut` to completion on this thread, in `handle`'s context, reading
/// its connections' sockets itself ([`kvpool_net::conn::read_eagerly`]):
/// a lane's payload read then sets its socket's low-water mark, so the
/// kernel reports it readable once per large piece, not per arriving
/// segment, and the lane takes the bytes without a runtime worker waking
/// first and then waking it.
fn block_on_eagerly<F: Future>(handle: &tokio::runtime::Handle, fut: F) -> F::Output {
    use kvpool_net::conn::{read_eagerly, ThreadWaker};
    use std::task::{Context, Poll, Waker};

    let _ctx = handle.enter();
    let wake = ThreadWaker::for_this_thread();
    let waker = Waker::from(wake.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = read_eagerly(|| fut.as_mut().poll(&mut cx)) {
            return v;
        }
        while !wake.take() {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_batches_take_one_lane() {
        assert_eq!(lanes(SPREAD_BYTES - 1, 100, 4), 1);
        assert_eq!(split((0..10).collect(), 1), [(0..10).collect::<Vec<_>>()]);
    }

    #[test]
    fn big_batches_spread_over_lanes_but_never_more_than_items() {
        assert_eq!(lanes(SPREAD_BYTES, 100, 4), 4);
        assert_eq!(lanes(SPREAD_BYTES, 2, 4), 2);
        assert_eq!(lanes(SPREAD_BYTES, 0, 4), 1);
        assert_eq!(lanes(SPREAD_BYTES, 5, 0), 1);
        let chunks = split((0..10).collect::<Vec<_>>(), 4);
        assert_eq!(
            chunks,
            [vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]]
        );
        assert_eq!(split(vec![1, 2], 4), [vec![1], vec![2]]);
        assert_eq!(split(vec![1, 2], 0), [vec![1, 2]]);
    }

    #[test]
    fn tcp_writes_of_big_values_keep_to_one_connection() {
        assert_eq!(tcp_write_lanes(32 * (512 << 10), 32, 4), 1);
        assert_eq!(tcp_write_lanes(32 * (64 << 10), 32, 4), 4);
        assert_eq!(tcp_write_lanes(SPREAD_BYTES - 1, 100, 4), 1);
        assert_eq!(tcp_write_lanes(0, 0, 4), 1);
    }

    #[test]
    fn an_empty_group_makes_no_chunks() {
        assert!(split(Vec::<u8>::new(), 4).is_empty());
    }

    /// Jobs on threads of their own are woken by the runtime (a timer, a
    /// message from one of its tasks) and still answer in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_answer_in_order_on_threads_or_not() {
        for parallel in [false, true] {
            let jobs: Vec<_> = (0..5u64)
                .map(|i| async move {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    tokio::spawn(async move {
                        tokio::time::sleep(std::time::Duration::from_millis(5 * i)).await;
                        let _ = tx.send(i * 10);
                    });
                    rx.await.unwrap()
                })
                .collect();
            assert_eq!(run_jobs_on(jobs, parallel).await, [0, 10, 20, 30, 40]);
        }
    }
}
