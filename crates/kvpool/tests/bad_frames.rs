//! Hostile and broken input on the master's RPC port and a store's data port:
//! every bad frame gets an error response with the right code, a stream that
//! cannot be trusted any more is closed, a well-framed bad request leaves the
//! connection usable, and both servers keep serving normal clients.

mod common;

use std::time::Duration;

use common::Cluster;
use kvpool_client::{Client, ReplicateConfig};
use kvpool_net::FramedConn;
use kvpool_proto::frame::{FrameHeader, FrameKind, Limits, Opcode, HEADER_LEN};
use kvpool_proto::msg::{self, Hello, PutItem, PutStart, ReadReq, SegmentInfo, Status, WriteReq};
use kvpool_proto::{Code, KvResult, MAX_KEY_LEN, PROTOCOL_VERSION};
use kvpool_transfer::data::{read_regions, write_regions, ReadOp, WriteOp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A one-store cluster, a connected client, and the store's segment.
async fn setup() -> (Cluster, Client, SegmentInfo) {
    let cluster = Cluster::builder().start().await;
    let client = cluster.client().await;
    let st = client.status().await.expect("status");
    let segment = st.segments.into_iter().next().expect("one segment").info;
    (cluster, client, segment)
}

/// Both servers under test: (label, address).
fn servers<'a>(cluster: &'a Cluster, segment: &'a SegmentInfo) -> [(&'static str, &'a str); 2] {
    [
        ("master", &cluster.master_addr),
        ("store", &segment.endpoint),
    ]
}

/// Bounds a socket exchange so a server that never answers fails the test.
async fn timed<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(IO_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {IO_TIMEOUT:?}"))
}

/// Reads one error response and then expects the server to close the stream.
async fn expect_error_then_close(conn: &mut FramedConn, want: Code, what: &str) {
    let h = timed(what, conn.read_header())
        .await
        .unwrap_or_else(|e| panic!("{what}: reading the response: {e}"))
        .unwrap_or_else(|| panic!("{what}: closed without an error response"));
    assert_eq!(h.kind, FrameKind::Response, "{what}");
    assert_eq!(h.status, want.as_i32(), "{what}: status");
    let message = String::from_utf8_lossy(conn.read_meta(h.meta_len).await.expect("error message"))
        .into_owned();
    assert!(!message.is_empty(), "{what}: the error carries a message");
    match timed(what, conn.read_header()).await {
        Ok(None) | Err(_) => {}
        Ok(Some(h)) => panic!("{what}: expected the connection to close, got another frame {h:?}"),
    }
}

/// A normal client still writes and reads through both servers.
async fn assert_serves(cluster: &mut Cluster, client: &Client, key: &str) {
    let value: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    client
        .put(key, &value, &ReplicateConfig::default())
        .await
        .expect("put after bad input");
    assert!(client.get(key).await.expect("get after bad input") == value);
    let fresh = cluster.client().await;
    assert!(fresh.get(key).await.expect("get by a new client") == value);
    cluster.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_get_an_error_frame_and_the_connection_closes() {
    let (mut cluster, client, segment) = setup().await;
    for (name, addr) in servers(&cluster, &segment) {
        let mut raw = TcpStream::connect(addr).await.expect("connect");
        let garbage: Vec<u8> = (0..64u32)
            .map(|i| (i.wrapping_mul(97) ^ 0xA5) as u8)
            .collect();
        raw.write_all(&garbage).await.expect("send garbage");
        // Read until the server closes (EOF, or a reset once it has answered).
        let mut resp = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match timed(name, raw.read(&mut buf)).await {
                Ok(0) | Err(_) => break,
                Ok(n) => resp.extend_from_slice(&buf[..n]),
            }
        }
        assert!(
            resp.len() >= HEADER_LEN,
            "{name}: no error frame before close (got {} bytes)",
            resp.len()
        );
        let head: &[u8; HEADER_LEN] = resp[..HEADER_LEN].try_into().expect("header bytes");
        let h = FrameHeader::decode(head, &Limits::default())
            .unwrap_or_else(|e| panic!("{name}: the answer is not a valid frame: {e}"));
        assert_eq!(h.kind, FrameKind::Response, "{name}");
        assert_ne!(h.status, 0, "{name}: garbage must get an error status");
        assert_eq!(
            resp.len(),
            HEADER_LEN + h.meta_len as usize,
            "{name}: one error frame, nothing else"
        );
    }
    assert_serves(&mut cluster, &client, "bad-frames/garbage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frame_lengths_are_buffer_overflow() {
    let (mut cluster, client, segment) = setup().await;
    let limits = Limits::default();
    for (name, addr) in servers(&cluster, &segment) {
        for (what, meta_len, payload_len) in [
            ("meta_len", limits.max_meta + 1, 0),
            ("payload_len", 16, limits.max_payload + 1),
            ("both at max", u32::MAX, u64::MAX),
        ] {
            let what = format!("{name}: {what} over the limit");
            let mut conn = FramedConn::connect(addr, "test", limits)
                .await
                .expect("connect");
            let h = FrameHeader::request(Opcode::Status, 1, meta_len, payload_len);
            conn.send_frame(&h, &[], &[]).await.expect("send header");
            conn.flush().await.expect("flush");
            expect_error_then_close(&mut conn, Code::BufferOverflow, &what).await;
        }
    }
    assert_eq!(Code::BufferOverflow.as_i32(), -10);
    assert_serves(&mut cluster, &client, "bad-frames/oversized").await;
}

/// Sends a well-framed request whose message is garbage; returns the answer.
async fn send_garbage_message(
    conn: &mut FramedConn,
    opcode: Opcode,
    payload: &[u8],
) -> KvResult<FrameHeader> {
    let meta = [0xffu8; 32];
    let id = conn.next_id();
    let h = FrameHeader::request(opcode, id, meta.len() as u32, payload.len() as u64);
    conn.send_frame(&h, &meta, &[payload]).await.expect("send");
    conn.flush().await.expect("flush");
    timed("garbage message", conn.read_response(id)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_message_is_invalid_params_and_the_connection_survives() {
    let (mut cluster, client, segment) = setup().await;

    let mut conn = FramedConn::connect(&cluster.master_addr, "test", Limits::default())
        .await
        .expect("connect");
    let e = send_garbage_message(&mut conn, Opcode::PutStart, &[])
        .await
        .expect_err("garbage PutStart");
    assert_eq!(e.code, Code::InvalidParams, "master: {e}");
    assert_eq!(Code::InvalidParams.as_i32(), -600);
    let st = timed("status", conn.call(&Status {}))
        .await
        .expect("the same connection answers Status");
    assert_eq!(st.segments.len(), 1);
    // A data-plane request on the control port is refused the same way.
    let e = send_garbage_message(&mut conn, Opcode::Write, &[7u8; 100])
        .await
        .expect_err("Write to the master");
    assert_ne!(e.code, Code::Ok);
    timed("status", conn.call(&Status {}))
        .await
        .expect("still answers after a Write");

    let mut conn = FramedConn::connect(&segment.endpoint, "test", Limits::default())
        .await
        .expect("connect");
    let e = send_garbage_message(&mut conn, Opcode::Write, &[7u8; 1000])
        .await
        .expect_err("garbage Write");
    assert_eq!(e.code, Code::InvalidParams, "store: {e}");
    let e = send_garbage_message(&mut conn, Opcode::PutStart, &[])
        .await
        .expect_err("PutStart to a store");
    assert_eq!(e.code, Code::NotSupported, "store: {e}");
    assert_readable(&mut conn, &segment).await;

    assert_serves(&mut cluster, &client, "bad-frames/garbage-message").await;
}

/// One valid read of the segment's first bytes on `conn` succeeds.
async fn assert_readable(conn: &mut FramedConn, segment: &SegmentInfo) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    let ops = vec![ReadOp {
        req: ReadReq {
            segment: segment.id,
            offset: segment.base,
            len: buf.len() as u64,
            grant: None,
        },
        dst: vec![&mut buf[..]],
    }];
    let r = timed("read", read_regions(conn, ops))
        .await
        .expect("the same connection still reads");
    assert!(r[0].is_ok(), "valid read refused: {:?}", r[0]);
    buf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_write_is_refused_and_the_connection_survives() {
    let (mut cluster, client, segment) = setup().await;
    let mut conn = FramedConn::connect(&segment.endpoint, "test", Limits::default())
        .await
        .expect("connect");
    let payload = vec![0x5Au8; 4096];
    let end = segment.base + segment.size;
    // Past the end, overflowing, and into the segment's superblock below `base`.
    for offset in [end, end - 1, u64::MAX - 10, 0, segment.base - 1] {
        let grant = msg::Grant {
            offset,
            len: payload.len() as u64,
            generation: 1,
            fence: 0,
            cap: None,
        };
        let op = WriteOp {
            req: WriteReq {
                segment: segment.id,
                offset,
                grant,
            },
            parts: vec![&payload],
        };
        let r = timed("write", write_regions(&mut conn, &[op]))
            .await
            .expect("the connection survives");
        let e = r[0]
            .as_ref()
            .expect_err("a write outside the object area must be refused");
        assert_eq!(e.code, Code::InvalidParams, "offset {offset}: {e}");
        assert_readable(&mut conn, &segment).await;
    }
    // A granted write on the same connection lands and reads back.
    let link = cluster.master_link("bad-frames-writer");
    link.register().await.expect("register");
    let key = "bad-frames/in-range";
    let region_len = (kvpool_format::header_len(key.len()) + payload.len()) as u64;
    let start = PutStart {
        client_id: link.client_id(),
        op: 1,
        items: vec![PutItem {
            key: key.into(),
            value_len: payload.len() as u64,
            region_len,
        }],
        config: ReplicateConfig::default(),
        upsert: false,
    };
    let granted = link.call(&start).await.expect("put start").remove(0);
    let Ok(msg::PutGrant::Write {
        generation,
        replicas,
    }) = granted
    else {
        panic!("no write grant: {granted:?}");
    };
    let rep = &replicas[0];
    let mut object = kvpool_format::ObjectHeader {
        key: key.into(),
        value_len: payload.len() as u64,
        generation,
        checksum: kvpool_format::value_checksum(&[&payload]),
    }
    .encode();
    object.extend_from_slice(&payload);
    let op = WriteOp {
        req: WriteReq {
            segment: segment.id,
            offset: rep.offset,
            grant: rep.grant(generation),
        },
        parts: vec![&object],
    };
    let r = timed("write", write_regions(&mut conn, &[op]))
        .await
        .expect("write");
    assert!(r[0].is_ok(), "in-range write refused: {:?}", r[0]);
    let mut back = vec![0u8; object.len()];
    let ops = vec![ReadOp {
        req: ReadReq {
            segment: segment.id,
            offset: rep.offset,
            len: object.len() as u64,
            grant: None,
        },
        dst: vec![&mut back[..]],
    }];
    let r = timed("read", read_regions(&mut conn, ops)).await;
    assert!(r.expect("read")[0].is_ok());
    assert!(back == object, "the object reads back as written");
    // A segment the store does not serve.
    let op = WriteOp {
        req: WriteReq {
            segment: msg::SegmentId(segment.id.0 ^ 1),
            offset: segment.base,
            grant: rep.grant(generation),
        },
        parts: vec![&payload],
    };
    let r = timed("write", write_regions(&mut conn, &[op]))
        .await
        .expect("write");
    assert_eq!(
        r[0].as_ref().expect_err("unknown segment").code,
        Code::SegmentNotFound
    );
    assert_readable(&mut conn, &segment).await;

    assert_serves(&mut cluster, &client, "bad-frames/out-of-range").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_key_is_invalid_key() {
    let (mut cluster, client, _segment) = setup().await;
    let long = "k".repeat(MAX_KEY_LEN + 1);
    let rc = ReplicateConfig::default();
    assert_eq!(
        client.put(&long, b"v", &rc).await.expect_err("put").code,
        Code::InvalidKey
    );
    assert_eq!(
        client.get(&long).await.expect_err("get").code,
        Code::InvalidKey
    );
    assert_eq!(
        client.exist(&long).await.expect_err("exist").code,
        Code::InvalidKey
    );
    assert_eq!(
        client.put("", b"v", &rc).await.expect_err("empty key").code,
        Code::InvalidKey
    );
    assert_eq!(Code::InvalidKey.as_i32(), -400);
    // The longest allowed key works.
    let longest = "k".repeat(MAX_KEY_LEN);
    client
        .put(&longest, b"value", &rc)
        .await
        .expect("a key of exactly the limit");
    assert_eq!(client.get(&longest).await.expect("get"), b"value");

    // The master checks too, for clients that skip the library.
    let link = cluster.master_link("raw-writer");
    link.register().await.expect("register");
    let grants = link
        .call(&PutStart {
            client_id: link.client_id(),
            op: 1,
            items: vec![PutItem {
                key: long.clone(),
                value_len: 1,
                region_len: 1024 + long.len() as u64,
            }],
            config: rc.clone(),
            upsert: false,
        })
        .await
        .expect("PutStart answered per key");
    let e = msg::from_wire(grants.into_iter().next().expect("one result"))
        .expect_err("long key granted");
    assert_eq!(e.code, Code::InvalidKey);
    let st = client.status().await.expect("status");
    assert_eq!(st.pending, 0, "nothing reserved for a refused key");

    assert_serves(&mut cluster, &client, "bad-frames/long-key").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_protocol_version_is_invalid_version() {
    let (mut cluster, client, segment) = setup().await;
    for (name, addr) in servers(&cluster, &segment) {
        for (version, min_version) in [(PROTOCOL_VERSION + 98, PROTOCOL_VERSION + 90), (0, 0)] {
            let what = format!("{name}: Hello {min_version}..={version}");
            let stream = TcpStream::connect(addr).await.expect("connect");
            let mut conn = FramedConn::from_stream(stream, Limits::default()).expect("wrap");
            let hello = Hello {
                version,
                min_version,
                role: "test".into(),
                nonce: [0; 16],
            };
            let e = timed(&what, conn.call(&hello))
                .await
                .expect_err("handshake must fail");
            assert_eq!(e.code, Code::InvalidVersion, "{what}: {e}");
            match timed(&what, conn.read_header()).await {
                Ok(None) | Err(_) => {}
                Ok(Some(h)) => panic!("{what}: connection left open, got {h:?}"),
            }
        }
        // A request before any Hello is refused and closed too.
        let stream = TcpStream::connect(addr).await.expect("connect");
        let mut conn = FramedConn::from_stream(stream, Limits::default()).expect("wrap");
        let e = timed(name, conn.call(&Status {}))
            .await
            .expect_err("Status without Hello");
        assert_eq!(
            e.code,
            Code::InvalidParams,
            "{name}: a first frame that is not a Hello: {e}"
        );
        match timed(name, conn.read_header()).await {
            Ok(None) | Err(_) => {}
            Ok(Some(h)) => panic!("{name}: connection left open after a missing Hello, got {h:?}"),
        }
    }
    assert_eq!(Code::InvalidVersion.as_i32(), -300);
    assert_serves(&mut cluster, &client, "bad-frames/version").await;
}
