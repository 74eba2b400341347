//! Hedged reads (`ClientConfig::hedge_reads`, off by default for their cost
//! in throughput): when a read of a replicated object has not answered by the
//! time most reads have (the 95th percentile of this process's recent read
//! rounds), the next replica is asked too and the first verified answer
//! wins. A store that stalls (paused, swapping, cut off but not yet known to
//! be) then costs its readers that delay, not a timeout, for every object it
//! shares with a live store; the others still wait for it.
//!
//! [`HedgeDelay`] keeps the recent samples and the delay; the race itself
//! is in [`crate::read`].

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;

/// Read rounds remembered for the percentile.
const SAMPLES: usize = 256;
/// The delay is worked out again after this many new samples.
const EVERY: u32 = 32;
/// Never hedge sooner: below this the second read would mostly race a
/// first one that is merely queued behind the scheduler (on a busy 2-core
/// box a 2 ms floor hedged often enough to cost 10-30% of batch-get
/// throughput; dropping a hedged store's reads also drops its connection).
pub(crate) const MIN_DELAY: Duration = Duration::from_millis(10);
/// Never wait longer before hedging, whatever the percentile says.
pub(crate) const MAX_DELAY: Duration = Duration::from_millis(200);

/// When to hedge: the 95th percentile of recent read rounds, within
/// [`MIN_DELAY`]..=[`MAX_DELAY`].
pub(crate) struct HedgeDelay {
    state: Mutex<State>,
}

struct State {
    samples: VecDeque<Duration>,
    since: u32,
    delay: Duration,
}

impl Default for HedgeDelay {
    fn default() -> Self {
        HedgeDelay {
            state: Mutex::new(State {
                samples: VecDeque::with_capacity(SAMPLES),
                since: 0,
                // Until there are samples: soon, for a store already stalled
                // at the first read.
                delay: MIN_DELAY * 2,
            }),
        }
    }
}

impl HedgeDelay {
    /// How long a read may take before its object's next replica is asked.
    pub(crate) fn delay(&self) -> Duration {
        self.state.lock().delay
    }

    /// Records how long a read round took.
    pub(crate) fn record(&self, took: Duration) {
        let mut s = self.state.lock();
        if s.samples.len() == SAMPLES {
            s.samples.pop_front();
        }
        s.samples.push_back(took);
        s.since += 1;
        if s.since >= EVERY {
            s.since = 0;
            let mut sorted: Vec<Duration> = s.samples.iter().copied().collect();
            sorted.sort_unstable();
            let p95 = sorted[(sorted.len() * 95 / 100).min(sorted.len() - 1)];
            s.delay = p95.clamp(MIN_DELAY, MAX_DELAY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_delay_follows_the_95th_percentile_within_bounds() {
        let h = HedgeDelay::default();
        assert_eq!(h.delay(), MIN_DELAY * 2);
        // 4% of reads slow: they are the tail, not the 95th percentile.
        for i in 0..256 {
            h.record(if i % 25 == 0 { ms(90) } else { ms(30) });
        }
        assert_eq!(h.delay(), ms(30));
        for _ in 0..256 {
            h.record(ms(50));
        }
        assert_eq!(h.delay(), ms(50));
        for _ in 0..256 {
            h.record(Duration::from_micros(100));
        }
        assert_eq!(h.delay(), MIN_DELAY);
        for _ in 0..256 {
            h.record(Duration::from_secs(5));
        }
        assert_eq!(h.delay(), MAX_DELAY);
    }
}
