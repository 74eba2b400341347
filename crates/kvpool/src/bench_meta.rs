//! `kvpool bench-meta`: the master's metadata alone, in this process, with
//! no data bytes and no network. It fills a `MasterState` with N objects
//! through batched put start/end (as `PutStart`/`PutEnd` requests do) and,
//! at each checkpoint, prints the resident memory per object and the
//! latency of single gets and puts, so how memory and latency grow with the
//! key count is measured up to 100M keys on one machine. With
//! `--recovery` it times a new leader reconciling one store's inventory
//! instead.

use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use kvpool_master::state::{ClientLimits, MasterState, StateConfig};
use kvpool_proto::limits::MAX_BATCH_KEYS;
use kvpool_proto::msg::{
    ClientId, InventoryItem, InventoryVerdict, PutEndItem, PutGrant, PutItem, ReplicateConfig,
    SegmentId, SegmentInfo,
};
use kvpool_proto::units::parse_size;

/// Flags of `kvpool bench-meta`.
#[derive(Args, Debug, Clone)]
pub struct BenchMetaArgs {
    /// Objects to fill up to; checkpoints are printed on the way.
    #[arg(long, default_value = "10M", value_parser = parse_count)]
    pub keys: u64,
    /// Key counts at which to measure (default: 10k, then every power of ten, and the end).
    #[arg(long, value_delimiter = ',', value_parser = parse_count)]
    pub checkpoints: Vec<u64>,
    /// Bytes per key of the `plain` shape (zero-padded numbers with a prefix).
    #[arg(long, default_value_t = 32)]
    pub key_len: usize,
    /// How keys are named: `plain`, or as an engine names its objects
    /// (bench/engine_keys.py), over a SHA-256 digest of the key's number.
    #[arg(long, value_enum, default_value_t = KeyShape::Plain)]
    pub key_shape: KeyShape,
    /// Replicas per object (one segment each).
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Segments the objects are placed over, as many stores would lend
    /// them (default: one per replica).
    #[arg(long)]
    pub segments: Option<u32>,
    /// Value bytes per object (decides only region sizes).
    #[arg(long, default_value = "64B", value_parser = parse_size)]
    pub value_size: u64,
    /// Keys per put batch while filling.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    /// Single gets and single puts timed at each checkpoint.
    #[arg(long, default_value_t = 20_000)]
    pub samples: usize,
    /// Instead of filling, time what sets a failover's length: a new
    /// leader taking one store's inventory of `--keys` objects, in parts as
    /// a store sends it, and reconciling it on the last part.
    #[arg(long)]
    pub recovery: bool,
}

/// Names of the keys a fill puts.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyShape {
    /// `k-000…N`, `--key-len` bytes.
    Plain,
    /// SGLang's HiCache Mooncake backend: `{model}_{sha256 hex}_0_k` and `_v` (101 bytes).
    Sglang,
    /// vLLM's Mooncake store connector: `{model}@tp_rank:0@…@group:0@{sha256 hex}` (135 bytes).
    Vllm,
    /// kvpool's LMCache adapter: `lmcache/{model}@00000000@0@{sha256 hex}` (116 bytes).
    Lmcache,
}

/// The model name in engine-shaped keys.
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// Lowercase hex of SHA-256 over `i`'s little-endian bytes.
fn digest(i: u64) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(i.to_le_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Counts with an optional k/M/G suffix (powers of ten).
pub(crate) fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1_000),
        Some('m' | 'M') => (&s[..s.len() - 1], 1_000_000),
        Some('g' | 'G') => (&s[..s.len() - 1], 1_000_000_000),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mul)
        .map_err(|e| format!("{s:?}: {e}"))
}

/// CPU time this thread has used: unlike wall time, it does not count the
/// time another process had the core.
/// This thread's CPU time so far (to the nanosecond), the part of it in the
/// kernel (split by the kernel's tick samples), and the page faults it took
/// (minor and major together).
fn thread_usage() -> (Duration, Duration, u64) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    // SAFETY: an all-zero `rusage` is a valid value, and a valid out-pointer
    // for the duration of the call.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let sys = Duration::new(ru.ru_stime.tv_sec as u64, ru.ru_stime.tv_usec as u32 * 1000);
    let faults = (ru.ru_minflt + ru.ru_majflt) as u64;
    (
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32),
        sys,
        faults,
    )
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Key number `i` of a fill in `shape` (`plain` keys are `key_len` bytes).
pub(crate) fn key(shape: KeyShape, key_len: usize, i: u64) -> String {
    match shape {
        KeyShape::Plain => {
            let digits = key_len.saturating_sub(2).max(1);
            format!("k-{i:0digits$}")
        }
        // Two objects (K and V) per page.
        KeyShape::Sglang => format!(
            "{}_{}_0_{}",
            MODEL.replace('/', "-"),
            digest(i / 2),
            if i.is_multiple_of(2) { 'k' } else { 'v' }
        ),
        KeyShape::Vllm => format!(
            "{MODEL}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{}",
            digest(i)
        ),
        KeyShape::Lmcache => format!("lmcache/{MODEL}@00000000@0@{}", digest(i)),
    }
}

/// What puts cost in the master's calls alone (making keys not counted).
#[derive(Default)]
struct Spent {
    /// Wall time in `put_start` and `put_end`.
    wall: Duration,
    /// The most CPU time of this thread one of those calls took, how much
    /// of it was in the kernel, and the page faults it took: a long call
    /// spent in the kernel is the machine's (faults, reclaim), not the
    /// master's code.
    longest: (Duration, Duration, u64),
}

impl Spent {
    /// Runs one master call, counting it.
    fn time<T>(&mut self, call: impl FnOnce() -> T) -> T {
        let (w, (cpu, sys, faults)) = (Instant::now(), thread_usage());
        let out = call();
        let (cpu2, sys2, faults2) = thread_usage();
        if cpu2 - cpu > self.longest.0 {
            self.longest = (cpu2 - cpu, sys2 - sys, faults2 - faults);
        }
        self.wall += w.elapsed();
        out
    }
}

struct Filler {
    st: MasterState,
    client: ClientId,
    key_len: usize,
    key_shape: KeyShape,
    value_len: u64,
    region_len: u64,
    rc: ReplicateConfig,
}

impl Filler {
    fn key(&self, i: u64) -> String {
        key(self.key_shape, self.key_len, i)
    }

    fn now(&self) -> tokio::time::Instant {
        tokio::time::Instant::from_std(Instant::now())
    }

    /// Puts keys `from..to` in batches.
    fn put_range(&self, from: u64, to: u64, batch: usize) -> anyhow::Result<Spent> {
        let mut spent = Spent::default();
        let mut i = from;
        while i < to {
            let n = (to - i).min(batch as u64);
            let items: Vec<PutItem> = (i..i + n)
                .map(|k| PutItem {
                    key: self.key(k),
                    value_len: self.value_len,
                    region_len: self.region_len,
                })
                .collect();
            let grants = spent
                .time(|| (self.st).put_start(self.client, &items, &self.rc, false, self.now()));
            let mut ends = Vec::with_capacity(items.len());
            for (item, g) in items.into_iter().zip(grants) {
                match g {
                    Ok(PutGrant::Write { generation, .. }) => ends.push(PutEndItem {
                        key: item.key,
                        generation,
                    }),
                    Ok(PutGrant::Exists) => {}
                    Err(e) => anyhow::bail!("put of {} refused: {e}", item.key),
                }
            }
            for r in spent.time(|| self.st.put_end(self.client, &ends, self.now())) {
                r?;
            }
            i += n;
        }
        Ok(spent)
    }
}

/// Quantile `q` of a histogram of nanoseconds, in microseconds.
pub(crate) fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// A new leader taking one store's inventory of `a.keys` objects, and
/// what the reconcile on its last part costs.
fn recovery(a: &BenchMetaArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.keys > 0, "--recovery needs --keys of at least 1");
    let st = MasterState::new(StateConfig::default());
    let client = ClientId(1);
    let now = tokio::time::Instant::now();
    st.register_client(client, "bench-meta", now)?;
    let key_len = key(a.key_shape, a.key_len, 0).len();
    let region_len = (a.value_size + 64 + key_len as u64).div_ceil(64) * 64;
    let info = SegmentInfo {
        id: SegmentId(1),
        name: "seg-0".into(),
        endpoint: "10.0.0.1:1".into(),
        base: 4096,
        size: a.keys * region_len,
        path: None,
        tier: Default::default(),
    };
    st.mount(client, info, a.keys, now)
        .map_err(|e| anyhow::anyhow!("mount: {e}"))?;
    println!(
        "bench-meta --recovery: one store's inventory of {} keys of {} B ({:?})",
        a.keys, key_len, a.key_shape
    );
    let before = rss();
    // Every part but the last only queues its items; the last reconciles.
    let (mut parts, mut took) = (Duration::ZERO, Duration::ZERO);
    let mut v = InventoryVerdict::default();
    let mut i = 0;
    while i < a.keys {
        let n = (a.keys - i).min(MAX_BATCH_KEYS as u64);
        let items: Vec<InventoryItem> = (i..i + n)
            .map(|k| InventoryItem {
                key: key(a.key_shape, a.key_len, k),
                generation: k + 1,
                value_len: a.value_size,
                offset: 4096 + k * region_len,
                region_len,
            })
            .collect();
        i += n;
        let last = i == a.keys;
        let t = Instant::now();
        v = st
            .report_objects(client, SegmentId(1), items, last, now)
            .map_err(|e| anyhow::anyhow!("inventory: {e}"))?;
        *(if last { &mut took } else { &mut parts }) += t.elapsed();
    }
    anyhow::ensure!(
        v.accepted == a.keys && v.rejected.is_empty(),
        "{} objects accepted and {} rejected of {}",
        v.accepted,
        v.rejected.len(),
        a.keys
    );
    println!(
        "parts before the last: {:.2} s; the last part's reconcile: {:.2} s, {:.2} µs per object; {:.1} MiB more resident",
        parts.as_secs_f64(),
        took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / a.keys as f64,
        rss().saturating_sub(before) as f64 / (1 << 20) as f64
    );
    Ok(())
}

/// Runs the benchmark and prints one row per checkpoint.
pub fn run(a: BenchMetaArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.key_len >= 4, "--key-len must be at least 4");
    anyhow::ensure!(a.replicas >= 1, "--replicas must be at least 1");
    if a.recovery {
        return recovery(&a);
    }
    let mut checkpoints = if a.checkpoints.is_empty() {
        let mut v = vec![10_000];
        let mut p = 100_000;
        while p < a.keys {
            v.push(p);
            p *= 10;
        }
        v
    } else {
        a.checkpoints.clone()
    };
    checkpoints.retain(|&c| c < a.keys);
    checkpoints.push(a.keys);

    let segments = a.segments.unwrap_or(a.replicas);
    anyhow::ensure!(
        segments >= a.replicas,
        "--segments {segments} is fewer than --replicas {}",
        a.replicas
    );
    let before = rss();
    let st = MasterState::new(StateConfig {
        // Never evict: the segments are far larger than the fill.
        high_watermark: 1.0,
        lease_ttl: Duration::from_millis(1),
        // One client lends them all here, as many stores would.
        limits: ClientLimits {
            max_segments_per_client: segments as usize,
            ..Default::default()
        },
        ..StateConfig::default()
    });
    let client = ClientId(1);
    let now = tokio::time::Instant::now();
    st.register_client(client, "bench-meta", now)?;
    let key_len = key(a.key_shape, a.key_len, 0).len();
    // Room for every region many times over; the master never touches it.
    let region_len = (a.value_size + 64 + key_len as u64).div_ceil(64) * 64;
    let size = (a.keys + a.samples as u64 * (checkpoints.len() as u64 + 1)) * region_len * 2;
    for s in 0..segments {
        let info = SegmentInfo {
            id: SegmentId(u128::from(s) + 1),
            name: format!("seg-{s}"),
            endpoint: format!("10.0.{}.{}:1", s / 256, s % 256),
            base: 4096,
            size,
            path: None,
            tier: Default::default(),
        };
        st.mount(client, info, 0, now)
            .map_err(|e| anyhow::anyhow!("mount: {e}"))?;
    }
    let f = Filler {
        st,
        client,
        key_len: a.key_len,
        key_shape: a.key_shape,
        value_len: a.value_size,
        region_len,
        rc: ReplicateConfig {
            replica_num: a.replicas,
            ..Default::default()
        },
    };
    println!(
        "bench-meta: {} keys of {} B ({:?}), {} replica(s) over {segments} segment(s), {} B values, batches of {}",
        a.keys, key_len, a.key_shape, a.replicas, a.value_size, a.batch
    );
    println!(
        "{:>12} {:>10} {:>9} {:>11} {:>11} {:>11} {:>11} {:>13} {:>14} {:>9} {:>7}",
        "keys",
        "rss MiB",
        "B/key",
        "get p50 µs",
        "get p99 µs",
        "put p50 µs",
        "put p99 µs",
        "batch put/s",
        "longest cpu ms",
        "of it sys",
        "faults"
    );
    let mut filled = 0;
    let mut extra = 1u64 << 62;
    for &cp in &checkpoints {
        let fill = f.put_range(filled, cp, a.batch)?;
        let rate = (cp - filled) as f64 / fill.wall.as_secs_f64();
        filled = cp;
        let mem = rss().saturating_sub(before);
        // Single gets of random existing keys, single puts of new keys
        // (removed again so the key count stays at the checkpoint).
        let mut get = Histogram::<u64>::new(3)?;
        let mut put = Histogram::<u64>::new(3)?;
        let mut x = cp.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..a.samples {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = f.key(x % cp);
            let t = Instant::now();
            let r = f.st.get_replica_list(std::slice::from_ref(&key), f.now());
            get.record(t.elapsed().as_nanos() as u64)?;
            anyhow::ensure!(r[0].is_ok(), "get of {key} failed: {:?}", r[0]);
        }
        let mut fresh = Vec::with_capacity(a.samples);
        for _ in 0..a.samples {
            let one = f.put_range(extra, extra + 1, 1)?;
            put.record(one.wall.as_nanos() as u64)?;
            fresh.push(f.key(extra));
            extra += 1;
        }
        for r in f.st.remove(&fresh, true, f.now()) {
            r.map_err(|e| anyhow::anyhow!("remove: {e}"))?;
        }
        // No stores here: count the queued invalidations as delivered.
        let (_, through) = f.st.take_invalidations();
        f.st.invalidations_sent(through);
        println!(
            "{:>12} {:>10.1} {:>9.1} {:>11.2} {:>11.2} {:>11.2} {:>11.2} {:>13.0} {:>14.2} {:>9.2} {:>7}",
            cp,
            mem as f64 / (1 << 20) as f64,
            mem as f64 / cp as f64,
            us(&get, 0.5),
            us(&get, 0.99),
            us(&put, 0.5),
            us(&put, 0.99),
            rate,
            fill.longest.0.as_secs_f64() * 1e3,
            fill.longest.1.as_secs_f64() * 1e3,
            fill.longest.2,
        );
    }
    Ok(())
}
