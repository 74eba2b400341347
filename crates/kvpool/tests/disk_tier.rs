//! The disk tier against the real binaries: a store with a small memory
//! segment and a disk segment (on the machine's disk, O_DIRECT) takes three
//! times its memory in objects, all readable byte-exact over every
//! transport; they survive `kill -9` and a restart; removes, upserts and a
//! second read (promotion) behave; a full disk tier drops only objects it
//! then reports missing; and a disk that fails is withdrawn while memory
//! keeps serving, with no wrong byte returned.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use kvpool_client::{Client, ClientConfig, Protocol, ReplicateConfig};
use kvpool_proto::msg::{ClusterStatus, Tier};
use kvpool_proto::Code;
use rand::SeedableRng;

/// Value bytes of each object.
const VALUE: usize = 256 << 10;

/// The value of `key`: `VALUE` bytes derived from it.
fn value(key: &str) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed_of(key));
    random_bytes(&mut rng, VALUE)
}

/// A directory on the machine's disk (not tmpfs: the tier uses O_DIRECT).
/// A master and one store lending `memory` of memory and `disk` of disk in
/// `disk_dir`; the master demotes above half of memory.
struct TierPool {
    master: MasterProcess,
    store: Process,
    store_args: Vec<String>,
    dir: tempfile::TempDir,
    restarts: usize,
}

impl TierPool {
    async fn start(memory: &str, disk: &str, disk_dir: &Path) -> TierPool {
        Self::start_with(memory, disk, disk_dir, &[]).await
    }

    /// [`Self::start`] with more flags for the master.
    async fn start_with(
        memory: &str,
        disk: &str,
        disk_dir: &Path,
        master_flags: &[&str],
    ) -> TierPool {
        let dir = scratch_dir();
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).expect("log dir");
        let master = spawn_master("master", &logs, |rpc, metrics| {
            [
                "master",
                "--rpc-port",
                &rpc.to_string(),
                "--metrics-port",
                &metrics.to_string(),
                "--client-ttl",
                "2s",
                "--store-grace",
                "10s",
                "--demote-watermark",
                "0.5",
            ]
            .into_iter()
            .chain(master_flags.iter().copied())
            .map(String::from)
            .collect()
        })
        .await;
        let store_args: Vec<String> = [
            "store",
            "--master",
            &master.rpc,
            "--segment-size",
            memory,
            "--data-dir",
            &dir.path().join("mem").to_string_lossy(),
            "--disk-dir",
            &disk_dir.to_string_lossy(),
            "--disk-size",
            disk,
            "--name",
            "tiered",
        ]
        .map(String::from)
        .to_vec();
        let store = Process::spawn("store", &store_args, &logs);
        let mut pool = TierPool {
            master,
            store,
            store_args,
            dir,
            restarts: 0,
        };
        pool.wait_mounted().await;
        pool
    }

    async fn wait_mounted(&mut self) {
        wait_for_segments(&self.master.rpc, 2, &mut [&mut self.store]).await;
    }

    fn kill9_store(&mut self) {
        self.store.kill9();
    }

    async fn restart_store(&mut self) {
        self.restarts += 1;
        let logs = self.dir.path().join("logs");
        self.store = Process::spawn(
            &format!("store.restart{}", self.restarts),
            &self.store_args,
            &logs,
        );
        self.wait_mounted().await;
    }

    /// The first `n` of `keys` whose only replica is on the disk tier (as
    /// the master's admin API shows them).
    async fn on_disk(&self, keys: &[String], n: usize) -> Vec<String> {
        let c = self.client(Protocol::Tcp).await;
        let disk = status(&c)
            .await
            .segments
            .iter()
            .find(|s| s.info.tier == Tier::Disk)
            .map(|s| s.info.id.0)
            .expect("a disk segment");
        let mut out = Vec::new();
        for k in keys {
            let path = format!("/api/keys/{}", k.replace('/', "%2F"));
            let (code, body) = http_get(&self.master.metrics, &path).await;
            if code == 200
                && body.matches("\"segment\":").count() == 1
                && body.contains(&format!("\"segment\":{disk}"))
            {
                out.push(k.clone());
                if out.len() == n {
                    break;
                }
            }
        }
        out
    }

    async fn client(&self, protocol: Protocol) -> Client {
        let mut cfg = ClientConfig::new(&self.master.rpc);
        cfg.protocol = protocol;
        Client::connect(cfg).await.expect("client")
    }
}

/// A counter or gauge of the master's `/metrics` (0 when absent).
async fn master_metric(pool: &TierPool, name: &str) -> u64 {
    let (code, body) = http_get(&pool.master.metrics, "/metrics").await;
    assert_eq!(code, 200, "/metrics");
    metric(&body, name).unwrap_or(0.0) as u64
}

async fn status(c: &Client) -> ClusterStatus {
    c.status().await.expect("status")
}

fn tier_used(s: &ClusterStatus, tier: Tier) -> (u64, u64) {
    s.segments
        .iter()
        .filter(|x| x.info.tier == tier)
        .fold((0, 0), |(c, u), x| (c + x.info.size, u + x.used))
}

/// Puts `keys` in batches of `batch`, each into memory under its
/// watermark, and returns once memory is back under it (a writer faster
/// than the disk would make memory evict instead).
async fn fill(c: &Client, keys: &[String], batch: usize) {
    for part in keys.chunks(batch) {
        under_watermark(c).await;
        let values: Vec<Vec<u8>> = part.iter().map(|k| value(k)).collect();
        let items: Vec<(&str, &[u8])> = part
            .iter()
            .map(String::as_str)
            .zip(values.iter().map(Vec::as_slice))
            .collect();
        for (k, r) in part.iter().zip(
            c.batch_put_values(&items, &ReplicateConfig::default(), false)
                .await,
        ) {
            r.unwrap_or_else(|e| panic!("put {k}: {e}"));
        }
    }
    under_watermark(c).await;
}

/// Waits until demotions have brought memory back under the watermark, so
/// that the next batch of puts fits beside what is there: a put into a full
/// memory tier evicts, however much room the disk has (after a pause the
/// store may still be catching up on its demotions).
async fn under_watermark(c: &Client) {
    eventually(
        "memory back under the demotion watermark",
        STARTUP,
        async || {
            let (cap, used) = tier_used(&status(c).await, Tier::Memory);
            (used as f64 <= cap as f64 * 0.55).then_some(())
        },
    )
    .await;
}

/// Puts 16 more of `keys` past the first `written` at once (into memory
/// under its watermark, but then, unlike [`fill`], without waiting for the
/// disk) and pauses the store, until the
/// master's `metric` shows, within `within`, that the pause caught moves
/// under way; returns how many keys are written. On a loaded machine the
/// demotions may all be done before a pause: then the store resumes and
/// takes 16 more. Fails past 96 keys.
async fn pause_during_demotions(
    pool: &TierPool,
    c: &Client,
    keys: &[String],
    mut written: usize,
    metric: &str,
    within: Duration,
) -> usize {
    loop {
        assert!(written < 96, "no demotion was ever under way at a pause");
        under_watermark(c).await;
        let more: Vec<(&str, Vec<u8>)> = keys[written..written + 16]
            .iter()
            .map(|k| (k.as_str(), value(k)))
            .collect();
        let items: Vec<(&str, &[u8])> = more.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        for r in c
            .batch_put_values(&items, &ReplicateConfig::default(), false)
            .await
        {
            r.expect("put");
        }
        written += 16;
        pool.store.freeze(true);
        let caught = async || (master_metric(pool, metric).await > 0).then_some(());
        let wait =
            tokio::time::timeout(within, async { eventually(metric, STARTUP, caught).await });
        if wait.await.is_ok() {
            return written;
        }
        pool.store.freeze(false);
    }
}

/// Reads every key; panics on wrong bytes or an error other than "not
/// found". Returns how many were found.
async fn read_back(c: &Client, keys: &[String], what: &str) -> usize {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut found = 0;
    for (k, got) in keys.iter().zip(c.batch_get(&refs).await) {
        match got {
            Ok(v) => {
                assert!(v == value(k), "{what}: {k}: wrong bytes");
                found += 1;
            }
            Err(e) if e.code == Code::ObjectNotFound => {}
            Err(e) => {
                let again = c.get(k).await;
                panic!("{what}: {k}: {e}; read again: {:?}", again.map(|v| v.len()))
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_times_memory_stays_readable_through_a_restart() {
    let disk = disk_dir();
    let mut pool = TierPool::start("16MiB", "96MiB", disk.path()).await;
    let c = pool.client(Protocol::Auto).await;
    // 192 objects of 256 KiB: 48 MiB, three times the memory segment.
    let keys: Vec<String> = (0..192).map(|i| format!("tier/{i:03}")).collect();
    fill(&c, &keys, 16).await;
    let st = status(&c).await;
    assert_eq!(st.evictions, 0, "nothing was dropped");
    assert!(st.demotions >= 100, "{} demotions", st.demotions);
    let (disk_cap, disk_used) = tier_used(&st, Tier::Disk);
    assert!(
        disk_used >= 25 << 20 && disk_used <= disk_cap,
        "{disk_used} of {disk_cap}"
    );
    // An object read twice while on disk is promoted once memory has room
    // below the demotion watermark. The last puts of the fill may still be
    // on their way to disk, and a promotion planned before there is room is
    // dropped until the object's next read: so it is read until promoted.
    let promoted = pool.on_disk(&keys, 1).await.remove(0);
    let uncached = {
        let mut cfg = ClientConfig::new(&pool.master.rpc);
        cfg.location_cache = 0;
        Client::connect(cfg).await.expect("client")
    };
    let before = status(&c).await.promotions;
    assert!(uncached.get(&promoted).await.expect("get") == value(&promoted));
    eventually(
        "the twice-read object to be promoted",
        STARTUP,
        async || {
            assert!(uncached.get(&promoted).await.expect("get") == value(&promoted));
            (status(&c).await.promotions > before).then_some(())
        },
    )
    .await;
    assert!(uncached.get(&promoted).await.expect("get") == value(&promoted));

    // Every object, from memory (shared memory here) or disk (TCP always).
    assert_eq!(read_back(&c, &keys, "auto").await, keys.len());
    let tcp = pool.client(Protocol::Tcp).await;
    assert_eq!(read_back(&tcp, &keys, "tcp").await, keys.len());
    let shm = pool.client(Protocol::Shm).await;
    assert_eq!(read_back(&shm, &keys, "shm").await, keys.len());
    // The store reports its disk I/O with its next heartbeat.
    eventually("the disk tier's writes reported", STARTUP, async || {
        let st = status(&c).await;
        let io = st.segments.iter().find(|s| s.info.tier == Tier::Disk);
        io.and_then(|s| s.io).filter(|io| io.write_ops > 0)
    })
    .await;

    // kill -9 and a restart: the scan finds both tiers' objects again.
    // Until the master has the store's new endpoint, a read of an object
    // there fails at once (a store known down is not waited for).
    pool.kill9_store();
    pool.restart_store().await;
    let c = pool.client(Protocol::Tcp).await;
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    eventually(
        "every object reachable after the restart",
        STARTUP,
        async || {
            let got = c.batch_get(&refs).await;
            (!got
                .iter()
                .any(|r| r.as_ref().is_err_and(|e| e.code == Code::TransferFail)))
            .then_some(())
        },
    )
    .await;
    assert_eq!(read_back(&c, &keys, "after restart").await, keys.len());

    // Disk-resident objects upserted and removed.
    let on_disk = pool.on_disk(&keys, 2).await;
    assert_eq!(on_disk.len(), 2);
    let fresh = value("another value");
    c.upsert(&on_disk[0], &fresh, &ReplicateConfig::default())
        .await
        .expect("upsert");
    assert!(c.get(&on_disk[0]).await.expect("get") == fresh);
    c.remove(&on_disk[1], true).await.expect("remove");
    assert_eq!(
        c.get(&on_disk[1]).await.unwrap_err().code,
        Code::ObjectNotFound
    );
    let rest: Vec<String> = keys
        .iter()
        .filter(|k| ![&on_disk[0], &on_disk[1]].contains(k))
        .cloned()
        .collect();
    assert_eq!(read_back(&c, &rest, "at the end").await, rest.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_tier_drops_only_what_it_then_reports_missing() {
    let disk = disk_dir();
    let pool = TierPool::start("8MiB", "8MiB", disk.path()).await;
    let c = pool.client(Protocol::Tcp).await;
    // 96 objects: 24 MiB into 16 MiB of memory and disk together.
    let keys: Vec<String> = (0..96).map(|i| format!("full/{i:03}")).collect();
    fill(&c, &keys, 8).await;
    let found = read_back(&c, &keys, "full").await;
    let st = status(&c).await;
    assert!(st.evictions > 0, "the full disk tier evicted");
    assert!(found < keys.len() && found >= 30, "{found} found");
    // The newest objects are the ones kept.
    assert_eq!(read_back(&c, &keys[88..], "newest").await, 8);
}

/// A tmpfs of `size` mounted at a fresh directory, unmounted on drop: a
/// "disk" that runs out of space for real.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(size: &str) -> SmallFs {
        let dir = disk_dir().keep();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "mount -t tmpfs failed: this test needs root (CI runs as root)"
        );
        SmallFs(dir)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_disk_is_withdrawn_and_memory_keeps_serving() {
    // The disk tier claims 32 MiB on a file system with 2: writes fail.
    let fs = SmallFs::mount("2m");
    let mut pool = TierPool::start("8MiB", "32MiB", &fs.0).await;
    let c = pool.client(Protocol::Tcp).await;
    let keys: Vec<String> = (0..64).map(|i| format!("fail/{i:03}")).collect();
    for part in keys.chunks(8) {
        let values: Vec<Vec<u8>> = part.iter().map(|k| value(k)).collect();
        for (k, v) in part.iter().zip(&values) {
            c.put(k, v, &ReplicateConfig::default()).await.expect("put");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eventually(
        "the failed disk tier to be withdrawn",
        STARTUP,
        async || {
            let st = status(&c).await;
            (st.segments.len() == 1 && st.segments[0].info.tier == Tier::Memory).then_some(())
        },
    )
    .await;
    assert!(
        pool.store.stderr().contains("the disk tier is offline"),
        "{}",
        pool.store.stderr()
    );
    assert!(pool.store.try_exit().is_none(), "the store keeps running");
    // Whatever is still readable is exact; the rest is reported missing.
    let found = read_back(&c, &keys, "after the failure").await;
    assert!(found > 0, "memory still serves");
    // And memory still takes new objects. The read back just leased every
    // other object, so the full memory tier may evict the new one, the only
    // one without a lease, at once: then it is counted as evicted, never
    // served wrong.
    let v = value("after");
    let evicted = status(&c).await.evictions;
    c.put("after", &v, &ReplicateConfig::default())
        .await
        .expect("put");
    match c.get("after").await {
        Ok(got) => assert!(got == v, "wrong bytes"),
        Err(e) => {
            assert_eq!(e.code, Code::ObjectNotFound, "{e}");
            assert!(status(&c).await.evictions > evicted, "gone, not evicted");
        }
    }
}

/// A store that stops answering in the middle of demotions (paused longer
/// than `--tier-move-timeout`) has its moves given up. Their copies may
/// still land when it resumes, so the regions reserved for them are reused
/// only once the store has confirmed the moves' cancellation: nothing is
/// lost or damaged, and demotions go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_given_up_on_a_paused_store_never_land_on_other_objects() {
    let disk = disk_dir();
    let pool = TierPool::start_with(
        "16MiB",
        "96MiB",
        disk.path(),
        &["--tier-move-timeout", "1s"],
    )
    .await;
    let c = pool.client(Protocol::Tcp).await;
    let keys: Vec<String> = (0..144).map(|i| format!("paused/{i:03}")).collect();
    fill(&c, &keys[..32], 16).await;
    // 12 MiB of 16 in memory, over the 50% watermark, and the store paused
    // before the disk takes it.
    let written = pause_during_demotions(
        &pool,
        &c,
        &keys,
        32,
        "kvpool_tier_moves_given_up_total",
        Duration::from_secs(5),
    )
    .await;
    // Its cancellations cannot reach it either: those regions stay reserved.
    eventually(
        "cancellations owed to the paused store",
        STARTUP,
        async || {
            (master_metric(&pool, "kvpool_tier_moves_awaiting_cancel").await > 0).then_some(())
        },
    )
    .await;
    pool.store.freeze(false);
    eventually("the cancellations delivered", STARTUP, async || {
        (master_metric(&pool, "kvpool_tier_moves_awaiting_cancel").await == 0).then_some(())
    })
    .await;
    // Demotions go on, into regions the given-up moves had reserved among
    // others, and every object reads back byte-exact.
    fill(&c, &keys[written..], 16).await;
    let st = status(&c).await;
    assert_eq!(st.evictions, 0, "nothing was dropped");
    assert_eq!(read_back(&c, &keys, "after the pause").await, keys.len());
}

/// A master told to stop while its tier moves wait on a paused store
/// stops at once: a round of moves waits up to `--tier-move-timeout` (a
/// minute by default) and a leader that waited it out on SIGTERM held up
/// its replacement by as much (a chaos campaign's upgrade found it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_stops_without_waiting_for_moves_a_paused_store_holds() {
    let disk = disk_dir();
    let mut pool = TierPool::start("16MiB", "96MiB", disk.path()).await;
    let c = pool.client(Protocol::Tcp).await;
    let keys: Vec<String> = (0..96).map(|i| format!("stop/{i:03}")).collect();
    fill(&c, &keys[..32], 16).await;
    // Over the 50% watermark, then the store paused before the disk takes
    // it all.
    pause_during_demotions(
        &pool,
        &c,
        &keys,
        32,
        "kvpool_tier_moves_in_flight",
        Duration::from_secs(3),
    )
    .await;
    drop(c);
    let asked = std::time::Instant::now();
    pool.master.process.terminate();
    let exit = pool.master.process.wait_exit(Duration::from_secs(30)).await;
    let took = asked.elapsed();
    pool.store.freeze(false);
    assert!(exit.success(), "{exit:?}");
    assert!(
        took < Duration::from_secs(10),
        "the master took {took:?} to stop"
    );
}
