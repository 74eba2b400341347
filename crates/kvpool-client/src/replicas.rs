//! Replica management: where an object's replicas are, copies of an
//! object to more segments and moves between segments (carried out by this
//! client: it reads the object from a replica, writes it into regions the
//! master reserved, and commits them), clearing replicas off a segment, and
//! replica tasks the master records so anyone can ask how they went.
//!
//! A copy writes the same version (same generation and checksum) that is
//! already readable, so readers never see a difference; a version replaced
//! while it was being copied is freed by the master instead of attached.

use kvpool_format::{header_len, value_checksum, ObjectHeader};
use kvpool_proto::msg::{
    self, task_status, ObjectLocation, ReplicaPlan, SegmentId, TaskInfo, WriteReq,
};
use kvpool_proto::{validate_key, Code, KvError, KvResult};
use tokio::time::Instant;

use crate::get::{Found, GetInto};
use crate::rpc::split_batch;
use crate::transport::{Write, WriteOp};
use crate::Client;

/// One replica of an object, as `get_replica_desc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaDesc {
    /// Name of the segment holding it (what copies and moves name).
    pub segment: String,
    /// The segment's id.
    pub segment_id: SegmentId,
    /// Data endpoint (`host:port`) serving the segment.
    pub endpoint: String,
    /// Offset of the object's value in the segment.
    pub value_offset: u64,
    /// Value bytes.
    pub value_len: u64,
}

/// What a replica task does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskKind {
    /// Copy the object to more segments.
    Copy,
    /// Move the object's replica from one segment to another.
    Move,
}

impl TaskKind {
    fn wire(self) -> u8 {
        match self {
            TaskKind::Copy => msg::task_kind::COPY,
            TaskKind::Move => msg::task_kind::MOVE,
        }
    }
}

/// Message of a task that succeeded (Mooncake's words).
const DONE: &str = "Task completed successfully";

impl Client {
    /// Existence and value size of `keys`, taking a read lease on each
    /// object found, as a read does (Mooncake's `is_exist` semantics: a
    /// remove right after is refused while the lease lasts). `None` for a
    /// missing key.
    pub async fn batch_exist_leased(&self, keys: &[&str]) -> Vec<KvResult<Option<u64>>> {
        let scoped = self.tenant_keys(keys);
        let refs: Vec<&str> = scoped.iter().map(String::as_str).collect();
        let keys = if scoped.is_empty() { keys } else { &refs[..] };
        let found = |r: KvResult<u64>| match r {
            Ok(len) => Ok(Some(len)),
            Err(e) if e.code == Code::ObjectNotFound => Ok(None),
            Err(e) => Err(e),
        };
        let got = self.call_keys(keys, |keys| msg::ExistLeased { keys }).await;
        if got
            .iter()
            .any(|r| matches!(r, Err(e) if e.code == Code::NotSupported))
        {
            // A master before protocol 9: locating takes the same leases,
            // at the cost of describing every replica.
            let located = self.locate_keys(keys).await;
            return located
                .into_iter()
                .map(|f| found(f.map(|f| f.location.value_len)))
                .collect();
        }
        got.into_iter().map(found).collect()
    }

    /// Names of mounted segments by id, from one `Status` call.
    async fn segment_names(&self) -> KvResult<Vec<(SegmentId, String)>> {
        let st = self.status().await?;
        Ok(st
            .segments
            .into_iter()
            .map(|s| (s.info.id, s.info.name))
            .collect())
    }

    /// The replicas of each of `keys` (taking a read lease, as a read
    /// does); `OBJECT_NOT_FOUND` for a missing key.
    pub async fn replica_descs(&self, keys: &[&str]) -> Vec<KvResult<Vec<ReplicaDesc>>> {
        let scoped = self.tenant_keys(keys);
        let refs: Vec<&str> = scoped.iter().map(String::as_str).collect();
        let keys = if scoped.is_empty() { keys } else { &refs[..] };
        let found = self.locate_keys(keys).await;
        if found.iter().all(|f| f.is_err()) {
            return found.into_iter().map(|f| f.map(|_| Vec::new())).collect();
        }
        let names = match self.segment_names().await {
            Ok(n) => n,
            Err(e) => return keys.iter().map(|_| Err(e.clone())).collect(),
        };
        keys.iter()
            .zip(found)
            .map(|(key, f)| {
                let l = f?.location;
                let head = header_len(key.len()) as u64;
                Ok(l.replicas
                    .iter()
                    .map(|r| ReplicaDesc {
                        segment: names
                            .iter()
                            .find(|(id, _)| *id == r.segment)
                            .map_or_else(|| r.segment.to_string(), |(_, n)| n.clone()),
                        segment_id: r.segment,
                        endpoint: r.endpoint.clone(),
                        value_offset: r.offset + head,
                        value_len: l.value_len,
                    })
                    .collect())
            })
            .collect()
    }

    /// Copies `key`'s current version to the segments named `targets`
    /// (a segment that already holds a replica is left as it is).
    pub async fn copy_replicas(&self, key: &str, targets: &[String]) -> KvResult<()> {
        self.copy_object(key, targets, None).await
    }

    /// Moves `key`'s replica from segment `source` to segment `target`.
    pub async fn move_replica(&self, key: &str, source: &str, target: &str) -> KvResult<()> {
        if source == target {
            return Err(KvError::new(
                Code::InvalidParams,
                "a move goes from one segment to another",
            ));
        }
        self.copy_object(key, &[target.to_string()], Some(source))
            .await
    }

    /// Reads `key` from a replica, writes it into regions on `targets`,
    /// commits them, and (a move) drops the replica on `drop_from`.
    async fn copy_object(
        &self,
        key: &str,
        targets: &[String],
        drop_from: Option<&str>,
    ) -> KvResult<()> {
        let key = &*self.scoped(key);
        validate_key(key)?;
        if targets.is_empty() {
            return Err(KvError::new(Code::InvalidParams, "no target segments"));
        }
        let t0 = Instant::now();
        let plan: ReplicaPlan = self
            .call(&msg::ReplicaAdd {
                client_id: self.client_id(),
                key: key.to_string(),
                targets: targets.to_vec(),
            })
            .await?;
        let mut failure = None;
        let mut regions = Vec::new();
        for t in &plan.targets {
            match t {
                Ok(Some(r)) => regions.push(r.clone()),
                Ok(None) => {}
                Err(c) => {
                    failure.get_or_insert_with(|| KvError::from(Code::from_i32(*c)));
                }
            }
        }
        let drop_id = match drop_from {
            None => None,
            Some(name) => {
                let id = self
                    .segment_names()
                    .await?
                    .into_iter()
                    .find(|(id, n)| n == name || id.to_string() == name)
                    .map(|(id, _)| id);
                match id.filter(|id| plan.sources.iter().any(|r| r.segment == *id)) {
                    Some(id) => Some(id),
                    None => {
                        failure.get_or_insert_with(|| {
                            KvError::new(
                                Code::InvalidParams,
                                format!("{key:?} has no replica on segment {name:?}"),
                            )
                        });
                        None
                    }
                }
            }
        };
        let commit = |written: Vec<SegmentId>, failed: Vec<SegmentId>, drop: Vec<SegmentId>| {
            msg::ReplicaCommit {
                client_id: self.client_id(),
                key: key.to_string(),
                generation: plan.generation,
                written,
                failed,
                drop,
            }
        };
        let all: Vec<SegmentId> = regions.iter().map(|r| r.segment).collect();
        if let Some(e) = failure {
            if !all.is_empty() {
                let _ = self.call(&commit(Vec::new(), all, Vec::new())).await;
            }
            return Err(e);
        }
        let (written, failed) = if regions.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            self.write_copies(key, &plan, regions, t0).await
        };
        let ok = failed.is_empty();
        let drop = match (ok, drop_id) {
            (true, Some(id)) => vec![id],
            _ => Vec::new(),
        };
        let r = self.call(&commit(written, failed, drop)).await;
        self.inner.cache.forget(key);
        r?;
        if ok {
            Ok(())
        } else {
            Err(KvError::new(
                Code::TransferFail,
                format!("copying {key:?} failed on some target segments"),
            ))
        }
    }

    /// Reads the object `plan` names and writes it into `regions`; the
    /// segments written in full and those not.
    async fn write_copies(
        &self,
        key: &str,
        plan: &ReplicaPlan,
        regions: Vec<msg::Replica>,
        t0: Instant,
    ) -> (Vec<SegmentId>, Vec<SegmentId>) {
        let all: Vec<SegmentId> = regions.iter().map(|r| r.segment).collect();
        let mut value = vec![0u8; plan.value_len as usize];
        let location = ObjectLocation {
            value_len: plan.value_len,
            generation: plan.generation,
            lease_ms: plan.lease_ms,
            replicas: plan.sources.clone(),
        };
        let read = {
            let mut items = [GetInto {
                key,
                dst: vec![&mut value[..]],
            }];
            let found = vec![Ok(Found::from_master(location, t0))];
            self.read_located(&mut items, found).await.pop()
        };
        if !matches!(read, Some(Ok(_))) {
            return (Vec::new(), all);
        }
        let head = ObjectHeader {
            key: key.to_string(),
            value_len: plan.value_len,
            generation: plan.generation,
            checksum: value_checksum(&[&value[..]]),
        }
        .encode();
        let ops: Vec<_> = regions
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let req = WriteReq {
                    segment: r.segment,
                    offset: r.offset,
                    grant: r.grant(plan.generation),
                };
                let parts: Vec<&[u8]> = vec![&head, &value];
                Write {
                    item: i,
                    peer: r.endpoint.clone(),
                    op: WriteOp { req, parts },
                }
            })
            .collect();
        let mut ok = vec![false; regions.len()];
        for (i, r) in self.run_writes(ops).await {
            ok[i] = r.is_ok();
        }
        let written = all
            .iter()
            .zip(&ok)
            .filter(|(_, k)| **k)
            .map(|(s, _)| *s)
            .collect();
        let failed = all
            .iter()
            .zip(&ok)
            .filter(|(_, k)| !**k)
            .map(|(s, _)| *s)
            .collect();
        (written, failed)
    }

    /// Drops `keys`' replicas on the segment named `segment` (all of them,
    /// and so the object, for `None`), except for objects under a live read
    /// lease; per key, whether something was dropped.
    pub async fn clear_replicas(
        &self,
        keys: &[&str],
        segment: Option<&str>,
    ) -> KvResult<Vec<bool>> {
        let owned: Vec<String> = keys.iter().map(|k| self.scoped(k).into_owned()).collect();
        let mut out = Vec::with_capacity(keys.len());
        for part in split_batch(owned.clone(), String::as_str) {
            let n = part.len();
            let cleared = self
                .call(&msg::ReplicaClear {
                    keys: part,
                    segment: segment.map(str::to_string),
                })
                .await?;
            if cleared.len() != n {
                return Err(KvError::new(
                    Code::RpcFail,
                    "master answered the wrong number of keys",
                ));
            }
            out.extend(cleared);
        }
        for k in &owned {
            self.inner.cache.forget(k);
        }
        Ok(out)
    }

    /// Records a replica task at the master and carries it out in the
    /// background, reporting its progress there; returns its id at once.
    /// A task that cannot be done (missing key, unknown segment) is refused
    /// here.
    pub async fn start_task(
        &self,
        kind: TaskKind,
        key: &str,
        source: &str,
        targets: &[String],
    ) -> KvResult<u128> {
        let key = &*self.scoped(key);
        validate_key(key)?;
        let id = self
            .call(&msg::TaskCreate {
                client_id: self.client_id(),
                kind: kind.wire(),
                key: key.to_string(),
                source: source.to_string(),
                targets: targets.to_vec(),
            })
            .await?;
        let me = self.clone();
        let (key, source, targets) = (key.to_string(), source.to_string(), targets.to_vec());
        tokio::spawn(async move {
            let update = |status: u8, message: String| msg::TaskUpdate {
                client_id: me.client_id(),
                id,
                status,
                message,
            };
            let _ = me
                .call(&update(task_status::PROCESSING, String::new()))
                .await;
            let r = match kind {
                TaskKind::Copy => me.copy_replicas(&key, &targets).await,
                TaskKind::Move => {
                    let target = targets.first().cloned().unwrap_or_default();
                    me.move_replica(&key, &source, &target).await
                }
            };
            let (status, message) = match r {
                Ok(()) => (task_status::SUCCESS, DONE.to_string()),
                Err(e) => (task_status::FAILED, e.to_string()),
            };
            if let Err(e) = me.call(&update(status, message)).await {
                tracing::warn!(task = %format!("{id:032x}"), error = %e, "task result not recorded");
            }
        });
        Ok(id)
    }

    /// A replica task as the master knows it.
    pub async fn query_task(&self, id: u128) -> KvResult<TaskInfo> {
        self.call(&msg::TaskQuery { id }).await
    }
}
