//! The connection's tests: handshakes, framing limits and pooling, over
//! real sockets on 127.0.0.1.

use super::*;
use crate::breaker::FIRST_OPEN;
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
    // The probe times out on its own and keeps the peer down.
    tokio::time::sleep(timeout).await;
    assert!(pool.is_down());
}
