//! The object map's operations: puts (start, end, revoke), reads (replica
//! lists with read leases, touches, existence) and removals.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kvpool_proto::msg::{
    ClientId, ObjectLocation, PutEndItem, PutGrant, PutItem, ReplicateConfig, SegmentId, TouchItem,
};
use kvpool_proto::{validate_key, Code, KvError, KvResult};
use tokio::time::Instant;

use crate::alloc::Region;
use crate::refusals::Refusal;

use super::ledger::{Pin, PinLimit};
use super::segments::Candidates;
use super::table::ObjectTable;
use super::tenants;
use super::*;

/// Eviction passes one allocation may trigger before it gives up (each frees
/// `eviction_ratio` of capacity).
const MAX_EVICTION_ROUNDS: usize = 16;

/// A point in time as nanoseconds since the state's epoch: 8 bytes where an
/// `Instant` takes 16, for the times every object carries (584 years of range).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Tick(pub(super) u64);

/// One written (or being written) copy set of an object, with its replicas
/// named by segment id (`S = SegNo` inside the compact [`ObjectTable`]).
#[derive(Debug, Clone)]
pub(super) struct Version<S = SegmentId> {
    pub(super) value_len: u64,
    pub(super) generation: u64,
    pub(super) replicas: Vec<(S, Region)>,
    pub(super) lease_until: Tick,
    /// `Tick(0)`: not pinned.
    pub(super) soft_pin_until: Tick,
    pub(super) last_access: Tick,
    /// When it was committed (or recovered).
    pub(super) committed_at: Tick,
    /// Never evicted; charged to a client's hard-pin limit.
    pub(super) hard_pin: Option<Pin>,
}

impl<S: Copy> Version<S> {
    /// The segments its replicas are on.
    pub(super) fn segments(&self) -> impl Iterator<Item = S> + '_ {
        self.replicas.iter().map(|(s, _)| *s)
    }
}

impl<S> Version<S> {
    /// The same version with its replicas' segments renamed by `f`, less
    /// those it has no name for.
    pub(super) fn map_segments<T>(
        self,
        f: impl FnMut((S, Region)) -> Option<(T, Region)>,
    ) -> Version<T> {
        Version {
            value_len: self.value_len,
            generation: self.generation,
            replicas: self.replicas.into_iter().filter_map(f).collect(),
            lease_until: self.lease_until,
            soft_pin_until: self.soft_pin_until,
            last_access: self.last_access,
            committed_at: self.committed_at,
            hard_pin: self.hard_pin,
        }
    }
}

/// A put in flight: who writes it, since when, and the version it will commit.
pub(super) struct Pending {
    pub(super) owner: ClientId,
    /// The writer's operation (see `msg::PutStart::op`).
    pub(super) op: u64,
    pub(super) started: Instant,
    pub(super) version: Version,
}

/// Where a key listing goes on from: a shard, and a slot number in it.
pub type ListPos = (u32, u32);

/// Slots one [`MasterState::list_keys`] call looks at, at most (an empty
/// shard counts one): a page costs about a millisecond whatever matches.
const LIST_SCAN: usize = 1 << 16;

/// One lock's worth of the object map: each key's committed version, and
/// apart from it (so the many committed objects carry no room for one) the
/// put of a new version in flight, at most one per key.
pub(super) struct Shard {
    pub(super) objects: ObjectTable,
    pub(super) pending: HashMap<Box<str>, Pending, KeyHasher>,
}

impl Shard {
    /// An empty shard whose holdings are counted in `ledger`, its commits
    /// and removals told to `events`.
    pub(super) fn new(ledger: Arc<super::Ledger>, events: Arc<crate::kv_events::KvEvents>) -> Self {
        Shard {
            objects: ObjectTable::new(ledger, events),
            pending: HashMap::default(),
        }
    }
}

/// Hashing of keys inside a shard: foldhash, seeded per process (keys are
/// the clients' choice), several times cheaper than SipHash on short keys.
pub(super) type KeyHasher = foldhash::fast::RandomState;

/// What [`MasterState::put_start_one`] did for a key.
pub(super) enum Started {
    /// Started a new put, which holds one of the client's puts in flight.
    New(PutGrant),
    /// Answered from what is there (the key exists, or this client's put of
    /// it is already in flight): nothing new is held.
    Held(PutGrant),
}

impl Started {
    fn grant(self) -> PutGrant {
        match self {
            Started::New(g) | Started::Held(g) => g,
        }
    }
}

impl MasterState {
    /// Reserves regions for each item; one result per item. Keys beyond the
    /// client's limit of puts in flight get `NO_AVAILABLE_HANDLE`.
    pub fn put_start(
        &self,
        client: ClientId,
        items: &[PutItem],
        config: &ReplicateConfig,
        upsert: bool,
        now: Instant,
    ) -> Vec<KvResult<PutGrant>> {
        self.put_start_op((client, 0), items, config, upsert, now)
    }

    /// [`Self::put_start`] for the writer's operation `op` (see
    /// `msg::PutStart::op`): only the same operation asking again gets a
    /// put of its own in flight back.
    pub fn put_start_op(
        &self,
        (client, op): (ClientId, u64),
        items: &[PutItem],
        config: &ReplicateConfig,
        upsert: bool,
        now: Instant,
    ) -> Vec<KvResult<PutGrant>> {
        if let Err(e) = self.require_writer(client, op, now) {
            return items.iter().map(|_| Err(e.clone())).collect();
        }
        // Puts in flight are reserved for the whole batch at once: the keys
        // beyond the client's limit are refused before any work, unless what
        // is there answers them (the key exists, or it is this client's put
        // in flight asked again after a lost answer).
        let max = self.cfg.limits.max_pending_per_client;
        let allowed = self.ledger.reserve_puts(client, items.len() as u64, max) as usize;
        let mut cands = self.candidates(now);
        // The pool's share sums every memory segment's capacity: worked
        // out once per batch, and only when the batch hard-pins.
        let pin_limits = config.with_hard_pin.then(|| {
            (
                self.cfg.limits.max_hard_pinned_per_client,
                self.pool_pin_limit(),
            )
        });
        let (mut started, mut refused, mut quota) = (0, 0, 0);
        let out = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                if i >= allowed {
                    validate_key(&item.key)?;
                    let shard = self.shard(&item.key).lock();
                    if let Some(answer) = self.existing_answer(&shard, (client, op), item, upsert)
                    {
                        return answer;
                    }
                    refused += 1;
                    return Err(KvError::new(
                        Code::NoAvailableHandle,
                        format!(
                            "this client has {max} puts in flight, its limit: end or revoke some first"
                        ),
                    ));
                }
                if let Err(e) =
                    self.ledger
                        .tenant_reserve(&item.key, item.value_len, &self.cfg.tenants)
                {
                    quota += 1;
                    return Err(e);
                }
                let r = self.put_start_one(
                    (client, op),
                    item,
                    (config, pin_limits),
                    upsert,
                    &mut cands,
                    now,
                );
                if matches!(&r, Ok(Started::New(_))) {
                    started += 1;
                } else {
                    // Nothing new is in flight: the reservation goes back.
                    self.ledger.tenant_end_put(&item.key, item.value_len);
                }
                r.map(Started::grant)
            })
            .collect();
        // Existing keys, retries of a put already in flight and failures hold nothing.
        self.ledger.release_puts(client, (allowed - started) as u64);
        if refused > 0 {
            let detail = format!(
                "client {client} has {max} puts in flight, its limit; {refused} of {} keys refused",
                items.len()
            );
            self.refusals.record(Refusal::PendingPuts, refused, &detail);
        }
        if quota > 0 {
            let detail = format!("{quota} of {} keys over their tenant's quota", items.len());
            self.refusals.record(Refusal::Quota, quota, &detail);
        }
        out
    }

    /// Gives up the put operations `ops` of `client` (see
    /// `msg::PutCancel`): revokes their puts in flight, and refuses a
    /// `PutStart` of one that comes later. Returns how many were revoked.
    pub fn put_cancel(&self, client: ClientId, ops: &[u64], now: Instant) -> u64 {
        self.cancel_ops(client, ops, now);
        let mut revoked = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let keys: Vec<Box<str>> = (shard.pending.iter())
                .filter(|(_, p)| p.owner == client && ops.contains(&p.op))
                .map(|(k, _)| k.clone())
                .collect();
            for k in keys {
                if let Ok(p) = self.take_pending(&mut shard, client, &k) {
                    revoked.push(p);
                }
            }
        }
        for p in &revoked {
            self.abandon(&p.version.replicas, p.version.generation, now);
        }
        revoked.len() as u64
    }

    /// Gives back what a put in flight held: it was revoked, expired, or
    /// lost its segments (a committed put keeps its pin in the table).
    pub(super) fn forget_pending(&self, key: &str, p: &Pending) {
        self.ledger.release_puts(p.owner, 1);
        if let Some(pin) = p.version.hard_pin {
            self.ledger.unpin(key, pin);
        }
        self.ledger.tenant_end_put(key, p.version.value_len);
    }

    /// What the key's current state means for a new put, if it decides the answer.
    pub(super) fn existing_answer(
        &self,
        shard: &Shard,
        (client, op): (ClientId, u64),
        item: &PutItem,
        upsert: bool,
    ) -> Option<KvResult<PutGrant>> {
        if let Some(p) = shard.pending.get(item.key.as_str()) {
            // The same operation retrying (its answer was lost): hand back
            // the same regions. Another operation of the same writer is
            // another writer: two calls of one client granted one region
            // would both be acknowledged with one's bytes in it (a
            // write-once put took over an upsert that way in the chaos
            // harness).
            if p.owner == client && p.op == op && p.version.value_len == item.value_len {
                return Some(Ok(PutGrant::Write {
                    generation: p.version.generation,
                    replicas: self.describe(&p.version.replicas),
                }));
            }
            return Some(Err(KvError::new(
                Code::ReplicaIsNotReady,
                format!("{:?} is being written by another client", item.key),
            )));
        }
        if !upsert && shard.objects.contains(&item.key) {
            return Some(Ok(PutGrant::Exists));
        }
        None
    }

    pub(super) fn put_start_one(
        &self,
        (client, op): (ClientId, u64),
        item: &PutItem,
        (config, pin_limits): (&ReplicateConfig, Option<(u64, u64)>),
        upsert: bool,
        cands: &mut Candidates,
        now: Instant,
    ) -> KvResult<Started> {
        validate_key(&item.key)?;
        if item.region_len < item.value_len || item.region_len == 0 {
            return Err(KvError::new(
                Code::InvalidParams,
                "region length smaller than the value",
            ));
        }
        if item.region_len > crate::alloc::MAX_REGION {
            return Err(KvError::new(
                Code::InvalidParams,
                format!(
                    "an object of {} bytes is over the largest one (256 GiB)",
                    item.region_len
                ),
            ));
        }
        if config.replica_num == 0 {
            return Err(KvError::new(
                Code::InvalidParams,
                "replica_num must be at least 1",
            ));
        }
        if let Some(answer) =
            self.existing_answer(&self.shard(&item.key).lock(), (client, op), item, upsert)
        {
            return answer.map(Started::Held);
        }
        // Allocate without holding the shard: eviction may need every shard.
        let want = config.replica_num as usize;
        if let Some(limits) = pin_limits {
            let more = item
                .region_len
                .saturating_mul(want.min(cands.ids.len()) as u64);
            let writer = (client, item.key.as_str());
            let fits = self
                .ledger
                .pin_fits(writer, more, limits, &self.cfg.tenants);
            if let Err(limit) = fits {
                return Err(self.pin_refused(writer, (limit, limits), more));
            }
        }
        let mut replicas = self.allocate(item.region_len, want, &config.preferred_segments, cands);
        // Counted only when placement fell short: it locks every allocator.
        if replicas.len() < want {
            let fit = self.fitting(item.region_len, Some(&cands.ids));
            if fit == 0 && self.fitting(item.region_len, None) > 0 {
                // Room exists but not now: never evict for segments that cannot
                // take the object anyway; the caller retries.
                self.free_now(&replicas, None);
                return Err(KvError::new(
                    Code::UnavailableInCurrentStatus,
                    "no segment takes new objects right now (recovering, draining or not heartbeating)",
                ));
            }
            // Evict only for replicas that room could give: with fewer segments
            // big enough than `replica_num`, the put is best effort, not a
            // reason to evict.
            let reachable = want.min(fit);
            // Freed bytes are not always a hole big enough (values of mixed
            // sizes fragment the segment), so evict more rounds until the
            // region fits or nothing evictable is left.
            let mut rounds = 0;
            while replicas.len() < reachable && rounds < MAX_EVICTION_ROUNDS {
                rounds += 1;
                self.free_now(&replicas, None);
                let need = item.region_len.saturating_mul(reachable as u64);
                let freed = self.evict_on(now, need, Some(&cands.ids));
                replicas = self.allocate(item.region_len, want, &config.preferred_segments, cands);
                if freed.objects == 0 {
                    break;
                }
            }
        }
        if replicas.is_empty() {
            let (cap, used) = self.usage();
            return Err(KvError::new(
                Code::NoAvailableHandle,
                format!(
                    "no segment has {} free bytes after eviction ({used} of {cap} bytes in use)",
                    item.region_len
                ),
            ));
        }
        let hard_pin = match pin_limits {
            None => None,
            Some(limits) => {
                // Allocation rounds regions up: charge what was placed.
                let bytes = replicas.iter().map(|(_, r)| r.len).sum();
                let writer = (client, item.key.as_str());
                let reserved = self
                    .ledger
                    .reserve_pin(writer, bytes, limits, &self.cfg.tenants);
                if let Err(limit) = reserved {
                    self.free_now(&replicas, None);
                    return Err(self.pin_refused(writer, (limit, limits), bytes));
                }
                Some(Pin {
                    owner: client,
                    bytes,
                })
            }
        };
        let mut shard = self.shard(&item.key).lock();
        if let Some(answer) = self.existing_answer(&shard, (client, op), item, upsert) {
            // Lost a race with another writer of the same key.
            drop(shard);
            self.free_now(&replicas, None);
            if let Some(pin) = hard_pin {
                self.ledger.unpin(&item.key, pin);
            }
            return answer.map(Started::Held);
        }
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let soft_pin_until = match config.with_soft_pin {
            true => {
                let ttl = config.soft_pin_ttl_ms.map(Duration::from_millis);
                // A TTL past the end of time pins for as long as there is.
                now.checked_add(ttl.unwrap_or(self.cfg.soft_pin_ttl))
                    .map_or(Tick(u64::MAX), |t| self.tick(t))
            }
            false => Tick(0),
        };
        let described = self.describe(&replicas);
        let at = self.tick(now);
        let pending = Pending {
            owner: client,
            op,
            started: now,
            version: Version {
                value_len: item.value_len,
                generation,
                replicas,
                lease_until: at,
                soft_pin_until,
                last_access: at,
                committed_at: at,
                hard_pin,
            },
        };
        shard.pending.insert(item.key.as_str().into(), pending);
        Ok(Started::New(PutGrant::Write {
            generation,
            replicas: described,
        }))
    }

    /// Bytes all clients' hard pins may take together: their share of the
    /// memory tier's capacity.
    fn pool_pin_limit(&self) -> u64 {
        let (capacity, _) = self.usage();
        (capacity as f64 * self.cfg.limits.max_hard_pinned_ratio) as u64
    }

    /// The refusal of a hard pin of `more` bytes of `key` by `client`,
    /// which would pass `limit` (of the `(client, pool)` limits checked, or
    /// the key's tenant's quota).
    fn pin_refused(
        &self,
        (client, key): (ClientId, &str),
        (limit, (max, pool_max)): (PinLimit, (u64, u64)),
        more: u64,
    ) -> KvError {
        if let (PinLimit::Tenant(quota), Some(name)) = (limit, tenants::owner(key)) {
            let e = tenants::quota_error(name, tenants::Over::Pinned(quota));
            return self.refusals.refuse(Refusal::HardPinnedTenant, e);
        }
        let message = match limit {
            PinLimit::Client => {
                let held = self.ledger.held(client).pinned;
                format!("client {client} holds {held} hard-pinned bytes; {more} more would pass its limit of {max}")
            }
            PinLimit::Pool | PinLimit::Tenant(_) => format!(
                "{} bytes of the pool are hard-pinned; {more} more would pass the pool's limit of {pool_max} ({:.0}% of its memory)",
                self.ledger.pinned(),
                self.cfg.limits.max_hard_pinned_ratio * 100.0
            ),
        };
        let reason = match limit {
            PinLimit::Client => Refusal::HardPinnedBytes,
            PinLimit::Pool | PinLimit::Tenant(_) => Refusal::HardPinnedPool,
        };
        self.refusals
            .refuse(reason, KvError::new(Code::NoAvailableHandle, message))
    }

    /// Commits written objects; one result per key.
    pub fn put_end(
        &self,
        client: ClientId,
        items: &[PutEndItem],
        now: Instant,
    ) -> Vec<KvResult<()>> {
        items
            .iter()
            .map(|i| self.put_end_one(client, &i.key, i.generation, now))
            .collect()
    }

    pub(super) fn take_pending(
        &self,
        shard: &mut Shard,
        client: ClientId,
        key: &str,
    ) -> KvResult<Pending> {
        match shard.pending.get(key) {
            None => {
                return Err(KvError::new(
                    Code::ObjectNotFound,
                    format!("no put of {key:?} in flight"),
                ))
            }
            Some(p) if p.owner != client => {
                return Err(KvError::new(
                    Code::IllegalClient,
                    format!("put of {key:?} belongs to another client"),
                ))
            }
            Some(_) => {}
        }
        let p = shard
            .pending
            .remove(key)
            .ok_or_else(|| KvError::from(Code::InternalError))?;
        self.forget_pending(key, &p);
        Ok(p)
    }

    pub(super) fn put_end_one(
        &self,
        client: ClientId,
        key: &str,
        generation: u64,
        now: Instant,
    ) -> KvResult<()> {
        validate_key(key)?;
        let mut shard = self.shard(key).lock();
        match shard.pending.get(key) {
            Some(p) if p.version.generation == generation => {
                if p.owner != client {
                    return Err(KvError::new(
                        Code::IllegalClient,
                        format!("put of {key:?} belongs to another client"),
                    ));
                }
            }
            // A retried PutEnd whose first attempt committed this very version.
            _ if shard.objects.get(key).map(|v| v.generation) == Some(generation) => return Ok(()),
            _ => {
                return Err(KvError::new(
                    Code::ObjectNotFound,
                    format!(
                        "no put of {key:?} generation {generation} in flight (revoked or expired)"
                    ),
                ))
            }
        }
        let p = shard
            .pending
            .remove(key)
            .ok_or_else(|| KvError::from(Code::InternalError))?;
        let owner = p.owner;
        // A segment may have gone away while the bytes were being written.
        let mut v = self.pack(p.version);
        // What the put reserved of its tenant's quota: the committed object
        // is charged by the table.
        self.ledger.tenant_end_put(key, v.value_len);
        if v.replicas.is_empty() {
            self.ledger.release_puts(owner, 1);
            if let Some(pin) = v.hard_pin {
                self.ledger.unpin(key, pin);
            }
            return Err(KvError::new(
                Code::WriteFail,
                format!("every segment of {key:?} went away"),
            ));
        }
        // Committed: no longer in flight; its pin now goes with the object.
        self.ledger.release_puts(owner, 1);
        v.last_access = self.tick(now);
        v.committed_at = v.last_access;
        tracing::trace!(target: "kvpool_keys", key, generation, replicas = ?v.replicas,
            replaced = ?shard.objects.get(key).map(|o| o.generation), "committed");
        self.written(key);
        if let Some(old) = shard.objects.insert(key, v) {
            drop(shard);
            self.release(key, self.unpack(old), now);
        }
        Ok(())
    }

    /// Abandons puts in flight; one result per key.
    pub fn put_revoke(&self, client: ClientId, keys: &[String], now: Instant) -> Vec<KvResult<()>> {
        keys.iter()
            .map(|k| {
                validate_key(k)?;
                let mut shard = self.shard(k).lock();
                let p = self.take_pending(&mut shard, client, k)?;
                drop(shard);
                self.abandon(&p.version.replicas, p.version.generation, now);
                Ok(())
            })
            .collect()
    }

    /// Finds committed `key` and extends its read lease; `then` runs under
    /// its shard's lock.
    pub(super) fn with_lease<T>(
        &self,
        key: &str,
        now: Instant,
        then: impl FnOnce(&mut ObjectTable, u32) -> T,
    ) -> KvResult<T> {
        validate_key(key)?;
        let mut shard = self.shard(key).lock();
        let objects = &mut shard.objects;
        let i = objects
            .find(key)
            .ok_or_else(|| KvError::new(Code::ObjectNotFound, format!("{key:?} not found")))?;
        let v = objects.at_mut(i);
        v.lease_until = v.lease_until.max(self.tick(now + self.cfg.lease_ttl));
        Ok(then(objects, i))
    }

    /// [`Self::with_lease`] as a read takes it: a use counted too.
    fn leased<T>(
        &self,
        key: &str,
        now: Instant,
        then: impl FnOnce(&mut ObjectTable, u32) -> T,
    ) -> KvResult<T> {
        self.with_lease(key, now, |objects, i| {
            objects.at_mut(i).last_access = self.tick(now);
            then(objects, i)
        })
    }

    /// Locates committed objects and grants each a read lease.
    pub fn get_replica_list(&self, keys: &[String], now: Instant) -> Vec<KvResult<ObjectLocation>> {
        let suspect = self.suspect_segments();
        keys.iter()
            .map(|k| {
                let (value_len, generation, mut replicas) = self.leased(k, now, |objects, i| {
                    let v = objects.at(i);
                    let (value_len, generation) = (v.value_len, v.generation);
                    self.read_on_disk(objects, i);
                    (
                        value_len,
                        generation,
                        self.describe_numbered(objects.replicas(i)),
                    )
                })?;
                if !suspect.is_empty() {
                    // Readers try replicas in order: live stores first.
                    replicas.sort_by_key(|r| suspect.contains(&r.segment));
                }
                Ok(ObjectLocation {
                    value_len,
                    generation,
                    lease_ms: ms(self.cfg.lease_ttl),
                    replicas,
                })
            })
            .collect()
    }

    /// Counts reads a client made through cached locations as if located
    /// when they happened: recency, and a read lease from then. Per item,
    /// whether that version is still the current one and its lease renewed
    /// (see [`Self::renewable`]).
    pub fn touch(&self, items: &[TouchItem], now: Instant) -> Vec<bool> {
        items
            .iter()
            .map(|it| {
                if validate_key(&it.key).is_err() {
                    return false;
                }
                let at = now
                    .checked_sub(Duration::from_micros(it.age_us))
                    .unwrap_or(now);
                if !self.renewable(&it.key, at) {
                    return false;
                }
                let mut shard = self.shard(&it.key).lock();
                let objects = &mut shard.objects;
                let Some(i) = objects
                    .find(&it.key)
                    .filter(|&i| objects.at(i).generation == it.generation)
                else {
                    return false;
                };
                let v = objects.at_mut(i);
                v.last_access = v.last_access.max(self.tick(at));
                v.lease_until = v.lease_until.max(self.tick(at + self.cfg.lease_ttl));
                self.read_on_disk(objects, i);
                true
            })
            .collect()
    }

    /// Value size of committed objects; does not touch recency or leases.
    pub fn exist(&self, keys: &[String]) -> Vec<KvResult<u64>> {
        keys.iter()
            .map(|k| {
                validate_key(k)?;
                self.shard(k)
                    .lock()
                    .objects
                    .get(k)
                    .map(|v| v.value_len)
                    .ok_or_else(|| KvError::new(Code::ObjectNotFound, format!("{k:?} not found")))
            })
            .collect()
    }

    /// [`Self::exist`] taking a read lease on each object found, and
    /// counting as a use of it, as [`Self::get_replica_list`] does.
    pub fn exist_leased(&self, keys: &[String], now: Instant) -> Vec<KvResult<u64>> {
        keys.iter()
            .map(|k| self.leased(k, now, |objects, i| objects.at(i).value_len))
            .collect()
    }

    /// Up to `limit` (one at least) committed keys that `keep` accepts,
    /// with their value sizes, in table order from `from` (shard, slot;
    /// `(0, 0)` to start), and where to go on from (`None`: every shard
    /// done). A page ends once it holds `max_bytes` of keys (one key at
    /// least), or after [`LIST_SCAN`] slots, so one
    /// call holds each shard lock briefly and does bounded work however
    /// few keys match. Slot numbers never move and the position only grows:
    /// a key put or removed meanwhile may be missed or (put again in a
    /// later slot) listed twice, and the listing always ends.
    pub fn list_keys(
        &self,
        keep: impl Fn(&str) -> bool,
        from: ListPos,
        limit: usize,
        max_bytes: usize,
    ) -> (Vec<(String, u64)>, Option<ListPos>) {
        let (mut shard, mut slot) = from;
        let (mut out, mut bytes, mut scanned) = (Vec::new(), 0, 0);
        while (shard as usize) < self.shards.len() {
            let sh = self.shards[shard as usize].lock();
            let table = &sh.objects;
            while slot < table.filled() {
                // A page holds one key at least, so every call moves on.
                let full = !out.is_empty() && (out.len() >= limit || bytes >= max_bytes);
                if full || scanned >= LIST_SCAN {
                    return (out, Some((shard, slot)));
                }
                scanned += 1;
                if let Some(s) = table.occupied(slot) {
                    let k = table.key(slot);
                    if keep(&k) {
                        bytes += k.len();
                        out.push((k.into_owned(), s.value_len));
                    }
                }
                slot += 1;
            }
            drop(sh);
            (shard, slot) = (shard + 1, 0);
            // An empty shard costs a lock: counted as a slot looked at.
            scanned += 1;
            if scanned >= LIST_SCAN && (shard as usize) < self.shards.len() {
                return (out, Some((shard, 0)));
            }
        }
        (out, None)
    }

    pub(super) fn remove_in(
        &self,
        shard: &mut Shard,
        key: &str,
        force: bool,
        now: Instant,
    ) -> KvResult<Version> {
        let v = shard
            .objects
            .get(key)
            .ok_or_else(|| KvError::new(Code::ObjectNotFound, format!("{key:?} not found")))?;
        if !force && v.lease_until > self.tick(now) {
            return Err(KvError::new(
                Code::ObjectHasLease,
                format!("{key:?} has a live read lease"),
            ));
        }
        let v = shard
            .objects
            .remove(key)
            .ok_or_else(|| KvError::from(Code::InternalError))?;
        // A copy on a given-up segment must not bring it back either.
        self.written(key);
        Ok(self.unpack(v))
    }

    /// Removes objects; one result per key.
    pub fn remove(&self, keys: &[String], force: bool, now: Instant) -> Vec<KvResult<()>> {
        keys.iter()
            .map(|k| {
                validate_key(k)?;
                let v = self.remove_in(&mut self.shard(k).lock(), k, force, now)?;
                tracing::trace!(target: "kvpool_keys", key = k, generation = v.generation, "removed");
                // A forced remove frees at once, as the caller asked; a reader still
                // in flight on it fails its header or checksum check, never returns
                // the new bytes.
                self.retire_removed(k, &v, now);
                Ok(())
            })
            .collect()
    }

    /// Removes committed objects whose key `matches`; returns how many. Objects
    /// under a live lease are kept unless `force`.
    pub fn remove_matching(
        &self,
        matches: impl Fn(&str) -> bool,
        force: bool,
        now: Instant,
    ) -> u64 {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            let keys: Vec<Box<str>> = sh
                .objects
                .iter()
                .map(|(i, _)| sh.objects.key(i))
                .filter(|k| matches(k))
                .map(Box::from)
                .collect();
            let mut versions = Vec::new();
            for k in keys {
                if let Ok(v) = self.remove_in(&mut sh, &k, force, now) {
                    versions.push((k, v));
                }
            }
            drop(sh);
            removed += versions.len() as u64;
            for (k, v) in versions {
                self.retire_removed(&k, &v, now);
            }
        }
        removed
    }
}
