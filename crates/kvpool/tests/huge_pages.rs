//! Segments on huge pages: a store whose data dir is on hugetlbfs or on a
//! tmpfs mounted with `huge=` serves shared-memory clients from 2 MiB pages
//! (its `kvpool_store_huge_page_bytes` says how much, and a client's own
//! mapping of the segment uses them), serves TCP reads of a huge tmpfs
//! segment from the file's pages (sendfile; hugetlbfs lends none), whole
//! and right while a writer replaces and evicts what they read, keeps
//! its objects across a restart,
//! and refuses a size the file system cannot hold with a clear error and no
//! file left behind.
//!
//! The tests mount their own file systems in scratch directories and, for
//! hugetlbfs, reserve the huge pages they need (`vm.nr_hugepages`, put
//! back afterwards): they need root. Where mounting is not allowed they
//! say so on stderr and pass without running.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use kvpool_client::{Client, ClientConfig, Protocol, ReplicateConfig};
use kvpool_transfer::mapped::mapped_huge_page_bytes;

const MIB: u64 = 1 << 20;
const SEGMENT: u64 = 64 * MIB;

/// A file system mounted at a scratch directory, unmounted when dropped.
struct Mount {
    at: PathBuf,
}

impl Mount {
    /// Mounts `fstype` with `options` at `at`; `None` where this process
    /// may not mount.
    fn new(fstype: &str, options: &str, at: &Path) -> Option<Mount> {
        std::fs::create_dir_all(at).expect("mount point");
        let c = |s: &[u8]| CString::new(s).expect("no NUL");
        let (target, fs, opts) = (
            c(at.as_os_str().as_bytes()),
            c(fstype.as_bytes()),
            c(options.as_bytes()),
        );
        // SAFETY: every pointer is a NUL-terminated string alive for the call.
        let rc = unsafe {
            libc::mount(
                fs.as_ptr(),
                target.as_ptr(),
                fs.as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        if rc != 0 {
            eprintln!(
                "cannot mount {fstype} ({}): not run",
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(Mount {
            at: at.to_path_buf(),
        })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let target = CString::new(self.at.as_os_str().as_bytes()).expect("no NUL");
        // SAFETY: a NUL-terminated path alive for the call.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Huge pages reserved for the test: `vm.nr_hugepages` raised so that
/// `free` of them are free, and put back when dropped.
struct Reserved {
    before: Option<u64>,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

fn meminfo(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let line = text.lines().find(|l| l.starts_with(field));
    let value = line.and_then(|l| l.split_whitespace().nth(1));
    value.and_then(|v| v.parse().ok()).unwrap_or(0)
}

impl Reserved {
    /// `None` where the pages cannot be had (not root, too little memory).
    fn at_least(free: u64) -> Option<Reserved> {
        let have = meminfo("HugePages_Free:");
        let mut r = Reserved { before: None };
        if have < free {
            let total = meminfo("HugePages_Total:");
            if std::fs::write(NR_HUGEPAGES, (total + free - have).to_string()).is_err() {
                eprintln!("cannot raise {NR_HUGEPAGES}: not run");
                return None;
            }
            r.before = Some(total);
        }
        let got = meminfo("HugePages_Free:");
        if got < free {
            eprintln!("only {got} huge pages free, {free} wanted: not run");
            return None;
        }
        Some(r)
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if let Some(n) = self.before {
            let _ = std::fs::write(NR_HUGEPAGES, n.to_string());
        }
    }
}

/// Bytes of this process's mappings of `path` in huge pages.
fn mapped_huge(path: &Path) -> u64 {
    let path = path.to_string_lossy();
    mapped_huge_page_bytes(|header| header.ends_with(path.as_ref()))
}

/// A master, with a store lending [`SEGMENT`] from `data_dir`, its metrics
/// port open.
struct Pool {
    master: MasterProcess,
    store: Process,
    store_metrics: String,
    data_dir: PathBuf,
    logs: PathBuf,
}

impl Pool {
    async fn start(data_dir: &Path, logs: &Path) -> Pool {
        std::fs::create_dir_all(logs).expect("log dir");
        let master = spawn_metered_master("master", logs).await;
        let port = free_port();
        let mut pool = Pool {
            store: store("store", &master.rpc, SEGMENT, data_dir, logs, port),
            store_metrics: format!("127.0.0.1:{port}"),
            master,
            data_dir: data_dir.to_path_buf(),
            logs: logs.to_path_buf(),
        };
        pool.wait_mounted().await;
        pool
    }

    /// Starts the store again on its data dir, logging as `log_name`.
    async fn restart_store(&mut self, log_name: &str) {
        let port = free_port();
        self.store = store(
            log_name,
            &self.master.rpc,
            SEGMENT,
            &self.data_dir,
            &self.logs,
            port,
        );
        self.store_metrics = format!("127.0.0.1:{port}");
        self.wait_mounted().await;
    }

    async fn wait_mounted(&mut self) {
        let mut watch = [&mut self.store, &mut self.master.process];
        wait_for_segments(&self.master.rpc, 1, &mut watch).await;
    }

    async fn store_metric(&self, name: &str) -> f64 {
        let (code, body) = http_get(&self.store_metrics, "/metrics").await;
        assert_eq!(code, 200, "{body}");
        metric(&body, name).unwrap_or_else(|| panic!("{name} is not exported"))
    }

    async fn huge_page_bytes(&self) -> f64 {
        self.store_metric("kvpool_store_huge_page_bytes").await
    }

    /// Payload bytes the store sent from its segment file's pages.
    async fn bytes_from_file(&self) -> f64 {
        self.store_metric("kvpool_store_bytes_from_file_total")
            .await
    }

    async fn client(&self) -> Client {
        self.client_over(Protocol::Shm).await
    }

    async fn client_over(&self, protocol: Protocol) -> Client {
        let mut cfg = ClientConfig::new(&self.master.rpc);
        cfg.protocol = protocol;
        Client::connect(cfg).await.expect("client")
    }
}

fn store(name: &str, master: &str, size: u64, data_dir: &Path, logs: &Path, port: u16) -> Process {
    spawn_store_with(
        Path::new(BIN),
        name,
        "store",
        master,
        &size.to_string(),
        data_dir,
        logs,
        &["--metrics-port".into(), port.to_string()],
    )
}

/// Puts 24 values of 1 MiB over shared memory, reads them back byte-exact.
async fn round_trip(c: &Client) -> Vec<String> {
    let keys: Vec<String> = (0..24).map(|i| format!("huge-{i}")).collect();
    for k in &keys {
        let v = value_for(k, MIB as usize);
        c.put(k, &v, &ReplicateConfig::default())
            .await
            .expect("put over shared memory");
    }
    read_back(c, &keys).await;
    keys
}

async fn read_back(c: &Client, keys: &[String]) {
    for k in keys {
        assert_eq!(
            c.get(k).await.expect("get"),
            value_for(k, MIB as usize),
            "{k}"
        );
    }
}

/// The data address the master has for the one segment.
async fn endpoint(c: &Client) -> String {
    let status = c.status().await.expect("status");
    status.segments[0].info.endpoint.clone()
}

/// A store that cannot start on hugetlbfs: exits with `why` in its error
/// and leaves no segment file.
async fn refused(name: &str, size: u64, data_dir: &Path, logs: &Path, master: &str, why: &str) {
    let mut p = store(name, master, size, data_dir, logs, free_port());
    let status = p.wait_exit(Duration::from_secs(20)).await;
    assert!(!status.success(), "{name}: started\n{}", p.logs());
    assert!(p.stderr().contains(why), "{name}: {}", p.stderr());
    assert!(
        !data_dir.join("segment.kvp").exists(),
        "{name}: a segment file was left behind"
    );
}

/// hugetlbfs: sizes it cannot hold are refused cleanly; a segment on it is
/// all huge pages, in the store and in a client's mapping, and its objects
/// are there again after the store restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_on_hugetlbfs_is_served_from_huge_pages() {
    let scratch = scratch_dir();
    let Some(_pages) = Reserved::at_least(SEGMENT / (2 * MIB) + 4) else {
        return;
    };
    let Some(fs) = Mount::new("hugetlbfs", "pagesize=2M", &scratch.path().join("huge")) else {
        return;
    };
    let logs = scratch.path().join("logs");
    let data = fs.at.join("store");
    let mut pool = Pool::start(&data, &logs).await;

    assert_eq!(pool.huge_page_bytes().await, SEGMENT as f64);
    let c = pool.client().await;
    let keys = round_trip(&c).await;
    let segment = data.join("segment.kvp");
    assert!(mapped_huge(&segment) > 0, "the client maps 4 KiB pages");
    // Hugetlbfs lends no pages to sockets: reads over TCP are copied.
    read_back(&pool.client_over(Protocol::Tcp).await, &keys).await;
    assert_eq!(pool.bytes_from_file().await, 0.0);

    // Another store beside it, on the same hugetlbfs: a size in 4 KiB
    // steps, then more than the free huge pages.
    let other = fs.at.join("other");
    let master = pool.master.rpc.clone();
    let hint = "not a multiple of the huge page size";
    refused("misaligned", SEGMENT + 4096, &other, &logs, &master, hint).await;
    let too_many = (meminfo("HugePages_Free:") + 8) * 2 * MIB;
    refused(
        "too-big",
        too_many,
        &other,
        &logs,
        &master,
        "too few free huge pages",
    )
    .await;

    let old = endpoint(&c).await;
    pool.store.terminate();
    pool.store.wait_exit(Duration::from_secs(30)).await;
    pool.restart_store("store.restart").await;
    let fresh = pool.client().await;
    eventually("the store remounted", STARTUP, async || {
        (endpoint(&fresh).await != old).then_some(())
    })
    .await;
    read_back(&fresh, &keys).await;
}

/// A tmpfs mounted with `huge=always`: the store's segment and a client's
/// mapping of it get transparent huge pages, and reads over TCP leave
/// from the file's pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_on_a_huge_tmpfs_is_served_from_huge_pages() {
    let scratch = scratch_dir();
    let at = scratch.path().join("thp");
    let Some(fs) = Mount::new("tmpfs", "huge=always,size=256m", &at) else {
        return;
    };
    let data = fs.at.join("store");
    let pool = Pool::start(&data, &scratch.path().join("logs")).await;
    let huge = pool.huge_page_bytes().await;
    assert!(huge > 0.0, "no huge pages in the segment");
    let c = pool.client().await;
    let keys = round_trip(&c).await;
    assert!(
        mapped_huge(&data.join("segment.kvp")) > 0,
        "the client maps 4 KiB pages"
    );
    // Its pages go to sockets as they are (sendfile), byte-exact.
    let tcp = pool.client_over(Protocol::Tcp).await;
    read_back(&tcp, &keys).await;
    let big: Vec<(String, Vec<u8>)> = (0..6u64)
        .map(|i| {
            let v = (0..2 * MIB).map(|j| (j * 31 + i) as u8).collect();
            (format!("big-{i}"), v)
        })
        .collect();
    for (k, v) in &big {
        c.put(k, v, &ReplicateConfig::default()).await.expect("put");
    }
    for (k, v) in &big {
        assert!(tcp.get(k).await.expect("get over TCP") == *v, "{k}");
    }
    let lent = pool.bytes_from_file().await;
    let want = big.iter().map(|(_, v)| v.len()).sum::<usize>() as f64;
    assert!(lent >= want, "{lent} of {want} bytes sent from the file");
}

/// Reads over TCP from a huge tmpfs leave from the segment's pages, which
/// the socket holds until the reader takes them: while a writer replaces
/// the values and fills the segment past full (eviction reuses regions),
/// every value a reader gets is one a writer wrote, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_from_lent_pages_never_return_replaced_bytes() {
    let scratch = scratch_dir();
    let at = scratch.path().join("thp");
    let Some(fs) = Mount::new("tmpfs", "huge=always,size=256m", &at) else {
        return;
    };
    let pool = Pool::start(&fs.at.join("store"), &scratch.path().join("logs")).await;
    let writer = pool.client().await;
    let keys = 8u8;
    // A version of key k repeats (k, round): a value that does not is
    // another key's, or mixes versions (or regions).
    let version = |k: u8, round: u32| [k, round as u8].repeat(MIB as usize);
    for k in 0..keys {
        let v = version(k, 0);
        writer
            .put(&format!("hot-{k}"), &v, &ReplicateConfig::default())
            .await
            .expect("put");
    }
    // Runs until the writer has gone round enough times and the readers
    // have read enough (however slow the machine), within a minute.
    let (rounds_done, reads_done) = (AtomicU32::new(0), AtomicU32::new(0));
    let enough =
        || rounds_done.load(Ordering::Relaxed) >= 8 && reads_done.load(Ordering::Relaxed) >= 40;
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    let going = || !enough() && tokio::time::Instant::now() < until;
    let write = async {
        let mut round = 1;
        while going() {
            for k in 0..keys {
                let v = version(k, round);
                let _ = writer
                    .upsert(&format!("hot-{k}"), &v, &ReplicateConfig::default())
                    .await;
            }
            // Past the 64 MiB segment within a few rounds: older objects
            // are evicted and their regions written again.
            let fill = vec![0xA5; 2 * MIB as usize];
            let _ = writer
                .put(&format!("fill-{round}"), &fill, &ReplicateConfig::default())
                .await;
            rounds_done.store(round, Ordering::Relaxed);
            round += 1;
        }
    };
    let read = async |seed: u8| {
        let c = pool.client_over(Protocol::Tcp).await;
        let mut k = seed;
        while going() {
            k = (k + 3) % keys;
            // A miss is allowed (old versions stay held under their read
            // leases, so the segment fills and evicts hot keys too); wrong
            // bytes are not.
            if let Ok(v) = c.get(&format!("hot-{k}")).await {
                assert_eq!(v.len(), 2 * MIB as usize);
                let want = [k, v[1]];
                assert!(
                    v.chunks(2).all(|pair| pair == want),
                    "hot-{k}: another key's bytes, or versions mixed"
                );
                reads_done.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    tokio::join!(write, read(0), read(1));
    // 16 MiB at first, 18 more a round: past the segment from the 3rd.
    assert!(
        enough(),
        "{} write rounds, {} whole reads in a minute",
        rounds_done.load(Ordering::Relaxed),
        reads_done.load(Ordering::Relaxed)
    );
    assert!(
        pool.bytes_from_file().await > 0.0,
        "nothing was sent from the file"
    );
}
