//! kvpool's storage node: segment files in a data directory ([`segment`]),
//! and the data node that serves segments, finds the objects they hold and
//! mounts them on the master ([`node`]), and its Prometheus metrics
//! ([`metrics`]). The bytes of objects and
//! superblocks are `kvpool_format`'s. `run` is what `kvpool store` does;
//! clients embed a [`node::DataNode`] to lend memory.

pub mod disk;
mod lent;
pub mod metrics;
pub mod node;
pub mod segment;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kvpool_net::auth::Security;
use kvpool_net::{CallPolicy, MasterLink};
use kvpool_proto::msg::ClientId;
use kvpool_proto::{Code, KvError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

pub use node::DataNode;
pub use segment::SegmentFile;

/// Why a store could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Bad configuration; fix the flags.
    #[error("{0}")]
    Config(String),
    /// A file or socket operation failed.
    #[error("{path}: {source}", path = .0.display(), source = .1)]
    Io(PathBuf, std::io::Error),
    /// The master refused or could not be reached.
    #[error("master: {0}")]
    Master(#[from] KvError),
}

/// Settings of `kvpool store`.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Master RPC address `host:port`.
    pub master: String,
    /// Bytes of segment to lend.
    pub segment_size: u64,
    /// Directory holding the segment file (tmpfs for RAM, a disk path for NVMe).
    pub data_dir: PathBuf,
    /// IP to bind the data plane on and advertise to clients.
    pub address: String,
    /// Data-plane port; 0 picks a free one.
    pub port: u16,
    /// Segment name for `preferred_segments`; defaults to the data endpoint.
    pub name: Option<String>,
    /// On shutdown, how long to keep serving after the master stopped placing
    /// new objects here, so transfers already under way complete.
    pub shutdown_grace: Duration,
    /// The key proved to the master and asked of data-plane peers.
    pub security: Security,
    /// Directory of the disk tier (a local SSD), if the store has one.
    pub disk_dir: Option<PathBuf>,
    /// Bytes of disk tier to lend.
    pub disk_size: u64,
    /// I/O requests the disk tier keeps in flight to the device at most.
    pub disk_queue_depth: usize,
    /// IP of the `/metrics` port.
    pub metrics_address: String,
    /// Port of `/metrics` (0 picks one); `None` serves no metrics.
    pub metrics_port: Option<u16>,
    /// Connection caps and timeouts of the metrics port.
    pub http: kvpool_net::http::HttpConnLimits,
}

/// Runs a storage node until `shutdown`: opens (or recovers) the segment,
/// serves it, mounts it with the objects it already holds (waiting for the
/// master to come up), and heartbeats. On shutdown the segment is drained,
/// not unmounted: its objects stay in the data dir and are readable again
/// when the store comes back.
pub async fn run(cfg: StoreConfig, shutdown: CancellationToken) -> Result<(), StoreError> {
    let seg = SegmentFile::open(&cfg.data_dir, cfg.segment_size)?;
    let disk = open_disk(&cfg)?;
    // The data plane outlives the shutdown signal by the grace period.
    let data_plane = CancellationToken::new();
    let (node, name) = serve_segments(&cfg, &seg, disk.as_ref(), data_plane.clone()).await?;
    let metrics = Arc::new(metrics::StoreMetrics::new(node.clone()));
    let huge = seg.region.huge_page_bytes();
    metrics.huge_page_bytes.set(huge as i64);
    // Tracked so that the store returns only once its own tasks have ended.
    let tasks = TaskTracker::new();
    // Ends what the graceful stops leave running once the node has stopped.
    let stop_now = CancellationToken::new();
    if let Some(port) = cfg.metrics_port {
        let (graceful, now) = (data_plane.clone(), stop_now.clone());
        spawn_metrics(&cfg, port, &metrics, &tasks, graceful, now).await?;
    }
    if let Some(d) = &disk {
        info!(segment = %d.id, size = d.file.len(), direct = d.file.direct(), path = %d.file.path().display(), "disk tier serving");
    }
    info!(endpoint = node.endpoint(), segment = %seg.id, size = cfg.segment_size, huge_page_bytes = huge, "store serving");

    let link = master_link(&cfg, &name, &node)?;
    let heartbeat = CancellationToken::new();
    if disk.is_some() {
        spawn_disk_watch(&tasks, node.clone(), link.clone(), heartbeat.clone());
    }
    tasks.close();
    tokio::select! {
        _ = shutdown.cancelled() => {
            heartbeat.cancel();
            data_plane.cancel();
            stop_now.cancel();
            tasks.wait().await;
            return Ok(());
        }
        r = register_and_mount(&cfg.master, &link, &node, &heartbeat) => r?,
    };
    info!(master = %cfg.master, "segment mounted");
    shutdown.cancelled().await;
    info!(grace = ?cfg.shutdown_grace, "shutting down: draining, finishing transfers in flight");
    metrics.draining.set(1);
    node.drain_all(&link).await;
    tokio::time::sleep(cfg.shutdown_grace).await;
    heartbeat.cancel();
    data_plane.cancel();
    node.stopped().await;
    stop_now.cancel();
    tasks.wait().await;
    let _ = seg.region.flush();
    info!("store stopped; its objects stay in the data dir for the next start");
    Ok(())
}

/// Opens (or recovers) the disk tier, when the store has one.
fn open_disk(cfg: &StoreConfig) -> Result<Option<disk::DiskSegment>, StoreError> {
    let open = |dir| disk::DiskSegment::open(dir, cfg.disk_size, cfg.disk_queue_depth);
    cfg.disk_dir.as_deref().map(open).transpose()
}

/// Binds the data plane with the segments already added, and returns it with the segment name.
async fn serve_segments(
    cfg: &StoreConfig,
    seg: &SegmentFile,
    disk: Option<&disk::DiskSegment>,
    data_plane: CancellationToken,
) -> Result<(Arc<DataNode>, String), StoreError> {
    // The segments are served from the first connection on.
    let mut name = String::new();
    let node = DataNode::bind_with(&cfg.address, cfg.port, &cfg.security, data_plane, |node| {
        node.set_master(&cfg.master);
        name = cfg
            .name
            .clone()
            .unwrap_or_else(|| node.endpoint().to_string());
        node.add_segment(
            seg.id,
            seg.possession,
            &name,
            seg.region.clone(),
            kvpool_format::DATA_BASE,
        );
        if let Some(d) = disk {
            node.add_disk_segment(
                d.id,
                d.possession,
                &name,
                d.file.clone(),
                kvpool_format::DATA_BASE,
            );
        }
    })
    .await
    .map_err(|e| StoreError::Io(PathBuf::from(format!("{}:{}", cfg.address, cfg.port)), e))?;
    Ok((node, name))
}

/// Binds the `/metrics` port and serves it on `tasks` until the data plane stops.
async fn spawn_metrics(
    cfg: &StoreConfig,
    port: u16,
    metrics: &Arc<metrics::StoreMetrics>,
    tasks: &TaskTracker,
    data_plane: CancellationToken,
    stop_now: CancellationToken,
) -> Result<(), StoreError> {
    let addr = format!("{}:{port}", cfg.metrics_address);
    let io = |e| StoreError::Io(PathBuf::from(&addr), e);
    let listener = tokio::net::TcpListener::bind(&addr).await.map_err(io)?;
    let local = listener.local_addr().map_err(io)?;
    (cfg.security)
        .check_listen(local.ip(), "the store's metrics port")
        .map_err(|e| StoreError::Config(e.message))?;
    // With a certificate the port serves https only, as the data port
    // speaks TLS only: a scraper needs the cluster's CA.
    let tls = (cfg.security.tls.as_ref()).and_then(|t| t.acceptor().cloned());
    let scheme = if tls.is_some() { "https" } else { "http" };
    info!(%local, scheme, "metrics serving");
    // Up until the data plane stops: a drain is watched through it.
    let serve = metrics::serve_metrics(listener, metrics.clone(), cfg.http, tls, data_plane);
    tasks.spawn(async move {
        // The graceful stop waits for open requests: a scraper stuck mid-request
        // must not keep the store from exiting, so `stop_now` cuts it off.
        tokio::select! {
            r = serve => r,
            _ = stop_now.cancelled() => Ok(()),
        }
    });
    Ok(())
}

/// Creates the link to the master, whose heartbeats report the node's I/O and held regions.
fn master_link(
    cfg: &StoreConfig,
    name: &str,
    node: &Arc<DataNode>,
) -> Result<Arc<MasterLink>, StoreError> {
    let link = MasterLink::new(
        &cfg.master,
        ClientId(rand::random()),
        name,
        "store",
        CallPolicy::default(),
        cfg.security.clone(),
    )?;
    let (io_node, held_node) = (node.clone(), node.clone());
    link.report_io(Arc::new(move || io_node.io()));
    link.report_held(Arc::new(move || held_node.held()));
    Ok(link)
}

/// Withdraws failed disk tiers from the pool every 0.5 s on `tasks`, until `stop`.
fn spawn_disk_watch(
    tasks: &TaskTracker,
    node: Arc<DataNode>,
    link: Arc<MasterLink>,
    stop: CancellationToken,
) {
    // An I/O error takes the disk tier offline; withdraw it from the
    // pool so nothing is placed or read there again.
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            // Not raced against `stop`: a withdrawal under way is allowed to
            // finish (each master call is time-bounded), so shutdown waits for it.
            node.withdraw_failed_disks(&link).await;
        }
    });
}

/// Registers with the master (waiting for it to come up), starts heartbeating, and mounts.
async fn register_and_mount(
    master: &str,
    link: &Arc<MasterLink>,
    node: &Arc<DataNode>,
    heartbeat: &CancellationToken,
) -> Result<(), StoreError> {
    let reply = loop {
        match link.register().await {
            Ok(r) => break r,
            // etcd unreachable (cut off, restarting): where the master
            // is will be known later, so wait as for the master itself.
            Err(e) if e.code.is_transient() || e.code == Code::EtcdOperationError => {
                warn!(master = %master, error = %e, "master not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(StoreError::from(e)),
        }
    };
    // Heartbeat from now on: scanning a big segment can outlast the TTL.
    link.spawn_heartbeat(
        Duration::from_millis(reply.heartbeat_interval_ms.max(10)),
        node.remount_hook(link),
        heartbeat.clone(),
    );
    node.mount_all(link).await.map_err(StoreError::from)
}
