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

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::future::{abortable, join_all, AbortHandle};
use futures::stream::{FuturesUnordered, StreamExt};
use kvpool_format::{header_len, ObjectHeader};
use kvpool_proto::msg::{ObjectLocation, ReadReq, Tier};
use kvpool_proto::{Code, KvError, KvResult};
use tokio::time::Instant;

use crate::fanout::THREAD_BYTES;
use crate::get::{reborrow, Found, GetInto};
use crate::placement::{due, rounds};
use crate::transport::{Dir, Job, Kind, Read, ReadOp, Share, Verify};
use crate::Client;

/// A second read of one object, from another replica, for a hedge.
#[derive(Clone, Copy)]
struct Hedge {
    /// The item it answers.
    item: usize,
    /// Which replica to read.
    replica: usize,
}

/// What a round's reads came to: per-item results, and the objects read
/// aside by hedges (header, then value) that answered first.
type Raced = (Vec<(usize, KvResult<usize>)>, HashMap<usize, Vec<u8>>);

/// A share's reads, answered together or dropped once hedged: (share
/// index, its results).
type Running<'a> = Pin<
    Box<
        dyn Future<
                Output = (
                    usize,
                    Result<Vec<(usize, KvResult<usize>)>, futures::future::Aborted>,
                ),
            > + Send
            + 'a,
    >,
>;

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
        let segments: Vec<_> = locations
            .iter()
            .flatten()
            .flat_map(|l| l.replicas.iter())
            .filter(|r| r.tier == Tier::Memory)
            .map(|r| r.segment)
            .collect();
        self.prepare(&segments).await;
        // What each read must find; hedges outlive a round's borrow of
        // `items`, so the keys are copied out.
        let checks: Vec<Option<Check>> = items
            .iter()
            .zip(&locations)
            .zip(&leases)
            .map(|((item, l), &lease_from)| {
                l.as_ref().map(|location| Check {
                    key: item.key,
                    location,
                    lease_from,
                })
            })
            .collect();
        let verify = |i: usize, dst: &[&mut [u8]], sum: u64| match &checks[i] {
            Some(c) => c.verify(dst, sum),
            None => Err(KvError::from(Code::InternalError)),
        };
        let verify: Verify = &verify;
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
            let mut reads: HashMap<Kind, Vec<Read>> = HashMap::new();
            // Per transport and store: its reads, and the hedges of those
            // that have one.
            let mut hedges: HashMap<(Kind, &str), (usize, Vec<Hedge>)> = HashMap::new();
            let mut done: Vec<(usize, KvResult<usize>)> = Vec::new();
            let (mut tcp_bytes, mut shm_bytes) = (0u64, 0u64);
            for ((item, head), &i) in reborrow(items, &todo)
                .into_iter()
                .zip(&mut heads)
                .zip(&todo)
            {
                let Some(l) = &locations[i] else { continue };
                let rep = &l.replicas[round];
                let kind = match self.route(rep.segment, rep.tier, Dir::Read) {
                    Ok(kind) => kind,
                    Err(e) => {
                        done.push((i, Err(e)));
                        continue;
                    }
                };
                let len = head.len() as u64 + l.value_len;
                let mut dst: Vec<&mut [u8]> = Vec::with_capacity(1 + item.dst.len());
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
                match kind {
                    Kind::Shm => shm_bytes += len,
                    Kind::Tcp => tcp_bytes += len,
                }
                if hedging {
                    let h = hedges.entry((kind, &rep.endpoint)).or_default();
                    h.0 += 1;
                    h.1.extend(self.hedge_for(i, l, round));
                }
                let req = ReadReq {
                    segment: rep.segment,
                    offset: rep.offset,
                    len,
                    grant: rep.read_grant(l.generation),
                };
                reads.entry(kind).or_default().push(Read {
                    item: i,
                    peer: rep.endpoint.clone(),
                    op: ReadOp { req, dst },
                });
            }
            let spread = self.spread();
            let transports = &self.inner.transports;
            let shares: Vec<(Kind, Share)> = reads
                .into_iter()
                .flat_map(|(kind, reads)| {
                    let shares = transports.get(kind).read(reads, verify, spread);
                    shares.into_iter().map(move |s| (kind, s))
                })
                .collect();
            // A store's share is hedged only if every read in it is: a store
            // is waited for as long as one of its objects has no other way.
            let hedged: Vec<Vec<Hedge>> = shares
                .iter()
                .map(|(kind, s)| {
                    let h = s.peer.as_deref().and_then(|p| hedges.remove(&(*kind, p)));
                    h.filter(|(n, h)| *n == h.len())
                        .map(|(_, h)| h)
                        .unwrap_or_default()
                })
                .collect();
            let peered = shares.iter().any(|(_, s)| s.peer.is_some());
            let big = tcp_bytes + shm_bytes >= THREAD_BYTES;
            (self.inner.metrics).transferred("read", tcp_bytes, shm_bytes);
            let t0 = Instant::now();
            let mut wins = HashMap::new();
            if !big && hedged.iter().any(|h| !h.is_empty()) {
                let aside = |h: Hedge| {
                    let check = checks[h.item].as_ref();
                    async move {
                        let c = check.ok_or_else(|| KvError::from(Code::InternalError))?;
                        self.read_aside(h, c.key.len(), c.location, verify).await
                    }
                };
                let (got, won) = self.race(shares, hedged, aside).await;
                done.extend(got);
                wins = won;
            } else {
                let jobs: Vec<Job<usize>> = shares.into_iter().flat_map(|(_, s)| s.jobs).collect();
                done.extend(self.run_jobs(jobs, big).await.into_iter().flatten());
            }
            if hedging && !big && peered {
                self.inner.hedge.record(t0.elapsed());
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
        let transports = &self.inner.transports;
        for (r, l) in results.iter_mut().zip(&locations) {
            let Some(l) = l else { continue };
            if r.as_ref().is_err_and(|e| e.is_retryable())
                && l.replicas.iter().all(|rep| {
                    self.route(rep.segment, rep.tier, Dir::Read)
                        .is_ok_and(|k| transports.get(k).is_down(&rep.endpoint))
                })
            {
                *r = r.clone().map_err(KvError::settled);
            }
        }
        results
    }
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
    /// The hedge for item `i` (at `l`), read in `round` from a store: its
    /// first later replica that is read without a store (shared memory), or
    /// on another store not known to be down. `None` when there is none.
    fn hedge_for(&self, i: usize, l: &ObjectLocation, round: usize) -> Option<Hedge> {
        let first = &l.replicas[round].endpoint;
        let transports = &self.inner.transports;
        let replica = (round + 1..l.replicas.len()).find(|&j| {
            let r = &l.replicas[j];
            match self.route(r.segment, r.tier, Dir::Read) {
                Ok(Kind::Shm) => true,
                Ok(k) => &r.endpoint != first && !transports.get(k).is_down(&r.endpoint),
                Err(_) => false,
            }
        })?;
        Some(Hedge { item: i, replica })
    }

    /// Runs a small round's `shares` (each tagged with its transport); a
    /// share still reading after the hedge delay has its `hedged` objects
    /// (all of its objects, or none) read from their next replica with
    /// `aside`, and is dropped once they all answered (and its store
    /// ranked after its peers for a while: see [`Transport::outrun`]).
    ///
    /// [`Transport::outrun`]: crate::transport::Transport::outrun
    async fn race<'a, A, F>(
        &self,
        shares: Vec<(Kind, Share<'a>)>,
        hedged: Vec<Vec<Hedge>>,
        aside: A,
    ) -> Raced
    where
        A: Fn(Hedge) -> F,
        F: Future<Output = KvResult<Vec<u8>>>,
    {
        let mut running: FuturesUnordered<Running<'a>> = FuturesUnordered::new();
        let mut stop: Vec<Option<AbortHandle>> = Vec::new();
        let mut peers = Vec::new();
        for (s, (kind, share)) in shares.into_iter().enumerate() {
            let (reads, handle) = abortable(join_all(share.jobs));
            stop.push(Some(handle));
            peers.push((kind, share.peer));
            running.push(Box::pin(
                async move { (s, reads.await.map(|r| r.concat())) },
            ));
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
                    Some((s, Ok(got))) => {
                        stop[s] = None;
                        done.extend(got);
                    }
                    Some((_, Err(_aborted))) => {}
                },
                () = &mut timer, if hedged.is_some() => {
                    for (s, hs) in hedged.take().unwrap_or_default().into_iter().enumerate() {
                        if stop[s].is_some() {
                            for h in hs {
                                let read = aside(h);
                                asked.push(async move { (s, h.item, read.await) });
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
                                if let (kind, Some(peer)) = &peers[s] {
                                    self.inner.transports.get(*kind).outrun(peer);
                                }
                            }
                        }
                    }
                    Err(e) => tracing::debug!(item, error = %e, "hedged read failed"),
                },
            }
        }
        (done, wins)
    }

    /// Reads replica `h.replica` of `h`'s object (at `l`, with a key of
    /// `key_len` bytes) into a buffer of its own (header, then value),
    /// verified.
    async fn read_aside(
        &self,
        h: Hedge,
        key_len: usize,
        l: &ObjectLocation,
        verify: Verify<'_>,
    ) -> KvResult<Vec<u8>> {
        let rep = &l.replicas[h.replica];
        let kind = self.route(rep.segment, rep.tier, Dir::Read)?;
        let hl = header_len(key_len);
        let mut object = vec![0u8; hl + l.value_len as usize];
        {
            let (head, value) = object.split_at_mut(hl);
            let req = ReadReq {
                segment: rep.segment,
                offset: rep.offset,
                len: hl as u64 + l.value_len,
                grant: rep.read_grant(l.generation),
            };
            let read = Read {
                item: h.item,
                peer: rep.endpoint.clone(),
                op: ReadOp {
                    req,
                    dst: vec![head, value],
                },
            };
            let shares = (self.inner.transports.get(kind)).read(vec![read], verify, self.spread());
            let got = join_all(shares.into_iter().flat_map(|s| s.jobs)).await;
            match got.into_iter().flatten().next() {
                Some((_, r)) => r?,
                None => return Err(KvError::from(Code::InternalError)),
            };
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
    /// names the expected object, the value's checksum (`sum`, taken by the
    /// transport as the bytes landed) matches it, and the read finished
    /// within its lease. Returns the value length.
    pub(crate) fn verify(&self, dst: &[&mut [u8]], sum: u64) -> KvResult<usize> {
        let (key, l) = (self.key, self.location);
        let head = dst
            .first()
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
        if sum != h.checksum {
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
    use kvpool_format::value_checksum;
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
        let sum = value_checksum(&[value]);
        check.verify(&[head, value], sum)
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
