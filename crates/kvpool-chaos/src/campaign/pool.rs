//! A running pool: its network, mounts, keys and processes, and what the
//! campaign does to them (start, supervise, fault, heal, sample status).

use super::*;

/// What was left mounted: unmounted when the pool is dropped (after its processes).
pub(super) struct Mounts(PathBuf);

impl Drop for Mounts {
    fn drop(&mut self) {
        net::unmount_below(&self.0);
    }
}

/// A restart waiting for its moment.
pub(super) enum Pending {
    /// Start `host` again at the instant.
    Start(Host, Instant),
    /// Start `host` on the other binary once it has exited (or kill it at the deadline).
    UpgradeWhenExited(Host, Instant),
}

/// A running pool. Fields drop in order: processes, then the network, then mounts.
pub(super) struct Pool {
    pub(super) cfg: CampaignConfig,
    pub(super) procs: BTreeMap<Host, Proc>,
    pub(super) net: Net,
    pub(super) _mounts: Mounts,
    pub(super) keys: Keys,
    pub(super) faults: Recorder,
    pub(super) etcd: Etcd,
    pub(super) etcd_addr: String,
    pub(super) bins: [PathBuf; 2],
    /// Which of `bins` each kvpool host runs.
    pub(super) on_bin: HashMap<Host, usize>,
    pub(super) incarnation: HashMap<usize, u32>,
    pub(super) pending: Vec<Pending>,
    pub(super) crashes: Vec<String>,
    pub(super) step_downs: u32,
    pub(super) status: Arc<Mutex<StatusSamples>>,
    /// The wall clock at the setup mark, time 0 of every report.
    pub(super) started_at: String,
    pub(super) _lock: RunLock,
}

/// What the status sampler saw.
#[derive(Default)]
pub(super) struct StatusSamples {
    pub(super) evictions: u64,
    pub(super) last: Option<ClusterStatus>,
    /// Demotions and promotions seen, summed over the leaders sampled (a
    /// new leader counts from 0).
    pub(super) moves: (u64, u64),
}

impl StatusSamples {
    fn take(&mut self, st: ClusterStatus) {
        self.evictions = self.evictions.max(st.evictions);
        let grew = |now: u64, before: u64| now.checked_sub(before).unwrap_or(now);
        if let Some(before) = &self.last {
            self.moves.0 += grew(st.demotions, before.demotions);
            self.moves.1 += grew(st.promotions, before.promotions);
        }
        self.last = Some(st);
    }
}

impl Pool {
    pub(super) fn mark(&self, what: impl Into<String>) {
        let what = what.into();
        tracing::info!("{what}");
        self.faults.record(&Event::Mark { t: now_ns(), what });
    }

    pub(super) fn data_dir(&self, h: Host) -> PathBuf {
        self.cfg.dir.join("data").join(h.to_string())
    }

    pub(super) fn history_dir(&self) -> PathBuf {
        self.cfg.dir.join("history")
    }

    /// Builds the network, mounts and keys, and defines every process (none started).
    pub(super) fn create(cfg: CampaignConfig, extra_hosts: &[Host]) -> anyhow::Result<Pool> {
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
        // Hosts start on the first: the earlier build, when there is one.
        let first = cfg.previous.as_ref().unwrap_or(&cfg.kvpool);
        for (b, from) in bins.iter().zip([first, &cfg.kvpool]) {
            std::fs::copy(from, b)
                .with_context(|| format!("copy {} (a kvpool binary)", from.display()))?;
        }
        let mut hosts = cfg.topo.hosts();
        hosts.extend_from_slice(extra_hosts);
        let net = Net::create(&hosts)?;
        let etcd_eps = etcd_endpoints(cfg.topo.etcd);
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
        if let Some(p) = &pool.cfg.previous {
            let (old, new) = (p.display(), pool.cfg.kvpool.display());
            pool.mark(format!(
                "mixed versions: hosts start on {old}, upgrades switch to {new} and back"
            ));
        }
        for h in hosts {
            if h.role == Role::Client {
                continue;
            }
            if h.role == Role::Store {
                // Room for the segment (and disk tier) and a little more:
                // what the disk-full fault fills.
                let room = pool.cfg.segment_size + pool.cfg.disk_size + (4 << 20);
                net::mount_tmpfs(&pool.data_dir(h), room)?;
            }
            let p = pool.define(h, 0);
            pool.procs.insert(h, p);
        }
        Ok(pool)
    }

    /// The process of host `h`, running binary `bin` (kvpool hosts).
    pub(super) fn define(&mut self, h: Host, bin: usize) -> Proc {
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
                let eps = etcd_endpoints(cfg.topo.etcd);
                let mut argv = vec![
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
                ];
                if cfg.disk_size > 0 {
                    argv.extend([s("--demote-watermark"), s("0.5")]);
                }
                argv
            }
            Role::Store => {
                let mut argv = vec![
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
                ];
                if cfg.disk_size > 0 {
                    // On the pool's tmpfs, through the page cache (no
                    // O_DIRECT there): the moves' logic is what is tested.
                    let disk = self.data_dir(h).join("disk");
                    argv.extend([
                        s("--disk-dir"),
                        disk.to_string_lossy().into_owned(),
                        s("--disk-size"),
                        cfg.disk_size.to_string(),
                    ]);
                }
                argv
            }
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
    pub(super) fn worker(&mut self, idx: usize, mode: &str, extra: &[String]) -> Proc {
        let h = Host {
            role: Role::Client,
            idx,
        };
        let inc = self.incarnation.entry(idx).or_insert(0);
        let n = *inc;
        *inc += 1;
        let cfg = &self.cfg;
        let history = self.history_dir().join(format!("{h}.{n}.jsonl"));
        let mut argv = match &cfg.previous_worker_cmd {
            Some(old) if mode == "load" && idx % 2 == 1 => old.clone(),
            _ => cfg.worker_cmd.clone(),
        };
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

    pub(super) fn start(&mut self, h: Host) -> anyhow::Result<()> {
        if h.role == Role::Client {
            let mut p = self.worker(h.idx, "load", &[]);
            p.start()?;
            self.procs.insert(h, p);
            return Ok(());
        }
        self.procs.get_mut(&h).expect("defined").start()
    }

    pub(super) fn start_role(&mut self, role: Role) -> anyhow::Result<()> {
        for idx in 0..self.cfg.topo.count(role) {
            self.start(Host { role, idx })?;
        }
        Ok(())
    }

    /// The master leading now, by the leader key in etcd.
    pub(super) async fn leader(&self) -> Option<Host> {
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
    pub(super) async fn status_client(&self) -> anyhow::Result<Client> {
        let mut c = ClientConfig::new(&self.etcd_addr);
        c.hostname = "coordinator".into();
        c.protocol = Protocol::Tcp;
        c.timeout = Duration::from_secs(2);
        c.retry_for = Duration::from_secs(2);
        c.security.credentials = Some(Credentials::load(&self.keys.client)?);
        Ok(Client::connect(c).await?)
    }

    /// The pool's status, or why not (bounded by a few seconds).
    pub(super) async fn status(&self) -> anyhow::Result<ClusterStatus> {
        let c = tokio::time::timeout(Duration::from_secs(5), self.status_client())
            .await
            .context("connecting for status timed out")??;
        let st = tokio::time::timeout(Duration::from_secs(3), c.status())
            .await
            .context("status timed out")??;
        c.close().await;
        Ok(st)
    }

    /// Waits until a master leads and the segments of `stores` stores (with
    /// their disk tiers) are mounted and live.
    pub(super) async fn settle(&mut self, stores: usize, within: Duration) -> anyhow::Result<()> {
        let stores = if self.cfg.disk_size > 0 {
            2 * stores
        } else {
            stores
        };
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
    pub(super) fn supervise(&mut self) {
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
    pub(super) fn upgrading(&self, h: Host) -> bool {
        (self.pending.iter()).any(|p| matches!(p, Pending::UpgradeWhenExited(x, _) if *x == h))
    }

    pub(super) fn proc(&mut self, h: Host) -> &mut Proc {
        self.procs.get_mut(&h).expect("every host has a process")
    }

    /// Starts fault `p` on `h` (resolved); returns what to record as its target.
    pub(super) fn begin(&mut self, p: &Planned, h: Option<Host>) -> anyhow::Result<()> {
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
                // Stopped first: a store still writing its disk tier would
                // take space between measuring what is free and filling it.
                self.proc(h).kill9();
                let filled = net::fill_disk(&self.data_dir(h), "chaos-filler")?;
                self.mark(format!(
                    "{h}: {filled} bytes of filler; restarting it on a full disk"
                ));
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
    pub(super) fn end(&mut self, p: &Planned, h: Option<Host>) -> anyhow::Result<()> {
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
    pub(super) async fn resolve(&self, t: Option<Target>) -> Option<Host> {
        match t? {
            Target::Host(h) => Some(h),
            Target::Leader => self.leader().await,
        }
    }

    /// Samples the pool's status every 2 s (evictions, for the checker, and
    /// tier moves, for the report).
    pub(super) async fn spawn_sampler(&self, stop: tokio_util_stop::Stop) -> anyhow::Result<()> {
        let client = self.status_client().await?;
        let samples = self.status.clone();
        tokio::spawn(async move {
            while !stop.is_set() {
                if let Ok(Ok(st)) =
                    tokio::time::timeout(Duration::from_secs(3), client.status()).await
                {
                    samples.lock().take(st);
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            client.close().await;
        });
        Ok(())
    }

    /// Panics in any process's log, one line each.
    pub(super) fn panics(&self) -> Vec<String> {
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
pub(super) mod tokio_util_stop {
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

/// The client addresses of the campaign's `n` etcd members.
fn etcd_endpoints(n: usize) -> Vec<String> {
    (0..n)
        .map(|idx| {
            format!(
                "{}:2379",
                net::ip(Host {
                    role: Role::Etcd,
                    idx
                })
            )
        })
        .collect()
}
