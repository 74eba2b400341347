//! Reading located objects from their replicas, and verifying every read.
//!
//! Reads go in rounds ([`crate::placement`]): each round reads one replica
//! of every object still unread, over that replica's route: a `memcpy` from
//! a mapped segment, or the store's TCP data plane. Each read lands header
//! first, then the value straight into the caller's buffers, and counts
//! only once [`Check::verify`] passes.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use kvpool_format::{header_len, value_checksum, ObjectHeader};
use kvpool_proto::msg::{ObjectLocation, ReadReq, Tier};
use kvpool_proto::{Code, KvError, KvResult};
use kvpool_transfer::data::ReadOp;
use tokio::time::Instant;

use crate::fanout::{cores, lanes, split, Job, SPREAD_BYTES};
use crate::get::{reborrow, Found, GetInto};
use crate::placement::{due, rounds, Route};
use crate::transport::not_mappable;
use crate::transport::tcp::{broken, StoreReads};
use crate::Client;

/// A TCP read queued for its store: (item index, its check) and the op.
type TcpRead<'a> = ((usize, Check<'a>), ReadOp<'a>);

/// Whether a located object can be read into `room` bytes.
fn readable(room: u64, l: &ObjectLocation) -> KvResult<()> {
    if room < l.value_len {
        return Err(KvError::new(
            Code::InvalidParams,
            format!(
                "buffer of {room} bytes is too small for {} bytes",
                l.value_len
            ),
        ));
    }
    if l.replicas.is_empty() {
        return Err(KvError::new(Code::ObjectNotFound, "no reachable replica"));
    }
    Ok(())
}

impl Client {
    /// Reads `items` from their `found` locations, trying replicas in
    /// order; one result (value length) per item.
    pub(crate) async fn read_located(
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
            let room: u64 = item.dst.iter().map(|d| d.len() as u64).sum();
            match f.and_then(|f| readable(room, &f.location).map(|()| f.location)) {
                Ok(l) => {
                    results.push(Err(KvError::new(Code::TransferFail, "not read")));
                    locations.push(Some(l));
                }
                Err(e) => {
                    results.push(Err(e));
                    locations.push(None);
                }
            }
        }
        // Replicas on stores known to be down go last: tried only when no
        // other is left, and then they fail at once.
        let tcp = &self.inner.transports.tcp;
        for l in locations.iter_mut().flatten() {
            if l.replicas.iter().any(|r| tcp.is_down(&r.endpoint)) {
                l.replicas.sort_by_cached_key(|r| tcp.is_down(&r.endpoint));
            }
        }
        let replicas: Vec<usize> = locations
            .iter()
            .map(|l| l.as_ref().map_or(0, |l| l.replicas.len()))
            .collect();
        // Disk replicas go over TCP whatever the protocol: no mapping to find.
        let routes = self
            .routes(
                locations
                    .iter()
                    .flatten()
                    .flat_map(|l| l.replicas.iter())
                    .filter(|r| r.tier == Tier::Memory)
                    .map(|r| r.segment)
                    .collect(),
            )
            .await;
        // Round r reads replica r of every object whose earlier replicas failed.
        for round in 0..rounds(&replicas) {
            let pending: Vec<bool> = results.iter().map(|r| r.is_err()).collect();
            let todo = due(&pending, &replicas, round);
            if todo.is_empty() {
                break;
            }
            // Object headers land here; the reads borrow them.
            let mut heads: Vec<Vec<u8>> = todo
                .iter()
                .map(|&i| vec![0u8; header_len(items[i].key.len())])
                .collect();
            let mut groups: HashMap<String, Vec<TcpRead>> = HashMap::new();
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
                let route = match rep.tier {
                    Tier::Disk => Route::Tcp,
                    Tier::Memory => routes.to(rep.segment),
                };
                match route {
                    Route::Shm(map) => {
                        local_bytes += hl + l.value_len;
                        local.push((i, map, rep.offset, dst, check));
                    }
                    Route::Unmappable => done.push((i, Err(not_mappable(rep.segment)))),
                    Route::Tcp => {
                        bytes += hl + l.value_len;
                        let req = ReadReq {
                            segment: rep.segment,
                            offset: rep.offset,
                            len: hl + l.value_len,
                            grant: rep.read_grant(l.generation),
                        };
                        let op = ReadOp { req, dst };
                        groups
                            .entry(rep.endpoint.clone())
                            .or_default()
                            .push(((i, check), op));
                    }
                }
            }
            // A store's reads wait in one queue its connections take from,
            // so one that runs ahead does more and none idles on a tail.
            let stores: Vec<StoreReads<(usize, Check)>> = groups
                .into_iter()
                .map(|(ep, group)| {
                    let bytes: u64 = group.iter().map(|(_, o)| o.req.len).sum();
                    let lanes = lanes(bytes, group.len(), self.inner.cfg.conns_per_store);
                    let pool = self.inner.transports.tcp.pool(&ep);
                    StoreReads::new(pool, lanes, group.into_iter().collect::<VecDeque<_>>())
                })
                .collect();
            let mut jobs: Vec<Job<usize>> = Vec::new();
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
            let timeout = self.inner.cfg.timeout;
            for store in &stores {
                for _ in 0..store.lanes {
                    jobs.push(Box::pin(async move {
                        // Verified here, so a big batch checksums on every core.
                        store
                            .lane(timeout)
                            .await
                            .into_iter()
                            .map(|((i, check), op, r)| {
                                (i, r.map_err(broken).and_then(|()| check.verify(&op.dst)))
                            })
                            .collect()
                    }));
                }
            }
            let big = bytes + local_bytes >= SPREAD_BYTES;
            (self.inner.metrics).transferred("read", bytes, local_bytes);
            done.extend(self.run_jobs(jobs, big).await.into_iter().flatten());
            // What no connection took fails with the reason.
            for store in stores {
                for ((i, _), e) in store.unread() {
                    done.push((i, Err(e)));
                }
            }
            for (i, r) in done {
                if let Err(e) = &r {
                    tracing::debug!(key = items[i].key, round, error = %e, "replica read failed");
                }
                results[i] = r;
            }
        }
        // An object whose every replica is on a store known to be down is a
        // miss for this call: asking again would find the same stores down
        // (until a probe finds one back), and would keep the caller waiting.
        for (r, l) in results.iter_mut().zip(&locations) {
            let Some(l) = l else { continue };
            if r.as_ref().is_err_and(|e| e.is_retryable())
                && l.replicas.iter().all(|rep| {
                    (rep.tier == Tier::Disk || matches!(routes.to(rep.segment), Route::Tcp))
                        && tcp.is_down(&rep.endpoint)
                })
            {
                *r = r.clone().map_err(KvError::settled);
            }
        }
        results
    }
}

/// What a read of one object must find.
pub(crate) struct Check<'a> {
    key: &'a str,
    location: &'a ObjectLocation,
    /// When the read lease began.
    lease_from: Instant,
}

impl Check<'_> {
    /// Checks a read object (`dst`: its header, then its value): the header
    /// names the expected object, the value checksum matches, and the read
    /// finished within its lease. Returns the value length.
    pub(crate) fn verify(&self, dst: &[&mut [u8]]) -> KvResult<usize> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use kvpool_proto::msg::{Replica, SegmentId};

    fn location(value: &[u8], lease_ms: u64, replicas: usize) -> ObjectLocation {
        ObjectLocation {
            value_len: value.len() as u64,
            generation: 3,
            lease_ms,
            replicas: (0..replicas)
                .map(|i| Replica {
                    segment: SegmentId(i as u128),
                    endpoint: format!("127.0.0.1:{i}"),
                    offset: 4096,
                    len: 4096,
                    cap: None,
                    tier: Default::default(),
                    fence: 1,
                })
                .collect(),
        }
    }

    fn object(key: &str, value: &[u8], generation: u64) -> Vec<u8> {
        let mut head = ObjectHeader {
            key: key.into(),
            value_len: value.len() as u64,
            generation,
            checksum: value_checksum(&[value]),
        }
        .encode();
        head.extend_from_slice(value);
        head
    }

    /// Verifies `bytes` (header + value) as a read of key "k" at `l`
    /// whose lease began `age` ago.
    fn verify(l: &ObjectLocation, age: Duration, bytes: &mut [u8]) -> KvResult<usize> {
        let check = Check {
            key: "k",
            location: l,
            lease_from: Instant::now() - age,
        };
        let (head, value) = bytes.split_at_mut(header_len(check.key.len()));
        check.verify(&[head, value])
    }

    #[test]
    fn a_read_must_fit_and_have_a_replica() {
        let l = location(b"value", 10_000, 1);
        assert!(readable(5, &l).is_ok());
        assert_eq!(readable(4, &l).unwrap_err().code, Code::InvalidParams);
        let none = location(b"value", 10_000, 0);
        assert_eq!(readable(5, &none).unwrap_err().code, Code::ObjectNotFound);
    }

    #[test]
    fn verify_accepts_the_object_and_rejects_others() {
        let l = location(b"value", 10_000, 1);
        let fresh = Duration::ZERO;
        assert_eq!(verify(&l, fresh, &mut object("k", b"value", 3)), Ok(5));
        // Another version under the read: transient, ask the master again.
        let e = verify(&l, fresh, &mut object("k", b"value", 4)).unwrap_err();
        assert_eq!(e.code, Code::TransferFail);
        // Flipped value bytes: never returned.
        let mut bad = object("k", b"value", 3);
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(
            verify(&l, fresh, &mut bad).unwrap_err().code,
            Code::ChecksumMismatch
        );
    }

    #[test]
    fn a_read_that_outlives_its_lease_is_discarded() {
        let l = location(b"value", 0, 1);
        let old = Duration::from_millis(5);
        let e = verify(&l, old, &mut object("k", b"value", 3)).unwrap_err();
        assert_eq!(e.code, Code::LeaseExpired);
    }
}
