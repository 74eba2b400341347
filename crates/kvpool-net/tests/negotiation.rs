//! Version negotiation over real sockets on 127.0.0.1: a build speaking
//! 5..=7 agrees with v5 peers on 5 (and sends them the v5 shapes), with
//! v6 peers on 6 and its own peers on 7 (and the request id arrives), and
//! refuses a peer with no version in common, saying so.

use kvpool_net::auth::Security;
use kvpool_net::conn::accept;
use kvpool_net::{request_id, FramedConn};
use kvpool_proto::compat::decode_with;
use kvpool_proto::frame::{Limits, MIN_PROTOCOL_VERSION};
use kvpool_proto::msg::{
    self, ClientId, Heartbeat, HeartbeatReply, Hello, HelloReply, RequestId, RequestTrailer,
};
use kvpool_proto::{Code, KvError, Opcode, PROTOCOL_VERSION};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

fn heartbeat() -> Heartbeat {
    Heartbeat {
        client_id: ClientId(42),
        io: Vec::new(),
        held: Vec::new(),
    }
}

/// What a server saw of one connection's first request.
#[derive(Debug, PartialEq)]
struct Seen {
    /// The version the server side recorded.
    version: u32,
    /// The request id after the message.
    id: RequestId,
    /// Whether the message was exactly its v5 encoding (no trailer).
    v5_shape: bool,
}

/// Which server answers.
#[derive(Clone, Copy)]
enum Server {
    /// This build's handshake ([`accept`]).
    ThisBuild,
    /// The released v5 build's handshake, as it was: it speaks 5 only.
    Released,
    /// A broken server that answers a version nobody offered.
    Picks(u32),
}

/// Starts `server` on 127.0.0.1: after each connection's handshake it
/// answers heartbeats, reporting each on the channel.
async fn start(server: Server) -> (String, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let conn = match server {
                    Server::ThisBuild => {
                        accept(stream, "master", Limits::default(), &Security::default()).await
                    }
                    Server::Released => released_handshake(stream, None).await,
                    Server::Picks(v) => released_handshake(stream, Some(v)).await,
                };
                let Some(mut conn) = conn else { return };
                while let Ok(Some(h)) = conn.next_request().await {
                    assert_eq!(h.opcode, Opcode::Heartbeat);
                    let meta = conn.read_meta(h.meta_len).await.unwrap().to_vec();
                    let (hb, trailer) = decode_with::<Heartbeat, RequestTrailer>(&meta).unwrap();
                    assert_eq!(hb, heartbeat());
                    let reply = msg::encode(&HeartbeatReply { known: true });
                    conn.send_response(&h, &reply, &[]).await.unwrap();
                    conn.flush().await.unwrap();
                    let _ = tx.send(Seen {
                        version: conn.version(),
                        id: trailer.id,
                        v5_shape: meta == msg::encode(&heartbeat()),
                    });
                }
            });
        }
    });
    (addr, rx)
}

/// The server half of the v5 handshake as the released build does it, or
/// answering `pick` whatever the client offered.
async fn released_handshake(
    stream: tokio::net::TcpStream,
    pick: Option<u32>,
) -> Option<FramedConn> {
    let mut conn = FramedConn::from_stream(stream, Limits::default()).ok()?;
    let h = conn.next_request().await.ok()??;
    let hello: Hello = msg::decode(conn.read_meta(h.meta_len).await.ok()?).ok()?;
    assert!(hello.version >= 5 && hello.min_version <= 5, "{hello:?}");
    let reply = HelloReply {
        version: pick.unwrap_or(hello.version.min(5)),
        server: "master".into(),
        challenge: None,
    };
    conn.send_response(&h, &msg::encode(&reply), &[])
        .await
        .ok()?;
    conn.flush().await.ok()?;
    Some(conn)
}

/// A client that only speaks `min..=max`, as a build of those versions
/// would: its own Hello, then the shapes of the oldest version.
async fn old_client(addr: &str, min: u32, max: u32) -> Result<(FramedConn, u32), KvError> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut conn = FramedConn::from_stream(stream, Limits::default()).unwrap();
    let reply = conn
        .call(&Hello {
            version: max,
            min_version: min,
            role: "client".into(),
            nonce: [0; 16],
        })
        .await?;
    Ok((conn, reply.version))
}

/// Sends one heartbeat as part of the call `id`.
async fn beat(conn: &mut FramedConn, id: RequestId) {
    let reply = request_id::within(id, conn.call(&heartbeat())).await;
    assert!(reply.unwrap().known);
}

#[tokio::test]
async fn a_v5_client_and_this_server_speak_5_without_request_ids() {
    let (addr, mut seen) = start(Server::ThisBuild).await;
    let (mut conn, agreed) = old_client(&addr, 5, 5).await.unwrap();
    assert_eq!(agreed, 5);
    assert_eq!(conn.version(), MIN_PROTOCOL_VERSION);
    beat(&mut conn, request_id::fresh()).await;
    let want = Seen {
        version: 5,
        id: RequestId::NONE,
        v5_shape: true,
    };
    assert_eq!(seen.recv().await.unwrap(), want);
}

#[tokio::test]
async fn this_client_and_this_server_speak_11_and_the_request_id_arrives() {
    assert_eq!(PROTOCOL_VERSION, 11);
    let (addr, mut seen) = start(Server::ThisBuild).await;
    let mut conn = FramedConn::connect(&addr, "client", Limits::default())
        .await
        .unwrap();
    assert_eq!(conn.version(), 11);
    let id = request_id::fresh();
    beat(&mut conn, id).await;
    let want = Seen {
        version: PROTOCOL_VERSION,
        id,
        v5_shape: false,
    };
    assert_eq!(seen.recv().await.unwrap(), want);
    // Outside any call the trailer is there, with no id.
    beat(&mut conn, RequestId::NONE).await;
    let want = Seen {
        version: PROTOCOL_VERSION,
        id: RequestId::NONE,
        v5_shape: false,
    };
    assert_eq!(seen.recv().await.unwrap(), want);
}

/// The upgrade this is all for: a new store or client against the
/// released master.
#[tokio::test]
async fn this_client_and_a_released_server_speak_5() {
    let (addr, mut seen) = start(Server::Released).await;
    let mut conn = FramedConn::connect(&addr, "store", Limits::default())
        .await
        .unwrap();
    assert_eq!(conn.version(), 5);
    beat(&mut conn, request_id::fresh()).await;
    let want = Seen {
        version: 5,
        id: RequestId::NONE,
        v5_shape: true,
    };
    assert_eq!(seen.recv().await.unwrap(), want);
}

/// A request newer than the connection's version is refused before it is
/// sent (the older peer would close the connection on it), and the
/// connection goes on.
#[tokio::test]
async fn a_request_newer_than_the_connection_is_not_sent() {
    let (addr, mut seen) = start(Server::Released).await;
    let mut conn = FramedConn::connect(&addr, "store", Limits::default())
        .await
        .unwrap();
    let drain = msg::DrainOwn {
        segment: msg::SegmentId(7),
        possession: [1; 16],
    };
    let e = conn.call(&drain).await.unwrap_err();
    assert_eq!(e.code, Code::NotSupported, "{e}");
    assert!(e.message.contains("DrainOwn needs protocol 7"), "{e}");
    beat(&mut conn, request_id::fresh()).await;
    let first = seen.recv().await.unwrap();
    assert_eq!(
        first.version, 5,
        "the heartbeat was the first request it saw"
    );
}

#[tokio::test]
async fn peers_without_a_common_version_are_refused_with_the_reason() {
    let (addr, _seen) = start(Server::ThisBuild).await;
    for (min, max) in [(3, 4), (PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 3), (6, 5)] {
        let e = old_client(&addr, min, max).await.err().expect("refused");
        assert_eq!(e.code, Code::InvalidVersion, "{min}..={max}: {e}");
        let says = format!(
            "speaks protocol {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION} and the client speaks {min}..={max}"
        );
        assert!(e.message.contains(&says), "{e}");
        assert!(e.message.contains("no version in common"), "{e}");
    }
}

#[tokio::test]
async fn a_server_choosing_a_version_not_offered_is_refused() {
    for v in [PROTOCOL_VERSION + 1, MIN_PROTOCOL_VERSION - 1] {
        let (addr, _seen) = start(Server::Picks(v)).await;
        let e = FramedConn::connect(&addr, "client", Limits::default())
            .await
            .err()
            .expect("refused");
        assert_eq!(e.code, Code::InvalidVersion, "{e}");
        assert!(e.message.contains(&format!("chose protocol {v}")), "{e}");
    }
}
