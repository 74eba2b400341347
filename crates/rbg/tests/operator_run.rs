//! The operator's whole loop (`operator::operate`: HTTP port, leader
//! election, controllers) against kube-rs's mocked API with paused tokio
//! time: a replica stands by while another holds the Lease, takes over
//! once it has gone unrenewed for the lease duration, then reconciles the
//! group the controller's initial list found; a replica whose Lease is
//! taken stops and returns an error (so its process exits and restarts);
//! one stopped by a signal releases the Lease. Tests wait on observable
//! state (the metrics, the fake's objects), never on a fixed sleep.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use rbg::operator::{self, Metrics, Options};
use serde_json::{json, Value};
use support::{fake_client, Fake};

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    opts: Options,
}

fn opts() -> Options {
    Flags::parse_from([
        "rbg",
        "--metrics-addr",
        "127.0.0.1:0",
        "--lease-namespace",
        "rbg-system",
        "--identity",
        "me",
    ])
    .opts
}

/// Waits (in paused time) until `cond` holds, at most `secs` seconds.
async fn until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn holder(fake: &Arc<Mutex<Fake>>) -> Value {
    fake.lock().expect("fake").leases["rbg-operator"]["spec"]["holderIdentity"].clone()
}

/// A Lease held by `who`, renewed "now" (the replica only counts from when
/// it first sees it).
fn lease(who: &str, rv: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": "rbg-operator", "namespace": "rbg-system", "resourceVersion": rv},
           "spec": {"holderIdentity": who, "leaseDurationSeconds": 15,
                    "renewTime": "2024-01-01T00:00:00.000000Z", "leaseTransitions": 4}})
}

/// The operator's whole loop on `client`, on a task: its metrics, the
/// sender that stops it (as SIGTERM does) and the task.
async fn start(
    client: kube::Client,
) -> (
    Arc<Metrics>,
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let metrics = Arc::new(Metrics::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (o, m) = (opts(), metrics.clone());
    let task =
        tokio::spawn(async move { operator::operate(client, &o, m, listener, stop_rx).await });
    (metrics, stop_tx, task)
}

#[tokio::test(start_paused = true)]
async fn standby_takes_over_reconciles_and_exits_when_deposed() {
    let (client, fake) = fake_client();
    {
        let mut f = fake.lock().expect("fake");
        f.leases.insert("rbg-operator".into(), lease("other", "1"));
        f.groups.insert(
            "g".into(),
            json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
                   "metadata": {"name": "g", "namespace": "default", "uid": "rbg-uid", "generation": 1},
                   "spec": {"roles": [{"name": "a", "standalonePattern": {"template":
                       {"spec": {"containers": [{"name": "c", "image": "i:1"}]}}}}]}}),
        );
    }
    let (metrics, _stop_tx, task) = start(client).await;

    // Standing by: ready, not leading, nothing reconciled.
    until(3, "standby ready", || metrics.is_ready()).await;
    assert!(!metrics.is_leader());
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!metrics.is_leader(), "took over before the lease expired");
    assert_eq!(holder(&fake), "other");
    assert!(fake.lock().expect("fake").pods.is_empty());

    // "other" never renewed: taken over within 15 s of first sight (+ one
    // 5 s retry period), and the group is reconciled.
    until(15, "takeover", || metrics.is_leader()).await;
    assert_eq!(holder(&fake), "me");
    assert_eq!(
        fake.lock().expect("fake").leases["rbg-operator"]["spec"]["leaseTransitions"],
        5
    );
    until(10, "the group reconciled", || {
        fake.lock().expect("fake").pods.contains_key("g-a-0")
    })
    .await;
    until(10, "leader ready", || metrics.is_ready()).await;
    assert!(metrics.reconciles_of("ok") >= 1);

    // Someone else writes the Lease: this replica stops and errs.
    let rv = {
        let mut f = fake.lock().expect("fake");
        f.rv += 1;
        f.rv.to_string()
    };
    fake.lock()
        .expect("fake")
        .leases
        .insert("rbg-operator".into(), lease("thief", &rv));
    let out = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("stops within a renew period")
        .expect("join");
    let err = out.expect_err("a deposed leader returns an error");
    assert!(err.to_string().contains("lost the leader Lease"), "{err}");
    assert!(!metrics.is_leader());
    assert_eq!(holder(&fake), "thief", "the deposed leader did not write");
}

#[tokio::test(start_paused = true)]
async fn leader_stopped_by_a_signal_releases_the_lease() {
    let (client, fake) = fake_client();
    let (metrics, stop_tx, task) = start(client).await;
    until(5, "leading", || metrics.is_leader()).await;
    assert_eq!(holder(&fake), "me");
    let _ = stop_tx.send(true);
    let out = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("stops")
        .expect("join");
    out.expect("a signal is a clean stop");
    assert_eq!(holder(&fake), Value::Null, "released for the standby");
}

/// A leader that cannot renew (every write refused) keeps retrying, then
/// steps down and errs within the renew deadline (10 s), before any
/// standby could take the Lease over (15 s after its last renewal).
#[tokio::test(start_paused = true)]
async fn leader_that_cannot_renew_steps_down_in_time() {
    let (client, fake) = fake_client();
    let (metrics, _stop_tx, task) = start(client).await;
    until(5, "leading", || metrics.is_leader()).await;
    fake.lock().expect("fake").refuse_puts = u32::MAX;
    let refused_at = tokio::time::Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("steps down")
        .expect("join");
    let took = refused_at.elapsed();
    assert!(out.is_err(), "stepping down is an error exit");
    assert!(took <= Duration::from_secs(11), "{took:?}");
    assert!(!metrics.is_leader());
    let tries = fake.lock().expect("fake").conflicts.len();
    assert!(tries >= 3, "retried before giving up: {tries}");
}
