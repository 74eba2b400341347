//! Reading located objects from their replicas, and verifying every read.
//!
//! Reads go in rounds ([`crate::placement`]): each round reads one replica
//! of every object still unread, over that replica's route: a `memcpy` from
//! a mapped segment, or the store's TCP data plane. Each read lands header
//! first, then the value straight into the caller's buffers, and counts
//! only once [`Check::verify`] passes.
//!
//! With `hedge_reads`, a small round whose reads over TCP are slower than
//! most is hedged ([`crate::hedge`]): the objects of a store that has not
//! answered yet are read from their next replica into buffers of their own,
//! and once every object of that store has a verified answer, its reads are
//! dropped and the answers copied to the caller.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::future::{abortable, join_all, AbortHandle};
use futures::stream::{FuturesUnordered, StreamExt};
use kvpool_format::{header_len, value_checksum, ObjectHeader};
use kvpool_proto::msg::{ObjectLocation, ReadReq, Tier};
use kvpool_proto::{Code, KvError, KvResult};
use kvpool_transfer::data::ReadOp;
use tokio::time::Instant;

use crate::fanout::{cores, lanes, split, Job, SPREAD_BYTES};
use crate::get::{reborrow, Found, GetInto};
use crate::placement::{due, rounds, Route};
use crate::transport::tcp::{broken, StoreReads};
use crate::transport::{not_mappable, Routes};
use crate::Client;

/// A second read of one object, from another replica, for a hedge.
struct Hedge<'a> {
    /// The item it answers.
    item: usize,
    key: &'a str,
    location: &'a ObjectLocation,
    /// Which replica to read.
    replica: usize,
    lease_from: Instant,
}

/// What a round's reads came to: per-item results, and the objects read
/// aside by hedges (header, then value) that answered first.
type Raced = (Vec<(usize, KvResult<usize>)>, HashMap<usize, Vec<u8>>);

/// A round's reads from one store, or its shared-memory copies (no store):
/// all answered together, or dropped once hedged.
type Share<'a> = Pin<
    Box<
        dyn Future<
                Output = (
                    Option<usize>,
                    Result<Vec<(usize, KvResult<usize>)>, futures::future::Aborted>,
                ),
            > + Send
            + 'a,
    >,
>;

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
        let hedging = self.inner.cfg.hedge_reads;
        // Hedges outlive the round's borrow of `items`: they hold the keys.
        let keys: Vec<&str> = if hedging {
            items.iter().map(|i| i.key).collect()
        } else {
            Vec::new()
        };
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
        // other is left, and then they fail at once; those on stores that
        // lost a hedge race lately go after the live ones.
        let tcp = &self.inner.transports.tcp;
        for l in locations.iter_mut().flatten() {
            if l.replicas.len() > 1 && l.replicas.iter().any(|r| tcp.rank(&r.endpoint) > 0) {
                l.replicas.sort_by_cached_key(|r| tcp.rank(&r.endpoint));
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
            // Per store: its reads, and the hedges of those that have one.
            let mut groups: HashMap<&str, (Vec<TcpRead>, Vec<Hedge>)> = HashMap::new();
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
                let route = routes.to_replica(rep);
                match route {
                    Route::Shm(map) => {
                        local_bytes += hl + l.value_len;
                        local.push((i, map, rep.offset, dst, check));
                    }
                    Route::Unmappable => done.push((i, Err(not_mappable(rep.segment)))),
                    Route::Tcp => {
                        let group = groups.entry(&rep.endpoint).or_default();
                        if hedging {
                            group
                                .1
                                .extend(self.hedge_for(i, keys[i], l, round, leases[i], &routes));
                        }
                        bytes += hl + l.value_len;
                        let req = ReadReq {
                            segment: rep.segment,
                            offset: rep.offset,
                            len: hl + l.value_len,
                            grant: rep.read_grant(l.generation),
                        };
                        group.0.push(((i, check), ReadOp { req, dst }));
                    }
                }
            }
            // A store's reads wait in one queue its connections take from,
            // so one that runs ahead does more and none idles on a tail.
            let mut hedged: Vec<Vec<Hedge>> = Vec::new();
            let stores: Vec<StoreReads<(usize, Check)>> = groups
                .into_iter()
                .map(|(ep, (group, h))| {
                    // Hedged only if every read there is: a store is waited
                    // for as long as one of its objects has no other way.
                    hedged.push(if h.len() == group.len() {
                        h
                    } else {
                        Vec::new()
                    });
                    let bytes: u64 = group.iter().map(|(_, o)| o.req.len).sum();
                    let lanes = lanes(bytes, group.len(), self.inner.cfg.conns_per_store);
                    let pool = self.inner.transports.tcp.pool(ep);
                    StoreReads::new(pool, lanes, group.into_iter().collect::<VecDeque<_>>())
                })
                .collect();
            let mut copies: Vec<Job<usize>> = Vec::new();
            // Shared-memory reads are copies and checksums: big batches
            // spread them over the cores too.
            for chunk in split(local, local_bytes, cores()) {
                copies.push(Box::pin(async move {
                    chunk
                        .into_iter()
                        .map(|(i, map, offset, mut dst, check)| {
                            let r = map.read(offset, &mut dst).and_then(|()| check.verify(&dst));
                            (i, r)
                        })
                        .collect()
                }));
            }
            let timeout = kvpool_net::deadline::cap(self.inner.cfg.timeout);
            let big = bytes + local_bytes >= SPREAD_BYTES;
            (self.inner.metrics).transferred("read", bytes, local_bytes);
            let t0 = Instant::now();
            let mut wins = HashMap::new();
            if !big && hedged.iter().any(|h| !h.is_empty()) {
                let shares: Vec<Job<usize>> = stores
                    .iter()
                    .map(|s| -> Job<usize> {
                        let lanes = join_all((0..s.lanes).map(|_| lane(s, timeout)));
                        Box::pin(async move { lanes.await.concat() })
                    })
                    .collect();
                let names: Vec<&str> = stores.iter().map(StoreReads::addr).collect();
                let (got, won) = self
                    .race(copies, shares, (hedged, &names), &routes, timeout)
                    .await;
                done.extend(got);
                wins = won;
            } else {
                let mut jobs = copies;
                for store in &stores {
                    jobs.extend((0..store.lanes).map(|_| lane(store, timeout)));
                }
                done.extend(self.run_jobs(jobs, big).await.into_iter().flatten());
            }
            if hedging && !big && !stores.is_empty() {
                self.inner.hedge.record(t0.elapsed());
            }
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
            drop(heads);
            let mut used = 0;
            for (i, object) in wins {
                if results[i].is_err() {
                    let value = &object[header_len(items[i].key.len())..];
                    results[i] = Ok(copy_value(value, &mut items[i].dst));
                    used += 1;
                }
            }
            self.inner.metrics.hedges_won(used);
        }
        // An object whose every replica is on a store known to be down is a
        // miss for this call: asking again would find the same stores down
        // (until a probe finds one back), and would keep the caller waiting.
        for (r, l) in results.iter_mut().zip(&locations) {
            let Some(l) = l else { continue };
            if r.as_ref().is_err_and(|e| e.is_retryable())
                && l.replicas.iter().all(|rep| {
                    matches!(routes.to_replica(rep), Route::Tcp) && tcp.is_down(&rep.endpoint)
                })
            {
                *r = r.clone().map_err(KvError::settled);
            }
        }
        results
    }
}

/// One lane of a store's reads, each verified as it lands (so a big batch
/// checksums on every core).
fn lane<'s, 'a>(
    store: &'s StoreReads<'a, (usize, Check<'a>)>,
    timeout: Duration,
) -> Job<'s, usize> {
    Box::pin(async move {
        store
            .lane(timeout)
            .await
            .into_iter()
            .map(|((i, check), op, r)| (i, r.map_err(broken).and_then(|()| check.verify(&op.dst))))
            .collect()
    })
}

/// Copies an object's `value` into `dst` in order; returns its length.
fn copy_value(mut value: &[u8], dst: &mut [&mut [u8]]) -> usize {
    let len = value.len();
    for d in dst.iter_mut() {
        let n = d.len().min(value.len());
        d[..n].copy_from_slice(&value[..n]);
        value = &value[n..];
    }
    len
}

impl Client {
    /// The hedge for item `i`, read in `round` over TCP: its first later
    /// replica on another store that is not known to be down. `None` when
    /// there is none.
    fn hedge_for<'a>(
        &self,
        i: usize,
        key: &'a str,
        l: &'a ObjectLocation,
        round: usize,
        lease_from: Instant,
        routes: &Routes,
    ) -> Option<Hedge<'a>> {
        let first = &l.replicas[round].endpoint;
        let tcp = &self.inner.transports.tcp;
        let replica = (round + 1..l.replicas.len()).find(|&j| {
            let r = &l.replicas[j];
            match routes.to_replica(r) {
                Route::Shm(_) => true,
                Route::Tcp => &r.endpoint != first && !tcp.is_down(&r.endpoint),
                Route::Unmappable => false,
            }
        })?;
        Some(Hedge {
            item: i,
            key,
            location: l,
            replica,
            lease_from,
        })
    }

    /// Runs a small round: `copies` (shared memory) and each store's
    /// `shares`; a store still reading after the hedge delay has its
    /// `hedged` objects (all of its objects, or none) read from their next
    /// replica, and is dropped once they all answered (and ranked after
    /// its peers for a while: see `tcp::Pools::outrun`). `names` are the
    /// stores' addresses.
    async fn race<'a>(
        &self,
        copies: Vec<Job<'a, usize>>,
        shares: Vec<Job<'a, usize>>,
        (hedged, names): (Vec<Vec<Hedge<'a>>>, &[&str]),
        routes: &'a Routes,
        timeout: Duration,
    ) -> Raced {
        let mut running: FuturesUnordered<Share<'a>> = FuturesUnordered::new();
        running.push(Box::pin(async move {
            (None, Ok(join_all(copies).await.concat()))
        }));
        let mut stop: Vec<Option<AbortHandle>> = Vec::new();
        for (s, share) in shares.into_iter().enumerate() {
            let (share, handle) = abortable(share);
            stop.push(Some(handle));
            running.push(Box::pin(async move { (Some(s), share.await) }));
        }
        let mut unanswered: Vec<usize> = hedged.iter().map(Vec::len).collect();
        let mut hedged = Some(hedged);
        let mut asked = FuturesUnordered::new();
        let mut done = Vec::new();
        let mut wins = HashMap::new();
        let timer = tokio::time::sleep(self.inner.hedge.delay());
        tokio::pin!(timer);
        loop {
            tokio::select! {
                next = running.next() => match next {
                    None => break,
                    Some((store, Ok(got))) => {
                        if let Some(s) = store {
                            stop[s] = None;
                        }
                        done.extend(got);
                    }
                    Some((_, Err(_aborted))) => {}
                },
                () = &mut timer, if hedged.is_some() => {
                    for (s, hs) in hedged.take().unwrap_or_default().into_iter().enumerate() {
                        if stop[s].is_some() {
                            for h in hs {
                                asked.push(async move { (s, h.item, self.read_aside(&h, routes, timeout).await) });
                            }
                        }
                    }
                    self.inner.metrics.hedged(asked.len() as u64);
                }
                Some((s, item, r)) = asked.next(), if !asked.is_empty() => match r {
                    Ok(object) => {
                        wins.insert(item, object);
                        unanswered[s] -= 1;
                        if unanswered[s] == 0 {
                            if let Some(h) = stop[s].take() {
                                h.abort();
                                self.inner.transports.tcp.outrun(names[s]);
                            }
                        }
                    }
                    Err(e) => tracing::debug!(item, error = %e, "hedged read failed"),
                },
            }
        }
        (done, wins)
    }

    /// Reads `h`'s replica of its object into a buffer of its own (header,
    /// then value), verified.
    async fn read_aside(
        &self,
        h: &Hedge<'_>,
        routes: &Routes,
        timeout: Duration,
    ) -> KvResult<Vec<u8>> {
        let (l, rep) = (h.location, &h.location.replicas[h.replica]);
        let hl = header_len(h.key.len());
        let mut object = vec![0u8; hl + l.value_len as usize];
        let (head, value) = object.split_at_mut(hl);
        let mut dst = vec![head, value];
        let check = Check {
            key: h.key,
            location: l,
            lease_from: h.lease_from,
        };
        match routes.to_replica(rep) {
            Route::Shm(map) => {
                map.read(rep.offset, &mut dst)?;
                check.verify(&dst)?;
            }
            Route::Unmappable => return Err(not_mappable(rep.segment)),
            Route::Tcp => {
                let req = ReadReq {
                    segment: rep.segment,
                    offset: rep.offset,
                    len: hl as u64 + l.value_len,
                    grant: rep.read_grant(l.generation),
                };
                let pool = self.inner.transports.tcp.pool(&rep.endpoint);
                let read = VecDeque::from([((h.item, check), ReadOp { req, dst })]);
                let store = StoreReads::new(pool, 1, read);
                let got = lane(&store, timeout).await.pop();
                match got {
                    Some((_, r)) => r?,
                    None => {
                        return Err(store
                            .unread()
                            .pop()
                            .map_or_else(|| KvError::from(Code::InternalError), |(_, e)| e))
                    }
                };
            }
        }
        Ok(object)
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
