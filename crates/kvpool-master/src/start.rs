//! Starting a master: checking its configuration, binding its listeners,
//! joining the HA election when configured, and spawning its servers and
//! timers; [`MasterHandle`] waits for them to stop.

use super::*;

/// A started master: where it listens, and a way to wait for it to stop.
pub struct MasterHandle {
    /// RPC listener address.
    pub rpc_addr: SocketAddr,
    /// Metrics/admin HTTP address.
    pub admin_addr: SocketAddr,
    /// Transfer-metadata HTTP address, when enabled.
    pub metadata_addr: Option<SocketAddr>,
    /// The master itself (for in-process use and tests).
    pub master: Arc<Master>,
    tasks: TaskTracker,
    ha: Option<tokio::task::JoinHandle<Result<(), MasterError>>>,
}

impl MasterHandle {
    /// Waits until every listener and timer has stopped (after shutdown, or
    /// after leadership was lost, which is the error returned).
    pub async fn stopped(self) -> Result<(), MasterError> {
        let ha = match self.ha {
            Some(h) => h
                .await
                .unwrap_or_else(|e| Err(MasterError::Config(e.to_string()))),
            None => Ok(()),
        };
        self.tasks.wait().await;
        self.master.background.close();
        self.master.background.wait().await;
        ha
    }
}

async fn bind(ip: &str, port: u16) -> Result<TcpListener, MasterError> {
    TcpListener::bind((ip, port))
        .await
        .map_err(|source| MasterError::Bind {
            addr: format!("{ip}:{port}"),
            source,
        })
}

/// Binds every listener and starts serving until `shutdown`.
pub async fn start(
    cfg: MasterConfig,
    shutdown: CancellationToken,
) -> Result<MasterHandle, MasterError> {
    validate_config(&cfg)?;
    let listeners = bind_listeners(&cfg).await?;
    let (rpc_addr, admin_addr, metadata_addr) = (
        listeners.rpc_addr,
        listeners.admin_addr,
        listeners.metadata_addr,
    );
    // Losing leadership stops this master's servers, not the caller's token.
    let shutdown = shutdown.child_token();
    let master = new_master(&cfg, &shutdown);
    let ha = start_ha(&cfg, &master, rpc_addr, &shutdown)?;
    let tasks = TaskTracker::new();
    if let Some(ev) = &cfg.kv_events {
        start_kv_events(&tasks, ev, &master, &shutdown).await?;
    }
    spawn_servers(&tasks, &cfg, &master, listeners, &shutdown);
    spawn_background_tasks(&tasks, &cfg, &master, &shutdown);
    tasks.close();
    info!(%rpc_addr, %admin_addr, metadata = ?metadata_addr, "master listening");
    #[cfg(feature = "planted-bugs")]
    kvpool_net::planted::announce();
    Ok(MasterHandle {
        rpc_addr,
        admin_addr,
        metadata_addr,
        master,
        tasks,
        ha,
    })
}

/// Refuses settings that would make the master misbehave, before anything is bound.
fn validate_config(cfg: &MasterConfig) -> Result<(), MasterError> {
    let st = &cfg.state;
    if !(st.high_watermark > 0.0 && st.high_watermark <= 1.0) {
        return Err(MasterError::Config(format!(
            "eviction high watermark ratio {} not in (0, 1]",
            st.high_watermark
        )));
    }
    if !(st.eviction_ratio > 0.0 && st.eviction_ratio <= 1.0) {
        return Err(MasterError::Config(format!(
            "eviction ratio {} not in (0, 1]",
            st.eviction_ratio
        )));
    }
    if !(st.demote_watermark > 0.0 && st.demote_watermark <= 1.0) {
        return Err(MasterError::Config(format!(
            "demote watermark {} not in (0, 1]",
            st.demote_watermark
        )));
    }
    let pins = st.limits.max_hard_pinned_ratio;
    if !(0.0..=1.0).contains(&pins) {
        return Err(MasterError::Config(format!(
            "max hard-pinned ratio {pins} not in [0, 1]"
        )));
    }
    if st.client_ttl.is_zero() || st.lease_ttl.is_zero() {
        return Err(MasterError::Config(
            "client TTL and lease TTL must be positive".into(),
        ));
    }
    let (l, h) = (&st.limits, &cfg.http);
    if l.max_clients == 0
        || l.max_segments_per_client == 0
        || l.max_pending_per_client == 0
        || h.conn.max_connections == 0
        || h.metadata_max_keys == 0
        || h.conn.header_read_timeout.is_zero()
        || h.conn.request_timeout.is_zero()
    {
        return Err(MasterError::Config(
            "client, connection and metadata limits and HTTP timeouts must be positive".into(),
        ));
    }
    Ok(())
}

/// The master's bound listeners and the addresses they got (port 0 picks one).
struct Listeners {
    rpc: TcpListener,
    admin: TcpListener,
    metadata: Option<TcpListener>,
    rpc_addr: SocketAddr,
    admin_addr: SocketAddr,
    metadata_addr: Option<SocketAddr>,
}

/// Binds the RPC, admin and (when enabled) metadata listeners where `security` allows them.
async fn bind_listeners(cfg: &MasterConfig) -> Result<Listeners, MasterError> {
    let rpc = bind(&cfg.rpc_address, cfg.rpc_port).await?;
    let admin = bind(&cfg.metrics_address, cfg.metrics_port).await?;
    let metadata = if cfg.enable_http_metadata_server {
        Some(bind(&cfg.rpc_address, cfg.http_metadata_server_port).await?)
    } else {
        None
    };
    let local = |l: &TcpListener| {
        l.local_addr()
            .map_err(|e| MasterError::Config(e.to_string()))
    };
    let rpc_addr = local(&rpc)?;
    let admin_addr = local(&admin)?;
    for (addr, what) in [
        (rpc_addr, "the master RPC"),
        (admin_addr, "the admin HTTP API"),
    ] {
        cfg.security
            .check_listen(addr.ip(), what)
            .map_err(|e| MasterError::Config(e.message))?;
    }
    let metadata_addr = metadata.as_ref().map(local).transpose()?;
    Ok(Listeners {
        rpc,
        admin,
        metadata,
        rpc_addr,
        admin_addr,
        metadata_addr,
    })
}

/// Creates the master's state, holding object calls back for `recovery_grace` if one is set.
fn new_master(cfg: &MasterConfig, shutdown: &CancellationToken) -> Arc<Master> {
    let grants = cfg
        .security
        .credentials
        .as_ref()
        .and_then(CapabilityKey::new);
    let master = Master::with_shutdown(cfg.state.clone(), grants, shutdown.clone());
    if !cfg.recovery_grace.is_zero() {
        master.set_role(Role::Recovering(Instant::now() + cfg.recovery_grace));
    }
    master
}

/// With HA configured, stands the master by and runs the leader election until it ends.
fn start_ha(
    cfg: &MasterConfig,
    master: &Arc<Master>,
    rpc_addr: SocketAddr,
    shutdown: &CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<Result<(), MasterError>>>, MasterError> {
    let Some(ha_cfg) = cfg.ha.clone() else {
        return Ok(None);
    };
    if rpc_addr.ip().is_unspecified() {
        return Err(MasterError::Config(
            "--enable-ha needs a routable --rpc-address to publish, not 0.0.0.0".into(),
        ));
    }
    master.set_role(Role::Standby);
    let (m, token) = (master.clone(), shutdown.clone());
    let stepping_down = master.clone();
    let etcd_tls = cfg.security.etcd_tls.clone();
    let grace = if cfg.recovery_grace.is_zero() {
        // Two heartbeats or more (every TTL/4, at most 1 s apart): every
        // live store has re-mounted by then.
        cfg.state.client_ttl / 2
    } else {
        cfg.recovery_grace
    };
    Ok(Some(tokio::spawn(async move {
        let r = ha::run(
            m,
            ha_cfg,
            etcd_tls,
            rpc_addr.to_string(),
            grace,
            token.clone(),
        )
        .await;
        if r.is_err() {
            stepping_down.state.log_moves_in_flight();
            token.cancel();
        }
        r
    })))
}

/// Binds the KV event stream's PUB socket (and its replay socket) and
/// starts its publisher.
async fn start_kv_events(
    tasks: &TaskTracker,
    cfg: &kv_events::KvEventsConfig,
    master: &Arc<Master>,
    shutdown: &CancellationToken,
) -> Result<(), MasterError> {
    let events = master.state.kv_events().clone();
    let (publish, replay, rx) = events.bind(cfg).await.map_err(MasterError::Config)?;
    let loopback = |endpoint: &str| {
        let host = (endpoint.strip_prefix("tcp://"))
            .and_then(|a| a.rsplit_once(':'))
            .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'));
        host.is_some_and(|h| {
            h == "localhost"
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        })
    };
    let endpoints = std::iter::once(&cfg.endpoint).chain(&cfg.replay_endpoint);
    for endpoint in endpoints.filter(|e| !loopback(e)) {
        tracing::warn!(
            %endpoint,
            "the KV event stream is not authenticated (ZMQ's NULL mechanism, as engines' \
             streams): whoever reaches it sees key names and block hashes, never bytes"
        );
    }
    info!(endpoint = %cfg.endpoint, replay = ?cfg.replay_endpoint, backend_id = %cfg.backend_id,
        "publishing KV events");
    if let Some(router) = replay {
        let (events, token) = (events.clone(), shutdown.clone());
        tasks.spawn(async move { events.serve_replays(router, token).await });
    }
    let (m, backend, token) = (master.clone(), cfg.backend_id.clone(), shutdown.clone());
    tasks.spawn(async move {
        let tier = |no| m.state.tier_of(no);
        events.run(publish, rx, backend, tier, token).await;
    });
    Ok(())
}

/// Serves the RPC, admin HTTP and (when enabled) metadata HTTP listeners on `tasks`.
fn spawn_servers(
    tasks: &TaskTracker,
    cfg: &MasterConfig,
    master: &Arc<Master>,
    listeners: Listeners,
    shutdown: &CancellationToken,
) {
    let Listeners {
        rpc,
        admin,
        metadata,
        ..
    } = listeners;
    tasks.spawn(serve_control(
        rpc,
        master.clone(),
        "master",
        Limits::default(),
        cfg.security.clone(),
        shutdown.clone(),
    ));
    let keyring = cfg.security.credentials.as_ref();
    let router = http_auth::protect(
        http::admin_router(master.clone()),
        keyring,
        http_auth::admin_needs,
    );
    let https = (cfg.security.tls.as_ref()).and_then(|t| t.acceptor().cloned());
    let (token, m, limits, tls) = (
        shutdown.clone(),
        master.clone(),
        cfg.http.clone(),
        https.clone(),
    );
    tasks.spawn(async move {
        if let Err(e) = http::serve(admin, router, &limits, tls, m, token).await {
            tracing::error!(error = %e, "admin HTTP server failed");
        }
    });
    if let Some(l) = metadata {
        let (token, m, limits) = (shutdown.clone(), master.clone(), cfg.http.clone());
        let router = http_auth::protect(
            http::metadata_router(&limits, m.clone()),
            keyring,
            http_auth::metadata_needs,
        );
        tasks.spawn(async move {
            if let Err(e) = http::serve(l, router, &limits, https, m, token).await {
                tracing::error!(error = %e, "metadata HTTP server failed");
            }
        });
    }
}

/// Starts the sweeper, evictor, status sampler, invalidator and tierer on `tasks`.
fn spawn_background_tasks(
    tasks: &TaskTracker,
    cfg: &MasterConfig,
    master: &Arc<Master>,
    shutdown: &CancellationToken,
) {
    tasks.spawn(tasks::sweeper(master.clone(), shutdown.clone()));
    tasks.spawn(tasks::evictor(master.clone(), shutdown.clone()));
    tasks.spawn(status_page::sampler(master.clone(), shutdown.clone()));
    // Stores verify the store role at most: the master proves that one.
    let as_store = Security {
        credentials: (cfg.security.credentials.as_ref()).and_then(|c| c.derive(PeerRole::Store)),
        ..cfg.security.clone()
    };
    tasks.spawn(tasks::invalidator(
        master.clone(),
        as_store.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(tasks::tierer(master.clone(), as_store, shutdown.clone()));
}

/// Runs a master until `shutdown`.
pub async fn run(cfg: MasterConfig, shutdown: CancellationToken) -> Result<(), MasterError> {
    start(cfg, shutdown).await?.stopped().await
}
