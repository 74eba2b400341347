//! Resolving `MooncakeDistributedStore.setup(...)` arguments into client
//! settings: explicit arguments, then `KVPOOL_*` env vars, then `MOONCAKE_*`
//! env vars, then the JSON config file (`KVPOOL_CONFIG_PATH` or
//! `MOONCAKE_CONFIG_PATH`), then defaults. Pure: the environment and the file
//! reader are passed in, so every rule is unit-tested without Python.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kvpool_client::auth::{Credentials, Security};
use kvpool_client::tls::TlsFiles;
use kvpool_client::ClientConfig;
use kvpool_proto::units::{parse_duration, parse_size};
use kvpool_proto::{Code, KvError, KvResult};

/// Default master RPC port (API.md §5).
pub const DEFAULT_MASTER_PORT: u16 = 50051;
/// Default segment and local buffer size in `setup(dict)` (Mooncake's 16 MB).
pub const DEFAULT_SIZE: u64 = 16 << 20;

/// A raw setting value as a caller, an env var or a JSON file gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Raw {
    /// Text, e.g. `"16MB"`, `"tcp"`, `"127.0.0.1:50051"`.
    Str(String),
    /// An integer (sizes in bytes, counts).
    Int(i128),
    /// A float (timeouts in seconds).
    Float(f64),
    /// A boolean flag.
    Bool(bool),
    /// Explicitly unset (`None` / JSON `null`): falls through to env and defaults.
    Null,
}

impl Raw {
    /// Converts a JSON value; arrays and objects are not settings.
    pub fn from_json(v: &serde_json::Value) -> Option<Raw> {
        match v {
            serde_json::Value::Null => Some(Raw::Null),
            serde_json::Value::Bool(b) => Some(Raw::Bool(*b)),
            serde_json::Value::Number(n) => n
                .as_i64()
                .map(|i| Raw::Int(i128::from(i)))
                .or_else(|| n.as_u64().map(|u| Raw::Int(i128::from(u))))
                .or_else(|| n.as_f64().map(Raw::Float)),
            serde_json::Value::String(s) => Some(Raw::Str(s.clone())),
            _ => None,
        }
    }
}

/// Transport asked for in `protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Framed TCP data plane.
    Tcp,
    /// Shared memory with same-host segments; a segment that cannot be mapped is an error.
    Shm,
    /// Shared memory where the segment is on this host, else TCP.
    Auto,
}

impl Protocol {
    /// Parses a `protocol` value; `rdma` (and other transports kvpool lacks)
    /// is `NOT_SUPPORTED`, an unknown name `INVALID_PARAMS`.
    pub fn parse(s: &str) -> KvResult<Protocol> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "tcp" => Ok(Protocol::Tcp),
            "shm" => Ok(Protocol::Shm),
            "auto" => Ok(Protocol::Auto),
            p @ ("rdma" | "efa" | "nvlink" | "cxl" | "ascend" | "nvmeof") => Err(KvError::new(
                Code::NotSupported,
                format!("protocol {p:?} is not supported by kvpool yet; use \"tcp\", \"shm\" or \"auto\""),
            )),
            p => Err(KvError::new(
                Code::InvalidParams,
                format!("unknown protocol {p:?}; use \"tcp\", \"shm\" or \"auto\""),
            )),
        }
    }

    /// The name as users write it.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Shm => "shm",
            Protocol::Auto => "auto",
        }
    }
}

/// Fully resolved store settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Name of this client and of its embedded segment.
    pub local_hostname: String,
    /// Accepted for compatibility; kvpool needs only the master address.
    pub metadata_server: String,
    /// Bytes this process lends to the pool (0 = pure client).
    pub global_segment_size: u64,
    /// 0 refuses the copying `put`/`get` calls; zero-copy calls work regardless.
    pub local_buffer_size: u64,
    /// Transport asked for.
    pub protocol: Protocol,
    /// RDMA device list; accepted and ignored.
    pub device_name: String,
    /// Master RPC address, `host:port`.
    pub master_server_addr: String,
    /// Limit for each master call attempt and each transfer (`None`: the
    /// Rust client's default).
    pub timeout: Option<Duration>,
    /// Limit for opening a connection to a store (`None`: client default).
    pub connect_timeout: Option<Duration>,
    /// Most extra attempts after transient failures (`None`: client default).
    pub retries: Option<u32>,
    /// Parallel connections a big batch uses per store (`None`: client default).
    pub conns_per_store: Option<usize>,
    /// Keys whose locations are remembered for one-round-trip repeat reads
    /// (0 turns the cache off; `None`: client default).
    pub location_cache: Option<usize>,
    /// Whether slow reads of replicated objects ask the next replica too
    /// (`None`: client default, off).
    pub hedge_reads: Option<bool>,
    /// IP the embedded segment binds and advertises.
    pub segment_address: String,
    /// The key proved to the master and stores (`secret_file` or `secret`).
    pub credentials: Option<Credentials>,
    /// Let the embedded segment serve off loopback without a secret.
    pub insecure: bool,
    /// TLS files (`tls_ca`, `tls_cert`, `tls_key`); none: plaintext.
    pub tls: TlsFiles,
    /// Names of inputs that were accepted but have no effect (for a warning).
    pub ignored: Vec<String>,
    /// Choices made for the caller that it should hear about (a warning).
    pub notes: Vec<String>,
}

impl Settings {
    /// The Rust client configuration these settings describe (TLS files
    /// are read and checked here).
    pub fn client_config(&self) -> KvResult<ClientConfig> {
        let mut c = ClientConfig::new(&self.master_server_addr);
        c.hostname = self.local_hostname.clone();
        if let Some(t) = self.timeout {
            c.timeout = t;
        }
        if let Some(t) = self.connect_timeout {
            c.connect_timeout = t;
        }
        if let Some(r) = self.retries {
            c.retries = r;
        }
        if let Some(n) = self.conns_per_store {
            c.conns_per_store = n;
        }
        if let Some(n) = self.location_cache {
            c.location_cache = n;
        }
        if let Some(h) = self.hedge_reads {
            c.hedge_reads = h;
        }
        c.segment_size = self.global_segment_size;
        c.segment_address = self.segment_address.clone();
        c.security = Security::new(self.credentials.clone(), self.insecure, &self.tls)?;
        apply_protocol(&mut c, self.protocol);
        Ok(c)
    }
}

/// Sets the transport in a client configuration.
pub fn apply_protocol(cfg: &mut ClientConfig, protocol: Protocol) {
    cfg.protocol = match protocol {
        Protocol::Tcp => kvpool_client::Protocol::Tcp,
        Protocol::Shm => kvpool_client::Protocol::Shm,
        Protocol::Auto => kvpool_client::Protocol::Auto,
    };
}

/// One setting: its canonical name, the aliases accepted in `setup(dict)` and
/// config files, and its env var suffix (`KVPOOL_<S>` / `MOONCAKE_<S>`).
struct Key {
    name: &'static str,
    aliases: &'static [&'static str],
    kvpool_env: &'static str,
    /// Mooncake's env vars for it, in order; a name ending in `_MS` holds
    /// milliseconds.
    mooncake_env: &'static [&'static str],
}

const KEYS: &[Key] = &[
    Key {
        name: "local_hostname",
        aliases: &[],
        kvpool_env: "KVPOOL_LOCAL_HOSTNAME",
        mooncake_env: &["MOONCAKE_LOCAL_HOSTNAME"],
    },
    Key {
        name: "metadata_server",
        aliases: &[],
        kvpool_env: "KVPOOL_METADATA_SERVER",
        mooncake_env: &["MOONCAKE_TE_META_DATA_SERVER"],
    },
    Key {
        name: "global_segment_size",
        aliases: &[],
        kvpool_env: "KVPOOL_GLOBAL_SEGMENT_SIZE",
        mooncake_env: &["MOONCAKE_GLOBAL_SEGMENT_SIZE"],
    },
    Key {
        name: "local_buffer_size",
        aliases: &[],
        kvpool_env: "KVPOOL_LOCAL_BUFFER_SIZE",
        mooncake_env: &["MOONCAKE_LOCAL_BUFFER_SIZE"],
    },
    Key {
        name: "protocol",
        aliases: &[],
        kvpool_env: "KVPOOL_PROTOCOL",
        mooncake_env: &["MOONCAKE_PROTOCOL"],
    },
    Key {
        name: "device_name",
        aliases: &["rdma_devices"],
        kvpool_env: "KVPOOL_DEVICE",
        mooncake_env: &["MOONCAKE_DEVICE"],
    },
    Key {
        name: "master_server_addr",
        aliases: &["master_server_address", "master"],
        kvpool_env: "KVPOOL_MASTER",
        mooncake_env: &["MOONCAKE_MASTER"],
    },
    Key {
        name: "timeout",
        aliases: &[],
        kvpool_env: "KVPOOL_TIMEOUT",
        mooncake_env: &["MC_RPC_TIMEOUT_MS"],
    },
    Key {
        name: "connect_timeout",
        aliases: &[],
        kvpool_env: "KVPOOL_CONNECT_TIMEOUT",
        mooncake_env: &[],
    },
    Key {
        name: "hedge_reads",
        aliases: &[],
        kvpool_env: "KVPOOL_HEDGE_READS",
        mooncake_env: &[],
    },
    Key {
        name: "retries",
        aliases: &[],
        kvpool_env: "KVPOOL_RETRIES",
        mooncake_env: &["MC_RETRY_CNT"],
    },
    Key {
        name: "conns_per_store",
        aliases: &[],
        kvpool_env: "KVPOOL_CONNS_PER_STORE",
        mooncake_env: &[],
    },
    Key {
        name: "location_cache",
        aliases: &[],
        kvpool_env: "KVPOOL_LOCATION_CACHE",
        mooncake_env: &[],
    },
    Key {
        name: "segment_address",
        aliases: &[],
        kvpool_env: "KVPOOL_SEGMENT_ADDRESS",
        mooncake_env: &["MC_TCP_BIND_ADDRESS"],
    },
    Key {
        name: "cluster_id",
        aliases: &[],
        kvpool_env: "KVPOOL_CLUSTER_ID",
        mooncake_env: &["MC_STORE_CLUSTER_ID"],
    },
    Key {
        name: "secret_file",
        aliases: &[],
        kvpool_env: "KVPOOL_SECRET_FILE",
        mooncake_env: &[],
    },
    Key {
        name: "secret",
        aliases: &[],
        kvpool_env: "KVPOOL_SECRET",
        mooncake_env: &[],
    },
    Key {
        name: "insecure",
        aliases: &[],
        kvpool_env: "KVPOOL_INSECURE",
        mooncake_env: &[],
    },
    Key {
        name: "tls_ca",
        aliases: &[],
        kvpool_env: "KVPOOL_TLS_CA",
        mooncake_env: &[],
    },
    Key {
        name: "tls_cert",
        aliases: &[],
        kvpool_env: "KVPOOL_TLS_CERT",
        mooncake_env: &[],
    },
    Key {
        name: "tls_key",
        aliases: &[],
        kvpool_env: "KVPOOL_TLS_KEY",
        mooncake_env: &[],
    },
];

/// Mooncake `setup` inputs kvpool accepts and ignores (with their no-op values).
const IGNORED_KEYS: &[&str] = &[
    "engine",
    "ipc_socket_path",
    "enable_client_http_server",
    "client_http_port",
    "check_server",
    "master_metrics_port",
    "standalone_storage",
    "client_server_address",
    "extra_backend_tag",
];

/// Inputs kvpool accepts only at their default value; anything else is
/// `NOT_SUPPORTED` rather than silently different behaviour.
const DEFAULT_ONLY: &[(&str, &str)] = &[("enable_ssd_offload", "false"), ("ssd_offload_path", "")];

/// Canonical name of a setting key or alias, if it is one.
fn canonical(name: &str) -> Option<&'static Key> {
    KEYS.iter()
        .find(|k| k.name == name || k.aliases.contains(&name))
}

/// Where the JSON config file is, per env (`KVPOOL_CONFIG_PATH` wins).
pub fn config_path(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    ["KVPOOL_CONFIG_PATH", "MOONCAKE_CONFIG_PATH"]
        .iter()
        .find_map(|v| env(v).filter(|p| !p.trim().is_empty()))
}

/// Parses a JSON config file's text into raw settings.
pub fn parse_config_file(text: &str, path: &str) -> KvResult<BTreeMap<String, Raw>> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        KvError::new(
            Code::InvalidParams,
            format!("config file {path}: invalid JSON: {e}"),
        )
    })?;
    let obj = v.as_object().ok_or_else(|| {
        KvError::new(
            Code::InvalidParams,
            format!("config file {path}: expected a JSON object"),
        )
    })?;
    Ok(obj
        .iter()
        .filter_map(|(k, v)| Raw::from_json(v).map(|r| (k.clone(), r)))
        .collect())
}

/// Resolves settings. `explicit` are `setup` arguments or `setup(dict)` keys
/// (canonical names or aliases); `env` reads an environment variable; `file`
/// is the parsed config file, if any.
pub fn resolve(
    explicit: &BTreeMap<String, Raw>,
    env: &dyn Fn(&str) -> Option<String>,
    file: Option<&BTreeMap<String, Raw>>,
) -> KvResult<Settings> {
    let mut ignored = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    // Reject or note inputs that are not settings.
    for (source, map) in [("argument", Some(explicit)), ("config file key", file)] {
        let Some(map) = map else { continue };
        for (k, v) in map {
            if canonical(k).is_some() || matches!(v, Raw::Null) {
                continue;
            }
            if k == "tenant_id" {
                // Mooncake 0.3.13 keeps one key space for all tenants; so
                // does kvpool: another tenant is accepted and noted.
                if raw_text(v).trim() != "default" && !raw_text(v).trim().is_empty() {
                    ignored.push(k.clone());
                }
            } else if IGNORED_KEYS.contains(&k.as_str()) {
                ignored.push(k.clone());
            } else if let Some((_, default)) = DEFAULT_ONLY.iter().find(|(n, _)| n == k) {
                if raw_text(v).to_ascii_lowercase() != *default {
                    return Err(KvError::new(
                        Code::NotSupported,
                        format!("{source} {k}={} is not supported by kvpool", raw_text(v)),
                    ));
                }
            } else {
                ignored.push(k.clone());
            }
        }
    }
    let lookup = |key: &Key| -> Option<(Raw, String)> {
        let from_map = |m: &BTreeMap<String, Raw>, what: &str| {
            std::iter::once(key.name)
                .chain(key.aliases.iter().copied())
                .find_map(|n| match m.get(n) {
                    Some(Raw::Null) | None => None,
                    Some(v) => Some((v.clone(), format!("{what} {n}"))),
                })
        };
        from_map(explicit, "argument")
            .or_else(|| {
                env(key.kvpool_env)
                    .filter(|v| !v.is_empty())
                    .map(|v| (Raw::Str(v), key.kvpool_env.to_string()))
            })
            .or_else(|| {
                key.mooncake_env.iter().find_map(|n| {
                    let v = env(n).filter(|v| !v.trim().is_empty())?;
                    // Mooncake's `*_MS` variables hold bare milliseconds.
                    let v = match n.ends_with("_MS") {
                        true => format!("{}ms", v.trim()),
                        false => v,
                    };
                    Some((Raw::Str(v), n.to_string()))
                })
            })
            .or_else(|| file.and_then(|f| from_map(f, "config file key")))
    };
    let get = |name: &str| -> Option<(Raw, String)> {
        KEYS.iter().find(|k| k.name == name).and_then(lookup)
    };

    let text = |name: &str, default: &str| -> String {
        match get(name) {
            Some((v, _)) => raw_text(&v),
            None => default.to_string(),
        }
    };
    let size = |name: &str| -> KvResult<u64> {
        match get(name) {
            None => Ok(DEFAULT_SIZE),
            Some((v, from)) => {
                raw_size(&v).map_err(|e| KvError::new(Code::InvalidParams, format!("{from}: {e}")))
            }
        }
    };
    let count = |name: &str, max: u64| -> KvResult<Option<u64>> {
        match get(name) {
            None => Ok(None),
            Some((v, from)) => match v {
                Raw::Int(i) if (0..=i128::from(max)).contains(&i) => Ok(Some(i as u64)),
                Raw::Str(s) => s
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n <= max)
                    .map(Some)
                    .ok_or_else(|| {
                        KvError::new(Code::InvalidParams, format!("{from}: invalid count {s:?}"))
                    }),
                other => Err(KvError::new(
                    Code::InvalidParams,
                    format!("{from}: invalid count {}", raw_text(&other)),
                )),
            },
        }
    };

    let local_hostname = {
        let h = text("local_hostname", "");
        if h.trim().is_empty() {
            "127.0.0.1".to_string()
        } else {
            h.trim().to_string()
        }
    };
    let master = with_cluster(
        normalize_master(&text("master_server_addr", ""))?,
        &text("cluster_id", ""),
    );
    let asked = text("protocol", "tcp");
    let protocol = match asked.trim().to_ascii_lowercase().as_str() {
        // Mooncake itself runs over TCP where no RDMA device exists; kvpool
        // has no RDMA transport, so it always does (and says so).
        "rdma" => {
            notes.push("protocol rdma: kvpool has no RDMA transport; using tcp".into());
            Protocol::Tcp
        }
        _ => Protocol::parse(&asked)?,
    };
    let protocol = match env("MC_FORCE_TCP").map(|v| v.trim().to_ascii_lowercase()) {
        Some(v) if matches!(v.as_str(), "1" | "true" | "yes" | "on") => {
            if protocol != Protocol::Tcp {
                notes.push("MC_FORCE_TCP is set: using tcp".into());
            }
            Protocol::Tcp
        }
        _ => protocol,
    };
    let duration = |name: &str| -> KvResult<Option<Duration>> {
        let Some((v, from)) = get(name) else {
            return Ok(None);
        };
        let t = raw_duration(&v)
            .map_err(|e| KvError::new(Code::InvalidParams, format!("{from}: {e}")))?;
        if t.is_zero() {
            return Err(KvError::new(
                Code::InvalidParams,
                format!("{name} must be positive"),
            ));
        }
        Ok(Some(t))
    };
    let timeout = duration("timeout")?;
    let connect_timeout = duration("connect_timeout")?;
    let segment_address = {
        let a = text("segment_address", "");
        if a.trim().is_empty() {
            host_part(&local_hostname).to_string()
        } else {
            a.trim().to_string()
        }
    };
    let credentials = match (text("secret_file", ""), text("secret", "")) {
        (f, _) if !f.trim().is_empty() => Some(Credentials::load(Path::new(f.trim()))?),
        (_, s) if !s.is_empty() => Some(Credentials::parse(&s)?),
        _ => None,
    };
    // A yes/no setting (`None` when not given); anything else is an error.
    let flag = |name: &str| -> KvResult<Option<bool>> {
        match text(name, "").trim().to_ascii_lowercase().as_str() {
            "" => Ok(None),
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            other => Err(KvError::new(
                Code::InvalidParams,
                format!("{name} must be true or false, not {other:?}"),
            )),
        }
    };
    let insecure = flag("insecure")?.unwrap_or(false);
    let path = |name: &str| Some(text(name, "").trim().to_string()).filter(|p| !p.is_empty());
    let tls = TlsFiles {
        ca: path("tls_ca").map(Into::into),
        cert: path("tls_cert").map(Into::into),
        key: path("tls_key").map(Into::into),
        require_client_cert: false,
    };
    let hedge_reads = flag("hedge_reads")?;
    let device_name = text("device_name", "");
    if !device_name.is_empty() {
        ignored.push("device_name".into());
    }
    Ok(Settings {
        metadata_server: text("metadata_server", ""),
        global_segment_size: size("global_segment_size")?,
        local_buffer_size: size("local_buffer_size")?,
        protocol,
        device_name,
        master_server_addr: master,
        timeout,
        connect_timeout,
        retries: count("retries", 1000)?.map(|n| n as u32),
        conns_per_store: count("conns_per_store", 256)?.map(|n| n.max(1) as usize),
        location_cache: count("location_cache", 1 << 26)?.map(|n| n as usize),
        hedge_reads,
        segment_address,
        local_hostname,
        credentials,
        insecure,
        tls,
        ignored,
        notes,
    })
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

fn raw_text(v: &Raw) -> String {
    match v {
        Raw::Str(s) => s.clone(),
        Raw::Int(i) => i.to_string(),
        Raw::Float(f) => f.to_string(),
        Raw::Bool(b) => b.to_string(),
        Raw::Null => String::new(),
    }
}

/// A byte size from an int or a human string (`"16MB"`, `"4gb"`, `"1073741824"`).
pub fn raw_size(v: &Raw) -> Result<u64, String> {
    match v {
        Raw::Int(i) => u64::try_from(*i).map_err(|_| format!("invalid size {i}")),
        Raw::Str(s) => parse_size(s),
        Raw::Float(f) if f.is_finite() && *f >= 0.0 && *f < u64::MAX as f64 => Ok(*f as u64),
        other => Err(format!("invalid size {}", raw_text(other))),
    }
}

fn raw_duration(v: &Raw) -> Result<Duration, String> {
    match v {
        Raw::Int(i) if *i >= 0 => u64::try_from(*i)
            .map(Duration::from_secs)
            .map_err(|_| format!("invalid duration {i}")),
        Raw::Float(f) if f.is_finite() && *f >= 0.0 && *f < 1e12 => Ok(Duration::from_secs_f64(*f)),
        Raw::Str(s) => parse_duration(s),
        other => Err(format!("invalid duration {}", raw_text(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn args(pairs: &[(&str, Raw)]) -> BTreeMap<String, Raw> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn defaults() {
        let s = resolve(&BTreeMap::new(), &no_env, None).unwrap();
        assert_eq!(s.master_server_addr, "127.0.0.1:50051");
        assert_eq!(s.local_hostname, "127.0.0.1");
        assert_eq!(s.global_segment_size, DEFAULT_SIZE);
        assert_eq!(s.local_buffer_size, DEFAULT_SIZE);
        assert_eq!(s.protocol, Protocol::Tcp);
        assert_eq!(s.timeout, None);
        assert_eq!(s.retries, None);
        let c = s.client_config().unwrap();
        assert_eq!(c.timeout, ClientConfig::new("x").timeout);
        assert_eq!(c.location_cache, ClientConfig::new("x").location_cache);
        assert_eq!(s.client_config().unwrap().segment_size, DEFAULT_SIZE);
        // The location cache can be sized, or turned off, from the environment.
        let env = |k: &str| (k == "KVPOOL_LOCATION_CACHE").then(|| "0".to_string());
        let s = resolve(&BTreeMap::new(), &env, None).unwrap();
        assert_eq!(s.client_config().unwrap().location_cache, 0);
        assert!(!c.hedge_reads, "hedged reads are off unless asked for");
        let env = |k: &str| (k == "KVPOOL_HEDGE_READS").then(|| "on".to_string());
        let s = resolve(&BTreeMap::new(), &env, None).unwrap();
        assert!(s.client_config().unwrap().hedge_reads);
    }

    #[test]
    fn tls_files_come_from_arguments_env_or_file() {
        let env = |k: &str| (k == "KVPOOL_TLS_CA").then(|| "/env/ca.pem".to_string());
        let file = args(&[("tls_cert", Raw::Str("/file/c.pem".into()))]);
        let s = resolve(
            &args(&[("tls_key", Raw::Str(" /arg/k.pem ".into()))]),
            &env,
            Some(&file),
        )
        .unwrap();
        assert_eq!(s.tls.ca.as_deref(), Some(Path::new("/env/ca.pem")));
        assert_eq!(s.tls.cert.as_deref(), Some(Path::new("/file/c.pem")));
        assert_eq!(s.tls.key.as_deref(), Some(Path::new("/arg/k.pem")));
        // The files are read when the client is made: a missing one is an
        // error naming it.
        let e = s.client_config().unwrap_err();
        assert!(e.message.contains("/env/ca.pem"), "{e}");
        assert_eq!(
            normalize_master("etcds://10.0.0.1:2379/prod").unwrap(),
            "etcds://10.0.0.1:2379/prod"
        );
    }

    #[test]
    fn human_sizes_and_aliases() {
        let s = resolve(
            &args(&[
                ("global_segment_size", Raw::Str("4gb".into())),
                ("local_buffer_size", Raw::Str("16MB".into())),
                ("master_server_address", Raw::Str("10.0.0.1:7000".into())),
                ("rdma_devices", Raw::Str("mlx5_0".into())),
            ]),
            &no_env,
            None,
        )
        .unwrap();
        assert_eq!(s.global_segment_size, 4 << 30);
        assert_eq!(s.local_buffer_size, 16 << 20);
        assert_eq!(s.master_server_addr, "10.0.0.1:7000");
        assert_eq!(s.device_name, "mlx5_0");
        assert!(s.ignored.contains(&"device_name".to_string()));
    }

    #[test]
    fn precedence_explicit_kvpool_mooncake_file() {
        let env = |k: &str| match k {
            "KVPOOL_MASTER" => Some("kv:1".to_string()),
            "MOONCAKE_MASTER" => Some("mc:2".to_string()),
            "MOONCAKE_LOCAL_BUFFER_SIZE" => Some("1MB".to_string()),
            "MOONCAKE_PROTOCOL" => Some("shm".to_string()),
            _ => None,
        };
        let file = args(&[
            ("local_buffer_size", Raw::Int(7)),
            ("global_segment_size", Raw::Int(9)),
            ("protocol", Raw::Str("tcp".into())),
        ]);
        let s = resolve(&BTreeMap::new(), &env, Some(&file)).unwrap();
        assert_eq!(s.master_server_addr, "kv:1");
        assert_eq!(s.local_buffer_size, 1 << 20);
        assert_eq!(s.global_segment_size, 9);
        assert_eq!(s.protocol, Protocol::Shm);
        let s = resolve(
            &args(&[("master_server_addr", Raw::Str("arg:3".into()))]),
            &env,
            Some(&file),
        )
        .unwrap();
        assert_eq!(s.master_server_addr, "arg:3");
        // None falls through to the environment.
        let s = resolve(&args(&[("master_server_addr", Raw::Null)]), &env, None).unwrap();
        assert_eq!(s.master_server_addr, "kv:1");
    }

    #[test]
    fn mooncake_client_env_vars() {
        let env = |k: &str| match k {
            "MC_RPC_TIMEOUT_MS" => Some("2500".to_string()),
            "MC_RETRY_CNT" => Some("3".to_string()),
            "MC_TCP_BIND_ADDRESS" => Some("127.0.0.9".to_string()),
            "MC_STORE_CLUSTER_ID" => Some("mc".to_string()),
            "MOONCAKE_MASTER" => Some("etcd://10.0.0.1:2379".to_string()),
            _ => None,
        };
        let s = resolve(&BTreeMap::new(), &env, None).unwrap();
        assert_eq!(s.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(s.retries, Some(3));
        assert_eq!(s.segment_address, "127.0.0.9");
        assert_eq!(s.master_server_addr, "etcd://10.0.0.1:2379/mc");
        // KVPOOL_CLUSTER_ID wins; an id in the address wins over both.
        let env2 = |k: &str| match k {
            "KVPOOL_CLUSTER_ID" => Some("kv".to_string()),
            _ => env(k),
        };
        let s = resolve(&BTreeMap::new(), &env2, None).unwrap();
        assert_eq!(s.master_server_addr, "etcd://10.0.0.1:2379/kv");
        let a = args(&[("master_server_addr", Raw::Str("etcd://h:1/own".into()))]);
        assert_eq!(
            resolve(&a, &env2, None).unwrap().master_server_addr,
            "etcd://h:1/own"
        );
        // A plain master address has no cluster.
        let a = args(&[("master_server_addr", Raw::Str("h:1".into()))]);
        assert_eq!(resolve(&a, &env2, None).unwrap().master_server_addr, "h:1");
        assert_eq!(with_cluster("etcd://h:1/".into(), "/x/"), "etcd://h:1/x");
        // rdma runs over tcp, and MC_FORCE_TCP forces tcp.
        let a = args(&[("protocol", Raw::Str("rdma".into()))]);
        let s = resolve(&a, &no_env, None).unwrap();
        assert_eq!(s.protocol, Protocol::Tcp);
        assert_eq!(s.notes.len(), 1);
        let force = |k: &str| (k == "MC_FORCE_TCP").then(|| "1".to_string());
        let a = args(&[("protocol", Raw::Str("shm".into()))]);
        assert_eq!(resolve(&a, &force, None).unwrap().protocol, Protocol::Tcp);
    }

    #[test]
    fn protocols() {
        assert_eq!(Protocol::parse("TCP").unwrap(), Protocol::Tcp);
        assert_eq!(Protocol::parse("auto").unwrap(), Protocol::Auto);
        assert_eq!(
            Protocol::parse("rdma").unwrap_err().code,
            Code::NotSupported
        );
        assert_eq!(
            Protocol::parse("bogus").unwrap_err().code,
            Code::InvalidParams
        );
    }

    #[test]
    fn master_addresses() {
        assert_eq!(normalize_master("h:1").unwrap(), "h:1");
        assert_eq!(normalize_master(" h ").unwrap(), "h:50051");
        assert_eq!(normalize_master("[::1]:5").unwrap(), "[::1]:5");
        assert_eq!(normalize_master("[::1]").unwrap(), "[::1]:50051");
        assert_eq!(normalize_master("::1").unwrap(), "[::1]:50051");
        assert_eq!(
            normalize_master("etcd://10.0.0.1:2379;10.0.0.2:2379/c1").unwrap(),
            "etcd://10.0.0.1:2379;10.0.0.2:2379/c1"
        );
        assert_eq!(
            normalize_master("http://10.0.0.1:2379").unwrap_err().code,
            Code::NotSupported
        );
        assert_eq!(
            normalize_master("etcd://").unwrap_err().code,
            Code::NotSupported
        );
        assert_eq!(
            normalize_master("h:0").unwrap_err().code,
            Code::InvalidParams
        );
        assert_eq!(
            normalize_master("h:x").unwrap_err().code,
            Code::InvalidParams
        );
        assert_eq!(
            normalize_master("a:1,b:2").unwrap_err().code,
            Code::InvalidParams
        );
    }

    #[test]
    fn hosts() {
        assert_eq!(host_part("10.0.0.1:1234"), "10.0.0.1");
        assert_eq!(host_part("node1"), "node1");
        assert_eq!(host_part("[::1]:9"), "::1");
        let s = resolve(
            &args(&[("local_hostname", Raw::Str("127.0.0.2:17777".into()))]),
            &no_env,
            None,
        )
        .unwrap();
        assert_eq!(s.segment_address, "127.0.0.2");
        assert_eq!(s.local_hostname, "127.0.0.2:17777");
    }

    #[test]
    fn bad_values_are_errors_not_panics() {
        for (k, v) in [
            ("global_segment_size", Raw::Int(-1)),
            ("global_segment_size", Raw::Str("4XB".into())),
            ("local_buffer_size", Raw::Bool(true)),
            ("timeout", Raw::Str("soon".into())),
            ("timeout", Raw::Int(0)),
            ("connect_timeout", Raw::Str("soon".into())),
            ("connect_timeout", Raw::Int(0)),
            ("retries", Raw::Int(-3)),
            ("conns_per_store", Raw::Str("many".into())),
            ("location_cache", Raw::Int(-1)),
            ("hedge_reads", Raw::Str("sometimes".into())),
            ("insecure", Raw::Str("maybe".into())),
        ] {
            let e = resolve(&args(&[(k, v.clone())]), &no_env, None).unwrap_err();
            assert_eq!(e.code, Code::InvalidParams, "{k}={v:?}");
        }
    }

    #[test]
    fn unsupported_options() {
        let s = resolve(
            &args(&[("tenant_id", Raw::Str("other".into()))]),
            &no_env,
            None,
        )
        .unwrap();
        assert_eq!(s.ignored, vec!["tenant_id".to_string()]);
        let e = resolve(
            &args(&[("enable_ssd_offload", Raw::Bool(true))]),
            &no_env,
            None,
        )
        .unwrap_err();
        assert_eq!(e.code, Code::NotSupported);
        let s = resolve(
            &args(&[
                ("tenant_id", Raw::Str("default".into())),
                ("enable_ssd_offload", Raw::Bool(false)),
                ("engine", Raw::Null),
                ("ipc_socket_path", Raw::Str("/x".into())),
            ]),
            &no_env,
            None,
        )
        .unwrap();
        assert_eq!(s.ignored, vec!["ipc_socket_path".to_string()]);
    }

    #[test]
    fn config_files() {
        let env = |k: &str| match k {
            "KVPOOL_CONFIG_PATH" => Some("/a.json".to_string()),
            "MOONCAKE_CONFIG_PATH" => Some("/b.json".to_string()),
            _ => None,
        };
        assert_eq!(config_path(&env).as_deref(), Some("/a.json"));
        assert_eq!(config_path(&no_env), None);
        let f = parse_config_file(
            r#"{"master_server_address": "m:1", "global_segment_size": "1gb", "local_buffer_size": 0, "x": [1]}"#,
            "f",
        )
        .unwrap();
        let s = resolve(&BTreeMap::new(), &no_env, Some(&f)).unwrap();
        assert_eq!(s.master_server_addr, "m:1");
        assert_eq!(s.global_segment_size, 1 << 30);
        assert_eq!(s.local_buffer_size, 0);
        assert_eq!(
            parse_config_file("[1]", "f").unwrap_err().code,
            Code::InvalidParams
        );
        assert_eq!(
            parse_config_file("{", "f").unwrap_err().code,
            Code::InvalidParams
        );
    }
}
