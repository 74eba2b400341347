//! Durability with real processes: a storage node keeps its cache across
//! `kill -9`, a graceful stop and an upgrade to another binary; a master
//! restarted without HA rebuilds the object map from the stores; a torn write
//! is never served; `kvpool drain` takes a segment out of the pool.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kvpool_client::{Client, Protocol, ReplicateConfig};
use kvpool_format::scan::scan;
use kvpool_format::{header_len, value_checksum, Found, ObjectHeader, DATA_BASE};
use kvpool_net::FramedConn;
use kvpool_proto::frame::{FrameHeader, Limits, Opcode};
use kvpool_proto::msg::{self, PutGrant, PutItem, WriteReq};
use kvpool_proto::Code;
use kvpool_store::segment::SEGMENT_FILE;
use parking_lot::Mutex;

const VALUE_MAX: usize = 16 << 10;

/// Puts `n` deterministic objects named `{prefix}-{i}`; returns their keys.
async fn put_objects(client: &Client, prefix: &str, n: usize, rc: &ReplicateConfig) -> Vec<String> {
    let mut keys = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        client
            .put(&key, &value_for(&key, VALUE_MAX), rc)
            .await
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
        keys.push(key);
    }
    keys
}

/// Reads every key; returns how many came back byte-exact. Any other bytes
/// fail the test at once.
async fn count_exact(client: &Client, keys: &[String]) -> usize {
    let mut exact = 0;
    for key in keys {
        match client.get(key).await {
            Ok(v) => {
                assert_eq!(v, value_for(key, VALUE_MAX), "wrong bytes for {key}");
                exact += 1;
            }
            Err(e) => assert!(
                matches!(
                    e.code,
                    Code::ObjectNotFound | Code::TransferFail | Code::RpcFail
                ),
                "unexpected error for {key}: {e}"
            ),
        }
    }
    exact
}

/// Waits until the master reports at least `n` committed objects.
async fn wait_for_keys(client: &Client, n: u64) {
    eventually(&format!("{n} keys at the master"), STARTUP, async || {
        let s = client.status().await.ok()?;
        (s.keys >= n).then_some(())
    })
    .await;
}

/// The data endpoint of segment `name`, once it is mounted and open.
async fn endpoint_of(client: &Client, name: &str) -> String {
    eventually(&format!("segment {name} mounted"), STARTUP, async || {
        let s = client.status().await.ok()?;
        s.segments
            .into_iter()
            .find(|s| s.info.name == name)
            .map(|s| s.info.endpoint)
    })
    .await
}

/// Waits until segment `name` is mounted again from a new store process
/// (a new data endpoint), its inventory reconciled.
async fn wait_remounted(client: &Client, name: &str, old: &str) {
    eventually(&format!("segment {name} remounted"), STARTUP, async || {
        let s = client.status().await.ok()?;
        s.segments
            .iter()
            .any(|s| s.info.name == name && s.info.endpoint != old)
            .then_some(())
    })
    .await
}

/// The bytes of store `i`'s segment file (the store maps it shared, so what
/// it received is there).
fn segment_bytes(cluster: &Cluster, i: usize) -> Vec<u8> {
    let path = cluster
        .dir()
        .join(Cluster::store_name(i))
        .join(SEGMENT_FILE);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The intact objects in store `i`'s segment, as a restart's scan finds them.
fn on_disk(cluster: &Cluster, i: usize) -> Vec<Found> {
    scan(&segment_bytes(cluster, i), DATA_BASE).0
}

/// A steady writer and reader; the reader fails the test on wrong bytes.
struct Load {
    committed: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(writer: Client, reader: Client) -> Load {
        let committed = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let w = {
            let (committed, stop) = (committed.clone(), stop.clone());
            tokio::spawn(async move {
                let rc = ReplicateConfig::default();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("load-{i}");
                    i += 1;
                    if writer
                        .put(&key, &value_for(&key, VALUE_MAX), &rc)
                        .await
                        .is_ok()
                    {
                        committed.lock().push(key);
                    }
                }
            })
        };
        let r = {
            let (committed, stop, reads) = (committed.clone(), stop.clone(), reads.clone());
            tokio::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let key = {
                        let c = committed.lock();
                        if c.is_empty() {
                            None
                        } else {
                            n = n.wrapping_mul(31).wrapping_add(17);
                            Some(c[n % c.len()].clone())
                        }
                    };
                    let Some(key) = key else {
                        // Nothing committed yet: the reader idles a moment.
                        // Pacing of the load, not a wait the test relies on.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    if let Ok(v) = reader.get(&key).await {
                        assert_eq!(
                            v,
                            value_for(&key, VALUE_MAX),
                            "reader got wrong bytes for {key}"
                        );
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        Load {
            committed,
            stop,
            reads,
            tasks: vec![w, r],
        }
    }

    fn committed(&self) -> Vec<String> {
        self.committed.lock().clone()
    }

    /// Objects committed and reads checked so far.
    fn progress(&self) -> (usize, u64) {
        (
            self.committed.lock().len(),
            self.reads.load(Ordering::Relaxed),
        )
    }

    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("a load task panicked");
        }
        self.reads.load(Ordering::Relaxed)
    }
}

async fn kill9_restart_under_load(wait_past_ttl: bool, protocol: Protocol, segment: &str) {
    let mut cluster = Cluster::builder().segment_size(segment).start().await;
    let load = Load::start(
        cluster.client_with(|c| c.protocol = protocol).await,
        cluster.client_with(|c| c.protocol = protocol).await,
    );
    let probe = cluster.client().await;
    eventually("the load to commit objects", STARTUP, async || {
        (load.committed().len() >= 300).then_some(())
    })
    .await;
    let before = load.committed();
    let old = endpoint_of(&probe, "store-0").await;
    cluster.kill9_store(0);
    if wait_past_ttl {
        // The master drops the segment; the store comes back as a new one.
        eventually("the dead segment to be dropped", STARTUP, async || {
            let s = probe.status().await.ok()?;
            s.segments.is_empty().then_some(())
        })
        .await;
    } else {
        // The point of this case: the store stays down a moment, well within
        // the TTL, while the load keeps running.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    cluster.restart_store(0, None);
    wait_remounted(&probe, "store-0", &old).await;
    wait_for_keys(&probe, (before.len() as u64) * 99 / 100).await;
    // The load goes on through the restarted store before it stops.
    let (written, read) = load.progress();
    eventually(
        "the load to write and read after the restart",
        STARTUP,
        async || {
            let (w, r) = load.progress();
            (w >= written + 20 && r >= read + 20).then_some(())
        },
    )
    .await;
    let reads = load.stop().await;
    let exact = count_exact(&probe, &before).await;
    // The issue asks for >= 99%; nothing legitimate loses one here (the pool
    // is far from full), so any loss is a bug.
    assert!(
        exact == before.len(),
        "only {exact} of {} objects committed before the kill read back",
        before.len()
    );
    assert!(reads > 0, "the reader never read anything");
    eprintln!(
        "kill -9 {}, {protocol:?} load: {exact} of {} objects committed before the kill read back byte-exact",
        if wait_past_ttl {
            "past the TTL"
        } else {
            "within the TTL"
        },
        before.len()
    );
    cluster.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_keeps_its_cache_across_kill9_within_the_ttl() {
    kill9_restart_under_load(false, Protocol::Tcp, "128MiB").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_keeps_its_cache_across_kill9_past_the_ttl() {
    kill9_restart_under_load(true, Protocol::Tcp, "128MiB").await;
}

/// Writers on the same host keep writing through shared memory while the
/// store is down and while it scans; nothing they committed may be dropped
/// when it remounts. (Big enough a segment that nothing is evicted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_kill9_under_shared_memory_load_loses_nothing() {
    kill9_restart_under_load(false, Protocol::Shm, "1GiB").await;
}

/// The upgrade path: SIGTERM, then the store starts from another copy of the
/// binary on the same data dir; every object is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_upgrade_to_a_new_binary_keeps_every_object() {
    let mut cluster = Cluster::builder().stores(2).start().await;
    let client = cluster.client().await;
    let keys = put_objects(&client, "up", 200, &ReplicateConfig::default()).await;

    let old = endpoint_of(&client, "store-0").await;
    let v2 = cluster.dir().join("kvpool-v2");
    std::fs::copy(BIN, &v2).expect("copy the binary as v2");
    cluster.store(0).terminate();
    // While store-0 drains, new objects go to store-1 only.
    eventually("store-0 to stop taking objects", STARTUP, async || {
        let s = client.status().await.ok()?;
        s.segments
            .iter()
            .any(|s| s.info.name == "store-0" && s.state != "live")
            .then_some(())
    })
    .await;
    let during = put_objects(&client, "during", 20, &ReplicateConfig::default()).await;
    let status = cluster.store(0).wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "store-0 did not stop cleanly: {status}");
    let s = client.status().await.expect("status");
    let s0 = s
        .segments
        .iter()
        .find(|s| s.info.name == "store-0")
        .expect("store-0 still mounted");
    let s1 = s
        .segments
        .iter()
        .find(|s| s.info.name == "store-1")
        .expect("store-1");
    assert_eq!(s0.regions + s1.regions, 220);

    cluster.restart_store(0, Some(&v2));
    wait_remounted(&client, "store-0", &old).await;
    let all: Vec<String> = keys.iter().chain(during.iter()).cloned().collect();
    assert_eq!(count_exact(&client, &all).await, all.len());
    // The objects placed during the drain all went to store-1.
    let s = client.status().await.expect("status");
    let s0 = s
        .segments
        .iter()
        .find(|s| s.info.name == "store-0")
        .expect("store-0");
    assert!(s0.regions <= 200, "store-0 took objects while draining");
    cluster.assert_alive();
}

/// Without HA a restarted master is empty; it rebuilds the object map (both
/// replicas of replicated objects) from the stores as they re-mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_restart_rebuilds_from_the_stores() {
    let mut cluster = Cluster::builder().stores(2).start().await;
    let client = cluster.client().await;
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let mut keys = put_objects(&client, "single", 150, &ReplicateConfig::default()).await;
    keys.extend(put_objects(&client, "double", 150, &two).await);
    client
        .upsert("single-0", b"newer", &ReplicateConfig::default())
        .await
        .expect("upsert");
    client.remove("single-1", true).await.expect("remove");
    // The master destroys what was freed on the stores: wait until no
    // segment file holds the removed object or the replaced version.
    eventually(
        "the freed versions destroyed on the stores",
        STARTUP,
        async || {
            let found: Vec<Found> = (0..2).flat_map(|i| on_disk(&cluster, i)).collect();
            let copies = |key: &str| found.iter().filter(|f| f.key == key).count();
            (copies("single-0") == 1 && copies("single-1") == 0).then_some(())
        },
    )
    .await;

    cluster.kill9_master();
    cluster.restart_master().await;
    let fresh = cluster.client().await;
    wait_for_keys(&fresh, 299).await;
    let rest: Vec<String> = keys.iter().skip(2).cloned().collect();
    assert_eq!(count_exact(&fresh, &rest).await, rest.len());
    assert_eq!(fresh.get("single-0").await.expect("upserted"), b"newer");
    assert_eq!(
        fresh.get("single-1").await.expect_err("removed").code,
        Code::ObjectNotFound
    );
    let (code, body) = http_get(&cluster.metrics_addr, "/api/keys/double-7").await;
    assert_eq!(code, 200);
    assert_eq!(
        body.matches("\"segment\"").count(),
        2,
        "both replicas are back: {body}"
    );
    assert_eq!(fresh.status().await.expect("status").keys, 299);
    cluster.assert_alive();
}

/// A store killed in the middle of receiving an object: after it restarts
/// (and even after the master restarts, so only the scan decides) the object
/// is never served, while a committed neighbour is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_write_is_never_served() {
    let mut cluster = Cluster::builder().start().await;
    let client = cluster.client().await;
    client
        .put(
            "neighbour",
            &value_for("neighbour", VALUE_MAX),
            &ReplicateConfig::default(),
        )
        .await
        .expect("put");

    let link = cluster.master_link("torn-writer");
    link.register().await.expect("register");
    let value = vec![0xA5u8; 1 << 20];
    let key = "torn";
    let region_len = header_len(key.len()) as u64 + value.len() as u64;
    let grant = link
        .call(&msg::PutStart {
            client_id: link.client_id(),
            op: 1,
            items: vec![PutItem {
                key: key.into(),
                value_len: value.len() as u64,
                region_len,
            }],
            config: ReplicateConfig::default(),
            upsert: false,
        })
        .await
        .expect("put start")
        .remove(0)
        .expect("granted");
    let PutGrant::Write {
        generation,
        replicas,
    } = grant
    else {
        panic!("expected a write grant")
    };
    let head = ObjectHeader {
        key: key.into(),
        value_len: value.len() as u64,
        generation,
        checksum: value_checksum(&[&value]),
    }
    .encode();
    let r = &replicas[0];
    let mut conn = FramedConn::connect(&r.endpoint, "torn-writer", Limits::default())
        .await
        .expect("connect to the store");
    let meta = msg::encode(&WriteReq {
        segment: r.segment,
        offset: r.offset,
        grant: r.grant(generation),
    });
    let h = FrameHeader::request(Opcode::Write, 1, meta.len() as u32, region_len);
    // The header and half the value arrive; then the store dies.
    conn.send_frame(&h, &meta, &[&head, &value[..value.len() / 2]])
        .await
        .expect("send");
    conn.flush().await.expect("flush");
    let sent = head.len() + value.len() / 2;
    let at = r.offset as usize;
    eventually(
        "the half object in the store's segment",
        STARTUP,
        async || {
            let seg = segment_bytes(&cluster, 0);
            let got = seg.get(at..at + sent)?;
            (got[..head.len()] == head[..] && got[head.len()..].iter().all(|&b| b == 0xA5))
                .then_some(())
        },
    )
    .await;
    cluster.kill9_store(0);
    drop(conn);
    drop(link);

    cluster.restart_store(0, None);
    wait_for_keys(&client, 1).await;
    // The writer is gone: its put is revoked, never committed.
    assert_eq!(
        client.get(key).await.expect_err("torn").code,
        Code::ObjectNotFound
    );
    // A master with no memory of the put sees only what the scan found.
    cluster.kill9_master();
    cluster.restart_master().await;
    let fresh = cluster.client().await;
    wait_for_keys(&fresh, 1).await;
    assert_eq!(
        fresh.get(key).await.expect_err("torn").code,
        Code::ObjectNotFound
    );
    assert_eq!(
        fresh.get("neighbour").await.expect("neighbour"),
        value_for("neighbour", VALUE_MAX)
    );
    assert_eq!(fresh.status().await.expect("status").keys, 1);
    cluster.assert_alive();
}

/// `kvpool drain` stops placement at once and unmounts after the grace:
/// objects with a replica elsewhere stay readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_takes_a_segment_out_of_the_pool() {
    let mut cluster = Cluster::builder().stores(2).start().await;
    let client = cluster.client().await;
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let keys = put_objects(&client, "kept", 40, &two).await;
    let out = run_kvpool(
        &[
            "drain",
            "--master",
            &cluster.master_addr,
            "--segment",
            "store-0",
            "--grace",
            "1s",
        ],
        Duration::from_secs(15),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("draining"));
    // Placement skips the draining segment right away.
    let fresh = put_objects(&client, "after", 10, &ReplicateConfig::default()).await;
    eventually("store-0 to be unmounted", STARTUP, async || {
        let s = client.status().await.ok()?;
        (s.segments.len() == 1 && s.segments[0].info.name == "store-1").then_some(())
    })
    .await;
    let all: Vec<String> = keys.iter().chain(fresh.iter()).cloned().collect();
    assert_eq!(count_exact(&client, &all).await, all.len());
    let bad = run_kvpool(
        &[
            "drain",
            "--master",
            &cluster.master_addr,
            "--segment",
            "nope",
        ],
        Duration::from_secs(15),
    )
    .await;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("SEGMENT_NOT_FOUND"));
    cluster.assert_alive();
}
