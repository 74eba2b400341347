//! Where the objects a store wrote into a memory segment start: one bit per
//! [`REGION_ALIGN`] bytes (2 MiB per GiB of segment, touched as used).
//!
//! A write grant stays valid for the put timeout, and the store forgets old
//! invalidations under heavy churn, and hears of an eviction a few
//! milliseconds after the master reused the region. A holder of a stale
//! grant could then write its whole old region while the master had placed
//! a newer object at a later offset inside it. With these bits a write is
//! refused when an object newer than its grant starts anywhere inside its
//! range, whatever the store remembers of invalidations. Bits come from
//! what this store wrote (wire writes and its own copies); a write clears
//! the starts it covers, so a bit never points into a later object's bytes.

use std::alloc::Layout;
use std::sync::atomic::{AtomicU64, Ordering};

use kvpool_format::REGION_ALIGN;

/// The object starts of one memory segment.
pub(super) struct Starts {
    bits: Box<[AtomicU64]>,
}

impl Starts {
    /// No starts yet, for a segment of `len` bytes. The words come zeroed
    /// from the allocator, so the kernel backs them only once written.
    pub(super) fn new(len: u64) -> Starts {
        let words = len.div_ceil(REGION_ALIGN).div_ceil(64) as usize;
        // At most 2^52 words of 8 bytes: always a valid layout.
        let layout = Layout::array::<AtomicU64>(words).expect("a bitmap layout");
        if layout.size() == 0 {
            return Starts { bits: Box::new([]) };
        }
        // SAFETY: the layout is non-empty; zeroed bytes are valid
        // `AtomicU64`s (zero), and the box frees with the same layout.
        let bits = unsafe {
            let ptr = std::alloc::alloc_zeroed(layout).cast::<AtomicU64>();
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, words))
        };
        Starts { bits }
    }

    /// Offsets of the starts strictly inside `offset..offset + len`, first
    /// to last.
    pub(super) fn inside(&self, offset: u64, len: u64) -> impl Iterator<Item = u64> + '_ {
        let (first, last) = self.span(offset, len);
        let words = if first > last {
            0..0
        } else {
            (first / 64) as usize..(last / 64) as usize + 1
        };
        words.flat_map(move |w| {
            let mut word = self.bits[w].load(Ordering::Acquire);
            let base = w as u64 * 64;
            std::iter::from_fn(move || {
                while word != 0 {
                    let g = base + u64::from(word.trailing_zeros());
                    word &= word - 1;
                    if (first..=last).contains(&g) {
                        return Some(g * REGION_ALIGN);
                    }
                }
                None
            })
        })
    }

    /// An object of `len` bytes was written at `offset`: the starts it
    /// covers are gone, its own is marked. A misaligned offset (no region
    /// the master hands out) marks nothing.
    pub(super) fn wrote(&self, offset: u64, len: u64) {
        if !offset.is_multiple_of(REGION_ALIGN) {
            return;
        }
        let (first, last) = self.span(offset, len);
        let mut g = first;
        while g <= last {
            let (w, b) = ((g / 64) as usize, g % 64);
            let n = (64 - b).min(last - g + 1);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << b
            };
            // Most words of a big object hold no start: only read them.
            if let Some(word) = self
                .bits
                .get(w)
                .filter(|x| x.load(Ordering::Relaxed) & mask != 0)
            {
                word.fetch_and(!mask, Ordering::Relaxed);
            }
            g += n;
        }
        let own = offset / REGION_ALIGN;
        if let Some(word) = self.bits.get((own / 64) as usize) {
            word.fetch_or(1 << (own % 64), Ordering::Release);
        }
    }

    /// Granules strictly after the one at `offset`, through the last one
    /// `len` bytes reach within the segment (none when `first > last`).
    fn span(&self, offset: u64, len: u64) -> (u64, u64) {
        let first = offset / REGION_ALIGN + 1;
        let Some(max) = (self.bits.len() as u64 * 64).checked_sub(1) else {
            return (1, 0);
        };
        let end = offset.saturating_add(len);
        let last = (end.saturating_sub(1) / REGION_ALIGN).min(max);
        (first, if len == 0 { 0 } else { last })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_marks_its_start_and_clears_what_it_covers() {
        let s = Starts::new(1 << 20);
        s.wrote(0, 64);
        s.wrote(128, 64);
        s.wrote(64 * 100, 4096);
        let all: Vec<u64> = s.inside(0, 1 << 20).collect();
        assert_eq!(all, vec![128, 6400]);
        assert_eq!(s.inside(64, 64).count(), 0, "only strictly inside");
        assert_eq!(s.inside(0, 129).collect::<Vec<_>>(), vec![128]);
        assert_eq!(s.inside(0, 128).count(), 0, "a start at the end is outside");
        // A larger object over both clears them.
        s.wrote(0, 8192);
        assert_eq!(s.inside(0, 1 << 20).count(), 0);
        assert_eq!(s.inside(64 * 99, 1 << 19).count(), 0);
        // Starts across word boundaries.
        for off in [64 * 63, 64 * 64, 64 * 65, 64 * 200] {
            s.wrote(off, 64);
        }
        let got: Vec<u64> = s.inside(64 * 62, 64 * 100).collect();
        assert_eq!(got, vec![64 * 63, 64 * 64, 64 * 65]);
        s.wrote(64 * 62, 64 * 138);
        assert_eq!(
            s.inside(0, 1 << 20).collect::<Vec<_>>(),
            vec![64 * 62, 64 * 200]
        );
        // Misaligned writes, and ranges past the end, do nothing wrong.
        s.wrote(100, 64);
        assert_eq!(s.inside((1 << 20) - 64, 1 << 30).count(), 0);
        assert_eq!(s.inside(0, 0).count(), 0);
    }
}
