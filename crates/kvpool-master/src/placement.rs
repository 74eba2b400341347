//! Replica placement, as a pure function: which segments to try, in order,
//! for an object's replicas.
//!
//! Preferred segments come first. The others are drawn at random, weighted
//! by free space, so emptier segments fill faster and the pool evens out;
//! but no segment's weight exceeds [`MAX_SHARE_OVER_EVEN`] times an even
//! share. Without that cap (and before it, when the emptiest segment always
//! came first) a store joining a nearly full pool took every put until it
//! was as full as the others: all new objects, and all the reads of the
//! hottest data, on one node, and all of it lost if that one node failed.
//! The randomness comes in as an argument, so the function stays pure and
//! its callers decide how reproducible it is.

use kvpool_proto::msg::SegmentId;

/// The most a segment's chance to be drawn first may exceed an even share
/// (one over the number of candidates): an empty segment among full ones
/// takes at most 1.5x its share of new objects, not all of them.
pub const MAX_SHARE_OVER_EVEN: f64 = 1.5;

/// What placement needs to know about a mounted segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentView<'a> {
    /// The segment.
    pub id: SegmentId,
    /// Its name, matched against `preferred_segments`.
    pub name: &'a str,
    /// Free bytes.
    pub free: u64,
}

/// Segments to try for an object needing `region_len` bytes per replica:
/// preferred segments first, in the caller's order, then the others in a
/// random order drawn from `seed`, weighted by [`weights`]. Segments
/// without room are left out. The caller allocates on them in order until
/// it has its replicas (distinct segments by construction). The order is
/// drawn as it is read: a caller that stops at its replicas pays one pass
/// over the segments a replica, not one a segment (a pool of 64 stores
/// drew all 64 for every object's one replica).
pub fn order(segments: &[SegmentView], region_len: u64, preferred: &[String], seed: u64) -> Order {
    let mut first: Vec<SegmentId> = Vec::new();
    for name in preferred {
        for s in segments {
            if s.name == name && s.free >= region_len && !first.contains(&s.id) {
                first.push(s.id);
            }
        }
    }
    let mut rest: Vec<&SegmentView> = segments
        .iter()
        .filter(|s| s.free >= region_len && !first.contains(&s.id))
        .collect();
    // The draw must not depend on the order segments were listed in.
    rest.sort_by_key(|s| s.id);
    // A lone candidate needs no weights.
    let rest = match rest.len() {
        0 | 1 => rest.iter().map(|s| (s.id, 1.0)).collect(),
        _ => {
            let free: Vec<u64> = rest.iter().map(|s| s.free).collect();
            rest.iter().map(|s| s.id).zip(weights(&free)).collect()
        }
    };
    Order {
        first: first.into_iter(),
        rest,
        rng: SplitMix(seed),
    }
}

/// The segments [`order`] names, drawn one at a time.
pub struct Order {
    first: std::vec::IntoIter<SegmentId>,
    /// Segments not drawn yet, by id, with their weights.
    rest: Vec<(SegmentId, f64)>,
    rng: SplitMix,
}

impl Iterator for Order {
    type Item = SegmentId;

    fn next(&mut self) -> Option<SegmentId> {
        if let Some(id) = self.first.next() {
            return Some(id);
        }
        if self.rest.len() <= 1 {
            return self.rest.pop().map(|(id, _)| id);
        }
        // Weighted sampling without replacement.
        let total: f64 = self.rest.iter().map(|r| r.1).sum();
        let mut x = self.rng.unit() * total;
        let mut pick = self.rest.len() - 1;
        for (j, r) in self.rest.iter().enumerate() {
            if x < r.1 {
                pick = j;
                break;
            }
            x -= r.1;
        }
        Some(self.rest.remove(pick).0)
    }
}

/// Each segment's chance to be drawn first: proportional to its free
/// bytes, but at most [`MAX_SHARE_OVER_EVEN`] over an even share, the
/// excess spread over the others in proportion to theirs. Sums to 1.
pub fn weights(free: &[u64]) -> Vec<f64> {
    let n = free.len();
    if n == 0 {
        return Vec::new();
    }
    let cap = MAX_SHARE_OVER_EVEN / n as f64;
    let mut capped = vec![false; n];
    let mut w = vec![0.0; n];
    // Water-filling: cap the largest, share out what is left, repeat until
    // no share exceeds the cap (at most n rounds).
    loop {
        let fixed = capped.iter().filter(|c| **c).count();
        let mass = 1.0 - cap * fixed as f64;
        let total: u64 = (0..n).filter(|&i| !capped[i]).map(|i| free[i]).sum();
        let open = n - fixed;
        let mut changed = false;
        for i in 0..n {
            if capped[i] {
                w[i] = cap;
                continue;
            }
            w[i] = if total == 0 {
                mass / open as f64
            } else {
                mass * free[i] as f64 / total as f64
            };
            if w[i] > cap * (1.0 + 1e-9) {
                capped[i] = true;
                changed = true;
            }
        }
        if !changed {
            return w;
        }
    }
}

/// SplitMix64, to draw from a seed without a generator crate.
struct SplitMix(u64);

impl SplitMix {
    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(id: u128, name: &str, free: u64) -> SegmentView<'_> {
        SegmentView {
            id: SegmentId(id),
            name,
            free,
        }
    }

    fn ids(o: Order) -> Vec<u128> {
        o.map(|s| s.0).collect()
    }

    /// How often each segment is drawn first over `n` seeds.
    fn first_counts(segs: &[SegmentView], n: u64) -> Vec<u64> {
        let mut counts = vec![0u64; segs.len()];
        for seed in 0..n {
            let first = order(segs, 1, &[], seed).next().unwrap();
            counts[segs.iter().position(|s| s.id == first).unwrap()] += 1;
        }
        counts
    }

    #[test]
    fn preferred_first_then_every_segment_with_room_once() {
        let segs = [
            seg(1, "a", 100),
            seg(2, "b", 500),
            seg(3, "c", 300),
            seg(4, "d", 10),
        ];
        for seed in 0..50 {
            let mut all = ids(order(&segs, 50, &[], seed));
            all.sort_unstable();
            assert_eq!(all, vec![1, 2, 3], "d has no room");
            assert_eq!(ids(order(&segs, 50, &["a".into()], seed))[0], 1);
            let pref = ids(order(
                &segs,
                50,
                &["c".into(), "a".into(), "c".into()],
                seed,
            ));
            assert_eq!(&pref[..2], &[3, 1]);
            assert_eq!(pref.len(), 3);
            // Preferred but full: skipped.
            assert_eq!(order(&segs, 50, &["d".into()], seed).count(), 3);
            assert_eq!(ids(order(&segs, 400, &[], seed)), vec![2]);
            assert_eq!(order(&segs, 1000, &[], seed).next(), None);
        }
    }

    #[test]
    fn the_draw_is_a_function_of_the_seed_not_of_the_listing_order() {
        let a = [seg(1, "a", 100), seg(2, "b", 100), seg(3, "c", 100)];
        let b = [seg(3, "c", 100), seg(1, "a", 100), seg(2, "b", 100)];
        for seed in 0..20 {
            assert_eq!(ids(order(&a, 1, &[], seed)), ids(order(&b, 1, &[], seed)));
        }
        let orders: std::collections::HashSet<Vec<u128>> =
            (0..50).map(|s| ids(order(&a, 1, &[], s))).collect();
        assert_eq!(orders.len(), 6, "every permutation of equals comes up");
    }

    #[test]
    fn equal_segments_share_evenly_and_emptier_ones_get_more() {
        let even = first_counts(
            &[seg(1, "a", 100), seg(2, "b", 100), seg(3, "c", 100)],
            30_000,
        );
        for c in even {
            assert!((9_000..11_000).contains(&c), "{c} of 30000");
        }
        // 1:2 free space: about 1:2 of the first replicas (under the cap).
        let skew = first_counts(
            &[seg(1, "a", 100), seg(2, "b", 200), seg(3, "c", 300)],
            60_000,
        );
        assert!((8_500..11_500).contains(&skew[0]), "{skew:?}");
        assert!((28_000..32_000).contains(&skew[2]), "{skew:?}");
    }

    #[test]
    fn an_empty_segment_joining_a_nearly_full_pool_takes_at_most_its_capped_share() {
        // Four segments 95% full and one new, empty one.
        let segs = [
            seg(1, "a", 5),
            seg(2, "b", 5),
            seg(3, "c", 5),
            seg(4, "d", 5),
            seg(5, "new", 100),
        ];
        let w = weights(&segs.iter().map(|s| s.free).collect::<Vec<_>>());
        assert!((w[4] - 0.3).abs() < 1e-9, "{w:?}");
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        let counts = first_counts(&segs, 50_000);
        let share = counts[4] as f64 / 50_000.0;
        // Fair share is 20%; the cap allows 30%, well inside 2x.
        assert!((0.28..0.32).contains(&share), "{share}");
    }

    #[test]
    fn weights_are_capped_shares_that_sum_to_one() {
        for free in [
            vec![],
            vec![7],
            vec![0, 0, 0],
            vec![1, 1_000_000],
            vec![1, 2, 3, 4, 5, 6, 1 << 40],
            vec![10, 10, 10, 10],
        ] {
            let w = weights(&free);
            assert_eq!(w.len(), free.len());
            if free.is_empty() {
                continue;
            }
            let cap = MAX_SHARE_OVER_EVEN / free.len() as f64;
            assert!(
                (w.iter().sum::<f64>() - 1.0).abs() < 1e-9,
                "{free:?}: {w:?}"
            );
            assert!(
                w.iter().all(|x| *x <= cap + 1e-9 && *x >= 0.0),
                "{free:?}: {w:?}"
            );
        }
        // Two segments: the cap (75%) binds the bigger one.
        assert_eq!(weights(&[1, 1_000_000]), vec![0.25, 0.75]);
    }
}
