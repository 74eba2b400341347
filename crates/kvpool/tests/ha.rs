//! Master high availability with a real etcd: two masters, stores and
//! clients addressing the pool as `etcd://...`; the leader is killed under a
//! steady load, the standby serves within 10 s, every committed object is
//! readable afterwards, and clients only ever saw retryable errors.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kvpool_client::{Client, ClientConfig, ReplicateConfig};
use kvpool_proto::Code;
use parking_lot::Mutex;

const VALUE_MAX: usize = 8 << 10;

/// Which of `masters` (RPC addresses) says it leads.
async fn leader_of(masters: &[String]) -> usize {
    eventually("a master to lead", STARTUP, async || {
        for (i, m) in masters.iter().enumerate() {
            let out = run_kvpool(&["status", "--master", m], Duration::from_secs(10)).await;
            if String::from_utf8_lossy(&out.stdout).contains("role: leader") {
                return Some(i);
            }
        }
        None
    })
    .await
}

/// Two masters of `cluster` on the etcd at `endpoint` (2 s client TTL and
/// leadership lease), with `extra` flags.
async fn spawn_ha_masters(
    logs: &std::path::Path,
    endpoint: &str,
    cluster: &str,
    extra: &[&str],
) -> Vec<MasterProcess> {
    let mut masters = Vec::new();
    for i in 0..2 {
        let (ep, cluster) = (endpoint.to_string(), cluster.to_string());
        let extra: Vec<String> = extra.iter().map(|f| f.to_string()).collect();
        masters.push(
            spawn_master(&format!("master-{i}"), logs, move |rpc, metrics| {
                let mut args = [
                    "master",
                    "--rpc-port",
                    &rpc.to_string(),
                    "--metrics-port",
                    &metrics.to_string(),
                    "--enable-ha",
                    "--etcd-endpoints",
                    &ep,
                    "--cluster-id",
                    &cluster,
                    "--client-ttl",
                    "2s",
                    "--ha-lease-ttl",
                    "2s",
                ]
                .map(String::from)
                .to_vec();
                args.extend(extra.iter().cloned());
                args
            })
            .await,
        );
    }
    masters
}

/// A pool on a fresh etcd: two masters (see [`spawn_ha_masters`]) and two
/// stores, every segment mounted.
struct HaPool {
    /// `etcd://.../<cluster>`, for stores and clients.
    pool: String,
    masters: Vec<MasterProcess>,
    /// The masters' RPC addresses, in `masters` order.
    rpcs: Vec<String>,
    /// Which of `masters` leads.
    leader: usize,
    _stores: Vec<Process>,
    _etcd: Process,
    _dir: tempfile::TempDir,
}

async fn ha_pool(cluster: &str, segment_size: &str) -> HaPool {
    let dir = scratch_dir();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let (etcd, endpoint) = spawn_etcd(&logs).await;
    let pool = format!("etcd://{endpoint}/{cluster}");
    let masters = spawn_ha_masters(&logs, &endpoint, cluster, &[]).await;
    let stores: Vec<Process> = (0..2)
        .map(|i| {
            let name = format!("store-{i}");
            spawn_store(&name, &pool, segment_size, &dir.path().join(&name), &logs)
        })
        .collect();
    let rpcs: Vec<String> = masters.iter().map(|m| m.rpc.clone()).collect();
    let leader = leader_of(&rpcs).await;
    wait_for_segments(&pool, 2, &mut []).await;
    HaPool {
        pool,
        masters,
        rpcs,
        leader,
        _stores: stores,
        _etcd: etcd,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_when_the_leader_dies() {
    // Every field bound: the ones not used keep the processes alive.
    let HaPool {
        pool,
        mut masters,
        rpcs,
        leader,
        _stores,
        _etcd,
        _dir,
    } = ha_pool("ha-test", "64MiB").await;

    let connect = || async {
        Client::connect(ClientConfig::new(&pool))
            .await
            .unwrap_or_else(|e| panic!("client on {pool}: {e}"))
    };
    let (writer, reader, probe) = (connect().await, connect().await, connect().await);
    let committed: Arc<Mutex<Vec<String>>> = Arc::default();
    let errors: Arc<Mutex<Vec<Code>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let w = {
        let (committed, errors, stop) = (committed.clone(), errors.clone(), stop.clone());
        tokio::spawn(async move {
            let rc = ReplicateConfig::default();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("ha-{i}");
                i += 1;
                match writer.put(&key, &value_for(&key, VALUE_MAX), &rc).await {
                    Ok(()) => committed.lock().push(key),
                    Err(e) => errors.lock().push(e.code),
                }
            }
        })
    };
    let r = {
        let (committed, errors, stop) = (committed.clone(), errors.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let key = {
                    let c = committed.lock();
                    (!c.is_empty()).then(|| {
                        n = n.wrapping_mul(31).wrapping_add(7);
                        c[n % c.len()].clone()
                    })
                };
                let Some(key) = key else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                match reader.get(&key).await {
                    Ok(v) => assert_eq!(v, value_for(&key, VALUE_MAX), "wrong bytes for {key}"),
                    Err(e) => errors.lock().push(e.code),
                }
            }
        })
    };
    eventually("the load to commit objects", STARTUP, async || {
        (committed.lock().len() >= 200).then_some(())
    })
    .await;

    masters[leader].process.kill9();
    let killed = Instant::now();
    let standby = 1 - leader;
    // The standby serves: a put and a get through the etcd address succeed.
    eventually(
        "the standby to serve",
        Duration::from_secs(30),
        async || {
            let key = "after-failover";
            probe
                .put(key, b"v", &ReplicateConfig::default())
                .await
                .ok()?;
            (probe.get(key).await.ok()? == b"v").then_some(())
        },
    )
    .await;
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the standby served only after {took:?}"
    );
    assert_eq!(leader_of(&rpcs).await, standby);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    w.await.expect("writer");
    r.await.expect("reader");

    let keys = committed.lock().clone();
    let mut missing = Vec::new();
    for key in &keys {
        match probe.get(key).await {
            Ok(v) => assert_eq!(v, value_for(key, VALUE_MAX), "wrong bytes for {key}"),
            Err(e) => missing.push((key.clone(), e.code)),
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} committed objects lost: {:?}",
        missing.len(),
        keys.len(),
        &missing[..missing.len().min(5)]
    );
    let errors = errors.lock().clone();
    assert!(
        errors.iter().all(|c| c.is_transient()),
        "clients saw non-retryable errors: {errors:?}"
    );
    eprintln!(
        "failover: standby served {took:?} after the kill; {} objects committed; {} retryable errors surfaced",
        keys.len(),
        errors.len()
    );
}

/// A store (re)started while etcd cannot be reached waits for it, as it
/// waits for a master, instead of exiting: the chaos harness restarted a
/// store inside a partition that cut it off from etcd, and it exited with
/// an etcd connection error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_started_before_etcd_waits_for_it() {
    let dir = scratch_dir();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    // Nothing listens here yet.
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("127.0.0.1:{client}");
    let pool = format!("etcd://{endpoint}/late-etcd");
    let mut store = spawn_store("store-0", &pool, "64MiB", &dir.path().join("s0"), &logs);
    eventually("the store to try etcd", STARTUP, async || {
        store
            .stderr()
            .contains("ETCD_OPERATION_ERROR")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        store.try_exit().is_none(),
        "the store gave up on etcd:\n{}",
        store.logs()
    );
    let _etcd = Process::spawn_bin(
        "etcd",
        std::path::Path::new("etcd"),
        [
            "--data-dir".to_string(),
            dir.path().join("etcd").to_string_lossy().into_owned(),
            "--listen-client-urls".into(),
            format!("http://{endpoint}"),
            "--advertise-client-urls".into(),
            format!("http://{endpoint}"),
            "--listen-peer-urls".into(),
            format!("http://127.0.0.1:{peer}"),
        ],
        &logs,
    );
    let _master = spawn_master("master", &logs, |rpc, metrics| {
        [
            "master",
            "--rpc-port",
            &rpc.to_string(),
            "--metrics-port",
            &metrics.to_string(),
            "--enable-ha",
            "--etcd-endpoints",
            &endpoint,
            "--cluster-id",
            "late-etcd",
            "--client-ttl",
            "2s",
            "--ha-lease-ttl",
            "2s",
        ]
        .map(String::from)
        .to_vec()
    })
    .await;
    wait_for_segments(&pool, 1, &mut [&mut store]).await;
}

/// A removal made while the store holding the object is down answers
/// success (not a timeout: the master made it), and stays made when the
/// leader dies before the store is back: the new leader reads the
/// removal's tombstone from etcd and rejects the copy the store's
/// inventory still holds, while the store's other objects come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_made_while_its_store_is_down_survives_a_failover() {
    let dir = scratch_dir();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let (_etcd, endpoint) = spawn_etcd(&logs).await;
    let pool = format!("etcd://{endpoint}/tombs");
    let mut masters = spawn_ha_masters(&logs, &endpoint, "tombs", &["--store-grace", "60s"]).await;
    let store = |name: &str, log: &str| {
        spawn_store_bin(
            std::path::Path::new(BIN),
            log,
            name,
            &pool,
            "32MiB",
            &dir.path().join(name),
            &logs,
        )
    };
    let mut doomed = store("store-0", "store-0");
    let _live = store("store-1", "store-1");
    let rpcs: Vec<String> = masters.iter().map(|m| m.rpc.clone()).collect();
    let leader = leader_of(&rpcs).await;
    wait_for_segments(&pool, 2, &mut []).await;
    let client = Client::connect(ClientConfig::new(&pool))
        .await
        .unwrap_or_else(|e| panic!("client on {pool}: {e}"));
    let on_doomed = ReplicateConfig {
        preferred_segments: vec!["store-0".into()],
        ..Default::default()
    };
    for k in ["gone", "kept"] {
        client.put(k, k.as_bytes(), &on_doomed).await.expect(k);
    }

    doomed.kill9();
    client
        .remove("gone", false)
        .await
        .expect("the master made the removal: success, not a timeout");
    masters[leader].process.kill9();
    let _back = store("store-0", "store-0.restart");
    let kept = eventually(
        "the restarted store's objects",
        Duration::from_secs(60),
        async || client.get("kept").await.ok(),
    )
    .await;
    assert_eq!(kept, b"kept");
    assert_eq!(leader_of(&rpcs).await, 1 - leader);
    assert!(
        !client.exist("gone").await.expect("exist"),
        "a removed key came back"
    );
    assert_eq!(
        client.get("gone").await.unwrap_err().code,
        Code::ObjectNotFound
    );
}

/// Reads of objects a client read lately keep being served while the
/// leader is dead and no master answers: their cached locations are under a
/// live read lease (the first half of it), so the reads go straight to the
/// stores, which verify them as always. Every read in the first 1.5 s after
/// the kill (well inside the 2.5 s lease half the last renewal covers)
/// returns the right bytes without waiting for a master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_recently_read_objects_go_on_while_the_leader_is_dead() {
    let HaPool {
        pool,
        mut masters,
        leader,
        _stores,
        _etcd,
        _dir,
        ..
    } = ha_pool("reads", "32MiB").await;
    let client = Client::connect(ClientConfig::new(&pool))
        .await
        .unwrap_or_else(|e| panic!("client on {pool}: {e}"));
    let keys: Vec<String> = (0..16).map(|i| format!("hot-{i}")).collect();
    for k in &keys {
        let v = value_for(k, VALUE_MAX);
        client
            .put(k, &v, &ReplicateConfig::default())
            .await
            .expect(k);
        assert_eq!(client.get(k).await.expect(k), v);
    }
    // Steady reads, so the touches keep the leases (and cache entries) fresh.
    let read_all = async || {
        let mut slowest = Duration::ZERO;
        for k in &keys {
            let t0 = Instant::now();
            let got = client.get(k).await;
            slowest = slowest.max(t0.elapsed());
            assert_eq!(
                got.as_deref().ok(),
                Some(&value_for(k, VALUE_MAX)[..]),
                "{k}: {got:?}"
            );
        }
        slowest
    };
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_secs(1) {
        read_all().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    masters[leader].process.kill9();
    let killed = Instant::now();
    let (mut passes, mut slowest) = (0, Duration::ZERO);
    while killed.elapsed() < Duration::from_millis(1500) {
        slowest = slowest.max(read_all().await);
        passes += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(passes >= 5, "only {passes} passes of reads in 1.5 s");
    assert!(
        slowest < Duration::from_millis(500),
        "a read waited {slowest:?} for the dead leader"
    );
    let hits = client.cache_stats().hits;
    assert!(hits > 0, "no read was served from a cached location");
}

/// The scaling prototype (docs/scaling.md): a pool split by key over two
/// groups, each two masters and a store. Each key lands in the group its
/// slot names and only there, batches answer in the caller's order, the
/// slot map in etcd is written once, and one group's leader killed costs
/// no acknowledged write of either group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_split_over_two_groups_keeps_each_groups_guarantees() {
    use kvpool_client::groups::{publish_map, GroupedClient, SlotMap};

    let dir = scratch_dir();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let (_etcd, endpoint) = spawn_etcd(&logs).await;
    let clusters = ["grp-a", "grp-b"];
    let (mut groups, mut stores) = (Vec::new(), Vec::new());
    for c in clusters {
        let masters = spawn_ha_masters(&logs, &endpoint, c, &[]).await;
        let addr = format!("etcd://{endpoint}/{c}");
        let name = format!("{c}-store");
        stores.push(spawn_store(
            &name,
            &addr,
            "64MiB",
            &dir.path().join(&name),
            &logs,
        ));
        wait_for_segments(&addr, 1, &mut []).await;
        groups.push(masters);
    }
    let pool = format!("etcd://{endpoint}/split");
    let map = SlotMap::even(clusters.map(|c| format!("etcd://{endpoint}/{c}")).to_vec()).unwrap();
    assert_eq!(publish_map(&pool, &map).await.unwrap(), map);
    // A second writer finds the map there and changes nothing.
    let other = SlotMap::even(vec![format!("etcd://{endpoint}/grp-b")]).unwrap();
    assert_eq!(publish_map(&pool, &other).await.unwrap(), map);

    let client = GroupedClient::connect(&pool, ClientConfig::new(""))
        .await
        .unwrap_or_else(|e| panic!("grouped client on {pool}: {e}"));
    let keys: Vec<String> = (0..600).map(|i| format!("split-{i}")).collect();
    let values: Vec<Vec<u8>> = keys.iter().map(|k| value_for(k, 4096)).collect();
    put_every(&client, &keys, &values, false, "put").await;
    // Each group holds exactly the keys its slots name, and no other.
    for g in 0..2 {
        let mine: Vec<&str> = keys
            .iter()
            .map(String::as_str)
            .filter(|k| map.group_of(k) == g)
            .collect();
        assert!(
            mine.len() > 200,
            "the slots split 600 keys unevenly: {}",
            mine.len()
        );
        assert_eq!(
            client.group(g).status().await.unwrap().keys,
            mine.len() as u64,
            "group {g}"
        );
        let theirs: Vec<&str> = keys
            .iter()
            .map(String::as_str)
            .filter(|k| map.group_of(k) != g)
            .collect();
        for r in client.group(g).batch_exist(&theirs).await {
            assert!(!r.unwrap(), "group {g} holds a key of the other group");
        }
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let got = client.batch_get(&refs).await;
    for ((k, v), r) in keys.iter().zip(&values).zip(got) {
        assert_eq!(&r.unwrap_or_else(|e| panic!("get of {k}: {e}")), v, "{k}");
    }

    // Group a's leader dies; a batch over both groups is acknowledged whole
    // (group a's part once its standby leads) and reads back new bytes.
    let rpcs: Vec<String> = groups[0].iter().map(|m| m.rpc.clone()).collect();
    let leader = leader_of(&rpcs).await;
    groups[0][leader].process.kill9();
    let newer: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| value_for(&format!("{k}-2"), 4096))
        .collect();
    put_every(&client, &keys, &newer, true, "upsert across the failover").await;
    let got = client.batch_get(&refs).await;
    for ((k, v), r) in keys.iter().zip(&newer).zip(got) {
        assert_eq!(
            &r.unwrap_or_else(|e| panic!("get of {k}: {e}")),
            v,
            "{k} after the failover"
        );
    }
    client.close().await;
}

/// One batch put of `values` under `keys` through the grouped `client`,
/// every key acknowledged (`what` names the call in a failure).
async fn put_every(
    client: &kvpool_client::groups::GroupedClient,
    keys: &[String],
    values: &[Vec<u8>],
    upsert: bool,
    what: &str,
) {
    let items: Vec<(&str, &[u8])> = (keys.iter().map(String::as_str))
        .zip(values.iter().map(Vec::as_slice))
        .collect();
    let rc = ReplicateConfig::default();
    for (k, r) in keys
        .iter()
        .zip(client.batch_put_values(&items, &rc, upsert).await)
    {
        r.unwrap_or_else(|e| panic!("{what} of {k}: {e}"));
    }
}
