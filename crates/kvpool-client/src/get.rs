//! Gets: find where each object is (the location cache, or `GetReplicaList`
//! at the master, which grants a read lease), read it from a replica
//! ([`crate::read`]), and ask the master again for cached locations that
//! turned out stale.
//!
//! A hint (a location without a live lease) is read while the master
//! confirms it, so it costs one round trip instead of two; the read stands
//! only if the master names the same version.

use std::time::Duration;

use kvpool_proto::msg::{self, ObjectLocation};
use kvpool_proto::{Code, KvError, KvResult};
use tokio::time::Instant;

use crate::retry::KeyRetry;
use crate::rpc::one;
use crate::Client;

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

    /// The tier of the replica a read tries first.
    pub fn tier(&self) -> kvpool_proto::msg::Tier {
        self.found
            .location
            .replicas
            .first()
            .map_or(Default::default(), |r| r.tier)
    }
}

/// A location to read from.
pub(crate) struct Found {
    pub(crate) location: ObjectLocation,
    /// When the read lease began (when the master was asked, or the read
    /// it extended happened).
    pub(crate) lease_from: Instant,
    via: Via,
}

impl Found {
    /// A location the master just gave, whose lease began at `lease_from`.
    pub(crate) fn from_master(location: ObjectLocation, lease_from: Instant) -> Found {
        Found {
            location,
            lease_from,
            via: Via::Master,
        }
    }
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
pub(crate) fn reborrow<'a>(items: &'a mut [GetInto<'_>], at: &[usize]) -> Vec<GetInto<'a>> {
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

impl Client {
    /// Reads `key`'s value into a new vector.
    pub async fn get(&self, key: &str) -> KvResult<Vec<u8>> {
        one(self.batch_get(&[key]).await)
    }

    /// Reads many values into new vectors; one result per key.
    pub async fn batch_get(&self, keys: &[&str]) -> Vec<KvResult<Vec<u8>>> {
        let new = |lens: &[usize]| lens.iter().map(|&n| Ok(vec![0u8; n])).collect();
        self.batch_get_with(keys, new).await
    }

    /// Reads many values, each into memory `alloc` makes at its value's
    /// exact size (a vector, a Python `bytes`), so nothing is copied after
    /// the read; one result per key. Each pass calls `alloc` once, with the
    /// sizes of the values it found, and wants one buffer (or error) per
    /// size back; the buffer of a read that failed is dropped.
    pub async fn batch_get_with<B, F>(&self, keys: &[&str], alloc: F) -> Vec<KvResult<B>>
    where
        B: AsRef<[u8]> + AsMut<[u8]>,
        F: Fn(&[usize]) -> Vec<KvResult<B>>,
    {
        let scoped = self.tenant_keys(keys);
        let refs: Vec<&str> = scoped.iter().map(String::as_str).collect();
        let keys = if scoped.is_empty() { keys } else { &refs[..] };
        let t0 = Instant::now();
        let mut retry = KeyRetry::new(keys.len(), &self.inner.cfg);
        loop {
            let round: Vec<&str> = retry.todo().iter().map(|&i| keys[i]).collect();
            let out = retry.pass(self.get_pass(&round, &alloc)).await;
            if !retry.settle(out).await {
                let out = retry.finish();
                let len = |_, v: &B| v.as_ref().len() as u64;
                (self.inner.metrics).record("get", &out, len, t0.elapsed());
                return out;
            }
        }
    }

    async fn get_pass<B, F>(&self, keys: &[&str], alloc: &F) -> Vec<KvResult<B>>
    where
        B: AsMut<[u8]>,
        F: Fn(&[usize]) -> Vec<KvResult<B>>,
    {
        let found = self.find(keys).await;
        let cached = cached_flags(&found);
        let mut out = self.read_new(keys, found, alloc).await;
        let stale = self.stale(keys, &cached, &out);
        if !stale.is_empty() {
            let again: Vec<&str> = stale.iter().map(|&i| keys[i]).collect();
            let found = self.locate_keys(&again).await;
            for (&i, r) in stale.iter().zip(self.read_new(&again, found, alloc).await) {
                out[i] = r;
            }
        }
        out
    }

    /// Reads located objects into buffers `alloc` makes.
    async fn read_new<B, F>(
        &self,
        keys: &[&str],
        mut found: Vec<KvResult<Found>>,
        alloc: &F,
    ) -> Vec<KvResult<B>>
    where
        B: AsMut<[u8]>,
        F: Fn(&[usize]) -> Vec<KvResult<B>>,
    {
        let lens: Vec<usize> = found
            .iter()
            .filter_map(|f| f.as_ref().ok())
            .map(|f| f.location.value_len as usize)
            .collect();
        let mut made = alloc(&lens).into_iter();
        // A buffer per key found; a key whose buffer was refused fails.
        let mut bufs: Vec<Option<B>> = (found.iter_mut())
            .map(|f| {
                f.as_ref().ok()?;
                let made = made.next().unwrap_or_else(|| {
                    Err(KvError::new(
                        Code::InternalError,
                        "allocator made too few buffers",
                    ))
                });
                made.map_err(|e| *f = Err(e)).ok()
            })
            .collect();
        let mut items: Vec<GetInto> = keys
            .iter()
            .zip(bufs.iter_mut())
            .map(|(key, b)| GetInto {
                key,
                dst: b.iter_mut().map(|b| b.as_mut()).collect(),
            })
            .collect();
        let res = self.read_found(&mut items, found).await;
        drop(items);
        res.into_iter()
            .zip(bufs)
            .map(|(r, b)| {
                r.and_then(|_| b.ok_or_else(|| KvError::new(Code::InternalError, "no buffer")))
            })
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
        one(self.locate_many(&[&self.scoped(key)]).await)
    }

    /// [`Self::locate`] for many keys: one master round trip for those not
    /// in the location cache.
    async fn locate_many(&self, keys: &[&str]) -> Vec<KvResult<Located>> {
        let out: Vec<KvResult<Located>> = keys
            .iter()
            .zip(self.find(keys).await)
            .map(|(k, f)| {
                f.map(|found| Located {
                    key: k.to_string(),
                    found,
                })
            })
            .collect();
        // A key located is counted as a get when it is read.
        self.inner.metrics.failures("get", &out);
        out
    }

    /// Reads a located object into `dst` (at least `value_len` bytes),
    /// verified like every read; returns the value length. A cached location
    /// that turned out stale is a transient error: fall back to [`Self::get`].
    pub async fn read_located_into(&self, l: Located, dst: &mut [u8]) -> KvResult<usize> {
        one(self.read_located_many(vec![(l, dst)]).await)
    }

    /// [`Self::read_located_into`] for many objects, transferred together.
    async fn read_located_many(&self, items: Vec<(Located, &mut [u8])>) -> Vec<KvResult<usize>> {
        let t0 = Instant::now();
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
        let len = |_, n: &usize| *n as u64;
        (self.inner.metrics).record("get", &out, len, t0.elapsed());
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

    /// Reads many values into caller buffers; one result (value length) per
    /// item. With a tenant's key the `dst` lists are taken out of `items`
    /// (the reads go through items of the tenant's keys).
    pub async fn batch_get_into(&self, items: &mut [GetInto<'_>]) -> Vec<KvResult<usize>> {
        if self.tenant().is_none() {
            return self.get_into_items(items).await;
        }
        let keys: Vec<String> = items
            .iter()
            .map(|i| self.scoped(i.key).into_owned())
            .collect();
        let mut scoped: Vec<GetInto> = keys
            .iter()
            .zip(items.iter_mut())
            .map(|(key, i)| GetInto {
                key,
                dst: std::mem::take(&mut i.dst),
            })
            .collect();
        self.get_into_items(&mut scoped).await
    }

    /// [`Self::batch_get_into`] of keys as sent to the master.
    async fn get_into_items(&self, items: &mut [GetInto<'_>]) -> Vec<KvResult<usize>> {
        let t0 = Instant::now();
        let mut retry = KeyRetry::new(items.len(), &self.inner.cfg);
        loop {
            let todo = retry.todo();
            let mut round = reborrow(items, &todo);
            let out = retry.pass(self.get_into_pass(&mut round)).await;
            drop(round);
            if !retry.settle(out).await {
                let out = retry.finish();
                let len = |_, n: &usize| *n as u64;
                (self.inner.metrics).record("get", &out, len, t0.elapsed());
                return out;
            }
        }
    }

    /// One pass of [`Self::batch_get_into`]: locate, read, and ask the
    /// master again for cached locations that turned out stale.
    async fn get_into_pass(&self, round: &mut [GetInto<'_>]) -> Vec<KvResult<usize>> {
        let keys: Vec<&str> = round.iter().map(|i| i.key).collect();
        let found = self.find(&keys).await;
        let cached = cached_flags(&found);
        let mut out = self.read_found(round, found).await;
        let stale = self.stale(&keys, &cached, &out);
        if !stale.is_empty() {
            let mut again = reborrow(round, &stale);
            let keys: Vec<&str> = again.iter().map(|i| i.key).collect();
            let found = self.locate_keys(&keys).await;
            for (&i, r) in stale.iter().zip(self.read_located(&mut again, found).await) {
                out[i] = r;
            }
        }
        out
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
        self.inner.cache.follow(self.inner.link.registrations());
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
    pub(crate) async fn locate_keys(&self, keys: &[&str]) -> Vec<KvResult<Found>> {
        // The lease runs from when the master was asked, not from its answer.
        let t0 = Instant::now();
        let located = self.call_keys(keys, |keys| msg::GetReplicaList { keys });
        (keys.iter().zip(located.await))
            .map(|(k, l)| {
                l.map(|location| {
                    self.inner.cache.insert(k, location.clone(), Some(t0));
                    Found {
                        location,
                        lease_from: t0,
                        via: Via::Master,
                    }
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(via: Via) -> KvResult<Found> {
        Ok(Found {
            location: ObjectLocation {
                value_len: 1,
                generation: 1,
                lease_ms: 0,
                replicas: Vec::new(),
            },
            lease_from: Instant::now(),
            via,
        })
    }

    #[test]
    fn cached_and_hinted_locations_are_flagged() {
        let f = [
            found(Via::Master),
            found(Via::Cache),
            found(Via::Hint),
            Err(KvError::from(Code::ObjectNotFound)),
        ];
        assert_eq!(cached_flags(&f), [false, true, true, false]);
    }

    #[test]
    fn reborrow_keeps_the_chosen_items_in_order() {
        let keys = ["a", "b", "c"];
        let mut bufs = vec![vec![0u8; 1], vec![0u8; 2], vec![0u8; 3]];
        let mut items = GetInto::each(&keys, &mut bufs);
        let again = reborrow(&mut items, &[0, 2]);
        let seen: Vec<(&str, usize)> = again.iter().map(|g| (g.key, g.dst[0].len())).collect();
        assert_eq!(seen, [("a", 1), ("c", 3)]);
    }
}
