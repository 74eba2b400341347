//! Config files (docs/configuration.md): `kvpool master`, `store` and `up`
//! started from one TOML file, the order flag > env > file > default,
//! `kvpool config check`, Mooncake's key names, and the errors a bad file
//! gives.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};

use common::{
    eventually, http_get, kvpool_command, metric, scratch_dir, spawn_master, wait_for_segments,
    Process, STARTUP,
};

/// Writes `text` to `dir/name` and returns the path.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// Runs `kvpool <args>` to completion with `env` set.
fn kvpool(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = kvpool_command(args);
    cmd.envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.output()
        .unwrap_or_else(|e| panic!("run kvpool {args:?}: {e}"))
}

/// `kvpool config check FILE <args>`'s stdout, asserting it succeeded.
fn check_ok(file: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let file = file.to_string_lossy();
    let out = kvpool(&[&["config", "check", &file], args].concat(), env);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "config check {args:?} failed: {stderr}\n{stdout}"
    );
    stdout
}

/// The stderr of `kvpool <args>`, asserting it failed.
fn fails(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = kvpool(args, env);
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "kvpool {args:?} succeeded:\n{}{stderr}",
        text(&out.stdout)
    );
    stderr
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The line of effective config `out` for `key`, split into `(value, source)`.
fn entry<'a>(out: &'a str, key: &str) -> (&'a str, &'a str) {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no `{key} = ` line in:\n{out}"));
    let (value, source) = line.split_once(" # ").expect("a source comment");
    (value[key.len() + 3..].trim(), source.trim())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_and_store_run_from_one_file() {
    let dir = scratch_dir();
    let data = dir.path().join("store-data");
    let file = dir.path().join("kvpool.toml");
    let mut master = spawn_master("master", dir.path(), |rpc, metrics| {
        write(
            dir.path(),
            "kvpool.toml",
            &format!(
                "[master]\nrpc_port = {rpc}\nmetrics_port = {metrics}\n\n\
                 [store]\nmaster = \"127.0.0.1:{rpc}\"\nsegment_size = \"48MiB\"\n\
                 data_dir = {:?}\nname = \"from-file\"\n",
                data.to_string_lossy()
            ),
        );
        vec![
            "master".into(),
            "--config".into(),
            file.to_string_lossy().into(),
        ]
    })
    .await;
    let mut store = Process::spawn(
        "store",
        ["store", "--config", &file.to_string_lossy()],
        dir.path(),
    );
    wait_for_segments(&master.rpc, 1, &mut [&mut master.process, &mut store]).await;

    let status = kvpool(&["status", "--master", &master.rpc], &[]);
    let status = text(&status.stdout);
    let row = status
        .lines()
        .find(|l| l.starts_with("from-file "))
        .unwrap_or_else(|| panic!("no segment named from-file in:\n{status}"));
    assert!(
        row.contains("48.0 MiB"),
        "segment size from the file: {row}"
    );
    let (code, body) = http_get(&master.metrics, "/metrics").await;
    assert_eq!(code, 200);
    // Capacity is the segment less its superblock: well below the 1 GiB default.
    let capacity = metric(&body, "kvpool_capacity_bytes").unwrap_or(0.0);
    assert!(
        capacity > (32u64 << 20) as f64 && capacity <= (48u64 << 20) as f64,
        "capacity in /metrics: {capacity}"
    );
    assert!(
        std::fs::read_dir(&data).is_ok_and(|mut d| d.next().is_some()),
        "the segment file is in the data_dir of the file"
    );
}

/// A child killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_master_takes_env_and_flags_over_the_file() {
    let dir = scratch_dir();
    let [file_rpc, file_metrics, file_metadata, env_rpc, flag_metrics] =
        [(); 5].map(|_| common::free_port());
    let file = write(
        dir.path(),
        "kvpool.toml",
        &format!(
            "[master]\nrpc_port = {file_rpc}\nmetrics_port = {file_metrics}\n\
             enable_http_metadata_server = true\nhttp_metadata_server_port = {file_metadata}\n"
        ),
    );
    let log = std::fs::File::create(dir.path().join("master.log")).unwrap();
    let child = kvpool_command([
        "master",
        "--config",
        &file.to_string_lossy(),
        "--metrics-port",
        &flag_metrics.to_string(),
    ])
    .env("KVPOOL_RPC_PORT", env_rpc.to_string())
    .stdout(log.try_clone().unwrap())
    .stderr(log)
    .spawn()
    .expect("spawn kvpool master");
    let _master = Running(child);

    // Flag, env and file each set one port; the master listens on all three.
    let rpc = format!("127.0.0.1:{env_rpc}");
    let metrics = format!("127.0.0.1:{flag_metrics}");
    let metadata = format!("127.0.0.1:{file_metadata}");
    eventually(
        "the master on the env, flag and file ports",
        STARTUP,
        async || {
            let mut up = true;
            for addr in [&rpc, &metrics, &metadata] {
                up &= tokio::net::TcpStream::connect(addr).await.is_ok();
            }
            up.then_some(())
        },
    )
    .await;
    assert_eq!(http_get(&metrics, "/health").await.0, 200);
    for port in [file_rpc, file_metrics] {
        assert!(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err(),
            "the file's port {port} is overridden"
        );
    }
}

#[test]
fn mooncakes_cluster_id_variable_names_the_cluster() {
    let dir = scratch_dir();
    let file = write(dir.path(), "kvpool.toml", "");
    let mc = [("MC_STORE_CLUSTER_ID", "from-mooncake")];
    let out = check_ok(&file, &["--for", "master"], &mc);
    assert_eq!(
        entry(&out, "cluster_id"),
        ("\"from-mooncake\"", "env KVPOOL_CLUSTER_ID")
    );
    // kvpool's own variable wins when both are set.
    let both = [mc[0], ("KVPOOL_CLUSTER_ID", "ours")];
    let out = check_ok(&file, &["--for", "master"], &both);
    assert_eq!(entry(&out, "cluster_id").0, "\"ours\"");
}

#[test]
fn check_shows_each_layer_and_its_source() {
    let dir = scratch_dir();
    let file = write(
        dir.path(),
        "kvpool.toml",
        "client_ttl = \"20s\"\nsegment_size = \"2GiB\"\n\n\
         [master]\nrpc_port = 6001\nmetrics_port = 6002\ncluster_id = \"from-file\"\nclient_ttl = \"15s\"\n",
    );
    let env = [("KVPOOL_RPC_PORT", "7001"), ("KVPOOL_METRICS_PORT", "7002")];
    let out = check_ok(
        &file,
        &["--for", "master", "--", "--rpc-port", "8001"],
        &env,
    );
    assert_eq!(entry(&out, "rpc_port"), ("8001", "flag --rpc-port"));
    assert_eq!(
        entry(&out, "metrics_port"),
        ("7002", "env KVPOOL_METRICS_PORT")
    );
    assert_eq!(
        entry(&out, "cluster_id"),
        ("\"from-file\"", "file master.cluster_id")
    );
    assert_eq!(
        entry(&out, "client_ttl"),
        ("\"15s\"", "file master.client_ttl"),
        "a section beats the top level"
    );
    assert_eq!(entry(&out, "eviction_ratio"), ("0.05", "default"));
    assert_eq!(entry(&out, "enable_ha"), ("false", "default"));
    assert!(out.contains("# etcd_endpoints is not set"), "{out}");

    // `up` has no section: the top level applies; store ignores client_ttl.
    let up = check_ok(&file, &["--for", "up"], &[]);
    assert_eq!(entry(&up, "client_ttl"), ("\"20s\"", "file client_ttl"));
    assert_eq!(
        entry(&up, "segment_size"),
        ("\"2GiB\"", "file segment_size")
    );
    let store = check_ok(&file, &["--for", "store"], &[]);
    assert_eq!(
        entry(&store, "segment_size"),
        ("\"2GiB\"", "file segment_size")
    );
    assert!(!store.contains("client_ttl"), "{store}");

    // Without --for: every section the file has.
    let all = check_ok(&file, &[], &[]);
    assert!(
        all.contains("[master]") && !all.contains("[store]"),
        "{all}"
    );
}

#[test]
fn every_flag_is_a_key_and_an_env_var() {
    let dir = scratch_dir();
    let file = write(dir.path(), "empty.toml", "");
    for command in ["master", "store", "up"] {
        let help = text(&kvpool(&[command, "--help"], &[]).stdout);
        let flags: Vec<&str> = help
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .map(|l| l.split([' ', '[', '=']).next().unwrap())
            .filter(|f| !["help", "config"].contains(f))
            .collect();
        assert!(flags.len() > 10, "flags of {command}: {flags:?}\n{help}");
        let envs = help.matches("[env: KVPOOL_").count();
        assert_eq!(
            envs,
            flags.len() + 1,
            "{command}: an env var per flag and --config\n{help}"
        );
        let out = check_ok(&file, &["--for", command], &[]);
        for flag in flags {
            let key = flag.replace('-', "_");
            assert!(
                out.contains(&format!("\n{key} = "))
                    || out.contains(&format!("# {key} is not set")),
                "{command}: no key {key} in:\n{out}"
            );
        }
    }
}

#[test]
fn bad_values_name_the_key_and_the_format() {
    let dir = scratch_dir();
    let file = write(
        dir.path(),
        "bad.toml",
        "[master]\nrpc_port = 70000\ndefault_kv_lease_ttl = \"soon\"\neviction_ratio = \"half\"\n\n\
         [store]\nsegment_size = \"4 gigs\"\n",
    );
    let path = file.to_string_lossy();
    let err = fails(&["config", "check", &path], &[]);
    for want in [
        "4 errors",
        "master.rpc_port: 70000 is not an integer in 0..=65535",
        "master.default_kv_lease_ttl: \"soon\" is not a duration (e.g. 10s, 500ms, 2m)",
        "master.eviction_ratio: \"half\" is not a number",
        "store.segment_size: \"4 gigs\" is not a size (e.g. 4GiB, 512MiB)",
    ] {
        assert!(err.contains(want), "no {want:?} in:\n{err}");
    }
    // The commands themselves refuse the file, whatever section is bad.
    for command in ["master", "store", "up"] {
        let err = fails(&[command, "--config", &path], &[]);
        assert!(err.contains("master.rpc_port: 70000"), "{command}: {err}");
    }
}

#[test]
fn unknown_keys_and_sections_are_errors_with_a_suggestion() {
    let dir = scratch_dir();
    let file = write(
        dir.path(),
        "typo.toml",
        "segment_sise = \"1GiB\"\nconfig = \"other.toml\"\n\n\
         [master]\nrpc_prot = 1\n\n[stroe]\nport = 1\n",
    );
    let err = fails(&["config", "check", &file.to_string_lossy()], &[]);
    for want in [
        "segment_sise: unknown key (did you mean segment_size?)",
        "config: a config file cannot name another",
        "master.rpc_prot: unknown key (did you mean rpc_port?)",
        "[stroe]: unknown section (did you mean store?)",
    ] {
        assert!(err.contains(want), "no {want:?} in:\n{err}");
    }
    // A key of another section is unknown in this one.
    let file = write(
        dir.path(),
        "other.toml",
        "[master]\nsegment_size = \"1GiB\"\n",
    );
    let err = fails(&["config", "check", &file.to_string_lossy()], &[]);
    assert!(err.contains("master.segment_size: unknown key"), "{err}");
}

#[test]
fn wrong_types_are_errors() {
    let dir = scratch_dir();
    let file = write(
        dir.path(),
        "types.toml",
        "[master]\nenable_ha = \"yes\"\nrpc_address = 5\nmetrics_port = [1, 2]\nrpc_port = true\n\n\
         [up]\ndata_dir = { path = \"/x\" }\n",
    );
    let err = fails(&["config", "check", &file.to_string_lossy()], &[]);
    for want in [
        "master.enable_ha: expected true or false, found string \"yes\"",
        "master.rpc_address: expected a string, found integer 5",
        "master.metrics_port: expected one value, found array [1, 2]",
        "master.rpc_port: expected an integer in 0..=65535, found boolean true",
        "up.data_dir: expected a value, found a table",
    ] {
        assert!(err.contains(want), "no {want:?} in:\n{err}");
    }
}

#[test]
fn missing_or_unparsable_files_are_errors() {
    let dir = scratch_dir();
    let missing = dir.path().join("missing.toml");
    let missing = missing.to_string_lossy();
    let err = fails(&["config", "check", &missing], &[]);
    assert!(
        err.contains(&format!("config file {missing}: No such file")),
        "{err}"
    );
    let err = fails(&["store"], &[("KVPOOL_CONFIG", &missing)]);
    assert!(
        err.contains(&format!("config file {missing}")),
        "KVPOOL_CONFIG: {err}"
    );

    let broken = write(dir.path(), "broken.toml", "[master]\nrpc_port = \n");
    let err = fails(&["master", "--config", &broken.to_string_lossy()], &[]);
    assert!(
        err.contains("broken.toml") && err.contains("line 2"),
        "names the file and line: {err}"
    );
    let err = fails(
        &[
            "config",
            "check",
            &broken.to_string_lossy(),
            "--for",
            "bench",
        ],
        &[],
    );
    assert!(err.contains("broken.toml"), "{err}");
    let ok = write(dir.path(), "ok.toml", "");
    let err = fails(
        &["config", "check", &ok.to_string_lossy(), "--for", "bench"],
        &[],
    );
    assert!(
        err.contains("--for bench: not a command that reads a config file"),
        "{err}"
    );
}

#[test]
fn mooncake_names_and_both_spellings_are_keys() {
    let dir = scratch_dir();
    // Mooncake's master flags, as in a mooncake_master launch script.
    let file = write(
        dir.path(),
        "mooncake.toml",
        "rpc_port = 6100\ndefault_kv_lease_ttl = 5000\neviction_high_watermark_ratio = 0.9\n\
         enable_http_metadata_server = true\nhttp-metadata-server-port = 6101\n\n\
         [store]\nsegment_name = \"by-env-name\"\n",
    );
    let master = &check_ok(&file, &["--for", "master"], &[]);
    assert_eq!(entry(master, "rpc_port"), ("6100", "file rpc_port"));
    assert_eq!(
        entry(master, "default_kv_lease_ttl"),
        ("5000", "file default_kv_lease_ttl")
    );
    assert_eq!(
        entry(master, "eviction_high_watermark_ratio"),
        ("0.9", "file eviction_high_watermark_ratio")
    );
    assert_eq!(
        entry(master, "enable_http_metadata_server"),
        ("true", "file enable_http_metadata_server")
    );
    assert_eq!(
        entry(master, "http_metadata_server_port"),
        ("6101", "file http-metadata-server-port")
    );
    let store = &check_ok(&file, &["--for", "store"], &[]);
    assert_eq!(
        entry(store, "name"),
        ("\"by-env-name\"", "file store.segment_name"),
        "the env var's name (KVPOOL_SEGMENT_NAME) is a key too"
    );

    let twice = write(
        dir.path(),
        "twice.toml",
        "client_ttl = \"1s\"\nclient-ttl = \"2s\"\n[master]\nrpc_port = 1\nrpc-port = 2\n",
    );
    let err = fails(&["config", "check", &twice.to_string_lossy()], &[]);
    for want in [
        "2 errors",
        "client-ttl: sets the same flag as client_ttl",
        "master.rpc-port: sets the same flag as master.rpc_port",
    ] {
        assert!(err.contains(want), "no {want:?} in:\n{err}");
    }
}

#[test]
fn secrets_in_values_are_redacted() {
    let dir = scratch_dir();
    let file = write(
        dir.path(),
        "etcd.toml",
        "[master]\netcd_endpoints = \"http://root:hunter2@127.0.0.1:2379;127.0.0.2:2379\"\nrpc_port = \"http://u:hunter3@x\"\n",
    );
    let err = fails(&["config", "check", &file.to_string_lossy()], &[]);
    assert!(
        err.contains("master.rpc_port: \"http://u:<redacted>@x\""),
        "{err}"
    );
    assert!(!err.contains("hunter"), "a password in an error: {err}");

    let file = write(
        dir.path(),
        "etcd.toml",
        "[master]\netcd_endpoints = \"http://root:hunter2@127.0.0.1:2379;127.0.0.2:2379\"\n",
    );
    let out = check_ok(&file, &[], &[]);
    assert!(
        !out.contains("hunter2"),
        "a password in the effective config:\n{out}"
    );
    assert_eq!(
        entry(&out, "etcd_endpoints").0,
        "\"http://root:<redacted>@127.0.0.1:2379;127.0.0.2:2379\""
    );
}
