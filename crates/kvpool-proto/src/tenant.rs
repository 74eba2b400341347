//! Tenants: namespaces of keys that one client key each may reach.
//!
//! A tenant's objects live under the key prefix `\u{1}NAME\u{1}` (see
//! [`prefix`]): the client library of a tenant adds it to every key and the
//! master refuses a tenant's request that names a key outside it, so the
//! index, the grants (bound to the full key), the object headers on the
//! stores and every count keyed by object need no other field. Keys that
//! start with [`MARK`] are reserved for tenants: a peer without a tenant
//! may not write them (it may read a namespace an admin marked shared).

use crate::code::{Code, KvError, KvResult};

/// First byte of every tenant's keys (and of no other key a peer without
/// a tenant may write).
pub const MARK: char = '\u{1}';

/// Longest tenant name.
pub const MAX_TENANT_LEN: usize = 63;

/// Checks a tenant name: 1 to [`MAX_TENANT_LEN`] ASCII letters, digits,
/// `.`, `_` or `-` (it is part of keys, logs and metric labels).
pub fn validate_tenant(name: &str) -> KvResult<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TENANT_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        return Ok(());
    }
    Err(KvError::new(
        Code::InvalidParams,
        format!(
            "tenant name {name:?}: use 1 to {MAX_TENANT_LEN} ASCII letters, digits, '.', '_' or '-'"
        ),
    ))
}

/// The prefix of every key of tenant `name`.
pub fn prefix(name: &str) -> String {
    format!("{MARK}{name}{MARK}")
}

/// The tenant whose namespace `key` is in: `None` for a key without
/// [`MARK`] in front, `Some("")` for a reserved key that names no tenant
/// (only an admin may use it).
pub fn tenant_of(key: &str) -> Option<&str> {
    let rest = key.strip_prefix(MARK)?;
    Some(rest.split_once(MARK).map_or("", |(name, _)| name))
}

/// The key a tenant's client sends for the caller's `key`: prefixed with
/// the tenant's namespace, unless it names a namespace itself (starts with
/// [`MARK`], to read one marked shared).
pub fn scoped(tenant: Option<&str>, key: &str) -> String {
    match tenant {
        Some(t) if !key.starts_with(MARK) => format!("{MARK}{t}{MARK}{key}"),
        _ => key.to_string(),
    }
}

/// Who a request comes from, for the namespace check: a tenant's client,
/// another client (none), or a store or admin (every namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Every namespace (stores hold every tenant's bytes; admins see all).
    All,
    /// The keys without a tenant.
    Untenanted,
    /// The keys of this tenant.
    Tenant(&'a str),
}

impl Scope<'_> {
    /// Whether this scope may write (put, remove, replicate) `key`.
    pub fn may_write(self, key: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Untenanted => tenant_of(key).is_none(),
            Scope::Tenant(t) => tenant_of(key) == Some(t),
        }
    }

    /// Whether this scope may read `key`, given the namespaces marked
    /// shared (readable by every client).
    pub fn may_read(self, key: &str, shared: &dyn Fn(&str) -> bool) -> bool {
        self.may_write(key) || tenant_of(key).is_some_and(|t| !t.is_empty() && shared(t))
    }
}

/// The refusal of a request that names a key outside the caller's scope.
pub fn outside(scope: Scope<'_>, key: &str) -> KvError {
    let whose = match scope {
        Scope::Tenant(t) => format!("tenant {t:?}"),
        _ => "a client without a tenant".to_string(),
    };
    let what = match tenant_of(key) {
        Some(t) if !t.is_empty() => format!("tenant {t:?}'s namespace"),
        Some(_) => "the reserved key space (keys starting with \\u0001)".to_string(),
        None => "the namespace of clients without a tenant".to_string(),
    };
    KvError::new(
        Code::Unauthorized,
        format!("{whose} may not reach a key in {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["a", "acme", "team-1.prod_x", &"x".repeat(MAX_TENANT_LEN)] {
            assert!(validate_tenant(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "a/b",
            "\u{1}",
            "é",
            &"x".repeat(MAX_TENANT_LEN + 1),
        ] {
            assert_eq!(validate_tenant(bad).unwrap_err().code, Code::InvalidParams);
        }
    }

    #[test]
    fn keys_are_scoped_to_their_tenant() {
        let k = scoped(Some("acme"), "page-1");
        assert_eq!(k, "\u{1}acme\u{1}page-1");
        assert_eq!(tenant_of(&k), Some("acme"));
        assert_eq!(tenant_of("page-1"), None);
        assert_eq!(tenant_of("\u{1}broken"), Some(""));
        assert_eq!(scoped(None, "page-1"), "page-1");
        // An explicit namespace is left alone (a read of a shared one).
        assert_eq!(scoped(Some("acme"), &k), k);

        let acme = Scope::Tenant("acme");
        let none = |_: &str| false;
        let base = |t: &str| t == "base";
        assert!(acme.may_write(&k) && acme.may_read(&k, &none));
        for other in [
            "page-1",
            "\u{1}other\u{1}page-1",
            "\u{1}acme",
            "\u{1}acmex\u{1}k",
        ] {
            assert!(!acme.may_write(other), "{other:?}");
            assert!(!acme.may_read(other, &none), "{other:?}");
        }
        let shared = "\u{1}base\u{1}system-prompt";
        assert!(acme.may_read(shared, &base) && !acme.may_write(shared));
        assert!(Scope::Untenanted.may_read(shared, &base));
        assert!(!Scope::Untenanted.may_write(shared));
        assert!(Scope::Untenanted.may_write("page-1"));
        assert!(!Scope::Untenanted.may_read("\u{1}broken", &|_| true));
        assert!(Scope::All.may_write("\u{1}broken"));
        assert_eq!(outside(acme, "page-1").code, Code::Unauthorized);
    }
}
