//! The memory this process registered with its engine: the only bytes a
//! peer may write or read, and the only local buffers a transfer may use.
//!
//! Rules (Mooncake's, where it has one):
//! - a registration is `[addr, addr + len)` with `len > 0` and no
//!   wrap-around; a zero-length one is refused;
//! - registrations never overlap: one that shares a byte with another is
//!   refused (Mooncake answers `ERR_ADDRESS_OVERLAPPED`), registering the
//!   same buffer twice included, so every address has one owner and
//!   `unregister` is unambiguous;
//! - a transfer's range must lie entirely inside one registration (a range
//!   spanning two adjacent ones is refused: they may be unregistered apart).
//!
//! Every copy into or out of a region holds its pin ([`Region::pin`]); an
//! unregister takes the region out of the table, then waits for those pins
//! to go, so once it returns no byte moves to or from that memory.
//!
//! A region on a GPU ([`Memory::Device`]) is never touched by the CPU: its
//! bytes go out through [`Region::load`] and come in through
//! [`Region::land`], staged through host memory (see [`crate::cuda`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use kvpool_net::conn::FramedConn;
use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::RwLock;
use tokio::sync::RwLockReadGuard;

use crate::cuda::Memory;

/// One registered buffer.
#[derive(Debug)]
pub struct Region {
    /// First address.
    start: u64,
    /// Length in bytes (> 0).
    len: u64,
    /// Order of registration, for [`Regions::first`].
    seq: u64,
    /// Host or GPU memory.
    memory: Memory,
    /// `true` until unregistered. Copies hold it for reading (an async lock:
    /// a copy to a socket awaits while it holds it); unregister takes it
    /// for writing, which waits for every copy in flight.
    live: tokio::sync::RwLock<bool>,
}

/// A region held registered while bytes move to or from it.
pub type Pin<'a> = RwLockReadGuard<'a, bool>;

impl Region {
    /// Holds the region registered, waiting behind an unregister already
    /// under way; `None` once it is unregistered.
    pub async fn pin(&self) -> Option<Pin<'_>> {
        let g = self.live.read().await;
        (*g).then_some(g)
    }

    /// [`Self::pin`] without waiting: `None` while an unregister is under
    /// way or done. For a copy that goes on piece by piece and must stop
    /// landing bytes as soon as the memory stops being the registrant's.
    pub fn try_pin(&self) -> Option<Pin<'_>> {
        let g = self.live.try_read().ok()?;
        (*g).then_some(g)
    }

    /// The bytes `[addr, addr + len)`, which the caller checked lie inside
    /// the region.
    ///
    /// # Safety
    /// The caller must hold a [`Pin`] of this region for as long as it reads
    /// through the slice, and `[addr, addr + len)` must lie inside it.
    pub unsafe fn bytes(&self, addr: u64, len: u64) -> &[u8] {
        debug_assert!(self.contains(addr, len) && self.memory == Memory::Host);
        // SAFETY: inside a registered region, which the registrant vouched
        // is readable and writable until unregistered (`Regions::register`);
        // the caller's pin keeps it registered.
        unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len as usize) }
    }

    /// The bytes `[addr, addr + len)` for writing.
    ///
    /// # Safety
    /// As [`Self::bytes`]: the caller writes through the slice only while it
    /// holds a [`Pin`] of this region. The registrant, not this process's
    /// Rust code, owns the memory; concurrent access by the registrant is
    /// its own contract (Mooncake's: don't touch a buffer mid-transfer).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, addr: u64, len: u64) -> &mut [u8] {
        debug_assert!(self.contains(addr, len) && self.memory == Memory::Host);
        // SAFETY: as in `bytes`.
        unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut u8, len as usize) }
    }

    /// Where the region lives.
    pub fn memory(&self) -> Memory {
        self.memory
    }

    /// The bytes `[addr, addr + len)` to send: the region's own for host
    /// memory, else copied from the GPU into `staging`.
    ///
    /// # Safety
    /// As [`Self::bytes`].
    pub unsafe fn load<'a>(
        &'a self,
        addr: u64,
        len: u64,
        staging: &'a mut Vec<u8>,
    ) -> KvResult<&'a [u8]> {
        let Memory::Device(device) = self.memory else {
            // SAFETY: the caller's promise.
            return Ok(unsafe { self.bytes(addr, len) });
        };
        staging.clear();
        staging.resize(len as usize, 0);
        device.download(staging, addr)?;
        Ok(staging)
    }

    /// Copies `src` to `addr`: with the CPU into host memory, with the
    /// driver into GPU memory.
    ///
    /// # Safety
    /// As [`Self::bytes_mut`], for `[addr, addr + src.len())`.
    pub unsafe fn store(&self, addr: u64, src: &[u8]) -> KvResult<()> {
        match self.memory {
            // SAFETY: the caller's promise.
            Memory::Host => unsafe { self.bytes_mut(addr, src.len() as u64) }.copy_from_slice(src),
            Memory::Device(device) => device.upload(addr, src)?,
        }
        Ok(())
    }

    /// Reads a frame's `len`-byte payload from `conn` into `[addr, addr +
    /// len)`: straight into host memory, or through a host buffer into the
    /// GPU. The outer `Err` is a broken connection; the inner one this
    /// write's failure (unregistered midway, or the driver's copy failed).
    ///
    /// # Safety
    /// `[addr, addr + len)` must lie inside the region; no pin is needed
    /// (every piece lands under one).
    pub async unsafe fn land(
        &self,
        conn: &mut FramedConn,
        addr: u64,
        len: u64,
    ) -> KvResult<KvResult<()>> {
        let mut staging = Vec::new();
        let dst = match self.memory {
            // SAFETY: inside the region (the caller's promise); every read
            // into it runs under a pin the fenced read takes, so nothing
            // lands once an unregister is under way.
            Memory::Host => unsafe { self.bytes_mut(addr, len) },
            Memory::Device(_) => {
                staging.resize(len as usize, 0);
                &mut staging[..]
            }
        };
        if !conn
            .read_payload_fenced(dst, || self.try_pin(), |_| {})
            .await?
        {
            return Ok(Err(unregistered(addr, len)));
        }
        if self.memory == Memory::Host {
            return Ok(Ok(()));
        }
        let Some(_pin) = self.try_pin() else {
            return Ok(Err(unregistered(addr, len)));
        };
        // SAFETY: inside the region, pinned.
        Ok(unsafe { self.store(addr, &staging) })
    }

    /// Whether `[addr, addr + len)` lies entirely inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.start
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.start + self.len)
    }
}

/// The registered regions of one engine, by start address.
#[derive(Debug, Default)]
pub struct Regions {
    /// Short critical sections only (lookups, inserts, removals); copies
    /// never run under it.
    map: RwLock<Table>,
}

/// The table behind [`Regions`]'s lock.
#[derive(Debug, Default)]
struct Table {
    by_start: BTreeMap<u64, Arc<Region>>,
    next_seq: u64,
}

impl Regions {
    /// An empty table.
    pub fn new() -> Regions {
        Regions::default()
    }

    /// Registers `[addr, addr + len)`, which lives in `memory` (see
    /// [`Memory::locate`]): peers may write and read it, and local
    /// transfers may use it, until [`Self::unregister`]. Refused
    /// (`InvalidParams`) when empty or wrapping around, and
    /// (`ObjectAlreadyExists`, Mooncake's `ERR_ADDRESS_OVERLAPPED`) when it
    /// shares a byte with a registered region.
    ///
    /// # Safety
    /// The caller must guarantee the memory is valid for reads and writes,
    /// by any thread (through the driver, for GPU memory), until
    /// `unregister(addr)` has returned, and lives where `memory` says;
    /// peers write it at any time in between.
    pub unsafe fn register(&self, addr: u64, len: u64, memory: Memory) -> KvResult<()> {
        if len == 0 {
            return Err(invalid(format!("cannot register zero bytes at {addr:#x}")));
        }
        let end = addr
            .checked_add(len)
            .filter(|&e| usize::try_from(e).is_ok())
            .ok_or_else(|| invalid(format!("{addr:#x}+{len} wraps around")))?;
        let mut t = self.map.write();
        let below = t.by_start.range(..end).next_back();
        if let Some((_, r)) = below.filter(|(_, r)| r.start + r.len > addr) {
            return Err(KvError::new(
                Code::ObjectAlreadyExists,
                format!(
                    "{addr:#x}+{len} overlaps the registered region {:#x}+{}",
                    r.start, r.len
                ),
            ));
        }
        let seq = t.next_seq;
        t.next_seq += 1;
        let region = Region {
            start: addr,
            len,
            seq,
            memory,
            live: tokio::sync::RwLock::new(true),
        };
        t.by_start.insert(addr, Arc::new(region));
        Ok(())
    }

    /// Unregisters the region that starts at `addr`; returns whether there
    /// was one. Transfers that start after this is called are refused; it
    /// returns once copies in flight into or out of the region are done (a
    /// write cut off midway is refused to its sender).
    pub async fn unregister(&self, addr: u64) -> bool {
        let Some(region) = self.map.write().by_start.remove(&addr) else {
            return false;
        };
        *region.live.write().await = false;
        true
    }

    /// The region that holds all of `[addr, addr + len)`, if one does.
    pub fn find(&self, addr: u64, len: u64) -> Option<Arc<Region>> {
        let t = self.map.read();
        let (_, r) = t.by_start.range(..=addr).next_back()?;
        r.contains(addr, len).then(|| r.clone())
    }

    /// The region that holds `[addr, addr + len)`, or the error a transfer
    /// outside registered memory gets (`InvalidParams`).
    pub fn check(&self, addr: u64, len: u64, whose: &str) -> KvResult<Arc<Region>> {
        self.find(addr, len).ok_or_else(|| {
            invalid(format!(
                "{addr:#x}+{len} is not inside {whose} registered memory"
            ))
        })
    }

    /// Start and length of the earliest registration still in place
    /// (Mooncake's `get_first_buffer_address`).
    pub fn first(&self) -> Option<(u64, u64)> {
        let t = self.map.read();
        let r = t.by_start.values().min_by_key(|r| r.seq)?;
        Some((r.start, r.len))
    }

    /// How many regions are registered.
    pub fn len(&self) -> usize {
        self.map.read().by_start.len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn invalid(msg: String) -> KvError {
    KvError::new(Code::InvalidParams, msg)
}

/// The error of a transfer whose registered memory was unregistered while
/// its bytes moved.
pub(crate) fn unregistered(addr: u64, len: u64) -> KvError {
    KvError::new(
        Code::TransferFail,
        format!("{addr:#x}+{len} was unregistered during the transfer"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(regions: &[(u64, u64)]) -> Regions {
        let t = Regions::new();
        for &(a, l) in regions {
            // SAFETY: never dereferenced: these tests only look up ranges.
            unsafe { t.register(a, l, Memory::Host) }.unwrap();
        }
        t
    }

    #[test]
    fn lookups_need_the_whole_range_inside_one_region() {
        let t = table(&[(0x1000, 0x1000), (0x2000, 0x1000)]);
        assert!(t.find(0x1000, 0x1000).is_some());
        assert!(t.find(0x1800, 0x800).is_some());
        assert!(t.find(0x2fff, 1).is_some());
        // Adjacent regions are two regions: a range across both is refused.
        assert!(t.find(0x1800, 0x1000).is_none());
        assert!(t.find(0xfff, 2).is_none());
        assert!(t.find(0x3000, 1).is_none());
        assert!(t.find(0x2fff, 2).is_none());
        assert!(t.find(u64::MAX, 2).is_none());
        assert_eq!(
            t.check(0, 1, "this engine's").unwrap_err().code,
            Code::InvalidParams
        );
    }

    #[test]
    fn overlapping_empty_and_wrapping_registrations_are_refused() {
        let t = table(&[(0x1000, 0x1000)]);
        for (a, l) in [
            (0x1000, 0x1000),
            (0x800, 0x801),
            (0x1fff, 10),
            (0x1100, 1),
            (0, 0x10000),
        ] {
            // SAFETY: refused before anything is recorded.
            let e = unsafe { t.register(a, l, Memory::Host) }.unwrap_err();
            assert_eq!(e.code, Code::ObjectAlreadyExists, "{a:#x}+{l}");
        }
        for (a, l) in [(0x5000, 0), (u64::MAX - 1, 4)] {
            // SAFETY: refused before anything is recorded.
            let e = unsafe { t.register(a, l, Memory::Host) }.unwrap_err();
            assert_eq!(e.code, Code::InvalidParams, "{a:#x}+{l}");
        }
        // Touching but not overlapping is fine on both sides.
        // SAFETY: never dereferenced.
        unsafe {
            t.register(0x800, 0x800, Memory::Host).unwrap();
            t.register(0x2000, 0x10, Memory::Host).unwrap();
        }
        assert_eq!(t.len(), 3);
        assert_eq!(t.first(), Some((0x1000, 0x1000)));
    }

    #[tokio::test]
    async fn unregister_waits_for_pinned_copies_and_refuses_new_ones() {
        let t = Arc::new(table(&[(0x1000, 0x100)]));
        let r = t.find(0x1000, 0x10).unwrap();
        let pin = r.pin().await.unwrap();
        let t2 = t.clone();
        let gone = tokio::spawn(async move { t2.unregister(0x1000).await });
        // A piecewise copy stops landing bytes as soon as unregister waits.
        while r.try_pin().is_some() {
            tokio::task::yield_now().await;
        }
        // Out of the table, but not done while the copy holds on.
        assert!(t.find(0x1000, 0x10).is_none());
        assert!(!gone.is_finished());
        drop(pin);
        assert!(gone.await.unwrap());
        assert!(r.pin().await.is_none());
        assert!(!t.unregister(0x1000).await);
        assert_eq!(t.first(), None);
    }
}
