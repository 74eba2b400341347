//! The request id of the call a task is working on: set once per client call
//! ([`within`]), sent with every request the call makes on a connection that
//! speaks protocol 6 ([`crate::FramedConn::send_request`]), and logged by the
//! servers in a `request` span ([`span`]), so `KVPOOL_LOG=debug` shows one
//! call under one id in client, master and store logs.
//!
//! Like the [`deadline`](crate::deadline), it lives in a task-local so the
//! layers between the call and its requests (retries, the data-plane
//! pipeline) need not carry it; work spawned onto other tasks starts
//! without one.

use std::future::Future;

use kvpool_proto::msg::RequestId;
use kvpool_proto::Opcode;

tokio::task_local! {
    static CURRENT: RequestId;
}

/// A new id, random so that ids of different clients do not collide, never
/// [`RequestId::NONE`].
pub fn fresh() -> RequestId {
    RequestId(rand::random::<u64>().max(1))
}

/// The id of the call this task is working on; [`RequestId::NONE`] outside
/// any.
pub fn current() -> RequestId {
    CURRENT.try_with(|id| *id).unwrap_or(RequestId::NONE)
}

/// The id in force, or a fresh one when there is none: what a call that may
/// be part of a bigger one should use.
pub fn current_or_fresh() -> RequestId {
    match current() {
        RequestId::NONE => fresh(),
        id => id,
    }
}

/// Runs `f` as part of the call `id`: its requests carry `id`.
// Not an async fn: that would hold `f` twice (argument and scope), and
// the futures this wraps (a whole get) are big enough for the copies to
// overflow a test thread's stack in debug builds.
pub fn within<F: Future>(id: RequestId, f: F) -> impl Future<Output = F::Output> {
    CURRENT.scope(id, f)
}

/// The span a process handles or makes one request in; the same name and
/// fields on client, master and store. At debug level, so it costs a
/// check of a cached flag when debug logging is off.
pub fn span(id: RequestId, op: Opcode) -> tracing::Span {
    tracing::debug_span!("request", id = %id, op = op.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_id_holds_within_its_call_only() {
        assert_eq!(current(), RequestId::NONE);
        let id = fresh();
        assert_ne!(id, RequestId::NONE);
        within(id, async {
            assert_eq!(current(), id);
            assert_eq!(current_or_fresh(), id);
            tokio::task::yield_now().await;
            assert_eq!(current(), id);
        })
        .await;
        assert_eq!(current(), RequestId::NONE);
        assert_ne!(current_or_fresh(), RequestId::NONE);
    }
}
