//! `kvpool bench-reuse`: how much of a KV-cache workload the pool serves,
//! the way an inference engine uses it: look a page up, read it on a hit,
//! recompute and store it on a miss. Two access patterns:
//!
//! - `zipf`: pages drawn from a Zipf-like distribution over a fixed working
//!   set (a few prefixes are hot, most are lukewarm);
//! - `turns`: multi-turn chat: conversations advance a turn at a time, each
//!   turn re-reading every page of the turns before it and adding its own.
//!
//! It prints the hit rate and the read latency of hits by the tier they
//! were served from, so a pool with a disk tier can be compared with the
//! same memory alone on the same working set.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use kvpool_client::{Client, ClientConfig, ReplicateConfig};
use kvpool_proto::msg::Tier;
use kvpool_proto::units::{parse_duration, parse_size};
use kvpool_proto::Code;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};

/// Flags of `kvpool bench-reuse`.
#[derive(Args, Debug, Clone)]
pub struct BenchReuseArgs {
    /// Master RPC address host:port.
    #[arg(long, env = "KVPOOL_MASTER", default_value = "127.0.0.1:50051")]
    pub master: String,
    /// `zipf` or `turns`.
    #[arg(long, default_value = "zipf")]
    pub pattern: String,
    /// Bytes per page.
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    pub page_size: u64,
    /// Working set in bytes: `zipf` draws from this many bytes of pages;
    /// `turns` keeps this many bytes of conversations going.
    #[arg(long, value_parser = parse_size)]
    pub working_set: u64,
    /// Skew of `zipf` (about 1: a few pages take most reads).
    #[arg(long, default_value_t = 0.9)]
    pub zipf: f64,
    /// Turns per conversation, and pages each turn adds (`turns`).
    #[arg(long, default_value_t = 8)]
    pub turns: u64,
    /// Pages each turn adds (`turns`).
    #[arg(long, default_value_t = 4)]
    pub pages_per_turn: u64,
    /// How long to measure, after a warm-up of as long.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Concurrent workers.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Key prefix (keeps runs apart).
    #[arg(long, default_value = "reuse")]
    pub prefix: String,
    #[command(flatten)]
    pub security: crate::cli::SecurityArgs,
}

/// What the workers count, warm-up excluded.
#[derive(Default)]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
    errors: AtomicU64,
    /// Puts the pool refused (the page is then missed when next read).
    put_errors: AtomicU64,
    measuring: std::sync::atomic::AtomicBool,
}

/// Read latency of hits, per tier (memory, disk), in nanoseconds.
struct Latency {
    by_tier: [Histogram<u64>; 2],
}

impl Latency {
    fn new() -> Self {
        let h = || Histogram::new(3).expect("valid histogram precision");
        Latency {
            by_tier: [h(), h()],
        }
    }
}

/// Cumulative Zipf weights over `n` ranks, for sampling by binary search.
fn zipf_table(n: u64, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    (0..n)
        .map(|i| {
            acc += 1.0 / ((i + 1) as f64).powf(s);
            acc
        })
        .collect()
}

fn zipf_draw(table: &[f64], rng: &mut impl Rng) -> u64 {
    let total = table.last().copied().unwrap_or(1.0);
    let u = rng.gen::<f64>() * total;
    table.partition_point(|&c| c < u) as u64
}

/// Stores a page; a put refused while measuring is counted (and its first
/// few printed).
async fn store(client: &Client, key: &str, value: &[u8], counts: &Counts) {
    if let Err(e) = client.put(key, value, &ReplicateConfig::default()).await {
        if e.code != Code::ObjectAlreadyExists
            && counts.measuring.load(Ordering::Relaxed)
            && counts.put_errors.fetch_add(1, Ordering::Relaxed) < 3
        {
            eprintln!("put refused: {e}");
        }
    }
}

/// Runs the workload; returns false if any call failed.
pub async fn run(a: BenchReuseArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        a.page_size > 0 && a.working_set >= a.page_size,
        "--working-set must hold at least one page"
    );
    anyhow::ensure!(
        a.concurrency >= 1 && a.turns >= 2 && a.pages_per_turn >= 1,
        "concurrency 1+, turns 2+, pages per turn 1+"
    );
    let pattern = a.pattern.trim().to_string();
    anyhow::ensure!(
        matches!(pattern.as_str(), "zipf" | "turns"),
        "--pattern is zipf or turns"
    );
    let mut cfg = ClientConfig::new(&a.master);
    cfg.hostname = "kvpool-bench-reuse".into();
    // Every lookup asks the master, as an engine's first lookup of a page
    // does, so reads land on the tier the page is in now.
    cfg.location_cache = 0;
    cfg.security = a.security.to_security()?;
    let client = Client::connect(cfg)
        .await
        .map_err(|e| anyhow::anyhow!("connect {}: {e}", a.master))?;
    let pages = a.working_set / a.page_size;
    let table = Arc::new(zipf_table(pages, a.zipf));
    // Conversations kept going so their pages add up to the working set.
    let conversations = (pages / (a.turns * a.pages_per_turn)).max(1);
    let counts = Arc::new(Counts::default());
    let latency = Arc::new(Mutex::new(Latency::new()));
    let next_conversation = Arc::new(AtomicU64::new(conversations));
    let start = Instant::now();
    let warm_until = start + a.duration;
    let deadline = warm_until + a.duration;
    let run = format!("{}-{:08x}", a.prefix, rand::random::<u32>());
    let mut workers = Vec::new();
    for w in 0..a.concurrency {
        let (client, counts, latency, table, run, pattern) = (
            client.clone(),
            counts.clone(),
            latency.clone(),
            table.clone(),
            run.clone(),
            pattern.clone(),
        );
        let next_conversation = next_conversation.clone();
        let a = a.clone();
        workers.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::from_entropy();
            let value: Vec<u8> = (0..a.page_size).map(|i| (i as u8) ^ (w as u8)).collect();
            let mut buf = vec![0u8; a.page_size as usize];
            let mut local = Latency::new();
            // This worker's conversations: (id, next turn).
            let mine: Vec<u64> = (0..conversations)
                .filter(|c| *c as usize % a.concurrency == w)
                .collect();
            let mut convs: Vec<(u64, u64)> = mine.iter().map(|&c| (c, 0)).collect();
            while Instant::now() < deadline {
                if !counts.measuring.load(Ordering::Relaxed) && Instant::now() >= warm_until {
                    counts.measuring.store(true, Ordering::Relaxed);
                }
                let wanted: Vec<String> = match pattern.as_str() {
                    "zipf" => vec![format!("{run}/p{}", zipf_draw(&table, &mut rng))],
                    _ if convs.is_empty() => break,
                    _ => {
                        let i = rng.gen_range(0..convs.len());
                        let (c, turn) = convs[i];
                        let keys = (0..turn * a.pages_per_turn)
                            .map(|p| format!("{run}/c{c}/{p}"))
                            .collect();
                        convs[i].1 += 1;
                        if convs[i].1 == a.turns {
                            // Finished: a new conversation takes its place.
                            convs[i] = (next_conversation.fetch_add(1, Ordering::Relaxed), 0);
                        } else {
                            // This turn's own pages, computed now.
                            for p in turn * a.pages_per_turn..(turn + 1) * a.pages_per_turn {
                                let k = format!("{run}/c{c}/{p}");
                                store(&client, &k, &value, &counts).await;
                            }
                        }
                        keys
                    }
                };
                for key in wanted {
                    let t = Instant::now();
                    let read = match client.locate(&key).await {
                        Ok(l) => {
                            let tier = l.tier();
                            client.read_located_into(l, &mut buf).await.map(|_| tier)
                        }
                        Err(e) => Err(e),
                    };
                    let measuring = counts.measuring.load(Ordering::Relaxed);
                    match read {
                        Ok(tier) => {
                            if measuring {
                                counts.hits.fetch_add(1, Ordering::Relaxed);
                                let slot = usize::from(tier == Tier::Disk);
                                let _ = local.by_tier[slot].record(t.elapsed().as_nanos() as u64);
                            }
                        }
                        Err(e) if e.code == Code::ObjectNotFound => {
                            if measuring {
                                counts.misses.fetch_add(1, Ordering::Relaxed);
                            }
                            // Recompute: store the page again.
                            store(&client, &key, &value, &counts).await;
                        }
                        Err(e) => {
                            if measuring && counts.errors.fetch_add(1, Ordering::Relaxed) < 3 {
                                eprintln!("read error: {e}");
                            }
                        }
                    }
                }
            }
            let mut l = latency.lock();
            for (all, mine) in l.by_tier.iter_mut().zip(&local.by_tier) {
                let _ = all.add(mine);
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let _ = client
        .remove_by_regex(&format!("^{}/", run.replace('-', "\\-")), true)
        .await;
    client.close().await;
    let (hits, misses, errors, put_errors) = (
        counts.hits.load(Ordering::Relaxed),
        counts.misses.load(Ordering::Relaxed),
        counts.errors.load(Ordering::Relaxed),
        counts.put_errors.load(Ordering::Relaxed),
    );
    let l = latency.lock();
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "pattern {pattern} · working set {} in {}-byte pages · {} workers · {:?} measured after {:?} warm-up",
        crate::cli::human(a.working_set),
        a.page_size,
        a.concurrency,
        a.duration,
        a.duration
    );
    println!(
        "hit rate {:.2}% ({hits} hits, {misses} misses, {errors} read errors, {put_errors} puts refused)",
        100.0 * hits as f64 / (hits + misses).max(1) as f64
    );
    for (name, h) in ["memory", "disk"].iter().zip(&l.by_tier) {
        if !h.is_empty() {
            println!(
                "{name} hits {} ({:.1}%): read p50 {:.0} us, p99 {:.0} us",
                h.len(),
                100.0 * h.len() as f64 / hits.max(1) as f64,
                us(h, 0.5),
                us(h, 0.99)
            );
        }
    }
    Ok(errors == 0)
}
