//! Master addresses and host names as users write them.

use kvpool_proto::{Code, KvError, KvResult};

/// Default master RPC port (API.md §5).
pub const DEFAULT_MASTER_PORT: u16 = 50051;

/// Checks a master address: `host:port` (empty means `127.0.0.1:50051`, a
/// missing port means 50051), or `etcd://host:port[;...][/cluster-id]`
/// (`etcds://` over TLS) to follow the HA leader (passed on as is); other
/// schemes are not supported.
pub fn normalize_master(addr: &str) -> KvResult<String> {
    let a = addr.trim();
    if a.is_empty() {
        return Ok(format!("127.0.0.1:{DEFAULT_MASTER_PORT}"));
    }
    if let Some((scheme, rest)) = a.split_once("://") {
        if (scheme.eq_ignore_ascii_case("etcd") || scheme.eq_ignore_ascii_case("etcds"))
            && !rest.is_empty()
        {
            return Ok(a.to_string());
        }
        return Err(KvError::new(
            Code::NotSupported,
            format!("master address scheme {scheme:?} is not supported; use host:port or etcd://host:port"),
        ));
    }
    if a.contains(',') || a.contains(char::is_whitespace) {
        return Err(KvError::new(
            Code::InvalidParams,
            format!("master address {a:?} must be one host:port"),
        ));
    }
    // `[v6]:port`, `host:port`, or a bare host / v6 address.
    if let Some(rest) = a.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((_, "")) => Ok(format!("{a}:{DEFAULT_MASTER_PORT}")),
            Some((_, p)) if p.strip_prefix(':').is_some_and(valid_port) => Ok(a.to_string()),
            _ => Err(bad_master(a)),
        };
    }
    match a.rsplit_once(':') {
        None => Ok(format!("{a}:{DEFAULT_MASTER_PORT}")),
        Some((h, p)) if !h.is_empty() && !h.contains(':') && valid_port(p) => Ok(a.to_string()),
        Some(_) if a.matches(':').count() > 1 => Ok(format!("[{a}]:{DEFAULT_MASTER_PORT}")),
        Some(_) => Err(bad_master(a)),
    }
}

fn valid_port(p: &str) -> bool {
    p.parse::<u16>().is_ok_and(|n| n > 0)
}

fn bad_master(a: &str) -> KvError {
    KvError::new(
        Code::InvalidParams,
        format!("master address {a:?} is not host:port"),
    )
}

/// `master` with the HA cluster id `cluster` appended when it is an
/// `etcd://` address that names none (the address's own id wins).
pub fn with_cluster(master: String, cluster: &str) -> String {
    let cluster = cluster.trim().trim_matches('/');
    if cluster.is_empty() {
        return master;
    }
    let Some((_, rest)) = master.split_once("://") else {
        return master;
    };
    match rest.split_once('/') {
        Some((_, c)) if !c.is_empty() => master,
        Some(_) => format!("{master}{cluster}"),
        None => format!("{master}/{cluster}"),
    }
}

/// The host of `host[:port]` (Mooncake's `local_hostname` may carry a port).
pub fn host_part(h: &str) -> &str {
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split_once(']').map(|(v6, _)| v6).unwrap_or(h);
    }
    match h.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
        _ => h,
    }
}
