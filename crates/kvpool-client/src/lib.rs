//! kvpool's Rust client: put/get/exist/remove/upsert, their batch forms, and
//! zero-copy variants that write from and read into caller memory.
//!
//! A put is one master round trip to reserve regions (`PutStart`), the bytes
//! written straight to every replica's store, and one round trip to commit
//! (`PutEnd`) or abandon (`PutRevoke`). A get is one master round trip
//! (`GetReplicaList`, which grants a read lease) and one read per object from
//! a replica; the object header and checksum are verified before a byte is
//! reported as read, and a bad or unreachable replica falls back to the next.
//! Batches make one master round trip for all keys and pipeline the
//! transfers per store. Every result is per key.
//!
//! A client may also lend memory to the pool (an embedded segment), as an
//! inference engine does; it goes away with the client.
//!
//! Modules: `config` (the client's knobs), `settings` (resolving them
//! from arguments, env and config file), `put` and `get`/`read` (the two
//! protocols), `hedge` (when a slow read asks a second replica),
//! `transport` (the `Transport` trait, its TCP and shared-memory
//! implementations, and the one route choice), `placement` (which
//! replica a read tries), `retry` (per-key retries), `fanout` (running a
//! batch's jobs over connections and cores), `rpc` (master calls),
//! `query` (metadata-only calls), `cache` (the location cache), `metrics`
//! (what the client counts, for the engine to export), `groups` (a pool
//! split over several masters by key: the scaling prototype).

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

mod cache;
mod config;
mod fanout;
mod get;
pub mod groups;
mod hedge;
mod metrics;
mod placement;
mod put;
mod query;
mod read;
mod replicas;
mod retry;
mod rpc;
mod segments;
pub mod settings;
pub mod transport;

pub use cache::CacheStats;
pub use config::{ClientConfig, Protocol};
pub use get::{GetInto, Located};
pub use kvpool_net::auth;
pub use kvpool_net::tls;
pub use kvpool_proto::msg::ReplicateConfig;
pub use metrics::ClientMetrics;
pub use replicas::{ReplicaDesc, TaskKind};
pub use segments::store_about;
pub use settings::Settings;

use cache::LocationCache;
use kvpool_net::{CallPolicy, MasterLink};
use kvpool_proto::msg::{self, ClientId};
use kvpool_proto::{tenant, Code, KvError, KvResult};
use kvpool_store::DataNode;
use std::borrow::Cow;
use tokio_util::sync::CancellationToken;
use transport::Transports;

/// A connected client. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: ClientConfig,
    link: Arc<MasterLink>,
    /// TCP connection pools and shared-memory mappings, made on first use.
    transports: Transports,
    /// The embedded data node serving the memory this client lends: made
    /// at connect when it lends a segment, or when it mounts one later.
    node: Arc<tokio::sync::OnceCell<Arc<DataNode>>>,
    cache: Arc<LocationCache>,
    metrics: metrics::ClientMetrics,
    /// Big batches in flight: only a lone one spreads over threads.
    big_calls: AtomicUsize,
    /// When a slow read asks its object's next replica too.
    hedge: hedge::HedgeDelay,
    shutdown: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Client {
    /// Registers with the master, lends the embedded segment if configured,
    /// and starts heartbeating.
    pub async fn connect(cfg: ClientConfig) -> KvResult<Client> {
        let policy = CallPolicy {
            timeout: cfg.timeout,
            retries: cfg.retries,
            retry_for: cfg.retry_for,
            ..CallPolicy::default()
        };
        let link = MasterLink::new(
            &cfg.master,
            ClientId(rand::random()),
            &cfg.hostname,
            "client",
            policy,
            cfg.security.clone(),
        )?;
        let reply = link.register().await?;
        let shutdown = CancellationToken::new();
        let node = Arc::new(tokio::sync::OnceCell::new());
        if cfg.segment_size > 0 {
            let n = bind_node(&cfg, &shutdown).await?;
            n.add_anonymous_segment(&cfg.hostname, cfg.segment_size)
                .map_err(|e| KvError::new(Code::InternalError, format!("embedded segment: {e}")))?;
            n.mount_all(&link).await?;
            let _ = node.set(n);
        }
        // Segments mounted later (`mount_segment`) are found here too.
        let remount: kvpool_net::master::RemountHook = {
            let (node, link) = (node.clone(), link.clone());
            Arc::new(move || {
                let (node, link) = (node.clone(), link.clone());
                Box::pin(async move {
                    let Some(n) = node.get().cloned() else {
                        return true;
                    };
                    n.remount_hook(&link)().await
                })
            })
        };
        let held = node.clone();
        link.report_held(Arc::new(move || {
            held.get().map(|n| n.held()).unwrap_or_default()
        }));
        link.spawn_heartbeat(
            Duration::from_millis(reply.heartbeat_interval_ms.max(10)),
            remount,
            shutdown.clone(),
        );
        let cache = Arc::new(LocationCache::new(cfg.location_cache));
        tokio::spawn(report_touches(
            link.clone(),
            cache.clone(),
            shutdown.clone(),
        ));
        Ok(Client {
            inner: Arc::new(Inner {
                link,
                transports: Transports::new(&cfg),
                node,
                cache,
                metrics: Default::default(),
                big_calls: AtomicUsize::new(0),
                hedge: Default::default(),
                cfg,
                shutdown,
            }),
        })
    }

    /// What this client (and its clones) counted so far.
    pub fn metrics(&self) -> &ClientMetrics {
        &self.inner.metrics
    }

    /// The settings in force.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// How long since the master last answered this client's heartbeats
    /// (see [`kvpool_net::master::MasterLink::silent_for`]).
    pub fn master_silent_for(&self) -> Duration {
        self.inner.link.silent_for()
    }

    /// How the location cache has served reads so far.
    pub fn cache_stats(&self) -> CacheStats {
        self.inner.cache.stats()
    }

    /// `key` as this client sends it: in its tenant's namespace when its
    /// key is a tenant's (see [`kvpool_proto::tenant::scoped`]), else as is.
    pub(crate) fn scoped<'k>(&self, key: &'k str) -> Cow<'k, str> {
        match self.tenant() {
            Some(t) => Cow::Owned(tenant::scoped(Some(t), key)),
            None => Cow::Borrowed(key),
        }
    }

    /// The tenant whose key this client holds, if any.
    pub fn tenant(&self) -> Option<&str> {
        let credentials = self.inner.cfg.security.credentials.as_ref();
        credentials.and_then(|c| c.tenant())
    }

    /// [`Self::scoped`] of each key where that differs from the key (a
    /// tenant's client); empty otherwise, so the common path copies nothing.
    pub(crate) fn tenant_keys(&self, keys: &[&str]) -> Vec<String> {
        match self.tenant() {
            Some(t) => keys.iter().map(|k| tenant::scoped(Some(t), k)).collect(),
            None => Vec::new(),
        }
    }

    /// Withdraws the embedded segment and stops background work.
    pub async fn close(&self) {
        if let Some(node) = self.inner.node.get() {
            node.unmount_all(&self.inner.link).await;
        }
        self.inner.shutdown.cancel();
    }
}

/// Binds the embedded data node on the configured address and port.
async fn bind_node(cfg: &ClientConfig, shutdown: &CancellationToken) -> KvResult<Arc<DataNode>> {
    let n = DataNode::bind(
        &cfg.segment_address,
        cfg.segment_port,
        &cfg.security,
        shutdown.clone(),
    )
    .await
    .map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::AddrInUse => Code::SegmentAlreadyExists,
            _ => Code::InternalError,
        };
        KvError::new(
            code,
            format!(
                "embedded segment on {}:{}: {e}",
                cfg.segment_address, cfg.segment_port
            ),
        )
    })?;
    n.set_master(&cfg.master);
    Ok(n)
}

/// How often keys read through cached locations are reported to the master.
const TOUCH_EVERY: Duration = Duration::from_millis(200);

/// Reports reads through cached locations to the master, which counts
/// them for its LRU and extends their leases (and so the cached entries).
/// Best effort: an unreported read only lets its entry age out sooner.
async fn report_touches(link: Arc<MasterLink>, cache: Arc<LocationCache>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(TOUCH_EVERY) => {}
        }
        let (items, read_at) = cache.take_touched();
        if items.is_empty() {
            continue;
        }
        // As many requests as the master's batch limits ask for.
        let mut read_at = read_at.into_iter();
        for items in rpc::split_batch(items, |i| &i.key) {
            let at: Vec<_> = read_at.by_ref().take(items.len()).collect();
            let touch = msg::Touch { items };
            match tokio::time::timeout(TOUCH_EVERY * 5, link.call(&touch)).await {
                Ok(Ok(renewed)) => {
                    for ((it, at), ok) in touch.items.iter().zip(at).zip(renewed) {
                        if ok {
                            cache.renewed(&it.key, it.generation, at);
                        }
                    }
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "cached reads not reported"),
                Err(_) => tracing::debug!("cached reads not reported in time"),
            }
        }
    }
}
