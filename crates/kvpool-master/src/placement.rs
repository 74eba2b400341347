//! Replica placement, as a pure function: which segments to try, in order,
//! for an object's replicas.

use kvpool_proto::msg::SegmentId;

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
/// preferred segments first, in the caller's order, then the others with the
/// most free space first. Segments without room are left out. The caller
/// allocates on them in order until it has its replicas (distinct segments
/// by construction).
pub fn order(segments: &[SegmentView], region_len: u64, preferred: &[String]) -> Vec<SegmentId> {
    let mut out: Vec<SegmentId> = Vec::with_capacity(segments.len());
    for name in preferred {
        for s in segments {
            if s.name == name && s.free >= region_len && !out.contains(&s.id) {
                out.push(s.id);
            }
        }
    }
    let mut rest: Vec<&SegmentView<'_>> = segments
        .iter()
        .filter(|s| s.free >= region_len && !out.contains(&s.id))
        .collect();
    rest.sort_by(|a, b| b.free.cmp(&a.free).then(a.id.cmp(&b.id)));
    out.extend(rest.into_iter().map(|s| s.id));
    out
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

    #[test]
    fn preferred_then_most_free() {
        let segs = [
            seg(1, "a", 100),
            seg(2, "b", 500),
            seg(3, "c", 300),
            seg(4, "d", 10),
        ];
        let ids = |v: Vec<SegmentId>| v.into_iter().map(|s| s.0).collect::<Vec<_>>();
        assert_eq!(ids(order(&segs, 50, &[])), vec![2, 3, 1]);
        assert_eq!(ids(order(&segs, 50, &["a".into()])), vec![1, 2, 3]);
        assert_eq!(
            ids(order(&segs, 50, &["c".into(), "a".into(), "c".into()])),
            vec![3, 1, 2]
        );
        // preferred but full: skipped
        assert_eq!(ids(order(&segs, 50, &["d".into()])), vec![2, 3, 1]);
        assert_eq!(ids(order(&segs, 400, &[])), vec![2]);
        assert!(order(&segs, 1000, &[]).is_empty());
    }
}
