//! The connection's tests: handshakes, framing limits and pooling, over
//! real sockets on 127.0.0.1.

use super::*;
use crate::breaker::FIRST_OPEN;
use std::os::fd::AsFd;
use tokio::time::Instant;

/// A peer that accepts TCP connections and never answers (a paused
/// process) costs the first caller one connect timeout; then callers
/// fail at once, and the one that triggers a probe waits for it at
/// most [`PROBE_WAIT`], while the probe itself keeps the breaker open.
#[tokio::test]
async fn a_silent_peer_costs_one_connect_timeout_and_probes_run_aside() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let timeout = Duration::from_secs(1);
    let pool = ConnPool::new(&addr, "client", Limits::default(), timeout, 4).with_breaker();
    let t0 = Instant::now();
    assert_eq!(
        pool.take().await.err().map(|e| e.code),
        Some(Code::RpcTimeout)
    );
    assert!(t0.elapsed() >= timeout);
    assert!(pool.is_down());

    let t1 = Instant::now();
    assert!(pool.take().await.is_err());
    assert!(
        t1.elapsed() < timeout / 2,
        "an open breaker answers at once"
    );

    tokio::time::sleep(FIRST_OPEN).await;
    let t2 = Instant::now();
    let e = pool.take().await.err().expect("a silent peer");
    assert!(e.message.contains("probing"), "{e}");
    let took = t2.elapsed();
    assert!(took >= PROBE_WAIT && took < timeout / 2, "{took:?}");
    // The probe times out on its own; callers still fail without waiting
    // a connect timeout of their own.
    tokio::time::sleep(timeout).await;
    let t3 = Instant::now();
    assert!(pool.take().await.is_err());
    assert!(t3.elapsed() < timeout / 2, "{:?}", t3.elapsed());
}

/// Both ends of a same-host connection leave a pacing congestion control
/// (BBR, often a host's default) for CUBIC, whatever they started with.
#[tokio::test]
async fn same_host_connections_are_not_paced() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (client, accepted) = tokio::join!(TcpStream::connect(&addr), listener.accept());
    let ends = [client.unwrap(), accepted.unwrap().0];
    for end in &ends {
        let sock = socket2::SockRef::from(end);
        sock.set_tcp_congestion(b"reno")
            .expect("reno is always allowed");
        assert!(same_host(end));
        tune_socket(end);
        let cc = sock.tcp_congestion().unwrap();
        assert_eq!(
            &cc[..cc.iter().position(|&b| b == 0).unwrap_or(cc.len())],
            SAME_HOST_CONGESTION
        );
    }
}

/// A server connection that carried a big message gives its buffer back
/// once idle, and keeps serving.
#[tokio::test]
async fn big_message_buffers_are_given_back_when_the_connection_idles() {
    let (mut client, mut server) = pair().await;
    let small = server.buffered_bytes();
    assert!(small <= 2 * IO_BUFFER + IDLE_BUFFER, "{small}");
    let big = vec![7u8; 8 << 20];
    let h = FrameHeader::request(Opcode::Exist, 1, big.len() as u32, 0);
    let send = async {
        client.send_frame(&h, &big, &[]).await.unwrap();
        client.flush().await.unwrap();
    };
    let (_, got) = tokio::join!(send, server.next_request());
    let got = got.unwrap().expect("a request");
    assert_eq!(
        server.read_meta(got.meta_len).await.unwrap().len(),
        big.len()
    );
    assert!(server.buffered_bytes() >= big.len());
    // Idle past SHRINK_AFTER, then a small request.
    let next = async {
        tokio::time::sleep(SHRINK_AFTER * 2).await;
        let h = FrameHeader::request(Opcode::Exist, 2, 3, 0);
        client.send_frame(&h, b"abc", &[]).await.unwrap();
        client.flush().await.unwrap();
    };
    let (_, got) = tokio::join!(next, server.next_request());
    let got = got.unwrap().expect("a request");
    assert!(
        server.buffered_bytes() <= 2 * IO_BUFFER + IDLE_BUFFER,
        "{} bytes held after idling",
        server.buffered_bytes()
    );
    assert_eq!(server.read_meta(got.meta_len).await.unwrap(), b"abc");
}

/// An idle pooled connection is watched without being used up: while the
/// peer keeps it, the watch pends and the connection stays in the pool;
/// when the peer closes it (a master handing over), the watch resolves at
/// once and the pool drops it.
#[tokio::test]
async fn an_idle_connection_closed_by_the_peer_is_noticed_at_once() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (close, closed) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let conn = accept(stream, "master", Limits::default(), &Security::default()).await;
        let _ = closed.await;
        drop(conn);
        // No second connection is asked for.
        tokio::time::timeout(Duration::from_millis(300), listener.accept())
            .await
            .is_err()
    });
    let pool = ConnPool::new(
        &addr,
        "client",
        Limits::default(),
        Duration::from_secs(1),
        1,
    );
    let conn = pool.take().await.unwrap();
    pool.give(conn);
    let watch = tokio::time::timeout(Duration::from_millis(200), pool.idle_closed()).await;
    assert!(watch.is_err(), "the peer keeps it open");
    let conn = pool
        .take()
        .await
        .expect("the watched connection is back in the pool");
    pool.give(conn);
    let t0 = Instant::now();
    let (_, ()) = tokio::join!(async { close.send(()) }, pool.idle_closed());
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let again = tokio::time::timeout(Duration::from_millis(100), pool.idle_closed()).await;
    assert!(
        again.is_err(),
        "the closed connection was dropped, not pooled"
    );
    assert!(
        server.await.unwrap(),
        "the connection was reused, not reopened"
    );
}

/// Two ends of one loopback connection, as a client and a server.
async fn pair() -> (FramedConn, FramedConn) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (client, accepted) = tokio::join!(TcpStream::connect(&addr), listener.accept());
    let client = FramedConn::from_stream(client.unwrap(), Limits::default()).unwrap();
    let server = FramedConn::from_stream(accepted.unwrap().0, Limits::default()).unwrap();
    (client, server)
}

/// Reads the answer to request `id` and its whole payload.
async fn answer(client: &mut FramedConn, id: u64) -> Vec<u8> {
    let h = client.read_response(id).await.unwrap();
    let mut got = vec![0; h.payload_len as usize];
    client.read_payload(&mut got).await.unwrap();
    got
}

/// A response sent from a file arrives byte-exact and after the frames
/// queued before it: big payloads leave from the file's pages, small ones
/// and those of a file that lends none (a directory here, as hugetlbfs)
/// are copied, with nothing lost or reordered either way.
#[tokio::test]
async fn responses_sent_from_a_file_arrive_whole_and_in_order() {
    let (mut client, mut server) = pair().await;
    let big: Vec<u8> = (0..3 * SEND_FILE_MIN + 123)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let mut file = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut file, &[&[9u8; 4096][..], &big].concat()).unwrap();
    let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
    let small = &big[..SEND_FILE_MIN - 1];
    let req = |id| FrameHeader::request(Opcode::Read, id, 0, 0);

    let send = async {
        // Queued, not flushed: it must still leave before the next one.
        server
            .send_response(&req(1), &[], &[b"first"])
            .await
            .unwrap();
        let from = Some((file.as_fd(), 4096));
        let lent = server.send_response_from(&req(2), &big, from).await;
        assert_eq!(lent.unwrap(), big.len() as u64, "sent from the file");
        let from = Some((file.as_fd(), 4096));
        assert_eq!(
            server
                .send_response_from(&req(3), small, from)
                .await
                .unwrap(),
            0
        );
        let refusing = Some((dir.as_fd(), 0));
        assert_eq!(
            server
                .send_response_from(&req(4), &big, refusing)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            server
                .send_response_from(&req(5), &big, None)
                .await
                .unwrap(),
            0
        );
        server.flush().await.unwrap();
    };
    let read = async {
        assert_eq!(answer(&mut client, 1).await, b"first");
        assert!(answer(&mut client, 2).await == big, "from the file");
        assert!(answer(&mut client, 3).await == small, "small");
        assert!(
            answer(&mut client, 4).await == big,
            "a file that lends nothing"
        );
        assert!(answer(&mut client, 5).await == big, "no file");
    };
    tokio::join!(send, read);
}

/// Pipelined frames of mixed sizes (bulk payloads, small ones, a message
/// longer than one bounded read) arrive byte-exact through every payload
/// read; after a bulk frame read to the end of what was buffered, the next
/// header's read leaves its payload in the socket (at most [`HEAD_READ`]
/// comes through the buffer), and after a bulk frame the server sees in
/// the socket that more requests wait, until the last is read.
#[tokio::test]
async fn bulk_payloads_skip_the_buffer_and_mixed_frames_stay_whole() {
    let (mut client, mut server) = pair().await;
    let frames: Vec<(Vec<u8>, Vec<u8>)> = [
        (0, 64 << 10),
        (300, 64 << 10),
        (5000, 100),
        (10, 40 << 10),
        (0, 5000),
        (200, 1 << 20),
        (0, BULK),
        (0, 0),
        (100, 64 << 10),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(meta, payload))| {
        let bytes = |n: usize, salt: usize| (0..n).map(|j| (j * 31 + salt) as u8).collect();
        (bytes(meta, i), bytes(payload, i + 100))
    })
    .collect();
    let send = async {
        for (i, (meta, payload)) in frames.iter().enumerate() {
            let h = FrameHeader::request(
                Opcode::Exist,
                i as u64,
                meta.len() as u32,
                payload.len() as u64,
            );
            client.send_frame(&h, meta, &[payload]).await.unwrap();
        }
        client.flush().await.unwrap();
    };
    let read = async {
        // A bulk payload read to the end of what an earlier fill buffered.
        let mut bulk_drained = false;
        for (i, (meta, payload)) in frames.iter().enumerate() {
            let h = server.next_request().await.unwrap().expect("a frame");
            assert_eq!(h.request_id, i as u64);
            if bulk_drained {
                let buffered = server.reader.buffer().len();
                assert!(
                    buffered <= HEAD_READ,
                    "frame {i}: {buffered} bytes buffered"
                );
            }
            assert_eq!(server.read_meta(h.meta_len).await.unwrap(), &meta[..]);
            let mut got = vec![0u8; payload.len()];
            if i % 2 == 0 {
                server.read_payload(&mut got).await.unwrap();
            } else {
                let whole = server
                    .read_payload_fenced(&mut got, || Some(()), |_| {})
                    .await
                    .unwrap();
                assert!(whole);
            }
            assert!(got == *payload, "frame {i}: payload differs");
            bulk_drained = payload.len() >= BULK && server.reader.buffer().is_empty();
            // One bulk frame in three goes unchecked: the next header's
            // read then fills the buffer itself. (After a small frame only
            // the buffer is asked, which need not hold the next yet.)
            if payload.len() >= BULK && i % 3 != 1 && i + 1 < frames.len() {
                // The rest are sent meanwhile: they come.
                let waiting = tokio::time::timeout(Duration::from_secs(5), async {
                    while !server.has_input().await {
                        tokio::task::yield_now().await;
                    }
                });
                waiting.await.expect("the next frame is not seen waiting");
            }
        }
        assert!(!server.has_input().await);
    };
    tokio::join!(send, read);
}
