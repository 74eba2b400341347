//! The allocator's tests: unit cases, and property tests against a model of the free space.

use super::*;
use proptest::prelude::*;

/// Where a region lies, whatever block it has.
fn span(r: Option<Region>) -> Option<(u64, u64)> {
    r.map(|r| (r.offset, r.len))
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const TIB: u64 = 1024 * 1024 * MIB;

impl OffsetAllocator {
    /// Walks every structure and panics on the first inconsistency.
    fn check_invariants(&self) {
        // The free blocks, by offset: in range, apart, and merged with their neighbours.
        let mut free = 0u64;
        let mut last_end = None;
        for (&offset, &idx) in &self.by_offset {
            let n = self.nodes[idx as usize];
            assert_eq!(n.offset, offset);
            assert!(n.size > 0 && is_aligned(n.size) && is_aligned(offset));
            assert!(offset >= self.base && offset + n.size <= self.base + self.size);
            if let Some(end) = last_end {
                assert!(end < offset, "free blocks apart and coalesced");
            }
            last_end = Some(offset + n.size);
            free += n.size;
        }
        assert_eq!(free, self.free_bytes());
        assert!(self.used_bytes <= self.size);
        if self.live == 0 {
            assert_eq!(self.used_bytes, 0);
        }

        let mut binned = 0;
        for bin in 0..NUM_BINS {
            let (top, leaf) = (bin / LEAF_BINS, bin % LEAF_BINS);
            let head = self.bin_heads[bin];
            assert_eq!(self.leaf_bitmaps[top] & (1 << leaf) != 0, head != NONE);
            let (mut idx, mut prev) = (head, NONE);
            while idx != NONE {
                let n = self.nodes[idx as usize];
                assert_eq!(self.by_offset.get(&n.offset), Some(&idx));
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
        assert_eq!(binned, self.by_offset.len());

        let mut vacant = 0;
        let mut idx = self.vacant_head;
        while idx != NONE {
            assert_eq!(self.nodes[idx as usize].size, 0);
            vacant += 1;
            idx = self.nodes[idx as usize].bin_next;
        }
        assert_eq!(vacant + self.by_offset.len(), self.nodes.len());
    }

    fn exact_largest_free(&self) -> u64 {
        self.nodes.iter().map(|n| n.size).max().unwrap_or(0)
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
    assert_eq!(std::mem::size_of::<Node>(), 24);
}

/// A segment full of live regions keeps no bookkeeping for them.
#[test]
fn live_regions_cost_nothing() {
    let mut a = OffsetAllocator::new(0, 64 * KIB);
    let regions: Vec<Region> = (0..1024).map(|_| a.alloc(64).unwrap()).collect();
    assert_eq!((a.live_regions(), a.by_offset.len()), (1024, 0));
    for r in regions.iter().step_by(2) {
        a.free(*r);
    }
    // Each freed region is a hole between two live ones.
    assert_eq!(a.by_offset.len(), 512);
    for r in regions.iter().skip(1).step_by(2) {
        a.free(*r);
    }
    assert_eq!(a.by_offset.len(), 1);
    a.check_invariants();
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
    let (even, odd): (Vec<_>, Vec<_>) = regions.iter().enumerate().partition(|(i, _)| i % 2 == 0);
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

/// Many more free blocks than one slab chunk holds: nodes across chunk
/// boundaries stay linked and merge again.
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
    // One region is at most `MAX_REGION` long, however large the segment.
    assert_eq!(a.alloc(MAX_REGION + 1), None);
    assert_eq!(a.alloc(MAX_REGION).map(|r| r.len), Some(MAX_REGION));
    let too_long = OffsetAllocator::with_used(0, 4 * TIB, [(0, MAX_REGION + 1)]);
    assert!(matches!(too_long, Err(AllocError::OutOfRange { .. })));
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
    let held_regions: Vec<Region> = held
        .iter()
        .map(|&(offset, l)| Region {
            offset,
            len: normalize_len(l).unwrap(),
        })
        .collect();
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
    a.free(Region {
        offset: 4096,
        len: 128,
    });
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
fn a_double_free_is_ignored() {
    let mut a = OffsetAllocator::new(0, MIB);
    let r = a.alloc(4096).unwrap();
    let _kept = a.alloc(4096).unwrap();
    a.free(r);
    a.free(r);
    a.check_invariants();
    assert_eq!((a.live_regions(), a.used()), (1, 4096));
}

#[test]
#[cfg_attr(debug_assertions, should_panic(expected = "which is not live"))]
fn free_reaching_into_free_space_is_ignored() {
    let mut a = OffsetAllocator::new(0, MIB);
    let r = a.alloc(4096).unwrap();
    a.free(Region { len: 8192, ..r });
    a.check_invariants();
    assert_eq!(a.used(), 4096);
}

#[test]
#[cfg_attr(debug_assertions, should_panic(expected = "which is not live"))]
fn free_outside_the_segment_is_ignored() {
    let mut a = OffsetAllocator::new(4096, MIB);
    let _r = a.alloc(4096).unwrap();
    a.free(Region { offset: 0, len: 64 });
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
                        prop_assert!(crowded || a.exact_largest_free() < want || want > MAX_REGION);
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

        // Both free the same regions back to one whole segment.
        for r in &live {
            a.free(*r);
            rebuilt.free(*r);
        }
        for alloc in [&mut a, &mut rebuilt] {
            alloc.check_invariants();
            prop_assert_eq!(alloc.used(), 0);
            prop_assert_eq!(alloc.largest_free(), alloc.capacity());
            let cap = alloc.capacity();
            if cap > 0 && cap <= MAX_REGION {
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
