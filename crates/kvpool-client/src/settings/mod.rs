//! Client settings resolved from every place a user may put them: explicit
//! values (a `setup` argument, a `setup(dict)` key, a Rust caller's map),
//! then `KVPOOL_*` env vars, then Mooncake's env vars (`MOONCAKE_*`,
//! `MC_*`), then the JSON config file (`KVPOOL_CONFIG_PATH` or
//! `MOONCAKE_CONFIG_PATH`), then defaults.
//!
//! One resolver for the Rust client, the Python package and its Mooncake
//! drop-in, so the same env and file configure all three and reject the same
//! values with the same codes. [`Settings::resolve_with`] is pure (the
//! environment and the file are passed in), so every rule is unit-tested;
//! [`Settings::resolve`] reads the process's. [`Settings::client_config`]
//! turns the result into a [`ClientConfig`].
//!
//! Names follow Mooncake's `setup` arguments (`global_segment_size`,
//! `master_server_addr`, ...) because Mooncake users bring those names, in
//! dicts and config files, and the resolved values go back to Python under
//! them.

mod keys;
mod master;
mod raw;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kvpool_net::auth::{Credentials, Security};
use kvpool_net::tls::{yes_no, TlsFiles};
use kvpool_proto::{Code, KvError, KvResult};

use crate::{ClientConfig, Protocol};
use keys::{canonical, Key, DEFAULT_ONLY, IGNORED_KEYS, KEYS};

use master::{host_part, normalize_master, with_cluster};
use raw::load_config_file;
pub use raw::Raw;

/// Default segment and local buffer size (Mooncake's 16 MB).
const DEFAULT_SIZE: u64 = 16 << 20;

/// Fully resolved client settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Name of this client and of its embedded segment.
    pub local_hostname: String,
    /// Accepted for compatibility; kvpool needs only the master address.
    pub metadata_server: String,
    /// Bytes this process lends to the pool (0 = pure client).
    pub global_segment_size: u64,
    /// 0 refuses the copying `put`/`get` calls of the Mooncake drop-in;
    /// zero-copy calls work regardless.
    pub local_buffer_size: u64,
    /// Transport asked for (tcp unless given: Mooncake's default).
    pub protocol: Protocol,
    /// RDMA device list; accepted and ignored.
    pub device_name: String,
    /// Master RPC address, `host:port` or `etcd://...`.
    pub master_server_addr: String,
    /// Limit for each master call attempt and each transfer (`None`: the
    /// client default).
    pub timeout: Option<Duration>,
    /// Limit for opening a connection to a store (`None`: client default).
    pub connect_timeout: Option<Duration>,
    /// Most extra attempts after transient failures (`None`: client default).
    pub retries: Option<u32>,
    /// Master silence after which master calls fail at once (`None`: they
    /// wait out their retries; see [`ClientConfig::fail_fast_after`]).
    pub fail_fast_after: Option<Duration>,
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
    /// Port the embedded segment binds (0 picks a free one).
    pub segment_port: u16,
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
    /// Resolves `explicit` (canonical names or aliases) against this
    /// process's environment and the config file it names.
    pub fn resolve(explicit: &BTreeMap<String, Raw>) -> KvResult<Settings> {
        let env = |name: &str| std::env::var(name).ok();
        let file = load_config_file(&env)?;
        Settings::resolve_with(explicit, &env, file.as_ref())
    }

    /// Resolves settings. `explicit` are `setup` arguments or `setup(dict)`
    /// keys (canonical names or aliases; `Null` falls through); `env` reads
    /// an environment variable; `file` is the parsed config file, if any.
    /// Values kvpool cannot honour are `INVALID_PARAMS` or `NOT_SUPPORTED`.
    pub fn resolve_with(
        explicit: &BTreeMap<String, Raw>,
        env: &dyn Fn(&str) -> Option<String>,
        file: Option<&BTreeMap<String, Raw>>,
    ) -> KvResult<Settings> {
        let mut ignored = unknown_inputs(explicit, file)?;
        let mut notes: Vec<String> = Vec::new();
        let r = Resolver {
            explicit,
            env,
            file,
        };
        let local_hostname = r
            .trimmed("local_hostname")
            .unwrap_or_else(|| "127.0.0.1".into());
        let master = with_cluster(
            normalize_master(&r.text("master_server_addr", ""))?,
            &r.text("cluster_id", ""),
        );
        let protocol = r.protocol(&mut notes)?;
        let segment_address = r
            .trimmed("segment_address")
            .unwrap_or_else(|| host_part(&local_hostname).to_string());
        let credentials = match (r.text("secret_file", ""), r.text("secret", "")) {
            (f, _) if !f.trim().is_empty() => Some(Credentials::load(Path::new(f.trim()))?),
            (_, s) if !s.is_empty() => Some(Credentials::parse(&s)?),
            _ => None,
        };
        let credentials = with_tenant(credentials, r.trimmed("tenant"))?;
        let tls = TlsFiles {
            ca: r.trimmed("tls_ca").map(Into::into),
            cert: r.trimmed("tls_cert").map(Into::into),
            key: r.trimmed("tls_key").map(Into::into),
            require_client_cert: false,
        };
        let device_name = r.text("device_name", "");
        if !device_name.is_empty() {
            ignored.push("device_name".into());
        }
        Ok(Settings {
            metadata_server: r.text("metadata_server", ""),
            global_segment_size: r.size("global_segment_size")?,
            local_buffer_size: r.size("local_buffer_size")?,
            protocol,
            device_name,
            master_server_addr: master,
            timeout: r.duration("timeout")?,
            connect_timeout: r.duration("connect_timeout")?,
            retries: r.count("retries", 1000)?.map(|n| n as u32),
            fail_fast_after: r.duration("fail_fast_after")?,
            conns_per_store: r.count("conns_per_store", 256)?.map(|n| n.max(1) as usize),
            location_cache: r.count("location_cache", 1 << 26)?.map(|n| n as usize),
            hedge_reads: r.flag("hedge_reads")?,
            segment_address,
            segment_port: r
                .count("segment_port", u64::from(u16::MAX))?
                .map_or(0, |n| n as u16),
            local_hostname,
            credentials,
            insecure: r.flag("insecure")?.unwrap_or(false),
            tls,
            ignored,
            notes,
        })
    }

    /// These settings as explicit values under their canonical names, which
    /// resolve back to these settings with no env and no file (`ignored`
    /// and `notes` aside): how the Python binding hands resolved settings to
    /// Python as a dict and takes them back to connect, without reading the
    /// environment twice.
    pub fn explicit(&self) -> BTreeMap<String, Raw> {
        let text = |s: &str| Raw::Str(s.to_string());
        let int = |n: u64| Raw::Int(i128::from(n));
        let opt_int = |n: Option<u64>| n.map_or(Raw::Null, int);
        let secs = |t: Option<Duration>| t.map_or(Raw::Null, |t| Raw::Float(t.as_secs_f64()));
        let path = |p: &Option<std::path::PathBuf>| {
            p.as_ref().map_or(Raw::Null, |p| text(&p.to_string_lossy()))
        };
        [
            ("local_hostname", text(&self.local_hostname)),
            ("metadata_server", text(&self.metadata_server)),
            ("global_segment_size", int(self.global_segment_size)),
            ("local_buffer_size", int(self.local_buffer_size)),
            ("protocol", text(self.protocol.name())),
            ("device_name", text(&self.device_name)),
            ("master_server_addr", text(&self.master_server_addr)),
            ("timeout", secs(self.timeout)),
            ("connect_timeout", secs(self.connect_timeout)),
            ("retries", opt_int(self.retries.map(u64::from))),
            ("fail_fast_after", secs(self.fail_fast_after)),
            (
                "conns_per_store",
                opt_int(self.conns_per_store.map(|n| n as u64)),
            ),
            (
                "location_cache",
                opt_int(self.location_cache.map(|n| n as u64)),
            ),
            ("hedge_reads", self.hedge_reads.map_or(Raw::Null, Raw::Bool)),
            ("segment_address", text(&self.segment_address)),
            ("segment_port", int(u64::from(self.segment_port))),
            // The key travels as its encoded text, never as the file name:
            // whoever connects from these values must not read files again.
            (
                "secret",
                self.credentials
                    .as_ref()
                    .map_or(Raw::Null, |c| Raw::Str(c.encode())),
            ),
            (
                "tenant",
                self.credentials
                    .as_ref()
                    .and_then(|c| c.tenant())
                    .map_or(Raw::Null, |t| Raw::Str(t.into())),
            ),
            ("insecure", Raw::Bool(self.insecure)),
            ("tls_ca", path(&self.tls.ca)),
            ("tls_cert", path(&self.tls.cert)),
            ("tls_key", path(&self.tls.key)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The client configuration these settings describe: settings left
    /// `None` keep [`ClientConfig::new`]'s defaults. TLS files are read and
    /// checked here, so a missing one is an error naming it.
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
        c.fail_fast_after = self.fail_fast_after;
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
        c.segment_port = self.segment_port;
        c.protocol = self.protocol;
        c.security = self.security()?;
        Ok(c)
    }

    /// The key and TLS these settings name, for connections made outside a
    /// [`Client`](crate::Client) (asking a store what it serves, say). TLS
    /// files are read and checked here.
    pub fn security(&self) -> KvResult<Security> {
        Security::new(self.credentials.clone(), self.insecure, &self.tls)
    }
}

/// Names of inputs that are not settings but are accepted (Mooncake keys
/// kvpool has no use for); refuses those kvpool supports only at their
/// default.
fn unknown_inputs(
    explicit: &BTreeMap<String, Raw>,
    file: Option<&BTreeMap<String, Raw>>,
) -> KvResult<Vec<String>> {
    let mut ignored = Vec::new();
    for (source, map) in [("argument", Some(explicit)), ("config file key", file)] {
        let Some(map) = map else { continue };
        for (k, v) in map {
            if canonical(k).is_some() || matches!(v, Raw::Null) {
                continue;
            }
            let text = v.text();
            if k == "tenant_id" {
                // Mooncake 0.3.13 keeps one key space for all tenants; so
                // does kvpool: another tenant is accepted and noted.
                if text.trim() != "default" && !text.trim().is_empty() {
                    ignored.push(k.clone());
                }
            } else if IGNORED_KEYS.contains(&k.as_str()) {
                ignored.push(k.clone());
            } else if let Some((_, default)) = DEFAULT_ONLY.iter().find(|(n, _)| n == k) {
                if text.to_ascii_lowercase() != *default {
                    return Err(KvError::new(
                        Code::NotSupported,
                        format!("{source} {k}={text} is not supported by kvpool"),
                    ));
                }
            } else {
                // Unknown keys are accepted and reported (`ignored`), not
                // refused, like the known no-op keys above.
                ignored.push(k.clone());
            }
        }
    }
    Ok(ignored)
}

/// Looks settings up in precedence order and converts them, naming the
/// source of a bad value in its error.
struct Resolver<'a> {
    explicit: &'a BTreeMap<String, Raw>,
    env: &'a dyn Fn(&str) -> Option<String>,
    file: Option<&'a BTreeMap<String, Raw>>,
}

impl Resolver<'_> {
    /// The value of setting `name` and where it came from (for errors).
    fn get(&self, name: &str) -> Option<(Raw, String)> {
        let key = KEYS.iter().find(|k| k.name == name)?;
        let env = self.env;
        from_map(key, self.explicit, "argument")
            .or_else(|| {
                // An empty variable is unset, as in a shell.
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
            .or_else(|| self.file.and_then(|f| from_map(key, f, "config file key")))
    }

    /// The setting as text, or `default` when it is given nowhere.
    fn text(&self, name: &str, default: &str) -> String {
        self.get(name)
            .map_or_else(|| default.to_string(), |(v, _)| v.text())
    }

    /// The setting as trimmed text; `None` when it is absent or blank.
    fn trimmed(&self, name: &str) -> Option<String> {
        Some(self.text(name, "").trim().to_string()).filter(|t| !t.is_empty())
    }

    /// A byte size, [`DEFAULT_SIZE`] when not given.
    fn size(&self, name: &str) -> KvResult<u64> {
        match self.get(name) {
            None => Ok(DEFAULT_SIZE),
            Some((v, from)) => v
                .size()
                .map_err(|e| KvError::new(Code::InvalidParams, format!("{from}: {e}"))),
        }
    }

    /// A count up to `max`; `None` when not given.
    fn count(&self, name: &str, max: u64) -> KvResult<Option<u64>> {
        let Some((v, from)) = self.get(name) else {
            return Ok(None);
        };
        match v {
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
                format!("{from}: invalid count {}", other.text()),
            )),
        }
    }

    /// A positive duration; `None` when not given.
    fn duration(&self, name: &str) -> KvResult<Option<Duration>> {
        let Some((v, from)) = self.get(name) else {
            return Ok(None);
        };
        let t = v
            .duration()
            .map_err(|e| KvError::new(Code::InvalidParams, format!("{from}: {e}")))?;
        if t.is_zero() {
            return Err(KvError::new(
                Code::InvalidParams,
                format!("{name} must be positive"),
            ));
        }
        Ok(Some(t))
    }

    /// A yes/no setting (`None` when not given); anything else is an error.
    fn flag(&self, name: &str) -> KvResult<Option<bool>> {
        let Some(text) = self.trimmed(name) else {
            return Ok(None);
        };
        yes_no(&text).map(Some).ok_or_else(|| {
            KvError::new(
                Code::InvalidParams,
                format!("{name} must be true or false, not {text:?}"),
            )
        })
    }

    /// The transport: tcp when not given or blank (Mooncake's default, and
    /// what the Python binding has always read `protocol=""` as); `rdma`
    /// runs over tcp (noted), as Mooncake does where no RDMA device exists;
    /// `MC_FORCE_TCP` forces tcp.
    fn protocol(&self, notes: &mut Vec<String>) -> KvResult<Protocol> {
        let asked = self.trimmed("protocol").unwrap_or_else(|| "tcp".into());
        let protocol = match asked.to_ascii_lowercase().as_str() {
            "rdma" => {
                notes.push("protocol rdma: kvpool has no RDMA transport; using tcp".into());
                Protocol::Tcp
            }
            _ => asked.parse()?,
        };
        if (self.env)("MC_FORCE_TCP").and_then(|v| yes_no(&v)) == Some(true) {
            if protocol != Protocol::Tcp {
                notes.push("MC_FORCE_TCP is set: using tcp".into());
            }
            return Ok(Protocol::Tcp);
        }
        Ok(protocol)
    }
}

/// The value of `key` in `m` under its name or an alias (`Null` is absent).
fn from_map(key: &Key, m: &BTreeMap<String, Raw>, what: &str) -> Option<(Raw, String)> {
    std::iter::once(key.name)
        .chain(key.aliases.iter().copied())
        .find_map(|n| match m.get(n) {
            Some(Raw::Null) | None => None,
            Some(v) => Some((v.clone(), format!("{what} {n}"))),
        })
}

/// The key a `tenant` setting asks for: the tenant's own key as given, or
/// derived from a store key or the cluster secret given instead.
fn with_tenant(
    credentials: Option<Credentials>,
    tenant: Option<String>,
) -> KvResult<Option<Credentials>> {
    let Some(name) = tenant else {
        return Ok(credentials);
    };
    let bad = |why: String| KvError::new(Code::InvalidParams, format!("tenant {name:?}: {why}"));
    match credentials {
        None => Err(bad(
            "a tenant needs its key: set secret_file (KVPOOL_SECRET_FILE) to the output of \
             `kvpool secret derive --tenant NAME`"
                .into(),
        )),
        Some(c) if c.tenant() == Some(name.as_str()) => Ok(Some(c)),
        Some(c) if c.tenant().is_some() => Err(bad(format!(
            "the key given is tenant {:?}'s",
            c.tenant().unwrap_or_default()
        ))),
        Some(c) => c.for_tenant(&name).map(Some).map_err(|e| bad(e.message)),
    }
}
