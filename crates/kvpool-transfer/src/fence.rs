//! Write fences: nothing granted under an earlier mount of a segment lands
//! in it once it is mounted again.
//!
//! A store picks a fresh fence value every time it mounts a segment (at
//! start, after the master forgot it, with every new leader) and sends it in
//! `MountSegment`; the master names it in every grant for the segment, and
//! the store writes only for grants naming the current value. A new leader
//! rebuilds its allocators from inventories the store took after it moved
//! to the new value, so a region the new leader hands out again can no
//! longer be written through a grant of the old one, however late its
//! bytes come (a paused client, TCP retransmitting across a healed
//! partition). Writes reach a segment two ways, and both are fenced with no
//! extra round trip:
//!
//! - **Over TCP** the value is checked when the request arrives, and every
//!   read of payload bytes into the segment runs inside [`Fence::enter`].
//!   [`Fence::set`] waits only for the reads in progress (each one
//!   non-blocking socket read); after it, no byte of a write under the old
//!   value lands, whether it is queued, half read, or not sent yet.
//! - **Through shared memory** (a client on the same host copying into the
//!   mapped segment file) the value is published in the segment's first
//!   page ([`SharedFence`]). A writer claims a slot there, records the
//!   region it copies to and its grant's value, checks the published value,
//!   copies, and frees the slot. A store that publishes a new value then
//!   reads the slots: one claimed under another value belongs to a writer
//!   that may be anywhere in its copy (a paused process copies on when it
//!   resumes), so its region is held back from the pool until the writer
//!   frees the slot or dies. Writers prove they are alive with an
//!   open-file-description lock on a byte of the segment file, which the
//!   kernel drops when the process exits however it exits.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use kvpool_format::superblock::SUPERBLOCK_LEN;
use kvpool_format::DATA_BASE;
use parking_lot::{RwLock, RwLockReadGuard};

use crate::mapped::MappedRegion;

/// A segment's write fence in its store: the value of its current mount.
#[derive(Debug, Default)]
pub struct Fence {
    /// 0 until the segment is first mounted: no write is admitted before.
    value: AtomicU64,
    /// Held shared by each copy of payload bytes into the segment, and
    /// exclusively while the value changes.
    gate: RwLock<()>,
}

impl Fence {
    /// The current value (0: not mounted yet).
    pub fn value(&self) -> u64 {
        self.value.load(SeqCst)
    }

    /// Admits one copy into the segment for a write granted under `value`:
    /// `None` once the segment was mounted under another value (or never
    /// was). No value can change while the guard lives.
    pub fn enter(&self, value: u64) -> Option<RwLockReadGuard<'_, ()>> {
        let gate = self.gate.read();
        (self.admits(value)).then_some(gate)
    }

    /// Whether a write granted under `value` may land now.
    pub fn admits(&self, value: u64) -> bool {
        #[cfg(feature = "planted-bugs")]
        if kvpool_net::planted::active("skip-write-fence") {
            // Planted: every grant is honoured, whatever mount it was for.
            return true;
        }
        value != 0 && self.value() == value
    }

    /// Moves to `value`, once every copy admitted under the old one is done.
    pub fn set(&self, value: u64) {
        let _gate = self.gate.write();
        self.value.store(value, SeqCst);
    }
}

/// A fresh nonzero fence value, different from `old`.
pub fn fresh_value(old: u64) -> u64 {
    loop {
        let v: u64 = rand::random();
        if v != 0 && v != old {
            return v;
        }
    }
}

// Layout of the shared fence in the segment's first page, after the
// superblock and before the object area (offsets from the segment start):
//
//   1024        8  the store's current fence value (0: none, no shm writes)
//   1040  128 x 8  writer ids: the token of the process holding each
//   2064   48 x 32 slots: token, fence value, offset, length of a copy
//   3968  128 x 1  writer-id lock bytes (file offsets; never written)
const VALUE: u64 = 1024;
const WRITERS: u64 = 128;
const OWNERS: u64 = VALUE + 16;
const SLOTS: u64 = 48;
const SLOT_AT: u64 = OWNERS + 8 * WRITERS;
const SLOT_LEN: u64 = 32;
const LOCKS: u64 = 3968;
const _: () = assert!(
    VALUE >= SUPERBLOCK_LEN as u64
        && SLOT_AT + SLOTS * SLOT_LEN <= LOCKS
        && LOCKS + WRITERS <= DATA_BASE
);

/// How long a claim may stay unfree before a writer gives up (every slot
/// taken by writers that do not finish).
const CLAIM_FOR: Duration = Duration::from_secs(1);

/// The shared fence of a segment mapped in this process (by its store, or
/// by a client on the same host).
pub struct SharedFence<'a> {
    region: &'a MappedRegion,
}

/// A slot a store found claimed under another fence value: a writer that
/// may still copy into `offset..offset + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    slot: u64,
    token: u64,
    fence: u64,
    /// Start of the region the writer copies to.
    pub offset: u64,
    /// Bytes it copies.
    pub len: u64,
}

impl<'a> SharedFence<'a> {
    /// The shared fence of `region`, if it is large enough to be a segment.
    pub fn new(region: &'a MappedRegion) -> Option<Self> {
        (region.len() >= DATA_BASE).then_some(SharedFence { region })
    }

    fn word(&self, at: u64) -> &AtomicU64 {
        // SAFETY: `at + 8 <= DATA_BASE <= len` (checked in `new`); the mapping
        // is page-aligned and `at` a multiple of 8; these words are only
        // ever accessed atomically, by every process mapping the file.
        unsafe { &*(self.region.slice(at, 8).as_ptr() as *const AtomicU64) }
    }

    fn slot(&self, i: u64, field: u64) -> &AtomicU64 {
        self.word(SLOT_AT + i * SLOT_LEN + 8 * field)
    }

    /// The store's current value.
    pub fn value(&self) -> u64 {
        self.word(VALUE).load(SeqCst)
    }

    /// Publishes the store's new value; from now on a writer of another
    /// one either sees it and refuses, or is found by [`Self::stale`].
    pub fn publish(&self, value: u64) {
        self.word(VALUE).store(value, SeqCst);
    }

    /// Slots claimed by writers of a value other than `value`. Called after
    /// [`Self::publish`]: a writer whose check came after the publish
    /// refuses, and one whose check came before has its claim visible here
    /// (both sides store, then load, in one total order).
    pub fn stale(&self, value: u64) -> Vec<Claim> {
        (0..SLOTS)
            .filter_map(|slot| {
                let fence = self.slot(slot, 1).load(SeqCst);
                (fence != 0 && fence != value).then(|| Claim {
                    slot,
                    token: self.slot(slot, 0).load(SeqCst),
                    fence,
                    offset: self.slot(slot, 2).load(SeqCst),
                    len: self.slot(slot, 3).load(SeqCst),
                })
            })
            .collect()
    }

    /// Whether `c`'s writer still has its slot: a live process that has not
    /// finished its copy. A dead writer's slot is freed here. `file` is the
    /// segment file, opened by the caller, to ask the kernel about locks.
    pub fn holds(&self, c: &Claim, file: &File) -> bool {
        let token = self.slot(c.slot, 0);
        let same = token.load(SeqCst) == c.token
            && self.slot(c.slot, 1).load(SeqCst) == c.fence
            && self.slot(c.slot, 2).load(SeqCst) == c.offset;
        if !same {
            return false;
        }
        if self.alive(c.token, file) {
            return true;
        }
        self.slot(c.slot, 1).store(0, SeqCst);
        let _ = token.compare_exchange(c.token, 0, SeqCst, SeqCst);
        false
    }

    /// Frees the slots of writers that died in a copy (killed mid-`memcpy`),
    /// so they never run out; returns how many.
    pub fn reap(&self, file: &File) -> usize {
        let mut n = 0;
        for slot in 0..SLOTS {
            let token = self.slot(slot, 0).load(SeqCst);
            if token != 0 && !self.alive(token, file) {
                self.slot(slot, 1).store(0, SeqCst);
                if self
                    .slot(slot, 0)
                    .compare_exchange(token, 0, SeqCst, SeqCst)
                    .is_ok()
                {
                    n += 1;
                }
            }
        }
        n
    }

    /// Whether the process behind `token` still holds its writer id.
    fn alive(&self, token: u64, file: &File) -> bool {
        let Some(id) = (token & 0xff).checked_sub(1).filter(|&w| w < WRITERS) else {
            return false;
        };
        // Unknown lock state counts as alive: holding a region back is safe.
        self.word(OWNERS + 8 * id).load(SeqCst) == token && locked(file, LOCKS + id).unwrap_or(true)
    }
}

/// This process's writer id on one segment file, held by a lock on the
/// file for as long as this lives; the kernel drops the lock when the
/// process exits, which is how a store tells a dead writer from a paused one.
pub struct ShmWriter {
    /// Holds the lock (an open file description of its own).
    _file: File,
    token: u64,
}

/// A shared-memory write refused: the segment was mounted again since its
/// grant (or its store runs no fence), or no slot came free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl ShmWriter {
    /// Takes a free writer id of the segment file at `path`, mapped here as
    /// `fence`'s region.
    pub fn acquire(path: &Path, fence: &SharedFence) -> io::Result<ShmWriter> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        for id in 0..WRITERS {
            if lock(&file, LOCKS + id)? {
                let token = (rand::random::<u64>() << 8) | (id + 1);
                fence.word(OWNERS + 8 * id).store(token, SeqCst);
                return Ok(ShmWriter { _file: file, token });
            }
        }
        Err(io::Error::other(format!(
            "all {WRITERS} writer ids of {} are taken",
            path.display()
        )))
    }

    /// Runs `copy` (which writes `len` bytes at `offset` of `fence`'s
    /// segment) if the segment's fence is still `value`, with a slot
    /// claimed for it so a store moving to a new value meanwhile knows.
    pub fn write(
        &self,
        fence: &SharedFence,
        value: u64,
        (offset, len): (u64, u64),
        copy: impl FnOnce(),
    ) -> Result<(), Refused> {
        let slot = self.claim(fence)?;
        fence.slot(slot, 2).store(offset, SeqCst);
        fence.slot(slot, 3).store(len, SeqCst);
        // Last: a store that sees the value sees the region with it.
        fence.slot(slot, 1).store(value, SeqCst);
        let now = fence.value();
        let admitted = value != 0 && now == value;
        if admitted {
            copy();
        }
        fence.slot(slot, 1).store(0, SeqCst);
        fence.slot(slot, 0).store(0, SeqCst);
        if admitted {
            Ok(())
        } else {
            Err(Refused(format!(
                "the segment was mounted again since this put was granted (fence {value:x}, now {now:x})"
            )))
        }
    }

    fn claim(&self, fence: &SharedFence) -> Result<u64, Refused> {
        let start = (self.token >> 8) % SLOTS;
        let t0 = Instant::now();
        loop {
            for i in 0..SLOTS {
                let slot = (start + i) % SLOTS;
                let token = fence.slot(slot, 0);
                if token
                    .compare_exchange(0, self.token, SeqCst, SeqCst)
                    .is_ok()
                {
                    return Ok(slot);
                }
            }
            if t0.elapsed() > CLAIM_FOR {
                return Err(Refused(format!(
                    "no free write slot in the segment for {CLAIM_FOR:?}"
                )));
            }
            std::thread::yield_now();
        }
    }
}

/// A write lock on byte `at` of `file`, owned by its open file description;
/// false if another holds it.
fn lock(file: &File, at: u64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, at);
    // SAFETY: a valid descriptor and a fully initialised `flock`.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
    if rc == 0 {
        return Ok(true);
    }
    match io::Error::last_os_error() {
        e if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        e => Err(e),
    }
}

/// Whether another open file description holds a lock on byte `at`.
fn locked(file: &File, at: u64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, at);
    // SAFETY: a valid descriptor and a fully initialised `flock`.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i32::from(fl.l_type) != libc::F_UNLCK)
}

fn flock(kind: i32, at: u64) -> libc::flock {
    // SAFETY: `flock` is plain data; all-zero is a valid value (and l_pid
    // must be 0 for open-file-description locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = at as libc::off_t;
    fl.l_len = 1;
    fl
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment() -> (tempfile::TempDir, std::path::PathBuf, MappedRegion) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        let region = MappedRegion::open_file(&path, 1 << 20).unwrap();
        (dir, path, region)
    }

    #[test]
    fn a_write_under_the_published_value_copies_and_frees_its_slot() {
        let (_d, path, region) = segment();
        let fence = SharedFence::new(&region).unwrap();
        let w = ShmWriter::acquire(&path, &fence).unwrap();
        let mut copied = false;
        let r = w.write(&fence, 5, (DATA_BASE, 64), || copied = true);
        assert!(r.is_err(), "nothing published yet");
        assert!(!copied);
        fence.publish(5);
        w.write(&fence, 5, (DATA_BASE, 64), || copied = true)
            .unwrap();
        assert!(copied);
        assert!(fence.stale(6).is_empty(), "the slot was freed");
        let stale = w.write(&fence, 4, (DATA_BASE, 64), || {
            panic!("copied under an old fence")
        });
        assert!(stale.unwrap_err().0.contains("mounted again"));
    }

    #[test]
    fn a_writer_caught_in_its_copy_is_held_until_it_finishes() {
        let (_d, path, region) = segment();
        let fence = SharedFence::new(&region).unwrap();
        let w = ShmWriter::acquire(&path, &fence).unwrap();
        fence.publish(1);
        let file = File::open(&path).unwrap();
        let mut seen = Vec::new();
        w.write(&fence, 1, (8192, 300), || {
            // The store moves on mid-copy: it finds this writer.
            fence.publish(2);
            seen = fence.stale(2);
            assert!(fence.holds(&seen[0], &file), "a live writer holds its slot");
        })
        .unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!((seen[0].offset, seen[0].len), (8192, 300));
        assert!(!fence.holds(&seen[0], &file), "released after the copy");
    }

    #[test]
    fn a_dead_writers_slot_is_freed_and_its_id_taken_again() {
        let (_d, path, region) = segment();
        let fence = SharedFence::new(&region).unwrap();
        fence.publish(1);
        let file = File::open(&path).unwrap();
        let first = ShmWriter::acquire(&path, &fence).unwrap();
        let second = ShmWriter::acquire(&path, &fence).unwrap();
        assert_ne!(first.token & 0xff, second.token & 0xff, "distinct ids");
        // A claim left behind as a writer killed mid-copy leaves it.
        let slot = first.claim(&fence).unwrap();
        for (f, v) in [(2, 4096), (3, 64), (1, 1)] {
            fence.slot(slot, f).store(v, SeqCst);
        }
        fence.publish(2);
        let claim = fence.stale(2)[0];
        assert!(fence.holds(&claim, &file), "its process holds the lock");
        drop(first);
        assert!(!fence.holds(&claim, &file), "the lock went with it");
        assert!(fence.stale(2).is_empty(), "its slot is free again");
        let third = ShmWriter::acquire(&path, &fence).unwrap();
        assert_eq!(third.token & 0xff, 1, "the dead writer's id is reused");
        assert_eq!(fence.reap(&file), 0);
    }

    #[test]
    fn the_tcp_gate_admits_only_the_current_value() {
        let f = Fence::default();
        assert!(f.enter(0).is_none() && f.enter(3).is_none());
        f.set(3);
        let g = f.enter(3);
        assert!(g.is_some() && f.enter(4).is_none());
        drop(g);
        f.set(4);
        assert!(f.enter(3).is_none() && f.enter(4).is_some());
    }
}
