//! The coordinator: builds the pool in namespaces (etcd, HA masters, stores,
//! workload clients), runs the fault schedule while supervising every
//! process, heals, has every key read back, tears everything down, and
//! checks the history.
//!
//! Phases, each recorded as a mark in `history/faults.jsonl`:
//! `setup` → `load` (faults run) → `heal` (faults undone, the pool settles)
//! → `verify` (one client reads every key) → `teardown` → the checker.
//!
//! Everything the campaign made (namespaces, links, mounts, processes) is
//! undone on every exit path: in order, by the drop of [`Pool`]; and at the
//! start of the next campaign, by [`net::cleanup_stale`], if this one was
//! killed outright.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use kvpool_client::{Client, ClientConfig, Protocol};
use kvpool_net::auth::{Credentials, Role as KeyRole};
use kvpool_net::etcd::{leader_key, Etcd};
use kvpool_proto::msg::ClusterStatus;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::checker::{self, CheckConfig, Report};
use crate::history::{self, now_ns, Event, Recorder};
use crate::net::{self, Net};
use crate::procs::Proc;
use crate::schedule::{self, Fault, Host, PlanOptions, Planned, Role, Scenario, Target, Topology};

mod pool;
mod report;
use pool::{tokio_util_stop, Pool};
pub use report::{
    availability, failovers, Availability, CampaignResult, Causes, Failover, JoinResult,
};

/// The cluster id the masters compete under.
const CLUSTER: &str = "chaos";
/// Port of every master's RPC listener (each on its own host address).
const MASTER_PORT: u16 = 50051;
/// Port of every store's data plane.
const STORE_PORT: u16 = 7000;

/// Settings of a campaign.
#[derive(Debug, Clone)]
pub struct CampaignConfig {
    /// Seed of the fault schedule and of every worker's operation stream.
    pub seed: u64,
    /// Which faults.
    pub scenario: Scenario,
    /// How long faults run (the whole campaign takes setup, heal and verify more).
    pub duration: Duration,
    /// Scratch directory for keys, logs, histories and the report (kept).
    pub dir: PathBuf,
    /// The `kvpool` binary under test.
    pub kvpool: PathBuf,
    /// An earlier build (the last release): the masters and stores start on
    /// it, and each upgrade switches a process to `kvpool` (and the next one
    /// back), so old and new run side by side all campaign long. `None`:
    /// upgrades restart on another copy of `kvpool`.
    pub previous: Option<PathBuf>,
    /// How to start a worker: program and leading arguments; the worker's
    /// own flags follow (`kvpool-chaos worker`, or a test binary).
    pub worker_cmd: Vec<String>,
    /// How to start a worker of the previous release (its `kvpool-chaos
    /// worker`, whose flags and history are this one's): the load workers
    /// of odd-numbered client hosts run it, so that release's client
    /// library reads and writes beside this one's. `None`: every worker is
    /// `worker_cmd`.
    pub previous_worker_cmd: Option<Vec<String>>,
    /// Hosts per role.
    pub topo: Topology,
    /// Writer tasks per client process.
    pub writers: u32,
    /// Reader tasks per client process.
    pub readers: u32,
    /// Keys of the shared key space.
    pub keys: u32,
    /// Largest value.
    pub value_max: u32,
    /// Pause between a task's calls.
    pub think_ms: u64,
    /// Bytes each store lends.
    pub segment_size: u64,
    /// Bytes of disk tier each store lends beside its memory (0: none). The
    /// masters then keep memory at most half full (`--demote-watermark
    /// 0.5`), so objects move between the tiers all campaign long.
    pub disk_size: u64,
    /// `--ha-lease-ttl` of the masters.
    pub ha_lease_ttl: String,
    /// `--client-ttl` of the masters.
    pub client_ttl: String,
    /// `--store-grace` of the masters.
    pub store_grace: String,
    /// Schedule knobs.
    pub plan: PlanOptions,
    /// `KVPOOL_LOG` of the pool's processes.
    pub log_level: String,
    /// A bug to plant in the masters and stores (`KVPOOL_PLANTED_BUG`); the
    /// binary must be built with the `planted-bugs` features of
    /// `kvpool-master` and `kvpool-transfer`.
    pub planted_bug: Option<String>,
}

impl CampaignConfig {
    /// The defaults of the short campaign, for `seed` and `scenario`.
    pub fn new(
        seed: u64,
        scenario: Scenario,
        dir: PathBuf,
        kvpool: PathBuf,
        worker_cmd: Vec<String>,
    ) -> Self {
        CampaignConfig {
            seed,
            scenario,
            duration: Duration::from_secs(60),
            dir,
            kvpool,
            previous: None,
            worker_cmd,
            previous_worker_cmd: None,
            topo: Topology {
                etcd: 3,
                masters: 3,
                stores: 4,
                clients: 4,
            },
            writers: 4,
            readers: 2,
            keys: 400,
            value_max: 16 << 10,
            think_ms: 10,
            segment_size: 64 << 20,
            disk_size: 0,
            ha_lease_ttl: "2s".into(),
            client_ttl: "2s".into(),
            store_grace: "30s".into(),
            plan: PlanOptions::default(),
            log_level: "info".into(),
            planted_bug: None,
        }
    }
}

/// Paths of the secret files.
struct Keys {
    admin: PathBuf,
    store: PathBuf,
    client: PathBuf,
}

fn write_keys(dir: &Path) -> anyhow::Result<Keys> {
    use std::os::unix::fs::OpenOptionsExt;
    let admin = Credentials::parse(&kvpool_net::auth::new_cluster_secret())?;
    let write = |role: KeyRole| -> anyhow::Result<PathBuf> {
        let path = dir.join(format!("{role}.key"));
        let key = admin.derive(role).context("derive a role key")?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&path)?;
        std::io::Write::write_all(&mut f, key.encode().as_bytes())?;
        Ok(path)
    };
    Ok(Keys {
        admin: write(KeyRole::Admin)?,
        store: write(KeyRole::Store)?,
        client: write(KeyRole::Client)?,
    })
}

/// Cancelled by SIGINT or SIGTERM to the coordinator: the campaign stops and cleans up.
fn interrupted() -> Arc<std::sync::atomic::AtomicBool> {
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = flag.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        f.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    flag
}

/// Held while a campaign runs, so two never share the namespaces.
struct RunLock {
    _held: std::fs::File,
}

impl RunLock {
    fn take() -> anyhow::Result<RunLock> {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::create("/run/lock/kvpool-chaos.lock")
            .or_else(|_| std::fs::File::create("/tmp/kvpool-chaos.lock"))?;
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            bail!("another chaos campaign is running on this machine (kvpool-chaos.lock is held)");
        }
        Ok(RunLock { _held: f })
    }
}

/// Removes what a campaign killed outright left behind (processes,
/// namespaces, links, mounts), unless a campaign is running now.
pub fn cleanup() -> anyhow::Result<()> {
    let _lock = RunLock::take()?;
    net::cleanup_stale()?;
    net::unmount_stale();
    Ok(())
}

/// Starts etcd, the masters and the stores, and waits until they serve.
async fn bring_up(pool: &mut Pool) -> anyhow::Result<()> {
    pool.start_role(Role::Etcd)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let probe =
            tokio::time::timeout(Duration::from_secs(3), pool.etcd.get("/kvchaos/probe")).await;
        if matches!(probe, Ok(Ok(_))) {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "etcd did not serve within 60 s; see {}",
                pool.cfg.dir.join("logs").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pool.start_role(Role::Master)?;
    pool.start_role(Role::Store)?;
    let stores = pool.cfg.topo.stores;
    pool.settle(stores, Duration::from_secs(90)).await
}

/// Stops the workers (SIGTERM: they finish their calls), waiting up to 30 s.
async fn stop_workers(pool: &mut Pool) {
    let clients: Vec<Host> = pool
        .procs
        .keys()
        .copied()
        .filter(|h| h.role == Role::Client)
        .collect();
    for h in &clients {
        pool.proc(*h).terminate();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for h in &clients {
        while pool.proc(*h).running() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        pool.proc(*h).kill9();
    }
}

/// Runs a worker in `mode` on client host `idx` to completion (bounded).
async fn run_worker(
    pool: &mut Pool,
    idx: usize,
    mode: &str,
    extra: &[String],
    within: Duration,
) -> anyhow::Result<()> {
    let mut p = pool.worker(idx, mode, extra);
    p.start()?;
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = p.poll_exit() {
            p.held = true;
            if !s.success() {
                bail!("the {mode} worker failed with {s}:\n{}", p.log_tail(20));
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            p.kill9();
            bail!("the {mode} worker did not finish within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks the recorded history.
fn check_history(pool: &Pool, evictions: bool) -> anyhow::Result<(Vec<Event>, Report)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(pool.history_dir())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let events = history::load(&files)?;
    let mut report = checker::check(
        &events,
        CheckConfig {
            evictions_possible: evictions,
            ..CheckConfig::default()
        },
    );
    crate::leaders::set_aside_previous_release(&pool.cfg.dir, &events, &mut report)?;
    Ok((events, report))
}

/// Runs one campaign: the whole life of a pool under a fault schedule.
pub async fn run(cfg: CampaignConfig) -> anyhow::Result<CampaignResult> {
    let started = Instant::now();
    let stop_flag = interrupted();
    let plan = schedule::plan(cfg.seed, &cfg.topo, cfg.scenario, cfg.duration, cfg.plan);
    std::fs::create_dir_all(&cfg.dir)?;
    std::fs::write(
        cfg.dir.join("schedule.json"),
        serde_json::to_string_pretty(&plan)?,
    )?;
    let mut pool = Pool::create(cfg.clone(), &[])?;
    let started_at = pool.started_at.clone();
    bring_up(&mut pool).await?;
    if let Some(bug) = &cfg.planted_bug {
        for idx in 0..cfg.topo.masters {
            let p = pool.proc(Host {
                role: Role::Master,
                idx,
            });
            if !std::fs::read_to_string(p.log_path())
                .unwrap_or_default()
                .contains("PLANTED BUG")
            {
                bail!(
                    "{} does not plant {bug}: build it with `cargo build -p kvpool --features kvpool-master/planted-bugs,kvpool-transfer/planted-bugs`",
                    cfg.kvpool.display()
                );
            }
        }
        pool.mark(format!("planted bug: {bug}"));
    }
    pool.start_role(Role::Client)?;
    let sampler = tokio_util_stop::Stop::default();
    pool.spawn_sampler(sampler.clone()).await?;
    pool.mark(format!(
        "load: {} faults planned over {:?}",
        plan.len(),
        cfg.duration
    ));

    // The fault phase: each fault starts at its time and ends `hold` later.
    let t0 = Instant::now();
    let mut started_faults: HashMap<u32, Option<Host>> = HashMap::new();
    let mut ended: Vec<u32> = Vec::new();
    let mut kinds: BTreeMap<String, u32> = BTreeMap::new();
    let mut skipped = 0;
    loop {
        if stop_flag.load(std::sync::atomic::Ordering::Relaxed) {
            bail!("interrupted");
        }
        pool.supervise();
        let now = t0.elapsed();
        for p in &plan {
            if p.at <= now && !started_faults.contains_key(&p.n) && !ended.contains(&p.n) {
                let target = match &p.fault {
                    Fault::Kill(t) | Fault::Pause(t) | Fault::Isolate(t) | Fault::Upgrade(t) => {
                        Some(*t)
                    }
                    Fault::OneWay { target, .. } => Some(*target),
                    _ => None,
                };
                let h = pool.resolve(target).await;
                // A leader fault whose leader is unknown, or whose leader a
                // fault already holds, would not be the fault planned. A
                // full disk restarts its store: not while an upgrade waits
                // for that store to exit (it would wait for the new one).
                let restarts = match &p.fault {
                    Fault::DiskFull(s) => Some(Host {
                        role: Role::Store,
                        idx: *s,
                    }),
                    _ => h,
                };
                let busy = restarts.is_some_and(|h| {
                    started_faults.values().flatten().any(|x| *x == h)
                        || pool.procs.get(&h).is_some_and(|p| p.held || p.paused)
                        || pool.upgrading(h)
                });
                if (target.is_some() && h.is_none()) || busy {
                    skipped += 1;
                    pool.mark(format!(
                        "fault {} ({}) skipped: its target is unknown or busy",
                        p.n, p.fault
                    ));
                    ended.push(p.n);
                    continue;
                }
                let what = match (&p.fault, target) {
                    (_, Some(Target::Leader)) => format!("{} (leader)", h.expect("resolved")),
                    (_, Some(Target::Host(h))) => h.to_string(),
                    (f, None) => f.to_string(),
                };
                pool.faults.record(&Event::Fault {
                    t: now_ns(),
                    n: p.n,
                    phase: "start".into(),
                    kind: p.fault.kind().into(),
                    target: what.clone(),
                });
                tracing::info!("fault {} start: {} {what}", p.n, p.fault.kind());
                if let Err(e) = pool.begin(p, h) {
                    pool.crashes.push(format!(
                        "fault {} ({}) could not start: {e:#}",
                        p.n, p.fault
                    ));
                }
                *kinds.entry(p.fault.kind().to_string()).or_default() += 1;
                started_faults.insert(p.n, h);
            }
        }
        let due: Vec<(Planned, Option<Host>)> = plan
            .iter()
            .filter(|p| p.at + p.hold <= now)
            .filter_map(|p| started_faults.get(&p.n).map(|h| (p.clone(), *h)))
            .collect();
        for (p, h) in due {
            started_faults.remove(&p.n);
            ended.push(p.n);
            if let Err(e) = pool.end(&p, h) {
                pool.crashes.push(format!(
                    "fault {} ({}) could not be undone: {e:#}",
                    p.n, p.fault
                ));
            }
            pool.faults.record(&Event::Fault {
                t: now_ns(),
                n: p.n,
                phase: "end".into(),
                kind: p.fault.kind().into(),
                target: String::new(),
            });
            tracing::info!("fault {} end", p.n);
        }
        if now >= cfg.duration && started_faults.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    pool.mark("heal");
    pool.net.heal_all();
    for p in pool.procs.values_mut() {
        if p.paused {
            p.pause(false);
        }
    }
    // Upgrades in flight finish; anything down comes back.
    let heal_deadline = Instant::now() + Duration::from_secs(25);
    while !pool.pending.is_empty() && Instant::now() < heal_deadline {
        pool.supervise();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let down: Vec<Host> = pool
        .procs
        .iter_mut()
        .filter_map(|(h, p)| (!p.running()).then_some(*h))
        .collect();
    for h in down {
        pool.start(h)?;
    }
    let unsettled = pool
        .settle(cfg.topo.stores, Duration::from_secs(90))
        .await
        .err()
        .map(|e| e.to_string());
    // Let the workers run on the healed pool a little: what the faults broke shows now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_workers(&mut pool).await;
    pool.mark("verify");
    let verified = run_worker(&mut pool, 0, "verify", &[], Duration::from_secs(120)).await;
    if let Err(e) = verified {
        pool.crashes.push(format!("verification: {e:#}"));
    }
    sampler.set();
    pool.mark("teardown");
    let evictions = pool.status.lock().evictions > 0;
    let tier_moves = (cfg.disk_size > 0).then(|| pool.status.lock().moves);
    for p in pool.panics() {
        pool.crashes.push(p);
    }
    let (events, report) = check_history(&pool, evictions)?;
    let crashes = std::mem::take(&mut pool.crashes);
    let step_downs = pool.step_downs;
    let dir = cfg.dir.clone();
    drop(pool);
    let result = CampaignResult {
        seed: cfg.seed,
        scenario: cfg.scenario,
        duration_s: cfg.duration.as_secs(),
        wall_s: started.elapsed().as_secs(),
        faults: kinds,
        skipped,
        failovers: failovers(&events),
        availability: availability(&events),
        crashes,
        step_downs,
        evictions_possible: evictions,
        tier_moves,
        unsettled,
        report,
        dir: dir.clone(),
        started_at,
        planted_bug: cfg.planted_bug.clone(),
        previous: cfg.previous.clone(),
        previous_clients: cfg.previous_worker_cmd.is_some(),
    };
    std::fs::write(dir.join("report.txt"), result.render())?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&result)?,
    )?;
    Ok(result)
}

/// A store joins an almost full pool: how much of the next `cfg.duration`'s
/// puts does it take?
pub async fn run_join(mut cfg: CampaignConfig, fill_to: f64) -> anyhow::Result<JoinResult> {
    let stop_flag = interrupted();
    std::fs::create_dir_all(&cfg.dir)?;
    cfg.topo.clients = cfg.topo.clients.max(1);
    let joiner = Host {
        role: Role::Store,
        idx: cfg.topo.stores,
    };
    let mut pool = Pool::create(cfg.clone(), &[joiner])?;
    bring_up(&mut pool).await?;
    pool.mark("fill");
    // Big objects fill the pool fast.
    pool.cfg.value_max = 256 << 10;
    let fill = ["--fill-to".to_string(), fill_to.to_string()];
    run_worker(&mut pool, 0, "fill", &fill, Duration::from_secs(600)).await?;
    pool.cfg.value_max = cfg.value_max;
    let filled = pool.status().await?;
    let fill = filled.used as f64 / filled.capacity as f64;
    pool.mark(format!("{joiner} joins at {:.1}% full", fill * 100.0));
    pool.start(joiner)?;
    pool.settle(cfg.topo.stores + 1, Duration::from_secs(60))
        .await?;
    let regions = |st: &ClusterStatus| -> BTreeMap<String, u64> {
        st.segments
            .iter()
            .map(|s| (s.info.name.clone(), s.regions))
            .collect()
    };
    let first = pool.status().await?;
    let before = regions(&first);
    for idx in 0..cfg.topo.clients {
        let mut p = pool.worker(idx, "fresh", &[]);
        p.start()?;
        pool.procs.insert(
            Host {
                role: Role::Client,
                idx,
            },
            p,
        );
    }
    let t0 = Instant::now();
    while t0.elapsed() < cfg.duration {
        if stop_flag.load(std::sync::atomic::Ordering::Relaxed) {
            bail!("interrupted");
        }
        pool.supervise();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let last = pool.status().await?;
    let after = regions(&last);
    let evictions = last.evictions.saturating_sub(first.evictions);
    let window_s = t0.elapsed().as_secs();
    stop_workers(&mut pool).await;
    let placed: BTreeMap<String, u64> = after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect();
    let total: u64 = placed.values().sum();
    let share = placed.get(&joiner.to_string()).copied().unwrap_or(0) as f64 / total.max(1) as f64;
    let (_, report) = check_history(&pool, pool.status.lock().evictions > 0)?;
    let dir = cfg.dir.clone();
    drop(pool);
    let r = JoinResult {
        fill,
        fair: 1.0 / placed.len().max(1) as f64,
        placed,
        share,
        window_s,
        evictions,
        violations: report.total(),
        dir: dir.clone(),
    };
    std::fs::write(dir.join("report.txt"), r.render())?;
    std::fs::write(dir.join("summary.json"), serde_json::to_string_pretty(&r)?)?;
    Ok(r)
}
