//! Calls to the master: the one place the client reaches its link, so the
//! retry policy, the client id, the splitting of big batches into requests
//! within the master's limits and the spreading of batch answers over keys
//! are written once.

use futures::StreamExt;
use kvpool_net::request_id;
use kvpool_proto::limits::{batch_chunks, ITEM_OVERHEAD};
use kvpool_proto::msg::{self, ClientId, WireResult};
use kvpool_proto::Rpc;
use kvpool_proto::{validate_key, Code, KvError, KvResult};
use tracing::Instrument;

use crate::Client;

/// Requests of one split batch in flight at once: the master works on
/// several while the next is encoded, without one caller taking every
/// connection of the pool.
const PARTS_IN_FLIGHT: usize = 4;

/// Splits `items` into batches the master accepts: at most
/// [`kvpool_proto::MAX_BATCH_KEYS`] items, and keys of at most half the
/// message limit, each. In order; one batch (possibly empty) at least.
pub(crate) fn split_batch<I>(items: Vec<I>, key: impl Fn(&I) -> &str) -> Vec<Vec<I>> {
    let ranges = batch_chunks(&items, |i| key(i).len() + ITEM_OVERHEAD);
    let mut rest = items;
    let mut parts: Vec<Vec<I>> = ranges
        .iter()
        .rev()
        .map(|r| rest.split_off(r.start))
        .collect();
    parts.reverse();
    parts
}

impl Client {
    /// One master call, retried on transient errors by the link's policy,
    /// under the request id of the call it is part of (or a fresh one) and
    /// in a `request` span carrying it, as the master logs it. With
    /// [`crate::ClientConfig::fail_fast_after`], it fails at once while the
    /// master is that silent, and a call already waiting stops when the
    /// master's silence reaches it.
    pub(crate) async fn call<R: Rpc>(&self, req: &R) -> KvResult<R::Response> {
        let id = request_id::current_or_fresh();
        let call = (self.inner.link.call_as(id, req)).instrument(request_id::span(id, R::OPCODE));
        let Some(after) = self.inner.cfg.fail_fast_after else {
            return call.await;
        };
        self.silence_left(after)?;
        tokio::select! {
            r = call => r,
            e = self.until_master_silent(after) => Err(e),
        }
    }

    /// How long until the master will have been silent for `after` (this
    /// client's heartbeats unanswered), or the error of a call made once it
    /// has.
    fn silence_left(&self, after: std::time::Duration) -> KvResult<std::time::Duration> {
        let silent = self.inner.link.silent_for();
        if silent < after {
            return Ok(after - silent);
        }
        // Settled: the call's retries would wait for the master too.
        Err(KvError::new(
            Code::RpcFail,
            format!(
                "the master has not answered for {:.1}s (fail_fast_after {:.1}s)",
                silent.as_secs_f64(),
                after.as_secs_f64()
            ),
        )
        .settled())
    }

    /// Waits until the master has not answered for `after`: the error a
    /// call still waiting then ends with. Heartbeats answered meanwhile
    /// push the moment back.
    async fn until_master_silent(&self, after: std::time::Duration) -> KvError {
        loop {
            match self.silence_left(after) {
                Ok(left) => tokio::time::sleep(left).await,
                Err(e) => return e,
            }
        }
    }

    /// A batch master call answered per key: `n` results, in request order.
    pub(crate) async fn call_each<R, T>(&self, req: &R, n: usize) -> Vec<KvResult<T>>
    where
        R: Rpc<Response = Vec<WireResult<T>>>,
    {
        per_key(self.call(req).await, n)
    }

    /// A batch master call over `items` of any size, answered per item in
    /// order: split into requests the master accepts (see [`split_batch`];
    /// `key` names an item's key), made by `make`, a few in flight at once.
    pub(crate) async fn call_split<I, R, T>(
        &self,
        items: Vec<I>,
        key: impl Fn(&I) -> &str,
        make: impl Fn(Vec<I>) -> R,
    ) -> Vec<KvResult<T>>
    where
        R: Rpc<Response = Vec<WireResult<T>>>,
    {
        let mut parts = split_batch(items, key);
        if parts.len() == 1 {
            let part = parts.pop().unwrap_or_default();
            let n = part.len();
            return self.call_each(&make(part), n).await;
        }
        let calls = parts.into_iter().map(|part| {
            let n = part.len();
            let req = make(part);
            async move { self.call_each(&req, n).await }
        });
        futures::stream::iter(calls)
            .buffered(PARTS_IN_FLIGHT)
            .flat_map(futures::stream::iter)
            .collect()
            .await
    }

    /// [`Self::call_split`] over `keys`, each checked first: an invalid key
    /// answers its own error and is not sent, the others are asked.
    pub(crate) async fn call_keys<R, T>(
        &self,
        keys: &[&str],
        make: impl Fn(Vec<String>) -> R,
    ) -> Vec<KvResult<T>>
    where
        R: Rpc<Response = Vec<WireResult<T>>>,
    {
        let mut out: Vec<Option<KvResult<T>>> = keys
            .iter()
            .map(|k| validate_key(k).err().map(Err))
            .collect();
        let asked: Vec<String> = (keys.iter().zip(&out))
            .filter(|(_, o)| o.is_none())
            .map(|(k, _)| k.to_string())
            .collect();
        if !asked.is_empty() {
            let mut got = self
                .call_split(asked, String::as_str, make)
                .await
                .into_iter();
            for o in out.iter_mut().filter(|o| o.is_none()) {
                *o = got.next();
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err(KvError::from(Code::InternalError))))
            .collect()
    }

    /// The id this client registered under (puts are owned by it).
    pub(crate) fn client_id(&self) -> ClientId {
        self.inner.link.client_id()
    }
}

/// Spreads a batch-level master answer over its `n` keys.
pub(crate) fn per_key<T>(r: KvResult<Vec<WireResult<T>>>, n: usize) -> Vec<KvResult<T>> {
    match r {
        Ok(v) if v.len() == n => v.into_iter().map(msg::from_wire).collect(),
        Ok(_) => (0..n)
            .map(|_| {
                Err(KvError::new(
                    Code::RpcFail,
                    "master answered the wrong number of keys",
                ))
            })
            .collect(),
        Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
    }
}

/// The only result of a one-item batch.
pub(crate) fn one<T>(v: Vec<KvResult<T>>) -> KvResult<T> {
    v.into_iter()
        .next()
        .unwrap_or_else(|| Err(KvError::from(Code::InternalError)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes<T>(v: &[KvResult<T>]) -> Vec<Option<Code>> {
        v.iter().map(|r| r.as_ref().err().map(|e| e.code)).collect()
    }

    #[test]
    fn per_key_answers_map_codes() {
        let r = per_key::<u64>(Ok(vec![Ok(7), Err(Code::ObjectNotFound.as_i32())]), 2);
        assert_eq!(r[0].as_ref().ok(), Some(&7));
        assert_eq!(codes(&r), [None, Some(Code::ObjectNotFound)]);
    }

    #[test]
    fn a_wrong_count_or_a_failed_call_fails_every_key() {
        let r = per_key::<u64>(Ok(vec![Ok(1)]), 3);
        assert_eq!(codes(&r), [Some(Code::RpcFail); 3]);
        let r = per_key::<u64>(Err(KvError::from(Code::RpcTimeout)), 2);
        assert_eq!(codes(&r), [Some(Code::RpcTimeout); 2]);
    }

    #[test]
    fn big_batches_split_in_order_within_the_limits() {
        let keys: Vec<String> = (0..40_000).map(|i| format!("k{i}")).collect();
        let parts = split_batch(keys.clone(), |k| k.as_str());
        assert_eq!(
            parts.iter().map(Vec::len).collect::<Vec<_>>(),
            [16_384, 16_384, 7_232]
        );
        assert_eq!(parts.concat(), keys);
        // Long keys: the message size splits sooner.
        let long: Vec<String> = (0..5_000).map(|i| format!("{i:04096}")).collect();
        let parts = split_batch(long.clone(), |k| k.as_str());
        assert!(parts.len() >= 3, "{}", parts.len());
        assert!(parts
            .iter()
            .all(|p| p.iter().map(|k| k.len() + ITEM_OVERHEAD).sum::<usize>()
                <= kvpool_proto::limits::BATCH_BYTES));
        assert_eq!(parts.concat(), long);
        assert_eq!(split_batch(Vec::<String>::new(), |k| k.as_str()).len(), 1);
    }

    #[test]
    fn one_of_nothing_is_an_internal_error() {
        assert_eq!(one::<()>(Vec::new()).unwrap_err().code, Code::InternalError);
        assert_eq!(one(vec![Ok(3), Ok(4)]).unwrap(), 3);
    }
}
