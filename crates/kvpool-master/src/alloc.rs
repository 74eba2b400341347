// Long on purpose: half of this file (from `mod tests`) is the allocator's unit and property tests, kept beside the code they check.
//! Offset allocator for one storage segment.
//!
//! The master lends out regions of each segment's byte range but never touches the memory, so
//! this is pure bookkeeping over `[base, base + size)`. It is a two-level segregated fit (TLSF,
//! after Sebastian Aaltonen's OffsetAllocator): free blocks are binned by a small-float encoding of
//! their size (first level = power of two, second level = 8 linear steps), two bitmaps find the
//! smallest non-empty bin that is guaranteed to fit a request in O(1), and a freed block is merged
//! with its free physical neighbours at once, so a fully freed segment is a single block again.

use std::fmt;

/// Alignment of every region handed out; lengths are rounded up to it.
pub const ALIGN: u64 = 64;

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
    /// The allocator's block for it, so freeing it needs no lookup (a map
    /// from offsets to blocks cost 26 bytes per region, and growing it
    /// stalled the segment for milliseconds at millions of regions).
    pub node: u32,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Used,
    /// Slab slot not describing any block; chained through `bin_next` for reuse.
    Vacant,
}

/// One block of the segment (40 bytes). Free blocks sit in their bin's list; every non-vacant
/// block is linked to its physical neighbours so that `free` can coalesce in O(1).
#[derive(Debug, Clone, Copy)]
struct Node {
    offset: u64,
    size: u64,
    bin_prev: u32,
    bin_next: u32,
    phys_prev: u32,
    phys_next: u32,
    state: State,
}

impl Node {
    fn new(offset: u64, size: u64, phys_prev: u32, phys_next: u32, state: State) -> Self {
        Self {
            offset,
            size,
            bin_prev: NONE,
            bin_next: NONE,
            phys_prev,
            phys_next,
            state,
        }
    }
}

/// Nodes per chunk of the [`NodeSlab`] (160 KiB).
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

    fn reserve(&mut self, additional: usize) {
        let want = (self.len + additional).div_ceil(SLAB_CHUNK);
        self.chunks.reserve(want.saturating_sub(self.chunks.len()));
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
fn normalize_len(len: u64) -> Option<u64> {
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
    /// Slab of blocks; it never shrinks, vacant slots are recycled through `vacant_head`.
    nodes: NodeSlab,
    vacant_head: u32,
    /// Live regions.
    live: usize,
    top_bitmap: u64,
    leaf_bitmaps: [u8; TOP_BINS],
    bin_heads: [u32; NUM_BINS],
}

impl fmt::Debug for OffsetAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The slab can hold millions of nodes; a summary is what a log line wants.
        f.debug_struct("OffsetAllocator")
            .field("base", &self.base)
            .field("capacity", &self.size)
            .field("used", &self.used_bytes)
            .field("live_regions", &self.live)
            .finish_non_exhaustive()
    }
}

impl OffsetAllocator {
    /// Manages `[base, base + size)`, shrunk inward to [`ALIGN`] boundaries (and to `u64::MAX`).
    pub fn new(base: u64, size: u64) -> Self {
        let mut this = Self::empty(base, size);
        if this.size > 0 {
            let node = Node::new(this.base, this.size, NONE, NONE, State::Free);
            if let Some(idx) = this.push_node(node) {
                this.link_into_bin(idx);
            }
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
            let rounded = normalize_len(len);
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

        this.nodes.reserve(2 * regions.len() + 1);
        let mut cursor = base;
        let mut prev = NONE;
        for &(offset, len, given) in &regions {
            let too_many = AllocError::OutOfRange { offset, len: given };
            if offset > cursor {
                prev = this
                    .append_block(prev, cursor, offset - cursor, State::Free)
                    .ok_or_else(|| too_many.clone())?;
            }
            prev = this
                .append_block(prev, offset, len, State::Used)
                .ok_or(too_many)?;
            cursor = offset + len;
        }
        if end > cursor {
            this.append_block(prev, cursor, end - cursor, State::Free)
                .ok_or(AllocError::OutOfRange {
                    offset: cursor,
                    len: end - cursor,
                })?;
        }
        Ok(this)
    }

    /// Reserves `len` bytes (rounded up to [`ALIGN`], 0 counts as `ALIGN`); `None` if nothing fits.
    ///
    /// Order of preference: the head of the request's own bin when it fits (same-size holes are
    /// reused before larger blocks are split), then the smallest bin guaranteed to fit, then a
    /// bounded scan of the own bin. Because that last scan is capped at `FALLBACK_SCAN` blocks,
    /// `None` can be returned while a fitting block exists only when every fitting block sits in
    /// the request's own bin behind more than that many too-small ones.
    pub fn alloc(&mut self, len: u64) -> Option<Region> {
        let size = normalize_len(len)?;
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
        self.take(idx, size)
    }

    /// Returns a live region from `alloc`/`with_used`, merging it with free neighbours.
    ///
    /// An unknown offset or a length that does not match the live region is a caller bug: it
    /// trips a debug assertion and is otherwise ignored, leaving the allocator untouched.
    pub fn free(&mut self, region: Region) {
        let idx = region.node;
        let live = (idx as usize) < self.nodes.len() && {
            let n = &self.nodes[idx as usize];
            n.state == State::Used
                && n.offset == region.offset
                && normalize_len(region.len) == Some(n.size)
        };
        debug_assert!(live, "free of {region:?}, which is not live");
        if !live {
            return;
        }
        let mut node = self.nodes[idx as usize];
        self.live -= 1;
        self.used_bytes -= node.size;

        let prev = node.phys_prev;
        if prev != NONE && self.nodes[prev as usize].state == State::Free {
            self.unlink_from_bin(prev);
            let p = self.nodes[prev as usize];
            node.offset = p.offset;
            node.size += p.size;
            node.phys_prev = p.phys_prev;
            if p.phys_prev != NONE {
                self.nodes[p.phys_prev as usize].phys_next = idx;
            }
            self.release_node(prev);
        }
        let next = node.phys_next;
        if next != NONE && self.nodes[next as usize].state == State::Free {
            self.unlink_from_bin(next);
            let n = self.nodes[next as usize];
            node.size += n.size;
            node.phys_next = n.phys_next;
            if n.phys_next != NONE {
                self.nodes[n.phys_next as usize].phys_prev = idx;
            }
            self.release_node(next);
        }
        self.nodes[idx as usize] = node;
        self.link_into_bin(idx);
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

    /// The live regions in offset order (as [`Self::with_used`] was given
    /// them, once rebuilt), with the blocks that free them.
    pub fn live_list(&self) -> Vec<Region> {
        let mut out = Vec::with_capacity(self.live);
        let first = (0..self.nodes.len()).find(|&i| {
            let n = &self.nodes[i];
            n.state != State::Vacant && n.phys_prev == NONE
        });
        let mut idx = first.map_or(NONE, |i| i as u32);
        while idx != NONE {
            let n = &self.nodes[idx as usize];
            if n.state == State::Used {
                out.push(Region {
                    offset: n.offset,
                    len: n.size,
                    node: idx,
                });
            }
            idx = n.phys_next;
        }
        out
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
            live: 0,
            top_bitmap: 0,
            leaf_bitmaps: [0; TOP_BINS],
            bin_heads: [NONE; NUM_BINS],
        }
    }

    /// Appends a block after `prev` in physical order while rebuilding in `with_used`.
    fn append_block(&mut self, prev: u32, offset: u64, size: u64, state: State) -> Option<u32> {
        let idx = self.push_node(Node::new(offset, size, prev, NONE, state))?;
        if prev != NONE {
            self.nodes[prev as usize].phys_next = idx;
        }
        match state {
            State::Free => self.link_into_bin(idx),
            _ => {
                self.live += 1;
                self.used_bytes += size;
            }
        }
        Some(idx)
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

    /// Marks the first `size` bytes of free block `idx` used, returning the tail to its bin.
    fn take(&mut self, idx: u32, size: u64) -> Option<Region> {
        let node = self.nodes[idx as usize];
        let rest = node.size - size;
        // Get the tail's node before touching anything, so running out of node indices is a
        // clean `None` rather than a half-done split.
        let tail = if rest > 0 {
            let tail = Node::new(node.offset + size, rest, idx, node.phys_next, State::Free);
            Some(self.push_node(tail)?)
        } else {
            None
        };
        self.unlink_from_bin(idx);
        if let Some(tail) = tail {
            if node.phys_next != NONE {
                self.nodes[node.phys_next as usize].phys_prev = tail;
            }
            let n = &mut self.nodes[idx as usize];
            n.phys_next = tail;
            n.size = size;
            self.link_into_bin(tail);
        }
        self.nodes[idx as usize].state = State::Used;
        self.live += 1;
        self.used_bytes += size;
        Some(Region {
            offset: node.offset,
            len: size,
            node: idx,
        })
    }

    fn push_node(&mut self, node: Node) -> Option<u32> {
        if self.vacant_head != NONE {
            let idx = self.vacant_head;
            self.vacant_head = self.nodes[idx as usize].bin_next;
            self.nodes[idx as usize] = node;
            return Some(idx);
        }
        let idx = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&i| i != NONE)?;
        self.nodes.push(node);
        Some(idx)
    }

    fn release_node(&mut self, idx: u32) {
        let node = &mut self.nodes[idx as usize];
        node.state = State::Vacant;
        node.bin_next = self.vacant_head;
        self.vacant_head = idx;
    }

    /// Pushes free block `idx` on the front of its bin (LIFO: the hole just freed is reused
    /// first, which keeps same-size churn in the same few places).
    fn link_into_bin(&mut self, idx: u32) {
        let bin = bin_floor(self.nodes[idx as usize].size / ALIGN);
        let head = self.bin_heads[bin];
        let node = &mut self.nodes[idx as usize];
        node.state = State::Free;
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Where a region lies, whatever block it has.
    fn span(r: Option<Region>) -> Option<(u64, u64)> {
        r.map(|r| (r.offset, r.len))
    }

    /// The live region at `offset`.
    fn live_at(a: &OffsetAllocator, offset: u64) -> Region {
        a.live_list()
            .into_iter()
            .find(|r| r.offset == offset)
            .expect("live region")
    }

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    const TIB: u64 = 1024 * 1024 * MIB;

    impl OffsetAllocator {
        /// Walks every structure and panics on the first inconsistency.
        fn check_invariants(&self) {
            let live: Vec<u32> = (0..self.nodes.len() as u32)
                .filter(|&i| self.nodes[i as usize].state != State::Vacant)
                .collect();
            let firsts: Vec<u32> = live
                .iter()
                .copied()
                .filter(|&i| self.nodes[i as usize].phys_prev == NONE)
                .collect();
            if self.size == 0 {
                assert!(live.is_empty());
            } else {
                assert_eq!(firsts.len(), 1, "exactly one first block");
            }

            let (mut cursor, mut prev, mut walked) = (self.base, NONE, 0usize);
            let (mut used, mut used_count, mut free_count) = (0u64, 0usize, 0usize);
            let mut idx = firsts.first().copied().unwrap_or(NONE);
            while idx != NONE {
                let n = self.nodes[idx as usize];
                assert_eq!(n.offset, cursor, "blocks are contiguous");
                assert_eq!(n.phys_prev, prev);
                assert!(n.size > 0 && is_aligned(n.size));
                match n.state {
                    State::Used => {
                        used += n.size;
                        used_count += 1;
                    }
                    State::Free => {
                        free_count += 1;
                        if prev != NONE {
                            assert_ne!(self.nodes[prev as usize].state, State::Free, "coalesced");
                        }
                    }
                    State::Vacant => panic!("vacant node in physical chain"),
                }
                cursor += n.size;
                prev = idx;
                idx = n.phys_next;
                walked += 1;
            }
            assert_eq!(walked, live.len());
            assert_eq!(cursor, self.base + self.size, "blocks cover the range");
            assert_eq!(used, self.used_bytes);
            assert_eq!(used_count, self.live);

            let mut binned = 0;
            for bin in 0..NUM_BINS {
                let (top, leaf) = (bin / LEAF_BINS, bin % LEAF_BINS);
                let head = self.bin_heads[bin];
                assert_eq!(self.leaf_bitmaps[top] & (1 << leaf) != 0, head != NONE);
                let (mut idx, mut prev) = (head, NONE);
                while idx != NONE {
                    let n = self.nodes[idx as usize];
                    assert_eq!(n.state, State::Free);
                    assert_eq!(bin_floor(n.size / ALIGN), bin);
                    assert_eq!(n.bin_prev, prev);
                    binned += 1;
                    prev = idx;
                    idx = n.bin_next;
                }
            }
            for top in 0..TOP_BINS {
                assert_eq!(
                    self.top_bitmap & (1 << top) != 0,
                    self.leaf_bitmaps[top] != 0
                );
            }
            assert_eq!(binned, free_count);

            let mut vacant = 0;
            let mut idx = self.vacant_head;
            while idx != NONE {
                assert_eq!(self.nodes[idx as usize].state, State::Vacant);
                vacant += 1;
                idx = self.nodes[idx as usize].bin_next;
            }
            assert_eq!(vacant + live.len(), self.nodes.len());
        }

        fn exact_largest_free(&self) -> u64 {
            self.nodes
                .iter()
                .filter(|n| n.state == State::Free)
                .map(|n| n.size)
                .max()
                .unwrap_or(0)
        }

        fn bin_len(&self, bin: usize) -> usize {
            let mut idx = self.bin_heads[bin];
            let mut len = 0;
            while idx != NONE {
                len += 1;
                idx = self.nodes[idx as usize].bin_next;
            }
            len
        }
    }

    fn assert_disjoint(regions: &[Region]) {
        let mut sorted = regions.to_vec();
        sorted.sort_by_key(|r| r.offset);
        for pair in sorted.windows(2) {
            assert!(
                pair[0].offset + pair[0].len <= pair[1].offset,
                "{pair:?} overlap"
            );
        }
    }

    #[test]
    fn node_is_small() {
        assert!(std::mem::size_of::<Node>() <= 40);
    }

    #[test]
    fn bin_math_is_consistent() {
        let mut samples: Vec<u64> = (1..5000).collect();
        for shift in 0..58 {
            let p = 1u64 << shift;
            samples.extend(
                [p - 1, p, p + 1, p + p / 3, (p << 1) - 1]
                    .iter()
                    .filter(|&&u| u > 0),
            );
        }
        for units in samples {
            let (floor, ceil) = (bin_floor(units), bin_ceil(units));
            assert!(
                bin_lower(floor) <= units && units < bin_lower(floor + 1),
                "{units}"
            );
            assert!(
                bin_lower(ceil) >= units,
                "{units}: every block in ceil bin fits"
            );
            assert!(ceil == floor || ceil == floor + 1);
            assert_eq!(ceil == floor, bin_lower(floor) == units);
            assert!(ceil < NUM_BINS);
        }
        for bin in 1..(58 * LEAF_BINS) {
            assert_eq!(bin_floor(bin_lower(bin)), bin);
            assert!(bin_lower(bin) < bin_lower(bin + 1));
        }
    }

    #[test]
    fn alloc_until_full_then_none_then_full_reuse() {
        let mut a = OffsetAllocator::new(0, MIB);
        let mut regions = Vec::new();
        while let Some(r) = a.alloc(4 * KIB) {
            regions.push(r);
        }
        assert_eq!(regions.len(), 256);
        assert_eq!(a.used(), MIB);
        assert_eq!(a.free_bytes(), 0);
        assert_eq!(a.largest_free(), 0);
        assert_eq!(a.alloc(1), None);
        assert_disjoint(&regions);
        a.check_invariants();

        // Free in an interleaved order so both-side merges happen.
        let (even, odd): (Vec<_>, Vec<_>) =
            regions.iter().enumerate().partition(|(i, _)| i % 2 == 0);
        for (_, r) in even.into_iter().chain(odd) {
            a.free(*r);
        }
        a.check_invariants();
        assert_eq!(a.used(), 0);
        assert_eq!(a.live_regions(), 0);
        assert_eq!(a.largest_free(), MIB);
        assert_eq!(span(a.alloc(MIB)), Some((0, MIB)));
        assert_eq!(a.alloc(1), None);
    }

    /// Many more regions than one slab chunk holds or one offset-map part
    /// is sized for: nodes across chunk boundaries stay linked and every
    /// region is found again by its offset.
    #[test]
    fn many_regions_across_slab_chunks() {
        let n = 3 * SLAB_CHUNK + 17;
        let mut a = OffsetAllocator::new(0, n as u64 * ALIGN);
        let regions: Vec<Region> = (0..n).map(|_| a.alloc(ALIGN).expect("room")).collect();
        assert_disjoint(&regions);
        assert_eq!((a.live_regions(), a.alloc(ALIGN)), (n, None));
        for r in regions.iter().step_by(2) {
            a.free(*r);
        }
        a.check_invariants();
        assert_eq!(a.live_regions(), n / 2);
        for r in regions.iter().skip(1).step_by(2) {
            a.free(*r);
        }
        a.check_invariants();
        assert_eq!((a.used(), a.largest_free()), (0, n as u64 * ALIGN));
    }

    #[test]
    fn mixed_sizes_fill_and_fully_reuse() {
        let base = 7 * TIB;
        let cap = 3 * MIB + 4 * KIB;
        let mut a = OffsetAllocator::new(base, cap);
        let sizes = [100, 4096 + 100, 64, 1, 0, 200_000, 65, 16 * KIB];
        let mut regions = Vec::new();
        let mut i = 0;
        while let Some(r) = a.alloc(sizes[i % sizes.len()]) {
            regions.push(r);
            i += 1;
        }
        assert!(regions
            .iter()
            .all(|r| r.offset >= base && r.offset + r.len <= base + cap));
        assert_disjoint(&regions);
        for r in regions.iter().rev().step_by(3) {
            a.free(*r);
        }
        a.check_invariants();
        for r in regions.iter().rev().skip(1).step_by(3) {
            a.free(*r);
        }
        for r in regions.iter().rev().skip(2).step_by(3) {
            a.free(*r);
        }
        a.check_invariants();
        assert_eq!(span(a.alloc(cap)), Some((base, cap)));
    }

    #[test]
    fn alignment_and_rounding() {
        let mut a = OffsetAllocator::new(100, 10_000);
        // [100, 10100) shrinks inward to [128, 10048).
        assert_eq!(a.capacity(), 10_048 - 128);
        assert_eq!(span(a.alloc(1)), Some((128, 64)));
        assert_eq!(span(a.alloc(0)), Some((192, 64)));
        assert_eq!(a.alloc(65).map(|r| r.len), Some(128));
        assert_eq!(a.alloc(4096 + 100).map(|r| r.len), Some(4224));
        for _ in 0..20 {
            if let Some(r) = a.alloc(300) {
                assert!(is_aligned(r.offset));
                assert_eq!(r.len, 320);
            }
        }
        assert_eq!(a.alloc(u64::MAX), None);
        assert_eq!(a.alloc(u64::MAX - 10), None);
        a.check_invariants();

        assert_eq!(OffsetAllocator::new(0, 63).capacity(), 0);
        assert_eq!(OffsetAllocator::new(1, 64).capacity(), 0);
        assert_eq!(OffsetAllocator::new(u64::MAX - 5, 100).capacity(), 0);
        let mut empty = OffsetAllocator::new(0, 0);
        assert_eq!(empty.alloc(1), None);
        assert_eq!(empty.largest_free(), 0);
        empty.check_invariants();
        let top = OffsetAllocator::new(u64::MAX - 1000, u64::MAX);
        assert_eq!(
            top.capacity(),
            (u64::MAX - 63) - (u64::MAX - 1000).next_multiple_of(ALIGN)
        );
        top.check_invariants();
    }

    #[test]
    fn huge_segment() {
        let mut a = OffsetAllocator::new(0, 4 * TIB);
        let regions: Vec<_> = (0..1000).map(|_| a.alloc(4 * MIB + 100).unwrap()).collect();
        assert_eq!(a.largest_free(), 4 * TIB - a.used());
        for r in &regions {
            a.free(*r);
        }
        assert_eq!(a.alloc(4 * TIB).map(|r| r.len), Some(4 * TIB));
        let whole = OffsetAllocator::new(0, u64::MAX);
        assert_eq!(whole.largest_free(), u64::MAX - 63);
        whole.check_invariants();
    }

    #[test]
    fn with_used_errors() {
        let cap = 64 * KIB;
        let overlap = OffsetAllocator::with_used(0, cap, [(4096, 4096), (0, 64), (8000 - 64, 200)]);
        assert_eq!(
            overlap.unwrap_err(),
            AllocError::Overlap {
                offset: 8000 - 64,
                len: 200
            }
        );
        // Rounding the length up is what makes these overlap.
        let rounded = OffsetAllocator::with_used(0, cap, [(128, 1), (64, 65)]);
        assert_eq!(
            rounded.unwrap_err(),
            AllocError::Overlap {
                offset: 128,
                len: 1
            }
        );
        let dup = OffsetAllocator::with_used(0, cap, [(64, 64), (64, 64)]);
        assert!(matches!(dup, Err(AllocError::Overlap { offset: 64, .. })));
        let past_end = OffsetAllocator::with_used(0, cap, [(cap - 64, 65)]);
        assert_eq!(
            past_end.unwrap_err(),
            AllocError::OutOfRange {
                offset: cap - 64,
                len: 65
            }
        );
        let below = OffsetAllocator::with_used(4096, cap, [(0, 64)]);
        assert_eq!(
            below.unwrap_err(),
            AllocError::OutOfRange { offset: 0, len: 64 }
        );
        let wraps = OffsetAllocator::with_used(0, cap, [(64, u64::MAX)]);
        assert!(matches!(wraps, Err(AllocError::OutOfRange { .. })));
        let misaligned = OffsetAllocator::with_used(0, cap, [(100, 64)]);
        assert_eq!(
            misaligned.unwrap_err(),
            AllocError::Misaligned { offset: 100 }
        );
        assert_eq!(
            AllocError::Misaligned { offset: 100 }.to_string(),
            "region offset 100 is not a multiple of 64"
        );
        let edges = OffsetAllocator::with_used(0, cap, [(0, 64), (cap - 64, 64)]).unwrap();
        edges.check_invariants();
        let full = OffsetAllocator::with_used(0, cap, [(0, cap)]).unwrap();
        assert_eq!(full.free_bytes(), 0);
        full.check_invariants();
        let none = OffsetAllocator::with_used(0, cap, []).unwrap();
        assert_eq!(none.largest_free(), cap);
    }

    #[test]
    fn with_used_regions_are_not_handed_out_until_freed() {
        let cap = 64 * KIB;
        let held = [(4096, 100), (0, 64), (60 * KIB, 4096), (128, 0)];
        let mut a = OffsetAllocator::with_used(0, cap, held).unwrap();
        a.check_invariants();
        assert_eq!(a.used(), 128 + 64 + 4096 + 64);
        assert_eq!(a.live_regions(), 4);
        let held_regions: Vec<Region> = held.iter().map(|&(o, _)| live_at(&a, o)).collect();
        assert_eq!(
            held_regions.iter().map(|r| r.len).collect::<Vec<_>>(),
            held.iter()
                .map(|&(_, l)| normalize_len(l).unwrap())
                .collect::<Vec<_>>()
        );
        let mut got = Vec::new();
        while let Some(r) = a.alloc(64) {
            got.push(r);
        }
        assert_eq!(a.free_bytes(), 0);
        let mut all = got.clone();
        all.extend(&held_regions);
        assert_disjoint(&all);

        // A recovered region can be freed with the length the store reported.
        a.free(Region {
            len: 100,
            ..held_regions[0]
        });
        assert_eq!(span(a.alloc(128)), Some((4096, 128)));
        for r in got {
            a.free(r);
        }
        for r in &held_regions[1..] {
            a.free(*r);
        }
        a.free(live_at(&a, 4096));
        a.check_invariants();
        assert_eq!(span(a.alloc(cap)), Some((0, cap)));
    }

    #[test]
    fn same_size_churn_reuses_holes() {
        let object = 4 * KIB + 100;
        let slot = normalize_len(object).unwrap();
        let n = 1000;
        for cap in [n * slot, 2 * n * slot + 12_345] {
            let mut a = OffsetAllocator::new(0, cap);
            let regions: Vec<_> = (0..n).map(|_| a.alloc(object).unwrap()).collect();
            let mut holes = std::collections::HashSet::new();
            for r in regions.iter().step_by(2) {
                a.free(*r);
                holes.insert(r.offset);
            }
            for _ in 0..n / 2 {
                let r = a.alloc(object).unwrap();
                // Same-size holes are preferred over splitting the remaining tail.
                assert!(holes.remove(&r.offset), "{r:?} is not a hole");
            }
            assert!(holes.is_empty());
            assert_eq!(a.used(), n * slot);
            assert_eq!(a.free_bytes(), a.capacity() - n * slot);
            a.check_invariants();
        }

        // Many rounds of churn on a full segment never lose capacity.
        let mut a = OffsetAllocator::new(0, n * slot);
        let mut live: Vec<_> = (0..n).map(|_| a.alloc(object).unwrap()).collect();
        for round in 0..20 {
            for i in (round % 3..live.len()).step_by(3) {
                a.free(live[i]);
                live[i] = Region {
                    offset: u64::MAX,
                    len: 0,
                    node: NONE,
                };
            }
            for r in live.iter_mut().filter(|r| r.offset == u64::MAX) {
                *r = a.alloc(object).unwrap();
            }
            assert_eq!(a.free_bytes(), 0);
        }
        a.check_invariants();
    }

    #[test]
    fn largest_free_is_an_upper_bound() {
        let mut a = OffsetAllocator::new(0, 32 * MIB);
        // Sizes 64..=70 units all share one bin, so the bin's edge overestimates.
        let regions: Vec<_> = (0..2000)
            .map(|i| a.alloc((64 + i % 7) * 64).unwrap())
            .collect();
        assert_eq!(a.largest_free(), a.exact_largest_free());
        for r in regions.iter().step_by(2) {
            a.free(*r);
        }
        // Drop the tail so the largest bin is the crowded one holding the holes.
        let tail = a.alloc(a.exact_largest_free()).unwrap();
        let estimate = a.largest_free();
        assert_eq!(a.exact_largest_free(), 70 * 64);
        assert_eq!(estimate, 71 * 64);
        a.free(tail);
        assert_eq!(a.largest_free(), a.exact_largest_free());
    }

    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "which is not live"))]
    fn free_of_unknown_region_is_ignored() {
        let mut a = OffsetAllocator::new(0, MIB);
        let r = a.alloc(4096).unwrap();
        a.free(Region {
            offset: r.offset + 64,
            len: 64,
            node: r.node,
        });
        a.check_invariants();
        assert_eq!(a.live_regions(), 1);
    }

    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "which is not live"))]
    fn free_with_wrong_len_is_ignored() {
        let mut a = OffsetAllocator::new(0, MIB);
        let r = a.alloc(4096).unwrap();
        a.free(Region { len: 64, ..r });
        a.check_invariants();
        assert_eq!(a.used(), 4096);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // Mostly sizes that fill the smaller capacities, so segments run full and
            // fragment; occasionally huge and degenerate requests.
            3 => prop_oneof![
                4 => 1..=512u64,
                4 => 1..=8 * KIB,
                2 => Just(4 * KIB + 100),
                1 => 1..=256 * KIB,
                1 => 1..=16 * TIB,
                1 => Just(0u64),
                1 => Just(u64::MAX),
            ]
            .prop_map(Op::Alloc),
            1 => any::<usize>().prop_map(Op::Free),
        ]
    }

    fn check_against_model(a: &OffsetAllocator, live: &[Region]) {
        let (base, end) = (a.base, a.base + a.capacity());
        for r in live {
            assert!(is_aligned(r.offset));
            assert!(r.len > 0 && is_aligned(r.len));
            assert!(r.offset >= base && r.offset + r.len <= end, "{r:?} outside");
        }
        assert_disjoint(live);
        assert_eq!(a.used() + a.free_bytes(), a.capacity());
        assert_eq!(a.used(), live.iter().map(|r| r.len).sum::<u64>());
        assert_eq!(a.live_regions(), live.len());
        let largest = a.largest_free();
        assert!(largest >= a.exact_largest_free() && largest <= a.free_bytes());
    }

    proptest! {
        #[test]
        fn random_alloc_free_sequences(
            base in prop_oneof![0..=4096u64, 0..=u64::MAX / 2],
            size in prop_oneof![3 => 0..=64 * KIB, 3 => 0..=MIB, 1 => 0..=8 * TIB],
            ops in prop::collection::vec(op(), 0..=200),
        ) {
            let mut a = OffsetAllocator::new(base, size);
            let mut live: Vec<Region> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(len) => match a.alloc(len) {
                        Some(r) => {
                            prop_assert!(len == 0 || r.len >= len);
                            live.push(r);
                        }
                        None => {
                            // Only a crowded own bin may hide a fitting block.
                            let want = normalize_len(len).unwrap_or(u64::MAX);
                            let crowded = want <= a.capacity()
                                && a.bin_len(bin_floor(want / ALIGN)) > FALLBACK_SCAN + 1;
                            prop_assert!(crowded || a.exact_largest_free() < want);
                        }
                    },
                    Op::Free(i) if !live.is_empty() => {
                        let r = live.swap_remove(i % live.len());
                        a.free(r);
                    }
                    Op::Free(_) => {}
                }
                check_against_model(&a, &live);
                a.check_invariants();
            }

            // Restart recovery: rebuilding from the live set (in another order) is equivalent.
            let reported = live.iter().rev().map(|r| (r.offset, r.len));
            let mut rebuilt = OffsetAllocator::with_used(base, size, reported).unwrap();
            rebuilt.check_invariants();
            check_against_model(&rebuilt, &live);
            prop_assert_eq!(rebuilt.free_bytes(), a.free_bytes());

            // The rebuilt allocator has blocks of its own, in offset order.
            let mut by_offset = live.clone();
            by_offset.sort_unstable_by_key(|r| r.offset);
            let rebuilt_live = rebuilt.live_list();
            prop_assert_eq!(
                rebuilt_live.iter().map(|r| (r.offset, r.len)).collect::<Vec<_>>(),
                by_offset.iter().map(|r| (r.offset, r.len)).collect::<Vec<_>>()
            );
            for r in &live {
                a.free(*r);
            }
            for r in rebuilt_live {
                rebuilt.free(r);
            }
            for alloc in [&mut a, &mut rebuilt] {
                alloc.check_invariants();
                prop_assert_eq!(alloc.used(), 0);
                prop_assert_eq!(alloc.largest_free(), alloc.capacity());
                let cap = alloc.capacity();
                if cap > 0 {
                    let whole = alloc.alloc(cap);
                    prop_assert_eq!(span(whole), Some((alloc.base, cap)));
                }
            }
        }

        #[test]
        fn any_block_in_ceil_bin_fits(units in 1..=(u64::MAX / ALIGN)) {
            let ceil = bin_ceil(units);
            prop_assert!(bin_lower(ceil) >= units);
            let floor = bin_floor(units);
            prop_assert!(bin_lower(floor) <= units && units < bin_lower(floor + 1));
        }
    }
}
