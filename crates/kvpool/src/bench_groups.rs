//! `kvpool bench-groups`: the pool-past-one-master prototype (docs/scaling.md)
//! measured. Through a [`GroupedClient`] it fills a grouped pool with
//! SGLang-shaped keys, prints how the keys spread over the groups and the
//! latency of single gets and puts, and then, with `--check`, runs a
//! verified workload: each worker upserts versions of its own keys and
//! reads each one back, and every answer is checked against what was
//! acknowledged (an acknowledged version is never lost or replaced by an
//! older one; no bytes that were never written). A group's leader can be
//! killed meanwhile (bench/groups.sh does); the run reports the calls that
//! failed and the longest time each group went without an acknowledged
//! write, and fails on any violation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use kvpool_client::groups::{parse_pool, publish_map, GroupedClient, SlotMap};
use kvpool_client::{ClientConfig, ReplicateConfig};
use kvpool_proto::units::{parse_duration, parse_size};
use kvpool_proto::Code;
use parking_lot::Mutex;

use crate::bench_meta::{key, us, KeyShape};

/// Flags of `kvpool bench-groups`.
#[derive(Args, Debug, Clone)]
pub struct BenchGroupsArgs {
    /// The grouped pool: `etcd://host:port[;host:port...]/NAME`.
    #[arg(long)]
    pub pool: String,
    /// Cluster ids of the groups, for a pool that has no slot map yet
    /// (slots split evenly; each group reached at `etcd://endpoints/ID`).
    #[arg(long, value_delimiter = ',')]
    pub groups: Vec<String>,
    /// Objects to fill the pool with (SGLang-shaped keys).
    #[arg(long, default_value = "100k", value_parser = crate::bench_meta::parse_count)]
    pub keys: u64,
    /// Bytes per value.
    #[arg(long, default_value = "64B", value_parser = parse_size)]
    pub value_size: u64,
    /// Keys per put batch while filling.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    /// Concurrent callers while filling and checking.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Single gets and single puts timed after the fill.
    #[arg(long, default_value_t = 5_000)]
    pub samples: usize,
    /// Run the verified workload for this long after the fill (0: none).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub check: Duration,
    /// Keys each checking worker owns.
    #[arg(long, default_value_t = 64)]
    pub check_keys: usize,
    #[command(flatten)]
    pub security: crate::cli::SecurityArgs,
}

/// The bytes the fill stores under key number `i`.
fn fill_value(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|b| (i as usize + b) as u8).collect()
}

/// The bytes of version `v` of `key`: the version, then a pattern that
/// depends on both, so a read of another key's or version's bytes shows.
fn versioned(key: &str, v: u64, len: usize) -> Vec<u8> {
    let seed = xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), v);
    let mut out = v.to_le_bytes().to_vec();
    out.extend((0..len.max(16) - 8).map(|b| (seed >> ((b % 8) * 8)) as u8 ^ b as u8));
    out
}

/// What a checking worker knows about one of its keys.
#[derive(Default)]
struct KeyModel {
    /// The last version acknowledged or seen read (0: none yet).
    acked: u64,
    /// Versions written since whose upsert failed: each may have landed.
    maybe: Vec<u64>,
    /// The next version to write.
    next: u64,
}

impl KeyModel {
    /// Checks a read's answer; `Err` says what rule it broke.
    fn read(&mut self, key: &str, got: Result<Vec<u8>, Code>, len: usize) -> Result<(), String> {
        let bytes = match got {
            Ok(b) => b,
            Err(Code::ObjectNotFound) if self.acked > 0 => {
                return Err(format!(
                    "{key}: version {} acknowledged, read not found",
                    self.acked
                ))
            }
            Err(_) => return Ok(()),
        };
        let v = bytes
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .unwrap_or(0);
        if bytes != versioned(key, v, len) {
            return Err(format!("{key}: {} bytes that no write wrote", bytes.len()));
        }
        if v == self.acked {
            Ok(())
        } else if self.maybe.contains(&v) && v > self.acked {
            // A failed write landed: from now on it is the floor.
            self.acked = v;
            self.maybe.retain(|&m| m > v);
            Ok(())
        } else {
            Err(format!(
                "{key}: read version {v}, acknowledged {}",
                self.acked
            ))
        }
    }
}

/// What the checking workers saw.
struct Seen {
    ops: u64,
    acked_writes: u64,
    failed_calls: u64,
    violations: Vec<String>,
    /// Per group: its last acknowledged write (the start before the first)
    /// and its longest time without one.
    last_ack: Vec<Instant>,
    longest_gap: Vec<Duration>,
}

impl Seen {
    fn new(groups: usize, start: Instant) -> Seen {
        Seen {
            ops: 0,
            acked_writes: 0,
            failed_calls: 0,
            violations: Vec::new(),
            last_ack: vec![start; groups],
            longest_gap: vec![Duration::ZERO; groups],
        }
    }

    /// Measures `group`'s time without an acknowledged write up to `at`
    /// (a write acknowledged then, or the end of the run).
    fn mark(&mut self, group: usize, at: Instant) {
        let since = at - std::mem::replace(&mut self.last_ack[group], at);
        self.longest_gap[group] = self.longest_gap[group].max(since);
    }
}

/// Runs the benchmark; false if the check found a violation.
pub async fn run(a: BenchGroupsArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        a.batch >= 1 && a.concurrency >= 1 && a.check_keys >= 1,
        "--batch, --concurrency and --check-keys must be at least 1"
    );
    let mut cfg = ClientConfig::new("");
    cfg.hostname = "kvpool-bench-groups".into();
    cfg.security = a.security.to_security()?;
    let pool = if a.groups.is_empty() {
        GroupedClient::connect(&a.pool, cfg).await?
    } else {
        let (endpoints, _) = parse_pool(&a.pool)?;
        let masters = a
            .groups
            .iter()
            .map(|g| format!("etcd://{endpoints}/{g}"))
            .collect();
        let map = publish_map(&a.pool, &SlotMap::even(masters)?).await?;
        GroupedClient::with_map(map, cfg).await?
    };
    let pool = Arc::new(pool);
    let map = pool.map();
    println!(
        "kvpool bench-groups: {} group(s), slots {:?}, map epoch {}",
        map.groups.len(),
        map.slots_per_group(),
        map.epoch
    );
    let len = a.value_size as usize;

    if a.keys > 0 {
        fill_and_time(&pool, &a, len).await?;
    }
    if a.check.is_zero() {
        pool.close().await;
        return Ok(true);
    }
    let ok = check(&pool, &a, len).await?;
    pool.close().await;
    Ok(ok)
}

/// Fills the pool and times single gets and puts.
async fn fill_and_time(
    pool: &Arc<GroupedClient>,
    a: &BenchGroupsArgs,
    len: usize,
) -> anyhow::Result<()> {
    let rc = ReplicateConfig::default();
    // Fill: each caller takes every `concurrency`-th batch.
    let t = Instant::now();
    let mut callers = Vec::new();
    for c in 0..a.concurrency as u64 {
        let (pool, rc) = (pool.clone(), rc.clone());
        let (n, batch, step) = (a.keys, a.batch as u64, a.concurrency as u64);
        callers.push(tokio::spawn(async move {
            let mut from = c * batch;
            while from < n {
                let to = (from + batch).min(n);
                let keys: Vec<String> = (from..to).map(|i| key(KeyShape::Sglang, 0, i)).collect();
                let values: Vec<Vec<u8>> = (from..to).map(|i| fill_value(i, len)).collect();
                let items: Vec<(&str, &[u8])> = (keys.iter().map(String::as_str))
                    .zip(values.iter().map(Vec::as_slice))
                    .collect();
                for (k, r) in keys
                    .iter()
                    .zip(pool.batch_put_values(&items, &rc, false).await)
                {
                    r.map_err(|e| anyhow::anyhow!("put of {k}: {e}"))?;
                }
                from += batch * step;
            }
            anyhow::Ok(())
        }));
    }
    for c in callers {
        c.await??;
    }
    let fill = t.elapsed();
    println!(
        "fill: {} keys in {:.1} s, {:.0} keys/s",
        a.keys,
        fill.as_secs_f64(),
        a.keys as f64 / fill.as_secs_f64()
    );
    let mut per_group = Vec::new();
    for g in 0..pool.map().groups.len() {
        per_group.push(pool.group(g).status().await?.keys);
    }
    println!("keys per group: {per_group:?}");

    // Single calls, one at a time.
    let mut get = Histogram::<u64>::new(3)?;
    let mut put = Histogram::<u64>::new(3)?;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for s in 0..a.samples {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = x % a.keys.max(1);
        let k = key(KeyShape::Sglang, 0, i);
        let t = Instant::now();
        let v = pool.get(&k).await;
        get.record(t.elapsed().as_nanos() as u64)?;
        anyhow::ensure!(v? == fill_value(i, len), "{k} read back other bytes");
        let k = format!("probe-{s}-{k}");
        let t = Instant::now();
        pool.put(&k, &fill_value(i, len), &rc).await?;
        put.record(t.elapsed().as_nanos() as u64)?;
        pool.remove(&k, true).await?;
    }
    println!(
        "single get p50 / p99: {:.0} / {:.0} µs; single put p50 / p99: {:.0} / {:.0} µs",
        us(&get, 0.5),
        us(&get, 0.99),
        us(&put, 0.5),
        us(&put, 0.99)
    );
    Ok(())
}

/// The verified workload, then a final read of every key.
async fn check(pool: &Arc<GroupedClient>, a: &BenchGroupsArgs, len: usize) -> anyhow::Result<bool> {
    let start = Instant::now();
    let seen = Arc::new(Mutex::new(Seen::new(pool.map().groups.len(), start)));
    let mut workers = Vec::new();
    for w in 0..a.concurrency {
        let (pool, seen, check, nkeys) = (pool.clone(), seen.clone(), a.check, a.check_keys);
        workers.push(tokio::spawn(async move {
            // A worker's keys are all in one group, so a group that stops
            // answering holds up only its own workers.
            let group = w % pool.map().groups.len();
            let keys: Vec<String> = (0..)
                .map(|j| format!("check-{w}-{j}"))
                .filter(|k| pool.map().group_of(k) == group)
                .take(nkeys)
                .collect();
            let mut model: Vec<KeyModel> = (0..nkeys).map(|_| KeyModel::default()).collect();
            let rc = ReplicateConfig::default();
            let mut j = 0;
            while start.elapsed() < check {
                let (k, m) = (&keys[j], &mut model[j]);
                m.next += 1;
                let v = m.next;
                let wrote = pool.upsert(k, &versioned(k, v, len), &rc).await;
                let got = pool.get(k).await.map_err(|e| e.code);
                let mut s = seen.lock();
                s.ops += 2;
                match wrote {
                    Ok(()) => {
                        m.acked = v;
                        m.maybe.clear();
                        s.acked_writes += 1;
                        s.mark(group, Instant::now());
                    }
                    Err(_) => {
                        m.maybe.push(v);
                        s.failed_calls += 1;
                    }
                }
                if got.is_err() {
                    s.failed_calls += 1;
                }
                if let Err(v) = m.read(k, got, len) {
                    s.violations
                        .push(format!("at {:.2} s: {v}", start.elapsed().as_secs_f64()));
                }
                j = (j + 1) % nkeys;
            }
            (keys, model)
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.push(w.await?);
    }
    let end = Instant::now();
    // Every key read once more, retried while its group is unavailable.
    let mut unreadable = 0;
    for (keys, mut model) in all {
        for (k, m) in keys.iter().zip(&mut model) {
            let deadline = Instant::now() + Duration::from_secs(20);
            let got = loop {
                let got = pool.get(k).await.map_err(|e| e.code);
                match got {
                    Err(c) if c != Code::ObjectNotFound && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    got => break got,
                }
            };
            if matches!(got, Err(c) if c != Code::ObjectNotFound) {
                unreadable += 1;
            }
            if let Err(v) = m.read(k, got, len) {
                seen.lock().violations.push(format!("final read: {v}"));
            }
        }
    }
    let mut s = seen.lock();
    for g in 0..pool.map().groups.len() {
        s.mark(g, end);
    }
    println!(
        "check: {:.1} s, {} calls, {} acknowledged writes, {} failed calls, {} keys unreadable at the end, {} violation(s)",
        (end - start).as_secs_f64(),
        s.ops,
        s.acked_writes,
        s.failed_calls,
        unreadable,
        s.violations.len()
    );
    let gaps: Vec<String> = (s.longest_gap.iter().enumerate())
        .map(|(g, d)| format!("group {g} {:.2} s", d.as_secs_f64()))
        .collect();
    println!(
        "longest time without an acknowledged write: {}",
        gaps.join(", ")
    );
    for v in s.violations.iter().take(20) {
        println!("violation: {v}");
    }
    Ok(s.violations.is_empty() && unreadable == 0)
}
