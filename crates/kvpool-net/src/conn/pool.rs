//! [`ConnPool`]: idle connections to one peer, opened on demand (dialled
//! with a timeout, behind the peer's breaker when it has one).

use super::*;

/// Idle connections to one peer, opened on demand.
pub struct ConnPool {
    addr: String,
    role: String,
    security: Security,
    limits: Limits,
    connect_timeout: Duration,
    max_idle: usize,
    idle: Mutex<Vec<FramedConn>>,
    /// Set by [`ConnPool::with_breaker`]: connect failures and silent
    /// answers open it.
    breaker: Option<Arc<Mutex<Breaker>>>,
    /// Set by [`ConnPool::with_same_host`]: the kind of server whose
    /// same-host socket is tried before TCP.
    same_host: Option<&'static str>,
}

impl ConnPool {
    /// A pool for `addr`; at most `max_idle` connections are kept open.
    pub fn new(
        addr: &str,
        role: &str,
        limits: Limits,
        connect_timeout: Duration,
        max_idle: usize,
    ) -> Self {
        ConnPool {
            addr: addr.to_string(),
            role: role.to_string(),
            security: Security::default(),
            limits,
            connect_timeout,
            max_idle,
            idle: Mutex::new(Vec::new()),
            breaker: None,
            same_host: None,
        }
    }

    /// Connects through the peer's same-host socket when it has one here
    /// (a `kind` server of this user in this network namespace, see
    /// [`crate::local`]), over TCP otherwise: the same frames, handshake
    /// and secret, without the TCP stack (and without TLS: the kernel
    /// carries the bytes).
    pub fn with_same_host(mut self, kind: &'static str) -> Self {
        self.same_host = Some(kind);
        self
    }

    /// Fails connects at once while the peer is known to be unreachable
    /// (see [`Breaker`]), and takes a peer that does not start an answer
    /// within two connect timeouts for unreachable: for peers a caller can
    /// do without, like one store among many, not for the master a caller
    /// must wait for.
    pub fn with_breaker(mut self) -> Self {
        self.breaker = Some(Arc::new(Mutex::new(Breaker::default())));
        self
    }

    /// Whether the breaker is refusing connects now: the peer's last
    /// connect failed and its next probe is not due.
    pub fn is_down(&self) -> bool {
        let now = tokio::time::Instant::now();
        self.breaker.as_ref().is_some_and(|b| b.lock().is_open(now))
    }

    /// Connects with `security` (its TLS, proving its key) from now on.
    pub fn with_security(mut self, security: Security) -> Self {
        self.security = security;
        self
    }

    /// The peer address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Checks out an idle connection or opens a new one. While the breaker
    /// is open this fails at once; when its probe is due, the probe runs
    /// on its own and this caller waits for it at most [`PROBE_WAIT`]: no
    /// caller waits a connect timeout on a peer that may still be gone.
    pub async fn take(&self) -> KvResult<FramedConn> {
        if let Some(c) = self.idle.lock().pop() {
            return Ok(c);
        }
        let Some(b) = &self.breaker else {
            return self.dialer().dial().await;
        };
        let admit = b.lock().admit(tokio::time::Instant::now());
        match admit {
            Ok(Admit::Connect) => {
                let r = self.dialer().dial().await;
                if r.is_err() {
                    self.clear();
                }
                r
            }
            Ok(Admit::Probe) => {
                // A peer back from a restart answers at once and this caller
                // uses the connection; one still silent is left to the probe.
                let dial = self.dialer();
                let mut probe = tokio::spawn(async move { dial.dial().await });
                match tokio::time::timeout(PROBE_WAIT, &mut probe).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(_)) => Err(KvError::from(Code::InternalError)),
                    Err(_) => Err(KvError::new(
                        Code::RpcFail,
                        format!("{} is unreachable (probing it again)", self.addr),
                    )),
                }
            }
            Err(wait) => Err(KvError::new(
                Code::RpcFail,
                format!("{} is unreachable (next try in {wait:?})", self.addr),
            )),
        }
    }

    /// What a connect to the peer needs, owned (a probe runs on its own).
    fn dialer(&self) -> Dial {
        Dial {
            addr: self.addr.clone(),
            role: self.role.clone(),
            security: self.security.clone(),
            limits: self.limits,
            timeout: self.connect_timeout,
            breaker: self.breaker.clone(),
            same_host: self.same_host,
        }
    }

    /// Returns a connection whose last exchange completed cleanly.
    pub fn give(&self, conn: FramedConn) {
        let mut idle = self.idle.lock();
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }

    /// Resolves once the peer closes an idle connection (a master shutting
    /// down to hand its leadership over, say), which is dropped; pending
    /// while there is none. Cancel-safe: dropped first, the connection goes
    /// back to the pool.
    pub async fn idle_closed(&self) {
        /// Gives the watched connection back unless it closed.
        struct Watched<'a> {
            pool: &'a ConnPool,
            conn: Option<FramedConn>,
        }
        impl Drop for Watched<'_> {
            fn drop(&mut self) {
                if let Some(c) = self.conn.take() {
                    self.pool.give(c);
                }
            }
        }
        let Some(conn) = self.idle.lock().pop() else {
            return std::future::pending().await;
        };
        let mut w = Watched {
            pool: self,
            conn: Some(conn),
        };
        if let Some(c) = w.conn.as_mut() {
            c.closed().await;
        }
        w.conn = None;
    }

    /// Drops every idle connection (after the peer restarted, say).
    pub fn clear(&self) {
        self.idle.lock().clear();
    }

    /// An exchange with the peer got no answer in time: it is stuck (paused,
    /// cut off) or gone. Drops the idle connections and opens the breaker,
    /// so the next calls do not each wait out their own timeout.
    pub fn stalled(&self) {
        self.clear();
        if let Some(b) = &self.breaker {
            b.lock().failed(tokio::time::Instant::now());
        }
    }

    /// Runs one typed call on a pooled connection.
    pub async fn call<R: Rpc>(&self, req: &R) -> KvResult<R::Response> {
        let mut conn = self.take().await?;
        let r = conn.exchange(req).await;
        // An error status leaves the stream in step; a broken one goes.
        if r.is_ok() {
            self.give(conn);
        }
        r?
    }
}

/// One connect to a pool's peer, reported to its breaker.
struct Dial {
    addr: String,
    role: String,
    security: Security,
    limits: Limits,
    timeout: Duration,
    breaker: Option<Arc<Mutex<Breaker>>>,
    same_host: Option<&'static str>,
}

impl Dial {
    /// Connects within the timeout. With a breaker: a connect that works
    /// closes it (and the connection must start each answer within
    /// [`ANSWER_CONNECT_TIMEOUTS`] timeouts, see [`Silence`]); one refused,
    /// reset or silent opens it (a refusal of our key or version is an
    /// answer, not an absence).
    async fn dial(&self) -> KvResult<FramedConn> {
        let (addr, role, limits, security) = (&self.addr, &self.role, self.limits, &self.security);
        // Boxed: a connect is rare, and the callers' futures nest deep.
        let connect: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> = match self
            .same_host
            .and_then(|kind| crate::local::connect(kind, addr))
        {
            Some(unix) => Box::pin(FramedConn::connect_unix(unix, addr, role, limits, security)),
            None => Box::pin(FramedConn::connect_with(addr, role, limits, security)),
        };
        let mut r = tokio::time::timeout(self.timeout, connect)
            .await
            .unwrap_or_else(|_| {
                Err(KvError::new(
                    Code::RpcTimeout,
                    format!("connect {} timed out", self.addr),
                ))
            });
        if let Some(b) = &self.breaker {
            match &mut r {
                Ok(conn) => {
                    b.lock().succeeded();
                    conn.silence = Some(Silence {
                        within: self.timeout * ANSWER_CONNECT_TIMEOUTS,
                        breaker: b.clone(),
                    });
                }
                Err(e) if matches!(e.code, Code::RpcFail | Code::RpcTimeout) => {
                    b.lock().failed(tokio::time::Instant::now());
                }
                Err(_) => {}
            }
        }
        r
    }
}
