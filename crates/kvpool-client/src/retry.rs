//! Per-key retries of batch calls: the keys that failed transiently (a
//! store restarting, a master failing over, another writer holding the key)
//! go again, with backoff, while the client's retry budget lasts; the others
//! keep their first answer. The call has one deadline ([`KeyRetry::pass`]
//! runs each pass under it): every master attempt and transfer of every
//! pass takes what is left of it. Every pass also runs under one request
//! id, so the master and stores log the whole call, retries included,
//! under the id the client logs.
//!
//! The bookkeeping ([`KeyRetry::record`]) is pure apart from reading the
//! clock, so the classification and the backoff are unit-tested; only
//! [`KeyRetry::settle`] sleeps.

use std::future::Future;
use std::time::Duration;

use kvpool_net::request_id;
use kvpool_proto::msg::RequestId;
use kvpool_proto::{Code, KvError, KvResult};
use tokio::time::Instant;
use tracing::Instrument;

use crate::ClientConfig;

/// First delay between passes.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// Longest delay between passes: a restarting store or a failover is
/// noticed within this.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Whether a failed key goes again: only transient errors, only while the
/// budget lasts.
pub(crate) fn retryable(e: &KvError, budget_left: bool) -> bool {
    budget_left && e.is_retryable()
}

/// Doubling delays from [`FIRST_BACKOFF`], capped at [`MAX_BACKOFF`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff(Duration);

impl Backoff {
    /// A backoff at its first delay.
    pub(crate) fn new() -> Self {
        Backoff(FIRST_BACKOFF)
    }

    /// The delay [`Self::next`] will give.
    fn peek(&self) -> Duration {
        self.0
    }

    /// The delay to wait now; the next one doubles.
    pub(crate) fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(MAX_BACKOFF);
        d
    }
}

/// The state of one batch call's retries: results so far and keys to redo.
pub(crate) struct KeyRetry<T> {
    results: Vec<Option<KvResult<T>>>,
    todo: Vec<usize>,
    attempt: u32,
    retries: u32,
    /// When the call must answer by.
    deadline: Instant,
    backoff: Backoff,
    /// The call's request id, sent with every request of every pass.
    id: RequestId,
}

impl<T> KeyRetry<T> {
    /// Retries for a batch of `n` items under `cfg`'s budget.
    pub(crate) fn new(n: usize, cfg: &ClientConfig) -> Self {
        KeyRetry {
            results: (0..n).map(|_| None).collect(),
            todo: (0..n).collect(),
            attempt: 0,
            retries: cfg.retries,
            deadline: kvpool_net::deadline::for_call(cfg.retry_for, cfg.timeout),
            backoff: Backoff::new(),
            id: request_id::current_or_fresh(),
        }
    }

    /// Runs one pass under the call's deadline and request id, in a `call`
    /// span carrying the id (the transfers' logs show it).
    // Not an async fn, which would hold the pass's future (big: a whole
    // batch's transfers) once more.
    pub(crate) fn pass<F: Future>(&self, f: F) -> impl Future<Output = F::Output> {
        let f = kvpool_net::deadline::within(self.deadline, f);
        let span = tracing::debug_span!("call", id = %self.id, pass = self.attempt);
        request_id::within(self.id, f).instrument(span)
    }

    /// Item indexes for the next pass, ascending.
    pub(crate) fn todo(&self) -> Vec<usize> {
        self.todo.clone()
    }

    /// Records a pass's results (one per `todo` index); returns the delay
    /// before another pass, or `None` when every key has its answer.
    pub(crate) fn record(&mut self, out: Vec<KvResult<T>>) -> Option<Duration> {
        // Another pass only if its first backoff fits before the deadline.
        let more = self.attempt < self.retries
            && self.backoff.peek() < self.deadline.saturating_duration_since(Instant::now());
        let mut again = Vec::new();
        for (&i, r) in self.todo.iter().zip(out) {
            match r {
                Err(e) if retryable(&e, more) => again.push(i),
                r => self.results[i] = Some(r),
            }
        }
        self.todo = again;
        if self.todo.is_empty() {
            return None;
        }
        self.attempt += 1;
        Some(self.backoff.next())
    }

    /// [`Self::record`], then sleeps the backoff; returns whether another
    /// pass is due.
    pub(crate) async fn settle(&mut self, out: Vec<KvResult<T>>) -> bool {
        match self.record(out) {
            Some(delay) => {
                tokio::time::sleep(delay).await;
                true
            }
            None => false,
        }
    }

    /// The final result per item, in order.
    pub(crate) fn finish(self) -> Vec<KvResult<T>> {
        self.results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(KvError::from(Code::InternalError))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err<T>(code: Code) -> KvResult<T> {
        Err(KvError::from(code))
    }

    #[test]
    fn only_transient_errors_with_budget_are_retried() {
        for code in [
            Code::TransferFail,
            Code::RpcTimeout,
            Code::UnavailableInCurrentStatus,
        ] {
            assert!(retryable(&KvError::from(code), true), "{code:?}");
            assert!(!retryable(&KvError::from(code), false), "{code:?}");
        }
        for code in [
            Code::ObjectNotFound,
            Code::ChecksumMismatch,
            Code::InvalidParams,
        ] {
            assert!(!retryable(&KvError::from(code), true), "{code:?}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let mut b = Backoff::new();
        let got: Vec<u64> = (0..10).map(|_| b.next().as_millis() as u64).collect();
        assert_eq!(got, [5, 10, 20, 40, 80, 160, 320, 500, 500, 500]);
    }

    #[test]
    fn transient_keys_go_again_and_the_rest_keep_their_answer() {
        let cfg = ClientConfig::new("m");
        let mut r = KeyRetry::new(3, &cfg);
        let delay = r.record(vec![
            Ok(1),
            err(Code::TransferFail),
            err(Code::ObjectNotFound),
        ]);
        assert_eq!(delay, Some(FIRST_BACKOFF));
        assert_eq!(r.todo(), [1]);
        assert_eq!(r.record(vec![Ok(2)]), None);
        let out = r.finish();
        assert_eq!(out[0].as_ref().ok(), Some(&1));
        assert_eq!(out[1].as_ref().ok(), Some(&2));
        assert_eq!(out[2].as_ref().unwrap_err().code, Code::ObjectNotFound);
    }

    #[test]
    fn the_budget_ends_retries_with_the_last_error() {
        let mut cfg = ClientConfig::new("m");
        cfg.retries = 2;
        let mut r = KeyRetry::<()>::new(1, &cfg);
        assert!(r.record(vec![err(Code::RpcTimeout)]).is_some());
        assert!(r.record(vec![err(Code::RpcTimeout)]).is_some());
        assert_eq!(r.record(vec![err(Code::RpcTimeout)]), None);
        assert_eq!(r.finish()[0].as_ref().unwrap_err().code, Code::RpcTimeout);
    }

    #[tokio::test(start_paused = true)]
    async fn no_pass_starts_that_its_backoff_would_carry_past_the_deadline() {
        let mut cfg = ClientConfig::new("m");
        cfg.timeout = Duration::from_millis(100);
        cfg.retry_for = Duration::from_millis(100);
        let mut r = KeyRetry::<()>::new(1, &cfg);
        assert!(r.record(vec![err(Code::RpcTimeout)]).is_some());
        tokio::time::sleep(Duration::from_millis(95)).await;
        assert_eq!(r.record(vec![err(Code::RpcTimeout)]), None);
        assert_eq!(r.finish()[0].as_ref().unwrap_err().code, Code::RpcTimeout);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_runs_under_the_calls_deadline() {
        let cfg = ClientConfig::new("m");
        let r = KeyRetry::<()>::new(1, &cfg);
        let left = r
            .pass(async { kvpool_net::deadline::cap(Duration::MAX) })
            .await;
        assert_eq!(left, cfg.retry_for.max(cfg.timeout));
    }

    #[test]
    fn an_item_never_answered_is_an_internal_error() {
        let r = KeyRetry::<()>::new(1, &ClientConfig::new("m"));
        assert_eq!(
            r.finish()[0].as_ref().unwrap_err().code,
            Code::InternalError
        );
    }
}
