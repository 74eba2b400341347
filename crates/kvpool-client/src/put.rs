//! Puts: reserve regions at the master (`PutStart`), write header + value to
//! every replica over its transport, then commit (`PutEnd`) what was fully
//! written and revoke (`PutRevoke`) the rest.
//!
//! Two master round trips per batch whatever its size; the transfers of a
//! batch run per store and, when big, over several connections or cores.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kvpool_format::{header_len, ObjectHeader};
use kvpool_proto::msg::{self, ObjectLocation, PutGrant, PutItem, Replica, Tier, WriteReq};
use kvpool_proto::{validate_key, Code, KvError, KvResult};
use tokio::time::Instant;

use crate::fanout::THREAD_BYTES;
use crate::retry::KeyRetry;
use crate::rpc::one;
use crate::transport::{Dir, Job, Kind, Write, WriteOp};
use crate::{Client, ReplicateConfig};

/// How long a client tries to cancel a put operation that went
/// unanswered (the master's default put timeout is 60 s, after which it
/// revokes the puts itself).
const CANCEL_FOR: Duration = Duration::from_secs(90);
/// How often it tries while the master does not answer.
const CANCEL_RETRY: Duration = Duration::from_millis(250);

/// One object to put: its key and the parts its value is the concatenation of.
type Item<'a> = (&'a str, &'a [&'a [u8]]);

/// Bytes of a value given as parts.
fn value_len(parts: &[&[u8]]) -> u64 {
    parts.iter().map(|p| p.len() as u64).sum()
}

/// The `PutStart` items for `items`: a result slot per item (failed where
/// the key is invalid), and the request items with their item indexes.
fn plan(items: &[Item]) -> (Vec<KvResult<()>>, Vec<PutItem>, Vec<usize>) {
    let mut results = Vec::with_capacity(items.len());
    let mut put_items = Vec::with_capacity(items.len());
    let mut index = Vec::with_capacity(items.len());
    for (i, (key, parts)) in items.iter().enumerate() {
        match validate_key(key) {
            Ok(()) => {
                let value_len = value_len(parts);
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
    (results, put_items, index)
}

/// Whether a master call that failed with `e` may have been carried out
/// all the same (its answer lost, or its caller gave up waiting).
fn unsure(e: &KvError) -> bool {
    matches!(e.code, Code::RpcFail | Code::RpcTimeout)
}

/// A commit's error as the caller sees it: a put that vanished before its
/// commit (the master restarted or failed over, or the put timed out) is
/// transient, so it is written again.
fn commit_error(e: KvError) -> KvError {
    match e.code {
        Code::ObjectNotFound => KvError::new(
            Code::UnavailableInCurrentStatus,
            format!("put was lost before its commit: {}", e.message),
        ),
        _ => e,
    }
}

impl Client {
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

    /// [`Client::batch_put`] of values that are one part each.
    pub async fn batch_put_values(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<KvResult<()>> {
        let parts: Vec<[&[u8]; 1]> = items.iter().map(|(_, v)| [*v]).collect();
        let items: Vec<Item> = (items.iter().zip(&parts))
            .map(|((k, _), p)| (*k, &p[..]))
            .collect();
        self.batch_put(&items, config, upsert).await
    }

    /// Stores many objects (each the concatenation of its parts); one result
    /// per key, in order. `upsert` replaces existing values.
    pub async fn batch_put(
        &self,
        items: &[(&str, &[&[u8]])],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<KvResult<()>> {
        // A tenant's keys in its namespace; nothing copied without one.
        let scoped: Vec<String> = match self.tenant() {
            Some(_) => items
                .iter()
                .map(|(k, _)| self.scoped(k).into_owned())
                .collect(),
            None => Vec::new(),
        };
        let with_tenant: Vec<Item> = scoped
            .iter()
            .zip(items)
            .map(|(k, (_, v))| (k.as_str(), *v))
            .collect();
        let items = if scoped.is_empty() {
            items
        } else {
            &with_tenant[..]
        };
        let t0 = Instant::now();
        // Every pass is this one operation to the master (see `PutStart::op`).
        let op = rand::random::<u64>() | 1;
        // Set when a `PutStart` or `PutEnd` of this operation went
        // unanswered: the master may hold puts in flight nobody will end.
        let unanswered = AtomicBool::new(false);
        // Another writer holding a key, or a store restarting, is worth a retry.
        let mut retry = KeyRetry::new(items.len(), &self.inner.cfg);
        loop {
            let round: Vec<Item> = retry.todo().iter().map(|&i| items[i]).collect();
            let out = retry
                .pass(self.put_round(&round, config, (upsert, op), &unanswered))
                .await;
            if !retry.settle(out).await {
                let out = retry.finish();
                if unanswered.load(Ordering::Relaxed) && out.iter().any(Result::is_err) {
                    self.cancel_put(op);
                }
                let len = |i: usize, _: &()| value_len(items[i].1);
                (self.inner.metrics).record("put", &out, len, t0.elapsed());
                return out;
            }
        }
    }

    /// Gives up put operation `op`, a call of which went unanswered, in
    /// the background (retried for up to [`CANCEL_FOR`] while the master
    /// does not answer): otherwise a put it started would hold its key
    /// until the master's put timeout, and this client's next put of the
    /// key would wait out its retries behind it.
    fn cancel_put(&self, op: u64) {
        let client = self.clone();
        tokio::spawn(async move {
            let until = Instant::now() + CANCEL_FOR;
            let req = msg::PutCancel {
                client_id: client.client_id(),
                ops: vec![op],
            };
            loop {
                match client.call(&req).await {
                    Ok(_) => return,
                    // A master older than protocol 11: it frees the keys at
                    // its put timeout.
                    Err(e) if e.code == Code::NotSupported => return,
                    Err(_) if Instant::now() >= until => return,
                    Err(_) => tokio::time::sleep(CANCEL_RETRY).await,
                }
            }
        });
    }

    /// One pass of a batch put (an upsert or not, of operation `op`):
    /// start, write, commit or revoke. Sets `unanswered` when the master
    /// may hold puts in flight of it that this pass did not see through.
    async fn put_round(
        &self,
        items: &[Item<'_>],
        config: &ReplicateConfig,
        (upsert, op): (bool, u64),
        unanswered: &AtomicBool,
    ) -> Vec<KvResult<()>> {
        let (mut results, put_items, index) = plan(items);
        if put_items.is_empty() {
            return results;
        }
        let client_id = self.client_id();
        let start = |items| msg::PutStart {
            client_id,
            op,
            items,
            config: config.clone(),
            upsert,
        };
        let grants = self
            .call_split(put_items, |i: &PutItem| &i.key, start)
            .await;
        let mut granted = Vec::new();
        for (&i, g) in index.iter().zip(grants) {
            match g {
                Ok(PutGrant::Exists) => {}
                Ok(PutGrant::Write {
                    generation,
                    replicas,
                }) => granted.push((i, generation, replicas)),
                Err(e) => {
                    if unsure(&e) {
                        unanswered.store(true, Ordering::Relaxed);
                    }
                    results[i] = Err(e)
                }
            }
        }
        // Object headers must outlive the writes that borrow them.
        let mut headers: Vec<(usize, u64, Vec<u8>, Vec<Replica>)> = Vec::new();
        for (i, generation, replicas) in granted {
            let (key, parts) = items[i];
            // The value's checksum is sealed in where the bytes land (see
            // `kvpool_format::seal`): from the bytes stored, in one pass.
            let h = ObjectHeader {
                key: key.to_string(),
                value_len: value_len(parts),
                generation,
                checksum: 0,
            };
            headers.push((i, generation, h.encode(), replicas));
        }
        let mut ops: Vec<Write> = Vec::new();
        for (i, generation, head, replicas) in &headers {
            for r in replicas {
                let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + items[*i].1.len());
                parts.push(head);
                parts.extend_from_slice(items[*i].1);
                let req = WriteReq {
                    segment: r.segment,
                    offset: r.offset,
                    grant: r.grant(*generation),
                };
                ops.push(Write {
                    item: *i,
                    peer: r.endpoint.clone(),
                    op: WriteOp { req, parts },
                });
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
                let generation = *generation;
                commit.push((h, msg::PutEndItem { key, generation }));
            } else {
                revoke.push(key);
            }
        }
        if !revoke.is_empty() {
            // Best effort: the master also revokes puts that are never
            // ended, at its put timeout; unanswered, the operation is
            // cancelled instead (the keys are free again once it is).
            let keys = |keys| msg::PutRevoke { client_id, keys };
            let revoked = self.call_split(revoke, String::as_str, keys).await;
            if revoked.iter().any(|r| r.as_ref().is_err_and(unsure)) {
                unanswered.store(true, Ordering::Relaxed);
            }
        }
        if commit.is_empty() {
            return results;
        }
        let ends: Vec<msg::PutEndItem> = commit.iter().map(|(_, c)| c.clone()).collect();
        let end = |items| msg::PutEnd { client_id, items };
        let ended = self
            .call_split(ends, |i: &msg::PutEndItem| &i.key, end)
            .await;
        for ((h, _), r) in commit.iter().zip(ended) {
            let (i, generation, _, replicas) = &headers[*h];
            if r.is_ok() {
                // A put is often read back soon: where it went is a hint.
                let location = ObjectLocation {
                    value_len: value_len(items[*i].1),
                    generation: *generation,
                    lease_ms: 0,
                    replicas: replicas.clone(),
                };
                self.inner.cache.insert(items[*i].0, location, None);
            }
            if r.as_ref().is_err_and(unsure) {
                unanswered.store(true, Ordering::Relaxed);
            }
            results[*i] = r.map_err(commit_error);
        }
        results
    }

    /// Runs writes, each over its route: every transport batches its
    /// share as it does best, and all shares run together. Returns (item
    /// index, result) per op.
    pub(crate) async fn run_writes<'a>(&self, ops: Vec<Write<'a>>) -> Vec<(usize, KvResult<()>)> {
        let segments: Vec<_> = ops.iter().map(|w| w.op.req.segment).collect();
        self.prepare(&segments).await;
        let mut done = Vec::new();
        let mut by_kind: HashMap<Kind, Vec<Write<'a>>> = HashMap::new();
        let (mut tcp_bytes, mut shm_bytes) = (0, 0);
        for w in ops {
            match self.route(w.op.req.segment, Tier::Memory, Dir::Write) {
                Ok(kind) => {
                    let bytes = value_len(&w.op.parts);
                    match kind {
                        Kind::Shm => shm_bytes += bytes,
                        Kind::Tcp => tcp_bytes += bytes,
                    }
                    by_kind.entry(kind).or_default().push(w);
                }
                Err(e) => done.push((w.item, Err(e))),
            }
        }
        let spread = self.spread();
        let transports = &self.inner.transports;
        let jobs: Vec<Job<()>> = by_kind
            .into_iter()
            .flat_map(|(kind, ops)| transports.get(kind).write(ops, spread))
            .collect();
        let big = tcp_bytes + shm_bytes >= THREAD_BYTES;
        (self.inner.metrics).transferred("write", tcp_bytes, shm_bytes);
        done.extend(self.run_jobs(jobs, big).await.into_iter().flatten());
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_reserves_header_and_value_and_skips_bad_keys() {
        let a: &[&[u8]] = &[b"abc", b"de"];
        let b: &[&[u8]] = &[b"x"];
        let (results, put, index) = plan(&[("k1", a), ("", b), ("k3", b)]);
        assert!(results[0].is_ok() && results[2].is_ok());
        assert_eq!(results[1].as_ref().unwrap_err().code, Code::InvalidKey);
        assert_eq!(index, [0, 2]);
        assert_eq!(put[0].key, "k1");
        assert_eq!(put[0].value_len, 5);
        assert_eq!(put[0].region_len, header_len(2) as u64 + 5);
        assert_eq!(put[1].value_len, 1);
    }

    #[test]
    fn a_put_lost_before_commit_is_written_again() {
        let e = commit_error(KvError::from(Code::ObjectNotFound));
        assert_eq!(e.code, Code::UnavailableInCurrentStatus);
        assert!(e.code.is_transient());
        let e = commit_error(KvError::from(Code::NoAvailableHandle));
        assert_eq!(e.code, Code::NoAvailableHandle);
    }
}
