//! Memory that backs a segment: a shared mapping of a file (tmpfs or disk), so
//! the bytes outlive the process, or anonymous memory for tests.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};

/// A fixed-size region of memory shared by every connection of a store.
///
/// Regions are handed out by the master without overlap, so concurrent
/// writers touch disjoint bytes; a buggy or hostile client that writes over
/// another object is caught by the object checksum on read, never by a crash.
pub struct MappedRegion {
    map: MmapRaw,
    path: Option<PathBuf>,
    /// The mapped file, where its pages are lent to sockets (see
    /// [`MappedRegion::lent_file`]).
    file: Option<File>,
    /// Bytes of the mapping on huge pages when it was made.
    huge: u64,
    /// Made by this mapping (a new file, anonymous memory): only zeroes.
    fresh: bool,
}

impl MappedRegion {
    /// Maps `path` shared, creating it and setting its length to `size` when
    /// it does not exist; an existing file keeps its contents (restart). The
    /// pages are faulted in up front: lent memory is committed at start, not
    /// on the first write of each page in the data path.
    pub fn open_file(path: &Path, size: u64) -> io::Result<Self> {
        let existed = path.exists();
        // Owner-only: whoever may map the segment may read and write every object.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let old_len = file.metadata()?.len();
        let hugetlbfs_page = huge_page_size(&file);
        let sized = hugetlbfs_page
            .map_or(Ok(()), |page| fits_pages(path, size, page))
            .and_then(|()| match old_len == size {
                true => Ok(()),
                false => file.set_len(size),
            })
            .and_then(|()| reserve(&file, size));
        if let Err(e) = sized {
            // Give back what a failed reservation took (tmpfs pages are RAM).
            if !existed {
                let _ = std::fs::remove_file(path);
            } else if old_len != size {
                let _ = file.set_len(old_len);
            }
            return Err(e);
        }
        let map = MmapOptions::new()
            .len(size as usize)
            .populate()
            .map_raw(&file)?;
        let huge = huge_page_bytes_of(&map);
        // Lending a page to a socket costs a page-cache lookup per page:
        // on 4 KiB pages as much as copying it (4 MiB reads over loopback
        // ran at the same rate and store CPU either way, 2026-12-02), on
        // 2 MiB pages far less. Hugetlbfs lends none (sendfile: EINVAL).
        let lends = hugetlbfs_page.is_none() && huge >= size / 2;
        Ok(MappedRegion {
            map,
            path: Some(path.to_path_buf()),
            file: lends.then_some(file),
            huge,
            fresh: !existed,
        })
    }

    /// Maps `len` bytes at `offset` (a multiple of the page size) of the
    /// file at `path`, shared, creating or extending the file as needed; a
    /// segment over memory the caller provides (Mooncake's
    /// `mount_segment`). No path is recorded: other processes do not map
    /// it (it has no superblock), they reach it over TCP.
    pub fn file_range(path: &Path, offset: u64, len: u64) -> io::Result<Self> {
        let page = 4096;
        if !offset.is_multiple_of(page) || len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the offset must be a multiple of 4096 and the length above 0",
            ));
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "range overflows"))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        if file.metadata()?.len() < end {
            file.set_len(end)?;
        }
        let map = MmapOptions::new()
            .offset(offset)
            .len(usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?)
            .map_raw(&file)?;
        Ok(MappedRegion {
            map,
            path: None,
            file: None,
            huge: 0,
            fresh: false,
        })
    }

    /// Maps an existing segment file of a store on this host, read-write, as
    /// it is (the shared-memory transport). Fails unless this process may
    /// open the file for writing.
    pub fn open_existing(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        let map = MmapOptions::new().len(len as usize).map_raw(&file)?;
        Ok(MappedRegion {
            map,
            path: Some(path.to_path_buf()),
            file: None,
            huge: 0,
            fresh: false,
        })
    }

    /// Builds this process's page tables for `[offset, offset + len)` in
    /// one call (no data is read or written), so the first touches of its
    /// pages do not each trap into the kernel. Does nothing where the
    /// kernel lacks `MADV_POPULATE_READ` (before Linux 5.14), or for a
    /// range outside the region.
    ///
    /// Read, not write: a read fault maps the pages around it that are
    /// already in memory too (16 at a time by default), a write fault one
    /// page; on tmpfs the entries are writable either way. A fresh Python
    /// client's first 4 MiB puts over shared memory ran at 6.0-7.9 GB/s
    /// against 3.6-4.9 populating for writing (2026-12-01, this VM).
    pub fn populate(&self, offset: u64, len: u64) {
        if !self.contains(offset, len) || len == 0 {
            return;
        }
        let page = 4096;
        let start = offset / page * page;
        let end = (offset + len).div_ceil(page) * page;
        let end = end.min(self.len());
        // SAFETY: the page-aligned range is inside the mapping, which `self`
        // keeps alive; populating page tables does not change its contents.
        unsafe {
            libc::madvise(
                self.map.as_mut_ptr().add(start as usize).cast(),
                (end - start) as usize,
                libc::MADV_POPULATE_READ,
            );
        }
    }

    /// Anonymous memory (not recoverable), for embedded stores and tests.
    pub fn anonymous(size: u64) -> io::Result<Self> {
        let mmap = MmapOptions::new().len(size as usize).map_anon()?;
        Ok(MappedRegion {
            map: MmapRaw::from(mmap),
            path: None,
            file: None,
            huge: 0,
            fresh: true,
        })
    }

    /// Whether this mapping made the bytes (a file [`open_file`] created,
    /// anonymous memory): they are all zeroes, no object can be in them
    /// until it is lent. A mapped file range counts as not fresh.
    ///
    /// [`open_file`]: MappedRegion::open_file
    pub fn is_fresh(&self) -> bool {
        self.fresh
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The backing file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The file the region maps from its start, for sending straight from
    /// the file's pages: only for a segment file [`open_file`] mapped
    /// mostly on huge pages of a file system that lends them (a tmpfs
    /// mounted `huge=`).
    ///
    /// [`open_file`]: MappedRegion::open_file
    pub fn lent_file(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(|f| f.as_fd())
    }

    /// Whether `[offset, offset + len)` lies inside the region.
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len())
    }

    /// Bytes at `[offset, offset + len)`.
    ///
    /// # Safety
    /// The range must be inside the region (see [`Self::contains`]) and the
    /// caller must not rely on the bytes being stable while another
    /// connection may write them (readers verify checksums for that reason).
    pub unsafe fn slice(&self, offset: u64, len: u64) -> &[u8] {
        debug_assert!(self.contains(offset, len));
        // SAFETY: in bounds per the caller's contract; the mapping lives as long as self.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(offset as usize), len as usize) }
    }

    /// Mutable bytes at `[offset, offset + len)`.
    ///
    /// # Safety
    /// The range must be inside the region and no other live reference may
    /// cover it; the master's allocator guarantees that for honest clients.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: u64, len: u64) -> &mut [u8] {
        debug_assert!(self.contains(offset, len));
        // SAFETY: in bounds per the caller's contract; exclusivity is the caller's.
        unsafe {
            std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(offset as usize), len as usize)
        }
    }

    /// Bytes of a segment file's mapping ([`open_file`]) the kernel backed
    /// with huge pages when it was mapped: all of it on hugetlbfs, what
    /// transparent huge pages covered on a tmpfs mounted with `huge=`, 0
    /// elsewhere (or where `/proc` is not there); 0 for other mappings.
    ///
    /// [`open_file`]: MappedRegion::open_file
    pub fn huge_page_bytes(&self) -> u64 {
        self.huge
    }

    /// Flushes a file-backed mapping to its file (a no-op on tmpfs).
    pub fn flush(&self) -> io::Result<()> {
        self.map.flush()
    }
}

/// Bytes of `map` on huge pages now. Walks its page tables: once per
/// mapping, not per request.
fn huge_page_bytes_of(map: &MmapRaw) -> u64 {
    let start = format!("{:x}-", map.as_ptr() as usize);
    mapped_huge_page_bytes(|header| header.starts_with(&start))
}

/// Bytes in huge pages of this process's mappings whose `/proc/self/smaps`
/// header line `mapping` picks (address range first, file path last).
pub fn mapped_huge_page_bytes(mapping: impl Fn(&str) -> bool) -> u64 {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    // Huge pages of hugetlbfs count as `*_Hugetlb` (not `Rss`), those of a
    // tmpfs as `ShmemPmdMapped`; `VmFlags` ends each mapping's fields.
    let fields = [
        "ShmemPmdMapped",
        "FilePmdMapped",
        "Shared_Hugetlb",
        "Private_Hugetlb",
    ];
    let (mut picked, mut kib) = (false, 0);
    let mut header = true;
    for line in smaps.lines() {
        if header {
            picked = mapping(line);
            header = false;
        } else if line.starts_with("VmFlags") {
            header = true;
        } else if let Some((field, value)) = line.split_once(':') {
            let value = value.trim().strip_suffix("kB").map(str::trim);
            if picked && fields.contains(&field) {
                kib += value.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    1024 * kib
}

/// Reserves the file's blocks now, so a full tmpfs or disk is a clean error
/// at start instead of a SIGBUS on some later write into the mapping.
fn reserve(file: &std::fs::File, size: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment size too large"))?;
    // SAFETY: plain syscall on an open descriptor we own.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    if rc != 0 {
        let e = io::Error::from_raw_os_error(rc);
        let hint = match huge_page_size(file) {
            Some(_) => " (hugetlbfs: too few free huge pages; see HugePages_Free in /proc/meminfo, raise vm.nr_hugepages)",
            None => "",
        };
        return Err(io::Error::new(
            e.kind(),
            format!("cannot reserve {size} bytes: {e}{hint}"),
        ));
    }
    Ok(())
}

/// The page size of the hugetlbfs `file` lives on; `None` on any other
/// file system.
fn huge_page_size(file: &std::fs::File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    const HUGETLBFS_MAGIC: libc::c_long = 0x9584_58f6;
    // SAFETY: fstatfs fills the struct we own from a descriptor we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    (rc == 0 && st.f_type as libc::c_long == HUGETLBFS_MAGIC).then_some(st.f_bsize as u64)
}

/// Refuses a size hugetlbfs cannot hold: its files are whole huge pages.
fn fits_pages(path: &Path, size: u64, page: u64) -> io::Result<()> {
    if size.is_multiple_of(page) {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "segment size {size} is not a multiple of the huge page size ({page} bytes) of the hugetlbfs holding {}; use {} or {}",
            path.display(),
            size / page * page,
            size.div_ceil(page) * page
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_mapping_keeps_bytes_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        {
            let m = MappedRegion::open_file(&p, 1 << 20).unwrap();
            unsafe { m.slice_mut(4096, 5) }.copy_from_slice(b"hello");
        }
        let m = MappedRegion::open_file(&p, 1 << 20).unwrap();
        assert_eq!(unsafe { m.slice(4096, 5) }, b"hello");
        assert!(m.contains(0, 1 << 20));
        assert!(!m.contains(1, 1 << 20));
        assert!(!m.contains(u64::MAX, 2));
        // 4 KiB pages: copying them costs no more than lending them.
        assert_eq!(m.huge_page_bytes(), 0);
        assert!(m.lent_file().is_none());
    }

    #[test]
    fn populating_changes_no_byte_and_ignores_ranges_outside() {
        let dir = tempfile::tempdir().unwrap();
        let m = MappedRegion::open_file(&dir.path().join("seg"), 3 << 20).unwrap();
        unsafe { m.slice_mut(5000, 5) }.copy_from_slice(b"hello");
        let other = MappedRegion::open_existing(&dir.path().join("seg")).unwrap();
        for (offset, len) in [
            (4999, 7),
            (0, 3 << 20),
            (1 << 20, 0),
            (3 << 20, 1),
            (u64::MAX, 2),
        ] {
            other.populate(offset, len);
        }
        assert_eq!(unsafe { other.slice(5000, 5) }, b"hello");
        assert!(unsafe { other.slice(0, 5000) }.iter().all(|&b| b == 0));
    }
}
