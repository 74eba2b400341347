//! The settings kvpool reads, under which names: canonical keys (Mooncake's
//! `setup` argument names), their aliases in `setup(dict)` and config
//! files, and their kvpool and Mooncake env vars. Kept as one table so a
//! new setting is one row, not a branch in every source.

/// One setting: its canonical name, the aliases accepted in `setup(dict)` and
/// config files, and its env vars.
pub(super) struct Key {
    /// Canonical name (the `setup` argument and the resolved dict key).
    pub name: &'static str,
    /// Other names accepted for it in arguments and config files.
    pub aliases: &'static [&'static str],
    /// kvpool's env var for it.
    pub kvpool_env: &'static str,
    /// Mooncake's env vars for it, in order; a name ending in `_MS` holds
    /// milliseconds.
    pub mooncake_env: &'static [&'static str],
}

/// Shorthand for a row of [`KEYS`].
const fn key(
    name: &'static str,
    aliases: &'static [&'static str],
    kvpool_env: &'static str,
    mooncake_env: &'static [&'static str],
) -> Key {
    Key {
        name,
        aliases,
        kvpool_env,
        mooncake_env,
    }
}

/// Every setting kvpool reads.
pub(super) const KEYS: &[Key] = &[
    key(
        "local_hostname",
        &[],
        "KVPOOL_LOCAL_HOSTNAME",
        &["MOONCAKE_LOCAL_HOSTNAME"],
    ),
    key(
        "metadata_server",
        &[],
        "KVPOOL_METADATA_SERVER",
        &["MOONCAKE_TE_META_DATA_SERVER"],
    ),
    key(
        "global_segment_size",
        &[],
        "KVPOOL_GLOBAL_SEGMENT_SIZE",
        &["MOONCAKE_GLOBAL_SEGMENT_SIZE"],
    ),
    key(
        "local_buffer_size",
        &[],
        "KVPOOL_LOCAL_BUFFER_SIZE",
        &["MOONCAKE_LOCAL_BUFFER_SIZE"],
    ),
    key("protocol", &[], "KVPOOL_PROTOCOL", &["MOONCAKE_PROTOCOL"]),
    key(
        "device_name",
        &["rdma_devices"],
        "KVPOOL_DEVICE",
        &["MOONCAKE_DEVICE"],
    ),
    key(
        "master_server_addr",
        &["master_server_address", "master"],
        "KVPOOL_MASTER",
        &["MOONCAKE_MASTER"],
    ),
    key("timeout", &[], "KVPOOL_TIMEOUT", &["MC_RPC_TIMEOUT_MS"]),
    key("connect_timeout", &[], "KVPOOL_CONNECT_TIMEOUT", &[]),
    key("hedge_reads", &[], "KVPOOL_HEDGE_READS", &[]),
    key("retries", &[], "KVPOOL_RETRIES", &["MC_RETRY_CNT"]),
    key("fail_fast_after", &[], "KVPOOL_FAIL_FAST_AFTER", &[]),
    key("conns_per_store", &[], "KVPOOL_CONNS_PER_STORE", &[]),
    key("location_cache", &[], "KVPOOL_LOCATION_CACHE", &[]),
    key(
        "segment_address",
        &[],
        "KVPOOL_SEGMENT_ADDRESS",
        &["MC_TCP_BIND_ADDRESS"],
    ),
    key("segment_port", &[], "KVPOOL_SEGMENT_PORT", &[]),
    key(
        "cluster_id",
        &[],
        "KVPOOL_CLUSTER_ID",
        &["MC_STORE_CLUSTER_ID"],
    ),
    key("secret_file", &[], "KVPOOL_SECRET_FILE", &[]),
    key("secret", &[], "KVPOOL_SECRET", &[]),
    key("tenant", &[], "KVPOOL_TENANT", &[]),
    key("insecure", &[], "KVPOOL_INSECURE", &[]),
    key("tls_ca", &[], "KVPOOL_TLS_CA", &[]),
    key("tls_cert", &[], "KVPOOL_TLS_CERT", &[]),
    key("tls_key", &[], "KVPOOL_TLS_KEY", &[]),
];

/// Mooncake `setup` inputs kvpool accepts and ignores (with their no-op values).
pub(super) const IGNORED_KEYS: &[&str] = &[
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
pub(super) const DEFAULT_ONLY: &[(&str, &str)] =
    &[("enable_ssd_offload", "false"), ("ssd_offload_path", "")];

/// The setting a key or alias names, if it is one.
pub(super) fn canonical(name: &str) -> Option<&'static Key> {
    KEYS.iter()
        .find(|k| k.name == name || k.aliases.contains(&name))
}
