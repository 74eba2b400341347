//! kvpool's storage node: segment files with a superblock ([`segment`]), the
//! object header every region starts with ([`header`]), and the data node
//! that serves segments and mounts them on the master ([`node`]). `run` is
//! what `kvpool store` does; clients embed a [`node::DataNode`] to lend memory.

pub mod header;
pub mod node;
pub mod segment;

use std::path::PathBuf;
use std::time::Duration;

use kvpool_proto::msg::ClientId;
use kvpool_proto::KvError;
use kvpool_transfer::{CallPolicy, MasterLink};
use tokio_util::sync::CancellationToken;
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
}

/// Runs a storage node until `shutdown`: opens the segment, serves it, mounts
/// it (waiting for the master to come up), heartbeats, and unmounts on exit.
pub async fn run(cfg: StoreConfig, shutdown: CancellationToken) -> Result<(), StoreError> {
    let seg = SegmentFile::open(&cfg.data_dir, cfg.segment_size)?;
    let node = DataNode::bind(&cfg.address, cfg.port, shutdown.clone())
        .await
        .map_err(|e| StoreError::Io(PathBuf::from(format!("{}:{}", cfg.address, cfg.port)), e))?;
    let name = cfg
        .name
        .clone()
        .unwrap_or_else(|| node.endpoint().to_string());
    node.add_segment(seg.id, &name, seg.region.clone(), segment::DATA_BASE);
    info!(endpoint = node.endpoint(), segment = %seg.id, size = cfg.segment_size, "store serving");

    let link = MasterLink::new(
        &cfg.master,
        ClientId(rand::random()),
        &name,
        "store",
        CallPolicy::default(),
    );
    let reply = loop {
        match link.register().await {
            Ok(r) => break r,
            Err(e) if e.code.is_transient() => {
                warn!(master = %cfg.master, error = %e, "master not reachable yet; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
            Err(e) => return Err(e.into()),
        }
    };
    node.mount_all(&link).await?;
    info!(master = %cfg.master, "segment mounted");
    link.spawn_heartbeat(
        Duration::from_millis(reply.heartbeat_interval_ms.max(10)),
        node.remount_hook(&link),
        shutdown.clone(),
    );
    shutdown.cancelled().await;
    info!("shutting down: unmounting and finishing in-flight transfers");
    node.unmount_all(&link).await;
    node.stopped().await;
    let _ = seg.region.flush();
    Ok(())
}
