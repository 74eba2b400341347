//! Liveness with real processes: a store that stops answering for a while
//! (paused with SIGSTOP, as a starved or swapped process is) keeps its cache
//! through the grace period with no moment in which the pool reports its
//! objects missing; one that comes back after the grace reports its full
//! inventory; a paused master does not count its own pause against the
//! stores; and saturating batched puts never cost a store its segment.

mod common;

use std::time::Duration;

use common::*;
use kvpool_client::{Client, Protocol, ReplicateConfig};
use kvpool_proto::msg::ClusterStatus;
use tokio::time::Instant;

const VALUE_MAX: usize = 4 << 10;

/// Puts `n` deterministic objects `{prefix}-{i}` in batches of 100.
async fn put_objects(client: &Client, prefix: &str, n: usize, rc: &ReplicateConfig) -> Vec<String> {
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for chunk in keys.chunks(100) {
        let values: Vec<Vec<u8>> = chunk.iter().map(|k| value_for(k, VALUE_MAX)).collect();
        let items: Vec<(&str, &[u8])> = chunk
            .iter()
            .map(String::as_str)
            .zip(values.iter().map(Vec::as_slice))
            .collect();
        for (k, r) in chunk
            .iter()
            .zip(client.batch_put_values(&items, rc, false).await)
        {
            r.unwrap_or_else(|e| panic!("put {k}: {e}"));
        }
    }
    keys
}

/// Reads every key and checks its bytes; panics on any miss or wrong byte.
async fn assert_all_exact(client: &Client, keys: &[String]) {
    for chunk in keys.chunks(200) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for (k, r) in chunk.iter().zip(client.batch_get(&refs).await) {
            let v = r.unwrap_or_else(|e| panic!("get {k}: {e}"));
            assert!(v == value_for(k, VALUE_MAX), "wrong bytes for {k}");
        }
    }
}

/// The master's status, from a client.
async fn status(client: &Client) -> ClusterStatus {
    client.status().await.expect("status")
}

/// Watches the master's status every 100 ms for `d`: panics the moment it
/// shows fewer than `segments` segments or `keys` keys; returns the segment
/// states seen.
async fn watch_for(client: &Client, d: Duration, segments: usize, keys: u64) -> Vec<String> {
    let until = Instant::now() + d;
    let mut seen = Vec::new();
    while Instant::now() < until {
        let s = status(client).await;
        assert!(
            s.segments.len() >= segments && s.keys >= keys,
            "the pool dropped objects: {} segments, {} keys (want {segments}, {keys})",
            s.segments.len(),
            s.keys
        );
        for seg in s.segments {
            if !seen.contains(&seg.state) {
                seen.push(seg.state);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

/// A store paused past the client TTL but within the grace period: the
/// master marks it suspect, never reports its objects missing, reads of
/// replicated objects go to the live store, and when it runs again it is
/// live with nothing re-mounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_store_keeps_its_cache_through_the_grace_period() {
    let mut cluster = Cluster::builder()
        .stores(2)
        .master_flag("--store-grace", "60s")
        .start()
        .await;
    let client = cluster.client_with(|c| c.protocol = Protocol::Tcp).await;
    let both = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let solo = ReplicateConfig {
        preferred_segments: vec![Cluster::store_name(0)],
        ..Default::default()
    };
    let replicated = put_objects(&client, "both", 300, &both).await;
    let only_on_0 = put_objects(&client, "solo", 300, &solo).await;
    let total = 600;

    cluster.store(0).freeze(true);
    // Three TTLs: far past the point where the store used to be dropped.
    let seen = watch_for(&client, 3 * CLIENT_TTL, 2, total).await;
    assert!(seen.iter().any(|s| s == "suspect"), "states seen: {seen:?}");
    // A client that never saw a location: the master offers the live replica first.
    let fresh = cluster
        .client_with(|c| {
            c.protocol = Protocol::Tcp;
            c.location_cache = 0;
        })
        .await;
    let started = Instant::now();
    assert_all_exact(&fresh, &replicated).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "reads waited for the paused store: {:?}",
        started.elapsed()
    );

    cluster.store(0).freeze(false);
    eventually("the store to be live again", STARTUP, async || {
        let s = status(&client).await;
        s.segments.iter().all(|s| s.state == "live").then_some(())
    })
    .await;
    assert_eq!(status(&client).await.keys, total);
    assert_all_exact(&client, &replicated).await;
    assert_all_exact(&client, &only_on_0).await;
    let log = cluster.store(0).logs();
    assert!(
        !log.contains("registering again"),
        "the store had to register and re-mount:\n{log}"
    );
    cluster.assert_alive();
}

/// A store paused past TTL + grace is dropped; when it runs again it
/// registers, reports its whole inventory, and every object is readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_back_after_the_grace_reports_its_whole_inventory() {
    let grace = Duration::from_secs(2);
    let mut cluster = Cluster::builder()
        .master_flag("--store-grace", "2s")
        .start()
        .await;
    let client = cluster.client_with(|c| c.protocol = Protocol::Tcp).await;
    let keys = put_objects(&client, "k", 1000, &ReplicateConfig::default()).await;

    cluster.store(0).freeze(true);
    eventually(
        "the store's segment to be dropped",
        CLIENT_TTL + grace + TTL_MARGIN,
        async || status(&client).await.segments.is_empty().then_some(()),
    )
    .await;
    cluster.store(0).freeze(false);
    eventually(
        "the store to mount again with its objects",
        STARTUP,
        async || {
            let s = status(&client).await;
            (s.keys == 1000 && s.segments.first().is_some_and(|s| s.state == "live")).then_some(())
        },
    )
    .await;
    assert_all_exact(&client, &keys).await;
    let log = cluster.store(0).logs();
    assert!(
        log.contains("found=1000"),
        "the store did not report its inventory:\n{log}"
    );
    cluster.assert_alive();
}

/// A master paused for several TTLs does not count the pause as its stores'
/// silence: no store becomes suspect, no segment is unmounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_master_does_not_expire_its_stores() {
    let mut cluster = Cluster::builder().start().await;
    let client = cluster.client_with(|c| c.protocol = Protocol::Tcp).await;
    let keys = put_objects(&client, "k", 500, &ReplicateConfig::default()).await;

    cluster.master_process().freeze(true);
    tokio::time::sleep(3 * CLIENT_TTL).await;
    cluster.master_process().freeze(false);
    watch_for(&client, 2 * CLIENT_TTL, 1, 500).await;
    assert_all_exact(&client, &keys).await;
    let log = cluster.master_process().logs();
    for bad in ["segment unmounted", "suspect"] {
        assert!(!log.contains(bad), "master log has {bad:?}:\n{log}");
    }
    cluster.assert_alive();
}

/// About a minute of saturating batched puts of small objects (the load that
/// once starved a store's heartbeat and cost the pool its cache), with the
/// status and metrics read all along: no store is ever suspect or dropped,
/// and every key stays readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturating_puts_never_cost_a_store_its_segment() {
    const KEYS: u64 = 200_000;
    let mut cluster = Cluster::builder()
        .segment_size("256MiB")
        .master_flag("--client-ttl", "5s")
        .start()
        .await;
    let master = cluster.master_addr.clone();
    let keys = KEYS.to_string();
    let mut bench = cluster.spawn(
        "bench",
        [
            "bench",
            "--master",
            &master,
            "--sizes",
            "64B",
            "--ops",
            "put",
            "--batch",
            "128",
            "--concurrency",
            "4",
            "--duration",
            "45s",
            "--keys",
            &keys,
            "--keep",
            "--protocol",
            "tcp",
            "--prefix",
            "soak",
        ],
    );
    let client = cluster.client_with(|c| c.protocol = Protocol::Tcp).await;
    let metrics = cluster.metrics_addr.clone();
    let deadline = Instant::now() + Duration::from_secs(120);
    while bench.try_exit().is_none() {
        assert!(Instant::now() < deadline, "the bench did not finish");
        let s = status(&client).await;
        assert_eq!(s.segments.len(), 1, "a segment was dropped under load");
        assert_eq!(
            s.segments[0].state, "live",
            "the store went suspect under load"
        );
        let (code, _) = http_get(&metrics, "/metrics").await;
        assert_eq!(code, 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        bench.wait_exit(Duration::from_secs(5)).await.success(),
        "{}",
        bench.logs()
    );
    let s = status(&client).await;
    assert_eq!(s.keys, KEYS, "every key of the keyspace was committed once");
    let all: Vec<String> = (0..KEYS).map(|i| format!("soak-64-{i}")).collect();
    for chunk in all.chunks(1000) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for (k, r) in chunk.iter().zip(client.batch_get(&refs).await) {
            assert_eq!(
                r.unwrap_or_else(|e| panic!("get {k}: {e}")).len(),
                64,
                "{k}"
            );
        }
    }
    let log = cluster.master_process().logs();
    for bad in ["segment unmounted", "suspect", "client expired client"] {
        let hits: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(bad) && !l.contains("kvpool-bench"))
            .collect();
        assert!(hits.is_empty(), "master log: {hits:?}");
    }
    cluster.assert_alive();
}
