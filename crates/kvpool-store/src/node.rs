//! A data node: a TCP data-plane server over one or more segments, and their
//! mounting on the master. `kvpool store` runs one; a client that lends
//! memory embeds one.

use std::sync::Arc;

use kvpool_proto::frame::Limits;
use kvpool_proto::msg::{MountSegment, SegmentId, SegmentInfo, UnmountSegment};
use kvpool_proto::{Code, KvResult};
use kvpool_transfer::data::{serve_data, SegmentTable};
use kvpool_transfer::master::RemountHook;
use kvpool_transfer::{MappedRegion, MasterLink};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::segment::DATA_BASE;

/// A running data-plane server and the segments it lends.
pub struct DataNode {
    table: Arc<SegmentTable>,
    endpoint: String,
    segments: Mutex<Vec<SegmentInfo>>,
    tasks: TaskTracker,
}

impl DataNode {
    /// Binds the data plane on `address:port` (port 0 picks one) and starts
    /// serving until `shutdown`.
    pub async fn bind(
        address: &str,
        port: u16,
        shutdown: CancellationToken,
    ) -> std::io::Result<Arc<DataNode>> {
        let listener = TcpListener::bind((address, port)).await?;
        let endpoint = listener.local_addr()?.to_string();
        let table = Arc::new(SegmentTable::default());
        let tasks = TaskTracker::new();
        tasks.spawn(serve_data(
            listener,
            table.clone(),
            Limits::default(),
            shutdown,
        ));
        tasks.close();
        Ok(Arc::new(DataNode {
            table,
            endpoint,
            segments: Mutex::new(Vec::new()),
            tasks,
        }))
    }

    /// `host:port` clients use to reach this node.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Serves `region` as segment `id`, object area starting at `base`.
    pub fn add_segment(
        &self,
        id: SegmentId,
        name: &str,
        region: Arc<MappedRegion>,
        base: u64,
    ) -> SegmentInfo {
        let info = SegmentInfo {
            id,
            name: name.to_string(),
            endpoint: self.endpoint.clone(),
            base,
            size: region.len().saturating_sub(base),
        };
        self.table.insert(id, region, base);
        self.segments.lock().push(info.clone());
        info
    }

    /// Serves an anonymous in-process segment of `size` bytes (embedded store).
    pub fn add_anonymous_segment(&self, name: &str, size: u64) -> std::io::Result<SegmentInfo> {
        let region = Arc::new(MappedRegion::anonymous(size)?);
        Ok(self.add_segment(SegmentId(rand::random()), name, region, DATA_BASE))
    }

    /// Mounts every segment on the master (again, after a re-register).
    pub async fn mount_all(&self, link: &MasterLink) -> KvResult<()> {
        let segments = self.segments.lock().clone();
        for segment in segments {
            let r = link
                .call(&MountSegment {
                    client_id: link.client_id(),
                    segment,
                })
                .await;
            match r {
                Ok(()) => {}
                Err(e) if e.code == Code::SegmentAlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Withdraws every segment from the master (best effort, on shutdown).
    pub async fn unmount_all(&self, link: &MasterLink) {
        let ids: Vec<SegmentId> = self.segments.lock().iter().map(|s| s.id).collect();
        for segment in ids {
            let _ = link
                .call_once(&UnmountSegment {
                    client_id: link.client_id(),
                    segment,
                })
                .await;
        }
    }

    /// A heartbeat hook that mounts this node's segments again.
    pub fn remount_hook(self: &Arc<Self>, link: &Arc<MasterLink>) -> RemountHook {
        let node = self.clone();
        let link = link.clone();
        Arc::new(move || {
            let node = node.clone();
            let link = link.clone();
            Box::pin(async move {
                if let Err(e) = node.mount_all(&link).await {
                    tracing::warn!(error = %e, "re-mount failed");
                }
            })
        })
    }

    /// Waits until the data plane has stopped (after the shutdown token fired
    /// and in-flight requests finished).
    pub async fn stopped(&self) {
        self.tasks.wait().await;
    }
}
