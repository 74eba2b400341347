//! What lets `rbg operator` run as several replicas on a cluster: leader
//! election on a Lease against kube-rs's mocked API (the fake in
//! `support/` checks `resourceVersion` on every write, as the API server
//! does), and the `/metrics`, `/healthz`, `/readyz` port on 127.0.0.1.
//! Time is handed to the elector as an argument, so lease expiry is
//! tested without waiting.

mod support;

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use rbg::operator::leader::{Elector, Outcome};
use rbg::operator::{self, metrics, Context, Metrics};
use rbg::spec::v2::{GroupSpecV2, RoleBasedGroupResource};
use serde_json::json;
use support::fake_client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const S: i64 = 1_000_000;
/// Some Unix time in microseconds, far from 0 so that nothing is
/// accidentally expired by being near the epoch.
const T0: i64 = 1_700_000_000 * S;

fn elector(client: &kube::Client, me: &str) -> Elector {
    Elector::new(
        Api::<Lease>::namespaced(client.clone(), "rbg-system"),
        "rbg-operator",
        me,
    )
}

fn following(holder: &str) -> Outcome {
    Outcome::Following {
        holder: Some(holder.into()),
    }
}

/// The first candidate creates the Lease and leads; a second follows;
/// renewing moves renewTime and keeps the transition count.
#[tokio::test]
async fn first_candidate_acquires_and_renews() {
    let (client, fake) = fake_client();
    let (a, b) = (elector(&client, "a"), elector(&client, "b"));
    assert_eq!(a.round(T0).await.expect("a"), Outcome::Leading);
    assert_eq!(b.round(T0).await.expect("b"), following("a"));
    let lease = fake.lock().expect("fake").leases["rbg-operator"].clone();
    assert_eq!(lease["spec"]["holderIdentity"], "a");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15);
    assert_eq!(lease["spec"]["leaseTransitions"], 0);
    assert_eq!(a.round(T0 + 5 * S).await.expect("a"), Outcome::Leading);
    let renewed = fake.lock().expect("fake").leases["rbg-operator"].clone();
    assert_ne!(renewed["spec"]["renewTime"], lease["spec"]["renewTime"]);
    assert_eq!(renewed["spec"]["acquireTime"], lease["spec"]["acquireTime"]);
    assert_eq!(renewed["spec"]["leaseTransitions"], 0);
    assert!(fake.lock().expect("fake").unexpected.is_empty());
}

/// A leader that stops renewing is taken over one lease duration (15 s)
/// after the follower first saw its last renewal, not before; the old
/// leader then sees it follows.
#[tokio::test]
async fn takeover_after_expiry() {
    let (client, fake) = fake_client();
    let (a, b) = (elector(&client, "a"), elector(&client, "b"));
    assert_eq!(a.round(T0).await.expect("a"), Outcome::Leading);
    assert_eq!(b.round(T0 + S).await.expect("b"), following("a"));
    // a falls silent; b keeps trying every 5 s.
    assert_eq!(b.round(T0 + 6 * S).await.expect("b"), following("a"));
    assert_eq!(b.round(T0 + 11 * S).await.expect("b"), following("a"));
    assert_eq!(b.round(T0 + 16 * S).await.expect("b"), Outcome::Leading);
    let lease = fake.lock().expect("fake").leases["rbg-operator"].clone();
    assert_eq!(lease["spec"]["holderIdentity"], "b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    assert_eq!(a.round(T0 + 17 * S).await.expect("a"), following("b"));
    assert_eq!(
        fake.lock().expect("fake").leases["rbg-operator"]["spec"]["holderIdentity"],
        "b",
        "the deposed leader did not write"
    );
}

/// A leader that renews in time is never taken over.
#[tokio::test]
async fn renewing_leader_keeps_the_lease() {
    let (client, _fake) = fake_client();
    let (a, b) = (elector(&client, "a"), elector(&client, "b"));
    for i in 0..10 {
        let t = T0 + i * 5 * S;
        assert_eq!(a.round(t).await.expect("a"), Outcome::Leading);
        assert_eq!(
            b.round(t + S).await.expect("b"),
            following("a"),
            "round {i}"
        );
    }
}

/// Two candidates racing for an expired Lease: whatever the interleaving,
/// exactly one leads; the loser's write, if it got that far, is refused
/// with a Conflict for its stale resourceVersion.
#[tokio::test]
async fn racing_candidates_one_wins() {
    let (client, fake) = fake_client();
    let (x, a, b) = (
        elector(&client, "x"),
        elector(&client, "a"),
        elector(&client, "b"),
    );
    assert_eq!(x.round(T0).await.expect("x"), Outcome::Leading);
    assert_eq!(a.round(T0).await.expect("a"), following("x"));
    assert_eq!(b.round(T0).await.expect("b"), following("x"));
    let t = T0 + 20 * S;
    let (ra, rb) = tokio::join!(a.round(t), b.round(t));
    let (ra, rb) = (ra.expect("a"), rb.expect("b"));
    let leaders = [&ra, &rb]
        .iter()
        .filter(|o| ***o == Outcome::Leading)
        .count();
    assert_eq!(leaders, 1, "{ra:?} {rb:?}");
    let f = fake.lock().expect("fake");
    let holder = f.leases["rbg-operator"]["spec"]["holderIdentity"].clone();
    let winner = if ra == Outcome::Leading { "a" } else { "b" };
    assert_eq!(holder, winner);
    assert_eq!(f.leases["rbg-operator"]["spec"]["leaseTransitions"], 1);
    assert!(f.conflicts.len() <= 1, "{:?}", f.conflicts);
}

/// Writes refused for a stale resourceVersion (another client wrote
/// between read and write): a candidate whose takeover is refused follows;
/// a leader whose renewal is refused is not deposed, and renews on the
/// next round.
#[tokio::test]
async fn refused_writes_are_lost_races_not_losses() {
    let (client, fake) = fake_client();
    let (x, a) = (elector(&client, "x"), elector(&client, "a"));
    assert_eq!(x.round(T0).await.expect("x"), Outcome::Leading);
    assert_eq!(a.round(T0).await.expect("a"), following("x"));
    fake.lock().expect("fake").refuse_puts = 1;
    let o = a.round(T0 + 20 * S).await.expect("a");
    assert_eq!(o, following("x"), "the takeover lost the race");
    assert_eq!(fake.lock().expect("fake").conflicts, ["PUT rbg-operator"]);
    fake.lock().expect("fake").refuse_puts = 1;
    let o = x.round(T0 + 21 * S).await.expect("x");
    assert_eq!(o, following("x"));
    assert!(!o.deposes("x"), "a refused renewal is retried, not a loss");
    assert_eq!(x.round(T0 + 22 * S).await.expect("x"), Outcome::Leading);
    assert_eq!(
        fake.lock().expect("fake").leases["rbg-operator"]["spec"]["holderIdentity"],
        "x"
    );
}

/// A leader stopping on SIGTERM releases the Lease: the next candidate
/// takes it at once, without waiting out the lease duration.
#[tokio::test]
async fn released_lease_is_taken_at_once() {
    let (client, fake) = fake_client();
    let (a, b) = (elector(&client, "a"), elector(&client, "b"));
    assert_eq!(a.round(T0).await.expect("a"), Outcome::Leading);
    assert_eq!(b.round(T0).await.expect("b"), following("a"));
    a.release().await.expect("release");
    assert_eq!(
        fake.lock().expect("fake").leases["rbg-operator"]["spec"]["holderIdentity"],
        json!(null)
    );
    assert_eq!(b.round(T0 + S).await.expect("b"), Outcome::Leading);
    // Releasing a Lease one does not hold changes nothing.
    a.release().await.expect("release");
    assert_eq!(
        fake.lock().expect("fake").leases["rbg-operator"]["spec"]["holderIdentity"],
        "b"
    );
}

/// One HTTP/1.1 request to `addr`: (status code, body).
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

/// The port on 127.0.0.1:0: `/healthz` always answers; `/readyz` is 503
/// until ready and names leader or standby; `/metrics` is Prometheus text
/// with the leader gauge and the reconciles, failures by kind and
/// durations of real reconciles against the mocked API.
#[tokio::test]
async fn metrics_and_probes_over_http() {
    let m = Arc::new(Metrics::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(metrics::serve(listener, m.clone(), async move {
        let _ = stop_rx.await;
    }));

    assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into()));
    assert_eq!(
        get(addr, "/readyz").await,
        (503, "not ready (standby)\n".into())
    );
    let (code, body) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(body.contains("rbg_operator_leader 0"), "{body}");
    assert!(
        body.contains("rbg_operator_reconciles_total{result=\"ok\"} 0"),
        "{body}"
    );

    // One good and one invalid reconcile through the same metrics.
    let (client, _fake) = fake_client();
    let ctx = Context::with_metrics(client, m.clone());
    let good: GroupSpecV2 = serde_yaml::from_str(
        "roles: [{name: a, standalonePattern: {template: {spec: {containers: [{name: c, image: i}]}}}}]",
    )
    .expect("spec");
    let bad: GroupSpecV2 = serde_yaml::from_str(
        "roles: [{name: a, dependencies: [nope], standalonePattern: {template: {spec: {containers: [{name: c, image: i}]}}}}]",
    )
    .expect("spec");
    for (name, spec) in [("good", good), ("bad", bad)] {
        let mut g = RoleBasedGroupResource::new(name, spec);
        g.metadata.namespace = Some("default".into());
        let g = Arc::new(g);
        if let Err(e) = operator::reconcile(g.clone(), ctx.clone()).await {
            let _ = operator::error_policy(g, &e, ctx.clone());
        }
    }
    m.set_leader(true);
    m.set_ready(true);

    assert_eq!(get(addr, "/readyz").await, (200, "ready (leader)\n".into()));
    let (_, body) = get(addr, "/metrics").await;
    for line in [
        "rbg_operator_leader 1",
        "rbg_operator_reconciles_total{result=\"ok\"} 1",
        "rbg_operator_reconciles_total{result=\"error\"} 1",
        "rbg_operator_reconcile_failures_total{kind=\"invalid\"} 1",
        "rbg_operator_reconcile_failures_total{kind=\"kube\"} 0",
        "rbg_operator_reconcile_duration_seconds_count 2",
        "# TYPE rbg_operator_reconcile_duration_seconds histogram",
    ] {
        assert!(body.lines().any(|l| l == line), "{line:?} missing:\n{body}");
    }
    assert_eq!(get(addr, "/nope").await.0, 404);
    let _ = stop_tx.send(());
    server.await.expect("join").expect("serve");
}
