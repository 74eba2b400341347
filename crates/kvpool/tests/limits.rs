//! Limits on everything, against the real binaries: each test replays a
//! resource attack of the security issue with well-formed requests and
//! checks that it is refused with a clear error, that nothing legitimate is
//! lost, that everyone else keeps being served, and that the refusal is
//! counted in `kvpool_refusals_total{reason}`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{eventually, free_port, http_get, spawn_store_with, Cluster};
use kvpool_client::ReplicateConfig;
use kvpool_net::FramedConn;
use kvpool_proto::frame::{FrameHeader, FrameKind, Limits, Opcode, MIN_PROTOCOL_VERSION};
use kvpool_proto::msg::{
    ClientId, Exist, GetReplicaList, Heartbeat, Hello, InvalidateReq, InventoryItem, MountSegment,
    PutEnd, PutEndItem, PutGrant, PutItem, PutRevoke, PutStart, RegisterClient, Remove,
    RemoveByRegex, ReportObjects, SegmentId, SegmentInfo, Touch, TouchItem, UnmountSegment,
    WireResult,
};
use kvpool_proto::Rpc;
use kvpool_proto::{Code, KvError, KvResult, MAX_BATCH_KEYS, MAX_KEY_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A control connection to the master, past the handshake.
async fn control(cluster: &Cluster) -> FramedConn {
    FramedConn::connect(&cluster.master_addr, "test", Limits::default())
        .await
        .expect("connect to the master")
}

/// One call on `conn`, owning its request.
async fn ask<R: Rpc>(conn: &mut FramedConn, req: R) -> KvResult<R::Response> {
    conn.call(&req).await
}

/// `kvpool_refusals_total{reason}` as the master's `/metrics` shows it (0
/// when absent).
async fn refusals(cluster: &Cluster, reason: &str) -> u64 {
    let (code, body) = http_get(&cluster.metrics_addr, "/metrics").await;
    assert_eq!(code, 200, "/metrics");
    let line = format!("kvpool_refusals_total{{reason=\"{reason}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |n| n.trim().parse().expect("a counter value"))
}

/// Expects `r` to be refused with `code` and a message containing `says`.
fn refused<T: std::fmt::Debug>(r: Result<T, KvError>, code: Code, says: &str, what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.code, code, "{what}: {e}");
    assert!(
        e.message.contains(says),
        "{what}: {e:?} should say {says:?}"
    );
}

/// Whether the peer closed `s` within `within` (reads until EOF or error).
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
async fn over_limit_batches_are_refused_whole_and_nothing_is_lost() {
    let mut cluster = Cluster::builder().start().await;
    let client = cluster.client().await;
    let keys: Vec<String> = (0..100).map(|i| format!("kept/{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let items: Vec<(&str, &[u8])> = refs.iter().map(|k| (*k, k.as_bytes())).collect();
    let put = client
        .batch_put_values(&items, &ReplicateConfig::default(), false)
        .await;
    assert!(put.iter().all(|r| r.is_ok()), "{put:?}");

    // Every batch one item over the limit, made of the keys that exist: a
    // removal that were not refused whole would delete them.
    let mut conn = control(&cluster).await;
    let over: Vec<String> = keys
        .iter()
        .cycle()
        .take(MAX_BATCH_KEYS + 1)
        .cloned()
        .collect();
    let id = ClientId(rand::random());
    let limit = MAX_BATCH_KEYS.to_string();
    let remove = ask(
        &mut conn,
        Remove {
            keys: over.clone(),
            force: true,
        },
    );
    refused(remove.await, Code::InvalidParams, &limit, "Remove");
    let exist = ask(&mut conn, Exist { keys: over.clone() });
    refused(exist.await, Code::InvalidParams, &limit, "Exist");
    let locate = ask(&mut conn, GetReplicaList { keys: over.clone() });
    refused(locate.await, Code::InvalidParams, &limit, "GetReplicaList");
    let revoke = ask(
        &mut conn,
        PutRevoke {
            client_id: id,
            keys: over.clone(),
        },
    );
    refused(revoke.await, Code::InvalidParams, &limit, "PutRevoke");
    let end = PutEnd {
        client_id: id,
        items: over
            .iter()
            .map(|k| PutEndItem {
                key: k.clone(),
                generation: 1,
            })
            .collect(),
    };
    refused(
        ask(&mut conn, end).await,
        Code::InvalidParams,
        &limit,
        "PutEnd",
    );
    let start = PutStart {
        client_id: id,
        op: 1,
        items: over
            .iter()
            .map(|k| PutItem {
                key: k.clone(),
                value_len: 1,
                region_len: 64,
            })
            .collect(),
        config: ReplicateConfig::default(),
        upsert: true,
    };
    refused(
        ask(&mut conn, start).await,
        Code::InvalidParams,
        &limit,
        "PutStart",
    );
    let touch = Touch {
        items: over
            .iter()
            .map(|k| TouchItem {
                key: k.clone(),
                generation: 1,
                age_us: 0,
            })
            .collect(),
    };
    refused(
        ask(&mut conn, touch).await,
        Code::InvalidParams,
        &limit,
        "Touch",
    );
    let report = ReportObjects {
        client_id: id,
        segment: SegmentId(1),
        objects: (0..=MAX_BATCH_KEYS as u64)
            .map(|i| InventoryItem {
                key: format!("inv/{i}"),
                generation: 1,
                value_len: 1,
                offset: 4096 + 64 * i,
                region_len: 64,
            })
            .collect(),
        last: true,
    };
    refused(
        ask(&mut conn, report).await,
        Code::InvalidParams,
        &limit,
        "ReportObjects",
    );

    // The issue's stall: 4M one-byte keys in one request, refused from the
    // count at its front (how fast is for benchmarks, not this test).
    let huge = ask(
        &mut conn,
        Exist {
            keys: vec!["k".into(); 4 << 20],
        },
    );
    refused(huge.await, Code::InvalidParams, &limit, "4M keys");

    // The connection stays usable; a batch at the limit is answered per key.
    let at = ask(
        &mut conn,
        Exist {
            keys: over[..MAX_BATCH_KEYS].to_vec(),
        },
    );
    let at = at.await.expect("a batch at the limit");
    assert_eq!(at.len(), MAX_BATCH_KEYS);
    assert!(at.iter().all(|r| r.is_ok()), "every key exists");

    // Key lengths on every call that carries keys, inventories and touches too.
    let long = "k".repeat(MAX_KEY_LEN + 1);
    let touched = ask(
        &mut conn,
        Touch {
            items: vec![TouchItem {
                key: long.clone(),
                generation: 1,
                age_us: 0,
            }],
        },
    );
    assert_eq!(touched.await.expect("touch"), vec![false]);
    let exist = ask(
        &mut conn,
        Exist {
            keys: vec![long.clone(), keys[0].clone()],
        },
    );
    let exist: Vec<WireResult<u64>> = exist.await.expect("exist");
    assert_eq!(exist[0], Err(Code::InvalidKey.as_i32()));
    assert!(exist[1].is_ok());
    let report = ReportObjects {
        client_id: id,
        segment: SegmentId(1),
        objects: vec![InventoryItem {
            key: long,
            generation: 1,
            value_len: 1,
            offset: 4096,
            region_len: 8192,
        }],
        last: true,
    };
    refused(
        ask(&mut conn, report).await,
        Code::InvalidKey,
        "key length",
        "inventory key",
    );

    // A store takes at most as many regions per invalidation.
    let st = client.status().await.expect("status");
    let mut store = FramedConn::connect(&st.segments[0].info.endpoint, "test", Limits::default())
        .await
        .expect("connect to the store");
    let invalidate = InvalidateReq {
        segment: st.segments[0].info.id,
        fence: 1,
        regions: vec![(4096, 1); MAX_BATCH_KEYS + 1],
    };
    refused(
        ask(&mut store, invalidate).await,
        Code::InvalidParams,
        &limit,
        "Invalidate",
    );

    // Nothing was lost, and the client still works.
    let got = client.batch_get(&refs).await;
    for (k, v) in refs.iter().zip(got) {
        assert_eq!(v.expect("get after the attack"), k.as_bytes());
    }
    assert!(refusals(&cluster, "batch_keys").await >= 9);
    assert!(refusals(&cluster, "key_length").await >= 3);
    cluster.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100k_key_batch_through_the_client_is_split_transparently() {
    let cluster = Cluster::builder().segment_size("128MiB").start().await;
    let client = cluster.client().await;
    const N: usize = 100_000;
    let keys: Vec<String> = (0..N).map(|i| format!("batch/{i:06}")).collect();
    let values: Vec<Vec<u8>> = (0..N as u32).map(|i| i.to_le_bytes().repeat(4)).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let items: Vec<(&str, &[u8])> = refs
        .iter()
        .copied()
        .zip(values.iter().map(Vec::as_slice))
        .collect();
    let put = client
        .batch_put_values(&items, &ReplicateConfig::default(), false)
        .await;
    assert_eq!(put.len(), N);
    assert!(
        put.iter().all(|r| r.is_ok()),
        "{:?}",
        put.iter().find(|r| r.is_err())
    );

    // Per-key results in order: every value comes back under its own key.
    let got = client.batch_get(&refs).await;
    for (i, v) in got.into_iter().enumerate() {
        assert_eq!(v.expect("get"), values[i], "key {i}");
    }
    // Interleaved present and missing keys keep their places.
    let missing: Vec<String> = (0..N).map(|i| format!("missing/{i}")).collect();
    let mixed: Vec<&str> = refs
        .iter()
        .zip(&missing)
        .flat_map(|(k, m)| [*k, m.as_str()])
        .collect();
    let exist = client.batch_exist(&mixed).await;
    for (i, e) in exist.into_iter().enumerate() {
        assert_eq!(e.expect("exist"), i % 2 == 0, "position {i}");
    }
    let removed = client.batch_remove(&refs[..N / 2], true).await;
    assert!(removed.iter().all(|r| r.is_ok()));
    let exist = client.batch_exist(&refs).await;
    for (i, e) in exist.into_iter().enumerate() {
        assert_eq!(e.expect("exist"), i >= N / 2, "key {i} after removal");
    }

    // Long keys: the message size splits the batch before the key count does.
    let long: Vec<String> = (0..2_500).map(|i| format!("{i:04000}")).collect();
    let lrefs: Vec<&str> = long.iter().map(String::as_str).collect();
    let value: &[&[u8]] = &[b"v"];
    let items: Vec<(&str, &[&[u8]])> = lrefs.iter().map(|k| (*k, value)).collect();
    let put = client
        .batch_put(&items, &ReplicateConfig::default(), false)
        .await;
    assert!(
        put.iter().all(|r| r.is_ok()),
        "{:?}",
        put.iter().find(|r| r.is_err())
    );
    let got = client.batch_get(&lrefs).await;
    assert!(got.iter().all(|v| v.as_deref() == Ok(&b"v"[..])));

    // The client kept within every limit: the master refused nothing.
    assert_eq!(refusals(&cluster, "batch_keys").await, 0);
}

/// Fills the master's map with `n` keys (`fill/0000042` ...) without
/// writing any payload: PutStart and PutEnd straight from a registered id.
async fn fill_map(cluster: &Cluster, n: usize) {
    let link = cluster.master_link("filler");
    link.register().await.expect("register the filler");
    let mut conn = control(cluster).await;
    let keys: Vec<String> = (0..n).map(|i| format!("fill/{i:07}")).collect();
    for chunk in keys.chunks(MAX_BATCH_KEYS) {
        let start = PutStart {
            client_id: link.client_id(),
            op: 1,
            items: chunk
                .iter()
                .map(|k| PutItem {
                    key: k.clone(),
                    value_len: 1,
                    region_len: 64,
                })
                .collect(),
            config: ReplicateConfig::default(),
            upsert: false,
        };
        let grants = conn.call(&start).await.expect("put start");
        let items = chunk
            .iter()
            .zip(grants)
            .map(|(k, g)| match g {
                Ok(PutGrant::Write { generation, .. }) => PutEndItem {
                    key: k.clone(),
                    generation,
                },
                g => panic!("{k}: {g:?}"),
            })
            .collect();
        let ended = conn
            .call(&PutEnd {
                client_id: link.client_id(),
                items,
            })
            .await
            .expect("put end");
        assert!(ended.iter().all(|r| r.is_ok()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_removals_are_bounded_and_never_hold_up_heartbeats() {
    let mut cluster = Cluster::builder().segment_size("256MiB").start().await;
    let mut conn = control(&cluster).await;

    // A 44 MiB pattern is over the message limit: refused from its header,
    // before a byte of it is read, and the connection closed.
    let mut big = control(&cluster).await;
    let h = FrameHeader::request(Opcode::RemoveByRegex, 1, 44 << 20, 0);
    big.send_frame(&h, &[], &[]).await.expect("send header");
    big.flush().await.expect("flush");
    let answer = big
        .read_header()
        .await
        .expect("an answer")
        .expect("a frame");
    assert_eq!(answer.kind, FrameKind::Response);
    assert_eq!(answer.status, Code::BufferOverflow.as_i32());
    // Over 4 KiB, or compiling past the size limit: refused before any walk.
    let long = ask(
        &mut conn,
        RemoveByRegex {
            pattern: "a".repeat(5 << 10),
            force: true,
        },
    );
    refused(long.await, Code::InvalidParams, "4096", "a 5 KiB pattern");
    let bomb = ask(
        &mut conn,
        RemoveByRegex {
            pattern: r"\w{1000}".into(),
            force: true,
        },
    );
    refused(
        bomb.await,
        Code::InvalidParams,
        "compiles to more than",
        "\\w{1000}",
    );
    assert!(refusals(&cluster, "regex_pattern").await >= 1);
    assert!(refusals(&cluster, "regex_size").await >= 1);

    // As many removals as the master has runtime workers (one per core),
    // each walking a million keys: heartbeats are answered throughout,
    // because the walks run off the workers. (Run on them, the walks would
    // hold every worker and the heartbeats would wait for them.)
    const KEYS: usize = 1 << 20;
    fill_map(&cluster, KEYS).await;
    let watcher = cluster.master_link("watcher");
    watcher.register().await.expect("register the watcher");
    let stop = tokio_util::sync::CancellationToken::new();
    let beats = {
        let (stop, watcher) = (stop.clone(), watcher.clone());
        tokio::spawn(async move {
            let (mut n, mut longest) = (0u32, Duration::ZERO);
            while !stop.is_cancelled() {
                let t = Instant::now();
                let beat = Heartbeat {
                    client_id: watcher.client_id(),
                    io: Vec::new(),
                    held: Vec::new(),
                };
                let reply = watcher.call_once(&beat).await.expect("heartbeat");
                assert!(reply.known, "the watcher expired");
                longest = longest.max(t.elapsed());
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (n, longest)
        })
    };
    let walks = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 10));
    let mut conns = Vec::new();
    for _ in 0..walks {
        conns.push(control(&cluster).await);
    }
    let t0 = Instant::now();
    let removed = futures::future::join_all(conns.iter_mut().enumerate().map(|(d, c)| {
        ask(
            c,
            RemoveByRegex {
                pattern: format!("{d}$"),
                force: true,
            },
        )
    }))
    .await;
    let walked = t0.elapsed();
    stop.cancel();
    let (n, longest) = beats.await.expect("heartbeat task");
    let ending = |d| (0..KEYS).filter(|i| i % 10 == d).count() as u64;
    for (d, r) in removed.into_iter().enumerate() {
        assert_eq!(r.expect("remove by regex"), ending(d), "keys ending in {d}");
    }
    assert!(
        walked >= Duration::from_millis(100),
        "the walks took {walked:?}: too short to tell"
    );
    assert!(
        longest * 3 < walked && n >= 3,
        "longest heartbeat {longest:?} while the removals walked for {walked:?} ({n} beats)"
    );
    // No store expired meanwhile: its segment is still there and live.
    let client = cluster.client().await;
    let st = client.status().await.expect("status");
    assert_eq!(st.segments.len(), 1);
    assert_eq!(st.segments[0].state, "live");
    assert_eq!(st.keys, KEYS as u64 - (0..walks).map(ending).sum::<u64>());
    cluster.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_beyond_the_client_limit_are_refused_and_registered_clients_keep_working() {
    // The store and the client below are two; the cap leaves room for two more.
    let cluster = Cluster::builder()
        .master_flag("--max-clients", "4")
        .master_flag("--max-segments-per-client", "1")
        .start()
        .await;
    let client = cluster.client().await;
    let register = |link: &kvpool_net::MasterLink, hostname: String| RegisterClient {
        client_id: link.client_id(),
        hostname,
    };
    let extra: Vec<_> = (0..3)
        .map(|i| cluster.master_link(&format!("extra-{i}")))
        .collect();
    for link in &extra[..2] {
        link.call_once(&register(link, "extra".into()))
            .await
            .expect("within the limit");
    }
    let third = extra[2]
        .call_once(&register(&extra[2], "extra".into()))
        .await;
    refused(
        third,
        Code::UnavailableInCurrentStatus,
        "4 clients",
        "a fifth client",
    );
    assert!(refusals(&cluster, "clients").await >= 1);

    // Registered clients keep working, and may register again.
    client
        .put("still/works", b"yes", &ReplicateConfig::default())
        .await
        .expect("a registered client puts");
    assert_eq!(client.get("still/works").await.expect("get"), b"yes");
    extra[0]
        .call_once(&register(&extra[0], "extra".into()))
        .await
        .expect("a registered client registers again");

    // Names and endpoints: at most 255 bytes, and endpoints must parse.
    let long_name = extra[0]
        .call_once(&register(&extra[0], "h".repeat(256)))
        .await;
    refused(long_name, Code::InvalidParams, "255", "a 256-byte hostname");
    let segment = |id: u128, name: &str, endpoint: &str| MountSegment {
        client_id: extra[0].client_id(),
        segment: SegmentInfo {
            id: SegmentId(id),
            name: name.into(),
            endpoint: endpoint.into(),
            base: 4096,
            size: 1 << 20,
            path: None,
            tier: Default::default(),
        },
        objects: 0,
        scan_age_ms: 0,
        possession: [0; 16],
        fence: 1,
        held: Vec::new(),
    };
    for (what, mount) in [
        ("endpoint without a port", segment(1, "fake", "nohost")),
        ("endpoint port 0", segment(1, "fake", "127.0.0.1:0")),
        (
            "256-byte endpoint",
            segment(1, "fake", &format!("{}:80", "h".repeat(253))),
        ),
        ("256-byte name", segment(1, &"n".repeat(256), "127.0.0.1:9")),
    ] {
        refused(
            extra[0].call_once(&mount).await,
            Code::InvalidParams,
            "",
            what,
        );
    }
    // One segment per client here: a second is refused.
    extra[0]
        .call_once(&segment(1, "fake-1", "127.0.0.1:9"))
        .await
        .expect("a first segment");
    let second = extra[0]
        .call_once(&segment(2, "fake-2", "127.0.0.1:9"))
        .await;
    refused(second, Code::InvalidParams, "segments", "a second segment");
    extra[0]
        .call_once(&UnmountSegment {
            client_id: extra[0].client_id(),
            segment: SegmentId(1),
        })
        .await
        .expect("unmount");
    assert!(refusals(&cluster, "segments_per_client").await >= 1);
    assert!(refusals(&cluster, "endpoint").await >= 3);

    // Slots free as silent clients expire (the extras never heartbeat).
    eventually("a slot to free", Duration::from_secs(15), async || {
        extra[2]
            .call_once(&register(&extra[2], "extra".into()))
            .await
            .ok()
    })
    .await;
}

/// Opens a TCP connection to `addr` from the loopback address `from`.
async fn connect_from(from: &str, addr: &str) -> TcpStream {
    let s = TcpSocket::new_v4().expect("socket");
    s.bind(format!("{from}:0").parse().expect("address"))
        .unwrap_or_else(|e| panic!("bind {from}: {e}"));
    s.connect(addr.parse().expect("address"))
        .await
        .expect("connect")
}

/// A connection from `from` to the master past the handshake (in the
/// oldest protocol, which needs no more of it), proved admitted by a call.
async fn admitted_from(from: &str, addr: &str) -> KvResult<FramedConn> {
    let mut conn = FramedConn::from_stream(connect_from(from, addr).await, Limits::default())?;
    let hello = Hello {
        version: MIN_PROTOCOL_VERSION,
        min_version: MIN_PROTOCOL_VERSION,
        role: "test".into(),
        nonce: [0; 16],
    };
    conn.call(&hello).await?;
    // Any answer will do (the outer error is a closed connection).
    let _answer = conn.exchange(&Exist { keys: Vec::new() }).await?;
    Ok(conn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    const PER_IP: usize = 32;
    let cluster = Cluster::builder()
        .master_flag("--max-connections-per-ip", &PER_IP.to_string())
        .start()
        .await;
    let master = cluster.master_addr.clone();
    // Authenticated connections from one address, up to its share.
    let mut held = Vec::new();
    for i in 0..PER_IP {
        let conn = admitted_from("127.0.0.2", &master).await;
        held.push(conn.unwrap_or_else(|e| panic!("connection {i} within the share: {e}")));
    }
    // Past it: closed once the handshake says who it is (a tenant's key
    // would have a share of its own, see tests/tenants.rs).
    for _ in 0..PER_IP {
        assert!(admitted_from("127.0.0.2", &master).await.is_err());
    }
    // Everyone else is served meanwhile: a client from 127.0.0.1, and a
    // handshake from a third address.
    let client = cluster.client().await;
    client
        .put("per-ip/ok", b"1", &ReplicateConfig::default())
        .await
        .expect("put during the flood");
    admitted_from("127.0.0.3", &master)
        .await
        .expect("another address");
    assert!(refusals(&cluster, "connections_per_ip").await >= PER_IP as u64);
    // Once they are gone, that address connects again.
    drop(held);
    eventually(
        "127.0.0.2 to connect again",
        Duration::from_secs(5),
        async || admitted_from("127.0.0.2", &master).await.ok(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_connections_are_capped_and_a_header_that_never_ends_is_closed() {
    let cluster = Cluster::builder()
        .master_flag("--http-header-read-timeout", "2s")
        .master_flag("--http-max-connections", "8")
        .start()
        .await;
    let addr = cluster.metrics_addr.clone();
    // Half a request header, then nothing: closed at the timeout.
    let mut slow = TcpStream::connect(&addr).await.expect("connect");
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let t0 = Instant::now();
    assert!(
        closed_within(&mut slow, Duration::from_secs(6)).await,
        "a header that never ended was still open after {:?}",
        t0.elapsed()
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(1500),
        "closed too soon"
    );

    // Eight idle connections hold every slot: a ninth is closed at once.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    // A loaded master may not have accepted all eight yet: a ninth that
    // got a slot is dropped and tried again, well inside their 2 s.
    let held_from = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut ninth = TcpStream::connect(&addr).await.expect("connect");
        if closed_within(&mut ninth, Duration::from_millis(500)).await {
            break;
        }
        assert!(
            held_from.elapsed() < Duration::from_millis(1200),
            "a ninth connection was still open while eight held every slot"
        );
    }
    // Idle connections are closed by the same timeout, freeing the slots.
    for s in &mut idle {
        assert!(closed_within(s, Duration::from_secs(6)).await);
    }
    assert_eq!(http_get(&addr, "/health").await.0, 200);
    assert!(refusals(&cluster, "http_connections").await >= 1);
}

/// One HTTP/1.1 request with a body; the status code and the body back.
async fn http_send(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("send header");
    // A refused body may be cut short by the server: that is its answer.
    let _ = s.write_all(body).await;
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw)).await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: no answer in {raw:?}"));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: bad status line {head:?}"));
    (code, body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_service_refuses_big_values_and_too_many_keys() {
    let port = free_port();
    let cluster = Cluster::builder()
        .master_flag("--enable-http-metadata-server", "true")
        .master_flag("--http-metadata-server-port", &port.to_string())
        .master_flag("--metadata-max-keys", "10")
        .start()
        .await;
    let addr = format!("127.0.0.1:{port}");
    eventually(
        "the metadata service",
        Duration::from_secs(10),
        async || TcpStream::connect(&addr).await.ok(),
    )
    .await;
    let put = |key: &str, len: usize| {
        let (addr, path) = (addr.clone(), format!("/metadata?key={key}"));
        async move { http_send(&addr, "PUT", &path, &vec![b'x'; len]).await }
    };
    // Values: 1 MiB is the largest taken.
    let (code, body) = put("big", (1 << 20) + 1).await;
    assert_eq!(code, 413, "{body}");
    assert!(body.contains("limit"), "{body}");
    assert_eq!(put("big", 1 << 20).await.0, 200);
    let (code, value) = http_get(&addr, "/metadata?key=big").await;
    assert_eq!((code, value.len()), (200, 1 << 20));
    // Keys: ten, then a new one is refused; existing ones are still replaced.
    for i in 1..10 {
        assert_eq!(put(&format!("k{i}"), 10).await.0, 200, "key {i}");
    }
    let (code, body) = put("k10", 10).await;
    assert_eq!(code, 507, "{body}");
    assert!(body.contains("10 keys"), "{body}");
    assert_eq!(put("k1", 20).await.0, 200);
    let deleted = http_send(&addr, "DELETE", "/metadata?key=k1", b"").await;
    assert_eq!(deleted.0, 200);
    assert_eq!(put("k10", 10).await.0, 200);
    assert!(refusals(&cluster, "metadata_value_size").await >= 1);
    assert!(refusals(&cluster, "metadata_keys").await >= 1);
}

/// Opens `n` TCP connections to `addr` from `from` that never say a word.
async fn silent_flood(from: &str, addr: &str, n: usize) -> Vec<TcpStream> {
    let mut flood = Vec::with_capacity(n);
    for _ in 0..n {
        flood.push(connect_from(from, addr).await);
    }
    flood
}

/// How many of `socks` the peer has closed, each given `within`.
async fn closed_of(socks: &mut [TcpStream], within: Duration) -> usize {
    let closed =
        futures::future::join_all(socks.iter_mut().map(|s| closed_within(s, within))).await;
    closed.into_iter().filter(|&c| c).count()
}

/// Attack 6 of the tenancy issue: without any key, 1,024 connections from
/// one address (every process of a host shares it; on loopback everything
/// does) used to refuse every new client of that address, and half the
/// reads on a flooded store failed. Connections in their handshake now have
/// a budget of their own where a newcomer evicts the oldest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unauthenticated_connections_locks_nobody_out() {
    const FLOOD: usize = 1100;
    let cluster = Cluster::builder().secured().start().await;
    let before = cluster.client().await;
    let keys: Vec<String> = (0..32).map(|i| format!("flood/{i}")).collect();
    for k in &keys {
        before
            .put(k, k.as_bytes(), &ReplicateConfig::default())
            .await
            .expect("put before the flood");
    }
    let store = before.status().await.expect("status").segments[0]
        .info
        .endpoint
        .clone();
    // From the address everyone here uses, to both the master and the
    // store: more than the old per-address cap, and none says a word.
    let mut on_master = silent_flood("127.0.0.1", &cluster.master_addr, FLOOD).await;
    let mut on_store = silent_flood("127.0.0.1", &store, FLOOD).await;

    // A new client from that address connects, puts and reads (from the
    // store, on connections it opens now), within retries too short to
    // wait out the flood's handshake timeout (5 s): a lock-out fails it.
    let newcomer = cluster
        .client_with(|c| {
            c.timeout = Duration::from_secs(2);
            c.retry_for = Duration::from_secs(2);
        })
        .await;
    newcomer
        .put("flood/new", b"new", &ReplicateConfig::default())
        .await
        .expect("a put by a newcomer during the flood");
    let mut failed = 0;
    for k in &keys {
        match newcomer.get(k).await {
            Ok(v) => assert_eq!(v, k.as_bytes(), "{k}"),
            Err(_) => failed += 1,
        }
    }
    assert_eq!(failed, 0, "reads by a newcomer failed during the flood");
    assert_eq!(before.get("flood/new").await.expect("get"), b"new");
    // The flood holds at most its share of handshake slots: the rest were
    // closed to make room, oldest first.
    let within = Duration::from_millis(500);
    let open = FLOOD - closed_of(&mut on_master, within).await;
    assert!(
        open <= 64,
        "{open} silent connections still open on the master"
    );
    let open = FLOOD - closed_of(&mut on_store, within).await;
    assert!(
        open <= 64,
        "{open} silent connections still open on the store"
    );
    assert!(refusals(&cluster, "preauth_evicted").await >= (FLOOD - 64) as u64);
    // Nothing was refused for the address's share of authenticated slots.
    assert_eq!(refusals(&cluster, "connections_per_ip").await, 0);
}

/// Opens `n` idle connections from 127.0.0.2 to the HTTP port `addr` and
/// checks that 64 stay open and that `/health` and `/metrics` still answer
/// others; returns the metrics page.
async fn flood_keeps_64_open(addr: &str, n: usize) -> String {
    flood_keeps_open(addr, n, 64).await
}

/// [`flood_keeps_64_open`] for a port whose cap per address is `cap`.
async fn flood_keeps_open(addr: &str, n: usize, cap: usize) -> String {
    // Idle connections: they would be held until the header timeout (10 s).
    let mut flood = silent_flood("127.0.0.2", addr, n).await;
    let open = n - closed_of(&mut flood, Duration::from_millis(500)).await;
    assert_eq!(open, cap, "connections from 127.0.0.2 left open");
    assert_eq!(http_get(addr, "/health").await.0, 200);
    let (code, body) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    body
}

/// Attack 6, HTTP: the cap was per listener only, so one address could
/// hold all 1,024 connections and keep `/metrics` and `/health`
/// unreachable. Each address now gets 64 of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_keep_http_health_unreachable() {
    const FLOOD: usize = 1100;
    let cluster = Cluster::builder().start().await;
    let addr = cluster.metrics_addr.clone();
    let body = flood_keeps_64_open(&addr, FLOOD).await;
    assert!(body.contains("kvpool_refusals_total"), "{body}");
    let mut third = connect_from("127.0.0.3", &addr).await;
    third
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut answer = String::new();
    let read = third.read_to_string(&mut answer);
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("an answer")
        .expect("read");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(refusals(&cluster, "http_connections_per_ip").await >= (FLOOD - 64) as u64);
}

/// The same for a store's metrics port, which was a plain server: no cap
/// per address and no header timeout, so one address could hold its
/// probes (`/health` for the orchestrator) for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_keep_a_stores_metrics_port_unreachable() {
    const FLOOD: usize = 200;
    let cluster = Cluster::builder().start().await;
    let port = free_port().to_string();
    let extra = ["--metrics-port".to_string(), port.clone()];
    let data = cluster.dir().join("metrics-store");
    let logs = cluster.dir().join("logs");
    let bin = Path::new(common::BIN);
    let name = "metrics-store";
    let master = &cluster.master_addr;
    let _store = spawn_store_with(bin, name, name, master, "16MiB", &data, &logs, &extra);
    let addr = format!("127.0.0.1:{port}");
    eventually(
        "the store's metrics port",
        Duration::from_secs(20),
        async || TcpStream::connect(&addr).await.ok().map(|_| ()),
    )
    .await;
    let body = flood_keeps_64_open(&addr, FLOOD).await;
    let line = format!(
        "kvpool_store_connections_refused{{reason=\"http_per_ip\"}} {}",
        FLOOD - 64
    );
    assert!(body.contains(&line), "no {line:?} in {body}");

    // The cap is the store's `--http-max-connections-per-ip`, as the master's.
    let port = free_port().to_string();
    let extra = [
        "--metrics-port".to_string(),
        port.clone(),
        "--http-max-connections-per-ip".to_string(),
        "4".to_string(),
    ];
    let data = cluster.dir().join("capped-store");
    let name = "capped-store";
    let _capped = spawn_store_with(bin, name, name, master, "16MiB", &data, &logs, &extra);
    let addr = format!("127.0.0.1:{port}");
    eventually(
        "the capped store's metrics port",
        Duration::from_secs(20),
        async || TcpStream::connect(&addr).await.ok().map(|_| ()),
    )
    .await;
    let body = flood_keeps_open(&addr, 20, 4).await;
    let line = "kvpool_store_connections_refused{reason=\"http_per_ip\"} 16";
    assert!(body.contains(line), "no {line:?} in {body}");
}

/// One connection's message: `len` bytes that decode to nothing, so the
/// server reads them whole, answers an error and keeps the connection.
async fn send_big_message(conn: &mut FramedConn, opcode: Opcode, len: usize) {
    let id = conn.next_id();
    let h = FrameHeader::request(opcode, id, len as u32, 0);
    conn.send_frame(&h, &vec![0xff; len], &[])
        .await
        .expect("send");
    conn.flush().await.expect("flush");
    let answer = conn.read_answer(id).await.expect("the connection stays");
    assert!(answer.is_err(), "a message of 0xff decodes to nothing");
}

/// Attack 5 of the tenancy issue: an idle authenticated connection held on
/// to the buffer of the biggest message it ever carried (16 MiB), for as
/// long as it stayed open. Idle connections now give buffers over 64 KiB
/// back within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_give_back_the_memory_of_big_messages() {
    const CONNECTIONS: usize = 32;
    const MESSAGE: usize = 15 << 20;
    let mut cluster = Cluster::builder().start().await;
    let client = cluster.client().await;
    let store = client.status().await.expect("status").segments[0]
        .info
        .endpoint
        .clone();
    for (name, addr, opcode) in [
        ("master", cluster.master_addr.clone(), Opcode::Exist),
        ("store", store, Opcode::Read),
    ] {
        let rss = |cluster: &mut Cluster| match name {
            "master" => cluster.master_process().rss(),
            _ => cluster.store(0).rss(),
        };
        let mut conns = Vec::new();
        for _ in 0..CONNECTIONS {
            let c = FramedConn::connect(&addr, "test", Limits::default()).await;
            conns.push(c.expect("connect"));
        }
        let before = rss(&mut cluster);
        let mut peak = 0;
        for c in &mut conns {
            send_big_message(c, opcode, MESSAGE).await;
            peak = peak.max(rss(&mut cluster));
        }
        // Held all at once that would be 32 x 16 MiB = 512 MiB; once idle,
        // each connection keeps its 64 KiB read and write buffers only.
        let bound = 96 << 20;
        let mut grown = u64::MAX;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            grown = rss(&mut cluster).saturating_sub(before);
            if grown < bound {
                break;
            }
        }
        eprintln!(
            "{name}: RSS {} MiB before, peak {} MiB, {} MiB more once idle",
            before >> 20,
            peak >> 20,
            grown >> 20
        );
        assert!(
            grown < bound,
            "{name}: {CONNECTIONS} idle connections hold {grown} more bytes than before their big messages"
        );
        // They still work.
        for c in &mut conns {
            send_big_message(c, opcode, 1024).await;
        }
    }
}
