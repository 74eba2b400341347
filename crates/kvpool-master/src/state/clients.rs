//! Registered clients and their liveness: heartbeats, the suspect state of
//! a silent store (kept through the grace period), and the sweep that
//! expires clients, their puts in flight and, after the grace, the
//! segments of dead stores.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kvpool_proto::msg::{ClientId, RegisterReply, SegmentId};
use kvpool_proto::{Code, KvError, KvResult};
use tokio::time::Instant;

use super::*;
use crate::refusals::Refusal;
use kvpool_proto::policy::Role;

/// A registered client (or store) and when it was last heard from.
pub(super) struct ClientEntry {
    pub(super) last_seen: Instant,
    pub(super) hostname: String,
    /// Silent past the TTL while lending segments: kept for the grace period.
    pub(super) suspect: bool,
    /// The connection its heartbeats came over closed: a store that crashed
    /// closes it at once, so its segments take no new objects from then
    /// until it is heard from again, instead of for its late heartbeats.
    pub(super) hung_up: bool,
    /// Registered by a peer that proved only the client role: such ids
    /// may not take the slots kept for stores.
    pub(super) engine: bool,
    /// The tenant whose key registered it, whose quota counts it.
    pub(super) tenant: Option<Arc<str>>,
    /// Put operations it gave up (`PutCancel`), the newest
    /// [`CANCELLED_OPS_KEPT`]: a `PutStart` of one arriving late is refused.
    pub(super) cancelled_ops: Vec<u64>,
}

/// The error of a call from a client this master does not know.
fn not_registered(id: ClientId) -> KvError {
    KvError::new(
        Code::ClientNotFound,
        format!("client {id} is not registered"),
    )
}

/// Cancelled put operations remembered per client: a late `PutStart`
/// arrives within one connection's delivery of the cancellation.
const CANCELLED_OPS_KEPT: usize = 64;

/// Most time between two heartbeats, whatever the TTL: a store that stops
/// is noticed within a few of them, not within half a long TTL.
const HEARTBEAT_AT_MOST: Duration = Duration::from_secs(1);

/// Heartbeats a lender may miss before its segments take no new objects.
const LATE_AFTER_BEATS: u32 = 3;

impl ClientEntry {
    /// Records a sign of life; true when a suspect store is live again.
    pub(super) fn seen(&mut self, id: ClientId, now: Instant) -> bool {
        self.last_seen = self.last_seen.max(now);
        self.hung_up = false;
        let back = std::mem::take(&mut self.suspect);
        if back {
            tracing::info!(client = %id, hostname = %self.hostname, "suspect store heartbeats again; its segments are live");
        }
        back
    }
}

/// A registered client as the status page lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClientInfo {
    /// Its id (hex).
    pub id: String,
    /// The host name it registered with.
    pub hostname: String,
    /// Milliseconds since it was last heard from.
    pub idle_ms: u64,
    /// Silent past the TTL while lending segments (kept for the grace).
    pub suspect: bool,
    /// The connection its heartbeats came over closed, and it has not been
    /// heard from since.
    pub hung_up: bool,
    /// Segments it lends (a store's); 0 for an engine's client.
    pub segments: usize,
}

impl MasterState {
    /// Every registered client, most recently heard from first.
    pub fn clients(&self, now: Instant) -> Vec<ClientInfo> {
        let mut lends: HashMap<ClientId, usize> = HashMap::new();
        for s in self.segments.read().values() {
            *lends.entry(s.owner).or_default() += 1;
        }
        let mut out: Vec<ClientInfo> = self
            .clients
            .lock()
            .iter()
            .map(|(id, c)| ClientInfo {
                id: id.to_string(),
                hostname: c.hostname.clone(),
                idle_ms: ms(now.saturating_duration_since(c.last_seen)),
                suspect: c.suspect,
                hung_up: c.hung_up,
                segments: lends.get(id).copied().unwrap_or(0),
            })
            .collect();
        out.sort_by_key(|c| c.idle_ms);
        out
    }

    /// Registers (or refreshes) a client in process, or for a peer that
    /// proved the store role or above; see [`Self::register_client_as`].
    pub fn register_client(
        &self,
        id: ClientId,
        hostname: &str,
        now: Instant,
    ) -> KvResult<RegisterReply> {
        self.register_client_as(id, hostname, now, (Role::Admin, None))
    }

    /// Registers (or refreshes) a client for a peer that proved `role`. A
    /// new client beyond [`ClientLimits::max_clients`](super::ClientLimits)
    /// is refused with `UNAVAILABLE_IN_CURRENT_STATUS` (a store retries
    /// until one leaves); a registered one always refreshes. Peers with
    /// only the client role may register at most nine tenths of the
    /// limit, rounded down, and never the last slot: the rest is kept for
    /// stores, so one holder of the client key registering ids in a loop
    /// cannot keep restarted stores out.
    pub fn register_client_as(
        &self,
        id: ClientId,
        hostname: &str,
        now: Instant,
        (role, tenant): (Role, Option<&Arc<str>>),
    ) -> KvResult<RegisterReply> {
        let max = self.cfg.limits.max_clients;
        let engine = role < Role::Store;
        let engines_max = max - max.div_ceil(10);
        let old = {
            let mut clients = self.clients.lock();
            let new = !clients.contains_key(&id);
            let engines = self.engine_ids.load(Ordering::Relaxed);
            let refused = if new && clients.len() >= max {
                Some(format!("{max} clients are registered, the limit"))
            } else if new && engine && engines >= engines_max {
                Some(format!(
                    "{engines} clients with the client key are registered, their share of the limit of {max} (the rest is kept for stores)"
                ))
            } else {
                None
            };
            if let Some(why) = refused {
                drop(clients);
                return Err(self.refusals.refuse(
                    Refusal::Clients,
                    KvError::new(
                        Code::UnavailableInCurrentStatus,
                        format!("{why}: client {id} ({hostname}) refused"),
                    ),
                ));
            }
            let tenant = tenant.cloned();
            let same_tenant = clients.get(&id).map(|c| &c.tenant) == Some(&tenant);
            if let Some(name) = tenant.as_deref().filter(|_| !same_tenant) {
                if let Err(e) = self.ledger.tenant_add_client(name, &self.cfg.tenants) {
                    drop(clients);
                    return Err(self.refusals.refuse(Refusal::Quota, e));
                }
            }
            let old = clients.insert(
                id,
                ClientEntry {
                    last_seen: now,
                    hostname: hostname.to_string(),
                    suspect: false,
                    hung_up: false,
                    engine,
                    tenant,
                    cancelled_ops: Vec::new(),
                },
            );
            // Counted under the map's lock, so the count is the map's.
            if old.as_ref().is_some_and(|c| c.engine) {
                self.engine_ids.fetch_sub(1, Ordering::Relaxed);
            }
            if engine {
                self.engine_ids.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(name) = old.as_ref().and_then(|c| c.tenant.as_deref()) {
                if !same_tenant {
                    self.ledger.tenant_drop_client(name);
                }
            }
            old
        };
        if old.is_some_and(|c| c.suspect) {
            self.suspect_count.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(RegisterReply {
            heartbeat_interval_ms: ms(self.heartbeat_interval()).max(1),
            client_ttl_ms: ms(self.cfg.client_ttl),
        })
    }

    /// How often clients heartbeat: four times per TTL, and at least every
    /// [`HEARTBEAT_AT_MOST`].
    fn heartbeat_interval(&self) -> Duration {
        (self.cfg.client_ttl / 4).min(HEARTBEAT_AT_MOST)
    }

    /// The connection `id`'s heartbeats came over closed. A live client
    /// reconnects and is heard from within a heartbeat; a dead store takes
    /// no new objects from now on.
    pub fn hung_up(&self, id: ClientId) {
        let Some(c) = self.clients.lock().get_mut(&id).map(|c| {
            c.hung_up = true;
            c.hostname.clone()
        }) else {
            return;
        };
        if self.segments.read().values().any(|s| s.owner == id) {
            tracing::info!(client = %id, hostname = %c, "store's heartbeat connection closed: its segments take no new objects until it is heard from again");
        }
    }

    /// Records a heartbeat; false when the client is unknown (it must register).
    pub fn heartbeat(&self, id: ClientId, now: Instant) -> bool {
        self.seen_client(id, now, |_| ()).is_some()
    }

    /// Records a sign of life of client `id` and runs `f` on its entry;
    /// `None` when it is not registered.
    fn seen_client<T>(
        &self,
        id: ClientId,
        now: Instant,
        f: impl FnOnce(&mut ClientEntry) -> T,
    ) -> Option<T> {
        let mut clients = self.clients.lock();
        let c = clients.get_mut(&id)?;
        if c.seen(id, now) {
            self.suspect_count.fetch_sub(1, Ordering::Relaxed);
        }
        Some(f(c))
    }

    /// Adds `stall` to every client's silence allowance: the master itself did
    /// not run (paused, or starved of CPU) for that long, so heartbeats sent
    /// meanwhile could not be counted.
    pub fn forgive_stall(&self, stall: Duration, now: Instant) {
        for c in self.clients.lock().values_mut() {
            c.last_seen = (c.last_seen + stall).min(now);
        }
    }

    /// Client ids that are suspect stores now.
    pub(super) fn suspects(&self) -> HashSet<ClientId> {
        if self.suspect_count.load(Ordering::Relaxed) == 0 {
            return HashSet::new();
        }
        self.clients
            .lock()
            .iter()
            .filter(|(_, c)| c.suspect)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Segments whose store is suspect now.
    pub(super) fn suspect_segments(&self) -> HashSet<SegmentId> {
        let suspects = self.suspects();
        if suspects.is_empty() {
            return HashSet::new();
        }
        self.segments
            .read()
            .values()
            .filter(|s| suspects.contains(&s.owner))
            .map(|s| s.info.id)
            .collect()
    }

    /// Checks that `id` is registered; its call counts as a sign of life.
    pub(super) fn require_client(&self, id: ClientId, now: Instant) -> KvResult<()> {
        self.seen_client(id, now, |_| ())
            .ok_or_else(|| not_registered(id))
    }

    /// [`Self::require_client`] for a put of `id`'s operation `op`, which
    /// must not be one it gave up (see [`Self::cancel_ops`]).
    pub(super) fn require_writer(&self, id: ClientId, op: u64, now: Instant) -> KvResult<()> {
        match self.seen_client(id, now, |c| c.cancelled_ops.contains(&op)) {
            None => Err(not_registered(id)),
            // Its caller stopped waiting; nobody reads this answer.
            Some(true) => Err(KvError::new(
                Code::InvalidParams,
                "this put was cancelled by its writer",
            )),
            Some(false) => Ok(()),
        }
    }

    /// Remembers that client `id` gave up its put operations `ops`.
    pub(super) fn cancel_ops(&self, id: ClientId, ops: &[u64], now: Instant) {
        self.seen_client(id, now, |c| {
            c.cancelled_ops.extend_from_slice(ops);
            let over = c.cancelled_ops.len().saturating_sub(CANCELLED_OPS_KEPT);
            c.cancelled_ops.drain(..over);
        });
    }

    /// Which of `owners` (the clients lending segments) have missed
    /// [`LATE_AFTER_BEATS`] heartbeats (at most half the client TTL), or hung
    /// up: probably dead, so their segments get no new objects while the TTL
    /// runs out. One look-up per owner: every put asks,
    /// so its cost must not grow with the number of registered clients
    /// (walking them all made each put over 3000x slower at 300k clients).
    pub(super) fn late_owners(
        &self,
        owners: impl IntoIterator<Item = ClientId>,
        now: Instant,
    ) -> HashSet<ClientId> {
        let grace = (self.heartbeat_interval() * LATE_AFTER_BEATS).min(self.cfg.client_ttl / 2);
        let clients = self.clients.lock();
        owners
            .into_iter()
            .filter(|id| {
                clients.get(id).is_some_and(|c| {
                    c.hung_up || now.saturating_duration_since(c.last_seen) > grace
                })
            })
            .collect()
    }

    /// Periodic upkeep: drops clients silent for `client_ttl` with their puts
    /// in flight (a store, one that lends segments, is suspect first and is
    /// dropped with its segments only after `client_ttl + store_grace`),
    /// revokes puts older than `pending_ttl`, and frees regions whose lease
    /// ended. Returns the clients dropped. Its cost grows with the clients
    /// and the puts in flight, never with their product.
    pub fn sweep(&self, now: Instant) -> Vec<ClientId> {
        let lenders: HashSet<ClientId> = self.segments.read().values().map(|s| s.owner).collect();
        let (ttl, grace) = (self.cfg.client_ttl, self.cfg.store_grace);
        let dead: Vec<ClientId> = {
            let mut clients = self.clients.lock();
            let mut dead = Vec::new();
            for (id, c) in clients.iter_mut() {
                let silent = now.saturating_duration_since(c.last_seen);
                if silent <= ttl {
                    continue;
                }
                // A store's cache is worth a grace period: a store starved or
                // paused for a while comes back with nothing lost.
                if lenders.contains(id) && silent <= ttl + grace {
                    if !c.suspect {
                        c.suspect = true;
                        self.suspect_count.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(client = %id, hostname = %c.hostname, silent_ms = ms(silent), grace_ms = ms(grace),
                            "store missed its heartbeats: suspect; its segments take no new objects, its objects stay readable");
                    }
                    continue;
                }
                dead.push(*id);
            }
            for id in &dead {
                if let Some(c) = clients.remove(id) {
                    if c.suspect {
                        self.suspect_count.fetch_sub(1, Ordering::Relaxed);
                    }
                    if c.engine {
                        self.engine_ids.fetch_sub(1, Ordering::Relaxed);
                    }
                    if let Some(name) = c.tenant.as_deref() {
                        self.ledger.tenant_drop_client(name);
                    }
                    tracing::warn!(client = %id, hostname = %c.hostname, "client expired");
                }
            }
            dead
        };
        let dead_set: HashSet<ClientId> = dead.iter().copied().collect();
        if !dead.is_empty() {
            let owned: Vec<SegmentId> = self
                .segments
                .read()
                .values()
                .filter(|s| dead_set.contains(&s.owner))
                .map(|s| s.info.id)
                .collect();
            for id in owned {
                self.give_up_segment(id, now);
            }
        }
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            if sh.pending.is_empty() {
                continue;
            }
            let mut freed = Vec::new();
            sh.pending.retain(|key, p| {
                let stale = dead_set.contains(&p.owner)
                    || now.saturating_duration_since(p.started) > self.cfg.pending_ttl;
                if stale {
                    self.forget_pending(key, p);
                    freed.push((p.version.replicas.clone(), p.version.generation));
                }
                !stale
            });
            drop(sh);
            for (replicas, generation) in freed {
                self.abandon(&replicas, generation, now);
            }
        }
        self.sweep_copies(&dead_set, now);
        self.free_expired_deferred(now);
        self.expire_fences(now);
        self.expire_expected(now);
        self.expire_given_up(now);
        self.expire_moved_leased(now);
        dead
    }
}
