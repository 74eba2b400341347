//! Attacks with well-formed bytes against the real master and stores.
//! Resources: a connection costs memory only for the bytes it has sent, and
//! one that stalls is closed instead of held forever. Authentication: with a
//! cluster secret, nothing but the handshake is answered to a peer without
//! a key of the cluster, a client key cannot do what takes the store or
//! admin key, a client reads and writes only the regions the master granted
//! it, and nothing an attacker tries loses a stored object.
//!
//! Long on purpose (over 800 lines): one attack per test, each against its
//! own real cluster, sharing the raw-protocol helpers at the top.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, run_kvpool, Cluster, Process};
use kvpool_client::ReplicateConfig;
use kvpool_format::ObjectHeader;
use kvpool_net::auth::{Credentials, Role, Security};
use kvpool_net::conn::{HANDSHAKE_TIMEOUT, MAX_HELLO, PROGRESS_TIMEOUT};
use kvpool_net::{FramedConn, MasterLink};
use kvpool_proto::frame::{FrameHeader, Limits, Opcode, MIN_PROTOCOL_VERSION};
use kvpool_proto::msg::{self, Hello, SegmentId, SegmentInfo};
use kvpool_proto::{Code, PROTOCOL_VERSION};
use kvpool_transfer::data::{read_regions, write_regions, ReadOp, WriteOp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connections each attack opens per server.
const CONNECTIONS: usize = 16;

/// Connects and completes the handshake by hand; returns the raw socket.
async fn handshaken(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let hello = msg::encode(&Hello {
        version: PROTOCOL_VERSION,
        min_version: MIN_PROTOCOL_VERSION,
        role: "attacker".into(),
        nonce: [0; 16],
    });
    let h = FrameHeader::request(Opcode::Hello, 1, hello.len() as u32, 0);
    s.write_all(&h.encode()).await.expect("send hello");
    s.write_all(&hello).await.expect("send hello");
    // The reply: a header and a short message; read whatever arrives first.
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("hello answered")
        .expect("read");
    assert!(n > 0, "{addr} closed instead of answering the hello");
    s
}

/// Whether the server closed `s` within `within` (reads until EOF or error).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_message_costs_nothing_until_its_bytes_arrive() {
    let mut cluster = Cluster::builder().start().await;
    let client = cluster.client().await;
    let store_addr = client.status().await.expect("status").segments[0]
        .info
        .endpoint
        .clone();
    let max = Limits::default().max_meta;
    for (name, addr) in [
        ("master", cluster.master_addr.clone()),
        ("store", store_addr),
    ] {
        let before = match name {
            "master" => cluster.master_process().rss(),
            _ => cluster.store(0).rss(),
        };
        let mut socks = Vec::new();
        for i in 0..CONNECTIONS {
            let mut s = handshaken(&addr).await;
            // A header promising the largest message there may be, then a
            // trickle of it, then nothing.
            let h = FrameHeader::request(Opcode::Status, 2 + i as u64, max, 0);
            s.write_all(&h.encode()).await.expect("send header");
            s.write_all(&[0u8; 100]).await.expect("send a little");
            socks.push(s);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = match name {
            "master" => cluster.master_process().rss(),
            _ => cluster.store(0).rss(),
        };
        // Allocating what was declared would be 16 x 64 MiB = 1 GiB.
        let grown = after.saturating_sub(before);
        assert!(
            grown < 64 << 20,
            "{name}: RSS grew {grown} bytes for {CONNECTIONS} stalled 64 MiB messages"
        );
        // Everyone else is still served meanwhile.
        client.status().await.expect("status during the attack");
        drop(socks);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_trickles_loses_its_connection() {
    let cluster = Cluster::builder().start().await;
    let client = cluster.client().await;
    let seg = client.status().await.expect("status").segments[0]
        .info
        .clone();
    let mut s = handshaken(&seg.endpoint).await;
    let meta = msg::encode(&msg::WriteReq {
        segment: seg.id,
        offset: seg.base,
        grant: msg::Grant {
            offset: seg.base,
            len: 2 << 20,
            generation: 1,
            fence: 0,
            cap: None,
        },
    });
    let h = FrameHeader::request(Opcode::Write, 2, meta.len() as u32, 2 << 20);
    s.write_all(&h.encode()).await.expect("send header");
    s.write_all(&meta).await.expect("send meta");
    // Well under a MiB, then nothing: the store gives up after 10 s.
    s.write_all(&[0u8; 1024]).await.expect("send a little");
    let started = Instant::now();
    assert!(
        closed_within(&mut s, PROGRESS_TIMEOUT + Duration::from_secs(5)).await,
        "a 2 MiB payload stalled after 1 KiB kept its connection"
    );
    assert!(started.elapsed() >= PROGRESS_TIMEOUT - Duration::from_secs(1));
    client.status().await.expect("the store still serves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_says_hello_is_closed() {
    let cluster = Cluster::builder().start().await;
    let mut silent = TcpStream::connect(&cluster.master_addr)
        .await
        .expect("connect");
    let started = Instant::now();
    assert!(
        closed_within(&mut silent, HANDSHAKE_TIMEOUT + Duration::from_secs(5)).await,
        "a connection that sent nothing was still open after {:?}",
        started.elapsed()
    );
    // Half a header, then nothing: closed the same way.
    let mut half = TcpStream::connect(&cluster.master_addr)
        .await
        .expect("connect");
    half.write_all(b"KV").await.expect("write");
    assert!(closed_within(&mut half, HANDSHAKE_TIMEOUT + Duration::from_secs(5)).await);
    // The master still serves.
    cluster.client().await.status().await.expect("status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_hello_is_refused_before_it_is_read() {
    let cluster = Cluster::builder().start().await;
    let mut s = TcpStream::connect(&cluster.master_addr)
        .await
        .expect("connect");
    let h = FrameHeader::request(Opcode::Hello, 1, MAX_HELLO + 1, 0);
    s.write_all(&h.encode()).await.expect("send header");
    // Refused and closed without waiting for the 4 KiB + 1 that were declared.
    assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    // A normal handshake still works.
    FramedConn::connect(&cluster.master_addr, "test", Limits::default())
        .await
        .expect("a normal client connects");
}

/// Puts `n` keys through a client of `cluster` and returns them.
async fn stored(cluster: &Cluster, n: usize) -> Vec<(String, Vec<u8>)> {
    let objects = (0..n).map(|i| {
        let key = format!("victim-{i}");
        let value = common::value_for(&key, 4096);
        (key, value)
    });
    put_all(&cluster.client().await, objects).await
}

/// Puts every `(key, value)` through `client` and returns them.
async fn put_all(
    client: &kvpool_client::Client,
    objects: impl IntoIterator<Item = (String, Vec<u8>)>,
) -> Vec<(String, Vec<u8>)> {
    let mut kept = Vec::new();
    for (key, value) in objects {
        client
            .put(&key, &value, &ReplicateConfig::default())
            .await
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
        kept.push((key, value));
    }
    kept
}

/// Asserts every key still reads back its exact value.
async fn all_there(cluster: &Cluster, kept: &[(String, Vec<u8>)]) {
    let client = cluster.client().await;
    for (key, value) in kept {
        let got = client
            .get(key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(got == *value, "{key}: wrong bytes");
    }
}

/// A raw link to the master proving `key` (or nothing).
fn link_as(cluster: &Cluster, key: Option<Credentials>) -> std::sync::Arc<MasterLink> {
    common::master_link_as(&cluster.master_addr, "attacker", key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_of_the_cluster_nothing_is_answered() {
    let cluster = Cluster::builder().secured().start().await;
    let kept = stored(&cluster, 20).await;
    let store = cluster
        .client()
        .await
        .status()
        .await
        .expect("status")
        .segments[0]
        .info
        .endpoint
        .clone();
    let stranger = Credentials::parse("another cluster's secret, 32 bytes").expect("secret");
    for (name, addr) in [("master", &cluster.master_addr), ("store", &store)] {
        // No key: refused at the handshake, with a hint.
        let e = FramedConn::connect(addr, "attacker", Limits::default())
            .await
            .err()
            .unwrap_or_else(|| panic!("{name}: connected without a key"));
        assert_eq!(e.code, Code::Unauthorized, "{name}: {e}");
        assert!(e.message.contains("KVPOOL_SECRET_FILE"), "{name}: {e}");
        // Another cluster's key, at every role: refused.
        for role in Role::ALL {
            let key = stranger.derive(role).expect("derive");
            let e = FramedConn::connect_with(
                addr,
                "attacker",
                Limits::default(),
                &Security::with_key(Some(key.clone())),
            )
            .await
            .err()
            .unwrap_or_else(|| panic!("{name}: connected with a stranger's {role} key"));
            assert_eq!(e.code, Code::Unauthorized, "{name} {role}: {e}");
        }
        // Skipping the proof: the first request after Hello is refused and
        // the connection closed.
        let mut s = handshaken(addr).await;
        let status = msg::encode(&msg::Status {});
        let h = FrameHeader::request(Opcode::Status, 2, status.len() as u32, 0);
        s.write_all(&h.encode()).await.expect("send");
        s.write_all(&status).await.expect("send");
        assert!(
            closed_within(&mut s, Duration::from_secs(5)).await,
            "{name}: a request without the proof left the connection open"
        );
    }
    // Removals from the unauthenticated: impossible, so nothing is lost.
    let e = link_as(&cluster, None)
        .call_once(&msg::RemoveAll { force: true })
        .await
        .expect_err("remove-all without a key");
    assert_eq!(e.code, Code::Unauthorized, "{e}");
    all_there(&cluster, &kept).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_does_only_what_it_may() {
    let cluster = Cluster::builder().secured().start().await;
    let kept = stored(&cluster, 20).await;
    let secrets = cluster.secrets.as_ref().expect("secured");
    let client_key = secrets.key(Role::Client);
    let as_client = link_as(&cluster, Some(client_key.clone()));
    // What takes the admin key.
    for (what, e) in [
        (
            "remove-all",
            as_client
                .call_once(&msg::RemoveAll { force: true })
                .await
                .err(),
        ),
        (
            "remove-by-regex",
            as_client
                .call_once(&msg::RemoveByRegex {
                    pattern: ".*".into(),
                    force: true,
                })
                .await
                .err(),
        ),
        (
            "drain with a deadline",
            as_client
                .call_once(&msg::DrainSegment {
                    segment: Cluster::store_name(0),
                    unmount_after_ms: Some(0),
                })
                .await
                .err(),
        ),
    ] {
        let e = e.unwrap_or_else(|| panic!("{what} with a client key succeeded"));
        assert_eq!(e.code, Code::Unauthorized, "{what}: {e}");
    }
    // What takes the store key: lending (a fake segment), inventories.
    let fake = common::black_hole_mount(as_client.client_id());
    let e = as_client
        .call_once(&fake)
        .await
        .expect_err("a client mounted");
    assert_eq!(e.code, Code::Unauthorized, "{e}");
    // Data plane: a client may read and write, but not invalidate.
    let status = cluster.client().await.status().await.expect("status");
    let seg = &status.segments[0].info;
    let mut conn = FramedConn::connect_with(
        &seg.endpoint,
        "attacker",
        Limits::default(),
        &Security::with_key(Some(client_key.clone())),
    )
    .await
    .expect("a client key opens the data plane");
    let e = conn
        .call(&msg::InvalidateReq {
            segment: seg.id,
            fence: 1,
            regions: vec![(seg.base, 1)],
        })
        .await
        .expect_err("a client invalidated objects");
    assert_eq!(e.code, Code::Unauthorized, "{e}");
    all_there(&cluster, &kept).await;
    assert_eq!(status.segments.len(), 1, "no fake segment joined");

    // The admin key may do all of it.
    let as_admin = link_as(&cluster, Some(secrets.key(Role::Admin)));
    let removed = as_admin
        .call_once(&msg::RemoveAll { force: true })
        .await
        .expect("the admin removes everything");
    assert!(removed >= kept.len() as u64, "removed {removed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_a_store_need_the_key_too() {
    let mut cluster = Cluster::builder().secured().start().await;
    let secrets = cluster.secrets.as_ref().expect("secured");
    let client_file = secrets.client_file.to_string_lossy().into_owned();
    // `kvpool status` without the key: a clear refusal; with it: served.
    let out = run_kvpool(
        &["status", "--master", &cluster.master_addr],
        Duration::from_secs(15),
    )
    .await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("requires authentication"), "{err}");
    let out = run_kvpool(
        &[
            "status",
            "--master",
            &cluster.master_addr,
            "--secret-file",
            &client_file,
        ],
        Duration::from_secs(15),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("segments: 1"));
    // A store with only a client key cannot lend its segment.
    let data = cluster.dir().join("intruder");
    let mut intruder = cluster.spawn(
        "intruder",
        [
            "store",
            "--master",
            &cluster.master_addr,
            "--segment-size",
            "16MiB",
            "--data-dir",
            &data.to_string_lossy(),
            "--secret-file",
            &client_file,
        ],
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = cluster.client().await.status().await.expect("status");
    assert_eq!(
        status.segments.len(),
        1,
        "the intruder's segment was mounted"
    );
    intruder.kill9();
    cluster.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_means_loopback_only_and_a_keyed_client_refuses_it() {
    // Off loopback without a secret: refused with the way out in the message.
    let dir = common::scratch_dir();
    let port = free_port().to_string();
    let out = run_kvpool(
        &[
            "master",
            "--rpc-address",
            "0.0.0.0",
            "--rpc-port",
            &port,
            "--metrics-port",
            "0",
        ],
        Duration::from_secs(15),
    )
    .await;
    assert!(!out.status.success(), "an open master started");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("without a secret") && err.contains("--insecure"),
        "{err}"
    );
    // Said explicitly, it starts.
    let mut open = Process::spawn(
        "open-master",
        [
            "master",
            "--rpc-address",
            "0.0.0.0",
            "--rpc-port",
            &port,
            "--metrics-port",
            "0",
            "--insecure",
        ],
        dir.path(),
    );
    let addr = format!("127.0.0.1:{port}");
    common::eventually(
        "the insecure master to listen",
        Duration::from_secs(20),
        async || {
            assert!(open.try_exit().is_none(), "{}", open.logs());
            tokio::net::TcpStream::connect(&addr).await.ok().map(|_| ())
        },
    )
    .await;
    // A process holding a key does not trust a server that proves none.
    let key = Credentials::parse("our cluster secret, long enough").expect("secret");
    let e = FramedConn::connect_with(
        &addr,
        "client",
        Limits::default(),
        &Security::with_key(Some(key.clone())),
    )
    .await
    .err()
    .expect("a keyed client talked to an unauthenticated server");
    assert_eq!(e.code, Code::Unauthorized, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_cannot_take_over_another_stores_segment() {
    // Attack 7 of the tenancy issue ("store-key insiders"): a holder of the
    // store key mounts a live segment's id as its own.
    let mut cluster = Cluster::builder().secured().start().await;
    let kept = stored(&cluster, 20).await;
    let victim = cluster
        .client()
        .await
        .status()
        .await
        .expect("status")
        .segments[0]
        .info
        .clone();
    // A holder of the store key, registered, mounts the victim's segment id
    // with its own endpoint (to receive its reads and writes) and an empty
    // inventory (to make the master forget its objects).
    let thief = link_as(
        &cluster,
        Some(cluster.secrets.as_ref().expect("secured").key(Role::Store)),
    );
    thief.register().await.expect("register");
    // Its mounts of the victim's id, with an empty inventory and with one.
    let grabs = |client_id| {
        [0, 1].map(|objects| msg::MountSegment {
            client_id,
            segment: SegmentInfo {
                endpoint: "127.0.0.1:1".into(),
                ..victim.clone()
            },
            objects,
            scan_age_ms: 0,
            possession: rand::random(),
            fence: 1,
            held: Vec::new(),
        })
    };
    for grab in grabs(thief.client_id()) {
        let e = thief
            .call_once(&grab)
            .await
            .expect_err("a segment was taken over without its secret");
        assert_eq!(e.code, Code::Unauthorized, "{e}");
    }
    // Nor drain it (every put would then fail): by name takes the admin
    // key, and a store's own drain takes the segment's secret.
    let by_name = msg::DrainSegment {
        segment: victim.name.clone(),
        unmount_after_ms: None,
    };
    let e = thief
        .call_once(&by_name)
        .await
        .expect_err("a drain by name");
    assert_eq!(e.code, Code::Unauthorized, "{e}");
    let own = msg::DrainOwn {
        segment: victim.id,
        possession: rand::random(),
    };
    let e = thief
        .call_once(&own)
        .await
        .expect_err("a drain without the secret");
    assert_eq!(e.code, Code::Unauthorized, "{e}");
    let after = cluster.client().await.status().await.expect("status");
    assert_eq!(after.segments[0].info.endpoint, victim.endpoint);
    assert_eq!(after.segments[0].state, "live", "not draining");
    all_there(&cluster, &kept).await;
    // Attack 7 of the tenancy issue: the window after a master restart,
    // before the segment's store is back, when the master has not seen its
    // secret yet. The id is derived from the secret, so the proof is
    // checked without it.
    cluster.kill9_store(0);
    cluster.kill9_master();
    cluster.restart_master().await;
    thief.register().await.expect("register again");
    for grab in grabs(thief.client_id()) {
        let e = thief
            .call_once(&grab)
            .await
            .expect_err("a segment was captured while its store was away");
        assert_eq!(e.code, Code::Unauthorized, "{e}");
        assert!(e.message.contains("proof of possession"), "{e}");
    }
    // Its own store, restarted on the same data dir, proves the secret
    // from the superblock and gets its objects back.
    cluster.restart_store(0, None);
    common::eventually(
        "the restarted store's objects",
        Duration::from_secs(30),
        async || {
            let c = cluster.client().await;
            let mut ok = true;
            for (key, value) in &kept {
                ok &= c.get(key).await.ok().as_ref() == Some(value);
            }
            ok.then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_takes_bearer_tokens_but_probes_stay_open() {
    let meta_port = free_port().to_string();
    let cluster = Cluster::builder()
        .secured()
        .master_flag("--enable-http-metadata-server", "true")
        .master_flag("--http-metadata-server-port", &meta_port)
        .start()
        .await;
    let secrets = cluster.secrets.as_ref().expect("secured");
    let bearer = |role: Role| format!("Bearer {}", secrets.key(role).http_token());
    let admin = &cluster.metrics_addr;
    // Probes and scrapers need nothing.
    for path in ["/health", "/metrics"] {
        assert_eq!(common::http_get(admin, path).await.0, 200, "{path}");
    }
    // The admin API and status page: the admin's token only.
    for path in ["/api/status", "/api/segments", "/"] {
        assert_eq!(
            common::http_get(admin, path).await.0,
            401,
            "{path} without a token"
        );
        for (role, code) in [(Role::Client, 403), (Role::Store, 403), (Role::Admin, 200)] {
            let auth = bearer(role);
            let got =
                common::http_request(admin, "GET", path, &[("Authorization", &auth)], b"").await;
            assert_eq!(got.0, code, "{path} with the {role} token: {}", got.1);
        }
        let forged = format!("Bearer {}", "0".repeat(64));
        let got =
            common::http_request(admin, "GET", path, &[("Authorization", &forged)], b"").await;
        assert_eq!(got.0, 401, "{path} with a forged token");
        // A browser sends the token as a Basic password.
        let basic = |token: &str| {
            use base64::Engine as _;
            let pair = base64::engine::general_purpose::STANDARD.encode(format!("me:{token}"));
            format!("Basic {pair}")
        };
        for (token, code) in [
            (secrets.key(Role::Admin).http_token(), 200),
            (secrets.key(Role::Client).http_token(), 403),
            ("0".repeat(64), 401),
        ] {
            let auth = basic(&token);
            let got =
                common::http_request(admin, "GET", path, &[("Authorization", &auth)], b"").await;
            assert_eq!(got.0, code, "{path} with Basic credentials: {}", got.1);
        }
    }
    let raw = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(admin)
            .await
            .expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("send");
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.expect("answer");
        raw
    };
    assert!(
        raw.contains("www-authenticate: Basic realm=\"kvpool\""),
        "a browser is asked for credentials: {raw}"
    );
    // The metadata service: writes take a token, reads do not.
    let meta = format!("127.0.0.1:{meta_port}");
    let path = "/metadata?key=engine-1";
    let got = common::http_request(&meta, "PUT", path, &[], b"forged").await;
    assert_eq!(got.0, 401, "a metadata write without a token");
    assert_eq!(
        common::http_get(&meta, path).await.0,
        404,
        "nothing was stored"
    );
    let auth = bearer(Role::Client);
    let got = common::http_request(&meta, "PUT", path, &[("Authorization", &auth)], b"real").await;
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(common::http_get(&meta, path).await, (200, "real".into()));
    let got = common::http_request(&meta, "DELETE", path, &[], b"").await;
    assert_eq!(got.0, 401, "a metadata delete without a token");
    assert_eq!(common::http_get(&meta, path).await.0, 200, "still there");
}

/// The object `key` of version `generation` holding `value`: header and
/// value, as a client writes it.
fn object(key: &str, generation: u64, value: &[u8]) -> Vec<u8> {
    let mut o = ObjectHeader {
        key: key.into(),
        value_len: value.len() as u64,
        generation,
        checksum: kvpool_format::value_checksum(&[value]),
    }
    .encode();
    o.extend_from_slice(value);
    o
}

/// Writes `payload` through `conn` under `grant`; the store's verdict.
async fn write_as(
    conn: &mut FramedConn,
    segment: SegmentId,
    offset: u64,
    grant: msg::Grant,
    payload: &[u8],
) -> Result<(), kvpool_proto::KvError> {
    let req = msg::WriteReq {
        segment,
        offset,
        grant,
    };
    let op = WriteOp {
        req,
        parts: vec![payload],
    };
    let mut r = write_regions(conn, &[op])
        .await
        .expect("the connection survives");
    r.remove(0)
}

/// Reads `len` bytes through `conn` under `grant`.
async fn read_as(
    conn: &mut FramedConn,
    segment: SegmentId,
    (offset, len): (u64, u64),
    grant: Option<msg::Grant>,
) -> Result<Vec<u8>, kvpool_proto::KvError> {
    let mut buf = vec![0u8; len as usize];
    let req = msg::ReadReq {
        segment,
        offset,
        len,
        grant,
    };
    let ops = vec![ReadOp {
        req,
        dst: vec![&mut buf[..]],
    }];
    let mut r = read_regions(conn, ops)
        .await
        .expect("the connection survives");
    r.remove(0).map(|()| buf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_touches_only_the_regions_the_master_granted() {
    let cluster = Cluster::builder().secured().start().await;
    let kept = stored(&cluster, 20).await;
    let client_key = cluster.secrets.as_ref().expect("secured").key(Role::Client);
    let link = link_as(&cluster, Some(client_key.clone()));
    link.register().await.expect("register");
    // Where a victim lives, with the read grant anyone may ask for.
    let located = link
        .call_once(&msg::GetReplicaList {
            keys: vec![kept[0].0.clone()],
        })
        .await
        .expect("locate");
    let victim = msg::from_wire(located[0].clone()).expect("the victim is there");
    let rep = &victim.replicas[0];
    let read_grant = rep
        .read_grant(victim.generation)
        .expect("a secured master grants");
    let mut conn = FramedConn::connect_with(
        &rep.endpoint,
        "attacker",
        Limits::default(),
        &Security::with_key(Some(client_key.clone())),
    )
    .await
    .expect("a client key opens the data plane");
    let forged = vec![0x5Au8; rep.len as usize];
    let denied = |r: Result<(), kvpool_proto::KvError>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.code, Code::Unauthorized, "{what}: {e}");
    };

    // Writes: without a signed grant, under a read grant, under a forged one.
    let unsigned = msg::Grant {
        cap: None,
        ..read_grant
    };
    denied(
        write_as(&mut conn, rep.segment, rep.offset, unsigned, &forged).await,
        "a write without a signed grant",
    );
    denied(
        write_as(&mut conn, rep.segment, rep.offset, read_grant, &forged).await,
        "a write under a read grant",
    );
    let mut upgraded = read_grant;
    upgraded.cap.as_mut().unwrap().access |= msg::Capability::WRITE;
    denied(
        write_as(&mut conn, rep.segment, rep.offset, upgraded, &forged).await,
        "a write under a read grant that claims write",
    );
    let mut stretched = read_grant;
    stretched.cap.as_mut().unwrap().expires_ms = u64::MAX;
    denied(
        read_as(&mut conn, rep.segment, (rep.offset, 64), Some(stretched))
            .await
            .map(drop),
        "a read under a grant with a forged expiry",
    );
    // A real write grant, for a put of the attacker's own: honoured for its
    // region, not for the victim's, nor past its end.
    let start = msg::PutStart {
        client_id: link.client_id(),
        op: 1,
        items: vec![msg::PutItem {
            key: "attacker-own".into(),
            value_len: 64,
            region_len: 4096,
        }],
        config: ReplicateConfig::default(),
        upsert: false,
    };
    let granted = link.call_once(&start).await.expect("put start");
    let Ok(msg::PutGrant::Write {
        generation,
        replicas,
    }) = granted[0].clone()
    else {
        panic!("no write grant: {:?}", granted[0]);
    };
    let own = &replicas[0];
    let write_grant = own.grant(generation);
    let own_object = |generation| object("attacker-own", generation, &[1; 64]);
    write_as(
        &mut conn,
        own.segment,
        own.offset,
        write_grant,
        &own_object(generation),
    )
    .await
    .expect("a write inside its own grant");
    // A grant writes only the version it names: not another object's
    // header, nor bytes that are no object at all.
    for (what, payload) in [
        ("a newer generation", own_object(generation + 1)),
        ("an older generation", own_object(generation - 1)),
        ("no header", vec![1; 64]),
    ] {
        let e = write_as(&mut conn, own.segment, own.offset, write_grant, &payload)
            .await
            .expect_err(what);
        assert_eq!(e.code, Code::TransferFail, "{what}: {e}");
    }
    denied(
        write_as(&mut conn, rep.segment, rep.offset, write_grant, &forged).await,
        "a write into the victim's region under another region's grant",
    );
    denied(
        write_as(
            &mut conn,
            own.segment,
            own.offset + own.len - 8,
            write_grant,
            &[1; 64],
        )
        .await,
        "a write running past the end of its grant",
    );
    // Reads: only inside a read grant.
    let head = read_as(&mut conn, rep.segment, (rep.offset, 64), Some(read_grant))
        .await
        .expect("a read inside its grant");
    assert!(head.iter().any(|&b| b != 0), "the victim's header was read");
    denied(
        read_as(&mut conn, rep.segment, (rep.offset, 64), None)
            .await
            .map(drop),
        "a read without a grant",
    );
    denied(
        read_as(
            &mut conn,
            rep.segment,
            (rep.offset, rep.len + 1),
            Some(read_grant),
        )
        .await
        .map(drop),
        "a read past the end of its grant",
    );
    // A grant kept after its object is gone writes nothing: the attacker
    // commits and removes its own object, then writes through the grant.
    let end = msg::PutEnd {
        client_id: link.client_id(),
        items: vec![msg::PutEndItem {
            key: "attacker-own".into(),
            generation,
        }],
    };
    assert!(link.call_once(&end).await.expect("put end")[0].is_ok());
    let remove = msg::Remove {
        keys: vec!["attacker-own".into()],
        force: true,
    };
    assert!(link.call_once(&remove).await.expect("remove")[0].is_ok());
    let e = write_as(
        &mut conn,
        own.segment,
        own.offset,
        write_grant,
        &own_object(generation),
    )
    .await
    .expect_err("a write through the grant of a removed object");
    assert_eq!(e.code, Code::TransferFail, "{e}");
    // Nothing was lost, and an engine over TCP (not shared memory) reads
    // and writes through its grants without noticing them.
    all_there(&cluster, &kept).await;
    let tcp = cluster
        .client_with(|c| c.protocol = kvpool_client::Protocol::Tcp)
        .await;
    let value = common::value_for("over-tcp", 100_000);
    tcp.put("over-tcp", &value, &ReplicateConfig::default())
        .await
        .expect("put over TCP");
    assert!(tcp.get("over-tcp").await.expect("get over TCP") == value);
    for (key, value) in &kept {
        assert!(tcp.get(key).await.expect("get over TCP") == *value, "{key}");
    }
}

/// The attacker's setup of attack 1: with the client key it puts `n`
/// objects of its own holding `value` through raw grants, commits them and
/// removes them, keeping each one's (key, generation, replica): the grants
/// it will try again. Also returns its master link and a data connection
/// to their store.
async fn grants_of_removed(
    cluster: &Cluster,
    n: usize,
    value: &[u8],
) -> (
    std::sync::Arc<MasterLink>,
    Vec<(String, u64, msg::Replica)>,
    FramedConn,
) {
    let client_key = cluster.secrets.as_ref().expect("secured").key(Role::Client);
    let link = link_as(cluster, Some(client_key.clone()));
    link.register().await.expect("register");
    let own = |i: usize| format!("own-{i:03}");
    let items: Vec<msg::PutItem> = (0..n)
        .map(|i| msg::PutItem {
            key: own(i),
            value_len: value.len() as u64,
            region_len: (kvpool_format::header_len(own(i).len()) + value.len()) as u64,
        })
        .collect();
    let start = msg::PutStart {
        client_id: link.client_id(),
        op: 7,
        items,
        config: ReplicateConfig::default(),
        upsert: false,
    };
    let granted = link.call_once(&start).await.expect("put start");
    // (key, generation, replica) of each own object, written and committed.
    let mut held = Vec::new();
    for (i, g) in granted.into_iter().enumerate() {
        let Ok(msg::PutGrant::Write {
            generation,
            replicas,
        }) = msg::from_wire(g)
        else {
            panic!("no write grant for {}", own(i));
        };
        held.push((own(i), generation, replicas[0].clone()));
    }
    let endpoint = held[0].2.endpoint.clone();
    let mut conn = FramedConn::connect_with(
        &endpoint,
        "attacker",
        Limits::default(),
        &Security::with_key(Some(client_key.clone())),
    )
    .await
    .expect("a client key opens the data plane");
    for (key, generation, rep) in &held {
        write_as(
            &mut conn,
            rep.segment,
            rep.offset,
            rep.grant(*generation),
            &object(key, *generation, value),
        )
        .await
        .expect("a write inside its own grant");
    }
    let end = msg::PutEnd {
        client_id: link.client_id(),
        items: held
            .iter()
            .map(|(key, generation, _)| msg::PutEndItem {
                key: key.clone(),
                generation: *generation,
            })
            .collect(),
    };
    let ended = link.call_once(&end).await.expect("put end");
    assert!(ended.iter().all(|r| r.is_ok()), "{ended:?}");
    let remove = msg::Remove {
        keys: held.iter().map(|(k, ..)| k.clone()).collect(),
        force: true,
    };
    let removed = link.call_once(&remove).await.expect("remove");
    assert!(removed.iter().all(|r| r.is_ok()), "{removed:?}");

    (link, held, conn)
}

/// Where the first replica of each of `kept`'s objects starts, in order.
async fn starts_of(link: &MasterLink, kept: &[(String, Vec<u8>)]) -> Vec<(SegmentId, u64)> {
    let located = link
        .call_once(&msg::GetReplicaList {
            keys: kept.iter().map(|(k, _)| k.clone()).collect(),
        })
        .await
        .expect("locate");
    located
        .into_iter()
        .map(|l| {
            let l: msg::ObjectLocation = msg::from_wire(l).expect("the victim is there");
            (l.replicas[0].segment, l.replicas[0].offset)
        })
        .collect()
}

/// The first attack of the tenancy issue: a client keeps the write grants
/// of its own puts, removes its objects, waits until another client's
/// objects take the freed regions, and writes through the old grants
/// (under its own key and version, or naming a victim's key with a newer
/// one). Grants name the version they were granted for and stores refuse
/// a version the master invalidated or a region that holds a newer one,
/// so every write is refused and every victim reads back intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_grants_forge_nothing_in_regions_others_reuse() {
    const N: usize = 64;
    const VALUE: usize = 3000;
    let cluster = Cluster::builder()
        .secured()
        .segment_size("16MiB")
        .start()
        .await;
    let value = vec![0xA5u8; VALUE];
    let (link, held, mut conn) = grants_of_removed(&cluster, N, &value).await;

    // The victim's objects, of the same size, take the freed regions.
    let victims = (0..N).map(|i| {
        let key = format!("vic-{i:03}");
        let v = common::value_for(&key, 256);
        (key, v.into_iter().cycle().take(VALUE).collect())
    });
    let kept = put_all(&cluster.client().await, victims).await;
    let victims: std::collections::HashMap<(SegmentId, u64), String> =
        (starts_of(&link, &kept).await.into_iter())
            .zip(kept.iter().map(|(k, _)| k.clone()))
            .collect();
    let reused: Vec<_> = held
        .iter()
        .filter_map(|(key, generation, rep)| {
            victims
                .get(&(rep.segment, rep.offset))
                .map(|v| (key, *generation, rep, v))
        })
        .collect();
    assert!(
        reused.len() >= N / 4,
        "only {} of {N} freed regions were reused: the attack was not set up",
        reused.len()
    );

    // Every old grant, on a reused region or not, writes nothing: neither
    // the attacker's own object again nor a header naming a victim's key
    // with a newer version.
    for (key, generation, rep) in &held {
        let grant = rep.grant(*generation);
        let e = write_as(
            &mut conn,
            rep.segment,
            rep.offset,
            grant,
            &object(key, *generation, &value),
        )
        .await
        .expect_err("a write through the grant of a removed object");
        assert_eq!(e.code, Code::TransferFail, "{key}: {e}");
    }
    for (_, generation, rep, victim_key) in &reused {
        let planted = object(victim_key, generation + 1_000_000, &value);
        let e = write_as(
            &mut conn,
            rep.segment,
            rep.offset,
            rep.grant(*generation),
            &planted,
        )
        .await
        .expect_err("a header naming the victim");
        assert_eq!(e.code, Code::TransferFail, "{victim_key}: {e}");
    }
    all_there(&cluster, &kept).await;
}

/// Attack 1 past what the store remembers: with its invalidation memory
/// cut to one entry (`--invalidations-kept 1`, as heavy churn would wear it
/// down), the store no longer knows the attacker's versions were removed,
/// and smaller objects of another client now start inside the attacker's
/// old regions, past their starts (written over TCP). Writing a whole old region through its
/// grant would overwrite them; the store refuses every such write because
/// a newer object starts inside the range, and every victim reads back
/// intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_grants_forge_nothing_inside_regions_after_the_store_forgot() {
    const N: usize = 8;
    let cluster = Cluster::builder()
        .secured()
        .segment_size("4MiB")
        .store_flag("--invalidations-kept", "1")
        .start()
        .await;
    let value = vec![0x5Au8; 60_000];
    let (link, held, mut conn) = grants_of_removed(&cluster, N, &value).await;
    // Over TCP: the store marks where the objects it writes start (a
    // client on the store's host writes through shared memory, unseen).
    let victim = cluster
        .client_with(|c| c.protocol = kvpool_client::Protocol::Tcp)
        .await;
    let victims = (0..400).map(|i| {
        let key = format!("small-{i:03}");
        let v = common::value_for(&key, 2000);
        (key, v)
    });
    let mut kept = put_all(&victim, victims).await;
    let starts = starts_of(&link, &kept).await;
    // The victims at the very starts of old regions go (so only the check
    // of what starts inside stands between the grant and the rest).
    let at_start: Vec<String> = (starts.iter().zip(&kept))
        .filter(|(at, _)| held.iter().any(|(_, _, r)| **at == (r.segment, r.offset)))
        .map(|(_, (k, _))| k.clone())
        .collect();
    for key in &at_start {
        victim.remove(key, true).await.expect("remove");
    }
    let starts: Vec<(SegmentId, u64)> = (starts.into_iter().zip(&kept))
        .filter(|(_, (k, _))| !at_start.contains(k))
        .map(|(at, _)| at)
        .collect();
    kept.retain(|(k, _)| !at_start.contains(k));
    let mut attacked = 0;
    for (key, generation, rep) in &held {
        let range = rep.offset..rep.offset + rep.len;
        if !starts
            .iter()
            .any(|(seg, off)| *seg == rep.segment && range.contains(off))
        {
            continue;
        }
        attacked += 1;
        let e = write_as(
            &mut conn,
            rep.segment,
            rep.offset,
            rep.grant(*generation),
            &object(key, *generation, &value),
        )
        .await
        .expect_err("a write over newer objects inside its region");
        assert_eq!(e.code, Code::TransferFail, "{key}: {e}");
        assert!(e.message.contains("starts inside"), "{key}: {e}");
    }
    assert!(
        attacked >= N / 2,
        "only {attacked} of {N} old regions hold a victim past their start: the attack was not set up"
    );
    all_there(&cluster, &kept).await;
}

/// Attack 2 of the tenancy issue, "plant headers that win after a master
/// restart": inside the grant of a put of its own (so with a generation
/// newer than the victims'), a holder of the client key writes a header
/// naming a victim's key; a master rebuilding from the stores' scans would
/// take it for the victim's newest version. Grants are bound to the key
/// they were given for, so the store refuses the header before a byte of
/// it lands, and after a master restart every victim reads its own bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_headers_win_nothing_after_a_master_restart() {
    const N: usize = 16;
    const VALUE: usize = 2048;
    let mut cluster = Cluster::builder().secured().stores(2).start().await;
    let victim = cluster.client().await;
    let victims: Vec<(String, Vec<u8>)> = (0..N)
        .map(|i| {
            (
                format!("victim-{i:02}"),
                common::value_for(&format!("v{i}"), VALUE),
            )
        })
        .collect();
    for (key, value) in &victims {
        victim
            .put(key, value, &ReplicateConfig::default())
            .await
            .expect("victim put");
    }
    let client_key = cluster.secrets.as_ref().expect("secured").key(Role::Client);
    let link = link_as(&cluster, Some(client_key.clone()));
    link.register().await.expect("register");
    let newest_victim = link
        .call_once(&msg::GetReplicaList {
            keys: victims.iter().map(|(k, _)| k.clone()).collect(),
        })
        .await
        .expect("locate")
        .into_iter()
        .map(|l| msg::from_wire(l).expect("the victim is there").generation)
        .max()
        .expect("victims");
    // The attacker's own keys are as long as the victims', so a victim's
    // header fits its regions exactly.
    let own = |i: usize| format!("attack-{i:02}");
    let planted = vec![0xEEu8; VALUE];
    let start = msg::PutStart {
        client_id: link.client_id(),
        op: rand::random(),
        items: (0..N)
            .map(|i| msg::PutItem {
                key: own(i),
                value_len: VALUE as u64,
                region_len: (kvpool_format::header_len(own(i).len()) + VALUE) as u64,
            })
            .collect(),
        config: ReplicateConfig::default(),
        upsert: false,
    };
    let granted = link.call_once(&start).await.expect("put start");
    let mut conns = std::collections::HashMap::new();
    let mut refused = 0;
    for (i, g) in granted.into_iter().enumerate() {
        let Ok(msg::PutGrant::Write {
            generation,
            replicas,
        }) = msg::from_wire(g)
        else {
            panic!("no write grant for {}", own(i));
        };
        assert!(generation > newest_victim, "the planted version would win");
        let rep = &replicas[0];
        let cap = rep.cap.expect("a secured master signs");
        assert_ne!(cap.access & msg::Capability::KEY, 0, "bound to {}", own(i));
        if !conns.contains_key(&rep.endpoint) {
            let conn = FramedConn::connect_with(
                &rep.endpoint,
                "attacker",
                Limits::default(),
                &Security::with_key(Some(client_key.clone())),
            )
            .await
            .expect("a client key opens the data plane");
            conns.insert(rep.endpoint.clone(), conn);
        }
        let conn = conns.get_mut(&rep.endpoint).expect("connected");
        let (victim_key, _) = &victims[i];
        let e = write_as(
            conn,
            rep.segment,
            rep.offset,
            rep.grant(generation),
            &object(victim_key, generation, &planted),
        )
        .await
        .expect_err("a header naming the victim's key");
        assert_eq!(e.code, Code::Unauthorized, "{victim_key}: {e}");
        assert!(e.message.contains("another key"), "{e}");
        refused += 1;
        // The same grant still writes the object it was given for.
        write_as(
            conn,
            rep.segment,
            rep.offset,
            rep.grant(generation),
            &object(&own(i), generation, &planted),
        )
        .await
        .expect("a write of its own key");
        // And reads it back: a store finds the key a read grant is bound
        // to in the region's header.
        let range = (rep.offset, 64);
        read_as(conn, rep.segment, range, Some(rep.grant(generation)))
            .await
            .expect("a read under the grant bound to its key");
    }
    assert_eq!(refused, N);

    // The rebuild after a master restart finds no header naming a victim.
    cluster.kill9_master();
    cluster.restart_master().await;
    let fresh = cluster.client().await;
    common::eventually("both stores back", Duration::from_secs(30), async || {
        let st = fresh.status().await.ok()?;
        (st.segments.len() == 2).then_some(())
    })
    .await;
    for (key, value) in &victims {
        let got = fresh
            .get(key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(got == *value, "{key}: the planted bytes won");
    }
}

/// Attack 4 of the tenancy issue, "lock others out": a holder of the
/// client key hard-pins as much as it may and registers client ids in a
/// loop. Pins of all clients together take at most half the pool, so a
/// registered engine keeps writing (its objects evict each other); ids
/// proven only by the client key take at most nine tenths of the client
/// limit, so a store restarted meanwhile registers and mounts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_out_by_pins_and_client_ids_is_bounded() {
    const MIB: u64 = 1 << 20;
    let mut cluster = Cluster::builder()
        .secured()
        .segment_size("16MiB")
        .master_flag("--max-clients", "20")
        .start()
        .await;
    let engine = cluster.client().await;
    let client_key = cluster.secrets.as_ref().expect("secured").key(Role::Client);
    let attacker = link_as(&cluster, Some(client_key.clone()));
    attacker.register().await.expect("register");

    // Hard pins: 1 MiB objects until the master refuses.
    let mut pinned = 0;
    for i in 0..32 {
        let start = msg::PutStart {
            client_id: attacker.client_id(),
            op: rand::random(),
            items: vec![msg::PutItem {
                key: format!("pinned-{i}"),
                value_len: MIB,
                region_len: MIB + 64,
            }],
            config: ReplicateConfig {
                with_hard_pin: true,
                ..ReplicateConfig::default()
            },
            upsert: false,
        };
        let answer = attacker.call_once(&start).await.expect("answered");
        match answer.into_iter().next().expect("one answer") {
            Ok(_) => pinned += 1,
            Err(code) => {
                assert_eq!(code, Code::NoAvailableHandle.as_i32(), "pin {i}");
                break;
            }
        }
    }
    assert!(
        (6..=8).contains(&pinned),
        "{pinned} MiB pinned of a 16 MiB pool"
    );
    // The engine writes twice the pool in 512 KiB objects; every put lands.
    let value = vec![7u8; 512 << 10];
    for i in 0..64 {
        (engine.put(&format!("engine-{i}"), &value, &ReplicateConfig::default()))
            .await
            .unwrap_or_else(|e| panic!("put {i} with the pool half pinned: {e}"));
    }
    assert_eq!(engine.get("engine-63").await.expect("get"), value);

    // Client ids: register until refused.
    let mut links = Vec::new();
    let refused = loop {
        let link = link_as(&cluster, Some(client_key.clone()));
        let register = msg::RegisterClient {
            client_id: link.client_id(),
            hostname: "flood".into(),
        };
        match link.call_once(&register).await {
            Ok(_) => links.push(link),
            Err(e) => break e,
        }
        assert!(links.len() < 20, "every slot went to the client key");
    };
    assert_eq!(refused.code, Code::UnavailableInCurrentStatus, "{refused}");
    // A store restarted now still gets in (on a new port: the segment
    // is mounted by the new process).
    let before = engine.status().await.expect("status").segments[0]
        .info
        .clone();
    cluster.kill9_store(0);
    cluster.restart_store(0, None);
    common::eventually(
        "the restarted store mounted again",
        Duration::from_secs(30),
        async || {
            let s = engine.status().await.ok()?;
            (s.segments.iter())
                .any(|s| {
                    let moved = s.info.endpoint != before.endpoint;
                    s.info.id == before.id && moved && s.state == "live"
                })
                .then_some(())
        },
    )
    .await;
    let again = engine
        .get("engine-63")
        .await
        .expect("get after the restart");
    assert_eq!(again, value);
}
