//! Caller memory named by address and length (raw pointers from Python, or
//! the address of a buffer-protocol object): validation, overlap checks, and
//! the one place that turns an address into a Rust slice.

use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::RwLock;

/// Pages [`Region::readable`] probes with one system call.
const PROBES_PER_CALL: usize = 1024;

/// Regions this process registered for zero-copy calls (Mooncake's
/// `register_buffer`), one entry per registration. Their owner promised
/// they stay mapped until unregistered, as Mooncake requires of registered
/// memory, so [`Region::readable`] takes that word instead of probing them:
/// the probe costs 0.55 µs a page (measured here), a quarter of a 4 MiB
/// `put_from` over loopback TCP.
static REGISTERED: RwLock<Vec<Region>> = RwLock::new(Vec::new());

/// Notes `region` as registered memory (see [`REGISTERED`]).
pub fn note_registered(region: Region) {
    REGISTERED.write().push(region);
}

/// Forgets one registration of `region`; whether there was one.
pub fn note_unregistered(region: Region) -> bool {
    let mut all = REGISTERED.write();
    let found = all.iter().position(|r| *r == region);
    found.map(|i| all.swap_remove(i)).is_some()
}

/// A region of caller memory: `len` bytes at address `ptr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Start address.
    pub ptr: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Region {
    /// Checks an address and length given by a caller: a non-empty region
    /// needs a non-null address, must not wrap around the address space, and
    /// must fit in `isize` (Rust's limit for one allocation).
    pub fn new(ptr: u64, len: u64) -> KvResult<Region> {
        let bad = |why: &str| {
            KvError::new(
                Code::InvalidParams,
                format!("buffer at {ptr:#x} of {len} bytes: {why}"),
            )
        };
        let p = usize::try_from(ptr).map_err(|_| bad("address out of range"))?;
        let l = usize::try_from(len).map_err(|_| bad("length out of range"))?;
        if l > isize::MAX as usize {
            return Err(bad("length out of range"));
        }
        if l > 0 && p == 0 {
            return Err(bad("null address"));
        }
        if p.checked_add(l).is_none() {
            return Err(bad("region wraps around the address space"));
        }
        Ok(Region { ptr: p, len: l })
    }

    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.ptr + self.len
    }

    /// Checks, without touching it, that every page of the region can be
    /// read: a raw address from a caller may name memory that is not mapped
    /// (or not readable), and reading it would kill the process (Mooncake
    /// answers `TRANSFER_FAIL` for such a key). One `process_vm_readv` of a
    /// byte per page, for up to [`PROBES_PER_CALL`] pages at a time; where
    /// the kernel or a sandbox refuses the call itself, the caller's word is
    /// taken, as before.
    pub fn readable(&self) -> KvResult<()> {
        if self.len == 0 || self.is_registered() {
            return Ok(());
        }
        // SAFETY: sysconf has no memory effects.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096);
        // A byte of each page: the first at the region's start.
        let mut probes = ((self.ptr & !(page - 1))..self.end())
            .step_by(page)
            .map(|p| libc::iovec {
                iov_base: p.max(self.ptr) as *mut libc::c_void,
                iov_len: 1,
            });
        let mut scratch = [0u8; PROBES_PER_CALL];
        let mut remote = Vec::with_capacity(PROBES_PER_CALL.min(self.len / page + 2));
        loop {
            remote.clear();
            remote.extend(probes.by_ref().take(PROBES_PER_CALL));
            if remote.is_empty() {
                return Ok(());
            }
            let local = libc::iovec {
                iov_base: scratch.as_mut_ptr().cast(),
                iov_len: remote.len(),
            };
            // SAFETY: the local iovec is our own scratch buffer; the remote
            // ones are only read by the kernel, which reports a fault instead
            // of taking one.
            let n = unsafe {
                libc::process_vm_readv(
                    libc::getpid(),
                    &local,
                    1,
                    remote.as_ptr(),
                    remote.len() as _,
                    0,
                )
            };
            if n == remote.len() as isize {
                continue;
            }
            let errno = std::io::Error::last_os_error().raw_os_error();
            if n < 0 && matches!(errno, Some(libc::ENOSYS | libc::EPERM)) {
                return Ok(());
            }
            return Err(KvError::new(
                Code::TransferFail,
                format!(
                    "buffer at {:#x} of {} bytes is not readable memory",
                    self.ptr, self.len
                ),
            ));
        }
    }

    /// Whether the region lies inside one registered region.
    fn is_registered(&self) -> bool {
        REGISTERED
            .read()
            .iter()
            .any(|r| r.ptr <= self.ptr && self.end() <= r.end())
    }

    /// The region as a shared slice.
    ///
    /// # Safety
    /// The caller must guarantee that the region is readable memory that stays
    /// valid, and is not written by Rust code, for the lifetime `'a`.
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `new` checked non-null, no wrap and len <= isize::MAX; the
        // caller guarantees validity for 'a.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// The region as a mutable slice.
    ///
    /// # Safety
    /// The caller must guarantee that the region is writable memory that stays
    /// valid for `'a` and that no other live reference overlaps it (see
    /// [`overlapping`]).
    pub unsafe fn as_mut_slice<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as for `as_slice`, plus exclusivity guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
}

/// For destinations of one batch read (each item a list of regions), marks
/// every item that shares a byte with an earlier item or with itself. Such an
/// item is refused: two reads into one byte would alias mutable memory.
pub fn overlapping(items: &[Vec<Region>]) -> Vec<bool> {
    let mut spans: Vec<(usize, usize, usize)> = items
        .iter()
        .enumerate()
        .flat_map(|(i, rs)| {
            rs.iter()
                .filter(|r| r.len > 0)
                .map(move |r| (r.ptr, r.end(), i))
        })
        .collect();
    spans.sort_unstable();
    let mut bad = vec![false; items.len()];
    // Sweep by start address; `reach` is the furthest end seen so far and
    // `owner` the item that reaches it.
    let mut reach: Option<(usize, usize)> = None;
    for &(start, end, item) in &spans {
        if let Some((r_end, r_item)) = reach {
            if start < r_end {
                // Blame the later item in batch order so the first one still reads.
                bad[item.max(r_item)] = true;
                if end > r_end {
                    reach = Some((end, item));
                }
                continue;
            }
        }
        reach = Some((end, item));
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(ptr: usize, len: usize) -> Region {
        Region { ptr, len }
    }

    #[test]
    fn validation() {
        assert!(Region::new(0, 0).is_ok());
        assert_eq!(Region::new(0, 1).unwrap_err().code, Code::InvalidParams);
        assert_eq!(
            Region::new(u64::MAX - 1, 4).unwrap_err().code,
            Code::InvalidParams
        );
        assert_eq!(
            Region::new(8, u64::MAX / 2 + 1).unwrap_err().code,
            Code::InvalidParams
        );
        let ok = Region::new(0x1000, 16).unwrap();
        assert_eq!(ok.end(), 0x1010);
    }

    #[test]
    fn slices() {
        let mut v = vec![1u8, 2, 3, 4];
        let reg = Region::new(v.as_mut_ptr() as u64, 4).unwrap();
        // SAFETY: `v` outlives the slices and is not otherwise used meanwhile.
        unsafe {
            reg.as_mut_slice()[0] = 9;
            assert_eq!(reg.as_slice(), &[9, 2, 3, 4]);
        }
        let empty = Region::new(0, 0).unwrap();
        // SAFETY: empty regions never touch memory.
        unsafe {
            assert!(empty.as_slice().is_empty());
        }
    }

    #[test]
    fn registered_memory_is_taken_at_its_owners_word_until_unregistered() {
        // SAFETY: an anonymous mapping, used only through the probes.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
            let at = libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(at, libc::MAP_FAILED);
            let whole = Region::new(at as u64, 2 * page as u64).unwrap();
            let inner = Region::new(at as u64 + 8, page as u64).unwrap();
            let past = Region::new(at as u64 + page as u64, 2 * page as u64).unwrap();
            assert_eq!(inner.readable().unwrap_err().code, Code::TransferFail);
            note_registered(whole);
            assert_eq!(inner.readable(), Ok(()));
            // Only regions wholly inside a registered one skip the probe.
            assert_eq!(past.readable().unwrap_err().code, Code::TransferFail);
            assert!(note_unregistered(whole));
            assert!(!note_unregistered(whole));
            assert_eq!(inner.readable().unwrap_err().code, Code::TransferFail);
            libc::munmap(at, 2 * page);
        }
    }

    #[test]
    fn unmapped_or_unreadable_memory_is_found_without_a_fault() {
        // SAFETY: plain anonymous mappings, used only through the probes.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
            let at = libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(at, libc::MAP_FAILED);
            let base = at as usize;
            let region =
                |off: usize, len: usize| Region::new((base + off) as u64, len as u64).unwrap();
            assert_eq!(region(0, 3 * page).readable(), Ok(()));
            assert_eq!(region(page - 1, 2).readable(), Ok(()));
            // The middle page made unreadable, then the last one unmapped.
            assert_eq!(
                libc::mprotect((base + page) as *mut _, page, libc::PROT_NONE),
                0
            );
            assert_eq!(
                region(page / 2, page).readable().unwrap_err().code,
                Code::TransferFail
            );
            assert_eq!(region(0, page).readable(), Ok(()));
            assert_eq!(libc::munmap((base + 2 * page) as *mut _, page), 0);
            assert_eq!(
                region(2 * page + 8, 16).readable().unwrap_err().code,
                Code::TransferFail
            );
            libc::munmap(at, 2 * page);
        }
        // A region of more pages than one probe call covers.
        let v = vec![7u8; (PROBES_PER_CALL + 3) * 4096];
        assert_eq!(
            Region::new(v.as_ptr() as u64, v.len() as u64)
                .unwrap()
                .readable(),
            Ok(())
        );
    }

    #[test]
    fn overlaps() {
        assert_eq!(
            overlapping(&[vec![r(0x100, 16)], vec![r(0x110, 16)]]),
            vec![false, false]
        );
        assert_eq!(
            overlapping(&[vec![r(0x100, 16)], vec![r(0x10f, 16)]]),
            vec![false, true]
        );
        // The later item in batch order is blamed even if it starts first.
        assert_eq!(
            overlapping(&[vec![r(0x108, 16)], vec![r(0x100, 16)]]),
            vec![false, true]
        );
        // Within one item.
        assert_eq!(
            overlapping(&[vec![r(0x100, 8), r(0x104, 8)], vec![r(0x200, 1)]]),
            vec![true, false]
        );
        // Empty regions never overlap; a long region covers later ones.
        assert_eq!(
            overlapping(&[
                vec![r(0x100, 0)],
                vec![r(0x100, 0x100)],
                vec![r(0x120, 4)],
                vec![r(0x300, 4)]
            ]),
            vec![false, false, true, false]
        );
    }
}
