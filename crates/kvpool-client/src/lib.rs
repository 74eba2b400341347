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

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod cache;

pub use cache::CacheStats;
use cache::LocationCache;
use futures::future::join_all;
use kvpool_format::{header_len, value_checksum, ObjectHeader};
use kvpool_net::{CallPolicy, ConnPool, MasterLink};
use kvpool_proto::frame::Limits;
use kvpool_proto::msg::{
    self, ClientId, ClusterStatus, ObjectLocation, PutGrant, PutItem, ReadReq, Replica, WriteReq,
};
use kvpool_proto::{validate_key, Code, KvError, KvResult};
use kvpool_store::DataNode;
use kvpool_transfer::data::{read_regions_shared, write_regions, ReadOp, WriteOp};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use kvpool_proto::msg::ReplicateConfig;

/// Idle connections kept per store, enough for many concurrent callers.
const IDLE_CONNS_PER_STORE: usize = 64;
/// Batches whose bytes exceed this are spread over several connections per store.
const SPREAD_BYTES: u64 = 1 << 20;

/// How object bytes move between this client and the stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Always over the TCP data plane.
    Tcp,
    /// Always by mapping the store's segment file (same host only); a
    /// segment that cannot be mapped is an error.
    Shm,
    /// Shared memory for segments on this host that this process may map,
    /// TCP for the others.
    #[default]
    Auto,
}

impl std::str::FromStr for Protocol {
    type Err = KvError;

    fn from_str(s: &str) -> KvResult<Protocol> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" => Ok(Protocol::Tcp),
            "shm" => Ok(Protocol::Shm),
            "auto" | "" => Ok(Protocol::Auto),
            "rdma" => Err(KvError::new(
                Code::NotSupported,
                "the rdma transport is not available in this build",
            )),
            other => Err(KvError::new(
                Code::InvalidParams,
                format!("unknown protocol {other:?} (tcp, shm, auto)"),
            )),
        }
    }
}

/// A store's segment file mapped into this process.
struct ShmMap {
    region: Arc<kvpool_transfer::MappedRegion>,
    /// Start of the object area; nothing below it is ever written.
    base: u64,
}

impl ShmMap {
    fn check(&self, offset: u64, len: u64) -> KvResult<()> {
        if offset < self.base || !self.region.contains(offset, len) {
            return Err(KvError::new(
                Code::InvalidParams,
                format!("range {offset}+{len} outside the mapped segment"),
            ));
        }
        Ok(())
    }

    /// Copies the concatenation of `parts` to `offset`.
    fn write(&self, offset: u64, parts: &[&[u8]]) -> KvResult<()> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        self.check(offset, len)?;
        // SAFETY: in bounds (checked); the master gave this region to this put alone.
        let dst = unsafe { self.region.slice_mut(offset, len) };
        let mut at = 0;
        for p in parts {
            dst[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        Ok(())
    }

    /// Fills `dst` in order from `offset`.
    fn read(&self, offset: u64, dst: &mut [&mut [u8]]) -> KvResult<()> {
        let len: u64 = dst.iter().map(|d| d.len() as u64).sum();
        self.check(offset, len)?;
        // SAFETY: in bounds (checked); a concurrent rewrite of the region is
        // caught by the header and checksum verification that follows.
        let src = unsafe { self.region.slice(offset, len) };
        let mut at = 0;
        for d in dst.iter_mut() {
            d.copy_from_slice(&src[at..at + d.len()]);
            at += d.len();
        }
        Ok(())
    }
}

type ShmMaps = HashMap<kvpool_proto::msg::SegmentId, Option<Arc<ShmMap>>>;

/// The id in a mapped segment's superblock, if it is a valid kvpool segment
/// of the mapping's size (how a path is known to be the segment it was
/// named for before any object is read or written through it).
fn mapped_segment_id(
    region: &kvpool_transfer::MappedRegion,
) -> Option<kvpool_proto::msg::SegmentId> {
    if region.len() < kvpool_format::DATA_BASE {
        return None;
    }
    // SAFETY: in bounds (checked above); the superblock is written once when
    // the store creates the segment.
    let sb = unsafe { region.slice(0, kvpool_format::DATA_BASE) };
    kvpool_format::segment_id(sb, region.len())
}

/// Settings of a client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Master RPC address `host:port`.
    pub master: String,
    /// Name of this client (and of its embedded segment).
    pub hostname: String,
    /// Limit for each master call attempt and each transfer.
    pub timeout: Duration,
    /// Most extra attempts after transient failures (master calls, and keys
    /// whose store was unreachable or busy).
    pub retries: u32,
    /// Transient failures are retried only while the call is younger than
    /// this: long enough to ride out a store restart or a master failover.
    pub retry_for: Duration,
    /// Connections one big batch uses in parallel per store.
    pub conns_per_store: usize,
    /// Bytes to lend to the pool from this process (0 = pure client).
    pub segment_size: u64,
    /// IP the embedded segment's data plane binds and advertises.
    pub segment_address: String,
    /// Transport for object bytes.
    pub protocol: Protocol,
    /// Keys whose locations are remembered for one-round-trip repeat reads
    /// (0 turns the location cache off).
    pub location_cache: usize,
}

impl ClientConfig {
    /// Defaults for a client of the master at `master`.
    pub fn new(master: &str) -> Self {
        ClientConfig {
            master: master.to_string(),
            hostname: "127.0.0.1".into(),
            timeout: Duration::from_secs(10),
            retries: 50,
            retry_for: Duration::from_secs(10),
            conns_per_store: 4,
            segment_size: 0,
            segment_address: "127.0.0.1".into(),
            protocol: Protocol::Auto,
            location_cache: 65_536,
        }
    }
}

/// One object to read into caller memory.
pub struct GetInto<'a> {
    /// The key.
    pub key: &'a str,
    /// Destination buffers; the value fills them in order and must fit.
    pub dst: Vec<&'a mut [u8]>,
}

impl<'a> GetInto<'a> {
    /// One item per key, each reading into the whole buffer at its position.
    pub fn each<K: AsRef<str>>(keys: &'a [K], bufs: &'a mut [Vec<u8>]) -> Vec<GetInto<'a>> {
        keys.iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| GetInto {
                key: k.as_ref(),
                dst: vec![&mut b[..]],
            })
            .collect()
    }
}

/// An object located by [`Client::locate`], holding its read lease: the
/// first half of a get whose caller must size the destination first (a
/// Python `bytes`, say) and then read straight into it.
pub struct Located {
    key: String,
    found: Found,
}

impl Located {
    /// Value bytes the destination must hold.
    pub fn value_len(&self) -> usize {
        self.found.location.value_len as usize
    }
}

/// A location to read from.
struct Found {
    location: ObjectLocation,
    /// When the read lease began (when the master was asked, or the read
    /// it extended happened).
    lease_from: Instant,
    via: Via,
}

/// Where a location came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The master, just now.
    Master,
    /// The location cache, under a lease still young.
    Cache,
    /// The location cache, without a live lease: read while the master
    /// confirms it (see [`Client::read_found`]).
    Hint,
}

/// Which of `found` came from the location cache (on failure: ask the
/// master again at once).
fn cached_flags(found: &[KvResult<Found>]) -> Vec<bool> {
    found
        .iter()
        .map(|f| f.as_ref().is_ok_and(|f| f.via != Via::Master))
        .collect()
}

/// Reborrows the items at `at` (ascending indexes) for another pass.
fn reborrow<'a>(items: &'a mut [GetInto<'_>], at: &[usize]) -> Vec<GetInto<'a>> {
    items
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| at.binary_search(i).is_ok())
        .map(|(_, it)| GetInto {
            key: it.key,
            dst: it.dst.iter_mut().map(|d| &mut **d).collect(),
        })
        .collect()
}

/// A connected client. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: ClientConfig,
    link: Arc<MasterLink>,
    stores: Mutex<HashMap<String, Arc<ConnPool>>>,
    /// Segments mapped for the shared-memory transport (`None`: not mappable
    /// from here, use TCP).
    shm: Mutex<ShmMaps>,
    node: Option<Arc<DataNode>>,
    cache: Arc<LocationCache>,
    /// Big batches in flight: only a lone one spreads over threads.
    big_calls: AtomicUsize,
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
        )?;
        let reply = link.register().await?;
        let shutdown = CancellationToken::new();
        let node = if cfg.segment_size > 0 {
            let node = DataNode::bind(&cfg.segment_address, 0, shutdown.clone())
                .await
                .map_err(|e| KvError::new(Code::InternalError, format!("embedded segment: {e}")))?;
            node.add_anonymous_segment(&cfg.hostname, cfg.segment_size)
                .map_err(|e| KvError::new(Code::InternalError, format!("embedded segment: {e}")))?;
            node.mount_all(&link).await?;
            Some(node)
        } else {
            None
        };
        let remount = match &node {
            Some(n) => n.remount_hook(&link),
            None => Arc::new(|| Box::pin(async { true }) as _),
        };
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
                stores: Mutex::new(HashMap::new()),
                shm: Mutex::new(HashMap::new()),
                node,
                cache,
                big_calls: AtomicUsize::new(0),
                cfg,
                shutdown,
            }),
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// How the location cache has served reads so far.
    pub fn cache_stats(&self) -> CacheStats {
        self.inner.cache.stats()
    }

    /// Withdraws the embedded segment and stops background work.
    pub async fn close(&self) {
        if let Some(node) = &self.inner.node {
            node.unmount_all(&self.inner.link).await;
        }
        self.inner.shutdown.cancel();
    }

    /// The shared-memory mappings for `segments` (mapping new ones when the
    /// protocol allows): a segment is mapped only if its file can be opened
    /// here and its superblock names that very segment, which is what makes
    /// it the same host, whatever the host names say.
    async fn shm_maps(&self, wanted: Vec<kvpool_proto::msg::SegmentId>) -> ShmMaps {
        if self.inner.cfg.protocol == Protocol::Tcp {
            return ShmMaps::new();
        }
        let unknown = {
            let known = self.inner.shm.lock();
            wanted.iter().any(|s| !known.contains_key(s))
        };
        if unknown {
            let infos = self.status().await.map(|s| s.segments).unwrap_or_default();
            let mut known = self.inner.shm.lock();
            for id in &wanted {
                if known.contains_key(id) {
                    continue;
                }
                let Some(info) = infos.iter().find(|s| s.info.id == *id).map(|s| &s.info) else {
                    continue;
                };
                let mapped = info.path.as_deref().and_then(|path| {
                    let region = kvpool_transfer::MappedRegion::open_existing(std::path::Path::new(path))
                        .map_err(|e| tracing::debug!(%path, error = %e, "segment not mappable; using tcp"))
                        .ok()?;
                    (mapped_segment_id(&region) == Some(*id)).then(|| {
                        tracing::debug!(segment = %id, %path, "reaching segment through shared memory");
                        let region = Arc::new(region);
                        let r = region.clone();
                        std::thread::spawn(move || r.prefault());
                        Arc::new(ShmMap {
                            region,
                            base: info.base,
                        })
                    })
                });
                known.insert(*id, mapped);
            }
        }
        let known = self.inner.shm.lock();
        wanted
            .into_iter()
            .map(|id| (id, known.get(&id).cloned().flatten()))
            .collect()
    }

    /// The error for a segment `protocol = shm` cannot reach.
    fn not_mappable(segment: kvpool_proto::msg::SegmentId) -> KvError {
        KvError::new(
            Code::TransferFail,
            format!("segment {segment} cannot be mapped from this process (protocol shm)"),
        )
    }

    fn pool(&self, endpoint: &str) -> Arc<ConnPool> {
        let mut stores = self.inner.stores.lock();
        stores
            .entry(endpoint.to_string())
            .or_insert_with(|| {
                Arc::new(ConnPool::new(
                    endpoint,
                    "client",
                    Limits::default(),
                    self.inner.cfg.timeout,
                    IDLE_CONNS_PER_STORE,
                ))
            })
            .clone()
    }

    // ------------------------------------------------------------ puts

    /// Stores `value` under `key`; an existing key is kept (write-once, success).
    pub async fn put(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> KvResult<()> {
        self.put_parts(key, &[value], config).await
    }

    /// Stores the concatenation of `parts` under `key` (write-once).
    pub async fn put_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        config: &ReplicateConfig,
    ) -> KvResult<()> {
        one(self.batch_put(&[(key, parts)], config, false).await)
    }

    /// Stores `value` under `key`, replacing any existing value.
    pub async fn upsert(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> KvResult<()> {
        one(self.batch_put(&[(key, &[value])], config, true).await)
    }

    /// Stores many objects (each the concatenation of its parts); one result
    /// per key, in order. `upsert` replaces existing values.
    pub async fn batch_put(
        &self,
        items: &[(&str, &[&[u8]])],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<KvResult<()>> {
        // Another writer holding a key, or a store restarting, is worth a retry.
        let mut retry = KeyRetry::new(items.len(), &self.inner.cfg);
        loop {
            let round: Vec<(&str, &[&[u8]])> = retry.todo().iter().map(|&i| items[i]).collect();
            let out = self.put_round(&round, config, upsert).await;
            if !retry.settle(out).await {
                return retry.finish();
            }
        }
    }

    async fn put_round(
        &self,
        items: &[(&str, &[&[u8]])],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<KvResult<()>> {
        let mut results: Vec<KvResult<()>> = Vec::with_capacity(items.len());
        let mut put_items = Vec::with_capacity(items.len());
        let mut index = Vec::with_capacity(items.len());
        for (i, (key, parts)) in items.iter().enumerate() {
            match validate_key(key) {
                Ok(()) => {
                    let value_len: u64 = parts.iter().map(|p| p.len() as u64).sum();
                    put_items.push(PutItem {
                        key: key.to_string(),
                        value_len,
                        region_len: header_len(key.len()) as u64 + value_len,
                    });
                    index.push(i);
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if put_items.is_empty() {
            return results;
        }
        let grants = self
            .inner
            .link
            .call(&msg::PutStart {
                client_id: self.inner.link.client_id(),
                items: put_items,
                config: config.clone(),
                upsert,
            })
            .await;
        // Object headers must outlive the writes that borrow them.
        let mut headers: Vec<(usize, u64, Vec<u8>, Vec<Replica>)> = Vec::new();
        let mut granted = Vec::new();
        for (&i, g) in index.iter().zip(per_key(grants, index.len())) {
            match g {
                Ok(PutGrant::Exists) => {}
                Ok(PutGrant::Write {
                    generation,
                    replicas,
                }) => granted.push((i, generation, replicas)),
                Err(e) => results[i] = Err(e),
            }
        }
        let sums = checksums(granted.iter().map(|g| items[g.0].1).collect());
        for ((i, generation, replicas), checksum) in granted.into_iter().zip(sums) {
            let (key, parts) = items[i];
            let h = ObjectHeader {
                key: key.to_string(),
                value_len: parts.iter().map(|p| p.len() as u64).sum(),
                generation,
                checksum,
            };
            headers.push((i, generation, h.encode(), replicas));
        }
        let mut ops: Vec<(usize, String, WriteOp)> = Vec::new();
        for (i, _, head, replicas) in &headers {
            for r in replicas {
                let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + items[*i].1.len());
                parts.push(head);
                parts.extend_from_slice(items[*i].1);
                ops.push((
                    *i,
                    r.endpoint.clone(),
                    WriteOp {
                        req: WriteReq {
                            segment: r.segment,
                            offset: r.offset,
                        },
                        parts,
                    },
                ));
            }
        }
        for (i, r) in self.run_writes(ops).await {
            if let Err(e) = r {
                if results[i].is_ok() {
                    results[i] = Err(e);
                }
            }
        }
        let (mut commit, mut revoke) = (Vec::new(), Vec::new());
        for (h, (i, generation, _, _)) in headers.iter().enumerate() {
            let key = items[*i].0.to_string();
            if results[*i].is_ok() {
                commit.push((
                    h,
                    msg::PutEndItem {
                        key,
                        generation: *generation,
                    },
                ));
            } else {
                revoke.push(key);
            }
        }
        if !revoke.is_empty() {
            // Best effort: the master also revokes puts that are never ended.
            let _ = self
                .inner
                .link
                .call(&msg::PutRevoke {
                    client_id: self.inner.link.client_id(),
                    keys: revoke,
                })
                .await;
        }
        if !commit.is_empty() {
            let r = self
                .inner
                .link
                .call(&msg::PutEnd {
                    client_id: self.inner.link.client_id(),
                    items: commit.iter().map(|(_, c)| c.clone()).collect(),
                })
                .await;
            for ((h, _), r) in commit.iter().zip(per_key(r, commit.len())) {
                let (i, generation, _, replicas) = &headers[*h];
                if r.is_ok() {
                    // A put is often read back soon: where it went is a hint.
                    let location = ObjectLocation {
                        value_len: items[*i].1.iter().map(|p| p.len() as u64).sum(),
                        generation: *generation,
                        lease_ms: 0,
                        replicas: replicas.clone(),
                    };
                    self.inner.cache.insert(items[*i].0, location, None);
                }
                results[*i] = r.map_err(|e| match e.code {
                    // The put vanished before its commit (the master restarted or
                    // failed over, or the put timed out): write it again.
                    Code::ObjectNotFound => KvError::new(
                        Code::UnavailableInCurrentStatus,
                        format!("put was lost before its commit: {}", e.message),
                    ),
                    _ => e,
                });
            }
        }
        results
    }

    /// Runs writes grouped by store, each group pipelined, groups (and big
    /// groups' chunks) in parallel. Returns (item index, result) per op.
    async fn run_writes<'a>(
        &self,
        ops: Vec<(usize, String, WriteOp<'a>)>,
    ) -> Vec<(usize, KvResult<()>)> {
        let shm = self
            .shm_maps(ops.iter().map(|(_, _, o)| o.req.segment).collect())
            .await;
        let forced = self.inner.cfg.protocol == Protocol::Shm;
        let mut done = Vec::new();
        let mut groups: HashMap<String, Vec<(usize, WriteOp<'a>)>> = HashMap::new();
        let (mut local, mut local_bytes) = (Vec::new(), 0);
        for (i, ep, op) in ops {
            match shm.get(&op.req.segment).and_then(|m| m.as_ref()) {
                Some(map) => {
                    local_bytes += op.parts.iter().map(|p| p.len() as u64).sum::<u64>();
                    local.push((i, map.clone(), op));
                }
                None if forced => done.push((i, Err(Self::not_mappable(op.req.segment)))),
                None => groups.entry(ep).or_default().push((i, op)),
            }
        }
        let mut jobs: Vec<WriteJob> = Vec::new();
        // Shared-memory writes are copies: big batches spread them too.
        for chunk in split(local, local_bytes, cores()) {
            jobs.push(Box::pin(async move {
                chunk
                    .into_iter()
                    .map(|(i, map, op)| (i, map.write(op.req.offset, &op.parts)))
                    .collect()
            }));
        }
        let mut total = local_bytes;
        for (ep, group) in groups {
            let bytes: u64 = group
                .iter()
                .flat_map(|(_, o)| o.parts.iter())
                .map(|p| p.len() as u64)
                .sum();
            total += bytes;
            for chunk in split(group, bytes, self.inner.cfg.conns_per_store) {
                let pool = self.pool(&ep);
                let timeout = self.inner.cfg.timeout;
                jobs.push(Box::pin(async move {
                    let (idx, wops): (Vec<usize>, Vec<WriteOp>) = chunk.into_iter().unzip();
                    let r = transfer(&pool, timeout, |mut c| async move {
                        let r = write_regions(&mut c, &wops).await;
                        (c, r)
                    })
                    .await;
                    spread(idx, r)
                }));
            }
        }
        done.extend(
            self.run_jobs(jobs, total >= SPREAD_BYTES)
                .await
                .into_iter()
                .flatten(),
        );
        done
    }

    // ------------------------------------------------------------ gets

    /// Reads `key`'s value into a new vector.
    pub async fn get(&self, key: &str) -> KvResult<Vec<u8>> {
        one(self.batch_get(&[key]).await)
    }

    /// Reads many values into new vectors; one result per key.
    pub async fn batch_get(&self, keys: &[&str]) -> Vec<KvResult<Vec<u8>>> {
        let mut retry = KeyRetry::new(keys.len(), &self.inner.cfg);
        loop {
            let round: Vec<&str> = retry.todo().iter().map(|&i| keys[i]).collect();
            let out = self.get_pass(&round).await;
            if !retry.settle(out).await {
                return retry.finish();
            }
        }
    }

    async fn get_pass(&self, keys: &[&str]) -> Vec<KvResult<Vec<u8>>> {
        let found = self.find(keys).await;
        let cached = cached_flags(&found);
        let mut out = self.read_new(keys, found).await;
        let stale = self.stale(keys, &cached, &out);
        if !stale.is_empty() {
            let again: Vec<&str> = stale.iter().map(|&i| keys[i]).collect();
            let found = self.locate_keys(&again).await;
            for (&i, r) in stale.iter().zip(self.read_new(&again, found).await) {
                out[i] = r;
            }
        }
        out
    }

    /// Reads located objects into new vectors.
    async fn read_new(&self, keys: &[&str], found: Vec<KvResult<Found>>) -> Vec<KvResult<Vec<u8>>> {
        let mut bufs: Vec<Vec<u8>> = found
            .iter()
            .map(|f| match f {
                Ok(f) => vec![0u8; f.location.value_len as usize],
                Err(_) => Vec::new(),
            })
            .collect();
        let mut items = GetInto::each(keys, &mut bufs);
        let res = self.read_found(&mut items, found).await;
        drop(items);
        res.into_iter()
            .zip(bufs)
            .map(|(r, b)| r.map(|_| b))
            .collect()
    }

    /// Indexes of reads through cached locations that failed; their
    /// locations are dropped.
    fn stale<T>(&self, keys: &[&str], cached: &[bool], res: &[KvResult<T>]) -> Vec<usize> {
        let stale: Vec<usize> = (0..res.len())
            .filter(|&i| {
                // Not found is the master's own answer (to a hint's check).
                cached.get(i) == Some(&true)
                    && res[i]
                        .as_ref()
                        .is_err_and(|e| e.code != Code::ObjectNotFound)
            })
            .collect();
        for &i in &stale {
            tracing::debug!(key = keys[i], "cached location is stale; asking the master");
            self.inner.cache.stale(keys[i]);
        }
        stale
    }

    /// Locates `key` (from the location cache, or one master round trip that
    /// takes the read lease). No retries: on a transient error, fall back to
    /// [`Self::get`].
    pub async fn locate(&self, key: &str) -> KvResult<Located> {
        one(self.locate_many(&[key]).await)
    }

    /// [`Self::locate`] for many keys: one master round trip for those not
    /// in the location cache.
    pub async fn locate_many(&self, keys: &[&str]) -> Vec<KvResult<Located>> {
        keys.iter()
            .zip(self.find(keys).await)
            .map(|(k, f)| {
                f.map(|found| Located {
                    key: k.to_string(),
                    found,
                })
            })
            .collect()
    }

    /// Reads a located object into `dst` (at least `value_len` bytes),
    /// verified like every read; returns the value length. A cached location
    /// that turned out stale is a transient error: fall back to [`Self::get`].
    pub async fn read_located_into(&self, l: Located, dst: &mut [u8]) -> KvResult<usize> {
        one(self.read_located_many(vec![(l, dst)]).await)
    }

    /// [`Self::read_located_into`] for many objects, transferred together.
    pub async fn read_located_many(
        &self,
        items: Vec<(Located, &mut [u8])>,
    ) -> Vec<KvResult<usize>> {
        let mut keys = Vec::with_capacity(items.len());
        let mut found = Vec::with_capacity(items.len());
        let mut dsts = Vec::with_capacity(items.len());
        for (l, dst) in items {
            keys.push(l.key);
            found.push(Ok(l.found));
            dsts.push(dst);
        }
        let cached = cached_flags(&found);
        let mut gets: Vec<GetInto> = keys
            .iter()
            .zip(dsts)
            .map(|(key, dst)| GetInto {
                key,
                dst: vec![dst],
            })
            .collect();
        let mut out = self.read_found(&mut gets, found).await;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        for i in self.stale(&refs, &cached, &out) {
            out[i] = Err(KvError::new(
                Code::UnavailableInCurrentStatus,
                format!("cached location of {:?} is stale", keys[i]),
            ));
        }
        out
    }

    /// Reads `key`'s value into `buf`; returns the value length. A buffer
    /// smaller than the value is `INVALID_PARAMS` and nothing is read.
    pub async fn get_into(&self, key: &str, buf: &mut [u8]) -> KvResult<usize> {
        let mut items = [GetInto {
            key,
            dst: vec![buf],
        }];
        one(self.batch_get_into(&mut items).await)
    }

    /// Reads many values into caller buffers; one result (value length) per item.
    pub async fn batch_get_into(&self, items: &mut [GetInto<'_>]) -> Vec<KvResult<usize>> {
        let mut retry = KeyRetry::new(items.len(), &self.inner.cfg);
        loop {
            let todo = retry.todo();
            let mut round = reborrow(items, &todo);
            let keys: Vec<&str> = round.iter().map(|i| i.key).collect();
            let found = self.find(&keys).await;
            let cached = cached_flags(&found);
            let mut out = self.read_found(&mut round, found).await;
            let stale = self.stale(&keys, &cached, &out);
            if !stale.is_empty() {
                let mut again = reborrow(&mut round, &stale);
                let keys: Vec<&str> = again.iter().map(|i| i.key).collect();
                let found = self.locate_keys(&keys).await;
                for (&i, r) in stale.iter().zip(self.read_located(&mut again, found).await) {
                    out[i] = r;
                }
            }
            drop(round);
            if !retry.settle(out).await {
                return retry.finish();
            }
        }
    }

    /// Reads `items` from `found` locations. Hints are read while the master
    /// is asked where those keys are: the read stands if the master names
    /// the same version, which it now holds a lease on; otherwise the item
    /// fails as stale (the caller asks again, through the fresh location).
    async fn read_found(
        &self,
        items: &mut [GetInto<'_>],
        found: Vec<KvResult<Found>>,
    ) -> Vec<KvResult<usize>> {
        let hinted: Vec<(usize, u64)> = found
            .iter()
            .enumerate()
            .filter_map(|(i, f)| match f {
                Ok(f) if f.via == Via::Hint => Some((i, f.location.generation)),
                _ => None,
            })
            .collect();
        if hinted.is_empty() {
            return self.read_located(items, found).await;
        }
        let keys: Vec<&str> = hinted.iter().map(|&(i, _)| items[i].key).collect();
        let (confirmed, mut out) =
            tokio::join!(self.locate_keys(&keys), self.read_located(items, found));
        for (&(i, generation), c) in hinted.iter().zip(confirmed) {
            match c {
                Ok(f) if f.location.generation == generation => {
                    if f.lease_from.elapsed() > Duration::from_millis(f.location.lease_ms) {
                        out[i] = Err(KvError::new(
                            Code::LeaseExpired,
                            format!("read of {:?} outlived its lease", items[i].key),
                        ));
                    }
                }
                Ok(_) => {
                    out[i] = Err(KvError::new(
                        Code::TransferFail,
                        format!("{:?} changed since this client saw it", items[i].key),
                    ))
                }
                Err(e) => out[i] = Err(e),
            }
        }
        out
    }

    /// Locations of `keys`: the location cache's, the master's for the rest.
    async fn find(&self, keys: &[&str]) -> Vec<KvResult<Found>> {
        // A read from the cache over shared memory never waits on I/O; this
        // keeps a loop of them from starving the caller's other tasks.
        tokio::task::consume_budget().await;
        let mut out: Vec<Option<KvResult<Found>>> = keys
            .iter()
            .map(|k| {
                self.inner.cache.get(k).map(|(mut location, lease_from)| {
                    Ok(match lease_from {
                        Some(lease_from) => Found {
                            location,
                            lease_from,
                            via: Via::Cache,
                        },
                        None => {
                            // Its lease is checked against the master's answer.
                            location.lease_ms = u64::MAX;
                            Found {
                                location,
                                lease_from: Instant::now(),
                                via: Via::Hint,
                            }
                        }
                    })
                })
            })
            .collect();
        let ask: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
        if !ask.is_empty() {
            let asked: Vec<&str> = ask.iter().map(|&i| keys[i]).collect();
            for (&i, f) in ask.iter().zip(self.locate_keys(&asked).await) {
                out[i] = Some(f);
            }
        }
        out.into_iter()
            .map(|f| f.unwrap_or_else(|| Err(KvError::from(Code::InternalError))))
            .collect()
    }

    /// Asks the master where `keys` are (granting read leases) and
    /// remembers the answers in the location cache.
    async fn locate_keys(&self, keys: &[&str]) -> Vec<KvResult<Found>> {
        // The lease runs from when the master was asked, not from its answer.
        let t0 = Instant::now();
        let mut out: Vec<KvResult<Found>> = keys
            .iter()
            .map(|k| {
                validate_key(k).map(|_| Found {
                    location: ObjectLocation {
                        value_len: 0,
                        generation: 0,
                        lease_ms: 0,
                        replicas: Vec::new(),
                    },
                    lease_from: t0,
                    via: Via::Master,
                })
            })
            .collect();
        let ask: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_ok()).collect();
        if ask.is_empty() {
            return out;
        }
        let r = self
            .inner
            .link
            .call(&msg::GetReplicaList {
                keys: ask.iter().map(|&i| keys[i].to_string()).collect(),
            })
            .await;
        for (&i, l) in ask.iter().zip(per_key(r, ask.len())) {
            out[i] = l.map(|location| {
                self.inner.cache.insert(keys[i], location.clone(), Some(t0));
                Found {
                    location,
                    lease_from: t0,
                    via: Via::Master,
                }
            });
        }
        out
    }

    async fn read_located(
        &self,
        items: &mut [GetInto<'_>],
        found: Vec<KvResult<Found>>,
    ) -> Vec<KvResult<usize>> {
        let mut results: Vec<KvResult<usize>> = Vec::with_capacity(items.len());
        let mut locations: Vec<Option<ObjectLocation>> = Vec::with_capacity(items.len());
        let leases: Vec<Instant> = found
            .iter()
            .map(|f| f.as_ref().map_or(Instant::now(), |f| f.lease_from))
            .collect();
        for (item, f) in items.iter().zip(found) {
            match f.map(|f| f.location) {
                Ok(l) => {
                    let room: u64 = item.dst.iter().map(|d| d.len() as u64).sum();
                    if room < l.value_len {
                        results.push(Err(KvError::new(
                            Code::InvalidParams,
                            format!(
                                "buffer of {room} bytes is too small for {} bytes",
                                l.value_len
                            ),
                        )));
                        locations.push(None);
                    } else if l.replicas.is_empty() {
                        results.push(Err(KvError::new(
                            Code::ObjectNotFound,
                            "no reachable replica",
                        )));
                        locations.push(None);
                    } else {
                        results.push(Err(KvError::new(Code::TransferFail, "not read")));
                        locations.push(Some(l));
                    }
                }
                Err(e) => {
                    results.push(Err(e));
                    locations.push(None);
                }
            }
        }
        let max_replicas = locations
            .iter()
            .flatten()
            .map(|l| l.replicas.len())
            .max()
            .unwrap_or(0);
        let shm = self
            .shm_maps(
                locations
                    .iter()
                    .flatten()
                    .flat_map(|l| l.replicas.iter().map(|r| r.segment))
                    .collect(),
            )
            .await;
        let forced = self.inner.cfg.protocol == Protocol::Shm;
        // Round r reads replica r of every object whose earlier replicas failed.
        for round in 0..max_replicas {
            let todo: Vec<usize> = (0..items.len())
                .filter(|&i| {
                    results[i].is_err()
                        && locations[i]
                            .as_ref()
                            .is_some_and(|l| round < l.replicas.len())
                })
                .collect();
            if todo.is_empty() {
                break;
            }
            // Object headers land here; the reads borrow them.
            let mut heads: Vec<Vec<u8>> = todo
                .iter()
                .map(|&i| vec![0u8; header_len(items[i].key.len())])
                .collect();
            let mut groups: HashMap<String, Vec<(usize, ReadOp, Check)>> = HashMap::new();
            let mut done: Vec<(usize, KvResult<usize>)> = Vec::new();
            let mut local = Vec::new();
            let (mut bytes, mut local_bytes) = (0u64, 0u64);
            for ((item, head), &i) in reborrow(items, &todo)
                .into_iter()
                .zip(&mut heads)
                .zip(&todo)
            {
                let Some(l) = &locations[i] else { continue };
                let check = Check {
                    key: item.key,
                    location: l,
                    lease_from: leases[i],
                };
                let rep = &l.replicas[round];
                let mut dst: Vec<&mut [u8]> = Vec::with_capacity(1 + item.dst.len());
                let hl = head.len() as u64;
                dst.push(&mut head[..]);
                let mut left = l.value_len;
                for d in item.dst {
                    if left == 0 {
                        break;
                    }
                    let n = (d.len() as u64).min(left) as usize;
                    dst.push(&mut d[..n]);
                    left -= n as u64;
                }
                match shm.get(&rep.segment).and_then(|m| m.as_ref()) {
                    Some(map) => {
                        local_bytes += hl + l.value_len;
                        local.push((i, map.clone(), rep.offset, dst, check));
                        continue;
                    }
                    None if forced => {
                        done.push((i, Err(Self::not_mappable(rep.segment))));
                        continue;
                    }
                    None => {}
                }
                bytes += hl + l.value_len;
                let req = ReadReq {
                    segment: rep.segment,
                    offset: rep.offset,
                    len: hl + l.value_len,
                };
                groups.entry(rep.endpoint.clone()).or_default().push((
                    i,
                    ReadOp { req, dst },
                    check,
                ));
            }
            // A store's reads wait in one queue its connections take from,
            // so one that runs ahead does more and none idles on a tail.
            let shared: Vec<SharedReads> = groups
                .into_iter()
                .map(|(ep, group)| {
                    let bytes: u64 = group.iter().map(|(_, o, _)| o.req.len).sum();
                    let conns = if bytes >= SPREAD_BYTES {
                        self.inner.cfg.conns_per_store.clamp(1, group.len())
                    } else {
                        1
                    };
                    let queue = group.into_iter().map(|(i, op, c)| ((i, c), op)).collect();
                    (self.pool(&ep), conns, Mutex::new(queue), Mutex::new(None))
                })
                .collect();
            let mut jobs: Vec<ReadJob> = Vec::new();
            // Shared-memory reads are copies and checksums: big batches
            // spread them over the cores too.
            for chunk in split(local, local_bytes, cores()) {
                jobs.push(Box::pin(async move {
                    chunk
                        .into_iter()
                        .map(|(i, map, offset, mut dst, check)| {
                            let r = map.read(offset, &mut dst).and_then(|()| check.verify(&dst));
                            (i, r)
                        })
                        .collect()
                }));
            }
            for (pool, conns, queue, failure) in &shared {
                for _ in 0..*conns {
                    let timeout = self.inner.cfg.timeout;
                    jobs.push(Box::pin(async move {
                        let run = async {
                            let mut conn = pool.take().await?;
                            let (done, broke) = read_regions_shared(&mut conn, queue).await;
                            if broke.is_none() {
                                pool.give(conn);
                            }
                            Ok::<_, KvError>(done)
                        };
                        let done = match tokio::time::timeout(timeout, run).await {
                            Ok(Ok(done)) => done,
                            Ok(Err(e)) => {
                                *failure.lock() = Some(e);
                                Vec::new()
                            }
                            Err(_) => {
                                *failure.lock() = Some(KvError::new(
                                    Code::RpcTimeout,
                                    format!("transfer with {} timed out", pool.addr()),
                                ));
                                Vec::new()
                            }
                        };
                        // Verified here, so a big batch checksums on every core.
                        done.into_iter()
                            .map(|((i, check), op, r)| {
                                (i, r.map_err(broken).and_then(|()| check.verify(&op.dst)))
                            })
                            .collect()
                    }));
                }
            }
            let big = bytes + local_bytes >= SPREAD_BYTES;
            done.extend(self.run_jobs(jobs, big).await.into_iter().flatten());
            // What no connection took fails with the reason.
            for (pool, _, queue, failure) in shared {
                let why = failure.into_inner().unwrap_or_else(|| {
                    KvError::new(
                        Code::TransferFail,
                        format!("{} was not reached", pool.addr()),
                    )
                });
                for ((i, _), _) in queue.into_inner() {
                    done.push((i, Err(broken(why.clone()))));
                }
            }
            for (i, r) in done {
                if let Err(e) = &r {
                    tracing::debug!(key = items[i].key, round, error = %e, "replica read failed");
                }
                results[i] = r;
            }
        }
        results
    }

    // ------------------------------------------------------------ queries

    /// Whether `key` exists (committed); does not extend its life.
    pub async fn exist(&self, key: &str) -> KvResult<bool> {
        one(self.batch_exist(&[key]).await)
    }

    /// Existence of many keys; one result per key.
    pub async fn batch_exist(&self, keys: &[&str]) -> Vec<KvResult<bool>> {
        self.sizes(keys)
            .await
            .into_iter()
            .map(|r| match r {
                Ok(_) => Ok(true),
                Err(e) if e.code == Code::ObjectNotFound => Ok(false),
                Err(e) => Err(e),
            })
            .collect()
    }

    /// Value size of `key`.
    pub async fn get_size(&self, key: &str) -> KvResult<u64> {
        one(self.sizes(&[key]).await)
    }

    async fn sizes(&self, keys: &[&str]) -> Vec<KvResult<u64>> {
        if let Some(e) = keys.iter().find_map(|k| validate_key(k).err()) {
            return keys
                .iter()
                .map(|k| validate_key(k).and(Err(e.clone())))
                .collect();
        }
        let r = self
            .inner
            .link
            .call(&msg::Exist {
                keys: keys.iter().map(|k| k.to_string()).collect(),
            })
            .await;
        per_key(r, keys.len())
    }

    /// Removes `key`; `force` ignores a live read lease.
    pub async fn remove(&self, key: &str, force: bool) -> KvResult<()> {
        one(self.batch_remove(&[key], force).await)
    }

    /// Removes many keys; one result per key.
    pub async fn batch_remove(&self, keys: &[&str], force: bool) -> Vec<KvResult<()>> {
        let r = self
            .inner
            .link
            .call(&msg::Remove {
                keys: keys.iter().map(|k| k.to_string()).collect(),
                force,
            })
            .await;
        for k in keys {
            self.inner.cache.forget(k);
        }
        per_key(r, keys.len())
    }

    /// Removes keys matching a regex; returns how many.
    pub async fn remove_by_regex(&self, pattern: &str, force: bool) -> KvResult<u64> {
        self.inner.cache.clear();
        self.inner
            .link
            .call(&msg::RemoveByRegex {
                pattern: pattern.to_string(),
                force,
            })
            .await
    }

    /// Removes every object; returns how many.
    pub async fn remove_all(&self, force: bool) -> KvResult<u64> {
        self.inner.cache.clear();
        self.inner.link.call(&msg::RemoveAll { force }).await
    }

    /// The cluster as the master sees it.
    pub async fn status(&self) -> KvResult<ClusterStatus> {
        self.inner.link.call(&msg::Status {}).await
    }
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
        let touch = msg::Touch { items };
        match tokio::time::timeout(TOUCH_EVERY * 5, link.call(&touch)).await {
            Ok(Ok(renewed)) => {
                for ((it, at), ok) in touch.items.iter().zip(read_at).zip(renewed) {
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

/// Per-key retries of a batch: the keys that failed transiently go again,
/// with backoff, within the client's retry budget.
struct KeyRetry<T> {
    results: Vec<Option<KvResult<T>>>,
    todo: Vec<usize>,
    attempt: u32,
    retries: u32,
    retry_for: Duration,
    start: Instant,
    backoff: Duration,
}

impl<T> KeyRetry<T> {
    fn new(n: usize, cfg: &ClientConfig) -> Self {
        KeyRetry {
            results: (0..n).map(|_| None).collect(),
            todo: (0..n).collect(),
            attempt: 0,
            retries: cfg.retries,
            retry_for: cfg.retry_for,
            start: Instant::now(),
            backoff: Duration::from_millis(5),
        }
    }

    /// Item indexes for the next pass, ascending.
    fn todo(&self) -> Vec<usize> {
        self.todo.clone()
    }

    /// Records a pass's results (one per `todo` index); returns whether
    /// another pass is due, after sleeping its backoff.
    async fn settle(&mut self, out: Vec<KvResult<T>>) -> bool {
        let more = self.attempt < self.retries && self.start.elapsed() < self.retry_for;
        let mut again = Vec::new();
        for (&i, r) in self.todo.iter().zip(out) {
            match r {
                Err(e) if more && e.code.is_transient() => again.push(i),
                r => self.results[i] = Some(r),
            }
        }
        self.todo = again;
        if self.todo.is_empty() {
            return false;
        }
        self.attempt += 1;
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(Duration::from_millis(500));
        true
    }

    fn finish(self) -> Vec<KvResult<T>> {
        self.results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(KvError::from(Code::InternalError))))
            .collect()
    }
}

/// The only result of a one-item batch.
fn one<T>(v: Vec<KvResult<T>>) -> KvResult<T> {
    v.into_iter()
        .next()
        .unwrap_or_else(|| Err(KvError::from(Code::InternalError)))
}

/// Spreads a batch-level master answer over its keys.
fn per_key<T>(r: KvResult<Vec<msg::WireResult<T>>>, n: usize) -> Vec<KvResult<T>> {
    match r {
        Ok(v) if v.len() == n => v.into_iter().map(msg::from_wire).collect(),
        Ok(_) => (0..n)
            .map(|_| {
                Err(KvError::new(
                    Code::RpcFail,
                    "master answered the wrong number of keys",
                ))
            })
            .collect(),
        Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
    }
}

/// Splits a store's batch into up to `conns` chunks when it is big enough
/// for parallel connections to pay off.
fn split<T>(group: Vec<T>, bytes: u64, conns: usize) -> Vec<Vec<T>> {
    let n = if bytes >= SPREAD_BYTES {
        conns.clamp(1, group.len().max(1))
    } else {
        1
    };
    let per = group.len().div_ceil(n).max(1);
    let mut out = Vec::with_capacity(n);
    let mut it = group.into_iter().peekable();
    while it.peek().is_some() {
        out.push(it.by_ref().take(per).collect());
    }
    out
}

/// Runs one pipelined exchange on a pooled connection under `timeout`; the
/// connection goes back to the pool only if the exchange completed.
async fn transfer<F, Fut, T>(pool: &ConnPool, timeout: Duration, f: F) -> KvResult<T>
where
    F: FnOnce(kvpool_net::FramedConn) -> Fut,
    Fut: std::future::Future<Output = (kvpool_net::FramedConn, KvResult<T>)>,
{
    let run = async {
        let conn = pool.take().await?;
        let (conn, r) = f(conn).await;
        if r.is_ok() {
            pool.give(conn);
        }
        r
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(r) => r,
        Err(_) => Err(KvError::new(
            Code::RpcTimeout,
            format!("transfer with {} timed out", pool.addr()),
        )),
    }
}

/// Pairs per-op results with item indexes; a broken connection fails them all.
fn spread<T>(idx: Vec<usize>, r: KvResult<Vec<KvResult<T>>>) -> Vec<(usize, KvResult<T>)> {
    match r {
        Ok(v) => idx.into_iter().zip(v).collect(),
        Err(e) => {
            let e = KvError::new(
                if e.code == Code::RpcTimeout {
                    Code::RpcTimeout
                } else {
                    Code::TransferFail
                },
                e.message,
            );
            idx.into_iter().map(|i| (i, Err(e.clone()))).collect()
        }
    }
}

/// One thread's share of a batch's writes: (item, result) pairs.
type WriteJob<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Vec<(usize, KvResult<()>)>> + Send + 'a>>;

/// One store's reads in a round: its pool, how many connections share the
/// queue, the queue (item index and check, op), and why a connection failed.
type SharedReads<'a> = (
    Arc<ConnPool>,
    usize,
    Mutex<std::collections::VecDeque<((usize, Check<'a>), ReadOp<'a>)>>,
    Mutex<Option<KvError>>,
);

/// A broken connection's error as a transfer failure (retryable); error
/// answers from the store keep their own codes.
fn broken(e: KvError) -> KvError {
    match e.code {
        Code::RpcFail => KvError::new(Code::TransferFail, e.message),
        _ => e,
    }
}

/// One thread's share of a read round: (item, result) pairs.
type ReadJob<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Vec<(usize, KvResult<usize>)>> + Send + 'a>>;

/// What a read of one object must find.
struct Check<'a> {
    key: &'a str,
    location: &'a ObjectLocation,
    /// When the read lease began.
    lease_from: Instant,
}

impl Check<'_> {
    /// Checks a read object (`dst`: its header, then its value): the header
    /// names the expected object, the value checksum matches, and the read
    /// finished within its lease. Returns the value length.
    fn verify(&self, dst: &[&mut [u8]]) -> KvResult<usize> {
        let (key, l) = (self.key, self.location);
        let (head, value) = dst
            .split_first()
            .ok_or_else(|| KvError::from(Code::InternalError))?;
        // A header that is gone or names another version means the object was
        // replaced or removed under the read (its old header is destroyed right
        // away): worth asking the master again, so transient.
        let h = ObjectHeader::decode(head)
            .and_then(|h| h.expect(key, l.value_len, l.generation).map(|()| h))
            .map_err(|e| {
                KvError::new(
                    Code::TransferFail,
                    format!("{key:?} changed during the read: {}", e.message),
                )
            })?;
        let parts: Vec<&[u8]> = value.iter().map(|v| &v[..]).collect();
        if value_checksum(&parts) != h.checksum {
            return Err(KvError::new(
                Code::ChecksumMismatch,
                format!("value of {key:?} fails its checksum"),
            ));
        }
        if self.lease_from.elapsed() > Duration::from_millis(l.lease_ms) {
            return Err(KvError::new(
                Code::LeaseExpired,
                format!("read of {key:?} outlived its lease"),
            ));
        }
        Ok(l.value_len as usize)
    }
}

impl Client {
    /// [`run_jobs_on`], in parallel only for a big batch that is alone: with
    /// several in flight the callers already keep the cores busy, and
    /// threads on top of them only contend (4 concurrent callers' 512 KiB
    /// batch gets were 20% slower with them).
    async fn run_jobs<F>(&self, jobs: Vec<F>, big: bool) -> Vec<F::Output>
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        if !big {
            return run_jobs_on(jobs, false).await;
        }
        /// Counts a big batch in flight until dropped (also when cancelled).
        struct InFlight<'a>(&'a AtomicUsize);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let alone = self.inner.big_calls.fetch_add(1, Ordering::AcqRel) == 0;
        let _in_flight = InFlight(&self.inner.big_calls);
        run_jobs_on(jobs, alone).await
    }
}

/// Cores this process may use, asked once: the answer reads cgroup files,
/// far too slow for every call.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Value checksums of objects (each the concatenation of its parts),
/// computed on every core when there are enough bytes to pay for threads.
fn checksums(values: Vec<&[&[u8]]>) -> Vec<u64> {
    let bytes: usize = values.iter().flat_map(|v| v.iter()).map(|p| p.len()).sum();
    let threads = cores();
    if bytes < 4 * SPREAD_BYTES as usize || threads < 2 || values.len() < 2 {
        return values.iter().map(|v| value_checksum(v)).collect();
    }
    let per = values.len().div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = values
            .chunks(per)
            .map(|c| s.spawn(move || c.iter().map(|v| value_checksum(v)).collect::<Vec<_>>()))
            .collect();
        parts
            .into_iter()
            .flat_map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Runs transfer jobs to completion. With `parallel` and a multi-thread
/// runtime, each job gets its own thread, so one caller's big batch moves
/// and verifies bytes on every core rather than one. The jobs borrow the
/// caller's buffers; scoped threads (under `block_in_place`) have all ended
/// when this returns, and nothing here can be dropped half-way, so no
/// transfer ever writes into memory its caller stopped waiting for.
async fn run_jobs_on<F>(jobs: Vec<F>, parallel: bool) -> Vec<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    let handle = Handle::current();
    if jobs.len() < 2 || !parallel || handle.runtime_flavor() != RuntimeFlavor::MultiThread {
        return join_all(jobs).await;
    }
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            let running: Vec<_> = jobs
                .into_iter()
                .map(|job| {
                    let handle = &handle;
                    s.spawn(move || handle.block_on(job))
                })
                .collect();
            running
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    })
}
