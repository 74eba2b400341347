//! The workload: a client process on its own host running writer and reader
//! tasks on the Rust `kvpool-client`, recording each call as an invoke and
//! a completion (see [`crate::history`]).
//!
//! Writers mix `put`, `upsert`, their batch forms, `remove` (some forced)
//! and reads; readers mix `get`, `batch_get`, `exist` and `batch_exist`.
//! Keys are shared by every client (`k/00000`..), half the calls on a small
//! hot set, so clients read each other's writes and race on keys, and the
//! location cache serves repeat reads. Values encode key and version
//! ([`crate::value`]); versions are unique: worker, incarnation and a
//! counter.
//!
//! Other modes: `verify` reads every key once the pool has healed (the
//! campaign's final check), `fill` writes fresh keys until the pool is
//! nearly full, `fresh` writes only fresh keys (the store-join measurement).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kvpool_client::{Client, ClientConfig, Protocol, ReplicateConfig};
use kvpool_net::auth::Credentials;
use kvpool_proto::{KvError, KvResult};

use crate::history::{now_ns, Event, Op, Outcome, Recorder, Written};
use crate::schedule::Rng;
use crate::value;

/// What a worker process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Mixed writers and readers until SIGTERM.
    Load,
    /// Read every key, retrying transient failures, then exit.
    Verify,
    /// Put fresh keys until the pool is `fill_to` full, then exit.
    Fill,
    /// Put only fresh keys until SIGTERM.
    Fresh,
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "load" => Ok(Mode::Load),
            "verify" => Ok(Mode::Verify),
            "fill" => Ok(Mode::Fill),
            "fresh" => Ok(Mode::Fresh),
            o => Err(format!("unknown mode {o:?} (load, verify, fill, fresh)")),
        }
    }
}

/// Settings of one worker process.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// What to do.
    pub mode: Mode,
    /// Master address (`etcd://...`).
    pub master: String,
    /// The client key.
    pub secret_file: Option<std::path::PathBuf>,
    /// Where to record.
    pub history: std::path::PathBuf,
    /// The worker's number (< 256).
    pub worker: u32,
    /// How many times this worker was started before (< 65,536).
    pub incarnation: u32,
    /// Seed of the operation stream.
    pub seed: u64,
    /// Keys of the shared key space.
    pub keys: u32,
    /// Writer tasks.
    pub writers: u32,
    /// Reader tasks.
    pub readers: u32,
    /// Largest value in bytes.
    pub value_max: u32,
    /// Pause between a task's calls, in milliseconds (0 = none).
    pub think_ms: u64,
    /// For [`Mode::Fill`]: the pool's used fraction to stop at.
    pub fill_to: f64,
    /// The name of this process in the history (`client-0`).
    pub name: String,
}

/// The name of key `i` of the shared key space.
pub fn key(i: u32) -> String {
    format!("k/{i:05}")
}

/// Runs a worker until it is done (or SIGTERM, for the endless modes).
pub async fn run(cfg: WorkerConfig) -> anyhow::Result<()> {
    let mut ccfg = ClientConfig::new(&cfg.master);
    ccfg.hostname = cfg.name.clone();
    // Hosts are separate machines: the segment files on this one's disk
    // are not theirs to map.
    ccfg.protocol = Protocol::Tcp;
    if let Some(f) = &cfg.secret_file {
        ccfg.security.credentials = Some(Credentials::load(f)?);
    }
    let rec = Arc::new(Recorder::create(&cfg.history)?);
    let client = connect(ccfg).await?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            if let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                term.recv().await;
                stop.store(true, Ordering::Relaxed);
            }
        });
    }
    let ids = Arc::new(Ids::new(cfg.worker, cfg.incarnation));
    let ctx = Ctx {
        client,
        rec,
        ids,
        client_name: format!("{}.{}", cfg.name, cfg.incarnation),
        cfg: cfg.clone(),
        stop,
    };
    match cfg.mode {
        Mode::Verify => verify(&ctx).await,
        Mode::Fill => fill(&ctx).await,
        Mode::Load | Mode::Fresh => {
            let mut tasks = Vec::new();
            let n = cfg.writers
                + if cfg.mode == Mode::Load {
                    cfg.readers
                } else {
                    0
                };
            for t in 0..n {
                let ctx = ctx.clone();
                let seed = Rng::derive(
                    cfg.seed,
                    ((cfg.worker as u64) << 40) | ((cfg.incarnation as u64) << 20) | t as u64,
                );
                let writer = t < cfg.writers;
                tasks.push(tokio::spawn(async move {
                    let mut rng = Rng::new(seed);
                    while !ctx.stop.load(Ordering::Relaxed) {
                        match (ctx.cfg.mode, writer) {
                            (Mode::Fresh, _) => ctx.fresh_put(&mut rng).await,
                            (_, true) => ctx.write_step(&mut rng).await,
                            (_, false) => ctx.read_step(&mut rng).await,
                        }
                        if ctx.cfg.think_ms > 0 {
                            let ms = rng.between(ctx.cfg.think_ms / 2, ctx.cfg.think_ms * 3 / 2);
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                    }
                }));
            }
            for t in tasks {
                t.await.context("a workload task panicked")?;
            }
            Ok(())
        }
    }
}

/// Connects, retrying for a while: the pool may be mid-failover.
async fn connect(cfg: ClientConfig) -> anyhow::Result<Client> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match Client::connect(cfg.clone()).await {
            Ok(c) => return Ok(c),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "cannot connect yet");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => anyhow::bail!("cannot connect to {}: {e}", cfg.master),
        }
    }
}

/// Operation ids and versions: worker, incarnation and a counter, so no
/// two writes of a campaign share a version.
struct Ids {
    base: u64,
    next: AtomicU64,
}

impl Ids {
    fn new(worker: u32, incarnation: u32) -> Ids {
        assert!(worker < 256 && incarnation < 65_536);
        Ids {
            base: ((worker as u64 + 1) << 48) | ((incarnation as u64) << 32),
            next: AtomicU64::new(1),
        }
    }

    fn next(&self) -> u64 {
        self.base | self.next.fetch_add(1, Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct Ctx {
    client: Client,
    rec: Arc<Recorder>,
    ids: Arc<Ids>,
    client_name: String,
    cfg: WorkerConfig,
    stop: Arc<AtomicBool>,
}

/// An error as recorded.
fn err(e: &KvError) -> Outcome {
    Outcome::Err {
        code: e.code.as_i32(),
        msg: e.message.clone(),
    }
}

fn unit(r: &KvResult<()>) -> Outcome {
    match r {
        Ok(()) => Outcome::Ok,
        Err(e) => err(e),
    }
}

impl Ctx {
    /// Records the invoke, runs `call`, records the completion.
    async fn recorded<F>(&self, op: Op, call: F)
    where
        F: std::future::Future<Output = Vec<Outcome>>,
    {
        let id = self.ids.next();
        self.rec.record(&Event::Invoke {
            id,
            t: now_ns(),
            client: self.client_name.clone(),
            op,
        });
        let results = call.await;
        self.rec.record(&Event::Complete {
            id,
            t: now_ns(),
            results,
        });
    }

    fn pick_key(&self, rng: &mut Rng) -> String {
        let hot = (self.cfg.keys / 20).max(1);
        if rng.chance(0.5) {
            key(rng.below(hot as u64) as u32)
        } else {
            key(rng.below(self.cfg.keys as u64) as u32)
        }
    }

    fn distinct_keys(&self, rng: &mut Rng, n: usize) -> Vec<String> {
        let mut v: Vec<String> = Vec::with_capacity(n);
        while v.len() < n.min(self.cfg.keys as usize) {
            let k = self.pick_key(rng);
            if !v.contains(&k) {
                v.push(k);
            }
        }
        v
    }

    fn value_len(&self, rng: &mut Rng) -> usize {
        let max = self.cfg.value_max.max(value::MIN_LEN as u32) as u64;
        if rng.chance(0.7) {
            rng.between(value::MIN_LEN as u64, max.min(1024)) as usize
        } else {
            rng.between(value::MIN_LEN as u64, max) as usize
        }
    }

    fn replicate(rng: &mut Rng) -> ReplicateConfig {
        ReplicateConfig {
            replica_num: if rng.chance(0.5) { 1 } else { 2 },
            ..ReplicateConfig::default()
        }
    }

    /// One writer call.
    async fn write_step(&self, rng: &mut Rng) {
        match rng.below(100) {
            0..=29 => self.write(rng, 1, false).await,
            30..=59 => self.write(rng, 1, true).await,
            60..=74 => {
                let n = rng.between(2, 6) as usize;
                let upsert = rng.chance(0.5);
                self.write(rng, n, upsert).await
            }
            75..=84 => {
                let force = rng.chance(0.25);
                let n = if rng.chance(0.7) {
                    1
                } else {
                    rng.between(2, 4) as usize
                };
                self.remove(rng, n, force).await
            }
            _ => self.read_step(rng).await,
        }
    }

    /// One reader call.
    async fn read_step(&self, rng: &mut Rng) {
        match rng.below(100) {
            0..=54 => {
                let k = vec![self.pick_key(rng)];
                self.get(k).await
            }
            55..=74 => {
                let n = rng.between(2, 8) as usize;
                let k = self.distinct_keys(rng, n);
                self.get(k).await
            }
            _ => {
                let n = if rng.chance(0.6) {
                    1
                } else {
                    rng.between(2, 8) as usize
                };
                let k = self.distinct_keys(rng, n);
                self.exist(k).await
            }
        }
    }

    async fn write(&self, rng: &mut Rng, n: usize, upsert: bool) {
        let keys = self.distinct_keys(rng, n);
        let items: Vec<Written> = keys
            .into_iter()
            .map(|key| Written {
                key,
                version: self.ids.next(),
                len: self.value_len(rng) as u32,
            })
            .collect();
        self.write_items(items, upsert, Self::replicate(rng)).await;
    }

    async fn write_items(&self, items: Vec<Written>, upsert: bool, rc: ReplicateConfig) {
        let values: Vec<Vec<u8>> = items
            .iter()
            .map(|w| value::encode(&w.key, w.version, w.len as usize))
            .collect();
        let op = if upsert {
            Op::Upsert {
                items: items.clone(),
            }
        } else {
            Op::Put {
                items: items.clone(),
            }
        };
        let client = &self.client;
        self.recorded(op, async {
            if items.len() == 1 {
                let r = if upsert {
                    client.upsert(&items[0].key, &values[0], &rc).await
                } else {
                    client.put(&items[0].key, &values[0], &rc).await
                };
                vec![unit(&r)]
            } else {
                let batch: Vec<(&str, &[u8])> = (items.iter())
                    .zip(&values)
                    .map(|(w, v)| (w.key.as_str(), v.as_slice()))
                    .collect();
                client
                    .batch_put_values(&batch, &rc, upsert)
                    .await
                    .iter()
                    .map(unit)
                    .collect()
            }
        })
        .await
    }

    async fn remove(&self, rng: &mut Rng, n: usize, force: bool) {
        let keys = self.distinct_keys(rng, n);
        let client = &self.client;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let op = Op::Remove {
            keys: keys.clone(),
            force,
        };
        self.recorded(op, async {
            if refs.len() == 1 {
                vec![unit(&client.remove(refs[0], force).await)]
            } else {
                client
                    .batch_remove(&refs, force)
                    .await
                    .iter()
                    .map(unit)
                    .collect()
            }
        })
        .await
    }

    async fn get(&self, keys: Vec<String>) {
        let client = &self.client;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let op = Op::Get { keys: keys.clone() };
        self.recorded(op, async {
            let res = if refs.len() == 1 {
                vec![client.get(refs[0]).await]
            } else {
                client.batch_get(&refs).await
            };
            res.iter()
                .zip(&keys)
                .map(|(r, k)| match r {
                    Ok(bytes) => match value::decode(k, bytes) {
                        value::Decoded::Version(version) => Outcome::Value { version },
                        value::Decoded::Corrupt(why) => Outcome::Corrupt { why },
                    },
                    Err(e) => err(e),
                })
                .collect()
        })
        .await
    }

    async fn exist(&self, keys: Vec<String>) {
        let client = &self.client;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let op = Op::Exist { keys: keys.clone() };
        self.recorded(op, async {
            let res = if refs.len() == 1 {
                vec![client.exist(refs[0]).await]
            } else {
                client.batch_exist(&refs).await
            };
            res.iter()
                .map(|r| match r {
                    Ok(present) => Outcome::Exists { present: *present },
                    Err(e) => err(e),
                })
                .collect()
        })
        .await
    }

    /// A put of a key never used before, of the worker's own (`f/...`).
    async fn fresh_put(&self, rng: &mut Rng) {
        let version = self.ids.next();
        let key = format!("f/{version:016x}");
        let len = rng.between(4 << 10, (self.cfg.value_max as u64).max(4 << 10)) as u32;
        let rc = ReplicateConfig::default();
        self.write_items(vec![Written { key, version, len }], false, rc)
            .await
    }
}

/// Reads every key of the key space (64 per call), again and again for the
/// keys that failed transiently, for up to a minute.
async fn verify(ctx: &Ctx) -> anyhow::Result<()> {
    let mut todo: Vec<String> = (0..ctx.cfg.keys).map(key).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !todo.is_empty() {
        let mut again = Vec::new();
        for chunk in todo.chunks(64) {
            let keys = chunk.to_vec();
            let client = &ctx.client;
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let id = ctx.ids.next();
            ctx.rec.record(&Event::Invoke {
                id,
                t: now_ns(),
                client: ctx.client_name.clone(),
                op: Op::Get { keys: keys.clone() },
            });
            let res = client.batch_get(&refs).await;
            let mut results = Vec::with_capacity(res.len());
            for (r, k) in res.iter().zip(&keys) {
                results.push(match r {
                    Ok(bytes) => match value::decode(k, bytes) {
                        value::Decoded::Version(version) => Outcome::Value { version },
                        value::Decoded::Corrupt(why) => Outcome::Corrupt { why },
                    },
                    Err(e) => {
                        if e.code.is_transient() {
                            again.push(k.clone());
                        }
                        err(e)
                    }
                });
            }
            ctx.rec.record(&Event::Complete {
                id,
                t: now_ns(),
                results,
            });
        }
        if again.is_empty() || tokio::time::Instant::now() > deadline {
            if !again.is_empty() {
                anyhow::bail!("{} keys still unreadable after a minute", again.len());
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        todo = again;
    }
    Ok(())
}

/// Puts fresh keys until the pool is `fill_to` full.
async fn fill(ctx: &Ctx) -> anyhow::Result<()> {
    let mut rng = Rng::new(ctx.cfg.seed);
    loop {
        let st = ctx.client.status().await?;
        if st.capacity > 0 && st.used as f64 >= ctx.cfg.fill_to * st.capacity as f64 {
            return Ok(());
        }
        let batch: Vec<Written> = (0..16)
            .map(|_| {
                let version = ctx.ids.next();
                Written {
                    key: format!("fill/{version:016x}"),
                    version,
                    len: rng.between((ctx.cfg.value_max / 2) as u64, ctx.cfg.value_max as u64)
                        as u32,
                }
            })
            .collect();
        ctx.write_items(batch, false, ReplicateConfig::default())
            .await;
    }
}

/// The worker's command-line flags (`kvpool-chaos worker ...`).
#[derive(clap::Args, Debug, Clone)]
pub struct WorkerArgs {
    /// load, verify, fill or fresh.
    #[arg(long, default_value = "load")]
    pub mode: Mode,
    /// Master address, `etcd://...` in a campaign.
    #[arg(long)]
    pub master: String,
    /// The client key file.
    #[arg(long)]
    pub secret_file: Option<std::path::PathBuf>,
    /// History file to append to.
    #[arg(long)]
    pub history: std::path::PathBuf,
    /// Worker number.
    #[arg(long, default_value_t = 0)]
    pub worker: u32,
    /// Incarnation of this worker.
    #[arg(long, default_value_t = 0)]
    pub incarnation: u32,
    /// Seed of the operation stream.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Keys of the shared key space.
    #[arg(long, default_value_t = 400)]
    pub keys: u32,
    /// Writer tasks.
    #[arg(long, default_value_t = 4)]
    pub writers: u32,
    /// Reader tasks.
    #[arg(long, default_value_t = 2)]
    pub readers: u32,
    /// Largest value in bytes.
    #[arg(long, default_value_t = 16 << 10)]
    pub value_max: u32,
    /// Pause between a task's calls, in ms.
    #[arg(long, default_value_t = 10)]
    pub think_ms: u64,
    /// For fill: stop at this used fraction.
    #[arg(long, default_value_t = 0.85)]
    pub fill_to: f64,
    /// Name in the history.
    #[arg(long, default_value = "client-0")]
    pub name: String,
}

impl WorkerArgs {
    /// The settings these flags give.
    pub fn config(&self) -> WorkerConfig {
        WorkerConfig {
            mode: self.mode,
            master: self.master.clone(),
            secret_file: self.secret_file.clone(),
            history: self.history.clone(),
            worker: self.worker,
            incarnation: self.incarnation,
            seed: self.seed,
            keys: self.keys,
            writers: self.writers,
            readers: self.readers,
            value_max: self.value_max,
            think_ms: self.think_ms,
            fill_to: self.fill_to,
            name: self.name.clone(),
        }
    }
}

/// Runs a worker from its flags (`argv` without the program name) on a
/// runtime of its own; for binaries that double as workers.
pub fn worker_main(argv: Vec<String>) -> std::process::ExitCode {
    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        args: WorkerArgs,
    }
    let cmd = match <Cmd as clap::Parser>::try_parse_from(
        std::iter::once("worker".to_string()).chain(argv),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    run_blocking(cmd.args.config())
}

/// Runs a worker on a runtime of its own; the process's exit code.
pub fn run_blocking(cfg: WorkerConfig) -> std::process::ExitCode {
    crate::init_tracing();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(run(cfg)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
