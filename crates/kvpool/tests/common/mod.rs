//! Harness for the integration tests: starts the real `kvpool` binary (master,
//! stores, one-shot CLI commands) on 127.0.0.1, captures every process's
//! output in a scratch directory, and kills every child on drop. When a test
//! panics, each process prints the tail of its logs as it is dropped.
//!
//! Every wait is bounded by a deadline and panics with what it waited for.
//!
//! Long on purpose (over 800 lines): the one harness every integration
//! test binary includes; split, each part would still be included whole.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use kvpool_client::{Client, ClientConfig};
use kvpool_net::auth::{Credentials, Role, Security};
use kvpool_net::tls::TlsFiles;
use kvpool_net::{CallPolicy, MasterLink};
use kvpool_proto::msg::{self, ClientId, SegmentId, SegmentInfo};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// The `kvpool` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_kvpool");
/// Client TTL the test masters run with, unless a test overrides it.
pub const CLIENT_TTL: Duration = Duration::from_secs(2);
/// Slack on top of a TTL for the master's sweeper to act (it ticks at TTL/8).
pub const TTL_MARGIN: Duration = Duration::from_secs(5);
/// Longest a process may take to start listening or mounting.
pub const STARTUP: Duration = Duration::from_secs(20);
/// Lines of each log printed when a test fails.
const LOG_TAIL: usize = 80;

/// A scratch directory under /dev/shm (or the system temp dir), removed on drop.
pub fn scratch_dir() -> TempDir {
    let builder = tempfile::Builder::new().prefix("kvpool-it-").to_owned();
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = builder.tempdir_in(shm) {
            return dir;
        }
    }
    builder.tempdir().expect("create a scratch directory")
}

/// A directory on disk (not tmpfs, where O_DIRECT fails), for a store's
/// disk tier; removed when dropped.
pub fn disk_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("kvpool-it-disk-")
        .tempdir_in(std::env::temp_dir())
        .expect("a directory on disk")
}

/// A TCP port that was free a moment ago on 127.0.0.1. Picked below the
/// kernel's ephemeral range (32768 and up by default), so no outgoing
/// connection of a test running beside this one can take it before the
/// server it is for binds it ("Address already in use" was a flake).
pub fn free_port() -> u16 {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    for _ in 0..1000 {
        let port = rng.gen_range(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A `kvpool` command without the caller's `KVPOOL_*`/`MOONCAKE_*` env, logging
/// uncoloured at `$KVPOOL_TEST_LOG` (default `info`), with the bug
/// `$KVPOOL_TEST_PLANTED_BUG` planted if set.
pub fn kvpool_command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    binary_command(Path::new(BIN), args)
}

/// Like [`kvpool_command`] for another copy of the binary (an upgrade).
pub fn binary_command<I, S>(bin: &Path, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(bin);
    cmd.args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("KVPOOL_") || k.starts_with("MOONCAKE_") {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.env("NO_COLOR", "1");
    cmd.env(
        "KVPOOL_LOG",
        std::env::var("KVPOOL_TEST_LOG").unwrap_or_else(|_| "info".into()),
    );
    // A bug planted on purpose, to see a test catch it (docs/chaos.md,
    // "Planted bugs"); acts only in a binary built with the feature.
    if let Ok(bug) = std::env::var("KVPOOL_TEST_PLANTED_BUG") {
        cmd.env("KVPOOL_PLANTED_BUG", bug);
    }
    cmd
}

/// Runs a one-shot `kvpool` command to completion (bounded by `timeout`).
pub async fn run_kvpool(args: &[&str], timeout: Duration) -> Output {
    let mut cmd = kvpool_command(args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let what = format!("kvpool {}", args.join(" "));
    let run = tokio::task::spawn_blocking(move || cmd.output());
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(Ok(out))) => out,
        Ok(Ok(Err(e))) => panic!("cannot run {what}: {e}"),
        Ok(Err(e)) => panic!("{what}: {e}"),
        Err(_) => panic!("{what} did not finish within {timeout:?}"),
    }
}

/// Polls `probe` every 50 ms until it returns `Some`, panicking after `timeout`.
pub async fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A child `kvpool` process with stdout/stderr in log files; killed (and
/// reaped) on drop, printing its logs first if the test is panicking.
pub struct Process {
    name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    exit: Option<ExitStatus>,
    killed: bool,
}

impl Process {
    /// Starts `kvpool <args>` with its output in `<log_dir>/<name>.{stdout,stderr}`.
    pub fn spawn<I, S>(name: &str, args: I, log_dir: &Path) -> Process
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Process::spawn_bin(name, Path::new(BIN), args, log_dir)
    }

    /// Like [`Process::spawn`] with another copy of the binary.
    pub fn spawn_bin<I, S>(name: &str, bin: &Path, args: I, log_dir: &Path) -> Process
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let stdout = log_dir.join(format!("{name}.stdout"));
        let stderr = log_dir.join(format!("{name}.stderr"));
        let file =
            |p: &Path| File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        let child = binary_command(bin, args)
            .stdout(file(&stdout))
            .stderr(file(&stderr))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {} for {name}: {e}", bin.display()));
        Process {
            name: name.to_string(),
            child,
            stdout,
            stderr,
            exit: None,
            killed: false,
        }
    }

    /// Resident memory of the process now, in bytes (0 once it is gone).
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()));
        status
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Everything the process printed on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Everything the process printed on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The tail of both logs, labelled, for failure messages.
    pub fn logs(&self) -> String {
        let tail = |s: String| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
        };
        format!(
            "----- {} stdout -----\n{}\n----- {} stderr -----\n{}\n",
            self.name,
            tail(self.stdout()),
            self.name,
            tail(self.stderr())
        )
    }

    /// The exit status, if the process has exited (reaps it).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Waits up to `timeout` for the process to exit on its own; kills it and
    /// panics (with its logs) if it does not.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_exit() {
                return s;
            }
            if Instant::now() >= deadline {
                self.kill9();
                panic!(
                    "{} did not exit within {timeout:?}\n{}",
                    self.name,
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends SIGKILL and reaps the process (no-op if it already exited).
    pub fn kill9(&mut self) {
        if self.try_exit().is_none() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
            self.killed = true;
        }
    }

    /// Sends SIGTERM (a graceful stop); see [`Process::wait_exit`].
    pub fn terminate(&mut self) {
        if self.try_exit().is_none() {
            // SAFETY: plain syscall on the pid of a child we have not reaped.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        }
    }

    /// Freezes (SIGSTOP) or resumes (SIGCONT) the process, to observe the
    /// cluster at a moment of the test's choosing.
    pub fn freeze(&self, frozen: bool) {
        let sig = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        let pid = self.child.id();
        // SAFETY: plain syscall on the pid of a child we have not reaped.
        unsafe { libc::kill(pid as libc::pid_t, sig) };
        // A stop reaches each thread on its own: under load a thread can
        // still answer a request sent just after the signal. Return once
        // every thread is stopped, as a caller means.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while frozen && !all_threads_stopped(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether this harness killed the process (as opposed to it exiting).
    pub fn was_killed(&self) -> bool {
        self.killed
    }
}

/// Whether every thread of process `pid` is stopped (state `T` in
/// `/proc/<pid>/task/*/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        matches!(state, None | Some('T' | 't'))
    })
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

/// A running master (`kvpool master` or `kvpool up`) and where it listens.
pub struct MasterProcess {
    /// The process.
    pub process: Process,
    /// RPC address `127.0.0.1:port`.
    pub rpc: String,
    /// Metrics/admin HTTP address `127.0.0.1:port`.
    pub metrics: String,
}

/// A master with no HA and its metrics port open, on free ports.
pub async fn spawn_metered_master(name: &str, log_dir: &Path) -> MasterProcess {
    spawn_master(name, log_dir, |rpc, metrics| {
        ["master", "--rpc-port", &rpc.to_string()]
            .into_iter()
            .chain(["--metrics-port", &metrics.to_string()])
            .map(String::from)
            .collect()
    })
    .await
}

/// Starts a master on free ports: `make_args(rpc_port, metrics_port)` builds
/// its command line. Ready once both ports accept connections; retried on
/// fresh ports if another process took one in between.
pub async fn spawn_master(
    name: &str,
    log_dir: &Path,
    make_args: impl Fn(u16, u16) -> Vec<String>,
) -> MasterProcess {
    const ATTEMPTS: usize = 3;
    for attempt in 1..=ATTEMPTS {
        let (rpc_port, metrics_port) = (free_port(), free_port());
        let mut process = Process::spawn(name, make_args(rpc_port, metrics_port), log_dir);
        let rpc = format!("127.0.0.1:{rpc_port}");
        let metrics = format!("127.0.0.1:{metrics_port}");
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(status) = process.try_exit() {
                if process.stderr().contains("cannot listen") && attempt < ATTEMPTS {
                    break;
                }
                panic!(
                    "{name} exited during startup with {status}\n{}",
                    process.logs()
                );
            }
            let accepts = |a: &str| tokio::net::TcpStream::connect(a.to_string());
            if accepts(&rpc).await.is_ok()
                && accepts(&metrics).await.is_ok()
                && process.try_exit().is_none()
            {
                return MasterProcess {
                    process,
                    rpc,
                    metrics,
                };
            }
            if Instant::now() >= deadline {
                panic!(
                    "{name} did not listen on {rpc} and {metrics} within {STARTUP:?}\n{}",
                    process.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    unreachable!("the last attempt panics instead of retrying")
}

/// Starts `kvpool store` named `name` lending `segment_size` from `data_dir`.
pub fn spawn_store(
    name: &str,
    master: &str,
    segment_size: &str,
    data_dir: &Path,
    log_dir: &Path,
) -> Process {
    spawn_store_bin(
        Path::new(BIN),
        name,
        name,
        master,
        segment_size,
        data_dir,
        log_dir,
    )
}

/// [`spawn_store`] with another copy of the binary (an upgrade), logging as
/// `log_name`.
pub fn spawn_store_bin(
    bin: &Path,
    log_name: &str,
    name: &str,
    master: &str,
    segment_size: &str,
    data_dir: &Path,
    log_dir: &Path,
) -> Process {
    spawn_store_with(
        bin,
        log_name,
        name,
        master,
        segment_size,
        data_dir,
        log_dir,
        &[],
    )
}

/// [`spawn_store_bin`] with `extra` flags.
#[allow(clippy::too_many_arguments)]
pub fn spawn_store_with(
    bin: &Path,
    log_name: &str,
    name: &str,
    master: &str,
    segment_size: &str,
    data_dir: &Path,
    log_dir: &Path,
    extra: &[String],
) -> Process {
    let data_dir = data_dir.to_string_lossy();
    let args = [
        "store",
        "--master",
        master,
        "--segment-size",
        segment_size,
        "--data-dir",
        &data_dir,
        "--address",
        "127.0.0.1",
        "--port",
        "0",
        "--name",
        name,
    ]
    .map(String::from);
    Process::spawn_bin(
        log_name,
        bin,
        args.into_iter().chain(extra.iter().cloned()),
        log_dir,
    )
}

/// The `segments: N` count printed by `kvpool status`, if it answered.
pub async fn cli_segments(master: &str) -> Option<usize> {
    cli_segments_as(master, &[]).await
}

/// [`cli_segments`] with `extra` flags (a secret file).
pub async fn cli_segments_as(master: &str, extra: &[String]) -> Option<usize> {
    let mut args = vec!["status", "--master", master];
    args.extend(extra.iter().map(String::as_str));
    let out = run_kvpool(&args, Duration::from_secs(15)).await;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("segments: "))
        .and_then(|n| n.trim().parse().ok())
}

/// Waits until `kvpool status` reports exactly `n` segments; panics on timeout
/// or when one of `watch` exits meanwhile.
pub async fn wait_for_segments(master: &str, n: usize, watch: &mut [&mut Process]) {
    wait_for_segments_as(master, n, watch, &[]).await
}

/// [`wait_for_segments`] with `extra` flags for `kvpool status`.
pub async fn wait_for_segments_as(
    master: &str,
    n: usize,
    watch: &mut [&mut Process],
    extra: &[String],
) {
    let deadline = Instant::now() + STARTUP;
    let mut last = None;
    loop {
        for p in watch.iter_mut() {
            if let Some(s) = p.try_exit() {
                panic!(
                    "{} exited with {s} while waiting for {n} segment(s)\n{}",
                    p.name(),
                    p.logs()
                );
            }
        }
        last = cli_segments_as(master, extra).await.or(last);
        if last == Some(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "`kvpool status --master {master}` did not show `segments: {n}` within {STARTUP:?} (last: {last:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A forged mount of a 64 GiB segment nobody serves (the attack that would
/// take every put and make the evictor delete real objects).
pub fn black_hole_mount(client_id: ClientId) -> msg::MountSegment {
    msg::MountSegment {
        client_id,
        segment: SegmentInfo {
            id: SegmentId(rand::random()),
            name: "black-hole".into(),
            endpoint: "127.0.0.1:1".into(),
            base: 4096,
            size: 64 << 30,
            path: None,
            tier: Default::default(),
        },
        objects: 0,
        scan_age_ms: 0,
        possession: [0; 16],
        fence: 1,
        held: Vec::new(),
    }
}

/// A master link for protocol-level tests, under its own random client id (not registered).
pub fn master_link(master: &str, hostname: &str) -> Arc<MasterLink> {
    master_link_as(master, hostname, None)
}

/// [`master_link`] proving `key` (or nothing) when the master asks.
pub fn master_link_as(master: &str, hostname: &str, key: Option<Credentials>) -> Arc<MasterLink> {
    MasterLink::new(
        master,
        ClientId(rand::random()),
        hostname,
        "test",
        CallPolicy::default(),
        Security::with_key(key),
    )
    .expect("a valid master address")
}

/// The value of an unlabelled Prometheus sample `name`.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A `GET` over a raw TCP connection; returns the status code and the body.
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    http_request(addr, "GET", path, &[], b"").await
}

/// One HTTP/1.1 request with extra `headers` and `body`: the status code and
/// the body of the answer.
pub async fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let what = format!("{method} http://{addr}{path}");
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await?;
        s.write_all(body).await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&raw).into_owned())
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .unwrap_or_else(|_| panic!("{what} timed out"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{what}: no header end in {raw:?}"));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{what}: bad status line in {head:?}"));
    (code, body.to_string())
}

/// A deterministic seed derived from `key`.
pub fn seed_of(key: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// `len` pseudo-random bytes from `rng`.
pub fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

/// The value tests store under `key`: length in `1..=max_len` and bytes both
/// derived from the key, so any reader can check it without shared state.
pub fn value_for(key: &str, max_len: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed_of(key));
    let len = 1 + (rng.next_u64() % max_len as u64) as usize;
    random_bytes(&mut rng, len)
}

/// Options of a test cluster; see [`Cluster::builder`].
pub struct ClusterBuilder {
    stores: usize,
    segment_size: String,
    master_flags: Vec<(String, String)>,
    store_flags: Vec<String>,
    secured: bool,
    tls: bool,
}

/// A cluster's TLS material, made by `kvpool tls new`: one CA, and a
/// certificate (with its key) for 127.0.0.1 per name.
pub struct Pki {
    /// The directory holding `ca.pem` and `<name>.pem` / `<name>.key`.
    pub dir: PathBuf,
}

impl Pki {
    /// Makes a CA and certificates named `names` in `dir`.
    pub async fn create(dir: &Path, names: &[&str]) -> Pki {
        let dir_arg = dir.to_string_lossy().into_owned();
        let mut args = vec!["tls", "new", "--out", &dir_arg];
        for n in names {
            args.extend(["--cert", n]);
        }
        let out = run_kvpool(&args, Duration::from_secs(30)).await;
        assert!(
            out.status.success(),
            "kvpool tls new failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    /// The CA bundle.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Flags giving the CA and, with `name`, that certificate and key.
    pub fn flags(&self, name: Option<&str>) -> Vec<String> {
        let mut f = vec!["--tls-ca".to_string(), self.ca().to_string_lossy().into()];
        if let Some(n) = name {
            let path = |ext: &str| self.dir.join(format!("{n}.{ext}")).to_string_lossy().into();
            f.extend([
                "--tls-cert".into(),
                path("pem"),
                "--tls-key".into(),
                path("key"),
            ]);
        }
        f
    }

    /// TLS files for an in-process client: the CA and, with `name`, that
    /// certificate.
    pub fn files(&self, name: Option<&str>) -> TlsFiles {
        TlsFiles {
            ca: Some(self.ca()),
            cert: name.map(|n| self.dir.join(format!("{n}.pem"))),
            key: name.map(|n| self.dir.join(format!("{n}.key"))),
            require_client_cert: false,
        }
    }
}

/// Where a secured cluster's keys are, and the keys themselves.
pub struct Secrets {
    /// The cluster secret (admin key) file the master uses.
    pub admin_file: PathBuf,
    /// The store key file the stores use.
    pub store_file: PathBuf,
    /// The client key file.
    pub client_file: PathBuf,
    /// The admin key.
    pub admin: Credentials,
}

impl Secrets {
    /// Makes a fresh cluster secret and its role keys as files in `dir`.
    pub fn create(dir: &Path) -> Secrets {
        let admin = Credentials::parse(&kvpool_net::auth::new_cluster_secret()).expect("secret");
        let write = |role: Role| {
            let path = dir.join(format!("{role}.key"));
            let key = admin.derive(role).expect("derive");
            std::fs::write(&path, key.encode()).expect("write a key file");
            path
        };
        Secrets {
            admin_file: write(Role::Admin),
            store_file: write(Role::Store),
            client_file: write(Role::Client),
            admin,
        }
    }

    /// The key of `role`.
    pub fn key(&self, role: Role) -> Credentials {
        self.admin.derive(role).expect("derive")
    }
}

impl ClusterBuilder {
    /// Number of `kvpool store` processes (default 1).
    pub fn stores(mut self, n: usize) -> Self {
        self.stores = n;
        self
    }

    /// Segment size each store lends, e.g. `64MiB` (default 64MiB).
    pub fn segment_size(mut self, size: &str) -> Self {
        self.segment_size = size.to_string();
        self
    }

    /// Turns authentication on: the master gets a fresh cluster secret, the
    /// stores its store key, and [`Cluster::client`] the client key.
    pub fn secured(mut self) -> Self {
        self.secured = true;
        self
    }

    /// Turns TLS on for every plane: a fresh CA, a certificate for the
    /// master and one the stores share; clients get the CA only.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Sets a master flag, replacing an earlier value of the same flag.
    pub fn master_flag(mut self, flag: &str, value: &str) -> Self {
        self.master_flags.retain(|(f, _)| f != flag);
        self.master_flags
            .push((flag.to_string(), value.to_string()));
        self
    }

    /// Adds a flag to every store's command line.
    pub fn store_flag(mut self, flag: &str, value: &str) -> Self {
        self.store_flags
            .extend([flag.to_string(), value.to_string()]);
        self
    }

    /// Starts the master and the stores; returns once every segment is mounted.
    pub async fn start(self) -> Cluster {
        let dir = scratch_dir();
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).expect("create the log dir");
        let secrets = self.secured.then(|| Secrets::create(dir.path()));
        let mut flags = self.master_flags;
        let mut store_flags = Vec::new();
        if let Some(s) = &secrets {
            flags.push((
                "--secret-file".into(),
                s.admin_file.to_string_lossy().into(),
            ));
            store_flags.extend([
                "--secret-file".to_string(),
                s.store_file.to_string_lossy().into(),
            ]);
        }
        let pki = match self.tls {
            true => Some(Pki::create(&dir.path().join("pki"), &["master", "store"]).await),
            false => None,
        };
        if let Some(pki) = &pki {
            for pair in pki.flags(Some("master")).chunks(2) {
                flags.push((pair[0].clone(), pair[1].clone()));
            }
            store_flags.extend(pki.flags(Some("store")));
        }
        // What `kvpool status` takes too; the builder's flags are the store's own.
        let status_flags = store_flags.clone();
        store_flags.extend(self.store_flags);
        let master = spawn_master("master", &logs, |rpc, metrics| {
            let mut args: Vec<String> = [
                "master",
                "--rpc-port",
                &rpc.to_string(),
                "--metrics-port",
                &metrics.to_string(),
            ]
            .map(String::from)
            .to_vec();
            for (f, v) in &flags {
                args.extend([f.clone(), v.clone()]);
            }
            args
        })
        .await;
        let mut stores: Vec<Process> = (0..self.stores)
            .map(|i| {
                let name = Cluster::store_name(i);
                spawn_store_with(
                    Path::new(BIN),
                    &name,
                    &name,
                    &master.rpc,
                    &self.segment_size,
                    &dir.path().join(&name),
                    &logs,
                    &store_flags,
                )
            })
            .collect();
        let MasterProcess {
            mut process,
            rpc,
            metrics,
        } = master;
        let mut watch: Vec<&mut Process> = stores.iter_mut().collect();
        watch.push(&mut process);
        wait_for_segments_as(&rpc, self.stores, &mut watch, &status_flags).await;
        Cluster {
            secrets,
            pki,
            store_flags,
            master_addr: rpc,
            metrics_addr: metrics,
            master: process,
            master_flags: flags,
            stores,
            segment_size: self.segment_size,
            restarts: 0,
            dir,
        }
    }
}

/// A master and N stores running as real processes on 127.0.0.1.
pub struct Cluster {
    /// Master RPC address.
    pub master_addr: String,
    /// Master metrics/admin HTTP address.
    pub metrics_addr: String,
    master: Process,
    master_flags: Vec<(String, String)>,
    stores: Vec<Process>,
    segment_size: String,
    restarts: usize,
    /// The keys, when the cluster was started [`ClusterBuilder::secured`].
    pub secrets: Option<Secrets>,
    /// The TLS material, when the cluster was started [`ClusterBuilder::tls`].
    pub pki: Option<Pki>,
    store_flags: Vec<String>,
    // Declared last: removed only after every process above is dead.
    dir: TempDir,
}

impl Cluster {
    /// A builder with defaults: 1 store of 64MiB, master `--client-ttl 2s
    /// --store-grace 0s` (a silent store is dropped at the TTL; the liveness
    /// tests set a grace period of their own).
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder {
            stores: 1,
            segment_size: "64MiB".into(),
            master_flags: vec![
                ("--client-ttl".into(), format!("{}s", CLIENT_TTL.as_secs())),
                ("--store-grace".into(), "0s".into()),
            ],
            store_flags: Vec::new(),
            secured: false,
            tls: false,
        }
    }

    /// The segment name (`--name`) of store `i`.
    pub fn store_name(i: usize) -> String {
        format!("store-{i}")
    }

    /// The scratch directory (data dirs and logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts another `kvpool` process (e.g. a bench) logging into the cluster's dir.
    pub fn spawn<I, S>(&self, name: &str, args: I) -> Process
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Process::spawn(name, args, &self.dir.path().join("logs"))
    }

    /// SIGKILLs store `i` (no drain, no goodbye) and reaps it.
    pub fn kill9_store(&mut self, i: usize) {
        self.stores[i].kill9();
    }

    /// Starts store `i` again on its data dir (after a kill or a stop),
    /// from `bin` (another copy of the binary: an upgrade) or the default.
    pub fn restart_store(&mut self, i: usize, bin: Option<&Path>) {
        let name = Cluster::store_name(i);
        let logs = self.dir.path().join("logs");
        self.restarts += 1;
        self.stores[i] = spawn_store_with(
            bin.unwrap_or(Path::new(BIN)),
            &format!("{name}.restart{}", self.restarts),
            &name,
            &self.master_addr,
            &self.segment_size,
            &self.dir.path().join(&name),
            &logs,
            &self.store_flags,
        );
    }

    /// The store process `i`, e.g. to signal it.
    pub fn store(&mut self, i: usize) -> &mut Process {
        &mut self.stores[i]
    }

    /// The master process, e.g. to signal it or read its log.
    pub fn master_process(&mut self) -> &mut Process {
        &mut self.master
    }

    /// The master's output so far.
    pub fn master_process_logs(&self) -> String {
        self.master.logs()
    }

    /// SIGKILLs the master.
    pub fn kill9_master(&mut self) {
        self.master.kill9();
    }

    /// Starts the master again on the same ports and flags (no HA: it comes
    /// back empty and rebuilds from the stores).
    pub async fn restart_master(&mut self) {
        let port = |a: &str| a.rsplit(':').next().unwrap_or_default().to_string();
        let mut args = vec![
            "master".to_string(),
            "--rpc-port".into(),
            port(&self.master_addr),
            "--metrics-port".into(),
            port(&self.metrics_addr),
        ];
        for (f, v) in &self.master_flags {
            args.extend([f.clone(), v.clone()]);
        }
        self.restarts += 1;
        let log = format!("master.restart{}", self.restarts);
        self.master = Process::spawn(&log, args, &self.dir.path().join("logs"));
        let addr = self.master_addr.clone();
        eventually("the restarted master to listen", STARTUP, async || {
            tokio::net::TcpStream::connect(&addr).await.ok().map(|_| ())
        })
        .await;
    }

    /// A connected client with default settings.
    pub async fn client(&self) -> Client {
        self.client_with(|_| {}).await
    }

    /// A connected client whose config `tweak` adjusted (holding the client
    /// key when the cluster is secured).
    pub async fn client_with(&self, tweak: impl FnOnce(&mut ClientConfig)) -> Client {
        let mut cfg = ClientConfig::new(&self.master_addr);
        let credentials = self.secrets.as_ref().map(|s| s.key(Role::Client));
        let tls = self.pki.as_ref().map(|p| p.files(None)).unwrap_or_default();
        cfg.security = Security::new(credentials, false, &tls).expect("client TLS files");
        tweak(&mut cfg);
        Client::connect(cfg)
            .await
            .unwrap_or_else(|e| panic!("client cannot connect to {}: {e}", self.master_addr))
    }

    /// A master link (not registered) for protocol-level tests.
    pub fn master_link(&self, hostname: &str) -> Arc<MasterLink> {
        master_link(&self.master_addr, hostname)
    }

    /// Panics (with every log) unless the master and every store not killed on purpose still run.
    pub fn assert_alive(&mut self) {
        let mut dead = Vec::new();
        for p in std::iter::once(&mut self.master).chain(self.stores.iter_mut()) {
            if p.was_killed() {
                continue;
            }
            if let Some(s) = p.try_exit() {
                dead.push(format!("{} exited with {s}", p.name()));
            }
        }
        assert!(dead.is_empty(), "cluster processes died: {dead:?}");
    }
}

/// A real etcd (Debian's `etcd-server`) on free loopback ports, with its
/// client endpoint `127.0.0.1:port`. The suite's setup installs it; a missing
/// binary fails the test with that hint rather than skipping it.
pub async fn spawn_etcd(log_dir: &Path) -> (Process, String) {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join("etcd").is_file()));
    assert!(
        found,
        "etcd not found on PATH: scripts/test.sh installs it (apt-get install etcd-server)"
    );
    let (client, peer) = (free_port(), free_port());
    let data = log_dir.join(format!("etcd-{client}"));
    let endpoint = format!("127.0.0.1:{client}");
    let mut etcd = Process::spawn_bin(
        "etcd",
        Path::new("etcd"),
        [
            "--data-dir".to_string(),
            data.to_string_lossy().into_owned(),
            "--listen-client-urls".into(),
            format!("http://{endpoint}"),
            "--advertise-client-urls".into(),
            format!("http://{endpoint}"),
            "--listen-peer-urls".into(),
            format!("http://127.0.0.1:{peer}"),
        ],
        log_dir,
    );
    let ep = endpoint.clone();
    eventually(
        "etcd to listen (is etcd-server installed?)",
        STARTUP,
        async || {
            assert!(etcd.try_exit().is_none(), "etcd exited:\n{}", etcd.logs());
            tokio::net::TcpStream::connect(&ep).await.ok().map(|_| ())
        },
    )
    .await;
    (etcd, endpoint)
}
