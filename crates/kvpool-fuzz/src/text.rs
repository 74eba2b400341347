//! Short texts from peers, flags, env vars and config files: keys, names and
//! endpoints (`kvpool_proto::limits`), sizes and durations
//! (`kvpool_proto::units`), secrets (`kvpool_net::auth`), tenant names,
//! namespaces and `--tenant-quota` values.

use kvpool_master::TenantPolicy;
use kvpool_net::auth::Credentials;
use kvpool_proto::limits::{validate_endpoint, validate_key, validate_name, MAX_KEY_LEN};
use kvpool_proto::tenant::{scoped, tenant_of, validate_tenant, Scope};
use kvpool_proto::units::{parse_duration, parse_size};

/// The input as each text a validator or parser takes; non-UTF-8 is
/// refused before any of them sees it, as `&str` arguments are.
pub fn validators(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    assert_eq!(
        validate_key(s).is_ok(),
        (1..=MAX_KEY_LEN).contains(&s.len())
    );
    let name = validate_name("name", s);
    if validate_endpoint(s).is_ok() {
        assert!(name.is_ok(), "an endpoint is a valid name");
    }
    if let Ok(n) = parse_size(s) {
        assert_eq!(parse_size(&n.to_string()), Ok(n), "size round trip");
    }
    if let Ok(d) = parse_duration(s) {
        let again = parse_duration(&format!("{}ns", d.as_nanos()));
        if d.as_secs() < 1 << 40 {
            assert!(again.is_ok(), "{d:?} does not parse back");
        }
    }
    if let Ok(c) = Credentials::parse(s) {
        let again = Credentials::parse(&c.encode()).ok();
        assert!(again == Some(c), "key round trip");
    }
    // Whatever key a tenant's client is given, the key it sends is in its
    // namespace, or names one outright; never in another's by accident.
    let key = scoped(Some("t"), s);
    assert!(Scope::Tenant("t").may_write(&key) || s.starts_with(kvpool_proto::tenant::MARK));
    if validate_tenant(s).is_ok() {
        assert_eq!(tenant_of(&scoped(Some(s), "k")), Some(s));
    }
    let _ = TenantPolicy::default().add_quota(s);
}
