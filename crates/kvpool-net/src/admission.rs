//! Who holds a connection slot on a server. A connection still in its
//! handshake (TLS, `Hello`, `Auth`) holds a slot of a small budget of its
//! own, per peer address and in all; when that budget is full, a newcomer
//! takes the slot of the *oldest* connection still in its handshake, which
//! is closed. A finished handshake moves the connection into the
//! authenticated budget (per identity and in all), which connections that
//! never finish a handshake cannot touch: a flood of them, with or without
//! a key, keeps nobody out. The identity is the tenant whose key the peer
//! proved, else its address: a tenant flooding from a host shared with
//! others uses up its own share, not theirs.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// Connections one peer address may hold in their handshake at once on one
/// server; a newer one closes its oldest. A legitimate process opens a
/// handful at a time, so 64 leaves room for many on one host while a flood
/// from that address only churns its own connections.
pub const PREAUTH_PER_IP: usize = 64;

/// Connections all peers together may hold in their handshake at once on
/// one server; a newer one closes the oldest of all.
pub const PREAUTH_TOTAL: usize = 512;

/// The sizes of a server's budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLimits {
    /// Authenticated connections one peer address, or one tenant, may
    /// hold (`usize::MAX`: no cap).
    pub per_ip: usize,
    /// Authenticated connections in all.
    pub total: usize,
    /// Connections in their handshake one peer address may hold.
    pub preauth_per_ip: usize,
    /// Connections in their handshake in all.
    pub preauth_total: usize,
}

/// Why a connection was refused a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its address (or its tenant) holds its share of authenticated
    /// connections, this many.
    PerIp(usize),
    /// The server holds its most authenticated connections.
    Total,
    /// A newer connection took its handshake slot (counted at eviction).
    Evicted,
}

/// The share of authenticated connections of one tenant, by its name, on
/// a server that knows tenants' quotas (the master); `None`, and servers
/// without one, give the tenant [`BudgetLimits::per_ip`].
pub type TenantCap = Arc<dyn Fn(&str) -> Option<usize> + Send + Sync>;

/// The two budgets of one server (see the module's documentation).
pub struct Budgets {
    limits: BudgetLimits,
    tenant_cap: Option<TenantCap>,
    preauth: Mutex<PreAuth>,
    authed: Mutex<HashMap<Identity, usize>>,
    slots: Arc<Semaphore>,
}

/// Whose share of the authenticated budget a connection takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A peer without a tenant: its address.
    Addr(IpAddr),
    /// A tenant's key, from any address.
    Tenant(Arc<str>),
}

/// Connections in their handshake, oldest first.
#[derive(Default)]
struct PreAuth {
    next: u64,
    /// Per address: (arrival number, what closes it), oldest first.
    by_ip: HashMap<IpAddr, VecDeque<(u64, CancellationToken)>>,
    /// Every one by arrival number.
    order: BTreeMap<u64, IpAddr>,
}

impl PreAuth {
    /// Takes out the oldest connection of `ip`, if it has one.
    fn pop_oldest_of(&mut self, ip: IpAddr) -> Option<CancellationToken> {
        let queue = self.by_ip.get_mut(&ip)?;
        let (seq, token) = queue.pop_front()?;
        if queue.is_empty() {
            self.by_ip.remove(&ip);
        }
        self.order.remove(&seq);
        Some(token)
    }

    /// Takes out connection `seq` of `ip`; whether it was still here.
    fn remove(&mut self, ip: IpAddr, seq: u64) -> bool {
        if self.order.remove(&seq).is_none() {
            return false;
        }
        if let Some(queue) = self.by_ip.get_mut(&ip) {
            queue.retain(|(s, _)| *s != seq);
            if queue.is_empty() {
                self.by_ip.remove(&ip);
            }
        }
        true
    }
}

impl Budgets {
    /// Empty budgets of these sizes, where `tenant_cap` (if any) sets each
    /// tenant's share instead of [`BudgetLimits::per_ip`].
    pub fn new(limits: BudgetLimits, tenant_cap: Option<TenantCap>) -> Arc<Budgets> {
        Arc::new(Budgets {
            limits,
            tenant_cap,
            preauth: Mutex::default(),
            authed: Mutex::default(),
            slots: Arc::new(Semaphore::new(limits.total)),
        })
    }

    /// A slot in the handshake budget for a connection from `ip`, and how
    /// many older connections in their handshake were closed to make room
    /// (their [`PreAuthSlot::evicted`] fires). Refused only when the
    /// connection could not be admitted after its handshake either: the
    /// server holds every authenticated slot (an address holding its share
    /// may still bring a tenant's connection, known after the handshake).
    pub fn arrive(self: &Arc<Self>, ip: IpAddr) -> Result<(PreAuthSlot, usize), Refused> {
        if self.slots.available_permits() == 0 {
            return Err(Refused::Total);
        }
        let token = CancellationToken::new();
        let mut evicted = Vec::new();
        let seq = {
            let mut pre = self.preauth.lock();
            let mine = pre.by_ip.get(&ip).map_or(0, VecDeque::len);
            if mine >= self.limits.preauth_per_ip.max(1) {
                evicted.extend(pre.pop_oldest_of(ip));
            }
            while pre.order.len() >= self.limits.preauth_total.max(1) {
                let oldest = *pre.order.values().next().expect("a connection");
                evicted.extend(pre.pop_oldest_of(oldest));
            }
            let seq = pre.next;
            pre.next += 1;
            pre.by_ip
                .entry(ip)
                .or_default()
                .push_back((seq, token.clone()));
            pre.order.insert(seq, ip);
            seq
        };
        for t in &evicted {
            t.cancel();
        }
        let slot = PreAuthSlot {
            budgets: self.clone(),
            ip,
            seq,
            token,
        };
        Ok((slot, evicted.len()))
    }

    /// Connections in their handshake now (from `ip`, or in all).
    pub fn preauth(&self, ip: Option<IpAddr>) -> usize {
        let pre = self.preauth.lock();
        match ip {
            Some(ip) => pre.by_ip.get(&ip).map_or(0, VecDeque::len),
            None => pre.order.len(),
        }
    }

    /// Authenticated connections now (of `who`, or in all).
    pub fn authenticated(&self, who: Option<&Identity>) -> usize {
        match who {
            Some(who) => self.authed.lock().get(who).copied().unwrap_or(0),
            None => self.limits.total - self.slots.available_permits(),
        }
    }
}

/// A connection's slot in the handshake budget; given back when dropped.
pub struct PreAuthSlot {
    budgets: Arc<Budgets>,
    ip: IpAddr,
    seq: u64,
    token: CancellationToken,
}

impl PreAuthSlot {
    /// Resolves once a newer connection took this slot: the handshake must
    /// be abandoned and the connection closed.
    pub fn evicted(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// Whether a newer connection took this slot.
    pub fn is_evicted(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The handshake finished, proving `tenant`'s key or none: gives this
    /// slot back and takes one in the authenticated budget, unless that
    /// budget is full for the tenant (else the address) or in all, or this
    /// slot was taken meanwhile.
    pub fn admit(self, tenant: Option<Arc<str>>) -> Result<Admitted, Refused> {
        if self.is_evicted() {
            return Err(Refused::Evicted);
        }
        let budgets = self.budgets.clone();
        let who = tenant.map_or(Identity::Addr(self.ip), Identity::Tenant);
        drop(self);
        let share = match (&who, &budgets.tenant_cap) {
            (Identity::Tenant(name), Some(cap)) => cap(name).unwrap_or(budgets.limits.per_ip),
            _ => budgets.limits.per_ip,
        };
        let mut authed = budgets.authed.lock();
        if authed.get(&who).copied().unwrap_or(0) >= share {
            return Err(Refused::PerIp(share));
        }
        let Ok(permit) = budgets.slots.clone().try_acquire_owned() else {
            return Err(Refused::Total);
        };
        *authed.entry(who.clone()).or_default() += 1;
        drop(authed);
        Ok(Admitted {
            budgets,
            who,
            _permit: permit,
        })
    }
}

impl Drop for PreAuthSlot {
    fn drop(&mut self) {
        self.budgets.preauth.lock().remove(self.ip, self.seq);
    }
}

/// An authenticated connection's slot; given back when dropped.
pub struct Admitted {
    budgets: Arc<Budgets>,
    who: Identity,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut authed = self.budgets.authed.lock();
        if let Some(n) = authed.get_mut(&self.who) {
            *n -= 1;
            if *n == 0 {
                authed.remove(&self.who);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn budgets(per_ip: usize, total: usize, pre_ip: usize, pre_total: usize) -> Arc<Budgets> {
        Budgets::new(
            BudgetLimits {
                per_ip,
                total,
                preauth_per_ip: pre_ip,
                preauth_total: pre_total,
            },
            None,
        )
    }

    #[test]
    fn a_full_address_gives_its_oldest_handshake_slot_to_a_newcomer() {
        let b = budgets(100, 100, 3, 100);
        let mut slots: Vec<PreAuthSlot> = (0..3).map(|_| b.arrive(ip(1)).unwrap().0).collect();
        let other = b.arrive(ip(2)).unwrap().0;
        let (newest, evicted) = b.arrive(ip(1)).unwrap();
        assert_eq!(evicted, 1);
        assert!(slots[0].is_evicted(), "the oldest of that address goes");
        assert!(!slots[1].is_evicted() && !slots[2].is_evicted());
        assert!(!other.is_evicted(), "another address keeps its slot");
        assert!(!newest.is_evicted());
        assert_eq!(b.preauth(Some(ip(1))), 3);
        assert_eq!(b.preauth(None), 4);
        // An evicted slot cannot be admitted; its drop changes nothing.
        let first = slots.remove(0);
        assert_eq!(first.admit(None).err(), Some(Refused::Evicted));
        assert_eq!(b.preauth(None), 4);
    }

    #[test]
    fn a_full_server_gives_the_oldest_handshake_slot_of_all_to_a_newcomer() {
        let b = budgets(100, 100, 10, 4);
        let a: Vec<PreAuthSlot> = (0..2).map(|_| b.arrive(ip(1)).unwrap().0).collect();
        let c: Vec<PreAuthSlot> = (0..2).map(|_| b.arrive(ip(2)).unwrap().0).collect();
        let (_new, evicted) = b.arrive(ip(3)).unwrap();
        assert_eq!(evicted, 1);
        assert!(a[0].is_evicted());
        assert!(!a[1].is_evicted() && !c[0].is_evicted() && !c[1].is_evicted());
        let (_new, _) = b.arrive(ip(3)).unwrap();
        assert!(a[1].is_evicted(), "then the next oldest");
        assert_eq!(b.preauth(None), 4);
        assert_eq!(b.preauth(Some(ip(1))), 0);
    }

    #[tokio::test]
    async fn an_evicted_connection_learns_it() {
        let b = budgets(100, 100, 1, 100);
        let (old, _) = b.arrive(ip(1)).unwrap();
        let (_new, _) = b.arrive(ip(1)).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), old.evicted())
            .await
            .expect("the eviction is signalled");
    }

    #[test]
    fn a_finished_handshake_leaves_the_handshake_budget_for_the_authenticated_one() {
        let b = budgets(2, 3, 1, 1);
        let (s, _) = b.arrive(ip(1)).unwrap();
        let first = s.admit(None).expect("admitted");
        let one = Identity::Addr(ip(1));
        assert_eq!((b.preauth(None), b.authenticated(Some(&one))), (0, 1));
        // A flood of handshakes that never finish does not touch it.
        let flood: Vec<PreAuthSlot> = (0..10).map(|_| b.arrive(ip(1)).unwrap().0).collect();
        assert_eq!(flood.iter().filter(|s| !s.is_evicted()).count(), 1);
        let last = flood.into_iter().last().unwrap();
        let second = last
            .admit(None)
            .expect("a newcomer gets in despite the flood");
        // The address holds its share now: refused after the handshake.
        let (s, _) = b.arrive(ip(1)).unwrap();
        assert_eq!(s.admit(None).err(), Some(Refused::PerIp(2)));
        let (other, _) = b.arrive(ip(2)).unwrap();
        let third = other.admit(None).expect("another address");
        assert_eq!(b.authenticated(None), 3);
        assert_eq!(b.arrive(ip(3)).err(), Some(Refused::Total));
        drop((first, second, third));
        assert_eq!(b.authenticated(None), 0);
        assert_eq!(b.authenticated(Some(&one)), 0);
        assert!(b.authed.lock().is_empty());
        assert!(b.preauth.lock().by_ip.is_empty());
    }

    #[test]
    fn admit_rechecks_the_authenticated_budget() {
        let b = budgets(1, 10, 10, 10);
        let (x, _) = b.arrive(ip(1)).unwrap();
        let (y, _) = b.arrive(ip(1)).unwrap();
        let _in = x.admit(None).expect("first");
        assert_eq!(y.admit(None).err(), Some(Refused::PerIp(1)));
        assert_eq!(b.preauth(None), 0);
    }

    #[test]
    fn a_tenant_has_its_own_share_whatever_its_address() {
        let b = budgets(2, 10, 10, 10);
        let acme: Arc<str> = Arc::from("acme");
        let admit =
            |from: u8, t: Option<&Arc<str>>| b.arrive(ip(from)).unwrap().0.admit(t.cloned());
        // The address is full of connections without a tenant...
        let _held = [admit(1, None).unwrap(), admit(1, None).unwrap()];
        assert_eq!(admit(1, None).err(), Some(Refused::PerIp(2)));
        // ...a tenant on the same host gets in, up to its own share.
        let _a = admit(1, Some(&acme)).expect("a tenant on a full address");
        let _b = admit(2, Some(&acme)).expect("from another address");
        assert_eq!(admit(3, Some(&acme)).err(), Some(Refused::PerIp(2)));
        let other: Arc<str> = Arc::from("other");
        let _o = admit(1, Some(&other)).expect("another tenant");
        assert_eq!(b.authenticated(Some(&Identity::Tenant(acme))), 2);
    }

    #[test]
    fn a_tenant_cap_sets_each_tenants_share() {
        let limits = BudgetLimits {
            per_ip: 2,
            total: 10,
            preauth_per_ip: 10,
            preauth_total: 10,
        };
        let cap: TenantCap = Arc::new(|name| match name {
            "small" => Some(1),
            "big" => Some(3),
            _ => None,
        });
        let b = Budgets::new(limits, Some(cap));
        let admit = |t: &str| b.arrive(ip(1)).unwrap().0.admit(Some(Arc::from(t)));
        let _s = admit("small").expect("its one connection");
        assert_eq!(admit("small").err(), Some(Refused::PerIp(1)));
        let _b = [
            admit("big").unwrap(),
            admit("big").unwrap(),
            admit("big").unwrap(),
        ];
        assert_eq!(admit("big").err(), Some(Refused::PerIp(3)));
        let _o = [admit("other").unwrap(), admit("other").unwrap()];
        assert_eq!(
            admit("other").err(),
            Some(Refused::PerIp(2)),
            "no cap: per_ip"
        );
        let none = |_: u8| b.arrive(ip(2)).unwrap().0.admit(None);
        let _n = [none(0).unwrap(), none(1).unwrap()];
        assert_eq!(
            none(2).err(),
            Some(Refused::PerIp(2)),
            "addresses keep per_ip"
        );
    }
}
