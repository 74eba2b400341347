//! The `kvpool` command line: `up`, `status`, the HTTP endpoints, `bench`,
//! config errors, and Mooncake's master flag names.

mod common;

use std::time::Duration;

use common::{
    http_get, master_link, metric, run_kvpool, scratch_dir, spawn_master, spawn_store,
    wait_for_segments, Process,
};
use kvpool_client::{Client, ClientConfig, ReplicateConfig};
use kvpool_proto::msg::GetReplicaList;

const SEGMENT_BYTES: u64 = 64 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_serves_status_http_and_bench() {
    let dir = scratch_dir();
    let data = dir.path().join("up-data").to_string_lossy().into_owned();
    let mut up = spawn_master("up", dir.path(), |rpc, metrics| {
        [
            "up",
            "--rpc-port",
            &rpc.to_string(),
            "--metrics-port",
            &metrics.to_string(),
        ]
        .into_iter()
        .chain(["--segment-size", "64MiB", "--data-dir", &data])
        .map(String::from)
        .collect()
    })
    .await;

    let banner = common::eventually("the `up` banner", Duration::from_secs(10), async || {
        up.process
            .stdout()
            .lines()
            .find(|l| l.contains("kvpool is up"))
            .map(String::from)
    })
    .await;
    assert!(
        banner.contains(&format!("master {}", up.rpc)),
        "banner names the master address: {banner:?}"
    );
    // The banner announces a usable pool: a put right after it is placed
    // at the first attempt (no retries to wait for a segment).
    let mut cfg = kvpool_client::ClientConfig::new(&up.rpc);
    cfg.retries = 0;
    let client = kvpool_client::Client::connect(cfg).await.expect("connect");
    client
        .put(
            "after-banner",
            b"v",
            &kvpool_client::ReplicateConfig::default(),
        )
        .await
        .expect("a put right after the banner");
    wait_for_segments(&up.rpc, 1, &mut [&mut up.process]).await;

    let (code, body) = http_get(&up.metrics, "/health").await;
    assert_eq!((code, body.trim()), (200, "OK"), "/health");
    let (code, body) = http_get(&up.metrics, "/metrics").await;
    assert_eq!(code, 200, "/metrics");
    let capacity =
        metric(&body, "kvpool_capacity_bytes").unwrap_or_else(|| panic!("no capacity in:\n{body}"));
    assert!(
        capacity > 0.0 && capacity <= SEGMENT_BYTES as f64,
        "capacity {capacity}"
    );
    assert_eq!(
        metric(&body, "kvpool_segments"),
        Some(1.0),
        "segments gauge in:\n{body}"
    );
    let (code, _) = http_get(&up.metrics, "/no-such-page").await;
    assert_eq!(code, 404);

    let mut bench = Process::spawn(
        "bench",
        [
            "bench",
            "--master",
            &up.rpc,
            "--sizes",
            "4KiB,64KiB",
            "--duration",
            "1s",
            "--ops",
            "put,get",
        ],
        dir.path(),
    );
    let status = bench.wait_exit(Duration::from_secs(60)).await;
    assert!(
        status.success(),
        "bench failed with {status}\n{}",
        bench.logs()
    );
    let out = bench.stdout();
    let mut lines = out.lines().skip_while(|l| !l.contains("items/s"));
    let header = lines
        .next()
        .unwrap_or_else(|| panic!("no table header with items/s in:\n{out}"));
    for col in ["op", "size", "items/s", "GB/s", "errors"] {
        assert!(
            header.split_whitespace().any(|c| c == col),
            "header lacks {col}: {header:?}"
        );
    }
    let rows: Vec<(String, String)> = lines
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>())
        .filter(|c| c.len() == 2)
        .map(|c| (c[0].to_string(), c[1].to_string()))
        .collect();
    for want in [
        ("put", "4KiB"),
        ("get", "4KiB"),
        ("put", "64KiB"),
        ("get", "64KiB"),
    ] {
        assert!(
            rows.iter()
                .any(|(op, size)| (op.as_str(), size.as_str()) == want),
            "no {want:?} row in:\n{out}"
        );
    }
    assert!(
        up.process.try_exit().is_none(),
        "kvpool up died\n{}",
        up.process.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_master_config_is_a_one_line_error() {
    let dir = scratch_dir();
    for (flag, value, mention) in [
        ("--eviction-ratio", "2", "eviction ratio"),
        ("--eviction-ratio", "0", "eviction ratio"),
        ("--eviction-high-watermark-ratio", "1.5", "watermark"),
        ("--client-ttl", "0s", "TTL"),
    ] {
        let (rpc, metrics) = (
            common::free_port().to_string(),
            common::free_port().to_string(),
        );
        let mut p = Process::spawn(
            "master",
            [
                "master",
                "--rpc-port",
                &rpc,
                "--metrics-port",
                &metrics,
                flag,
                value,
            ],
            dir.path(),
        );
        let status = p.wait_exit(Duration::from_secs(20)).await;
        assert!(!status.success(), "{flag} {value} must be refused");
        let err = p.stderr();
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(
            lines.len(),
            1,
            "{flag} {value}: expected one line on stderr, got:\n{err}"
        );
        assert!(
            lines[0].starts_with("kvpool: "),
            "{flag} {value}: {:?}",
            lines[0]
        );
        assert!(
            lines[0].contains(mention),
            "{flag} {value}: error should mention {mention:?}: {:?}",
            lines[0]
        );
        assert!(p.stdout().is_empty(), "{flag} {value}: nothing on stdout");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_master_flag_names_work() {
    let dir = scratch_dir();
    let mut master = spawn_master("mooncake-master", dir.path(), |rpc, metrics| {
        let (rpc, metrics) = (rpc.to_string(), metrics.to_string());
        [
            "master",
            "--rpc_port",
            &rpc,
            "--metrics_port",
            &metrics,
            "--default_kv_lease_ttl",
            "3000",
            "--client_ttl",
            "5",
            "--eviction_high_watermark_ratio",
            "0.9",
        ]
        .map(String::from)
        .to_vec()
    })
    .await;
    let out = run_kvpool(
        &["status", "--master", &master.rpc],
        Duration::from_secs(15),
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kvpool status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines().any(|l| l == "segments: 0"),
        "status output:\n{text}"
    );
    assert_eq!(
        http_get(&master.metrics, "/health").await.0,
        200,
        "--metrics_port serves /health"
    );

    // `--client_ttl 5` is seconds, as in Mooncake.
    let link = master_link(&master.rpc, "alias-check");
    let reply = link.register().await.expect("register");
    assert_eq!(reply.client_ttl_ms, 5000, "--client_ttl 5 means 5 s");

    // `--default_kv_lease_ttl 3000` is milliseconds: the lease a get receives
    // (not the default, 5000).
    let mut store = spawn_store(
        "store-0",
        &master.rpc,
        "64MiB",
        &dir.path().join("store-0"),
        dir.path(),
    );
    wait_for_segments(&master.rpc, 1, &mut [&mut store, &mut master.process]).await;
    let client = Client::connect(ClientConfig::new(&master.rpc))
        .await
        .expect("client");
    client
        .put("alias/key", b"value", &ReplicateConfig::default())
        .await
        .expect("put");
    let loc = link
        .call(&GetReplicaList {
            keys: vec!["alias/key".into()],
        })
        .await
        .expect("GetReplicaList");
    let loc = loc
        .into_iter()
        .next()
        .expect("one result")
        .expect("located");
    assert_eq!(
        loc.lease_ms, 3000,
        "--default_kv_lease_ttl 3000 means 3000 ms"
    );
    assert!(
        master.process.try_exit().is_none(),
        "master died\n{}",
        master.process.logs()
    );
}
