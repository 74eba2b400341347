//! `kvpool bench`: a load generator over the Rust client. For each value size
//! it runs each requested operation for a fixed time with N concurrent
//! workers, prints progress every second, and ends with a table of items/s,
//! GB/s and per-call p50/p99. Gets read keys written by the put phase, from
//! the most recent ones that fit in half the pool, so hits are expected; a
//! miss is counted apart from an error. With `--keys N` the keyspace is fixed
//! and shared between runs, so a later `--ops get` run reports the hit rate
//! on what an earlier run wrote (across restarts and upgrades).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use kvpool_client::{Client, ClientConfig, GetInto, ReplicateConfig};
use kvpool_proto::units::{parse_duration, parse_size};
use kvpool_proto::Code;
use parking_lot::Mutex;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Master RPC address host:port.
    #[arg(long, env = "KVPOOL_MASTER", default_value = "127.0.0.1:50051")]
    pub master: String,
    /// Value sizes, comma-separated (e.g. 4KiB,512KiB,4MiB).
    #[arg(long, default_value = "4KiB,64KiB,512KiB,4MiB", value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Vec<u64>,
    /// Operations in order, comma-separated: put, get.
    #[arg(long, default_value = "put,get", value_delimiter = ',')]
    pub ops: Vec<String>,
    /// Keys per call (1 = single-key calls).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Concurrent workers.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Time per (operation, size).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Replicas per put.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Key prefix (a random suffix keeps runs apart, unless --keys is set).
    #[arg(long, default_value = "bench")]
    pub prefix: String,
    /// Use a fixed keyspace of this many keys per size, `<prefix>-<size>-<i>`,
    /// so one run can read what an earlier one wrote (hit-rate checks across
    /// restarts and upgrades). Puts cycle through it; gets pick at random.
    #[arg(long)]
    pub keys: Option<u64>,
    /// Leave the keys in the pool at the end (default: remove them).
    #[arg(long)]
    pub keep: bool,
    /// Transport for object bytes: tcp, shm (same host), or auto.
    #[arg(long, default_value = "auto")]
    pub protocol: String,
    /// Hedge slow reads of replicated objects (off by default, as in the
    /// client; to measure what hedging costs or saves).
    #[arg(long)]
    pub hedge: bool,
    /// Calls per second over all workers, evenly paced (0: as fast as they
    /// go), to measure latency at a load the pool sustains.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    #[command(flatten)]
    pub security: crate::cli::SecurityArgs,
}

/// Which keys a phase writes and reads.
#[derive(Clone)]
struct KeySpace {
    prefix: String,
    /// A fixed keyspace of this many keys, or a moving one.
    fixed: Option<u64>,
    /// Moving keyspace: gets read among each worker's last `window` keys,
    /// which fit in half the pool, so they are expected to hit.
    window: u64,
    /// Keys issued per worker so far.
    written: Arc<Vec<AtomicU64>>,
}

impl KeySpace {
    fn key(&self, worker: usize, n: u64) -> String {
        match self.fixed {
            Some(_) => format!("{}-{n}", self.prefix),
            None => format!("{}-{worker}-{n}", self.prefix),
        }
    }

    /// The next `batch` keys worker `w` puts.
    fn put_keys(&self, w: usize, batch: usize) -> Vec<String> {
        let workers = self.written.len() as u64;
        let n0 = self.written[w].fetch_add(batch as u64, Ordering::Relaxed);
        (n0..n0 + batch as u64)
            .map(|j| match self.fixed {
                Some(n) => self.key(w, (j * workers + w as u64) % n),
                None => self.key(w, j),
            })
            .collect()
    }

    /// A key a get should find.
    fn get_key(&self) -> String {
        if let Some(n) = self.fixed {
            return self.key(0, rand::random::<u64>() % n.max(1));
        }
        let w = rand::random::<usize>() % self.written.len();
        let hi = self.written[w].load(Ordering::Relaxed);
        let lo = hi.saturating_sub(self.window);
        let n = if hi > lo {
            lo + rand::random::<u64>() % (hi - lo)
        } else {
            0
        };
        self.key(w, n)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Put,
    Get,
}

struct Row {
    op: Op,
    size: u64,
    items: u64,
    bytes: u64,
    errors: u64,
    misses: u64,
    secs: f64,
    p50_us: f64,
    p99_us: f64,
}

/// Shared counters of one phase.
#[derive(Default)]
struct Progress {
    items: AtomicU64,
    errors: AtomicU64,
    misses: AtomicU64,
}

/// Runs the benchmark; returns false if any call failed.
pub async fn run(a: BenchArgs) -> anyhow::Result<bool> {
    let ops: Vec<Op> = a
        .ops
        .iter()
        .map(|o| match o.trim() {
            "put" => Ok(Op::Put),
            "get" => Ok(Op::Get),
            other => Err(anyhow::anyhow!("unknown op {other:?} (put, get)")),
        })
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(
        a.batch >= 1 && a.concurrency >= 1,
        "batch and concurrency must be at least 1"
    );
    let mut cfg = ClientConfig::new(&a.master);
    cfg.hostname = "kvpool-bench".into();
    cfg.conns_per_store = a.concurrency.max(4);
    cfg.protocol = a.protocol.parse()?;
    cfg.hedge_reads = a.hedge;
    cfg.security = a.security.to_security()?;
    let client = Client::connect(cfg)
        .await
        .map_err(|e| anyhow::anyhow!("connect {}: {e}", a.master))?;
    let status = client.status().await?;
    anyhow::ensure!(
        !status.segments.is_empty(),
        "the pool has no segments mounted"
    );
    anyhow::ensure!(a.keys != Some(0), "--keys must be at least 1");
    anyhow::ensure!(
        a.rate.is_finite() && a.rate >= 0.0,
        "--rate must be a number of calls per second, or 0"
    );
    // A fixed keyspace is shared across runs; a moving one is this run's own.
    let run = match a.keys {
        Some(_) => a.prefix.clone(),
        None => format!("{}-{:08x}", a.prefix, rand::random::<u32>()),
    };
    let rc = ReplicateConfig {
        replica_num: a.replicas,
        ..Default::default()
    };
    println!(
        "kvpool bench: master {} · {} segment(s), {} · batch {} · concurrency {} · {:?} per phase · protocol {}",
        a.master,
        status.segments.len(),
        crate::cli::human(status.capacity),
        a.batch,
        a.concurrency,
        a.duration,
        a.protocol
    );
    let mut rows = Vec::new();
    for &size in &a.sizes {
        // Keys per worker that fit in half the pool, so gets are expected to hit.
        let footprint = (size + 128) * a.replicas.max(1) as u64;
        let window = ((status.capacity / 2) / footprint / a.concurrency as u64).max(1);
        let space = KeySpace {
            prefix: format!("{run}-{size}"),
            fixed: a.keys,
            window,
            written: Arc::new((0..a.concurrency).map(|_| AtomicU64::new(0)).collect()),
        };
        for &op in &ops {
            rows.push(phase(&client, &a, op, size, &space, &rc).await);
        }
        if !a.keep {
            // Start each size on an empty pool, as bench_store.py does.
            let _ = client
                .remove_by_regex(&format!("^{}-", regex_escape(&space.prefix)), true)
                .await;
        }
    }
    client.close().await;
    println!();
    println!(
        "{:<4} {:>8} {:>5} {:>5} {:>11} {:>8} {:>10} {:>10} {:>7} {:>7}",
        "op", "size", "batch", "conc", "items/s", "GB/s", "p50 us", "p99 us", "errors", "misses"
    );
    for r in &rows {
        println!(
            "{:<4} {:>8} {:>5} {:>5} {:>11.0} {:>8.3} {:>10.1} {:>10.1} {:>7} {:>7}",
            if r.op == Op::Put { "put" } else { "get" },
            crate::cli::human(r.size)
                .replace(".0 ", "")
                .replace(' ', ""),
            a.batch,
            a.concurrency,
            r.items as f64 / r.secs,
            r.bytes as f64 / r.secs / 1e9,
            r.p50_us,
            r.p99_us,
            r.errors,
            r.misses
        );
    }
    for r in rows.iter().filter(|r| r.op == Op::Get) {
        let asked = r.items + r.misses;
        println!(
            "get {} hit rate {:.2}% ({} hits, {} misses)",
            crate::cli::human(r.size),
            if asked > 0 {
                100.0 * r.items as f64 / asked as f64
            } else {
                0.0
            },
            r.items,
            r.misses
        );
    }
    Ok(rows.iter().all(|r| r.errors == 0))
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                vec![c]
            } else {
                vec!['\\', c]
            }
        })
        .collect()
}

async fn phase(
    client: &Client,
    a: &BenchArgs,
    op: Op,
    size: u64,
    space: &KeySpace,
    rc: &ReplicateConfig,
) -> Row {
    let progress = Arc::new(Progress::default());
    let hist = Arc::new(Mutex::new(
        Histogram::<u64>::new(3).expect("valid histogram precision"),
    ));
    let start = Instant::now();
    let deadline = start + a.duration;
    let mut workers = Vec::new();
    for w in 0..a.concurrency {
        let client = client.clone();
        let progress = progress.clone();
        let hist = hist.clone();
        let space = space.clone();
        let rc = rc.clone();
        let batch = a.batch;
        // Each worker's share of the rate, staggered so calls spread evenly.
        let pace = (a.rate > 0.0).then(|| Duration::from_secs_f64(a.concurrency as f64 / a.rate));
        let mut next = tokio::time::Instant::now()
            + pace.map_or(Duration::ZERO, |p| {
                p.mul_f64(w as f64 / a.concurrency as f64)
            });
        workers.push(tokio::spawn(async move {
            let value: Vec<u8> = (0..size).map(|i| (i as u8) ^ (w as u8)).collect();
            let mut bufs: Vec<Vec<u8>> = (0..batch).map(|_| vec![0u8; size as usize]).collect();
            let mut local = Histogram::<u64>::new(3).expect("valid histogram precision");
            while Instant::now() < deadline {
                if let Some(pace) = pace {
                    tokio::time::sleep_until(next).await;
                    next += pace;
                }
                let t = Instant::now();
                match op {
                    Op::Put => {
                        let keys = space.put_keys(w, batch);
                        let parts: [&[u8]; 1] = [&value];
                        let items: Vec<(&str, &[&[u8]])> =
                            keys.iter().map(|k| (k.as_str(), &parts[..])).collect();
                        let res = client.batch_put(&items, &rc, false).await;
                        let mut errs = 0;
                        for e in res.iter().filter_map(|r| r.as_ref().err()) {
                            if progress.errors.fetch_add(1, Ordering::Relaxed) < 3 {
                                eprintln!("put error: {e}");
                            }
                            errs += 1;
                        }
                        progress
                            .items
                            .fetch_add(batch as u64 - errs, Ordering::Relaxed);
                    }
                    Op::Get => {
                        let keys: Vec<String> = (0..batch).map(|_| space.get_key()).collect();
                        let mut items = GetInto::each(&keys, &mut bufs);
                        let res = client.batch_get_into(&mut items).await;
                        for r in res {
                            match r {
                                Ok(_) => progress.items.fetch_add(1, Ordering::Relaxed),
                                Err(e) if e.code == Code::ObjectNotFound => {
                                    progress.misses.fetch_add(1, Ordering::Relaxed)
                                }
                                Err(e) => {
                                    if progress.errors.fetch_add(1, Ordering::Relaxed) < 3 {
                                        eprintln!("get error: {e}");
                                    }
                                    0
                                }
                            };
                        }
                    }
                }
                let _ = local.record(t.elapsed().as_nanos() as u64);
            }
            let _ = hist.lock().add(&local);
        }));
    }
    let name = format!(
        "{} {}",
        if op == Op::Put { "put" } else { "get" },
        crate::cli::human(size)
    );
    let ticker = {
        let progress = progress.clone();
        tokio::spawn(async move {
            let mut last = 0;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let items = progress.items.load(Ordering::Relaxed);
                eprintln!(
                    "[{name}] {:>4.0}s {:>9} items/s {:>7.3} GB/s  errors {}  misses {}",
                    start.elapsed().as_secs_f64(),
                    items - last,
                    (items - last) as f64 * size as f64 / 1e9,
                    progress.errors.load(Ordering::Relaxed),
                    progress.misses.load(Ordering::Relaxed)
                );
                last = items;
            }
        })
    };
    for w in workers {
        let _ = w.await;
    }
    ticker.abort();
    let secs = start.elapsed().as_secs_f64();
    let h = hist.lock();
    let items = progress.items.load(Ordering::Relaxed);
    Row {
        op,
        size,
        items,
        bytes: items * size,
        errors: progress.errors.load(Ordering::Relaxed),
        misses: progress.misses.load(Ordering::Relaxed),
        secs,
        p50_us: h.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
    }
}
