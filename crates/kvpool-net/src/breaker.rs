//! A circuit breaker for one peer: after a connect fails, callers fail at
//! once instead of each waiting for its own refused or timed-out connect,
//! and one probe goes through per interval (every 100 ms for the first
//! half second, then doubling while the peer stays away) until a connect
//! succeeds. The pool runs the probe in the background, so no caller waits
//! on a peer that may still be gone.
//!
//! A dead store would otherwise cost every reader a connect per attempt and
//! keep its batch waiting; with the breaker it costs one failed connect per
//! interval for the whole process. Pure apart from the instants passed in,
//! so the state machine is unit-tested.

use std::time::Duration;

use tokio::time::Instant;

/// How long the breaker stays open after the first failed connect, and
/// after each of the first [`QUICK_PROBES`].
pub const FIRST_OPEN: Duration = Duration::from_millis(100);
/// Failed connects probed again after [`FIRST_OPEN`] before the interval
/// starts doubling: a store restarted in place is away about half a second,
/// and is used again within 100 ms of its return.
pub const QUICK_PROBES: u32 = 5;
/// Longest it stays open between probes: a store back from a restart (an
/// in-place upgrade takes about a second) is used again within this, and a
/// dead one costs a process one connect per interval.
pub const MAX_OPEN: Duration = Duration::from_millis(400);

/// What [`Breaker::admit`] lets a caller do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Connect: the peer is believed reachable.
    Connect,
    /// Probe whether the peer is back: the breaker was open and its
    /// interval has passed.
    Probe,
}

/// Connect health of one peer.
#[derive(Debug, Default)]
pub struct Breaker {
    /// Failed connects since the last one that worked.
    failures: u32,
    /// While set and in the future, connects are refused without trying.
    retry_at: Option<Instant>,
}

impl Breaker {
    /// Whether a connect may be tried at `now`. Once the open interval has
    /// passed, the caller admitted is the probe: the breaker stays shut to
    /// the others for another interval, so a probe that never reports back
    /// (its caller gave up) does not wedge it. `Err` holds how long until
    /// the next probe.
    pub fn admit(&mut self, now: Instant) -> Result<Admit, Duration> {
        match self.retry_at {
            Some(t) if now < t => Err(t - now),
            Some(_) => {
                self.retry_at = Some(now + self.interval());
                Ok(Admit::Probe)
            }
            None => Ok(Admit::Connect),
        }
    }

    /// A connect failed at `now`: open for the next interval.
    pub fn failed(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(now + self.interval());
    }

    /// A connect worked: closed.
    pub fn succeeded(&mut self) {
        *self = Breaker::default();
    }

    /// Whether connects are being refused at `now`.
    pub fn is_open(&self, now: Instant) -> bool {
        self.retry_at.is_some_and(|t| now < t)
    }

    /// The open interval after the failures so far.
    fn interval(&self) -> Duration {
        let doublings = self.failures.saturating_sub(QUICK_PROBES).min(16);
        (FIRST_OPEN * (1 << doublings)).min(MAX_OPEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_connect_opens_it_and_one_probe_goes_per_interval() {
        let t0 = Instant::now();
        let mut b = Breaker::default();
        assert_eq!(b.admit(t0), Ok(Admit::Connect));
        assert!(!b.is_open(t0));
        b.failed(t0);
        assert!(b.is_open(t0));
        assert_eq!(
            b.admit(t0 + Duration::from_millis(40)),
            Err(FIRST_OPEN - Duration::from_millis(40))
        );
        // Half open: one probe, the others still refused.
        let t1 = t0 + FIRST_OPEN;
        assert_eq!(b.admit(t1), Ok(Admit::Probe));
        assert!(b.admit(t1).is_err(), "a second caller waits for the probe");
        for _ in 1..QUICK_PROBES {
            b.failed(t1);
            assert_eq!(b.admit(t1), Err(FIRST_OPEN), "probed quickly at first");
        }
        b.failed(t1);
        assert_eq!(
            b.admit(t1),
            Err(2 * FIRST_OPEN),
            "then the interval doubles"
        );
        b.succeeded();
        assert!(!b.is_open(t1));
        assert_eq!(b.admit(t1), Ok(Admit::Connect));
    }

    #[test]
    fn the_interval_stops_doubling_at_its_cap() {
        let t0 = Instant::now();
        let mut b = Breaker::default();
        for _ in 0..100 {
            b.failed(t0);
        }
        assert_eq!(b.admit(t0), Err(MAX_OPEN));
    }

    #[test]
    fn a_probe_that_never_reports_back_does_not_wedge_it() {
        let t0 = Instant::now();
        let mut b = Breaker::default();
        b.failed(t0);
        assert_eq!(b.admit(t0 + FIRST_OPEN), Ok(Admit::Probe));
        // Its caller was cancelled: the next probe goes an interval later.
        assert_eq!(b.admit(t0 + 2 * FIRST_OPEN), Ok(Admit::Probe));
    }
}
