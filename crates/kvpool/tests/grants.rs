//! Grants are bound to the segment's mount (chaos finding 12): a writer
//! paused mid-put under one master leader, the leader killed, the next one
//! acknowledging 300 puts of 1 MiB into the same regions, then the writer
//! resumed. Before the fence, about 200 of the 300 were destroyed and the
//! damage showed only at the next rebuild. Here every acknowledged object
//! must read back intact, right after the writer resumed and again after
//! one more leader change (which rebuilds the map from the stores).
//!
//! The late writer comes three ways: the test process itself over TCP (a
//! write cut off mid-payload, and writes granted but not sent yet), the
//! test process through shared memory (a copy paused half done, holding a
//! write slot, and copies not started yet), and a real `kvpool bench`
//! process frozen with SIGSTOP in the middle of its batch puts.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kvpool_client::{Client, ClientConfig, Protocol, ReplicateConfig};
use kvpool_format::{header_len, value_checksum, ObjectHeader};
use kvpool_net::auth::{Role, Security};
use kvpool_net::{CallPolicy, FramedConn, MasterLink};
use kvpool_proto::frame::{FrameHeader, Limits, Opcode};
use kvpool_proto::msg::{self, ClientId, PutGrant, PutItem, Replica};
use kvpool_proto::{Code, KvResult};
use kvpool_transfer::data::{write_regions, WriteOp};
use kvpool_transfer::fence::{SharedFence, ShmWriter};
use kvpool_transfer::MappedRegion;

/// Objects the new leader acknowledges, and their size.
const OBJECTS: usize = 300;
const SIZE: usize = 1 << 20;
/// Puts the late writer has granted under the old leader.
const STALE: usize = 64;

/// etcd, two masters with HA, one store, all with a cluster secret.
struct Pool {
    _etcd: Process,
    masters: Vec<Option<MasterProcess>>,
    store: Process,
    addr: String,
    secrets: Secrets,
    dir: tempfile::TempDir,
    etcd_endpoint: String,
}

impl Pool {
    async fn start() -> Pool {
        let dir = scratch_dir();
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).expect("log dir");
        let secrets = Secrets::create(dir.path());
        let (etcd, endpoint) = spawn_etcd(&logs).await;
        let addr = format!("etcd://{endpoint}/grants");
        let mut pool = Pool {
            _etcd: etcd,
            masters: Vec::new(),
            store: spawn_store_with(
                std::path::Path::new(BIN),
                "store",
                "store",
                &addr,
                "1536MiB",
                &dir.path().join("store"),
                &logs,
                &["--secret-file".into(), path(&secrets.store_file)],
            ),
            addr,
            secrets,
            dir,
            etcd_endpoint: endpoint,
        };
        for i in 0..2 {
            let m = pool.spawn_master(i).await;
            pool.masters.push(Some(m));
        }
        let status = pool.status_flags();
        wait_for_segments_as(&pool.addr, 1, &mut [&mut pool.store], &status).await;
        pool
    }

    async fn spawn_master(&self, i: usize) -> MasterProcess {
        let (ep, secret) = (self.etcd_endpoint.clone(), path(&self.secrets.admin_file));
        let logs = self.dir.path().join("logs");
        spawn_master(&format!("master-{i}"), &logs, move |rpc, metrics| {
            [
                "master",
                "--rpc-port",
                &rpc.to_string(),
                "--metrics-port",
                &metrics.to_string(),
                "--enable-ha",
                "--etcd-endpoints",
                &ep,
                "--cluster-id",
                "grants",
                "--client-ttl",
                "2s",
                "--ha-lease-ttl",
                "2s",
                "--secret-file",
                &secret,
            ]
            .map(String::from)
            .to_vec()
        })
        .await
    }

    fn status_flags(&self) -> Vec<String> {
        vec!["--secret-file".into(), path(&self.secrets.client_file)]
    }

    /// Which master leads now.
    async fn leader(&self) -> usize {
        let flags = self.status_flags();
        eventually("a master to lead", STARTUP, async || {
            for (i, m) in self.masters.iter().enumerate() {
                let Some(m) = m else { continue };
                let mut args = vec!["status", "--master", &m.rpc];
                args.extend(flags.iter().map(String::as_str));
                let out = run_kvpool(&args, Duration::from_secs(10)).await;
                if String::from_utf8_lossy(&out.stdout).contains("role: leader") {
                    return Some(i);
                }
            }
            None
        })
        .await
    }

    /// Kills the leader; the other master takes over, a new standby is
    /// started in the dead one's place, and the store has mounted its
    /// segment on the new leader (a client put succeeds).
    async fn fail_over(&mut self, client: &Client) {
        let old = self.leader().await;
        if let Some(mut m) = self.masters[old].take() {
            m.process.kill9();
        }
        let new = self.leader().await;
        assert_ne!(new, old);
        self.masters[old] = Some(self.spawn_master(old).await);
        let (probe, rc) = (value_for("probe", 1024), ReplicateConfig::default());
        eventually("the new leader to take puts", STARTUP, async || {
            client.upsert("probe", &probe, &rc).await.ok()
        })
        .await;
    }

    async fn client(&self, protocol: Protocol) -> Client {
        let mut cfg = ClientConfig::new(&self.addr);
        cfg.protocol = protocol;
        cfg.security = Security::with_key(Some(self.secrets.key(Role::Client)));
        Client::connect(cfg).await.expect("client")
    }

    /// A bare master link, as the late writer: it asks for grants itself.
    async fn link(&self) -> std::sync::Arc<MasterLink> {
        let key = Some(self.secrets.key(Role::Client));
        let link = MasterLink::new(
            &self.addr,
            ClientId(rand::random()),
            "late-writer",
            "client",
            CallPolicy::default(),
            Security::with_key(key),
        )
        .expect("link");
        link.register().await.expect("register");
        link
    }
}

fn path(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A granted put of the late writer: the object's bytes and where they go.
struct Stale {
    object: Vec<u8>,
    generation: u64,
    replica: Replica,
}

/// Asks the current leader for [`STALE`] puts of 1 MiB, as a writer would
/// before it writes anything.
async fn grants(link: &MasterLink) -> Vec<Stale> {
    let keys: Vec<String> = (0..STALE).map(|i| format!("late/{i}")).collect();
    let items = keys
        .iter()
        .map(|k| PutItem {
            key: k.clone(),
            value_len: SIZE as u64,
            region_len: (header_len(k.len()) + SIZE) as u64,
        })
        .collect();
    let start = msg::PutStart {
        client_id: link.client_id(),
        op: 1,
        items,
        config: ReplicateConfig::default(),
        upsert: true,
    };
    // Asked again while the new pool settles: the same writer asking again
    // gets the same regions back.
    let granted = eventually("grants for every key", STARTUP, async || {
        let g = link.call(&start).await.ok()?;
        g.iter().all(|g| g.is_ok()).then_some(g)
    })
    .await;
    keys.iter()
        .zip(granted)
        .map(|(key, g)| {
            let Ok(PutGrant::Write {
                generation,
                mut replicas,
            }) = g
            else {
                panic!("no write grant for {key}: {g:?}");
            };
            let value = vec![0xEE; SIZE];
            let mut object = ObjectHeader {
                key: key.clone(),
                value_len: SIZE as u64,
                generation,
                checksum: value_checksum(&[&value]),
            }
            .encode();
            object.extend_from_slice(&value);
            Stale {
                object,
                generation,
                replica: replicas.remove(0),
            }
        })
        .collect()
}

/// The new leader's puts: [`OBJECTS`] acknowledged objects.
async fn acknowledged(client: &Client) -> Vec<String> {
    let keys: Vec<String> = (0..OBJECTS).map(|i| format!("acked/{i}")).collect();
    for chunk in keys.chunks(16) {
        let values: Vec<Vec<u8>> = chunk.iter().map(|k| value_for(k, SIZE)).collect();
        let items: Vec<(&str, &[u8])> = chunk
            .iter()
            .map(String::as_str)
            .zip(values.iter().map(Vec::as_slice))
            .collect();
        for (k, r) in chunk.iter().zip(
            client
                .batch_put_values(&items, &ReplicateConfig::default(), true)
                .await,
        ) {
            r.unwrap_or_else(|e| panic!("put {k} under the new leader: {e}"));
        }
    }
    keys
}

/// Which of `keys` do not read back exactly as written, read in batches
/// by a client that gives up on a key within seconds (a damaged object
/// fails its checksum on every replica and would otherwise be retried for
/// the whole default budget).
async fn damaged(pool: &Pool, keys: &[String]) -> Vec<String> {
    let mut cfg = ClientConfig::new(&pool.addr);
    cfg.security = Security::with_key(Some(pool.secrets.key(Role::Client)));
    cfg.timeout = Duration::from_secs(3);
    cfg.retry_for = Duration::from_secs(3);
    let reader = Client::connect(cfg).await.expect("reader");
    let mut bad = Vec::new();
    for chunk in keys.chunks(50) {
        let names: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for (k, r) in chunk.iter().zip(reader.batch_get(&names).await) {
            match r {
                Ok(v) if v == value_for(k, SIZE) => {}
                Ok(_) => bad.push(format!("{k}: wrong bytes")),
                Err(e) => bad.push(format!("{k}: {e}")),
            }
        }
    }
    bad
}

/// After the late writer is done: nothing acknowledged is damaged, now and
/// after one more leader change (a rebuild from the store's inventory is
/// where a destroyed object used to show).
async fn assert_intact(pool: &mut Pool, client: &Client, acked: &[String]) {
    let bad = damaged(pool, acked).await;
    assert!(
        bad.is_empty(),
        "{} of {OBJECTS} damaged: {bad:?}",
        bad.len()
    );
    pool.fail_over(client).await;
    let bad = damaged(pool, acked).await;
    assert!(
        bad.is_empty(),
        "{} of {OBJECTS} damaged after the next rebuild: {bad:?}",
        bad.len()
    );
    if let Some(s) = pool.store.try_exit() {
        panic!("the store exited with {s}\n{}", pool.store.logs());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_writer_over_tcp_damages_nothing_the_new_leader_acknowledged() {
    let mut pool = Pool::start().await;
    let client = pool.client(Protocol::Tcp).await;
    let link = pool.link().await;
    let stale = grants(&link).await;
    let first = &stale[0].replica;
    let key = Security::with_key(Some(pool.secrets.key(Role::Client)));
    let connect = || FramedConn::connect_with(&first.endpoint, "late", Limits::default(), &key);
    // One write is cut off half way through its payload; the others are
    // granted but not sent yet.
    let mut cut = connect().await.expect("connect to the store");
    let meta = msg::encode(&msg::WriteReq {
        segment: first.segment,
        offset: first.offset,
        grant: first.grant(stale[0].generation),
    });
    let object = &stale[0].object;
    let h = FrameHeader::request(Opcode::Write, 1, meta.len() as u32, object.len() as u64);
    let half = object.len() / 2;
    cut.send_frame(&h, &meta, &[&object[..half]])
        .await
        .expect("send");
    cut.flush().await.expect("flush");

    pool.fail_over(&client).await;
    let acked = acknowledged(&client).await;

    // The writer resumes: the rest of the cut-off payload, then the others.
    let rest = async {
        cut.send_more(&object[half..]).await?;
        cut.flush().await?;
        cut.read_response(1).await.map(drop)
    };
    let r: KvResult<()> = rest.await;
    if let Err(e) = &r {
        // The store may also have dropped the stalled connection (no
        // progress for 10 s): then nothing of it landed either.
        assert!(
            matches!(
                e.code,
                Code::TransferFail | Code::RpcFail | Code::RpcTimeout
            ),
            "{e}"
        );
    }
    assert!(r.is_err(), "the cut-off write was acknowledged");
    let mut conn = connect().await.expect("connect to the store");
    let ops: Vec<WriteOp> = stale[1..]
        .iter()
        .map(|s| WriteOp {
            req: msg::WriteReq {
                segment: s.replica.segment,
                offset: s.replica.offset,
                grant: s.replica.grant(s.generation),
            },
            parts: vec![&s.object],
        })
        .collect();
    let results = write_regions(&mut conn, &ops).await.expect("connection");
    for r in &results {
        let e = r
            .as_ref()
            .expect_err("a write granted by the dead leader landed");
        assert_eq!(e.code, Code::TransferFail, "{e}");
    }
    assert_intact(&mut pool, &client, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_writer_through_shared_memory_damages_nothing_the_new_leader_acknowledged() {
    let mut pool = Pool::start().await;
    let client = pool.client(Protocol::Auto).await;
    let link = pool.link().await;
    let stale = grants(&link).await;
    let status = client.status().await.expect("status");
    let file = status.segments[0]
        .info
        .path
        .clone()
        .expect("a segment file");
    let file = std::path::PathBuf::from(file);
    let region = Arc::new(MappedRegion::open_existing(&file).expect("map"));
    let fence = SharedFence::new(&region).expect("a segment");
    let writer = Arc::new(ShmWriter::acquire(&file, &fence).expect("a writer id"));
    // One copy is paused half done, holding its write slot across the
    // failover (a process stopped inside memcpy); the others wait.
    let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
    let (halfway_tx, halfway_rx) = std::sync::mpsc::channel::<()>();
    let copy = {
        let (region, writer) = (region.clone(), writer.clone());
        let (object, replica) = (stale[0].object.clone(), stale[0].replica.clone());
        std::thread::spawn(move || {
            let fence = SharedFence::new(&region).expect("a segment");
            let (offset, len) = (replica.offset, object.len() as u64);
            writer.write(&fence, replica.fence, (offset, len), || {
                // SAFETY: in bounds (the master granted it); this test plays
                // the writer the master gave the region to.
                let dst = unsafe { region.slice_mut(offset, len) };
                let half = object.len() / 2;
                dst[..half].copy_from_slice(&object[..half]);
                halfway_tx.send(()).expect("halfway");
                resume_rx.recv().expect("resumed");
                dst[half..].copy_from_slice(&object[half..]);
            })
        })
    };
    let started = tokio::task::spawn_blocking(move || halfway_rx.recv());
    started.await.expect("join").expect("the copy started");
    pool.fail_over(&client).await;
    let acked = acknowledged(&client).await;
    resume_tx.send(()).expect("resume");
    let copied = tokio::task::spawn_blocking(move || copy.join().expect("the copy"));
    let copied = copied.await.expect("join");
    assert!(
        copied.is_ok(),
        "the paused copy had passed its check before the failover"
    );
    // Copies not started before the failover are refused.
    let fence = SharedFence::new(&region).expect("a segment");
    for s in &stale[1..] {
        let len = s.object.len() as u64;
        let r = writer.write(&fence, s.replica.fence, (s.replica.offset, len), || {
            panic!("a copy under the dead leader's grant started")
        });
        assert!(r.is_err());
    }
    assert_intact(&mut pool, &client, &acked).await;
    // Its region was held back while the copy was paused, and released
    // once it finished: the late object was destroyed, never found.
    assert_eq!(
        client
            .get("late/0")
            .await
            .expect_err("never committed")
            .code,
        Code::ObjectNotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_process_frozen_mid_put_damages_nothing_the_new_leader_acknowledged() {
    let mut pool = Pool::start().await;
    let client = pool.client(Protocol::Tcp).await;
    let logs = pool.dir.path().join("logs");
    let mut args: Vec<String> = [
        "bench",
        "--master",
        &pool.addr,
        "--ops",
        "put",
        "--sizes",
        "1MiB",
        "--batch",
        "64",
        "--concurrency",
        "2",
        "--duration",
        "10m",
        "--rate",
        "3",
        "--protocol",
        "tcp",
        "--prefix",
        "frozen",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--secret-file".into(), path(&pool.secrets.client_file)]);
    let mut writer = Process::spawn("frozen-writer", &args, &logs);
    let flags = pool.status_flags();
    // Frozen while a put of it is in flight at the master.
    let mut tries = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % 40)).await;
        writer.freeze(true);
        let mut a = vec!["status", "--master", &pool.addr];
        a.extend(flags.iter().map(String::as_str));
        let out = run_kvpool(&a, Duration::from_secs(10)).await;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let in_flight = text
            .lines()
            .find_map(|l| l.strip_prefix("puts in flight: "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if in_flight > 0 {
            break;
        }
        writer.freeze(false);
        tries += 1;
        assert!(
            tries < 200,
            "the writer never had a put in flight\n{}",
            writer.logs()
        );
        assert!(
            writer.try_exit().is_none(),
            "the writer exited\n{}",
            writer.logs()
        );
    }
    pool.fail_over(&client).await;
    let acked = acknowledged(&client).await;
    writer.freeze(false);
    // It writes on (now under the new leader) for a while, then stops; paced,
    // so it does not fill the pool (an eviction would be a loss of another kind).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        writer.try_exit().is_none(),
        "the writer died\n{}",
        writer.logs()
    );
    writer.kill9();
    assert_intact(&mut pool, &client, &acked).await;
}
