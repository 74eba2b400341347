//! Resource attacks with well-formed bytes against the real master and
//! store: a connection costs memory only for the bytes it has sent, and a
//! connection that stalls is closed instead of held forever. (The security
//! issue's wider attack classes join this file as they are closed.)

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use kvpool_net::conn::{HANDSHAKE_TIMEOUT, MAX_HELLO};
use kvpool_net::FramedConn;
use kvpool_proto::frame::{FrameHeader, Limits, Opcode, MIN_PROTOCOL_VERSION};
use kvpool_proto::msg::{self, Hello};
use kvpool_proto::PROTOCOL_VERSION;
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
