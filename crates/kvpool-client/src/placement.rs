//! Read placement: which replica of an object a read tries, and which
//! transport reaches a segment.
//!
//! The master lists an object's replicas best first (live stores before
//! suspect ones), so reads go in rounds: round `r` reads replica `r` of
//! every object whose earlier replicas failed. A segment is reached by
//! shared memory when it is mapped here, by TCP otherwise, unless the
//! protocol insists on shared memory. Both choices are pure functions of
//! their inputs, so they are table-tested here.

use crate::Protocol;

/// The transport chosen for one segment; `M` is the mapping (generic so
/// the choice is testable without mapping a file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route<M> {
    /// Copy through this process's mapping of the segment file.
    Shm(M),
    /// Over the store's TCP data plane.
    Tcp,
    /// `protocol = shm` and the segment is not mapped here: an error.
    Unmappable,
}

/// The route to a segment with `mapped` (its mapping here, if any) under
/// `protocol`.
pub(crate) fn route<M: Clone>(mapped: Option<&M>, protocol: Protocol) -> Route<M> {
    match (mapped, protocol) {
        // A tcp client never maps, but be explicit: tcp means tcp.
        (_, Protocol::Tcp) => Route::Tcp,
        (Some(m), _) => Route::Shm(m.clone()),
        (None, Protocol::Shm) => Route::Unmappable,
        (None, Protocol::Auto) => Route::Tcp,
    }
}

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
    fn transport_choice() {
        let m = 7u32;
        assert_eq!(route(Some(&m), Protocol::Auto), Route::Shm(7));
        assert_eq!(route(None::<&u32>, Protocol::Auto), Route::Tcp);
        assert_eq!(route(Some(&m), Protocol::Shm), Route::Shm(7));
        assert_eq!(route(None::<&u32>, Protocol::Shm), Route::Unmappable);
        assert_eq!(route(Some(&m), Protocol::Tcp), Route::Tcp);
        assert_eq!(route(None::<&u32>, Protocol::Tcp), Route::Tcp);
    }

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
