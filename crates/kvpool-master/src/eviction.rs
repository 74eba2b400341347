//! Eviction choice, as pure functions: given the evictable objects and how
//! many bytes to free, which ones go. Least recently read first;
//! soft-pinned objects only after every unpinned one. Leased and
//! hard-pinned objects are never candidates (the caller filters them,
//! since only it knows the time).
//!
//! A pass over tens of millions of objects can neither copy nor sort them
//! all. So the caller scans twice: the first scan adds each candidate's
//! bytes to a [`Histogram`] by its [`rank`] (its place in eviction order,
//! to within 1/8 of its idle time), which gives the boundary rank: every
//! object ranked before it goes, and the second scan collects only the
//! objects at it, which [`choose`] sorts exactly.

/// Idle-time steps per power of two (3 bits: 1/8 resolution).
const STEPS_BITS: u32 = 3;
/// Idle-time classes: one per step of each power of two of a `u64`.
const IDLE_CLASSES: usize = 64 << STEPS_BITS;
/// Ranks: unpinned, then soft-pinned, each by idle class.
pub const RANKS: usize = 2 * IDLE_CLASSES;

/// An object's place in eviction order: lower goes first.
pub fn rank(soft_pinned: bool, idle_ns: u64) -> usize {
    usize::from(soft_pinned) * IDLE_CLASSES + (IDLE_CLASSES - 1 - idle_class(idle_ns))
}

/// `v` on a log scale with 8 linear steps per power of two; monotone.
fn idle_class(v: u64) -> usize {
    let steps = 1u64 << STEPS_BITS;
    if v < steps {
        return v as usize;
    }
    let shift = 63 - v.leading_zeros() - STEPS_BITS;
    (((u64::from(shift) + 1) << STEPS_BITS) | ((v >> shift) & (steps - 1))) as usize
}

/// Bytes and objects of a pass's candidates per [`rank`].
pub struct Histogram {
    bytes: Vec<u64>,
    objects: Vec<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            bytes: vec![0; RANKS],
            objects: vec![0; RANKS],
        }
    }
}

/// Where a pass stops: everything ranked before `rank` goes, and of the
/// objects at `rank`, enough to free `need` more bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Boundary {
    /// The rank chosen among ([`RANKS`] when every candidate goes).
    pub rank: usize,
    /// Bytes still to free among the objects at `rank`.
    pub need: u64,
    /// Objects at `rank`.
    pub objects: u64,
}

impl Histogram {
    /// Counts a candidate.
    pub fn add(&mut self, rank: usize, bytes: u64) {
        self.bytes[rank] = self.bytes[rank].saturating_add(bytes);
        self.objects[rank] += 1;
    }

    /// Where a pass that must free `target` bytes stops; `None` when
    /// nothing needs to go.
    pub fn boundary(&self, target: u64) -> Option<Boundary> {
        if target == 0 {
            return None;
        }
        let mut freed = 0u64;
        for rank in 0..RANKS {
            if freed.saturating_add(self.bytes[rank]) >= target {
                return Some(Boundary {
                    rank,
                    need: target - freed,
                    objects: self.objects[rank],
                });
            }
            freed += self.bytes[rank];
        }
        Some(Boundary {
            rank: RANKS,
            need: 0,
            objects: 0,
        })
    }
}

/// An object that may be evicted, named by the caller's `K`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<K> {
    /// How the caller finds it again.
    pub key: K,
    /// Generation, so the caller can tell the object was not replaced meanwhile.
    pub generation: u64,
    /// Bytes freed by evicting it (all replicas).
    pub bytes: u64,
    /// Soft-pinned objects go last.
    pub soft_pinned: bool,
    /// Nanoseconds since the object was written or last read; larger goes first.
    pub idle_ns: u64,
}

/// Picks victims in exact order until at least `target_bytes` are freed
/// (or candidates run out).
pub fn choose<K: Ord>(mut candidates: Vec<Candidate<K>>, target_bytes: u64) -> Vec<Candidate<K>> {
    candidates.sort_unstable_by(|a, b| {
        a.soft_pinned
            .cmp(&b.soft_pinned)
            .then(b.idle_ns.cmp(&a.idle_ns))
            .then_with(|| a.key.cmp(&b.key))
    });
    let mut freed = 0u64;
    let n = candidates
        .iter()
        .take_while(|c| {
            let take = freed < target_bytes;
            freed = freed.saturating_add(c.bytes);
            take
        })
        .count();
    candidates.truncate(n);
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(key: &'static str, idle_s: u64, soft: bool) -> Candidate<&'static str> {
        Candidate {
            key,
            generation: 1,
            bytes: 100,
            soft_pinned: soft,
            idle_ns: idle_s * 1_000_000_000,
        }
    }

    /// The two scans a pass makes, over a list.
    fn two_scans(cands: &[Candidate<&'static str>], target: u64) -> Vec<&'static str> {
        let mut h = Histogram::default();
        for c in cands {
            h.add(rank(c.soft_pinned, c.idle_ns), c.bytes);
        }
        let Some(b) = h.boundary(target) else {
            return Vec::new();
        };
        let rank_of = |c: &Candidate<_>| rank(c.soft_pinned, c.idle_ns);
        let mut out: Vec<Candidate<_>> = cands
            .iter()
            .filter(|c| rank_of(c) < b.rank)
            .cloned()
            .collect();
        let at: Vec<_> = cands
            .iter()
            .filter(|c| rank_of(c) == b.rank)
            .cloned()
            .collect();
        out.extend(choose(at, b.need));
        // In eviction order, to compare with `choose` over everything.
        choose(out, u64::MAX).into_iter().map(|c| c.key).collect()
    }

    #[test]
    fn order_is_lru_with_soft_pins_last() {
        type Case<'a> = (&'a [Candidate<&'static str>], u64, &'a [&'static str]);
        let table: &[Case] = &[
            // oldest first
            (
                &[c("a", 1, false), c("b", 5, false), c("c", 3, false)],
                150,
                &["b", "c"],
            ),
            // exactly enough stops early
            (&[c("a", 1, false), c("b", 5, false)], 100, &["b"]),
            // soft-pinned last even when older
            (
                &[c("old-pinned", 99, true), c("new", 1, false)],
                150,
                &["new", "old-pinned"],
            ),
            (
                &[c("old-pinned", 99, true), c("new", 1, false)],
                50,
                &["new"],
            ),
            // nothing to free
            (&[c("a", 1, false)], 0, &[]),
            // not enough candidates: take all
            (&[c("a", 1, false), c("b", 2, true)], 10_000, &["a", "b"]),
            // idle times within one rank are still told apart
            (
                &[c("a", 100, false), c("b", 101, false), c("c", 102, false)],
                150,
                &["c", "b"],
            ),
        ];
        for (cands, target, want) in table {
            let all: Vec<&str> = choose(cands.to_vec(), *target)
                .into_iter()
                .map(|c| c.key)
                .collect();
            assert_eq!(all, *want, "choose, target {target}");
            assert_eq!(
                two_scans(cands, *target),
                *want,
                "two scans, target {target}"
            );
        }
    }

    #[test]
    fn rank_follows_eviction_order() {
        let mut last = usize::MAX;
        for idle in (0..64).map(|s| 1u64 << s).chain([u64::MAX]) {
            let r = rank(false, idle);
            assert!(r <= last, "idle {idle}");
            last = r;
        }
        assert!(rank(true, u64::MAX) > rank(false, 0));
        assert!(rank(true, 0) < RANKS);
    }
}
