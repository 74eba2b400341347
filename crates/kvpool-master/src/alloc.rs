// Long on purpose: half of this file (from `mod tests`) is the allocator's unit and property tests, kept beside the code they check.
//! Offset allocator for one storage segment.
//!
//! The master lends out regions of each segment's byte range but never touches the memory, so
//! this is pure bookkeeping over `[base, base + size)`. It is a two-level segregated fit (TLSF,
//! after Sebastian Aaltonen's OffsetAllocator): free blocks are binned by a small-float encoding of
//! their size (first level = power of two, second level = 8 linear steps), two bitmaps find the
//! smallest non-empty bin that is guaranteed to fit a request in O(1), and a freed block is merged
//! with its free physical neighbours at once, so a fully freed segment is a single block again.
//!
//! Only free blocks have bookkeeping: a node in the bins and an entry in an ordered map by offset,
//! through which a freed region finds its free neighbours. A live region costs the allocator
//! nothing, since its holder keeps its offset and length anyway; at tens of millions of objects
//! that is what a node per region (40 bytes each) used to cost the master.

use std::collections::BTreeMap;
use std::fmt;

/// Alignment of every region handed out; lengths are rounded up to it.
pub const ALIGN: u64 = 64;

/// The longest region handed out or rebuilt (256 GiB): its length in [`ALIGN`] units fits the
/// 32 bits an object slot keeps it in.
pub const MAX_REGION: u64 = u32::MAX as u64 * ALIGN;

/// 8 linear steps per power of two: a bin spans at most 1/8 of its lower bound, so the round-up
/// search only ever skips blocks less than 12.5 % larger than the request.
const MANTISSA_BITS: u32 = 3;
const LEAF_BINS: usize = 1 << MANTISSA_BITS;
const MANTISSA_MASK: u64 = (1 << MANTISSA_BITS) - 1;
/// One first-level bin per bit of a `u64` size, so the top bitmap is a single word.
const TOP_BINS: usize = 64;
const NUM_BINS: usize = TOP_BINS * LEAF_BINS;

/// Null link; it also caps the node slab at `u32::MAX` entries to keep nodes small.
const NONE: u32 = u32::MAX;

/// Blocks of the request's own bin examined once the O(1) paths fail. Bounded so that a nearly
/// full segment with many slightly-too-small holes cannot turn a failing alloc into a full scan.
const FALLBACK_SCAN: usize = 32;

/// Blocks of the largest bin examined by `largest_free` before it falls back to the bin bound.
const LARGEST_SCAN: usize = 8;

/// A region handed out by [`OffsetAllocator::alloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    /// Absolute start of the region; a multiple of [`ALIGN`].
    pub offset: u64,
    /// The rounded-up length actually reserved.
    pub len: u64,
}

/// Error for [`OffsetAllocator::with_used`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError {
    /// A region reaches outside the segment (or would need more than `u32::MAX` bookkeeping nodes).
    OutOfRange {
        /// Offset of the offending region.
        offset: u64,
        /// Length of the offending region, as given.
        len: u64,
    },
    /// A region overlaps another one once lengths are rounded up to [`ALIGN`].
    Overlap {
        /// Offset of the later of the two overlapping regions.
        offset: u64,
        /// Length of that region, as given.
        len: u64,
    },
    /// A region's offset is not a multiple of [`ALIGN`].
    Misaligned {
        /// The misaligned offset.
        offset: u64,
    },
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfRange { offset, len } => {
                write!(
                    f,
                    "region at offset {offset} (len {len}) lies outside the segment"
                )
            }
            Self::Overlap { offset, len } => {
                write!(
                    f,
                    "region at offset {offset} (len {len}) overlaps another region"
                )
            }
            Self::Misaligned { offset } => {
                write!(f, "region offset {offset} is not a multiple of {ALIGN}")
            }
        }
    }
}

impl std::error::Error for AllocError {}

/// One free block (24 bytes), in its bin's list. A slab slot with `size == 0` describes no
/// block; vacant slots are chained through `bin_next` for reuse.
#[derive(Debug, Clone, Copy)]
struct Node {
    offset: u64,
    size: u64,
    bin_prev: u32,
    bin_next: u32,
}

impl Node {
    fn new(offset: u64, size: u64) -> Self {
        Self {
            offset,
            size,
            bin_prev: NONE,
            bin_next: NONE,
        }
    }
}

/// Nodes per chunk of the [`NodeSlab`] (96 KiB).
const SLAB_CHUNK: usize = 4096;

/// The node slab in fixed-size chunks: growing it never moves the nodes it
/// has (a `Vec` of millions of nodes copied itself on growth, under the
/// segment's lock) and never holds more than one chunk of spare room.
#[derive(Default)]
struct NodeSlab {
    chunks: Vec<Box<[Node]>>,
    len: usize,
}

impl NodeSlab {
    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, node: Node) {
        if self.len == self.chunks.len() * SLAB_CHUNK {
            self.chunks.push(vec![node; SLAB_CHUNK].into_boxed_slice());
        }
        let i = self.len;
        self.len += 1;
        self[i] = node;
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = &Node> {
        (0..self.len).map(|i| &self[i])
    }
}

impl std::ops::Index<usize> for NodeSlab {
    type Output = Node;
    fn index(&self, i: usize) -> &Node {
        debug_assert!(i < self.len);
        &self.chunks[i / SLAB_CHUNK][i % SLAB_CHUNK]
    }
}

impl std::ops::IndexMut<usize> for NodeSlab {
    fn index_mut(&mut self, i: usize) -> &mut Node {
        debug_assert!(i < self.len);
        &mut self.chunks[i / SLAB_CHUNK][i % SLAB_CHUNK]
    }
}

// The mask arithmetic below relies on it.
const _: () = assert!(ALIGN.is_power_of_two());

/// Whether `v` is a multiple of [`ALIGN`] (a mask, so it needs no MSRV-dependent helper).
fn is_aligned(v: u64) -> bool {
    v & (ALIGN - 1) == 0
}

/// Rounds a request up to [`ALIGN`]; zero still takes one unit so every region has an identity.
/// A region rebuilt from a reported length has this length.
pub(crate) fn normalize_len(len: u64) -> Option<u64> {
    if len == 0 {
        return Some(ALIGN);
    }
    len.checked_add(ALIGN - 1).map(|l| l & !(ALIGN - 1))
}

/// Bin whose lower bound is the largest one `<= units` (where a free block of that size lives).
fn bin_floor(units: u64) -> usize {
    if units <= MANTISSA_MASK {
        return units as usize;
    }
    let shift = 63 - units.leading_zeros() - MANTISSA_BITS;
    let exp = u64::from(shift) + 1;
    ((exp << MANTISSA_BITS) | ((units >> shift) & MANTISSA_MASK)) as usize
}

/// Smallest bin whose every block holds at least `units`.
fn bin_ceil(units: u64) -> usize {
    if units <= MANTISSA_MASK {
        return units as usize;
    }
    let shift = 63 - units.leading_zeros() - MANTISSA_BITS;
    let inexact = units & ((1u64 << shift) - 1) != 0;
    bin_floor(units) + usize::from(inexact)
}

/// Smallest size (in ALIGN units) stored in `bin`; saturates past the `u64` range.
fn bin_lower(bin: usize) -> u64 {
    let exp = (bin >> MANTISSA_BITS) as u32;
    let mantissa = (bin as u64) & MANTISSA_MASK;
    if exp == 0 {
        mantissa
    } else if exp - 1 > 60 {
        u64::MAX
    } else {
        ((1 << MANTISSA_BITS) | mantissa) << (exp - 1)
    }
}

/// Bin-based O(1) offset allocator for one segment's range `[base, base + size)`.
pub struct OffsetAllocator {
    base: u64,
    size: u64,
    used_bytes: u64,
    /// Slab of free blocks; it never shrinks, vacant slots are recycled through `vacant_head`.
    nodes: NodeSlab,
    vacant_head: u32,
    /// The free blocks by offset: where a freed region finds its neighbours.
    by_offset: BTreeMap<u64, u32>,
    /// Live regions.
    live: usize,
    top_bitmap: u64,
    leaf_bitmaps: [u8; TOP_BINS],
    bin_heads: [u32; NUM_BINS],
}

impl fmt::Debug for OffsetAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The maps can hold millions of blocks; a summary is what a log line wants.
        f.debug_struct("OffsetAllocator")
            .field("base", &self.base)
            .field("capacity", &self.size)
            .field("used", &self.used_bytes)
            .field("live_regions", &self.live)
            .field("free_blocks", &self.by_offset.len())
            .finish_non_exhaustive()
    }
}

impl OffsetAllocator {
    /// Manages `[base, base + size)`, shrunk inward to [`ALIGN`] boundaries (and to `u64::MAX`).
    pub fn new(base: u64, size: u64) -> Self {
        let mut this = Self::empty(base, size);
        if this.size > 0 {
            this.add_free(this.base, this.size);
        }
        this
    }

    /// Rebuilds an allocator whose given `(offset, len)` regions are already in use, in any order.
    ///
    /// Lengths are rounded up to [`ALIGN`] before the overlap and range checks; the first bad
    /// region found is reported. Sorting makes this O(n log n) in the number of regions.
    pub fn with_used(
        base: u64,
        size: u64,
        used: impl IntoIterator<Item = (u64, u64)>,
    ) -> Result<Self, AllocError> {
        let mut this = Self::empty(base, size);
        let (base, end) = (this.base, this.base + this.size);

        // (offset, rounded len, len as given) so errors can quote the caller's values.
        let mut regions: Vec<(u64, u64, u64)> = Vec::new();
        for (offset, len) in used {
            if !is_aligned(offset) {
                return Err(AllocError::Misaligned { offset });
            }
            let rounded = normalize_len(len).filter(|&r| r <= MAX_REGION);
            match rounded.and_then(|r| offset.checked_add(r)) {
                Some(region_end) if offset >= base && region_end <= end => {
                    regions.push((offset, region_end - offset, len));
                }
                _ => return Err(AllocError::OutOfRange { offset, len }),
            }
        }
        regions.sort_unstable_by_key(|r| r.0);
        for pair in regions.windows(2) {
            let ((a_off, a_len, _), (b_off, _, b_given)) = (pair[0], pair[1]);
            if a_off + a_len > b_off {
                return Err(AllocError::Overlap {
                    offset: b_off,
                    len: b_given,
                });
            }
        }

        let mut cursor = base;
        for &(offset, len, _) in &regions {
            if offset > cursor {
                this.add_free(cursor, offset - cursor);
            }
            cursor = offset + len;
        }
        if end > cursor {
            this.add_free(cursor, end - cursor);
        }
        this.live = regions.len();
        this.used_bytes = regions.iter().map(|r| r.1).sum();
        Ok(this)
    }

    /// Reserves `len` bytes (rounded up to [`ALIGN`], 0 counts as `ALIGN`); `None` if nothing fits
    /// or `len` is over [`MAX_REGION`].
    ///
    /// Order of preference: the head of the request's own bin when it fits (same-size holes are
    /// reused before larger blocks are split), then the smallest bin guaranteed to fit, then a
    /// bounded scan of the own bin. Because that last scan is capped at `FALLBACK_SCAN` blocks,
    /// `None` can be returned while a fitting block exists only when every fitting block sits in
    /// the request's own bin behind more than that many too-small ones.
    pub fn alloc(&mut self, len: u64) -> Option<Region> {
        let size = normalize_len(len).filter(|&s| s <= MAX_REGION)?;
        if size > self.free_bytes() {
            return None;
        }
        let units = size / ALIGN;
        let own = bin_floor(units);
        let head = self.bin_heads[own];
        let idx = if head != NONE && self.nodes[head as usize].size >= size {
            head
        } else if let Some(bin) = self.first_nonempty_from(bin_ceil(units)) {
            self.bin_heads[bin]
        } else {
            self.scan_bin(own, size)?
        };
        Some(self.take(idx, size))
    }

    /// Returns a live region from `alloc`/`with_used`, merging it with free neighbours.
    ///
    /// The allocator keeps no record of live regions, so it can only refuse a region that is
    /// out of range, misaligned, or overlaps free space (a double free): that trips a debug
    /// assertion and is otherwise ignored, leaving the allocator untouched. Freeing with a length
    /// other than the one reserved is a caller bug it cannot see.
    pub fn free(&mut self, region: Region) {
        let offset = region.offset;
        // Overflowing lengths are out of range below.
        let size = normalize_len(region.len).unwrap_or(u64::MAX);
        let end = offset.saturating_add(size);
        let before = self.by_offset.range(..=offset).next_back().map(|(_, &i)| i);
        let before_end =
            before.map(|i| self.nodes[i as usize].offset + self.nodes[i as usize].size);
        let after = self.by_offset.range(offset..).next().map(|(&o, &i)| (o, i));
        let live = is_aligned(offset)
            && offset >= self.base
            && end <= self.base + self.size
            && size <= self.used_bytes
            && self.live > 0
            && before_end.is_none_or(|e| e <= offset)
            && after.is_none_or(|(o, _)| o >= end);
        debug_assert!(live, "free of {region:?}, which is not live");
        if !live {
            return;
        }
        self.live -= 1;
        self.used_bytes -= size;
        // Merge with the free neighbours it touches.
        let extra = after.filter(|&(o, _)| o == end).map_or(0, |(_, a)| {
            let n = self.nodes[a as usize].size;
            self.remove_free(a);
            n
        });
        match before.filter(|_| before_end == Some(offset)) {
            Some(b) => self.resize_free(b, self.nodes[b as usize].size + size + extra),
            None => self.add_free(offset, size + extra),
        }
    }

    /// Total managed bytes.
    pub fn capacity(&self) -> u64 {
        self.size
    }

    /// Bytes currently reserved (sum of live region lens).
    pub fn used(&self) -> u64 {
        self.used_bytes
    }

    /// Bytes currently free.
    pub fn free_bytes(&self) -> u64 {
        self.size - self.used_bytes
    }

    /// Size of the largest free block: an upper bound, exact when its bin holds few blocks.
    ///
    /// The largest non-empty bin is found from the bitmaps; if it holds at most `LARGEST_SCAN`
    /// blocks (the usual case: one big tail block) their exact maximum is returned, otherwise
    /// the bin's upper edge, capped by `free_bytes()`. So `alloc(largest_free())` may fail only
    /// in that crowded case.
    pub fn largest_free(&self) -> u64 {
        if self.top_bitmap == 0 {
            return 0;
        }
        let top = 63 - self.top_bitmap.leading_zeros() as usize;
        let leaf = 7 - self.leaf_bitmaps[top].leading_zeros() as usize;
        let bin = top * LEAF_BINS + leaf;
        let mut best = 0;
        let mut idx = self.bin_heads[bin];
        for _ in 0..LARGEST_SCAN {
            if idx == NONE {
                return best;
            }
            let node = &self.nodes[idx as usize];
            best = best.max(node.size);
            idx = node.bin_next;
        }
        if idx == NONE {
            return best;
        }
        let upper = (bin_lower(bin + 1) - 1).saturating_mul(ALIGN);
        upper.min(self.free_bytes()).max(best)
    }

    /// Number of live regions.
    pub fn live_regions(&self) -> usize {
        self.live
    }

    fn empty(base: u64, size: u64) -> Self {
        let end = base.saturating_add(size) & !(ALIGN - 1);
        // A base that cannot be rounded up lies in the last partial unit: the range is empty.
        let base = base
            .checked_add(ALIGN - 1)
            .map_or(end, |b| b & !(ALIGN - 1));
        Self {
            base,
            size: end.saturating_sub(base),
            used_bytes: 0,
            nodes: NodeSlab::default(),
            vacant_head: NONE,
            by_offset: BTreeMap::new(),
            live: 0,
            top_bitmap: 0,
            leaf_bitmaps: [0; TOP_BINS],
            bin_heads: [NONE; NUM_BINS],
        }
    }

    /// Lowest non-empty bin at or above `bin`.
    fn first_nonempty_from(&self, bin: usize) -> Option<usize> {
        if bin >= NUM_BINS {
            return None;
        }
        let (top, leaf) = (bin / LEAF_BINS, bin % LEAF_BINS);
        let leaf_mask = self.leaf_bitmaps[top] & (u8::MAX << leaf);
        if leaf_mask != 0 {
            return Some(top * LEAF_BINS + leaf_mask.trailing_zeros() as usize);
        }
        let top_mask = self.top_bitmap & u64::MAX.checked_shl(top as u32 + 1).unwrap_or(0);
        if top_mask == 0 {
            return None;
        }
        let top = top_mask.trailing_zeros() as usize;
        Some(top * LEAF_BINS + self.leaf_bitmaps[top].trailing_zeros() as usize)
    }

    /// Bounded search past the head of `bin` for a block of at least `size` bytes.
    fn scan_bin(&self, bin: usize, size: u64) -> Option<u32> {
        let head = self.bin_heads[bin];
        if head == NONE {
            return None;
        }
        let mut idx = self.nodes[head as usize].bin_next;
        for _ in 0..FALLBACK_SCAN {
            if idx == NONE {
                return None;
            }
            let node = &self.nodes[idx as usize];
            if node.size >= size {
                return Some(idx);
            }
            idx = node.bin_next;
        }
        None
    }

    /// Reserves the first `size` bytes of free block `idx`; the rest stays free.
    fn take(&mut self, idx: u32, size: u64) -> Region {
        let Node {
            offset, size: had, ..
        } = self.nodes[idx as usize];
        if had == size {
            self.remove_free(idx);
        } else {
            self.unlink_from_bin(idx);
            self.by_offset.remove(&offset);
            self.nodes[idx as usize].offset = offset + size;
            self.nodes[idx as usize].size = had - size;
            self.by_offset.insert(offset + size, idx);
            self.link_into_bin(idx);
        }
        self.live += 1;
        self.used_bytes += size;
        Region { offset, len: size }
    }

    /// Records `[offset, offset + size)` as one free block.
    fn add_free(&mut self, offset: u64, size: u64) {
        let node = Node::new(offset, size);
        let idx = if self.vacant_head != NONE {
            let idx = self.vacant_head;
            self.vacant_head = self.nodes[idx as usize].bin_next;
            self.nodes[idx as usize] = node;
            idx
        } else {
            // Free blocks are at most half the segment's 64-byte units plus one: a
            // segment would need 256 GiB per 4 billion blocks to run out of indices.
            let idx = u32::try_from(self.nodes.len())
                .ok()
                .filter(|&i| i != NONE)
                .expect("free block indices exhausted");
            self.nodes.push(node);
            idx
        };
        self.by_offset.insert(offset, idx);
        self.link_into_bin(idx);
    }

    /// Grows or shrinks free block `idx` in place (its offset stays).
    fn resize_free(&mut self, idx: u32, size: u64) {
        self.unlink_from_bin(idx);
        self.nodes[idx as usize].size = size;
        self.link_into_bin(idx);
    }

    /// Forgets free block `idx` (it was merged or taken whole).
    fn remove_free(&mut self, idx: u32) {
        self.unlink_from_bin(idx);
        self.by_offset.remove(&self.nodes[idx as usize].offset);
        let node = &mut self.nodes[idx as usize];
        node.size = 0;
        node.bin_next = self.vacant_head;
        self.vacant_head = idx;
    }

    /// Pushes free block `idx` on the front of its bin (LIFO: the hole just freed is reused
    /// first, which keeps same-size churn in the same few places).
    fn link_into_bin(&mut self, idx: u32) {
        let bin = bin_floor(self.nodes[idx as usize].size / ALIGN);
        let head = self.bin_heads[bin];
        let node = &mut self.nodes[idx as usize];
        node.bin_prev = NONE;
        node.bin_next = head;
        if head != NONE {
            self.nodes[head as usize].bin_prev = idx;
        }
        self.bin_heads[bin] = idx;
        self.leaf_bitmaps[bin / LEAF_BINS] |= 1 << (bin % LEAF_BINS);
        self.top_bitmap |= 1 << (bin / LEAF_BINS);
    }

    /// Removes free block `idx` from its bin; must run before its size changes.
    fn unlink_from_bin(&mut self, idx: u32) {
        let node = self.nodes[idx as usize];
        let bin = bin_floor(node.size / ALIGN);
        if node.bin_prev != NONE {
            self.nodes[node.bin_prev as usize].bin_next = node.bin_next;
        } else {
            self.bin_heads[bin] = node.bin_next;
        }
        if node.bin_next != NONE {
            self.nodes[node.bin_next as usize].bin_prev = node.bin_prev;
        }
        if self.bin_heads[bin] == NONE {
            let top = bin / LEAF_BINS;
            self.leaf_bitmaps[top] &= !(1 << (bin % LEAF_BINS));
            if self.leaf_bitmaps[top] == 0 {
                self.top_bitmap &= !(1 << top);
            }
        }
    }
}

#[cfg(test)]
mod tests;
