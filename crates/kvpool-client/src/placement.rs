//! Read placement: which replica of an object a read tries.
//!
//! The master lists an object's replicas best first (live stores before
//! suspect ones), so reads go in rounds: round `r` reads replica `r` of
//! every object whose earlier replicas failed. The choice is a pure
//! function of its inputs, so it is table-tested here; which transport
//! reaches a replica is [`crate::transport::route`].

/// Read rounds needed: the most replicas any object has.
pub(crate) fn rounds(replicas: &[usize]) -> usize {
    replicas.iter().copied().max().unwrap_or(0)
}

/// Items read in round `round` (ascending): those still `pending` (not yet
/// read successfully) that have a replica number `round`.
pub(crate) fn due(pending: &[bool], replicas: &[usize], round: usize) -> Vec<usize> {
    (0..pending.len())
        .filter(|&i| pending[i] && round < replicas[i])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_are_tried_in_the_masters_order() {
        // Item 0 has 3 replicas, item 1 has 1, item 2 failed to locate (0).
        let replicas = [3, 1, 0];
        assert_eq!(rounds(&replicas), 3);
        assert_eq!(due(&[true, true, true], &replicas, 0), [0, 1]);
        // Round 0 read item 1; item 0 failed and goes to its replica 1.
        assert_eq!(due(&[true, false, true], &replicas, 1), [0]);
        assert_eq!(due(&[true, false, true], &replicas, 2), [0]);
        assert!(due(&[true, false, true], &replicas, 3).is_empty());
        assert!(due(&[false, false, true], &replicas, 1).is_empty());
    }

    #[test]
    fn nothing_to_read_takes_no_rounds() {
        assert_eq!(rounds(&[]), 0);
        assert_eq!(rounds(&[0, 0]), 0);
    }
}
