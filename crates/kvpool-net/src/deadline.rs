//! One deadline per call: a client call (a get, a batch put) sets when it
//! must answer by, and every master attempt and transfer under it takes the
//! smaller of its own limit and the time left, so retries share one budget
//! instead of each getting a fresh timeout (never retries × timeout).
//!
//! The deadline lives in a task-local, so the layers between the call and
//! its attempts need not carry it; work outside the task (a thread a big
//! batch spreads to) gets its limits computed before it leaves.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

tokio::task_local! {
    static DEADLINE: Instant;
}

/// The deadline of a call starting now that may retry for `retry_for`, each
/// attempt at most `timeout`: `retry_for` away, or one whole `timeout` if
/// that is longer (a caller that asked for a long timeout gets it once).
pub fn for_call(retry_for: Duration, timeout: Duration) -> Instant {
    Instant::now() + retry_for.max(timeout)
}

/// Runs `f` under `deadline`, or under the one already in force if that is
/// sooner: an inner call never outlives the call it is part of.
pub async fn within<F: Future>(deadline: Instant, f: F) -> F::Output {
    let deadline = current().map_or(deadline, |d| d.min(deadline));
    DEADLINE.scope(deadline, f).await
}

/// The deadline in force for this task, if any.
pub fn current() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// `limit`, or less if the deadline in force comes sooner (zero once it
/// has passed).
pub fn cap(limit: Duration) -> Duration {
    current().map_or(limit, |d| {
        limit.min(d.saturating_duration_since(Instant::now()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn limits_shrink_to_the_time_left() {
        assert_eq!(cap(Duration::from_secs(10)), Duration::from_secs(10));
        let soon = Instant::now() + Duration::from_secs(3);
        within(soon, async {
            assert_eq!(cap(Duration::from_secs(10)), Duration::from_secs(3));
            assert_eq!(cap(Duration::from_secs(1)), Duration::from_secs(1));
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(cap(Duration::from_secs(10)), Duration::from_secs(1));
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(cap(Duration::from_secs(10)), Duration::ZERO);
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_inner_call_keeps_the_sooner_deadline() {
        let now = Instant::now();
        let (near, far) = (now + Duration::from_secs(1), now + Duration::from_secs(5));
        within(
            near,
            within(far, async { assert_eq!(current(), Some(near)) }),
        )
        .await;
        within(
            far,
            within(near, async { assert_eq!(current(), Some(near)) }),
        )
        .await;
        assert_eq!(current(), None);
    }
}
