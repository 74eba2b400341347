//! Segments a client lends beyond the one it may lend at connect: more
//! anonymous memory, or a range of a file (Mooncake's
//! `allocate_and_mount_segment` and `mount_segment`), and taking them back
//! one at a time. They are served by the client's embedded data node,
//! which is made on first use.
//!
//! Also [`store_about`]: what a storage process on some address serves and
//! which master it answers to, for an engine that attaches to a local
//! store instead of lending memory itself.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvpool_net::auth::Security;
use kvpool_net::ConnPool;
use kvpool_proto::frame::Limits;
use kvpool_proto::msg::{SegmentId, SegmentInfo, StoreAbout, StoreAboutReply};
use kvpool_proto::{Code, KvError, KvResult};
use kvpool_store::DataNode;

use crate::{bind_node, Client};

/// Smallest segment worth mounting: the first 4 KiB are never used.
const MIN_SEGMENT: u64 = 2 * kvpool_format::DATA_BASE;

fn check_size(size: u64) -> KvResult<()> {
    if size < MIN_SEGMENT {
        return Err(KvError::new(
            Code::InvalidParams,
            format!("a segment needs at least {MIN_SEGMENT} bytes, got {size}"),
        ));
    }
    Ok(())
}

impl Client {
    /// The embedded data node, bound on first use.
    async fn node(&self) -> KvResult<Arc<DataNode>> {
        let inner = &self.inner;
        inner
            .node
            .get_or_try_init(|| bind_node(&inner.cfg, &inner.shutdown))
            .await
            .cloned()
    }

    /// Name for the `n`th segment this client lends: its hostname, then
    /// `hostname#2`, ... (segment names must be unique to be preferred).
    fn next_segment_name(&self, node: &DataNode) -> String {
        let have = node.segment_infos();
        let base = &self.inner.cfg.hostname;
        if !have.iter().any(|s| &s.name == base) {
            return base.clone();
        }
        (2..)
            .map(|n| format!("{base}#{n}"))
            .find(|name| !have.iter().any(|s| &s.name == name))
            .unwrap_or_else(|| base.clone())
    }

    /// Lends `size` more bytes of this process's memory to the pool, as a
    /// new segment; returns it as mounted.
    pub async fn mount_anonymous_segment(&self, size: u64) -> KvResult<SegmentInfo> {
        check_size(size)?;
        let node = self.node().await?;
        let name = self.next_segment_name(&node);
        node.mount_anonymous(&self.inner.link, &name, size).await
    }

    /// Lends `size` bytes at `offset` of the file at `path` (created or
    /// extended as needed) as a new segment; returns it as mounted.
    pub async fn mount_file_segment(
        &self,
        path: &Path,
        offset: u64,
        size: u64,
    ) -> KvResult<SegmentInfo> {
        check_size(size)?;
        let node = self.node().await?;
        let name = self.next_segment_name(&node);
        node.mount_file(&self.inner.link, &name, path, offset, size)
            .await
    }

    /// The segments this client lends now.
    pub fn lent_segments(&self) -> Vec<SegmentInfo> {
        self.inner
            .node
            .get()
            .map(|n| n.segment_infos())
            .unwrap_or_default()
    }

    /// Takes back a segment this client lends (its objects with no other
    /// replica are gone); `SEGMENT_NOT_FOUND` if it lends no such segment.
    pub async fn unmount_segment(&self, id: SegmentId) -> KvResult<SegmentInfo> {
        let node = self.inner.node.get().ok_or_else(|| {
            KvError::new(
                Code::SegmentNotFound,
                format!("this client lends no segment {id}"),
            )
        })?;
        node.remove_segment(&self.inner.link, id)
            .await
            .ok_or_else(|| {
                KvError::new(
                    Code::SegmentNotFound,
                    format!("this client lends no segment {id}"),
                )
            })
    }
}

/// Asks the data server at `endpoint` what it serves and which master it
/// answers to, within `timeout`.
pub async fn store_about(
    endpoint: &str,
    security: &Security,
    timeout: Duration,
) -> KvResult<StoreAboutReply> {
    let pool = ConnPool::new(endpoint, "client", Limits::default(), timeout, 1)
        .with_security(security.clone());
    match tokio::time::timeout(timeout, pool.call(&StoreAbout {})).await {
        Ok(r) => r,
        Err(_) => Err(KvError::new(
            Code::RpcTimeout,
            format!("{endpoint} did not answer within {timeout:?}"),
        )),
    }
}
