//! A disk-tier segment file, read and written with O_DIRECT in whole
//! [`DISK_BLOCK`]s: the page cache would keep a second copy, in memory, of
//! exactly what the tier exists to keep out of memory, and evict the
//! memory tier's pages to do it.
//!
//! Objects are written header last: the blocks after the first go down
//! first, then the block holding the header. A copy cut short by a crash
//! therefore has no header (or the old, invalidated one) and a scan never
//! finds it; every read verifies header and checksum anyway.
//!
//! Calls block (pread/pwrite). Async callers hand them to the file's own I/O
//! threads ([`DiskFile::submit`]), as many as the queue depth: each takes
//! the next queued job the moment its I/O is done, so while there is work
//! the device gets its next request with no thread woken in between (a
//! per-request hop through the runtime's blocking pool cost more than the
//! device's own latency for 4 KiB reads on a busy host). The first I/O
//! error takes the file offline: every later call fails at once, so a
//! failing disk is never read again and the store can withdraw the tier.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvpool_proto::msg::{SegmentId, SegmentIo, DISK_BLOCK};
use parking_lot::{Condvar, Mutex, RwLock};

const BLOCK: usize = DISK_BLOCK as usize;

/// Buffers kept for reuse: enough for the requests a store has in flight.
const POOLED: usize = 64;
/// Buffers larger than this are not kept (rare, and they pin memory).
const POOL_MAX: usize = 8 << 20;

/// A heap buffer aligned to [`DISK_BLOCK`] whose length is a multiple of
/// it, as O_DIRECT wants.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: it owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(len: usize) -> std::alloc::Layout {
        // BLOCK is a power of two and len a multiple of it: cannot fail.
        std::alloc::Layout::from_size_align(len, BLOCK).expect("block layout")
    }

    /// An uninitialized-then-zeroed buffer of at least `len` bytes, rounded
    /// up to whole blocks.
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(1).div_ceil(BLOCK) * BLOCK;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout(len)) };
        let ptr =
            NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout(len)));
        AlignedBuf { ptr, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes were allocated (and zeroed) at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

/// Bytes read from a disk segment: a block-aligned buffer and where in it
/// the bytes asked for are.
pub struct DiskRead {
    /// Always `Some` until dropped (then back to the pool).
    buf: Option<AlignedBuf>,
    start: usize,
    len: usize,
    pool: Option<Arc<Mutex<Vec<AlignedBuf>>>>,
}

impl DiskRead {
    /// The bytes asked for.
    pub fn bytes(&self) -> &[u8] {
        self.buf
            .as_deref()
            .map_or(&[][..], |b| &b[self.start..self.start + self.len])
    }
}

impl Drop for DiskRead {
    fn drop(&mut self) {
        if let (Some(pool), Some(buf)) = (&self.pool, self.buf.take()) {
            let mut p = pool.lock();
            if p.len() < POOLED {
                p.push(buf);
            }
        }
    }
}

/// Counters of a disk file's I/O since it was opened.
#[derive(Default)]
struct Counters {
    read_ops: AtomicU64,
    read_bytes: AtomicU64,
    read_us: AtomicU64,
    write_ops: AtomicU64,
    write_bytes: AtomicU64,
    write_us: AtomicU64,
    errors: AtomicU64,
}

/// Default I/O requests a store keeps in flight to one disk tier.
pub const QUEUE_DEPTH: usize = 32;

/// Stack of an I/O thread: its jobs are a read or write call and a copy.
const IO_THREAD_STACK: usize = 256 << 10;

/// A job for the I/O threads.
type Job = Box<dyn FnOnce() + Send>;

/// What the I/O threads of one file share: the jobs waiting, in order.
#[derive(Default)]
struct IoQueue {
    state: Mutex<QueueState>,
    /// Signalled when a job arrives for an idle thread, or at close.
    work: Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    /// Set when the file is dropped: the threads exit once the queue is empty.
    closed: bool,
}

impl IoQueue {
    fn push(&self, job: Job) {
        self.state.lock().jobs.push_back(job);
        // Wakes an idle thread, if any (no cost when none waits); a busy
        // one takes the job when its I/O is done.
        self.work.notify_one();
    }

    /// One I/O thread: runs jobs until the queue is closed and empty.
    fn serve(&self) {
        let mut s = self.state.lock();
        loop {
            if let Some(job) = s.jobs.pop_front() {
                drop(s);
                // A job that panics loses its answer (its caller sees an
                // error), not the thread: the queue depth stays whole.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                s = self.state.lock();
                continue;
            }
            if s.closed {
                return;
            }
            self.work.wait(&mut s);
        }
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.work.notify_all();
    }
}

/// An open disk-tier segment file.
pub struct DiskFile {
    file: File,
    /// Jobs for the I/O threads, `queue_depth` of them: requests in flight
    /// to the device at most (reads, copies, invalidations).
    io: Arc<IoQueue>,
    path: PathBuf,
    size: u64,
    direct: bool,
    failed: AtomicBool,
    counters: Counters,
    pool: Arc<Mutex<Vec<AlignedBuf>>>,
    /// Held exclusively while an invalidation rewrites the block it read,
    /// shared while an object is written. A block is destroyed by reading
    /// it and writing it back with its generation cleared: a copy landing
    /// in between (into a region the master gave out again while the old
    /// object's destruction was still on its way) would be overwritten by
    /// the old block, and the new object lost.
    rewrites: RwLock<()>,
}

/// Reserves the blocks of the disk tier's file, so that a file system
/// filled by something else later (logs, another tier) cannot fail the
/// tier's writes, which would withdraw it and lose its objects. Where that
/// fails (a file system without `fallocate`, or with less room than the
/// tier) the file stays sparse, with a warning: the tier then fails, and is
/// withdrawn, when the file system fills. The syscall is used rather than
/// `posix_fallocate`, whose fallback writes every block.
fn reserve(file: &File, path: &Path, size: u64) {
    use std::os::fd::AsRawFd;
    let Ok(len) = libc::off_t::try_from(size) else {
        return;
    };
    // SAFETY: plain syscall on an open descriptor we own.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0 {
        let e = io::Error::last_os_error();
        tracing::warn!(path = %path.display(), size, error = %e, "cannot reserve the disk tier's blocks; its writes fail, and the tier is withdrawn, if the file system fills");
    }
}

impl DiskFile {
    /// Opens (creating) the file at `path` with `size` bytes, its blocks
    /// reserved (see [`reserve`]), with O_DIRECT where the file system has it (tmpfs does not: then the page
    /// cache is used, which is what tmpfs is anyway), keeping at most
    /// `queue_depth` requests in flight to it.
    pub fn open(path: &Path, size: u64, queue_depth: usize) -> io::Result<DiskFile> {
        if !size.is_multiple_of(DISK_BLOCK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("disk segment size {size} is not a multiple of {DISK_BLOCK}"),
            ));
        }
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(flags)
                .open(path)
        };
        let (file, direct) = match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %path.display(), "the file system has no O_DIRECT; the disk tier goes through the page cache");
                (open(0)?, false)
            }
            Err(e) => return Err(e),
        };
        if file.metadata()?.len() != size {
            file.set_len(size)?;
        }
        reserve(&file, path, size);
        let disk = DiskFile {
            file,
            io: Arc::new(IoQueue::default()),
            path: path.to_path_buf(),
            size,
            direct,
            failed: AtomicBool::new(false),
            counters: Counters::default(),
            pool: Default::default(),
            rewrites: RwLock::new(()),
        };
        for i in 0..queue_depth.max(1) {
            let io = disk.io.clone();
            // On failure, dropping `disk` stops the threads already started.
            std::thread::Builder::new()
                .name(format!("kvpool-disk-io-{i}"))
                .stack_size(IO_THREAD_STACK)
                .spawn(move || io.serve())?;
        }
        Ok(disk)
    }

    /// Queues `job` (blocking I/O on this file, which it is handed) for the
    /// file's I/O threads, which run queued jobs in order, as many at once
    /// as the queue depth. The job is queued now, not when the returned
    /// future is first polled; dropping the future does not cancel it. The
    /// future fails only if the job panicked.
    pub fn submit<T: Send + 'static>(
        self: &Arc<Self>,
        job: impl FnOnce(&DiskFile) -> T + Send + 'static,
    ) -> impl Future<Output = io::Result<T>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let file = self.clone();
        self.io.push(Box::new(move || {
            let _ = tx.send(job(&file));
        }));
        async move {
            rx.await
                .map_err(|_| io::Error::other("a disk I/O job panicked"))
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Whether it has no bytes (never: opening needs a size).
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Whether reads and writes bypass the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Whether an I/O error took it offline.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Its I/O since it was opened, as heartbeats report it.
    pub fn io(&self, segment: SegmentId) -> SegmentIo {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SegmentIo {
            segment,
            read_ops: get(&c.read_ops),
            read_bytes: get(&c.read_bytes),
            read_us: get(&c.read_us),
            write_ops: get(&c.write_ops),
            write_bytes: get(&c.write_bytes),
            write_us: get(&c.write_us),
            errors: get(&c.errors),
        }
    }

    /// Whether `len` bytes at `offset` lie inside the file.
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.failed() {
            return Err(io::Error::other(format!(
                "disk tier {} is offline after an I/O error",
                self.path.display()
            )));
        }
        if !self.contains(offset, len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{offset}+{len} lies outside the disk segment of {} bytes",
                    self.size
                ),
            ));
        }
        Ok(())
    }

    /// Counts a failed I/O; the first takes the file offline.
    fn failure(&self, what: &str, offset: u64, e: io::Error) -> io::Error {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        if !self.failed.swap(true, Ordering::Relaxed) {
            tracing::error!(path = %self.path.display(), offset, error = %e,
                "disk tier {what} failed: the disk tier is offline; memory keeps serving");
        }
        e
    }

    fn buffer(&self, len: usize) -> AlignedBuf {
        let len = len.max(1).div_ceil(BLOCK) * BLOCK;
        if len <= POOL_MAX {
            let mut pool = self.pool.lock();
            if let Some(i) = pool.iter().position(|b| b.len >= len && b.len <= len * 2) {
                return pool.swap_remove(i);
            }
        }
        AlignedBuf::new(len)
    }

    /// Reads `len` bytes at `offset` (any alignment): the whole blocks that
    /// cover them, in one read.
    pub fn read(&self, offset: u64, len: u64) -> io::Result<DiskRead> {
        self.check(offset, len)?;
        let first = offset / DISK_BLOCK * DISK_BLOCK;
        let end = (offset + len).div_ceil(DISK_BLOCK) * DISK_BLOCK;
        let span = usize::try_from(end - first).map_err(io::Error::other)?;
        let mut buf = self.buffer(span);
        let started = Instant::now();
        self.file
            .read_exact_at(&mut buf[..span], first)
            .map_err(|e| self.failure("read", first, e))?;
        let c = &self.counters;
        c.read_ops.fetch_add(1, Ordering::Relaxed);
        c.read_bytes.fetch_add(span as u64, Ordering::Relaxed);
        c.read_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        let pool = (buf.len <= POOL_MAX).then(|| self.pool.clone());
        Ok(DiskRead {
            buf: Some(buf),
            start: (offset - first) as usize,
            len: len as usize,
            pool,
        })
    }

    /// Writes `bytes` at block-aligned `offset`, zero-filling the last block,
    /// header last: every block after the first, then the first. `check`
    /// sees the copy about to be written (taken before any write, so bytes
    /// changing under it cannot tear it) and may refuse it: `Ok(false)`.
    pub fn write_object(
        &self,
        offset: u64,
        bytes: &[u8],
        check: impl FnOnce(&[u8]) -> bool,
    ) -> io::Result<bool> {
        if !offset.is_multiple_of(DISK_BLOCK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("disk write at {offset}: not block-aligned"),
            ));
        }
        let span = bytes.len().max(1).div_ceil(BLOCK) * BLOCK;
        self.check(offset, span as u64)?;
        let mut buf = self.buffer(span);
        buf[..bytes.len()].copy_from_slice(bytes);
        buf[bytes.len()..span].fill(0);
        if !check(&buf[..bytes.len()]) {
            self.recycle(buf);
            return Ok(false);
        }
        let started = Instant::now();
        let _writing = self.rewrites.read();
        if span > BLOCK {
            self.file
                .write_all_at(&buf[BLOCK..span], offset + DISK_BLOCK)
                .map_err(|e| self.failure("write", offset, e))?;
        }
        self.file
            .write_all_at(&buf[..BLOCK], offset)
            .map_err(|e| self.failure("write", offset, e))?;
        self.recycle(buf);
        let c = &self.counters;
        c.write_ops.fetch_add(1, Ordering::Relaxed);
        c.write_bytes.fetch_add(span as u64, Ordering::Relaxed);
        c.write_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// Destroys the objects at `regions` (offset, generation) as
    /// [`Self::invalidate`] does; how many were destroyed. A failed write
    /// counts as not destroyed (and takes the file offline).
    pub fn invalidate_all(&self, regions: &[(u64, u64)]) -> usize {
        regions
            .iter()
            .filter(|&&(off, gen)| self.invalidate(off, gen).unwrap_or(false))
            .count()
    }

    /// Destroys the object at block-aligned `offset` if its header still
    /// carries `generation` (see `kvpool_format::scan::invalidate`).
    pub fn invalidate(&self, offset: u64, generation: u64) -> io::Result<bool> {
        if !offset.is_multiple_of(DISK_BLOCK) || !self.contains(offset, DISK_BLOCK) {
            return Ok(false);
        }
        self.check(offset, DISK_BLOCK)?;
        let mut buf = self.buffer(BLOCK);
        let _rewriting = self.rewrites.write();
        self.file
            .read_exact_at(&mut buf[..BLOCK], offset)
            .map_err(|e| self.failure("read", offset, e))?;
        let destroyed = kvpool_format::scan::invalidate(&mut buf[..BLOCK], generation);
        if destroyed {
            self.file
                .write_all_at(&buf[..BLOCK], offset)
                .map_err(|e| self.failure("write", offset, e))?;
            self.counters.write_ops.fetch_add(1, Ordering::Relaxed);
            self.counters
                .write_bytes
                .fetch_add(DISK_BLOCK, Ordering::Relaxed);
        }
        self.recycle(buf);
        Ok(destroyed)
    }

    /// Reads whole blocks at aligned `offset` into `buf` (its length a
    /// multiple of the block), for scans; counted as reads.
    pub fn read_blocks(&self, offset: u64, buf: &mut AlignedBuf, len: usize) -> io::Result<()> {
        let len = len.div_ceil(BLOCK) * BLOCK;
        self.check(offset, len as u64)?;
        self.file
            .read_exact_at(&mut buf[..len], offset)
            .map_err(|e| self.failure("read", offset, e))?;
        self.counters.read_ops.fetch_add(1, Ordering::Relaxed);
        self.counters
            .read_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Writes whole blocks at aligned `offset` from `buf` (the superblock).
    pub fn write_blocks(&self, offset: u64, buf: &AlignedBuf) -> io::Result<()> {
        self.check(offset, buf.len as u64)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.failure("write", offset, e))?;
        self.file.sync_data()
    }

    fn recycle(&self, buf: AlignedBuf) {
        if buf.len <= POOL_MAX {
            let mut pool = self.pool.lock();
            if pool.len() < POOLED {
                pool.push(buf);
            }
        }
    }
}

impl Drop for DiskFile {
    fn drop(&mut self) {
        // The threads finish what is queued, then exit.
        self.io.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: u64) -> (tempfile::TempDir, DiskFile) {
        // Not /dev/shm: tmpfs has no O_DIRECT, and this is the disk path.
        let dir = tempfile::Builder::new()
            .prefix("kvpool-disk-test")
            .tempdir_in(std::env::temp_dir())
            .unwrap();
        let f = DiskFile::open(&dir.path().join("disk.kvp"), size, QUEUE_DEPTH).unwrap();
        (dir, f)
    }

    /// The file's blocks are reserved at open: a file system filled by
    /// something else later cannot fail the tier's writes.
    #[test]
    fn the_file_is_reserved_at_open() {
        use std::os::unix::fs::MetadataExt;
        let size = 8 << 20;
        let (dir, _f) = file(size);
        let meta = std::fs::metadata(dir.path().join("disk.kvp")).unwrap();
        assert_eq!(meta.len(), size);
        assert!(meta.blocks() * 512 >= size, "{} blocks", meta.blocks());
    }

    /// The destruction of a block's old object, racing a new object's copy
    /// into the same block (the master gave the region out again before
    /// the destruction was delivered), never leaves the new one damaged:
    /// its read-modify-write cannot write the old block back over the copy.
    #[test]
    fn a_destruction_racing_a_copy_into_its_block_never_undoes_the_copy() {
        use kvpool_format::{value_checksum, ObjectHeader};
        let object = |key: &str, generation: u64| {
            let value = vec![generation as u8; 6000];
            let mut b = ObjectHeader {
                key: key.into(),
                value_len: value.len() as u64,
                generation,
                checksum: value_checksum(&[&value]),
            }
            .encode();
            b.extend_from_slice(&value);
            b
        };
        let (_d, f) = file(1 << 20);
        let f = Arc::new(f);
        let at = 4 * DISK_BLOCK;
        let mut undone = 0;
        for round in 1..=400u64 {
            let (old_gen, new_gen) = (2 * round, 2 * round + 1);
            assert!(f
                .write_object(at, &object("old", old_gen), |_| true)
                .unwrap());
            let new = object("new", new_gen);
            let destroyer = f.clone();
            let destroy = std::thread::spawn(move || destroyer.invalidate(at, old_gen).unwrap());
            assert!(f.write_object(at, &new, |_| true).unwrap());
            destroy.join().unwrap();
            if f.read(at, new.len() as u64).unwrap().bytes() != &new[..] {
                undone += 1;
            }
        }
        assert_eq!(undone, 0, "copies written over by a destruction");
    }

    #[test]
    fn objects_round_trip_at_any_length() {
        let (_d, f) = file(1 << 20);
        for (i, len) in [1usize, 100, 4095, 4096, 4097, 70_000]
            .into_iter()
            .enumerate()
        {
            let at = (i as u64) * 128 * 1024;
            let bytes: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
            assert!(f.write_object(at, &bytes, |_| true).unwrap());
            assert_eq!(f.read(at, len as u64).unwrap().bytes(), &bytes[..]);
            // An unaligned read inside it.
            let r = f.read(at + 3, (len as u64).saturating_sub(3)).unwrap();
            assert_eq!(r.bytes(), &bytes[3.min(len)..]);
        }
        let io = f.io(SegmentId(1));
        assert!(io.read_ops >= 12 && io.write_ops >= 6, "{io:?}");
    }

    #[tokio::test]
    async fn io_threads_run_jobs_at_most_queue_depth_at_once() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let f = Arc::new(DiskFile::open(&dir.path().join("disk.kvp"), 64 * 1024, 3).unwrap());
        let (running, most) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let jobs: Vec<_> = (0..24u64)
            .map(|i| {
                let (running, most) = (running.clone(), most.clone());
                f.submit(move |_| {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    running.fetch_sub(1, Ordering::SeqCst);
                    i
                })
            })
            .collect();
        for (i, job) in jobs.into_iter().enumerate() {
            assert_eq!(job.await.unwrap(), i as u64);
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            3,
            "the queue depth bounds jobs"
        );
        // A job that panics fails alone; the threads keep serving.
        let panics: Vec<_> = (0..3).map(|_| f.submit(|_| panic!("boom"))).collect();
        for p in panics {
            assert!(p.await.is_err());
        }
        assert_eq!(f.submit(|_| 7).await.unwrap(), 7);
    }

    #[test]
    fn out_of_range_and_unaligned_writes_are_refused() {
        let (_d, f) = file(64 * 1024);
        assert!(f.read(60 * 1024, 8 * 1024).is_err());
        assert!(f.read(u64::MAX, 2).is_err());
        assert!(f.write_object(100, b"x", |_| true).is_err());
        assert!(f
            .write_object(64 * 1024 - 4096, &[1; 4097], |_| true)
            .is_err());
        assert!(!f.write_object(0, b"refused", |_| false).unwrap());
        assert_eq!(
            f.read(0, 7).unwrap().bytes(),
            &[0; 7],
            "nothing was written"
        );
        assert!(!f.failed(), "refusals are not I/O errors");
        assert!(DiskFile::open(&f.path().with_extension("odd"), 1000, 1).is_err());
    }
}
