//! The link every client and store keeps to the master: typed calls with a
//! timeout per attempt and retries with backoff on transient errors, plus the
//! heartbeat that keeps the caller registered (and re-registers and re-mounts
//! after the master forgot it, e.g. after a master restart).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kvpool_proto::frame::Limits;
use kvpool_proto::msg::{ClientId, Heartbeat, RegisterClient, RegisterReply, Rpc};
use kvpool_proto::{Code, KvError, KvResult};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::conn::ConnPool;

/// Timeouts and retries for calls to the master.
#[derive(Debug, Clone)]
pub struct CallPolicy {
    /// Limit for one attempt (connect included).
    pub timeout: Duration,
    /// Most extra attempts after transient failures.
    pub retries: u32,
    /// Transient failures are retried only while the call is younger than
    /// this (long enough to ride out a master failover).
    pub retry_for: Duration,
    /// First backoff; doubles per retry.
    pub backoff: Duration,
}

impl Default for CallPolicy {
    fn default() -> Self {
        CallPolicy {
            timeout: Duration::from_secs(10),
            retries: 50,
            retry_for: Duration::from_secs(15),
            backoff: Duration::from_millis(20),
        }
    }
}

/// Runs `attempt` with a timeout each time, retrying transient failures with
/// exponential backoff.
pub async fn with_retries<T, F, Fut>(policy: &CallPolicy, mut attempt: F) -> KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = KvResult<T>>,
{
    let mut backoff = policy.backoff;
    let mut tries = 0;
    let start = tokio::time::Instant::now();
    loop {
        let r = match tokio::time::timeout(policy.timeout, attempt()).await {
            Ok(r) => r,
            Err(_) => Err(KvError::new(
                Code::RpcTimeout,
                format!("no answer within {:?}", policy.timeout),
            )),
        };
        match r {
            Err(e)
                if e.code.is_transient()
                    && tries < policy.retries
                    && start.elapsed() < policy.retry_for =>
            {
                tries += 1;
                // Jitter spreads out clients that failed together.
                let jitter = backoff.mul_f64(rand::random::<f64>());
                tokio::time::sleep(backoff + jitter).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            r => return r,
        }
    }
}

/// Called after re-registering, to mount the caller's segments again.
pub type RemountHook = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A registered client's connection to the master.
pub struct MasterLink {
    calls: ConnPool,
    heartbeats: ConnPool,
    client_id: ClientId,
    hostname: String,
    policy: CallPolicy,
}

impl MasterLink {
    /// A link to `addr` for `client_id` (not yet registered).
    pub fn new(
        addr: &str,
        client_id: ClientId,
        hostname: &str,
        role: &str,
        policy: CallPolicy,
    ) -> Arc<Self> {
        let limits = Limits::default();
        Arc::new(MasterLink {
            calls: ConnPool::new(addr, role, limits, policy.timeout, 16),
            // Heartbeats get their own connection so they never queue behind bulk metadata.
            heartbeats: ConnPool::new(addr, role, limits, policy.timeout, 1),
            client_id,
            hostname: hostname.to_string(),
            policy,
        })
    }

    /// This client's id.
    pub fn client_id(&self) -> ClientId {
        self.client_id
    }

    /// The master address.
    pub fn addr(&self) -> &str {
        self.calls.addr()
    }

    /// The call policy in force.
    pub fn policy(&self) -> &CallPolicy {
        &self.policy
    }

    /// A typed call with timeout and retries.
    pub async fn call<R: Rpc>(&self, req: &R) -> KvResult<R::Response> {
        with_retries(&self.policy, || self.calls.call(req)).await
    }

    /// A typed call with one attempt bounded by the policy timeout.
    pub async fn call_once<R: Rpc>(&self, req: &R) -> KvResult<R::Response> {
        tokio::time::timeout(self.policy.timeout, self.calls.call(req))
            .await
            .unwrap_or_else(|_| {
                Err(KvError::new(
                    Code::RpcTimeout,
                    "master did not answer in time",
                ))
            })
    }

    /// Registers with the master; returns the heartbeat timing it expects.
    pub async fn register(&self) -> KvResult<RegisterReply> {
        self.call(&RegisterClient {
            client_id: self.client_id,
            hostname: self.hostname.clone(),
        })
        .await
    }

    /// Heartbeats every `interval` until `shutdown`; when the master no longer
    /// knows this client, registers again and runs `remount`.
    pub fn spawn_heartbeat(
        self: &Arc<Self>,
        interval: Duration,
        remount: RemountHook,
        shutdown: CancellationToken,
    ) {
        let link = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let hb = Heartbeat {
                    client_id: link.client_id,
                };
                let r = tokio::time::timeout(link.policy.timeout, link.heartbeats.call(&hb)).await;
                match r {
                    Ok(Ok(reply)) if reply.known => {}
                    Ok(Ok(_))
                    | Ok(Err(KvError {
                        code: Code::ClientNotFound,
                        ..
                    })) => {
                        info!(client = %link.client_id, "master forgot this client; registering again");
                        if link.register().await.is_ok() {
                            remount().await;
                        }
                    }
                    Ok(Err(e)) => warn!(error = %e, "heartbeat failed"),
                    Err(_) => warn!("heartbeat timed out"),
                }
            }
        });
    }
}
