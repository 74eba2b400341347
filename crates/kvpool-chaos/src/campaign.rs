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
use serde::Serialize;
use tokio::time::Instant;

use crate::checker::{self, CheckConfig, Report};
use crate::history::{self, now_ns, Event, Op, Outcome, Recorder};
use crate::net::{self, Net};
use crate::procs::Proc;
use crate::schedule::{self, Fault, Host, PlanOptions, Planned, Role, Scenario, Target, Topology};

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
    /// How to start a worker: program and leading arguments; the worker's
    /// own flags follow (`kvpool-chaos worker`, or a test binary).
    pub worker_cmd: Vec<String>,
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
            worker_cmd,
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
            ha_lease_ttl: "2s".into(),
            client_ttl: "2s".into(),
            store_grace: "30s".into(),
            plan: PlanOptions::default(),
            log_level: "info".into(),
            planted_bug: None,
        }
    }
}

/// One leader kill and how long the pool took to serve writes again.
#[derive(Debug, Clone, Serialize)]
pub struct Failover {
    /// The fault's number.
    pub n: u32,
    /// The master killed.
    pub master: String,
    /// From the kill to the completion of the first successful write
    /// invoked after it; `None` if none succeeded before the next fault.
    pub serves_after_ms: Option<u64>,
}

/// Whether the pool kept taking writes through the faults: counted from the
/// history over the fault window (first fault's start to last fault's end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Availability {
    /// Whole seconds in the window.
    pub window_s: u64,
    /// Of those, the seconds in which no write (put, upsert) completed
    /// successfully.
    pub seconds_without_write: u64,
    /// The longest time in the window between successful write completions
    /// (or from the window's start to the first, or the last to its end).
    pub longest_gap_ms: u64,
    /// The seconds without a write, by what was faulted in them.
    pub without_write_by_cause: Causes,
}

impl std::fmt::Display for Availability {
    /// Two report lines: the share of seconds without a write, then why.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pct = 100 * self.seconds_without_write / self.window_s.max(1);
        writeln!(
            f,
            "availability: {} of {} s of faults without an acknowledged write ({pct}%), longest gap {} ms",
            self.seconds_without_write, self.window_s, self.longest_gap_ms
        )?;
        let c = self.without_write_by_cause;
        writeln!(
            f,
            "  of those, faulted: leader, etcd or a split {} s; only stores {} s; only clients or standbys {} s; nothing (aftermath) {} s",
            c.leader_etcd_or_split, c.stores, c.others, c.none
        )
    }
}

/// Seconds without an acknowledged write, each counted once, under the
/// first of these that had a fault active in it: what kvpool could still
/// serve through (stores) apart from what no lease-based pool serves
/// through (the leader and etcd).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Causes {
    /// The master leader, an etcd member, or a split (which may cut off
    /// either) was faulted.
    pub leader_etcd_or_split: u64,
    /// Only stores (and maybe clients or standby masters) were faulted.
    pub stores: u64,
    /// Only clients or standby masters were faulted.
    pub others: u64,
    /// No fault was active (the aftermath of one that had just ended).
    pub none: u64,
}

impl Causes {
    /// Counts one second in which the faults with `targets` were active.
    fn count<'a>(&mut self, targets: impl Iterator<Item = &'a str> + Clone) {
        let any = |f: fn(&str) -> bool| targets.clone().any(f);
        let slot =
            if any(|t| t.ends_with("(leader)") || t.starts_with("etcd-") || t.starts_with("split"))
            {
                &mut self.leader_etcd_or_split
            } else if any(|t| t.contains("store-")) {
                &mut self.stores
            } else if targets.clone().next().is_some() {
                &mut self.others
            } else {
                &mut self.none
            };
        *slot += 1;
    }
}

/// What a campaign found.
#[derive(Debug, Clone, Serialize)]
pub struct CampaignResult {
    /// The seed.
    pub seed: u64,
    /// The scenario.
    pub scenario: Scenario,
    /// Seconds of faults.
    pub duration_s: u64,
    /// Seconds the whole campaign took.
    pub wall_s: u64,
    /// Faults injected, per kind.
    pub faults: BTreeMap<String, u32>,
    /// Faults skipped (no leader known, or its host busy).
    pub skipped: u32,
    /// Leader kills and their failover times.
    pub failovers: Vec<Failover>,
    /// Writes taken through the fault window; `None` without faults.
    pub availability: Option<Availability>,
    /// Processes that exited or panicked unasked (a master stepping down
    /// after losing etcd is not one).
    pub crashes: Vec<String>,
    /// Masters that stepped down because they lost their lease.
    pub step_downs: u32,
    /// The pool evicted objects.
    pub evictions_possible: bool,
    /// The pool did not settle after the faults were healed.
    pub unsettled: Option<String>,
    /// The checker's report.
    pub report: Report,
    /// Where logs, histories and the report are.
    pub dir: PathBuf,
    /// Wall clock at the campaign's first event (time 0 of the report).
    pub started_at: String,
    /// The bug planted in the masters, if any.
    pub planted_bug: Option<String>,
}

impl CampaignResult {
    /// Violations of every rule, plus crashes: zero for a clean campaign.
    pub fn problems(&self) -> usize {
        self.report.total() + self.crashes.len()
    }

    /// p50, p99 and max of the failover times, in ms, if any were measured.
    pub fn failover_stats(&self) -> Option<(u64, u64, u64)> {
        let mut v: Vec<u64> = self
            .failovers
            .iter()
            .filter_map(|f| f.serves_after_ms)
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let pick = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
        Some((pick(0.5), pick(0.99), *v.last().unwrap()))
    }

    /// The human report.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "chaos campaign: scenario {:?}, seed {}, {} s of faults, {} s in all",
            self.scenario, self.seed, self.duration_s, self.wall_s
        );
        let _ = writeln!(
            s,
            "times below are seconds after {} (logs are in UTC)",
            self.started_at
        );
        if let Some(bug) = &self.planted_bug {
            let caught = if self.report.total() > 0 {
                "caught"
            } else {
                "NOT caught"
            };
            let _ = writeln!(s, "PLANTED BUG {bug}: {caught}");
        }
        let kinds: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let kinds = if kinds.is_empty() {
            "none".to_string()
        } else {
            kinds.join(", ")
        };
        let _ = writeln!(s, "faults: {kinds} (skipped {})", self.skipped);
        if !self.failovers.is_empty() {
            let _ = writeln!(s, "leader kills: {}", self.failovers.len());
            if let Some((p50, p99, max)) = self.failover_stats() {
                let _ = writeln!(
                    s,
                    "  writes served again after: p50 {p50} ms, p99 {p99} ms, max {max} ms"
                );
            }
            let none = self
                .failovers
                .iter()
                .filter(|f| f.serves_after_ms.is_none())
                .count();
            if none > 0 {
                let _ = writeln!(s, "  {none} kills were followed by no successful write");
            }
        }
        if let Some(a) = self.availability {
            let _ = write!(s, "{a}");
        }
        let _ = writeln!(
            s,
            "masters that stepped down (lost their lease): {}",
            self.step_downs
        );
        let _ = writeln!(
            s,
            "evictions during the campaign: {}",
            self.evictions_possible
        );
        if let Some(u) = &self.unsettled {
            let _ = writeln!(s, "the pool did not settle after healing: {u}");
        }
        let _ = writeln!(s, "crashes: {}", self.crashes.len());
        for c in &self.crashes {
            let _ = writeln!(s, "  {c}");
        }
        s.push_str(&checker::render(&self.report, 20));
        let _ = writeln!(s, "\nlogs and histories: {}", self.dir.display());
        s
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

/// What was left mounted: unmounted when the pool is dropped (after its processes).
struct Mounts(PathBuf);

impl Drop for Mounts {
    fn drop(&mut self) {
        net::unmount_below(&self.0);
    }
}

/// A restart waiting for its moment.
enum Pending {
    /// Start `host` again at the instant.
    Start(Host, Instant),
    /// Start `host` on the other binary once it has exited (or kill it at the deadline).
    UpgradeWhenExited(Host, Instant),
}

/// A running pool. Fields drop in order: processes, then the network, then mounts.
struct Pool {
    cfg: CampaignConfig,
    procs: BTreeMap<Host, Proc>,
    net: Net,
    _mounts: Mounts,
    keys: Keys,
    faults: Recorder,
    etcd: Etcd,
    etcd_addr: String,
    bins: [PathBuf; 2],
    /// Which of `bins` each kvpool host runs.
    on_bin: HashMap<Host, usize>,
    incarnation: HashMap<usize, u32>,
    pending: Vec<Pending>,
    crashes: Vec<String>,
    step_downs: u32,
    status: Arc<Mutex<StatusSamples>>,
    /// The wall clock at the setup mark, time 0 of every report.
    started_at: String,
    _lock: RunLock,
}

/// What the status sampler saw.
#[derive(Default)]
struct StatusSamples {
    evictions: u64,
    last: Option<ClusterStatus>,
}

impl Pool {
    fn mark(&self, what: impl Into<String>) {
        let what = what.into();
        tracing::info!("{what}");
        self.faults.record(&Event::Mark { t: now_ns(), what });
    }

    fn data_dir(&self, h: Host) -> PathBuf {
        self.cfg.dir.join("data").join(h.to_string())
    }

    fn history_dir(&self) -> PathBuf {
        self.cfg.dir.join("history")
    }

    /// Builds the network, mounts and keys, and defines every process (none started).
    fn create(cfg: CampaignConfig, extra_hosts: &[Host]) -> anyhow::Result<Pool> {
        net::preflight()?;
        let lock = RunLock::take()?;
        net::cleanup_stale()?;
        net::unmount_stale();
        for d in ["logs", "history", "bin", "data"] {
            std::fs::create_dir_all(cfg.dir.join(d))?;
        }
        let mounts = Mounts(cfg.dir.join("data"));
        // etcd's and the stores' files live in RAM: an fsync on a disk
        // shared with compilers would stall etcd's elections.
        net::mount_tmpfs(&cfg.dir.join("data"), 1 << 30)?;
        let keys = write_keys(&cfg.dir)?;
        let bins = [cfg.dir.join("bin/kvpool-a"), cfg.dir.join("bin/kvpool-b")];
        for b in &bins {
            std::fs::copy(&cfg.kvpool, b)
                .with_context(|| format!("copy {} (the kvpool binary)", cfg.kvpool.display()))?;
        }
        let mut hosts = cfg.topo.hosts();
        hosts.extend_from_slice(extra_hosts);
        let net = Net::create(&hosts)?;
        let etcd_eps: Vec<String> = (0..cfg.topo.etcd)
            .map(|i| {
                format!(
                    "{}:2379",
                    net::ip(Host {
                        role: Role::Etcd,
                        idx: i
                    })
                )
            })
            .collect();
        let etcd_addr = format!("etcd://{}/{CLUSTER}", etcd_eps.join(";"));
        let etcd = Etcd::new(&etcd_eps.join(","), None).map_err(|e| anyhow::anyhow!("{e}"))?;
        let faults = Recorder::create(&cfg.dir.join("history/faults.jsonl"))?;
        let mut pool = Pool {
            procs: BTreeMap::new(),
            net,
            _mounts: mounts,
            keys,
            faults,
            etcd,
            etcd_addr,
            bins,
            on_bin: HashMap::new(),
            incarnation: HashMap::new(),
            pending: Vec::new(),
            crashes: Vec::new(),
            step_downs: 0,
            status: Arc::default(),
            started_at: history::wall_clock(),
            _lock: lock,
            cfg,
        };
        pool.mark(format!("setup; wall clock {}", pool.started_at));
        for h in hosts {
            if h.role == Role::Client {
                continue;
            }
            if h.role == Role::Store {
                // Room for the segment and a little more: what the disk-full fault fills.
                net::mount_tmpfs(&pool.data_dir(h), pool.cfg.segment_size + (4 << 20))?;
            }
            let p = pool.define(h, 0);
            pool.procs.insert(h, p);
        }
        Ok(pool)
    }

    /// The process of host `h`, running binary `bin` (kvpool hosts).
    fn define(&mut self, h: Host, bin: usize) -> Proc {
        let cfg = &self.cfg;
        let ip = net::ip(h);
        let log = cfg.dir.join("logs").join(format!("{h}.log"));
        let s = |v: &str| v.to_string();
        let kvpool = self.bins[bin].to_string_lossy().into_owned();
        let argv: Vec<String> = match h.role {
            Role::Etcd => {
                let peers: Vec<String> = (0..cfg.topo.etcd)
                    .map(|i| {
                        let e = Host {
                            role: Role::Etcd,
                            idx: i,
                        };
                        format!("e{i}=http://{}:2380", net::ip(e))
                    })
                    .collect();
                vec![
                    s("etcd"),
                    s("--name"),
                    format!("e{}", h.idx),
                    s("--data-dir"),
                    self.data_dir(h).to_string_lossy().into_owned(),
                    s("--listen-client-urls"),
                    format!("http://{ip}:2379"),
                    s("--advertise-client-urls"),
                    format!("http://{ip}:2379"),
                    s("--listen-peer-urls"),
                    format!("http://{ip}:2380"),
                    s("--initial-advertise-peer-urls"),
                    format!("http://{ip}:2380"),
                    s("--initial-cluster"),
                    peers.join(","),
                    s("--initial-cluster-state"),
                    s("new"),
                    s("--initial-cluster-token"),
                    s("kvchaos"),
                    s("--logger"),
                    s("zap"),
                    s("--log-level"),
                    s("warn"),
                ]
            }
            Role::Master => {
                let eps: Vec<String> = (0..cfg.topo.etcd)
                    .map(|i| {
                        format!(
                            "{}:2379",
                            net::ip(Host {
                                role: Role::Etcd,
                                idx: i
                            })
                        )
                    })
                    .collect();
                vec![
                    kvpool,
                    s("master"),
                    s("--rpc-address"),
                    ip.clone(),
                    s("--rpc-port"),
                    MASTER_PORT.to_string(),
                    s("--metrics-address"),
                    ip,
                    s("--metrics-port"),
                    s("9003"),
                    s("--enable-ha"),
                    s("--etcd-endpoints"),
                    eps.join(","),
                    s("--cluster-id"),
                    s(CLUSTER),
                    s("--ha-lease-ttl"),
                    cfg.ha_lease_ttl.clone(),
                    s("--client-ttl"),
                    cfg.client_ttl.clone(),
                    s("--store-grace"),
                    cfg.store_grace.clone(),
                    s("--secret-file"),
                    self.keys.admin.to_string_lossy().into_owned(),
                ]
            }
            Role::Store => vec![
                kvpool,
                s("store"),
                s("--master"),
                self.etcd_addr.clone(),
                s("--address"),
                ip,
                s("--port"),
                STORE_PORT.to_string(),
                s("--segment-size"),
                cfg.segment_size.to_string(),
                s("--data-dir"),
                self.data_dir(h).to_string_lossy().into_owned(),
                s("--name"),
                h.to_string(),
                s("--secret-file"),
                self.keys.store.to_string_lossy().into_owned(),
            ],
            Role::Client => unreachable!("workers are defined by worker()"),
        };
        self.on_bin.insert(h, bin);
        let mut p = Proc::new(&h.to_string(), &net::ns(h), argv, &log);
        p.env("KVPOOL_LOG", &self.cfg.log_level);
        if let (Role::Master | Role::Store, Some(bug)) = (h.role, &self.cfg.planted_bug) {
            p.env("KVPOOL_PLANTED_BUG", bug);
        }
        p
    }

    /// A worker process on client host `idx`, in `mode`, as a new incarnation.
    fn worker(&mut self, idx: usize, mode: &str, extra: &[String]) -> Proc {
        let h = Host {
            role: Role::Client,
            idx,
        };
        let inc = self.incarnation.entry(idx).or_insert(0);
        let n = *inc;
        *inc += 1;
        let cfg = &self.cfg;
        let history = self.history_dir().join(format!("{h}.{n}.jsonl"));
        let mut argv = cfg.worker_cmd.clone();
        argv.extend(
            [
                "--mode",
                mode,
                "--master",
                &self.etcd_addr,
                "--secret-file",
                &self.keys.client.to_string_lossy(),
                "--history",
                &history.to_string_lossy(),
                "--worker",
                &idx.to_string(),
                "--incarnation",
                &n.to_string(),
                "--seed",
                &cfg.seed.to_string(),
                "--keys",
                &cfg.keys.to_string(),
                "--writers",
                &cfg.writers.to_string(),
                "--readers",
                &cfg.readers.to_string(),
                "--value-max",
                &cfg.value_max.to_string(),
                "--think-ms",
                &cfg.think_ms.to_string(),
                "--name",
                &h.to_string(),
            ]
            .map(String::from),
        );
        argv.extend_from_slice(extra);
        let log = cfg.dir.join("logs").join(format!("{h}.log"));
        let mut p = Proc::new(&h.to_string(), &net::ns(h), argv, &log);
        p.env("KVPOOL_LOG", "warn");
        p
    }

    fn start(&mut self, h: Host) -> anyhow::Result<()> {
        if h.role == Role::Client {
            let mut p = self.worker(h.idx, "load", &[]);
            p.start()?;
            self.procs.insert(h, p);
            return Ok(());
        }
        self.procs.get_mut(&h).expect("defined").start()
    }

    fn start_role(&mut self, role: Role) -> anyhow::Result<()> {
        for idx in 0..self.cfg.topo.count(role) {
            self.start(Host { role, idx })?;
        }
        Ok(())
    }

    /// The master leading now, by the leader key in etcd.
    async fn leader(&self) -> Option<Host> {
        let etcd = self.etcd.clone();
        let addr = tokio::time::timeout(Duration::from_secs(2), async move {
            etcd.get(&leader_key(CLUSTER)).await
        })
        .await
        .ok()?
        .ok()??;
        (0..self.cfg.topo.masters)
            .map(|idx| Host {
                role: Role::Master,
                idx,
            })
            .find(|h| addr == format!("{}:{MASTER_PORT}", net::ip(*h)))
    }

    /// A client of the pool in the coordinator's namespace, for status.
    async fn status_client(&self) -> anyhow::Result<Client> {
        let mut c = ClientConfig::new(&self.etcd_addr);
        c.hostname = "coordinator".into();
        c.protocol = Protocol::Tcp;
        c.timeout = Duration::from_secs(2);
        c.retry_for = Duration::from_secs(2);
        c.security.credentials = Some(Credentials::load(&self.keys.client)?);
        Ok(Client::connect(c).await?)
    }

    /// The pool's status, or why not (bounded by a few seconds).
    async fn status(&self) -> anyhow::Result<ClusterStatus> {
        let c = tokio::time::timeout(Duration::from_secs(5), self.status_client())
            .await
            .context("connecting for status timed out")??;
        let st = tokio::time::timeout(Duration::from_secs(3), c.status())
            .await
            .context("status timed out")??;
        c.close().await;
        Ok(st)
    }

    /// Waits until a master leads and `stores` segments are mounted and live.
    async fn settle(&mut self, stores: usize, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        let mut last = String::from("nothing yet");
        while Instant::now() < deadline {
            self.supervise();
            if self.leader().await.is_some() {
                match self.status().await {
                    Ok(st) => {
                        let live = st.segments.iter().filter(|s| s.state == "live").count();
                        if st.role == "leader" && live == stores && st.segments.len() == stores {
                            return Ok(());
                        }
                        last = format!(
                            "role {}, {} segments, {live} live",
                            st.role,
                            st.segments.len()
                        );
                    }
                    Err(e) => last = e.to_string(),
                }
            } else {
                last = "no leader in etcd".into();
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!("the pool did not settle within {within:?}: {last}")
    }

    /// Notices processes that exited unasked: restarts them, and reports
    /// crashes (a master stepping down is expected, not a crash).
    fn supervise(&mut self) {
        let now = Instant::now();
        let mut restart = Vec::new();
        for (h, p) in self.procs.iter_mut() {
            if p.held {
                continue;
            }
            let Some(status) = p.poll_exit() else {
                continue;
            };
            let tail = p.log_tail(30);
            if h.role == Role::Master && tail.contains("lost master leadership") {
                self.step_downs += 1;
                tracing::info!("{h} stepped down ({status}); restarting it as a standby");
                restart.push(Pending::Start(*h, now + Duration::from_millis(500)));
            } else {
                let t = now_ns();
                self.crashes.push(format!(
                    "{h} exited unasked with {status} at {:.3}s (monotonic); log tail:\n{tail}",
                    t as f64 / 1e9
                ));
                restart.push(Pending::Start(*h, now + Duration::from_millis(500)));
            }
            p.held = true;
        }
        self.pending.extend(restart);
        let due: Vec<Pending> = {
            let (due, keep): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut self.pending)
                .into_iter()
                .partition(|p| match p {
                    Pending::Start(_, at) => *at <= now,
                    Pending::UpgradeWhenExited(..) => true,
                });
            self.pending = keep;
            due
        };
        for p in due {
            match p {
                Pending::Start(h, _) => {
                    if let Err(e) = self.start(h) {
                        self.crashes.push(format!("cannot restart {h}: {e:#}"));
                    }
                }
                Pending::UpgradeWhenExited(h, deadline) => {
                    let proc = self.procs.get_mut(&h).expect("defined");
                    let exited = !proc.running();
                    if !exited && now < deadline {
                        self.pending.push(Pending::UpgradeWhenExited(h, deadline));
                        continue;
                    }
                    if !exited {
                        self.crashes.push(format!(
                            "{h} did not exit within 20 s of SIGTERM (upgrade); killed"
                        ));
                        proc.kill9();
                    }
                    let next = 1 - self.on_bin.get(&h).copied().unwrap_or(0);
                    let p = self.define(h, next);
                    self.procs.insert(h, p);
                    self.mark(format!(
                        "{h} upgraded in place to {}",
                        self.bins[next].display()
                    ));
                    if let Err(e) = self.start(h) {
                        self.crashes
                            .push(format!("cannot start upgraded {h}: {e:#}"));
                    }
                }
            }
        }
    }

    /// Whether an upgrade of `h` still waits for its old process to exit.
    fn upgrading(&self, h: Host) -> bool {
        (self.pending.iter()).any(|p| matches!(p, Pending::UpgradeWhenExited(x, _) if *x == h))
    }

    fn proc(&mut self, h: Host) -> &mut Proc {
        self.procs.get_mut(&h).expect("every host has a process")
    }

    /// Starts fault `p` on `h` (resolved); returns what to record as its target.
    fn begin(&mut self, p: &Planned, h: Option<Host>) -> anyhow::Result<()> {
        match (&p.fault, h) {
            (Fault::Kill(_), Some(h)) => self.proc(h).kill9(),
            (Fault::Pause(_), Some(h)) => self.proc(h).pause(true),
            (Fault::Isolate(_), Some(h)) => self.net.link(h, false)?,
            (Fault::OneWay { inbound, .. }, Some(h)) => self.net.drop_packets(h, *inbound, true)?,
            (Fault::Split(side), _) => self.net.split(side, true)?,
            (Fault::DiskFull(s), _) => {
                let h = Host {
                    role: Role::Store,
                    idx: *s,
                };
                let filled = net::fill_disk(&self.data_dir(h), "chaos-filler")?;
                self.mark(format!(
                    "{h}: {filled} bytes of filler; restarting it on a full disk"
                ));
                self.proc(h).kill9();
                self.proc(h).start()?;
            }
            (Fault::Upgrade(_), Some(h)) => {
                self.proc(h).terminate();
                self.pending.push(Pending::UpgradeWhenExited(
                    h,
                    Instant::now() + Duration::from_secs(20),
                ));
            }
            (f, None) => bail!("{f} needs a host"),
        }
        Ok(())
    }

    /// Undoes fault `p` on `h`.
    fn end(&mut self, p: &Planned, h: Option<Host>) -> anyhow::Result<()> {
        match (&p.fault, h) {
            (Fault::Kill(_), Some(h)) => {
                if !self.proc(h).running() {
                    self.start(h)?;
                }
            }
            (Fault::Pause(_), Some(h)) => self.proc(h).pause(false),
            (Fault::Isolate(_), Some(h)) => self.net.link(h, true)?,
            (Fault::OneWay { inbound, .. }, Some(h)) => {
                self.net.drop_packets(h, *inbound, false)?
            }
            (Fault::Split(side), _) => self.net.split(side, false)?,
            (Fault::DiskFull(s), _) => {
                let h = Host {
                    role: Role::Store,
                    idx: *s,
                };
                std::fs::remove_file(self.data_dir(h).join("chaos-filler"))?;
            }
            // The restart happens once the old process has drained.
            (Fault::Upgrade(_), _) => {}
            (_, None) => {}
        }
        Ok(())
    }

    /// Which host `t` means now; `None` when the leader is unknown.
    async fn resolve(&self, t: Option<Target>) -> Option<Host> {
        match t? {
            Target::Host(h) => Some(h),
            Target::Leader => self.leader().await,
        }
    }

    /// Samples the pool's status every 2 s (evictions, for the checker).
    async fn spawn_sampler(&self, stop: tokio_util_stop::Stop) -> anyhow::Result<()> {
        let client = self.status_client().await?;
        let samples = self.status.clone();
        tokio::spawn(async move {
            while !stop.is_set() {
                if let Ok(Ok(st)) =
                    tokio::time::timeout(Duration::from_secs(3), client.status()).await
                {
                    let mut s = samples.lock();
                    s.evictions = s.evictions.max(st.evictions);
                    s.last = Some(st);
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            client.close().await;
        });
        Ok(())
    }

    /// Panics in any process's log, one line each.
    fn panics(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Ok(rd) = std::fs::read_dir(self.cfg.dir.join("logs")) {
            for e in rd.flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                for l in text.lines().filter(|l| l.contains("panicked at")) {
                    out.push(format!("{}: {l}", e.file_name().to_string_lossy()));
                }
            }
        }
        out
    }
}

/// A stop flag shared with background tasks.
mod tokio_util_stop {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Set once; read by loops that should end.
    #[derive(Clone, Default)]
    pub struct Stop(Arc<AtomicBool>);

    impl Stop {
        /// Asks the loops to end.
        pub fn set(&self) {
            self.0.store(true, Ordering::Relaxed);
        }
        /// Whether they should.
        pub fn is_set(&self) -> bool {
            self.0.load(Ordering::Relaxed)
        }
    }
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
    let report = checker::check(
        &events,
        CheckConfig {
            evictions_possible: evictions,
            ..CheckConfig::default()
        },
    );
    Ok((events, report))
}

/// Failover times of the leader kills in `events`.
pub fn failovers(events: &[Event]) -> Vec<Failover> {
    let mut invokes: HashMap<u64, (u64, bool)> = HashMap::new();
    let mut writes: Vec<(u64, u64)> = Vec::new();
    for e in events {
        match e {
            Event::Invoke { id, t, op, .. } => {
                invokes.insert(*id, (*t, matches!(op, Op::Put { .. } | Op::Upsert { .. })));
            }
            Event::Complete { id, t, results } => {
                if let Some(&(inv, true)) = invokes.get(id) {
                    if results.iter().any(|r| matches!(r, Outcome::Ok)) {
                        writes.push((inv, *t));
                    }
                }
            }
            _ => {}
        }
    }
    let kills: Vec<(u32, u64, String)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Fault {
                t,
                n,
                phase,
                kind,
                target,
            } if phase == "start" && kind == "kill" && target.ends_with("(leader)") => {
                Some((*n, *t, target.trim_end_matches(" (leader)").to_string()))
            }
            _ => None,
        })
        .collect();
    kills
        .iter()
        .enumerate()
        .map(|(i, (n, t, master))| {
            let next = kills.get(i + 1).map_or(u64::MAX, |k| k.1);
            let served = writes
                .iter()
                .filter(|(inv, done)| *inv >= *t && *done < next)
                .map(|(_, done)| done - t)
                .min();
            Failover {
                n: *n,
                master: master.clone(),
                serves_after_ms: served.map(|d| d / 1_000_000),
            }
        })
        .collect()
}

/// Writes taken through the fault window of `events` (see [`Availability`]).
pub fn availability(events: &[Event]) -> Option<Availability> {
    // Each fault's span and target (an end names no target).
    let mut spans: Vec<(u64, u64, &str)> = Vec::new();
    let mut open: HashMap<u32, (u64, &str)> = HashMap::new();
    let (mut from, mut to) = (u64::MAX, 0);
    for e in events {
        let Event::Fault {
            t,
            n,
            phase,
            target,
            ..
        } = e
        else {
            continue;
        };
        if phase == "start" {
            from = from.min(*t);
            open.insert(*n, (*t, target));
        } else {
            to = to.max(*t);
            if let Some((start, target)) = open.remove(n) {
                spans.push((start, *t, target));
            }
        }
    }
    if from >= to {
        return None;
    }
    spans.extend(
        open.into_values()
            .map(|(start, target)| (start, to, target)),
    );
    let mut writes: HashMap<u64, bool> = HashMap::new();
    let mut done: Vec<u64> = Vec::new();
    for e in events {
        match e {
            Event::Invoke { id, op, .. } => {
                writes.insert(*id, matches!(op, Op::Put { .. } | Op::Upsert { .. }));
            }
            Event::Complete { id, t, results }
                if writes.get(id) == Some(&true)
                    && (from..to).contains(t)
                    && results.iter().any(|r| matches!(r, Outcome::Ok)) =>
            {
                done.push(*t)
            }
            _ => {}
        }
    }
    done.sort_unstable();
    const SEC: u64 = 1_000_000_000;
    let window_s = (to - from) / SEC;
    let mut served = vec![false; window_s as usize];
    for t in &done {
        if let Some(s) = served.get_mut(((t - from) / SEC) as usize) {
            *s = true;
        }
    }
    let edges = std::iter::once(from)
        .chain(done.iter().copied())
        .chain([to]);
    let longest = edges
        .clone()
        .zip(edges.skip(1))
        .map(|(a, b)| b - a)
        .max()
        .unwrap_or(0);
    let mut causes = Causes::default();
    for (i, _) in served.iter().enumerate().filter(|(_, s)| !**s) {
        let a = from + i as u64 * SEC;
        let active = spans
            .iter()
            .filter(|(start, end, _)| *start < a + SEC && *end > a)
            .map(|(_, _, target)| *target);
        causes.count(active);
    }
    Some(Availability {
        window_s,
        seconds_without_write: served.iter().filter(|s| !**s).count() as u64,
        longest_gap_ms: longest / 1_000_000,
        without_write_by_cause: causes,
    })
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
        unsettled,
        report,
        dir: dir.clone(),
        started_at,
        planted_bug: cfg.planted_bug.clone(),
    };
    std::fs::write(dir.join("report.txt"), result.render())?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&result)?,
    )?;
    Ok(result)
}

/// What the store-join measurement found.
#[derive(Debug, Clone, Serialize)]
pub struct JoinResult {
    /// The pool's used fraction when the store joined.
    pub fill: f64,
    /// Objects placed on each segment in the window, by name.
    pub placed: BTreeMap<String, u64>,
    /// The new store's share of the objects placed.
    pub share: f64,
    /// Its fair share: one over the number of stores.
    pub fair: f64,
    /// Seconds measured.
    pub window_s: u64,
    /// Objects the pool evicted in the window (placements are counted as
    /// regions gained, which evictions would blur).
    pub evictions: u64,
    /// Violations the checker found meanwhile.
    pub violations: usize,
    /// Where logs and histories are.
    pub dir: PathBuf,
}

impl JoinResult {
    /// The human report.
    pub fn render(&self) -> String {
        let mut s = format!(
            "store join: pool {:.1}% full when store-{} joined; over {} s it took {:.1}% of new objects, {:.2}x its fair share ({:.1}%)\n",
            self.fill * 100.0,
            self.placed.len() - 1,
            self.window_s,
            self.share * 100.0,
            self.share / self.fair,
            self.fair * 100.0
        );
        for (name, n) in &self.placed {
            s.push_str(&format!("  {name}: {n} objects\n"));
        }
        s.push_str(&format!(
            "evictions in the window: {}{}\n",
            self.evictions,
            if self.evictions > 0 {
                " (regions freed blur the count: write less per window)"
            } else {
                ""
            }
        ));
        s.push_str(&format!("checker violations: {}\n", self.violations));
        s
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn fault(t: u64, phase: &str) -> Event {
        fault_on(t, phase, 1, "store-0")
    }

    fn fault_on(t: u64, phase: &str, n: u32, target: &str) -> Event {
        Event::Fault {
            t: t * MS,
            n,
            phase: phase.into(),
            kind: "kill".into(),
            target: if phase == "start" {
                target.into()
            } else {
                String::new()
            },
        }
    }

    /// Invoke and completion of operation `id`, done at `done` ms.
    fn call(id: u64, op: Op, done: u64, ok: bool) -> [Event; 2] {
        let outcome = if ok {
            Outcome::Ok
        } else {
            Outcome::Err {
                code: -800,
                msg: "down".into(),
            }
        };
        [
            Event::Invoke {
                id,
                t: done * MS - MS,
                client: "client-0.0".into(),
                op,
            },
            Event::Complete {
                id,
                t: done * MS,
                results: vec![outcome],
            },
        ]
    }

    #[test]
    fn availability_counts_seconds_and_the_longest_gap_of_acknowledged_writes() {
        let put = || Op::Put { items: Vec::new() };
        let mut events = vec![fault(0, "start")];
        events.extend(call(1, put(), 500, true));
        events.extend(call(2, put(), 1_500, true));
        events.extend(call(3, put(), 2_500, false));
        events.extend(call(4, Op::Get { keys: Vec::new() }, 3_000, true));
        events.extend(call(5, Op::Upsert { items: Vec::new() }, 6_200, true));
        events.push(fault(10_000, "end"));
        events.extend(call(6, put(), 10_500, true));
        let a = availability(&events).expect("a fault window");
        assert_eq!(
            a,
            Availability {
                window_s: 10,
                seconds_without_write: 7,
                longest_gap_ms: 4_700,
                without_write_by_cause: Causes {
                    stores: 7,
                    ..Causes::default()
                },
            }
        );
        assert_eq!(availability(&events[1..7]), None, "no faults");
    }

    #[test]
    fn seconds_without_a_write_are_put_down_to_the_most_central_fault() {
        let mut events = vec![
            fault_on(0, "start", 1, "store-1"),
            fault_on(1_500, "start", 2, "master-0 (leader)"),
            fault_on(3_000, "end", 2, ""),
            fault_on(4_000, "end", 1, ""),
            fault_on(5_000, "start", 3, "client-2"),
            fault_on(6_000, "end", 3, ""),
            fault_on(7_000, "start", 4, "split {etcd-0,store-1} from the rest"),
        ];
        // One write in second 8 only; the split never ends: it lasts to the
        // window's end (the last end seen, 9 s).
        events.extend(call(1, Op::Put { items: Vec::new() }, 8_500, true));
        events.push(fault_on(9_000, "end", 9, ""));
        let a = availability(&events).expect("a fault window");
        assert_eq!(a.seconds_without_write, 8);
        assert_eq!(
            a.without_write_by_cause,
            Causes {
                // Seconds 1-2 (the leader), 7 (the split).
                leader_etcd_or_split: 3,
                // Seconds 0 and 3: the store alone.
                stores: 2,
                // Second 5: a client.
                others: 1,
                // Seconds 4 and 6: nothing active.
                none: 2,
            }
        );
    }
}
