//! The `kvpool-chaos` binary: `run` a campaign (or several seeds in turn),
//! `check` a recorded history again, `cleanup` what a killed campaign left,
//! and `worker`, the client process a campaign starts on each client host.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kvpool_chaos::campaign::{self, CampaignConfig};
use kvpool_chaos::schedule::Scenario;
use kvpool_chaos::workload::WorkerArgs;
use kvpool_chaos::{checker, history, net};
use kvpool_proto::units::{parse_duration, parse_size};

/// kvpool's chaos harness (see docs/chaos.md).
#[derive(Parser)]
#[command(name = "kvpool-chaos", about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run campaigns: build a pool in network namespaces, inject faults, check the history.
    Run(RunArgs),
    /// Check recorded history files (or a campaign directory) again.
    Check {
        /// `.jsonl` files, or a campaign directory (its `history/`).
        paths: Vec<PathBuf>,
        /// The pool evicted during the campaign (missing keys are then no violation).
        #[arg(long)]
        evictions: bool,
        /// Violations to print in full.
        #[arg(long, default_value_t = 20)]
        show: usize,
    },
    /// Remove namespaces, links and processes a killed campaign left behind.
    Cleanup,
    /// A workload client (started by campaigns inside a client namespace).
    Worker(WorkerArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// mixed, failover, pause-leader, partition, upgrade, or join (a store
    /// joins a nearly full pool).
    #[arg(long, default_value = "mixed")]
    scenario: String,
    /// Seeds, comma-separated, run one after another; default: one random seed.
    #[arg(long, value_delimiter = ',')]
    seed: Vec<u64>,
    /// Faults run this long per seed (join: the measured window).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Where each seed's logs, histories and report go (`<dir>/<scenario>-<seed>`).
    #[arg(long, default_value = "/tmp/kvchaos")]
    dir: PathBuf,
    /// The kvpool binary under test (default: next to this one).
    #[arg(long)]
    kvpool: Option<PathBuf>,
    /// An earlier kvpool binary (the last release): masters and stores
    /// start on it and upgrades switch them between it and --kvpool.
    #[arg(long)]
    previous: Option<PathBuf>,
    /// The previous release's `kvpool-chaos` binary: odd-numbered client
    /// hosts run its worker (that release's client) instead of this one's.
    #[arg(long)]
    previous_clients: Option<PathBuf>,
    /// Masters (HA through etcd).
    #[arg(long, default_value_t = 3)]
    masters: usize,
    /// Stores.
    #[arg(long, default_value_t = 4)]
    stores: usize,
    /// Client processes.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Writer tasks per client.
    #[arg(long, default_value_t = 4)]
    writers: u32,
    /// Reader tasks per client.
    #[arg(long, default_value_t = 2)]
    readers: u32,
    /// Keys shared by the clients.
    #[arg(long, default_value_t = 400)]
    keys: u32,
    /// Pause between a task's calls, in ms.
    #[arg(long, default_value_t = 10)]
    think_ms: u64,
    /// Largest value a client writes, in bytes.
    #[arg(long, default_value = "16KiB", value_parser = parse_size)]
    value_max: u64,
    /// Segment each store lends.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    segment_size: u64,
    /// Disk tier each store lends beside its segment (0: none); objects
    /// then move between memory and disk under the faults.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    disk_size: u64,
    /// Faults active at once, at most.
    #[arg(long, default_value_t = 2)]
    max_concurrent: usize,
    /// Seconds between leader kills (failover scenario).
    #[arg(long, default_value = "8s", value_parser = parse_duration)]
    failover_every: Duration,
    /// `--store-grace` of the masters.
    #[arg(long, default_value = "30s")]
    store_grace: String,
    /// join: fill the pool to this fraction before the store joins.
    #[arg(long, default_value_t = 0.85)]
    fill_to: f64,
    /// Plant this bug in the masters and stores (a binary built with
    /// `--features kvpool-master/planted-bugs,kvpool-transfer/planted-bugs`);
    /// the run passes if the checker catches it.
    #[arg(long)]
    plant_bug: Option<String>,
    /// `KVPOOL_LOG` of the pool's processes.
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Worker(args) = &cli.command {
        return kvpool_chaos::workload::run_blocking(args.config());
    }
    kvpool_chaos::init_tracing();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kvpool-chaos: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Worker(_) => unreachable!("handled before the runtime starts"),
        Command::Cleanup => {
            campaign::cleanup()?;
            println!("removed what earlier campaigns left");
            Ok(ExitCode::SUCCESS)
        }
        Command::Check {
            paths,
            evictions,
            show,
        } => {
            let mut files = Vec::new();
            for p in &paths {
                if p.is_dir() {
                    let dir = if p.join("history").is_dir() {
                        p.join("history")
                    } else {
                        p.clone()
                    };
                    for e in std::fs::read_dir(&dir)?.flatten() {
                        if e.path().extension().is_some_and(|x| x == "jsonl") {
                            files.push(e.path());
                        }
                    }
                } else {
                    files.push(p.clone());
                }
            }
            files.sort();
            let events = history::load(&files)?;
            let mut report = checker::check(
                &events,
                checker::CheckConfig {
                    evictions_possible: evictions,
                    ..checker::CheckConfig::default()
                },
            );
            // A campaign directory has the masters' logs beside its history.
            if let [dir] = &paths[..] {
                if dir.join("logs").is_dir() {
                    kvpool_chaos::leaders::set_aside_previous_release(dir, &events, &mut report)?;
                }
            }
            print!("{}", checker::render(&report, show));
            if let Some(a) = campaign::availability(&events) {
                print!("\n{a}");
            }
            let fo = campaign::failovers(&events);
            if !fo.is_empty() {
                println!("\nleader kills:");
                for f in fo {
                    println!("  fault {} {}: {:?} ms", f.n, f.master, f.serves_after_ms);
                }
            }
            Ok(if report.total() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Run(a) => run_campaigns(a).await,
    }
}

async fn run_campaigns(a: RunArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe()?;
    let kvpool = match a.kvpool {
        Some(p) => p,
        None => exe.with_file_name("kvpool"),
    };
    anyhow::ensure!(
        kvpool.is_file(),
        "{} not found: build it (cargo build -p kvpool) or pass --kvpool",
        kvpool.display()
    );
    let seeds = if a.seed.is_empty() {
        vec![rand::random::<u32>() as u64]
    } else {
        a.seed.clone()
    };
    let join = a.scenario == "join";
    let scenario: Scenario = if join {
        Scenario::Mixed
    } else {
        a.scenario.parse().map_err(anyhow::Error::msg)?
    };
    let mut failed = false;
    for seed in seeds {
        let dir = a.dir.join(format!("{}-{seed}", a.scenario));
        if dir.exists() {
            net::unmount_below(&dir);
            std::fs::remove_dir_all(&dir)?;
        }
        let worker = vec![exe.to_string_lossy().into_owned(), "worker".into()];
        let mut cfg = CampaignConfig::new(seed, scenario, dir, kvpool.clone(), worker);
        cfg.duration = a.duration;
        cfg.topo.masters = a.masters;
        cfg.topo.stores = a.stores;
        cfg.topo.clients = a.clients;
        cfg.writers = a.writers;
        cfg.readers = a.readers;
        cfg.keys = a.keys;
        cfg.think_ms = a.think_ms;
        cfg.value_max = u32::try_from(a.value_max)?;
        cfg.segment_size = a.segment_size;
        cfg.disk_size = a.disk_size;
        cfg.plan.max_concurrent = a.max_concurrent;
        cfg.plan.failover_every = a.failover_every;
        cfg.store_grace = a.store_grace.clone();
        cfg.planted_bug = a.plant_bug.clone();
        cfg.previous = a.previous.clone();
        cfg.previous_worker_cmd = (a.previous_clients.as_ref())
            .map(|p| vec![p.to_string_lossy().into_owned(), "worker".into()]);
        cfg.log_level = a.log_level.clone();
        println!("== {} seed {seed}: {}", a.scenario, cfg.dir.display());
        if join {
            let r = campaign::run_join(cfg, a.fill_to).await?;
            print!("{}", r.render());
            failed |= r.violations > 0 || r.share > 2.0 * r.fair;
        } else {
            let r = campaign::run(cfg).await?;
            print!("{}", r.render());
            failed |= if a.plant_bug.is_some() {
                r.report.total() == 0
            } else {
                r.problems() > 0
            };
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
