//! Command-line flags. Master flags accept Mooncake's names as aliases
//! (`--rpc_port`, `--default_kv_lease_ttl`, ...) so existing launch scripts
//! keep working; every flag can also come from a `KVPOOL_*` env var, and
//! those of `master`, `store` and `up` from a config file (`config.rs`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};
use kvpool_master::http::HttpLimits;
use kvpool_master::{ClientLimits, MasterConfig, StateConfig, TenantPolicy};
use kvpool_net::auth::{Credentials, Security};
use kvpool_net::http::HttpConnLimits;
use kvpool_net::tls::TlsFiles;
use kvpool_proto::msg::{ClusterStatus, Tier};
use kvpool_proto::units::{parse_duration, parse_size};

/// kvpool: a distributed KV-cache pool for LLM inference.
#[derive(Parser, Debug)]
#[command(name = "kvpool", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The per-address connection cap of the servers this command runs, if
    /// it runs any.
    pub fn max_connections_per_ip(&self) -> Option<usize> {
        match &self.command {
            Command::Master(m) => Some(m.max_connections_per_ip),
            Command::Up(u) => Some(u.master.max_connections_per_ip),
            Command::Store(s) => Some(s.max_connections_per_ip),
            _ => None,
        }
    }

    /// The invalidations a store of this command remembers, if it sets them.
    pub fn invalidations_kept(&self) -> Option<usize> {
        match &self.command {
            Command::Store(s) => Some(s.invalidations_kept),
            _ => None,
        }
    }

    /// The config file this command reads (`--config`, `KVPOOL_CONFIG`).
    pub fn config_file(&self) -> Option<&Path> {
        match &self.command {
            Command::Master(m) => m.config.file.as_deref(),
            Command::Store(s) => s.config.file.as_deref(),
            Command::Up(u) => u.master.config.file.as_deref(),
            _ => None,
        }
    }

    /// The checks a server command makes of its flags before it starts
    /// (flags that need each other, secret and TLS files readable).
    pub fn check(&self) -> anyhow::Result<()> {
        match &self.command {
            Command::Master(m) => m.to_config().map(drop),
            Command::Store(s) => s.to_config().map(drop),
            Command::Up(u) => u.master.to_config().and(u.disk.disk_dir()).map(drop),
            _ => Ok(()),
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the metadata master.
    Master(MasterArgs),
    /// Run a storage node that lends a segment to the pool.
    Store(StoreArgs),
    /// Run a master and one storage node in one process (first use, one machine).
    Up(UpArgs),
    /// Print the cluster: segments, capacity, used, keys.
    Status(StatusArgs),
    /// Take a segment out of the pool: no new objects now, unmounted after a grace period.
    Drain(DrainArgs),
    /// Generate load and print throughput and latency.
    Bench(crate::bench::BenchArgs),
    /// Fill the master's metadata in this process (no stores, no data) and
    /// print memory per object and latency as the key count grows.
    BenchMeta(crate::bench_meta::BenchMetaArgs),
    /// Fill and check a pool split over several masters by key (the
    /// scaling prototype, docs/scaling.md).
    BenchGroups(crate::bench_groups::BenchGroupsArgs),
    /// Run a KV-cache reuse workload (Zipf or multi-turn) and print the hit
    /// rate and read latency by tier.
    BenchReuse(crate::bench_reuse::BenchReuseArgs),
    /// Make a cluster secret, or derive a role's key from one.
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Make TLS certificates for a pool.
    #[command(subcommand)]
    Tls(TlsCommand),
    /// Check config files (docs/configuration.md).
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Validate a config file and print the effective config of `master`,
    /// `store` or `up`: every key, its value and where it came from (flag,
    /// env, file or default), secrets redacted. Exits non-zero on any bad
    /// key or value.
    Check {
        /// The TOML file.
        file: PathBuf,
        /// The command whose effective config to print (default: each the
        /// file has a section for, or all for a flat file).
        #[arg(long = "for", value_name = "COMMAND")]
        target: Option<String>,
        /// Flags of the `--for` command to apply on top, as it would take
        /// them (`-- --rpc-port 50052`).
        #[arg(last = true, requires = "target")]
        flags: Vec<OsString>,
    },
}

/// `--config`, on the commands that read a config file.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// TOML file with values for any of these flags, by long name
    /// (docs/configuration.md); flags and env vars override it.
    #[arg(
        long = "config",
        id = "config",
        env = "KVPOOL_CONFIG",
        value_name = "FILE"
    )]
    pub file: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum TlsCommand {
    /// Write a new private CA (`ca.pem`, `ca.key`) and a certificate and
    /// key per `--cert` (`NAME.pem`, `NAME.key`) into a directory; keys
    /// are 0600, nothing is overwritten. Each certificate serves and
    /// authenticates as a client. For trying TLS and for tests: production
    /// usually brings its own PKI.
    New {
        /// Directory to write into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// A certificate to issue: `NAME=SAN,SAN,...` (IP addresses or DNS
        /// names its host is reached by), or `NAME` alone for 127.0.0.1,
        /// ::1 and localhost. Repeat for each host.
        #[arg(long = "cert", default_value = "node")]
        certs: Vec<crate::tls_cmd::CertSpec>,
    },
}

#[derive(Subcommand, Debug)]
pub enum SecretCommand {
    /// Print a fresh random cluster secret (the admin key), or write it to
    /// a new file readable by its owner only.
    New {
        /// Write here instead of printing (refuses to overwrite).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print the bearer token of the key given by --secret-file or the
    /// environment, for the master's HTTP ports (`Authorization: Bearer`).
    Token {
        #[command(flatten)]
        security: SecurityArgs,
    },
    /// Print the key of a lower role (store, client), or of a tenant,
    /// derived from the secret given by --secret-file or the environment.
    Derive {
        /// The role: client, store or admin.
        #[arg(long, required_unless_present = "tenant")]
        role: Option<String>,
        /// Print tenant NAME's client key instead: it reaches only that
        /// tenant's keys (docs/security.md, "Tenants").
        #[arg(long, value_name = "NAME", conflicts_with = "role")]
        tenant: Option<String>,
        #[command(flatten)]
        security: SecurityArgs,
    },
}

/// Authentication and TLS flags, shared by every command that serves or
/// connects.
#[derive(Args, Debug, Clone, Default)]
pub struct SecurityArgs {
    /// File holding the cluster secret or a role key (`kvpool secret new`,
    /// `kvpool secret derive`); peers must prove the same cluster secret.
    /// KVPOOL_SECRET may hold the secret itself instead.
    #[arg(long, env = "KVPOOL_SECRET_FILE")]
    pub secret_file: Option<PathBuf>,
    /// Serve on non-loopback addresses without a secret: anyone who can
    /// connect may read, write and delete everything.
    #[arg(long, env = "KVPOOL_INSECURE", num_args = 0..=1, default_missing_value = "true",
          default_value_t = false, action = ArgAction::Set)]
    pub insecure: bool,
    /// CA bundle (PEM) that peers' certificates must chain to; turns TLS
    /// on for every connection this process makes and serves.
    #[arg(long, env = "KVPOOL_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// This process's certificate chain (PEM): served to peers, and shown
    /// as a client certificate (stores and admins need one over TLS).
    #[arg(long, env = "KVPOOL_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "KVPOOL_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Serving: turn away every peer without a client certificate.
    #[arg(long, env = "KVPOOL_TLS_REQUIRE_CLIENT_CERT", num_args = 0..=1,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub tls_require_client_cert: bool,
}

impl SecurityArgs {
    /// The security these flags (or KVPOOL_SECRET) describe, with TLS
    /// files read and checked.
    pub fn to_security(&self) -> anyhow::Result<Security> {
        let credentials = match &self.secret_file {
            Some(path) => Some(Credentials::load(path)?),
            None => Credentials::from_env()?,
        };
        let tls = TlsFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            require_client_cert: self.tls_require_client_cert,
        };
        Ok(Security::new(credentials, self.insecure, &tls)?)
    }
}

/// Durations where a bare number means milliseconds (Mooncake's lease flags).
fn millis(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<u64>() {
        Ok(ms) => Ok(Duration::from_millis(ms)),
        Err(_) => parse_duration(s),
    }
}

#[derive(Args, Debug, Clone)]
pub struct MasterArgs {
    /// IP to listen on for RPC.
    #[arg(
        long,
        alias = "rpc_address",
        env = "KVPOOL_RPC_ADDRESS",
        default_value = "127.0.0.1"
    )]
    pub rpc_address: String,
    /// RPC port.
    #[arg(
        long,
        alias = "rpc_port",
        env = "KVPOOL_RPC_PORT",
        default_value_t = 50051
    )]
    pub rpc_port: u16,
    /// IP for /metrics, /health and the admin API.
    #[arg(long, env = "KVPOOL_METRICS_ADDRESS", default_value = "127.0.0.1")]
    pub metrics_address: String,
    /// Port for /metrics, /health and the admin API.
    #[arg(
        long,
        alias = "metrics_port",
        env = "KVPOOL_METRICS_PORT",
        default_value_t = 9003
    )]
    pub metrics_port: u16,
    /// Also serve Mooncake's transfer-metadata HTTP service.
    #[arg(long, alias = "enable_http_metadata_server", env = "KVPOOL_ENABLE_HTTP_METADATA_SERVER",
          num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub enable_http_metadata_server: bool,
    /// Port of the transfer-metadata HTTP service.
    #[arg(
        long,
        alias = "http_metadata_server_port",
        env = "KVPOOL_HTTP_METADATA_SERVER_PORT",
        default_value_t = 8080
    )]
    pub http_metadata_server_port: u16,
    /// Publish every commit and removal as KV events on this ZMQ PUB
    /// endpoint (`tcp://IP:PORT`, Mooncake's master publisher's format);
    /// off when unset.
    #[arg(
        long,
        alias = "kv_events_bind_endpoint",
        env = "KVPOOL_KV_EVENTS_ENDPOINT"
    )]
    pub kv_events_endpoint: Option<String>,
    /// `backend_id` of every KV event: which pool published it.
    #[arg(
        long,
        alias = "kv_events_backend_id",
        env = "KVPOOL_KV_EVENTS_BACKEND_ID",
        default_value = "kvpool"
    )]
    pub kv_events_backend_id: String,
    /// Serve replays of the last 10,000 KV event batches on this ZMQ ROUTER
    /// endpoint (`tcp://IP:PORT`, vLLM's replay protocol), so a subscriber
    /// that missed batches asks for them instead of resyncing; off when
    /// unset. Needs `--kv-events-endpoint`.
    #[arg(
        long,
        alias = "kv_events_replay_endpoint",
        env = "KVPOOL_KV_EVENTS_REPLAY_ENDPOINT",
        requires = "kv_events_endpoint"
    )]
    pub kv_events_replay_endpoint: Option<String>,
    /// Read lease per get (a bare number is milliseconds, as in Mooncake).
    #[arg(long, alias = "default_kv_lease_ttl", env = "KVPOOL_DEFAULT_KV_LEASE_TTL", default_value = "5s", value_parser = millis)]
    pub default_kv_lease_ttl: Duration,
    /// Soft pin duration when a put asks for one without a TTL (bare number: ms).
    #[arg(long, alias = "default_kv_soft_pin_ttl", env = "KVPOOL_DEFAULT_KV_SOFT_PIN_TTL", default_value = "30m", value_parser = millis)]
    pub default_kv_soft_pin_ttl: Duration,
    /// Start evicting when this fraction of capacity is used.
    #[arg(
        long,
        alias = "eviction_high_watermark_ratio",
        env = "KVPOOL_EVICTION_HIGH_WATERMARK_RATIO",
        default_value_t = 0.95
    )]
    pub eviction_high_watermark_ratio: f64,
    /// Fraction of capacity freed per eviction pass.
    #[arg(
        long,
        alias = "eviction_ratio",
        env = "KVPOOL_EVICTION_RATIO",
        default_value_t = 0.05
    )]
    pub eviction_ratio: f64,
    /// Memory of stores with a disk tier is kept below this fraction of
    /// capacity by moving least recently used objects to disk.
    #[arg(long, env = "KVPOOL_DEMOTE_WATERMARK", default_value_t = 0.9)]
    pub demote_watermark: f64,
    /// Move an object read twice while on a disk tier back to memory.
    #[arg(long, env = "KVPOOL_PROMOTE_ON_READ", num_args = 0..=1, default_missing_value = "true",
          default_value_t = true, action = ArgAction::Set)]
    pub promote_on_read: bool,
    /// How long to wait for a store to carry out a batch of tier moves
    /// before giving it up (a disk stuck that long); the store is told, and
    /// the regions reserved for the copies are reused only once it knows.
    #[arg(long, env = "KVPOOL_TIER_MOVE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub tier_move_timeout: Duration,
    /// Silence after which a client is dropped and a store becomes suspect
    /// (bare number: seconds).
    #[arg(long, alias = "client_ttl", env = "KVPOOL_CLIENT_TTL", default_value = "10s", value_parser = parse_duration)]
    pub client_ttl: Duration,
    /// How long a suspect store's objects stay indexed and readable before
    /// its segments are dropped (0 = drop at the client TTL).
    #[arg(long, env = "KVPOOL_STORE_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub store_grace: Duration,
    /// A put not committed within this long is revoked.
    #[arg(long, env = "KVPOOL_PUT_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub put_timeout: Duration,
    /// Most registered clients (stores included); new ones beyond are
    /// refused, registered ones keep working.
    #[arg(long, env = "KVPOOL_MAX_CLIENTS", default_value_t = 10_000)]
    pub max_clients: usize,
    /// Most segments one client or store may lend.
    #[arg(long, env = "KVPOOL_MAX_SEGMENTS_PER_CLIENT", default_value_t = 64)]
    pub max_segments_per_client: usize,
    /// Most puts one client may have started and not yet committed.
    #[arg(
        long,
        env = "KVPOOL_MAX_PENDING_PUTS_PER_CLIENT",
        default_value_t = 1_000_000
    )]
    pub max_pending_puts_per_client: u64,
    /// Most bytes of hard-pinned objects (all replicas) one client may hold.
    #[arg(long, env = "KVPOOL_MAX_HARD_PINNED_PER_CLIENT", default_value = "64GiB", value_parser = parse_size)]
    pub max_hard_pinned_per_client: u64,
    /// Most of the pool's memory that hard-pinned objects of all clients
    /// together may take; the rest stays evictable for everyone's puts.
    #[arg(long, env = "KVPOOL_MAX_HARD_PINNED_RATIO", default_value_t = 0.5)]
    pub max_hard_pinned_ratio: f64,
    /// A tenant's quota, `NAME:objects=N,bytes=SIZE,clients=N,pinned=SIZE,puts=N,connections=N`
    /// (any of them; `none` lifts one); NAME `*` sets every other tenant's.
    /// `puts`: puts in flight over all its clients; `connections`: to the
    /// master (default: as many as one address).
    /// Repeat for more tenants, or separate with `;` in the environment.
    #[arg(long, env = "KVPOOL_TENANT_QUOTA", value_delimiter = ';')]
    pub tenant_quota: Vec<String>,
    /// A tenant whose namespace every client may read (never write).
    /// Repeat for more, or separate with `,` in the environment.
    #[arg(long, env = "KVPOOL_SHARED_TENANT", value_delimiter = ',')]
    pub shared_tenant: Vec<String>,
    /// Connections one peer IP address may hold on the RPC port (0: no
    /// per-address cap; the port takes 8192 in all).
    #[arg(long, env = "KVPOOL_MAX_CONNECTIONS_PER_IP", default_value_t = kvpool_net::server::MAX_CONNECTIONS_PER_IP)]
    pub max_connections_per_ip: usize,
    #[command(flatten)]
    pub http: HttpArgs,
    /// Largest value the transfer-metadata service stores (413 beyond).
    #[arg(long, env = "KVPOOL_METADATA_MAX_VALUE_SIZE", default_value = "1MiB", value_parser = parse_size)]
    pub metadata_max_value_size: u64,
    /// Most keys the transfer-metadata service holds (507 beyond).
    #[arg(long, env = "KVPOOL_METADATA_MAX_KEYS", default_value_t = 100_000)]
    pub metadata_max_keys: usize,
    /// Most bytes of keys and values the transfer-metadata service holds (507 beyond).
    #[arg(long, env = "KVPOOL_METADATA_MAX_BYTES", default_value = "256MiB", value_parser = parse_size)]
    pub metadata_max_bytes: u64,
    /// Elect a leader among masters through etcd; standbys take over when it dies.
    #[arg(long, alias = "enable_ha", env = "KVPOOL_ENABLE_HA", num_args = 0..=1,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub enable_ha: bool,
    /// etcd endpoints for HA, host:port separated by ';' or ','.
    #[arg(long, alias = "etcd_endpoints", env = "KVPOOL_ETCD_ENDPOINTS")]
    pub etcd_endpoints: Option<String>,
    /// Masters with the same cluster id compete to lead one pool.
    #[arg(
        long,
        alias = "cluster_id",
        env = "KVPOOL_CLUSTER_ID",
        default_value = "kvpool"
    )]
    pub cluster_id: String,
    /// Leadership lease: a dead leader is replaced within about this long.
    #[arg(long, env = "KVPOOL_HA_LEASE_TTL", default_value = "5s", value_parser = parse_duration)]
    pub ha_lease_ttl: Duration,
    /// After taking over, object calls wait this long for stores to re-mount
    /// (0 = half the client TTL with HA, none without).
    #[arg(long, env = "KVPOOL_RECOVERY_GRACE", default_value = "0s", value_parser = parse_duration)]
    pub recovery_grace: Duration,
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
}

impl MasterArgs {
    /// The tenants' quotas and shared namespaces these flags describe.
    fn tenant_policy(&self) -> anyhow::Result<TenantPolicy> {
        let mut p = TenantPolicy::default();
        for spec in &self.tenant_quota {
            p.add_quota(spec)?;
        }
        for name in &self.shared_tenant {
            kvpool_proto::tenant::validate_tenant(name)?;
            p.shared.insert(name.clone());
        }
        Ok(p)
    }

    /// The library config these flags describe.
    pub fn to_config(&self) -> anyhow::Result<MasterConfig> {
        let ha = match (self.enable_ha, &self.etcd_endpoints) {
            (false, _) => None,
            (true, None) => anyhow::bail!("--enable-ha needs --etcd-endpoints"),
            (true, Some(e)) => Some(kvpool_master::ha::HaConfig {
                etcd_endpoints: e.clone(),
                cluster_id: self.cluster_id.clone(),
                lease_ttl: self.ha_lease_ttl,
            }),
        };
        Ok(MasterConfig {
            ha,
            security: self.security.to_security()?,
            kv_events: self.kv_events_endpoint.as_ref().map(|endpoint| {
                kvpool_master::kv_events::KvEventsConfig {
                    endpoint: endpoint.clone(),
                    backend_id: self.kv_events_backend_id.clone(),
                    replay_endpoint: self.kv_events_replay_endpoint.clone(),
                }
            }),
            recovery_grace: self.recovery_grace,
            rpc_address: self.rpc_address.clone(),
            rpc_port: self.rpc_port,
            metrics_address: self.metrics_address.clone(),
            metrics_port: self.metrics_port,
            enable_http_metadata_server: self.enable_http_metadata_server,
            http_metadata_server_port: self.http_metadata_server_port,
            http: HttpLimits {
                conn: self.http.limits(),
                metadata_max_value: usize::try_from(self.metadata_max_value_size)?,
                metadata_max_keys: self.metadata_max_keys,
                metadata_max_bytes: self.metadata_max_bytes,
            },
            state: StateConfig {
                lease_ttl: self.default_kv_lease_ttl,
                soft_pin_ttl: self.default_kv_soft_pin_ttl,
                high_watermark: self.eviction_high_watermark_ratio,
                eviction_ratio: self.eviction_ratio,
                demote_watermark: self.demote_watermark,
                promote: self.promote_on_read,
                tier_move_timeout: self.tier_move_timeout,
                client_ttl: self.client_ttl,
                store_grace: self.store_grace,
                pending_ttl: self.put_timeout,
                limits: ClientLimits {
                    max_clients: self.max_clients,
                    max_segments_per_client: self.max_segments_per_client,
                    max_pending_per_client: self.max_pending_puts_per_client,
                    max_hard_pinned_per_client: self.max_hard_pinned_per_client,
                    max_hard_pinned_ratio: self.max_hard_pinned_ratio,
                },
                tenants: self.tenant_policy()?,
            },
        })
    }
}

#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Master RPC address host:port.
    #[arg(long, env = "KVPOOL_MASTER", default_value = "127.0.0.1:50051")]
    pub master: String,
    /// Bytes to lend, e.g. 4GiB.
    #[arg(long, env = "KVPOOL_SEGMENT_SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub segment_size: u64,
    /// Directory of the segment file (tmpfs for RAM, a disk path for NVMe).
    #[arg(long, env = "KVPOOL_DATA_DIR", default_value = "/dev/shm/kvpool-store")]
    pub data_dir: PathBuf,
    /// IP to serve data on and advertise to clients.
    #[arg(long, env = "KVPOOL_ADDRESS", default_value = "127.0.0.1")]
    pub address: String,
    /// Data port (0 picks a free one).
    #[arg(long, env = "KVPOOL_PORT", default_value_t = 0)]
    pub port: u16,
    /// Segment name for preferred_segments (default: the data address).
    #[arg(long, env = "KVPOOL_SEGMENT_NAME")]
    pub name: Option<String>,
    /// On SIGTERM, keep serving this long after new placements stop.
    #[arg(long, env = "KVPOOL_SHUTDOWN_GRACE", default_value = "1s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    #[command(flatten)]
    pub disk: DiskArgs,
    #[command(flatten)]
    pub security: SecurityArgs,
    /// Connections one peer IP address may hold on the data port (0: no
    /// per-address cap; the port takes 8192 in all).
    #[arg(long, env = "KVPOOL_MAX_CONNECTIONS_PER_IP", default_value_t = kvpool_net::server::MAX_CONNECTIONS_PER_IP)]
    pub max_connections_per_ip: usize,
    /// Invalidations the store remembers to refuse late writes of removed
    /// versions (about 130 bytes each; past them a stale grant is still
    /// refused wherever a newer object starts in its range).
    #[arg(long, env = "KVPOOL_INVALIDATIONS_KEPT", default_value_t = kvpool_transfer::data::INVALIDATIONS_KEPT)]
    pub invalidations_kept: usize,
    /// IP for the store's /metrics and /health.
    #[arg(long, env = "KVPOOL_METRICS_ADDRESS", default_value = "127.0.0.1")]
    pub metrics_address: String,
    /// Port for the store's /metrics and /health (0 picks one; unset: none).
    #[arg(long, env = "KVPOOL_METRICS_PORT")]
    pub metrics_port: Option<u16>,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
}

impl StoreArgs {
    /// The library config these flags describe.
    pub fn to_config(&self) -> anyhow::Result<kvpool_store::StoreConfig> {
        Ok(kvpool_store::StoreConfig {
            security: self.security.to_security()?,
            master: self.master.clone(),
            segment_size: self.segment_size,
            data_dir: self.data_dir.clone(),
            address: self.address.clone(),
            port: self.port,
            name: self.name.clone(),
            shutdown_grace: self.shutdown_grace,
            disk_dir: self.disk.disk_dir()?,
            disk_size: self.disk.disk_size,
            disk_queue_depth: self.disk.disk_queue_depth,
            metrics_address: self.metrics_address.clone(),
            metrics_port: self.metrics_port,
            http: self.http.limits(),
        })
    }
}

/// Limits of every HTTP listener of a process (the master's admin and
/// metadata ports, a store's metrics port).
#[derive(Args, Debug, Clone)]
pub struct HttpArgs {
    /// Connections each HTTP listener serves at once.
    #[arg(long, env = "KVPOOL_HTTP_MAX_CONNECTIONS", default_value_t = 1024)]
    pub http_max_connections: usize,
    /// Connections each HTTP listener serves at once from one peer address
    /// (0: no per-address cap).
    #[arg(long, env = "KVPOOL_HTTP_MAX_CONNECTIONS_PER_IP", default_value_t = 64)]
    pub http_max_connections_per_ip: usize,
    /// An HTTP request header must arrive within this long, else the
    /// connection is closed (idle keep-alive connections too).
    #[arg(long, env = "KVPOOL_HTTP_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub http_header_read_timeout: Duration,
    /// An HTTP request, body included, must be handled within this long (408 after).
    #[arg(long, env = "KVPOOL_HTTP_REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub http_request_timeout: Duration,
}

impl HttpArgs {
    /// The limits these flags describe.
    pub fn limits(&self) -> HttpConnLimits {
        HttpConnLimits {
            max_connections: self.http_max_connections,
            max_connections_per_ip: self.http_max_connections_per_ip,
            header_read_timeout: self.http_header_read_timeout,
            request_timeout: self.http_request_timeout,
        }
    }
}

/// The disk tier of a storage node.
#[derive(Args, Debug, Clone)]
pub struct DiskArgs {
    /// Directory on a local SSD for the disk tier: objects memory must make
    /// room for move there instead of being dropped (needs --disk-size).
    #[arg(long, env = "KVPOOL_DISK_DIR")]
    pub disk_dir: Option<PathBuf>,
    /// Bytes of disk tier, e.g. 100GiB.
    #[arg(long, env = "KVPOOL_DISK_SIZE", default_value = "0", value_parser = parse_size)]
    pub disk_size: u64,
    /// I/O requests kept in flight to the disk tier at most (reads, copies).
    #[arg(long, env = "KVPOOL_DISK_QUEUE_DEPTH", default_value_t = kvpool_transfer::disk::QUEUE_DEPTH)]
    pub disk_queue_depth: usize,
}

impl DiskArgs {
    /// The disk directory, checked against the size.
    pub fn disk_dir(&self) -> anyhow::Result<Option<PathBuf>> {
        match (&self.disk_dir, self.disk_size) {
            (None, 0) => Ok(None),
            (None, _) => anyhow::bail!("--disk-size needs --disk-dir"),
            (Some(_), 0) => anyhow::bail!("--disk-dir needs --disk-size (e.g. 100GiB)"),
            (Some(_), _) if self.disk_queue_depth == 0 => {
                anyhow::bail!("--disk-queue-depth must be at least 1")
            }
            (Some(d), _) => Ok(Some(d.clone())),
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub master: MasterArgs,
    /// Bytes the built-in storage node lends.
    #[arg(long, env = "KVPOOL_SEGMENT_SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub segment_size: u64,
    /// Directory of the built-in storage node's segment file.
    #[arg(long, env = "KVPOOL_DATA_DIR", default_value = "/dev/shm/kvpool-up")]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub disk: DiskArgs,
    /// Port for the built-in store's /metrics (0 picks one; unset: none;
    /// the master's are on --metrics-port).
    #[arg(long, env = "KVPOOL_STORE_METRICS_PORT")]
    pub store_metrics_port: Option<u16>,
}

#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// Master RPC address host:port.
    #[arg(long, env = "KVPOOL_MASTER", default_value = "127.0.0.1:50051")]
    pub master: String,
    #[command(flatten)]
    pub security: SecurityArgs,
}

#[derive(Args, Debug, Clone)]
pub struct DrainArgs {
    /// Master RPC address host:port.
    #[arg(long, env = "KVPOOL_MASTER", default_value = "127.0.0.1:50051")]
    pub master: String,
    /// Segment name (as in `kvpool status`) or id.
    #[arg(long)]
    pub segment: String,
    /// Time readers and writers in flight get before the segment is unmounted
    /// (its objects with no other replica are then gone).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub grace: Duration,
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// One control call to the master outside any client session (5 s limit),
/// proving the key `security` holds.
pub async fn call_master<R: kvpool_proto::Rpc>(
    master: &str,
    security: &SecurityArgs,
    req: &R,
) -> anyhow::Result<R::Response> {
    let security = security.to_security()?;
    let addr = kvpool_net::etcd::MasterAddr::parse(master, &security)?
        .resolve()
        .await?;
    let pool = kvpool_net::ConnPool::new(
        &addr,
        "cli",
        kvpool_proto::frame::Limits::default(),
        Duration::from_secs(5),
        1,
    )
    .with_security(security);
    Ok(tokio::time::timeout(Duration::from_secs(5), pool.call(req))
        .await
        .map_err(|_| anyhow::anyhow!("master {master} did not answer within 5s"))??)
}

/// Creates `path` readable and writable by its owner only and writes
/// `text`; refuses to replace an existing file.
pub fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// Bytes with a binary unit, for people.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The text `kvpool status` prints; scripts grep the `segments: N` line.
pub fn format_status(master: &str, s: &ClusterStatus) -> String {
    let pct = if s.capacity > 0 {
        100.0 * s.used as f64 / s.capacity as f64
    } else {
        0.0
    };
    let mut out = format!(
        "master: {master}\nrole: {}\nsegments: {}\ncapacity: {}\nused: {} ({pct:.1}%)\nkeys: {}\nputs in flight: {}\nclients: {}\nevictions: {}\n",
        s.role,
        s.segments.len(),
        human(s.capacity),
        human(s.used),
        s.keys,
        s.pending,
        s.clients,
        s.evictions
    );
    let disks: Vec<_> = s
        .segments
        .iter()
        .filter(|x| x.info.tier == Tier::Disk)
        .collect();
    if !disks.is_empty() {
        for tier in [Tier::Memory, Tier::Disk] {
            let of = || s.segments.iter().filter(|x| x.info.tier == tier);
            let (cap, used): (u64, u64) =
                (of().map(|x| x.info.size).sum(), of().map(|x| x.used).sum());
            let objects: u64 = of().map(|x| x.regions).sum();
            let pct = if cap > 0 {
                100.0 * used as f64 / cap as f64
            } else {
                0.0
            };
            out.push_str(&format!(
                "{} tier: {} of {} ({pct:.1}%), {objects} objects\n",
                tier.name(),
                human(used),
                human(cap)
            ));
        }
        out.push_str(&format!(
            "demotions: {}\npromotions: {}\n",
            s.demotions, s.promotions
        ));
    }
    if !s.segments.is_empty() {
        out.push_str(&format!(
            "\n{:<24} {:<6} {:<22} {:>10} {:>10} {:>8} {:<10}\n",
            "SEGMENT", "TIER", "ENDPOINT", "SIZE", "USED", "REGIONS", "STATE"
        ));
        for seg in &s.segments {
            out.push_str(&format!(
                "{:<24} {:<6} {:<22} {:>10} {:>10} {:>8} {:<10}\n",
                seg.info.name,
                seg.info.tier.name(),
                seg.info.endpoint,
                human(seg.info.size),
                human(seg.used),
                seg.regions,
                seg.state
            ));
        }
    }
    let io: Vec<_> = disks
        .iter()
        .filter_map(|d| d.io.map(|io| (d, io)))
        .collect();
    if !io.is_empty() {
        out.push_str(&format!(
            "\n{:<24} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9} {:>6}\n",
            "DISK I/O", "READS", "READ", "AVG READ", "WRITES", "WRITTEN", "AVG WRITE", "ERRORS"
        ));
        let avg = |us: u64, ops: u64| match ops {
            0 => "-".to_string(),
            n => format!("{} us", us / n),
        };
        for (d, io) in io {
            out.push_str(&format!(
                "{:<24} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9} {:>6}\n",
                d.info.name,
                io.read_ops,
                human(io.read_bytes),
                avg(io.read_us, io.read_ops),
                io.write_ops,
                human(io.write_bytes),
                avg(io.write_us, io.write_ops),
                io.errors
            ));
        }
    }
    out
}
