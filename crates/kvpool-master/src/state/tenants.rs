//! Tenants on the master: each tenant's quota, the namespaces an admin
//! marked shared, and what each tenant holds against its quota (its
//! connections are counted by the accept loop, against
//! [`Quota::connections`]).
//!
//! A tenant's usage counts its committed objects (charged where the object
//! table takes or drops them, so a rebuild after a restart counts too), its
//! puts in flight (reserved before any region is, given back when the put
//! ends either way), the bytes of its hard-pinned objects (in flight or
//! committed, as the pool's and each client's pin limits count them) and
//! its registered client ids. Value bytes are counted
//! once per object, whatever its replica count. Keys without a tenant
//! count against no quota (only the per-client limits).

use std::collections::{HashMap, HashSet};
use std::fmt;

use kvpool_proto::tenant::{tenant_of, validate_tenant};
use kvpool_proto::units::parse_size;
use kvpool_proto::{Code, KvError, KvResult};
use serde::Serialize;

/// What one tenant may hold; `u64::MAX` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Objects, committed or being put.
    pub objects: u64,
    /// Value bytes of those objects.
    pub bytes: u64,
    /// Registered client ids.
    pub clients: u64,
    /// Bytes of hard-pinned objects (all replicas, as placed), which
    /// eviction never frees.
    pub pinned: u64,
    /// Puts started and not yet committed or ended, over all its clients.
    pub puts: u64,
    /// Authenticated connections to the master (`u64::MAX`: as many as
    /// one address may hold).
    pub connections: u64,
}

impl Default for Quota {
    /// No limit on objects, bytes, pins or puts in flight (the pool's
    /// `--max-hard-pinned-ratio` bounds all tenants' pins together, and
    /// each client's `--max-pending-puts-per-client` its puts); 1,000 client
    /// ids, so that no tenant can take the registrations every other
    /// engine needs; as many connections as one address.
    fn default() -> Self {
        Quota {
            objects: u64::MAX,
            bytes: u64::MAX,
            clients: 1_000,
            pinned: u64::MAX,
            puts: u64::MAX,
            connections: u64::MAX,
        }
    }
}

/// The tenants' settings: quotas and shared namespaces.
#[derive(Debug, Clone, Default)]
pub struct TenantPolicy {
    /// The quota of a tenant without one of its own.
    pub default: Quota,
    /// Quotas of particular tenants.
    pub quotas: HashMap<String, Quota>,
    /// Namespaces every client may read (never write).
    pub shared: HashSet<String>,
}

impl TenantPolicy {
    /// Tenant `name`'s quota.
    pub fn quota(&self, name: &str) -> Quota {
        self.quotas.get(name).copied().unwrap_or(self.default)
    }

    /// Whether `name`'s namespace is readable by every client.
    pub fn is_shared(&self, name: &str) -> bool {
        self.shared.contains(name)
    }

    /// Applies one `--tenant-quota` value:
    /// `NAME:objects=N,bytes=SIZE,clients=N,pinned=SIZE,puts=N,connections=N` (any of them;
    /// `NAME` `*` sets the default of every tenant without a line of its
    /// own; `none` lifts a limit).
    pub fn add_quota(&mut self, spec: &str) -> KvResult<()> {
        let bad = |why: String| {
            KvError::new(
                Code::InvalidParams,
                format!(
                    "--tenant-quota {spec:?}: {why} \
                     (NAME:objects=N,bytes=SIZE,clients=N,pinned=SIZE,puts=N,connections=N)"
                ),
            )
        };
        let (name, limits) = spec
            .split_once(':')
            .ok_or_else(|| bad("no ':' after the tenant name".into()))?;
        if name != "*" {
            validate_tenant(name)?;
        }
        let mut q = if name == "*" {
            self.default
        } else {
            self.quota(name)
        };
        for part in limits.split(',').filter(|p| !p.is_empty()) {
            let (what, value) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("{part:?} is not what=value")))?;
            let n = match (what.trim(), value.trim()) {
                (_, "none") => u64::MAX,
                ("bytes" | "pinned", v) => parse_size(v).map_err(|e| bad(e.to_string()))?,
                (_, v) => v
                    .parse()
                    .map_err(|_| bad(format!("{v:?} is not a count")))?,
            };
            match what.trim() {
                "objects" => q.objects = n,
                "bytes" => q.bytes = n,
                "clients" => q.clients = n,
                "pinned" => q.pinned = n,
                "puts" => q.puts = n,
                "connections" => q.connections = n,
                other => return Err(bad(format!("unknown limit {other:?}"))),
            }
        }
        if name == "*" {
            self.default = q;
        } else {
            self.quotas.insert(name.to_string(), q);
        }
        Ok(())
    }
}

/// What one tenant holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Objects committed or being put.
    pub objects: u64,
    /// Their value bytes.
    pub bytes: u64,
    /// Registered client ids.
    pub clients: u64,
    /// Bytes of its hard-pinned objects.
    pub pinned: u64,
    /// Puts in flight.
    pub puts: u64,
}

/// The limit a reservation would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// Objects.
    Objects(u64),
    /// Value bytes.
    Bytes(u64),
    /// Client ids.
    Clients(u64),
    /// Hard-pinned bytes.
    Pinned(u64),
    /// Puts in flight.
    Puts(u64),
}

impl fmt::Display for Over {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Over::Objects(n) => write!(f, "its quota of {n} objects"),
            Over::Bytes(n) => write!(f, "its quota of {n} value bytes"),
            Over::Clients(n) => write!(f, "its quota of {n} client ids"),
            Over::Pinned(n) => write!(f, "its quota of {n} hard-pinned bytes"),
            Over::Puts(n) => write!(f, "its quota of {n} puts in flight"),
        }
    }
}

/// The refusal of a put or registration over tenant `name`'s quota.
pub(crate) fn quota_error(name: &str, over: Over) -> KvError {
    KvError::new(
        Code::QuotaExceeded,
        format!("tenant {name:?} holds {over}: remove some of its objects or raise --tenant-quota"),
    )
}

/// Every tenant's usage (entries that hold nothing are dropped).
#[derive(Default)]
pub(crate) struct Book {
    per: HashMap<Box<str>, Usage>,
}

impl Book {
    /// Reserves one object of `bytes`, and a put in flight, for tenant
    /// `name` within `quota`.
    pub(crate) fn reserve(&mut self, name: &str, bytes: u64, quota: Quota) -> Result<(), Over> {
        let u = self.per.get(name).copied().unwrap_or_default();
        if u.puts >= quota.puts {
            return Err(Over::Puts(quota.puts));
        }
        if u.objects >= quota.objects {
            return Err(Over::Objects(quota.objects));
        }
        if u.bytes.saturating_add(bytes) > quota.bytes {
            return Err(Over::Bytes(quota.bytes));
        }
        self.charge(name, bytes);
        self.usage_mut(name).puts += 1;
        Ok(())
    }

    /// Ends a put [`Self::reserve`] counted: its object and bytes go back
    /// (a committed one is charged again by the object table).
    pub(crate) fn end_put(&mut self, name: &str, bytes: u64) {
        self.update(name, |u| u.puts = u.puts.saturating_sub(1));
        self.release(name, bytes);
    }

    /// Adds one object of `bytes` to `name`, whatever its quota (a commit of
    /// what was reserved, or a rebuild).
    pub(crate) fn charge(&mut self, name: &str, bytes: u64) {
        let u = self.usage_mut(name);
        u.objects += 1;
        u.bytes += bytes;
    }

    /// Takes one object of `bytes` off `name`.
    pub(crate) fn release(&mut self, name: &str, bytes: u64) {
        self.update(name, |u| {
            u.objects = u.objects.saturating_sub(1);
            u.bytes = u.bytes.saturating_sub(bytes);
        });
    }

    /// Whether `name` may hard-pin `bytes` more within `quota`.
    pub(crate) fn pin_fits(&self, name: &str, bytes: u64, quota: Quota) -> Result<(), Over> {
        let held = self.per.get(name).map_or(0, |u| u.pinned);
        if held.saturating_add(bytes) > quota.pinned {
            return Err(Over::Pinned(quota.pinned));
        }
        Ok(())
    }

    /// Counts `bytes` more of `name`'s hard pins (checked with
    /// [`Self::pin_fits`] first, under the same lock).
    pub(crate) fn pin(&mut self, name: &str, bytes: u64) {
        self.usage_mut(name).pinned += bytes;
    }

    /// Gives back `bytes` of `name`'s hard pins.
    pub(crate) fn unpin(&mut self, name: &str, bytes: u64) {
        self.update(name, |u| u.pinned = u.pinned.saturating_sub(bytes));
    }

    /// Counts one more client id of `name`, within `quota`.
    pub(crate) fn add_client(&mut self, name: &str, quota: Quota) -> Result<(), Over> {
        let u = self.usage_mut(name);
        if u.clients >= quota.clients {
            return Err(Over::Clients(quota.clients));
        }
        u.clients += 1;
        Ok(())
    }

    /// Counts one client id of `name` less.
    pub(crate) fn drop_client(&mut self, name: &str) {
        self.update(name, |u| u.clients = u.clients.saturating_sub(1));
    }

    /// What `name` holds now.
    pub(crate) fn usage(&self, name: &str) -> Usage {
        self.per.get(name).copied().unwrap_or_default()
    }

    /// Every tenant holding something, by name.
    pub(crate) fn all(&self) -> Vec<(String, Usage)> {
        let mut v: Vec<_> = self.per.iter().map(|(k, u)| (k.to_string(), *u)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// `name`'s entry, made empty if it has none (the name is copied only then).
    fn usage_mut(&mut self, name: &str) -> &mut Usage {
        if !self.per.contains_key(name) {
            self.per.insert(name.into(), Usage::default());
        }
        self.per.get_mut(name).expect("just inserted")
    }

    fn update(&mut self, name: &str, f: impl FnOnce(&mut Usage)) {
        if let Some(u) = self.per.get_mut(name) {
            f(u);
            if *u == Usage::default() {
                self.per.remove(name);
            }
        }
    }
}

/// The tenant whose quota `key` counts against, if any.
pub(crate) fn owner(key: &str) -> Option<&str> {
    tenant_of(key).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_parse_and_default() {
        let mut p = TenantPolicy::default();
        p.add_quota("*:objects=10,clients=2").unwrap();
        p.add_quota("acme:bytes=1MiB,pinned=64KiB,puts=5,connections=8")
            .unwrap();
        p.add_quota("big:objects=none").unwrap();
        assert_eq!(
            p.quota("other"),
            Quota {
                objects: 10,
                bytes: u64::MAX,
                clients: 2,
                pinned: u64::MAX,
                puts: u64::MAX,
                connections: u64::MAX,
            }
        );
        assert_eq!(
            p.quota("acme"),
            Quota {
                objects: 10,
                bytes: 1 << 20,
                clients: 2,
                pinned: 64 << 10,
                puts: 5,
                connections: 8,
            }
        );
        assert_eq!(p.quota("big").objects, u64::MAX);
        for bad in [
            "acme",
            "acme:objects",
            "acme:colors=3",
            "a b:objects=1",
            "x:objects=-1",
            "x:bytes=lots",
            "x:puts=1KiB",
        ] {
            assert_eq!(
                p.add_quota(bad).unwrap_err().code,
                Code::InvalidParams,
                "{bad}"
            );
        }
    }

    #[test]
    fn usage_stops_at_the_quota_and_comes_back() {
        let q = Quota {
            objects: 2,
            bytes: 100,
            clients: 1,
            pinned: 50,
            puts: 3,
            connections: 1,
        };
        let mut b = Book::default();
        assert_eq!(b.reserve("a", 60, q), Ok(()));
        assert_eq!(b.reserve("a", 60, q), Err(Over::Bytes(100)));
        assert_eq!(b.reserve("a", 40, q), Ok(()));
        assert_eq!(b.reserve("a", 0, q), Err(Over::Objects(2)));
        assert_eq!(b.usage("a").puts, 2);
        // Both commit: the table charges the objects, the puts end.
        for bytes in [60, 40] {
            b.end_put("a", bytes);
            b.charge("a", bytes);
        }
        assert_eq!((b.usage("a").puts, b.usage("a").objects), (0, 2));
        assert_eq!(
            b.reserve("b", 100, q),
            Ok(()),
            "another tenant is not held back"
        );
        assert_eq!(b.add_client("a", q), Ok(()));
        assert_eq!(b.add_client("a", q), Err(Over::Clients(1)));
        assert_eq!(b.pin_fits("a", 30, q), Ok(()));
        b.pin("a", 30);
        assert_eq!(b.pin_fits("a", 21, q), Err(Over::Pinned(50)));
        assert_eq!(b.pin_fits("b", 50, q), Ok(()), "pins count per tenant");
        b.unpin("a", 30);
        b.release("a", 60);
        b.release("a", 40);
        b.drop_client("a");
        assert_eq!(b.usage("a"), Usage::default());
        assert_eq!(b.all().len(), 1, "an empty entry is dropped");
        let few = Quota {
            puts: 2,
            ..Quota::default()
        };
        assert_eq!(b.reserve("c", 1, few), Ok(()));
        assert_eq!(b.reserve("c", 1, few), Ok(()));
        assert_eq!(b.reserve("c", 1, few), Err(Over::Puts(2)));
        b.end_put("c", 1);
        assert_eq!(
            b.reserve("c", 1, few),
            Ok(()),
            "an ended put gives its room back"
        );
        b.end_put("c", 1);
        b.end_put("c", 1);
        assert_eq!(b.usage("c"), Usage::default());
        assert_eq!(owner("\u{1}a\u{1}k"), Some("a"));
        assert_eq!(owner("k"), None);
        assert_eq!(owner("\u{1}k"), None);
    }
}
