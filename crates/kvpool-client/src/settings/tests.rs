//! Resolution rules, one table per rule; the environment and the config
//! file are passed in, so nothing here reads the process's.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kvpool_proto::Code;

use super::raw::{config_path, parse_config_file};
use super::*;

/// An environment as `resolve_with` reads it.
type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

fn no_env(_: &str) -> Option<String> {
    None
}

fn args(pairs: &[(&str, Raw)]) -> BTreeMap<String, Raw> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn resolve(
    explicit: &BTreeMap<String, Raw>,
    env: Env<'_>,
    file: Option<&BTreeMap<String, Raw>>,
) -> KvResult<Settings> {
    Settings::resolve_with(explicit, env, file)
}

#[test]
fn defaults() {
    let s = resolve(&BTreeMap::new(), &no_env, None).unwrap();
    assert_eq!(s.master_server_addr, "127.0.0.1:50051");
    assert_eq!(s.local_hostname, "127.0.0.1");
    assert_eq!(s.global_segment_size, DEFAULT_SIZE);
    assert_eq!(s.local_buffer_size, DEFAULT_SIZE);
    assert_eq!(s.protocol, Protocol::Tcp, "Mooncake's default, not auto");
    assert_eq!((s.timeout, s.retries, s.segment_port), (None, None, 0));
    let c = s.client_config().unwrap();
    let d = ClientConfig::new("x");
    assert_eq!(c.timeout, d.timeout);
    assert_eq!(c.connect_timeout, d.connect_timeout);
    assert_eq!(c.location_cache, d.location_cache);
    assert_eq!(c.protocol, Protocol::Tcp);
    assert_eq!(c.segment_size, DEFAULT_SIZE);
    assert!(!c.hedge_reads, "hedged reads are off unless asked for");
    // The location cache can be sized, or turned off, from the environment.
    let env = |k: &str| (k == "KVPOOL_LOCATION_CACHE").then(|| "0".to_string());
    let s = resolve(&BTreeMap::new(), &env, None).unwrap();
    assert_eq!(s.client_config().unwrap().location_cache, 0);
    let env = |k: &str| (k == "KVPOOL_HEDGE_READS").then(|| "on".to_string());
    let s = resolve(&BTreeMap::new(), &env, None).unwrap();
    assert!(s.client_config().unwrap().hedge_reads);
}

#[test]
fn every_setting_reaches_the_client_config() {
    let s = resolve(
        &args(&[
            ("master", Raw::Str("m:7".into())),
            ("local_hostname", Raw::Str("node:9".into())),
            ("global_segment_size", Raw::Str("1MiB".into())),
            ("protocol", Raw::Str("SHM".into())),
            ("timeout", Raw::Float(2.5)),
            ("connect_timeout", Raw::Str("300ms".into())),
            ("retries", Raw::Int(3)),
            ("fail_fast_after", Raw::Str("3s".into())),
            ("conns_per_store", Raw::Int(0)),
            ("location_cache", Raw::Str("10".into())),
            ("hedge_reads", Raw::Bool(true)),
            ("segment_port", Raw::Int(17777)),
        ]),
        &no_env,
        None,
    )
    .unwrap();
    let c = s.client_config().unwrap();
    assert_eq!((c.master.as_str(), c.hostname.as_str()), ("m:7", "node:9"));
    assert_eq!(c.segment_size, 1 << 20);
    assert_eq!(c.protocol, Protocol::Shm);
    assert_eq!(c.timeout, Duration::from_millis(2500));
    assert_eq!(c.connect_timeout, Duration::from_millis(300));
    assert_eq!(c.retries, 3);
    assert_eq!(c.fail_fast_after, Some(Duration::from_secs(3)));
    assert_eq!(c.conns_per_store, 1, "at least one connection");
    assert_eq!(c.location_cache, 10);
    assert!(c.hedge_reads);
    assert_eq!(
        (c.segment_address.as_str(), c.segment_port),
        ("node", 17777)
    );
}

#[test]
fn precedence_explicit_env_file_default() {
    // Each layer alone wins over everything below it.
    let file = args(&[("retries", Raw::Int(1))]);
    let env = |k: &str| (k == "KVPOOL_RETRIES").then(|| "2".to_string());
    let explicit = args(&[("retries", Raw::Int(3))]);
    let none = BTreeMap::new();
    let cases: [(_, Env, _, _); 4] = [
        (&none, &no_env, None, None),
        (&none, &no_env, Some(&file), Some(1)),
        (&none, &env, Some(&file), Some(2)),
        (&explicit, &env, Some(&file), Some(3)),
    ];
    for (explicit, env, file, want) in cases {
        assert_eq!(resolve(explicit, env, file).unwrap().retries, want);
    }
}

#[test]
fn precedence_explicit_kvpool_mooncake_file() {
    let env = |k: &str| match k {
        "KVPOOL_MASTER" => Some("kv:1".to_string()),
        "MOONCAKE_MASTER" => Some("mc:2".to_string()),
        "MOONCAKE_LOCAL_BUFFER_SIZE" => Some("1MB".to_string()),
        "MOONCAKE_PROTOCOL" => Some("shm".to_string()),
        // Empty is unset, as in a shell: the next source decides.
        "KVPOOL_GLOBAL_SEGMENT_SIZE" => Some(String::new()),
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
fn empty_protocol_is_tcp() {
    // An explicit "" is tcp (what the Python binding always did), even
    // when the environment or the file asks for another transport.
    let env = |k: &str| (k == "KVPOOL_PROTOCOL").then(|| "shm".to_string());
    let explicit = args(&[("protocol", Raw::Str(String::new()))]);
    assert_eq!(
        resolve(&explicit, &env, None).unwrap().protocol,
        Protocol::Tcp
    );
    // An empty env var is unset.
    let empty = |k: &str| (k == "KVPOOL_PROTOCOL").then(String::new);
    let file = args(&[("protocol", Raw::Str("auto".into()))]);
    let s = resolve(&BTreeMap::new(), &empty, Some(&file)).unwrap();
    assert_eq!(s.protocol, Protocol::Auto);
}

#[test]
fn mooncake_env_names() {
    let env = |k: &str| {
        Some(
            match k {
                "MOONCAKE_LOCAL_HOSTNAME" => "10.0.0.7",
                "MOONCAKE_TE_META_DATA_SERVER" => "P2PHANDSHAKE",
                "MOONCAKE_GLOBAL_SEGMENT_SIZE" => "2gb",
                "MOONCAKE_LOCAL_BUFFER_SIZE" => "0",
                "MOONCAKE_PROTOCOL" => "auto",
                "MOONCAKE_DEVICE" => "mlx5_0",
                "MOONCAKE_MASTER" => "10.0.0.1:7000",
                _ => return None,
            }
            .to_string(),
        )
    };
    let s = resolve(&BTreeMap::new(), &env, None).unwrap();
    assert_eq!(s.local_hostname, "10.0.0.7");
    assert_eq!(s.segment_address, "10.0.0.7");
    assert_eq!(s.metadata_server, "P2PHANDSHAKE");
    assert_eq!((s.global_segment_size, s.local_buffer_size), (2 << 30, 0));
    assert_eq!(s.protocol, Protocol::Auto);
    assert_eq!(s.device_name, "mlx5_0");
    assert_eq!(s.ignored, vec!["device_name".to_string()]);
    assert_eq!(s.master_server_addr, "10.0.0.1:7000");
    // The kvpool name wins over Mooncake's.
    let both = |k: &str| match k {
        "KVPOOL_LOCAL_HOSTNAME" => Some("10.0.0.8".to_string()),
        _ => env(k),
    };
    assert_eq!(
        resolve(&BTreeMap::new(), &both, None)
            .unwrap()
            .local_hostname,
        "10.0.0.8"
    );
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
    let s = resolve(&a, &force, None).unwrap();
    assert_eq!(s.protocol, Protocol::Tcp);
    assert_eq!(s.notes, vec!["MC_FORCE_TCP is set: using tcp".to_string()]);
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
    // The files are read when the client config is made: a missing one is
    // an error naming it.
    let e = s.client_config().unwrap_err();
    assert!(e.message.contains("/env/ca.pem"), "{e}");
}

#[test]
fn resolved_settings_resolve_to_themselves() {
    let secret = "a cluster secret of enough bytes";
    let env = |k: &str| {
        Some(
            match k {
                "KVPOOL_SECRET" => secret,
                "MC_RPC_TIMEOUT_MS" => "2500",
                "KVPOOL_CONNECT_TIMEOUT" => "300ms",
                "KVPOOL_PROTOCOL" => "auto",
                "KVPOOL_TLS_CA" => "/ca.pem",
                "KVPOOL_HEDGE_READS" => "1",
                "MOONCAKE_MASTER" => "etcd://10.0.0.1:2379",
                "MC_STORE_CLUSTER_ID" => "c1",
                "KVPOOL_LOCAL_HOSTNAME" => "10.0.0.2:7000",
                _ => return None,
            }
            .to_string(),
        )
    };
    let s = resolve(
        &args(&[
            ("retries", Raw::Int(4)),
            ("tenant_id", Raw::Str("x".into())),
        ]),
        &env,
        None,
    )
    .unwrap();
    assert!(s.credentials.is_some());
    let again = resolve(&s.explicit(), &no_env, None).unwrap();
    assert_eq!(
        again,
        Settings {
            ignored: vec![],
            ..s.clone()
        }
    );
    // With nothing set, too (no secret, no TLS, client defaults).
    let s = resolve(&BTreeMap::new(), &no_env, None).unwrap();
    assert_eq!(resolve(&s.explicit(), &no_env, None).unwrap(), s);
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
fn protocols() {
    assert_eq!("TCP".parse::<Protocol>().unwrap(), Protocol::Tcp);
    assert_eq!("auto".parse::<Protocol>().unwrap(), Protocol::Auto);
    let a = args(&[("protocol", Raw::Str("efa".into()))]);
    let e = resolve(&a, &no_env, None).unwrap_err();
    assert_eq!(e.code, Code::NotSupported);
    let a = args(&[("protocol", Raw::Str("bogus".into()))]);
    let e = resolve(&a, &no_env, None).unwrap_err();
    assert_eq!(e.code, Code::InvalidParams);
    assert_eq!(
        e.message,
        "unknown protocol \"bogus\"; use \"tcp\", \"shm\" or \"auto\""
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
        normalize_master("etcds://10.0.0.1:2379/prod").unwrap(),
        "etcds://10.0.0.1:2379/prod"
    );
    for (bad, code) in [
        ("http://10.0.0.1:2379", Code::NotSupported),
        ("etcd://", Code::NotSupported),
        ("h:0", Code::InvalidParams),
        ("h:x", Code::InvalidParams),
        ("a:1,b:2", Code::InvalidParams),
    ] {
        assert_eq!(normalize_master(bad).unwrap_err().code, code, "{bad}");
    }
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
        ("segment_port", Raw::Int(65536)),
        ("hedge_reads", Raw::Str("sometimes".into())),
        ("insecure", Raw::Str("maybe".into())),
    ] {
        let e = resolve(&args(&[(k, v.clone())]), &no_env, None).unwrap_err();
        assert_eq!(e.code, Code::InvalidParams, "{k}={v:?}");
    }
    // The error names where the bad value came from.
    let env = |k: &str| (k == "MC_RETRY_CNT").then(|| "-1".to_string());
    let e = resolve(&BTreeMap::new(), &env, None).unwrap_err();
    assert_eq!(e.message, "MC_RETRY_CNT: invalid count \"-1\"");
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
    let file = args(&[("ssd_offload_path", Raw::Str("/ssd".into()))]);
    let e = resolve(&BTreeMap::new(), &no_env, Some(&file)).unwrap_err();
    assert_eq!(
        e.message,
        "config file key ssd_offload_path=/ssd is not supported by kvpool"
    );
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
    for bad in ["[1]", "{"] {
        let e = parse_config_file(bad, "f").unwrap_err();
        assert_eq!(e.code, Code::InvalidParams, "{bad}");
    }
}

#[test]
fn config_file_named_by_mooncake_env_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mooncake.json");
    std::fs::write(
        &path,
        r#"{"master_server_address": "m:2", "protocol": "shm"}"#,
    )
    .unwrap();
    let p = path.to_string_lossy().into_owned();
    let env = move |k: &str| (k == "MOONCAKE_CONFIG_PATH").then(|| p.clone());
    let file = load_config_file(&env).unwrap();
    let s = resolve(&BTreeMap::new(), &env, file.as_ref()).unwrap();
    assert_eq!(
        (s.master_server_addr.as_str(), s.protocol),
        ("m:2", Protocol::Shm)
    );
    // A named file that cannot be read is an error, not silently skipped.
    let missing = |k: &str| (k == "KVPOOL_CONFIG_PATH").then(|| "/nonexistent.json".to_string());
    let e = load_config_file(&missing).unwrap_err();
    assert_eq!(e.code, Code::InvalidParams);
    assert!(
        e.message.starts_with("config file /nonexistent.json: "),
        "{e}"
    );
}
