//! Calls to the master: the one place the client reaches its link, so the
//! retry policy, the client id and the spreading of batch answers over keys
//! are written once.

use kvpool_proto::msg::{self, ClientId, Rpc, WireResult};
use kvpool_proto::{Code, KvError, KvResult};

use crate::Client;

impl Client {
    /// One master call, retried on transient errors by the link's policy.
    pub(crate) async fn call<R: Rpc>(&self, req: &R) -> KvResult<R::Response> {
        self.inner.link.call(req).await
    }

    /// A batch master call answered per key: `n` results, in request order.
    pub(crate) async fn call_each<R, T>(&self, req: &R, n: usize) -> Vec<KvResult<T>>
    where
        R: Rpc<Response = Vec<WireResult<T>>>,
    {
        per_key(self.call(req).await, n)
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
    fn one_of_nothing_is_an_internal_error() {
        assert_eq!(one::<()>(Vec::new()).unwrap_err().code, Code::InternalError);
        assert_eq!(one(vec![Ok(3), Ok(4)]).unwrap(), 3);
    }
}
