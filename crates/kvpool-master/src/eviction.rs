//! Eviction choice, as a pure function: given the evictable objects and how
//! many bytes to free, which ones go. Least recently read first; soft-pinned
//! objects only after every unpinned one. Leased and hard-pinned objects are
//! never candidates (the caller filters them, since only it knows the time).

use std::time::Duration;

/// An object that may be evicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The key.
    pub key: String,
    /// Generation, so the caller can tell the object was not replaced meanwhile.
    pub generation: u64,
    /// Bytes freed by evicting it (all replicas).
    pub bytes: u64,
    /// Soft-pinned objects go last.
    pub soft_pinned: bool,
    /// Time since the object was written or last read; larger goes first.
    pub idle: Duration,
}

/// Picks victims until at least `target_bytes` are freed (or candidates run out).
pub fn choose(mut candidates: Vec<Candidate>, target_bytes: u64) -> Vec<Candidate> {
    candidates.sort_unstable_by(|a, b| {
        a.soft_pinned
            .cmp(&b.soft_pinned)
            .then(b.idle.cmp(&a.idle))
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

    fn c(key: &str, idle_s: u64, soft: bool) -> Candidate {
        Candidate {
            key: key.into(),
            generation: 1,
            bytes: 100,
            soft_pinned: soft,
            idle: Duration::from_secs(idle_s),
        }
    }

    #[test]
    fn order_is_lru_with_soft_pins_last() {
        let table: &[(&[Candidate], u64, &[&str])] = &[
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
        ];
        for (cands, target, want) in table {
            let got: Vec<String> = choose(cands.to_vec(), *target)
                .into_iter()
                .map(|c| c.key)
                .collect();
            assert_eq!(got, *want, "target {target}");
        }
    }
}
