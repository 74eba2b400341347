//! The link every client and store keeps to the master: typed calls with a
//! timeout per attempt and retries with backoff on transient errors, plus the
//! heartbeat that keeps the caller registered (and re-registers and re-mounts
//! after the master forgot it, e.g. after a master restart).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kvpool_proto::frame::Limits;
use kvpool_proto::msg::{
    ClientId, Heartbeat, RegisterClient, RegisterReply, RequestId, SegmentId, SegmentIo,
};
use kvpool_proto::Rpc;
use kvpool_proto::{Code, KvError, KvResult};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::auth::Security;
use crate::conn::ConnPool;
use crate::etcd::MasterAddr;
use crate::request_id;
use parking_lot::Mutex;

/// Timeouts and retries for calls to the master.
#[derive(Debug, Clone)]
pub struct CallPolicy {
    /// Limit for one attempt (connect included).
    pub timeout: Duration,
    /// Most extra attempts after transient failures.
    pub retries: u32,
    /// The call's deadline: transient failures are retried only until it
    /// (long enough to ride out a master failover); with a shorter
    /// `timeout`, the last attempt gets what is left.
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
/// exponential backoff. The call has one deadline, `retry_for` (or one
/// whole `timeout` if longer) from now, or sooner if the caller's
/// [`deadline`](crate::deadline) says so: each attempt gets what is left of
/// it, at most `timeout`.
pub async fn with_retries<T, F, Fut>(policy: &CallPolicy, mut attempt: F) -> KvResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = KvResult<T>>,
{
    let mut backoff = policy.backoff;
    let mut tries = 0;
    let end = crate::deadline::for_call(policy.retry_for, policy.timeout);
    crate::deadline::within(end, async {
        loop {
            let limit = crate::deadline::cap(policy.timeout);
            let r = match tokio::time::timeout(limit, attempt()).await {
                Ok(r) => r,
                Err(_) => Err(KvError::new(
                    Code::RpcTimeout,
                    format!("no answer within {limit:?}"),
                )),
            };
            match r {
                Err(e) if e.code.is_transient() && tries < policy.retries => {
                    // Jitter spreads out clients that failed together.
                    let jitter = backoff.mul_f64(rand::random::<f64>());
                    let pause = crate::deadline::cap(backoff + jitter);
                    if pause < backoff {
                        return Err(e);
                    }
                    tries += 1;
                    tokio::time::sleep(pause).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                r => return r,
            }
        }
    })
    .await
}

/// Called after re-registering, to mount the caller's segments again;
/// resolves to whether every segment was mounted.
pub type RemountHook = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// What a store reports of its disk segments' I/O with every heartbeat.
pub type IoSource = Arc<dyn Fn() -> Vec<SegmentIo> + Send + Sync>;

/// What a store reports with every heartbeat of the regions it holds back
/// from the pool, as `(segment, offset, len)`.
pub type HeldSource = Arc<dyn Fn() -> Vec<(SegmentId, u64, u64)> + Send + Sync>;

/// A registered client's connection to the master, following the leader
/// when the address is `etcd://...`.
pub struct MasterLink {
    target: MasterAddr,
    role: String,
    security: Security,
    conns: Mutex<Option<Conns>>,
    resolved_at: Mutex<Option<tokio::time::Instant>>,
    client_id: ClientId,
    hostname: String,
    policy: CallPolicy,
    io: Mutex<Option<IoSource>>,
    held: Mutex<Option<HeldSource>>,
    /// Registrations that succeeded: a new one means a master that did not
    /// know this client (a restart or a failover).
    registrations: std::sync::atomic::AtomicU64,
    /// When the master last answered a registration or a heartbeat.
    heard: Mutex<std::time::Instant>,
}

/// Pools to the master currently believed to lead.
struct Conns {
    calls: Arc<ConnPool>,
    heartbeats: Arc<ConnPool>,
}

/// Least time between two leader look-ups in etcd.
const RESOLVE_EVERY: Duration = Duration::from_millis(200);

/// Next heartbeat after a failed one.
const RETRY_BEAT: Duration = Duration::from_millis(100);

impl MasterLink {
    /// A link to `addr` (`host:port` or `etcd://...`) for `client_id` (not
    /// yet registered), connecting with `security` (TLS, and the key it
    /// proves when the master asks).
    pub fn new(
        addr: &str,
        client_id: ClientId,
        hostname: &str,
        role: &str,
        policy: CallPolicy,
        security: Security,
    ) -> KvResult<Arc<Self>> {
        let target = MasterAddr::parse(addr, &security)?;
        let link = MasterLink {
            target,
            role: role.to_string(),
            security,
            conns: Mutex::new(None),
            resolved_at: Mutex::new(None),
            client_id,
            hostname: hostname.to_string(),
            policy,
            io: Mutex::new(None),
            held: Mutex::new(None),
            registrations: Default::default(),
            heard: Mutex::new(std::time::Instant::now()),
        };
        if let MasterAddr::Static(a) = &link.target {
            *link.conns.lock() = Some(link.pools_for(a));
        }
        Ok(Arc::new(link))
    }

    fn pools_for(&self, addr: &str) -> Conns {
        let limits = Limits::default();
        Conns {
            calls: Arc::new(
                ConnPool::new(addr, &self.role, limits, self.policy.timeout, 16)
                    .with_security(self.security.clone()),
            ),
            // Heartbeats get their own connection so they never queue behind bulk metadata.
            heartbeats: Arc::new(
                ConnPool::new(addr, &self.role, limits, self.policy.timeout, 1)
                    .with_security(self.security.clone()),
            ),
        }
    }

    /// The pools to the current leader, looking it up first if none is known.
    async fn pools(&self) -> KvResult<(Arc<ConnPool>, Arc<ConnPool>)> {
        if let Some(c) = self.conns.lock().as_ref() {
            return Ok((c.calls.clone(), c.heartbeats.clone()));
        }
        self.refresh().await?;
        self.conns
            .lock()
            .as_ref()
            .map(|c| (c.calls.clone(), c.heartbeats.clone()))
            .ok_or_else(|| KvError::new(Code::UnavailableInCurrentStatus, "no master leader known"))
    }

    /// Looks the leader up again (after a failure that may mean a failover);
    /// a no-op for a fixed address, and at most every 200 ms.
    async fn refresh(&self) -> KvResult<()> {
        if matches!(self.target, MasterAddr::Static(_)) {
            return Ok(());
        }
        {
            let mut at = self.resolved_at.lock();
            let now = tokio::time::Instant::now();
            if at.is_some_and(|t| now.duration_since(t) < RESOLVE_EVERY)
                && self.conns.lock().is_some()
            {
                return Ok(());
            }
            *at = Some(now);
        }
        let addr = self.target.resolve().await?;
        let mut conns = self.conns.lock();
        if conns.as_ref().map(|c| c.calls.addr()) != Some(addr.as_str()) {
            tracing::info!(master = %addr, "following the master leader");
            *conns = Some(self.pools_for(&addr));
        }
        Ok(())
    }

    /// Resolves when the master closes the idle heartbeat connection (see
    /// [`ConnPool::idle_closed`]); pending while no leader is known.
    async fn heartbeat_closed(&self) {
        let pool = self.conns.lock().as_ref().map(|c| c.heartbeats.clone());
        match pool {
            Some(p) => p.idle_closed().await,
            None => std::future::pending().await,
        }
    }

    /// One attempt on the call pools; a failure that may mean the leader
    /// moved triggers a look-up before the next attempt.
    async fn attempt<R: Rpc>(&self, req: &R, heartbeat: bool) -> KvResult<R::Response> {
        let (calls, heartbeats) = self.pools().await?;
        let r = if heartbeat {
            heartbeats.call(req).await
        } else {
            calls.call(req).await
        };
        if let Err(e) = &r {
            if matches!(
                e.code,
                Code::RpcFail | Code::RpcTimeout | Code::UnavailableInCurrentStatus
            ) {
                let _ = self.refresh().await;
            }
        }
        r
    }

    /// This client's id.
    pub fn client_id(&self) -> ClientId {
        self.client_id
    }

    /// The master address now (`""` before the first etcd look-up).
    pub fn addr(&self) -> String {
        self.conns
            .lock()
            .as_ref()
            .map(|c| c.calls.addr().to_string())
            .unwrap_or_default()
    }

    /// The call policy in force.
    pub fn policy(&self) -> &CallPolicy {
        &self.policy
    }

    /// A typed call with timeout and retries (across a master failover),
    /// all under the request id in force (or a fresh one, see
    /// [`crate::request_id`]).
    pub async fn call<R: Rpc>(&self, req: &R) -> KvResult<R::Response> {
        self.call_as(request_id::current_or_fresh(), req).await
    }

    /// [`Self::call`] as part of the call `id` (see [`crate::request_id`]).
    pub fn call_as<'a, R: Rpc>(
        &'a self,
        id: RequestId,
        req: &'a R,
    ) -> impl Future<Output = KvResult<R::Response>> + 'a {
        self.call_under(&self.policy, id, req)
    }

    /// [`Self::call`] under `policy` instead of the link's own: for a call
    /// the master may take long to answer, which sent again after a
    /// timeout would only queue behind the first.
    pub async fn call_with<R: Rpc>(&self, policy: &CallPolicy, req: &R) -> KvResult<R::Response> {
        self.call_under(policy, request_id::current_or_fresh(), req)
            .await
    }

    /// A call with `policy`'s timeout and retries, as part of the call `id`.
    fn call_under<'a, R: Rpc>(
        &'a self,
        policy: &'a CallPolicy,
        id: RequestId,
        req: &'a R,
    ) -> impl Future<Output = KvResult<R::Response>> + 'a {
        // Not an async fn: one layer less in the futures that nest it.
        let call = with_retries(policy, move || self.attempt(req, false));
        request_id::within(id, call)
    }

    /// A typed call with one attempt bounded by the policy timeout.
    pub async fn call_once<R: Rpc>(&self, req: &R) -> KvResult<R::Response> {
        let attempt = self.attempt(req, false);
        let attempt = request_id::within(request_id::current_or_fresh(), attempt);
        tokio::time::timeout(crate::deadline::cap(self.policy.timeout), attempt)
            .await
            .unwrap_or_else(|_| {
                Err(KvError::new(
                    Code::RpcTimeout,
                    "master did not answer in time",
                ))
            })
    }

    /// Reports what `source` says with every heartbeat from now on (a
    /// store's disk I/O, for the master's status and metrics).
    pub fn report_io(&self, source: IoSource) {
        *self.io.lock() = Some(source);
    }

    /// Reports what `source` says with every heartbeat from now on (the
    /// regions a store holds back from the pool).
    pub fn report_held(&self, source: HeldSource) {
        *self.held.lock() = Some(source);
    }

    /// Registers with the master; returns the heartbeat timing it expects.
    pub async fn register(&self) -> KvResult<RegisterReply> {
        let reply = self
            .call(&RegisterClient {
                client_id: self.client_id,
                hostname: self.hostname.clone(),
            })
            .await?;
        (self.registrations).fetch_add(1, std::sync::atomic::Ordering::Release);
        *self.heard.lock() = std::time::Instant::now();
        Ok(reply)
    }

    /// How long since the master last answered this client's registration
    /// or heartbeats (which go at least once a second): what a caller that
    /// would rather skip the pool than wait out the retries of a call to an
    /// unreachable or stalled master looks at.
    pub fn silent_for(&self) -> Duration {
        self.heard.lock().elapsed()
    }

    /// How many times this client registered: it changes when a master
    /// that did not know the client (restarted, or newly leading) took it
    /// in, after which read leases granted before are not to be trusted
    /// alone.
    pub fn registrations(&self) -> u64 {
        (self.registrations).load(std::sync::atomic::Ordering::Acquire)
    }

    /// Heartbeats every `interval` until `shutdown`; when the master no longer
    /// knows this client, registers again and runs `remount`. The remount
    /// runs beside the heartbeats (a big inventory can outlast the TTL) and
    /// is started again on a later beat until one completes.
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
            let mut remounting: Option<tokio::task::JoinHandle<bool>> = None;
            let mut must_mount = false;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        if let Some(t) = remounting { t.abort(); }
                        return;
                    }
                    _ = tick.tick() => {}
                    // A leader handing over closes its connections: beat
                    // now, so the new leader hears from this client (and a
                    // store re-mounts) without waiting for the next tick.
                    () = link.heartbeat_closed() => {}
                }
                if remounting.as_ref().is_some_and(|t| t.is_finished()) {
                    if let Some(t) = remounting.take() {
                        must_mount = !t.await.unwrap_or(false);
                    }
                }
                let (io, held) = (link.io.lock().clone(), link.held.lock().clone());
                let hb = Heartbeat {
                    client_id: link.client_id,
                    io: io.map(|f| f()).unwrap_or_default(),
                    held: held.map(|f| f()).unwrap_or_default(),
                };
                let beat = request_id::within(request_id::fresh(), link.attempt(&hb, true));
                // The whole policy timeout: a beat that finds the leader moved
                // looks it up in etcd within the attempt, and cutting that
                // short would repeat the look-up without ever finishing it.
                let r = tokio::time::timeout(link.policy.timeout, beat).await;
                if matches!(
                    r,
                    Ok(Ok(_))
                        | Ok(Err(KvError {
                            code: Code::ClientNotFound,
                            ..
                        }))
                ) {
                    *link.heard.lock() = std::time::Instant::now();
                }
                match r {
                    Ok(Ok(reply)) if reply.known => {}
                    Ok(Ok(_))
                    | Ok(Err(KvError {
                        code: Code::ClientNotFound,
                        ..
                    })) => {
                        info!(client = %link.client_id, "master forgot this client; registering again");
                        if let Some(t) = remounting.take() {
                            t.abort();
                        }
                        must_mount = link.register().await.is_ok();
                    }
                    Ok(Err(e)) => {
                        warn!(error = %e, "heartbeat failed");
                        // The leader may have moved: try the new one soon, so
                        // the store re-mounts within the new leader's grace.
                        tick.reset_after(interval.min(RETRY_BEAT));
                    }
                    Err(_) => warn!("heartbeat timed out"),
                }
                if must_mount && remounting.is_none() {
                    must_mount = false;
                    remounting = Some(tokio::spawn(remount()));
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn policy() -> CallPolicy {
        CallPolicy {
            timeout: Duration::from_secs(2),
            retries: 50,
            retry_for: Duration::from_secs(5),
            backoff: Duration::from_millis(20),
        }
    }

    async fn silent() -> KvResult<()> {
        std::future::pending().await
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_share_one_deadline() {
        let t0 = Instant::now();
        let e = with_retries(&policy(), silent).await.unwrap_err();
        assert_eq!(e.code, Code::RpcTimeout);
        let took = t0.elapsed();
        assert!(took <= Duration::from_secs(5), "{took:?}");
        assert!(took >= Duration::from_millis(4500), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_callers_deadline_wins_when_sooner() {
        let t0 = Instant::now();
        let soon = t0 + Duration::from_millis(700);
        let e = crate::deadline::within(soon, with_retries(&policy(), silent))
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::RpcTimeout);
        assert_eq!(t0.elapsed(), Duration::from_millis(700));
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_timeout_still_gets_one_whole_attempt() {
        let p = CallPolicy {
            timeout: Duration::from_secs(8),
            retry_for: Duration::from_secs(1),
            ..policy()
        };
        let t0 = Instant::now();
        let slow = || async {
            tokio::time::sleep(Duration::from_secs(6)).await;
            Ok(())
        };
        with_retries(&p, slow).await.expect("within the timeout");
        assert_eq!(t0.elapsed(), Duration::from_secs(6));
    }
}
