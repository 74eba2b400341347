//! What each client holds that its limits count: puts in flight (started,
//! not yet committed or revoked) and bytes of hard-pinned objects (in flight
//! or committed), so a put beyond `max_pending_per_client`,
//! `max_hard_pinned_per_client` or the pool's `max_hard_pinned_ratio` is
//! refused before any region is reserved.
//!
//! It also keeps what each tenant holds against its quota (see
//! `tenants.rs`).
//!
//! Taken last: its lock is taken under a shard's (an object's removal gives
//! its pin back), and nothing is taken under it.

use std::collections::HashMap;

use kvpool_proto::msg::ClientId;
use kvpool_proto::KvResult;
use parking_lot::Mutex;

use super::tenants::{self, TenantPolicy, Usage};

/// What a hard-pinned object costs its writer: the client whose limit
/// counts it and the bytes its regions took when it was placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pin {
    /// The writer.
    pub(crate) owner: ClientId,
    /// Bytes over all replicas, as placed.
    pub(crate) bytes: u64,
}

/// One client's holdings.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    /// Puts started and not ended.
    pub(crate) pending: u64,
    /// Bytes of hard-pinned objects, in flight or committed.
    pub(crate) pinned: u64,
}

/// Holdings of every client that holds something.
#[derive(Default)]
pub(crate) struct Ledger {
    book: Mutex<Book>,
}

/// The ledger's contents, under its one lock.
#[derive(Default)]
struct Book {
    per: HashMap<ClientId, Held>,
    /// Hard-pinned bytes of all clients together (the sum over `per`).
    pinned: u64,
    /// What each tenant holds against its quota.
    tenants: tenants::Book,
}

/// Which limit a hard pin would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PinLimit {
    /// The client's own.
    Client,
    /// The pool's, over all clients.
    Pool,
    /// The quota of the key's tenant, of this many bytes.
    Tenant(u64),
}

impl Ledger {
    /// What `client` holds now.
    pub(crate) fn held(&self, client: ClientId) -> Held {
        self.book
            .lock()
            .per
            .get(&client)
            .copied()
            .unwrap_or_default()
    }

    /// Reserves up to `n` puts in flight for `client` without passing
    /// `max`; returns how many were reserved (the first ones of the batch go).
    pub(crate) fn reserve_puts(&self, client: ClientId, n: u64, max: u64) -> u64 {
        let per = &mut self.book.lock().per;
        let h = per.entry(client).or_default();
        let granted = n.min(max.saturating_sub(h.pending));
        h.pending += granted;
        if *h == Held::default() {
            per.remove(&client);
        }
        granted
    }

    /// Reserves `bytes` of hard pins of `key` for `client` unless that
    /// passes the client's limit, the pool's over all clients (`limits`),
    /// or the quota of the key's tenant.
    pub(crate) fn reserve_pin(
        &self,
        (client, key): (ClientId, &str),
        bytes: u64,
        limits: (u64, u64),
        policy: &TenantPolicy,
    ) -> Result<(), PinLimit> {
        let book = &mut *self.book.lock();
        book.pin_fits((client, key), bytes, limits, policy)?;
        if let Some(name) = tenants::owner(key) {
            book.tenants.pin(name, bytes);
        }
        book.per.entry(client).or_default().pinned += bytes;
        book.pinned += bytes;
        Ok(())
    }

    /// Whether `client` could pin `bytes` more of `key` now, without
    /// reserving them.
    pub(crate) fn pin_fits(
        &self,
        writer: (ClientId, &str),
        bytes: u64,
        limits: (u64, u64),
        policy: &TenantPolicy,
    ) -> Result<(), PinLimit> {
        self.book.lock().pin_fits(writer, bytes, limits, policy)
    }

    /// Hard-pinned bytes of all clients together.
    pub(crate) fn pinned(&self) -> u64 {
        self.book.lock().pinned
    }

    /// Gives back `puts` puts in flight of `client`.
    pub(crate) fn release_puts(&self, client: ClientId, puts: u64) {
        if puts > 0 {
            self.book.lock().update(client, |h| {
                h.pending = h.pending.saturating_sub(puts);
                0
            });
        }
    }

    /// Gives back `pin`, its writer's bytes of a hard pin of `key`.
    pub(crate) fn unpin(&self, key: &str, pin: Pin) {
        let book = &mut *self.book.lock();
        let given = book.update(pin.owner, |h| {
            let given = h.pinned.min(pin.bytes);
            h.pinned -= given;
            given
        });
        book.pinned -= given;
        if let Some(name) = tenants::owner(key) {
            book.tenants.unpin(name, pin.bytes);
        }
    }

    /// Reserves one object of `bytes` and a put in flight for a put of
    /// `key` against its tenant's quota (nothing for a key without a
    /// tenant).
    pub(crate) fn tenant_reserve(
        &self,
        key: &str,
        bytes: u64,
        policy: &TenantPolicy,
    ) -> KvResult<()> {
        let Some(name) = tenants::owner(key) else {
            return Ok(());
        };
        let quota = policy.quota(name);
        let r = self.book.lock().tenants.reserve(name, bytes, quota);
        r.map_err(|over| tenants::quota_error(name, over))
    }

    /// Ends a put of `key` that [`Self::tenant_reserve`] counted (committed,
    /// refused, revoked or expired): what it reserved goes back.
    pub(crate) fn tenant_end_put(&self, key: &str, bytes: u64) {
        if let Some(name) = tenants::owner(key) {
            self.book.lock().tenants.end_put(name, bytes);
        }
    }

    /// Charges a committed object of `key` to its tenant, whatever the quota
    /// (what its put reserved, or an object a rebuild found).
    pub(crate) fn tenant_charge(&self, key: &str, bytes: u64) {
        if let Some(name) = tenants::owner(key) {
            self.book.lock().tenants.charge(name, bytes);
        }
    }

    /// Gives back one object of `bytes` of `key`'s tenant.
    pub(crate) fn tenant_release(&self, key: &str, bytes: u64) {
        if let Some(name) = tenants::owner(key) {
            self.book.lock().tenants.release(name, bytes);
        }
    }

    /// Counts a new client id of tenant `name` within its quota.
    pub(crate) fn tenant_add_client(&self, name: &str, policy: &TenantPolicy) -> KvResult<()> {
        let r = self
            .book
            .lock()
            .tenants
            .add_client(name, policy.quota(name));
        r.map_err(|over| tenants::quota_error(name, over))
    }

    /// Counts a client id of tenant `name` less.
    pub(crate) fn tenant_drop_client(&self, name: &str) {
        self.book.lock().tenants.drop_client(name);
    }

    /// What tenant `name` holds.
    pub(crate) fn tenant_usage(&self, name: &str) -> Usage {
        self.book.lock().tenants.usage(name)
    }

    /// Every tenant holding something.
    pub(crate) fn tenants(&self) -> Vec<(String, Usage)> {
        self.book.lock().tenants.all()
    }

    /// Clients holding anything (for tests: entries do not outlive holdings).
    #[cfg(test)]
    pub(crate) fn clients(&self) -> usize {
        self.book.lock().per.len()
    }
}

impl Book {
    /// See [`Ledger::pin_fits`].
    fn pin_fits(
        &self,
        (client, key): (ClientId, &str),
        bytes: u64,
        limits: (u64, u64),
        policy: &TenantPolicy,
    ) -> Result<(), PinLimit> {
        let held = self.per.get(&client).map_or(0, |h| h.pinned);
        pin_limit(held, self.pinned, bytes, limits)?;
        match tenants::owner(key) {
            Some(name) => self
                .tenants
                .pin_fits(name, bytes, policy.quota(name))
                .map_err(|_| PinLimit::Tenant(policy.quota(name).pinned)),
            None => Ok(()),
        }
    }

    /// Changes `client`'s holdings with `f`, dropping an entry left empty;
    /// what `f` returned (0 when the client holds nothing).
    fn update(&mut self, client: ClientId, f: impl FnOnce(&mut Held) -> u64) -> u64 {
        let Some(h) = self.per.get_mut(&client) else {
            return 0;
        };
        let r = f(h);
        if *h == Held::default() {
            self.per.remove(&client);
        }
        r
    }
}

/// The limit `more` bytes of pins would pass, for a client holding `held`
/// while all clients hold `all`; `limits` are the client's and the pool's.
fn pin_limit(held: u64, all: u64, more: u64, (max, pool_max): (u64, u64)) -> Result<(), PinLimit> {
    if held.saturating_add(more) > max {
        Err(PinLimit::Client)
    } else if all.saturating_add(more) > pool_max {
        Err(PinLimit::Pool)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_at_the_limit_and_come_back() {
        let l = Ledger::default();
        let c = ClientId(1);
        assert_eq!(l.reserve_puts(c, 8, 10), 8);
        assert_eq!(l.reserve_puts(c, 8, 10), 2);
        assert_eq!(l.reserve_puts(c, 1, 10), 0);
        let none = TenantPolicy::default();
        assert_eq!(l.reserve_pin((c, "k"), 100, (150, u64::MAX), &none), Ok(()));
        assert_eq!(
            l.reserve_pin((c, "k"), 51, (150, u64::MAX), &none),
            Err(PinLimit::Client)
        );
        assert_eq!(
            l.held(c),
            Held {
                pending: 10,
                pinned: 100
            }
        );
        l.release_puts(c, 10);
        l.unpin(
            "k",
            Pin {
                owner: c,
                bytes: 100,
            },
        );
        assert_eq!(l.held(c), Held::default());
        assert_eq!(l.clients(), 0, "an empty entry is dropped");
        assert_eq!(l.reserve_puts(ClientId(2), 0, 10), 0);
        assert_eq!(l.clients(), 0);
    }

    #[test]
    fn the_pools_pin_limit_counts_every_client() {
        let l = Ledger::default();
        let (a, b) = (ClientId(1), ClientId(2));
        let none = TenantPolicy::default();
        let pin = |c, bytes| l.reserve_pin((c, "k"), bytes, (1000, 150), &none);
        assert_eq!(pin(a, 100), Ok(()));
        assert_eq!(pin(b, 60), Err(PinLimit::Pool));
        assert_eq!(pin(b, 50), Ok(()));
        assert_eq!(l.pinned(), 150);
        // Giving back more than was held gives back what was held.
        l.unpin(
            "k",
            Pin {
                owner: a,
                bytes: 500,
            },
        );
        assert_eq!(l.pinned(), 50);
        assert_eq!(pin(b, 60), Ok(()));
        assert_eq!(l.pinned(), 110);
    }

    #[test]
    fn a_tenants_pins_stop_at_its_quota_and_come_back() {
        let l = Ledger::default();
        let mut policy = TenantPolicy::default();
        policy.add_quota("acme:pinned=100").unwrap();
        let (a, b) = (ClientId(1), ClientId(2));
        let key = "\u{1}acme\u{1}page";
        let limits = (1000, 1000);
        assert_eq!(l.reserve_pin((a, key), 60, limits, &policy), Ok(()));
        // Another client of the same tenant shares its quota.
        assert_eq!(
            l.reserve_pin((b, key), 50, limits, &policy),
            Err(PinLimit::Tenant(100))
        );
        assert_eq!(l.pin_fits((b, key), 40, limits, &policy), Ok(()));
        // Keys without a tenant, and other tenants, are not held back.
        assert_eq!(l.reserve_pin((b, "page"), 500, limits, &policy), Ok(()));
        assert_eq!(
            l.reserve_pin((b, "\u{1}other\u{1}page"), 300, limits, &policy),
            Ok(())
        );
        assert_eq!(l.tenant_usage("acme").pinned, 60);
        l.unpin(
            key,
            Pin {
                owner: a,
                bytes: 60,
            },
        );
        assert_eq!(l.tenant_usage("acme").pinned, 0);
        assert_eq!(l.reserve_pin((b, key), 100, limits, &policy), Ok(()));
    }
}
