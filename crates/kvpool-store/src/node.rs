//! A data node: a TCP data-plane server over one or more segments, and their
//! mounting on the master. `kvpool store` runs one; a client that lends
//! memory embeds one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use kvpool_format::scan::{ScanStats, REGION_ALIGN};
use kvpool_format::DATA_BASE;
use kvpool_net::auth::Security;
use kvpool_net::master::RemountHook;
use kvpool_net::MasterLink;
use kvpool_proto::frame::Limits;
use kvpool_proto::limits::{batch_chunks, ITEM_OVERHEAD};
use kvpool_proto::msg::{
    InventoryItem, InventoryVerdict, MountSegment, ReportObjects, SegmentId, SegmentInfo,
    SegmentIo, Tier, UnmountSegment,
};
use kvpool_proto::{Code, KvError, KvResult};
use kvpool_transfer::data::{serve_data, serve_data_unix, SegmentTable};
use kvpool_transfer::{DiskFile, MappedRegion};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::lent::LentMedium;
use crate::metrics::Recovery;

/// Inventory parts sent before the first is answered.
const REPORTS_IN_FLIGHT: usize = 4;

/// A segment this node lends: what the master is told, its proof of
/// possession, and its bytes.
#[derive(Clone)]
struct Lent {
    info: SegmentInfo,
    possession: [u8; 16],
    medium: Arc<dyn LentMedium>,
    /// Holds nothing yet (created zeroed, never mounted): its first mount
    /// skips the scan. Shared by the clones each mount takes.
    blank: Arc<AtomicBool>,
}

/// A running data-plane server and the segments it lends.
pub struct DataNode {
    table: Arc<SegmentTable>,
    endpoint: String,
    segments: Mutex<Vec<Lent>>,
    /// Names of the disk segments withdrawn after an I/O error.
    withdrawn: Mutex<Vec<String>>,
    recovery: Arc<Recovery>,
    tasks: TaskTracker,
}

impl DataNode {
    /// Binds the data plane on `address:port` (port 0 picks one) and starts
    /// serving until `shutdown`, authenticating peers as `security` says.
    /// Refuses a non-loopback address without a secret unless insecure.
    pub async fn bind(
        address: &str,
        port: u16,
        security: &Security,
        shutdown: CancellationToken,
    ) -> std::io::Result<Arc<DataNode>> {
        Self::bind_with(address, port, security, shutdown, |_| {}).await
    }

    /// [`DataNode::bind`], running `setup` (which adds segments) before the
    /// first connection is served: a store restarting on a known endpoint
    /// must never answer a client "segment not served here" for its own
    /// segment. (The chaos harness saw exactly that, from a store that had
    /// bound its port but not yet added its segment.)
    pub async fn bind_with(
        address: &str,
        port: u16,
        security: &Security,
        shutdown: CancellationToken,
        setup: impl FnOnce(&DataNode),
    ) -> std::io::Result<Arc<DataNode>> {
        let listener = TcpListener::bind((address, port)).await?;
        let local = listener.local_addr()?;
        security
            .check_listen(local.ip(), "the data plane")
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.message))?;
        let node = DataNode {
            table: Arc::new(SegmentTable::default()),
            endpoint: local.to_string(),
            segments: Mutex::new(Vec::new()),
            withdrawn: Mutex::new(Vec::new()),
            recovery: Arc::default(),
            tasks: TaskTracker::new(),
        };
        setup(&node);
        // Same-host clients that cannot map a segment skip the TCP stack.
        if let Some(unix) = kvpool_net::local::listen(kvpool_net::local::STORE, &node.endpoint) {
            node.tasks.spawn(serve_data_unix(
                unix,
                node.table.clone(),
                Limits::default(),
                security.clone(),
                shutdown.clone(),
            ));
        }
        node.tasks.spawn(serve_data(
            listener,
            node.table.clone(),
            Limits::default(),
            security.clone(),
            shutdown,
        ));
        node.tasks.close();
        Ok(Arc::new(node))
    }

    /// The data plane's counters.
    pub fn table_metrics(&self) -> &Arc<kvpool_transfer::metrics::DataMetrics> {
        self.table.metrics()
    }

    /// What the scans that mounted this node's segments found.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Each disk segment this node lent, by name, and whether it still
    /// serves (false: withdrawn after an I/O error).
    pub fn disk_states(&self) -> Vec<(String, bool)> {
        let segs = self.segments.lock();
        let serving = segs
            .iter()
            .filter(|l| l.medium.tier() == Tier::Disk)
            .map(|l| (l.info.name.clone(), true));
        let withdrawn = self.withdrawn.lock();
        serving
            .chain(withdrawn.iter().map(|n| (n.clone(), false)))
            .collect()
    }

    /// `host:port` clients use to reach this node.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Serves `region` as segment `id`, object area starting at `base`,
    /// proving `possession` when mounting it.
    pub fn add_segment(
        &self,
        id: SegmentId,
        possession: [u8; 16],
        name: &str,
        region: Arc<MappedRegion>,
        base: u64,
    ) -> SegmentInfo {
        let info = self.lend(id, possession, name.to_string(), region, base);
        self.table.describe(|a| a.segments.push(info.clone()));
        info
    }

    /// Serves `medium` as segment `id` (object area from `base`) and keeps
    /// it to mount, proving `possession`.
    fn lend(
        &self,
        id: SegmentId,
        possession: [u8; 16],
        name: String,
        medium: Arc<dyn LentMedium>,
        base: u64,
    ) -> SegmentInfo {
        let info = SegmentInfo {
            id,
            name,
            endpoint: self.endpoint.clone(),
            base,
            size: medium.len().saturating_sub(base),
            path: medium.path(),
            tier: medium.tier(),
        };
        medium.clone().serve(&self.table, id, base);
        self.segments.lock().push(Lent {
            info: info.clone(),
            possession,
            blank: Arc::new(AtomicBool::new(medium.fresh())),
            medium,
        });
        info
    }

    /// Names the master this node's segments are mounted on, for the
    /// `StoreAbout` answer (an engine attaching to this store asks it).
    pub fn set_master(&self, master: &str) {
        self.table.describe(|a| a.master = master.to_string());
    }

    /// The segments this node serves, as mounted.
    pub fn segment_infos(&self) -> Vec<SegmentInfo> {
        self.segments
            .lock()
            .iter()
            .map(|l| l.info.clone())
            .collect()
    }

    /// Withdraws segment `id` from the master and stops serving it; its
    /// objects with no other replica are gone. `None` if it is not here.
    pub async fn remove_segment(&self, link: &MasterLink, id: SegmentId) -> Option<SegmentInfo> {
        let lent = {
            let mut segs = self.segments.lock();
            let at = segs.iter().position(|l| l.info.id == id)?;
            segs.remove(at)
        };
        let _ = link
            .call_once(&UnmountSegment {
                client_id: link.client_id(),
                segment: id,
            })
            .await;
        self.table.remove(id);
        self.table.describe(|a| a.segments.retain(|s| s.id != id));
        Some(lent.info)
    }

    /// Serves a segment mapped from `len` bytes at `offset` of the file at
    /// `path` (created or extended as needed), named `name`, and mounts it.
    /// The file is the caller's: its bytes become object storage.
    pub async fn mount_file(
        &self,
        link: &MasterLink,
        name: &str,
        path: &std::path::Path,
        offset: u64,
        len: u64,
    ) -> KvResult<SegmentInfo> {
        let region = MappedRegion::file_range(path, offset, len).map_err(|e| {
            KvError::new(
                Code::InvalidParams,
                format!("cannot map {}: {e}", path.display()),
            )
        })?;
        let (id, possession) = crate::segment::new_identity();
        let info = self.add_segment(id, possession, name, Arc::new(region), DATA_BASE);
        let lent = self.lent(id)?;
        mount_one(link, lent, &self.table, &self.recovery).await?;
        Ok(info)
    }

    /// Serves and mounts a new anonymous segment of `size` bytes.
    pub async fn mount_anonymous(
        &self,
        link: &MasterLink,
        name: &str,
        size: u64,
    ) -> KvResult<SegmentInfo> {
        let info = self.add_anonymous_segment(name, size).map_err(|e| {
            KvError::new(Code::InternalError, format!("cannot map {size} bytes: {e}"))
        })?;
        let lent = self.lent(info.id)?;
        mount_one(link, lent, &self.table, &self.recovery).await?;
        Ok(info)
    }

    fn lent(&self, id: SegmentId) -> KvResult<Lent> {
        self.segments
            .lock()
            .iter()
            .find(|l| l.info.id == id)
            .cloned()
            .ok_or_else(|| KvError::from(Code::SegmentNotFound))
    }

    /// Serves the disk-tier file `file` as segment `id` (object area from
    /// `base`), proving `possession` when mounting it. Clients read it over
    /// TCP; only the master's tier moves write to it.
    pub fn add_disk_segment(
        &self,
        id: SegmentId,
        possession: [u8; 16],
        name: &str,
        file: Arc<DiskFile>,
        base: u64,
    ) -> SegmentInfo {
        self.lend(id, possession, format!("{name}/disk"), file, base)
    }

    /// The I/O of this node's disk segments since they opened.
    pub fn io(&self) -> Vec<SegmentIo> {
        self.segments
            .lock()
            .iter()
            .filter_map(|l| l.medium.io(l.info.id))
            .collect()
    }

    /// Withdraws the disk segments an I/O error took offline: the master
    /// forgets their objects (they cannot be read any more) and this node
    /// stops serving them; memory segments keep serving. Returns how many.
    pub async fn withdraw_failed_disks(&self, link: &MasterLink) -> usize {
        let failed: Vec<SegmentId> = {
            let mut lent = self.segments.lock();
            let (failed, kept) = std::mem::take(&mut *lent)
                .into_iter()
                .partition::<Vec<_>, _>(|l| l.medium.failed());
            *lent = kept;
            (self.withdrawn.lock()).extend(failed.iter().map(|l| l.info.name.clone()));
            failed.iter().map(|l| l.info.id).collect()
        };
        for &segment in &failed {
            tracing::error!(%segment, "withdrawing the failed disk tier from the pool");
            let _ = link
                .call_once(&UnmountSegment {
                    client_id: link.client_id(),
                    segment,
                })
                .await;
            self.table.remove_disk(segment);
        }
        failed.len()
    }

    /// Serves an anonymous in-process segment of `size` bytes (embedded store).
    pub fn add_anonymous_segment(&self, name: &str, size: u64) -> std::io::Result<SegmentInfo> {
        let region = Arc::new(MappedRegion::anonymous(size)?);
        let (id, possession) = crate::segment::new_identity();
        Ok(self.add_segment(id, possession, name, region, DATA_BASE))
    }

    /// Mounts every segment on the master (again, after a re-register),
    /// reporting the objects each one already holds so they are readable
    /// again (restart recovery).
    pub async fn mount_all(&self, link: &MasterLink) -> KvResult<()> {
        let segments = self.segments.lock().clone();
        for lent in segments {
            mount_one(link, lent, &self.table, &self.recovery).await?;
        }
        Ok(())
    }

    /// Asks the master to place nothing new on this node's segments, keeping
    /// their objects (best effort, before a restart). Each drain proves the
    /// segment's secret; a master older than protocol 7 does not know that
    /// request (`NOT_SUPPORTED`, nothing sent) and is asked the old way, by
    /// name.
    pub async fn drain_all(&self, link: &MasterLink) {
        let own: Vec<(SegmentId, [u8; 16])> = (self.segments.lock().iter())
            .map(|s| (s.info.id, s.possession))
            .collect();
        for (segment, possession) in own {
            let req = kvpool_proto::msg::DrainOwn {
                segment,
                possession,
            };
            if let Err(e) = link.call_once(&req).await {
                if e.code == Code::NotSupported {
                    let old = kvpool_proto::msg::DrainSegment {
                        segment: segment.to_string(),
                        unmount_after_ms: None,
                    };
                    let _ = link.call_once(&old).await;
                }
            }
        }
    }

    /// Withdraws every segment from the master (best effort, on shutdown).
    pub async fn unmount_all(&self, link: &MasterLink) {
        let ids: Vec<SegmentId> = self.segments.lock().iter().map(|s| s.info.id).collect();
        for segment in ids {
            let _ = link
                .call_once(&UnmountSegment {
                    client_id: link.client_id(),
                    segment,
                })
                .await;
        }
    }

    /// The regions this node holds back from the pool, as `(segment,
    /// offset, len)`, for every heartbeat (see `SegmentTable::held`).
    pub fn held(&self) -> Vec<(SegmentId, u64, u64)> {
        self.table.held()
    }

    /// A heartbeat hook that mounts this node's segments again.
    pub fn remount_hook(self: &Arc<Self>, link: &Arc<MasterLink>) -> RemountHook {
        let node = self.clone();
        let link = link.clone();
        Arc::new(move || {
            let node = node.clone();
            let link = link.clone();
            Box::pin(async move {
                match node.mount_all(&link).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(error = %e, "re-mount failed; trying again on the next heartbeat");
                        false
                    }
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

/// How long a segment's scan is waited for before the segment is mounted
/// without it (see `mount_one`): small and empty segments mount with their
/// exact inventory, as before, and open at once.
const QUICK_SCAN: std::time::Duration = std::time::Duration::from_millis(200);

/// How long the last part of an inventory waits for its answer: the master
/// then reconciles the whole inventory (25 s for 10M objects on a busy
/// 2-core machine). Sent again after the usual 10 s, it found the master
/// still reconciling; masters before this build reconciled the part sent
/// again alone, rejecting its objects, which the store then destroyed (now
/// they refuse it, and the store mounts again once the reconcile is over,
/// reporting the whole inventory twice). Not longer: a master paused
/// meanwhile holds the store this long, and a new leader gives up on a
/// segment a client TTL and the store grace (40 s by default) after its
/// election.
const RECONCILE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Sends one part of a segment's inventory.
async fn report(
    link: &MasterLink,
    segment: SegmentId,
    objects: Vec<InventoryItem>,
    last: bool,
) -> KvResult<InventoryVerdict> {
    let req = ReportObjects {
        client_id: link.client_id(),
        segment,
        objects,
        last,
    };
    if !last {
        return link.call(&req).await;
    }
    let patient = kvpool_net::CallPolicy {
        timeout: RECONCILE_WAIT,
        retry_for: RECONCILE_WAIT,
        ..link.policy().clone()
    };
    link.call_with(&patient, &req).await
}

/// Scans one segment and mounts it (before the scan ends when it takes
/// longer than [`QUICK_SCAN`]), reports its inventory, invalidates what the
/// master rejects (removed, superseded or never committed objects), and
/// records what it found in `recovery`. Every mount is under
/// a fresh fence (see `kvpool_transfer::fence`), taken before the scan: no
/// write granted under an earlier mount lands after the scan, so the
/// inventory is all the segment holds but the regions held back, which it
/// leaves out.
async fn mount_one(
    link: &MasterLink,
    lent: Lent,
    table: &Arc<SegmentTable>,
    recovery: &Recovery,
) -> KvResult<()> {
    let Lent {
        info,
        possession,
        medium,
        blank,
    } = lent;
    // A segment created zeroed holds nothing: a scan would read every page
    // of it (1.4 s for 8 GiB on this VM) before the pool could use it. Only
    // the first attempt skips it: once a mount may have reached the master,
    // writes may have landed.
    let blank = blank.swap(false, Ordering::SeqCst);
    let t0 = std::time::Instant::now();
    // The fence may wait for writers: off the runtime's workers.
    let (fence, held) = {
        let (id, table) = (info.id, table.clone());
        tokio::task::spawn_blocking(move || table.refence(id))
            .await
            .map_err(|e| KvError::new(Code::InternalError, format!("refence failed: {e}")))?
            .ok_or_else(|| KvError::from(Code::SegmentNotFound))?
    };
    let (id, tier, base) = (info.id, info.tier, info.base);
    // A scan of a big segment takes seconds: off the runtime's workers too.
    let mut scan = {
        let medium = medium.clone();
        let held = held.clone();
        tokio::task::spawn_blocking(move || {
            if blank {
                return Ok((Vec::new(), ScanStats::default()));
            }
            let (mut found, stats) = medium.scan(base)?;
            // A held region's bytes are a copy nobody will commit.
            found.retain(|f| {
                let end = f.offset + f.region_len;
                !held.iter().any(|&(o, l)| f.offset < o + l && o < end)
            });
            Ok((found, stats))
        })
    };
    let joined = |r: Result<std::io::Result<_>, tokio::task::JoinError>| {
        r.map_err(|e| KvError::new(Code::InternalError, format!("segment scan failed: {e}")))?
            .map_err(|e| KvError::new(Code::TransferFail, format!("segment scan failed: {e}")))
    };
    // A scan that outlasts QUICK_SCAN is not waited for: the segment is
    // mounted announcing as many objects as it could hold (each takes at
    // least one aligned region), so the master points readers at this
    // process at once (its endpoint may be new after a restart) and keeps
    // the objects it knew readable, placing nothing new here until the
    // inventory is in. Mounting after every scan left a restarted store's
    // objects unreadable for as long as its scan took (3.5 s at 10M).
    let quick = match tokio::time::timeout(QUICK_SCAN, &mut scan).await {
        Ok(r) => Some(joined(r)?),
        Err(_) => None,
    };
    let objects = quick
        .as_ref()
        .map_or(info.size / REGION_ALIGN, |(found, _)| found.len() as u64);
    let r = link
        .call(&MountSegment {
            client_id: link.client_id(),
            segment: info,
            objects,
            scan_age_ms: t0.elapsed().as_millis() as u64,
            possession,
            fence,
            held,
        })
        .await;
    match r {
        Ok(()) => {}
        Err(e) if e.code == Code::SegmentAlreadyExists => return Ok(()),
        Err(e) => return Err(e),
    }
    let (found, stats) = match quick {
        Some(done) => done,
        None => joined(scan.await)?,
    };
    let scanned = t0.elapsed();
    if objects == 0 {
        recovery.record(tier, &stats, 0, 0, scanned);
        return Ok(());
    }
    let items: Vec<InventoryItem> = found
        .into_iter()
        .map(|f| InventoryItem {
            key: f.key,
            generation: f.generation,
            value_len: f.value_len,
            offset: f.offset,
            region_len: f.region_len,
        })
        .collect();
    // Parts within the master's limits: at most MAX_BATCH_KEYS objects and
    // half the message limit of keys each. Several parts in flight, so this
    // process encodes while the master decodes; the last part, which makes
    // the master reconcile, only once every other one has arrived.
    let mut chunks = batch_chunks(&items, |i| i.key.len() + ITEM_OVERHEAD);
    let last = chunks.pop().unwrap_or(0..0);
    let mut parts = futures::stream::iter(chunks.into_iter().map(|r| items[r].to_vec()))
        .map(|part| report(link, id, part, false))
        .buffer_unordered(REPORTS_IN_FLIGHT);
    while let Some(r) = parts.next().await {
        r?;
    }
    let last = items[last].to_vec();
    let InventoryVerdict { accepted, rejected } = report(link, id, last, true).await?;
    let invalidated = medium.invalidate(rejected).await;
    recovery.record(tier, &stats, accepted, invalidated as u64, scanned);
    tracing::info!(
        segment = %id,
        found = stats.objects,
        torn = stats.torn,
        accepted,
        invalidated,
        scan_ms = scanned.as_millis() as u64,
        total_ms = t0.elapsed().as_millis() as u64,
        "segment mounted with its objects"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpool_net::FramedConn;
    use kvpool_proto::msg::ReadReq;
    use kvpool_transfer::data::{read_regions, ReadOp};

    /// Reads 64 bytes of `segment` at `addr` on a runtime of its own.
    fn read_from(addr: String, segment: SegmentId) -> KvResult<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let mut c = FramedConn::connect(&addr, "test", Limits::default()).await?;
            let mut buf = [0u8; 64];
            let req = ReadReq {
                segment,
                offset: DATA_BASE,
                len: 64,
                grant: None,
            };
            let ops = vec![ReadOp {
                req,
                dst: vec![&mut buf[..]],
            }];
            read_regions(&mut c, ops).await?.remove(0)
        })
    }

    /// A client that connects while a restarting store is still adding its
    /// segment is served once the segment is in, never told "not served
    /// here" (the chaos harness saw that answer reach clients).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_segment_added_at_bind_is_served_from_the_first_connection() {
        let token = CancellationToken::new();
        let region = Arc::new(MappedRegion::anonymous(1 << 20).expect("memory"));
        let id = SegmentId(7);
        let mut reader = None;
        let node = DataNode::bind_with(
            "127.0.0.1",
            0,
            &Security::default(),
            token.clone(),
            |node| {
                let addr = node.endpoint().to_string();
                reader = Some(std::thread::spawn(move || read_from(addr, id)));
                // The reader connects and asks meanwhile.
                std::thread::sleep(std::time::Duration::from_millis(300));
                node.add_segment(id, [0; 16], "s", region.clone(), DATA_BASE);
            },
        )
        .await
        .expect("bind");
        let read = tokio::task::spawn_blocking(move || reader.expect("started").join())
            .await
            .expect("joined")
            .expect("the reader ran");
        assert!(read.is_ok(), "{read:?}");
        assert_eq!(node.endpoint().split(':').next(), Some("127.0.0.1"));
        token.cancel();
    }
}
