//! The serving path through a dead store: once a store is `kill -9`ed, a
//! reader of an object whose only replica was there gets its miss at once
//! (not after the client's whole retry budget), live keys in the same batch
//! never wait for it, replicated objects read from the live replica, a
//! remove answers success, new puts go to the live store at once, and the store is
//! used again once it is back (without the removed key).
//!
//! The clients here get a 30 s retry budget on purpose: a call that rode it
//! out would take 30 s, so the bounds below (a few seconds, for slow debug
//! builds on busy CI machines) fail on any stall, not on a slow machine.

mod common;

use std::time::Duration;

use common::Cluster;
use kvpool_client::{Client, GetInto, Protocol, ReplicateConfig};
use kvpool_proto::Code;
use tokio::time::Instant;

/// Far above any answer that does not wait out the retry budget, far below it.
const FAST: Duration = Duration::from_secs(3);

/// Two stores, and a master with its defaults: it keeps a dead store's
/// objects for its client TTL and grace (40 s), as in production, so
/// readers meet the dead store rather than a master that already forgot it.
async fn two_stores() -> Cluster {
    Cluster::builder()
        .stores(2)
        .segment_size("32MiB")
        .master_flag("--client-ttl", "10s")
        .master_flag("--store-grace", "30s")
        .start()
        .await
}

/// A client reading over TCP (a same-host client would map the segment
/// file, which outlives its store) with a long retry budget, and
/// `hedge_reads` as given.
async fn patient_tcp_client(cluster: &Cluster, hedge_reads: bool) -> Client {
    cluster
        .client_with(|c| {
            c.protocol = Protocol::Tcp;
            c.retry_for = Duration::from_secs(30);
            c.retries = 1_000;
            c.hedge_reads = hedge_reads;
        })
        .await
}

fn on(segments: &[&str], replicas: u32) -> ReplicateConfig {
    ReplicateConfig {
        replica_num: replicas,
        preferred_segments: segments.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// Runs `f`, asserting it answers within [`FAST`]; returns its answer.
async fn fast<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    let t0 = Instant::now();
    let out = f.await;
    let took = t0.elapsed();
    assert!(
        took < FAST,
        "{what} took {took:?}: it waited for a dead store"
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_store_costs_readers_no_retry_budget() {
    let mut cluster = two_stores().await;
    let (dead, live) = (Cluster::store_name(0), Cluster::store_name(1));
    let client = patient_tcp_client(&cluster, false).await;
    let value = vec![7u8; 4096];
    for (k, rc) in [
        ("only-dead", on(&[&dead], 1)),
        ("only-dead-2", on(&[&dead], 1)),
        ("only-live", on(&[&live], 1)),
        ("both", on(&[&dead, &live], 2)),
        ("removed", on(&[&dead], 1)),
    ] {
        client.put(k, &value, &rc).await.expect(k);
    }
    // Every location cached and every connection pooled, as in a warm engine.
    for k in ["only-dead", "only-live", "both"] {
        assert_eq!(client.get(k).await.expect(k), value);
    }

    cluster.kill9_store(0);

    let e = fast("get of a key on the dead store", client.get("only-dead"))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::TransferFail, "{e}");
    // Again, now that the client knows the store is down, and for a key
    // whose location was never cached.
    for k in ["only-dead", "only-dead-2"] {
        let e = fast("another get", client.get(k)).await.unwrap_err();
        assert_eq!(e.code, Code::TransferFail, "{k}: {e}");
    }

    // A batch: the dead key fails, the live ones answer, nobody waits.
    let keys = ["only-dead", "only-live", "both"];
    let mut bufs = vec![vec![0u8; 4096]; 3];
    let mut items = GetInto::each(&keys, &mut bufs);
    let got = fast(
        "a batch with one dead key",
        client.batch_get_into(&mut items),
    )
    .await;
    drop(items);
    assert_eq!(got[0].as_ref().unwrap_err().code, Code::TransferFail);
    for i in [1, 2] {
        assert_eq!(got[i].as_ref().ok(), Some(&4096), "{}", keys[i]);
        assert_eq!(bufs[i], value, "{}", keys[i]);
    }
    let got = fast("batch_get", client.batch_get(&keys)).await;
    assert!(got[0].is_err());
    assert_eq!(got[1].as_ref().unwrap(), &value);
    assert_eq!(got[2].as_ref().unwrap(), &value);

    // A remove the master made answers success, though the store could not
    // be told (it is, when it is back); before, the reply waited for the
    // store as long as it might come back (40 s) and the caller got a
    // timeout.
    client
        .remove("removed", false)
        .await
        .expect("the master removed it");
    assert!(!client.exist("removed").await.expect("exist"));

    // The master saw the dead store's heartbeat connection close...
    common::eventually(
        "the master to see the dead store hang up",
        Duration::from_secs(10),
        async || {
            let (code, body) = common::http_get(&cluster.metrics_addr, "/api/clients").await;
            (code == 200 && body.contains("\"hung_up\":true")).then_some(())
        },
    )
    .await;
    // ...so new puts go to the live store, even one that prefers the dead
    // one (before, the master placed there until three heartbeats were
    // missed, and such a put retried all that time).
    for (k, rc) in [("new", on(&[], 1)), ("new-pref", on(&[&dead], 1))] {
        fast("a put after the kill", client.put(k, &value, &rc))
            .await
            .expect(k);
        assert_eq!(client.get(k).await.expect(k), value);
    }

    // The store comes back: its objects are read again (the client probes
    // the endpoint it had given up on).
    cluster.restart_store(0, None);
    common::eventually(
        "the restarted store's object",
        Duration::from_secs(30),
        async || client.get("only-dead").await.ok(),
    )
    .await;
}

/// A paused store (SIGSTOP: it accepts connections but never answers) costs
/// the call that finds it one silence (two connect timeouts, 2 s), not its
/// 10 s timeout; later calls know it is stuck and fail or go to a live
/// replica at once, until it answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_store_costs_one_silence_not_one_timeout_per_call() {
    let mut cluster = two_stores().await;
    let (paused, live) = (Cluster::store_name(0), Cluster::store_name(1));
    let client = patient_tcp_client(&cluster, false).await;
    let value = vec![9u8; 4096];
    for (k, rc) in [
        ("only-paused", on(&[&paused], 1)),
        ("both", on(&[&paused, &live], 2)),
    ] {
        client.put(k, &value, &rc).await.expect(k);
        assert_eq!(client.get(k).await.expect(k), value);
    }
    // Preferred segments are a hint: say so if placement did not take it,
    // rather than fail below for the wrong reason.
    let held = client
        .replica_descs(&["only-paused"])
        .await
        .remove(0)
        .expect("descs");
    let held: Vec<&str> = held.iter().map(|d| d.segment.as_str()).collect();
    assert_eq!(
        held,
        [paused.as_str()],
        "only-paused was not placed on the store to pause"
    );

    cluster.store(0).freeze(true);
    // The first call meets the silent store and waits out its silence:
    // well under the call's 10 s timeout.
    let t0 = Instant::now();
    let e = client.get("only-paused").await.unwrap_err();
    assert!(e.code.is_transient(), "{e}");
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(6),
        "{took:?}: waited the timeout"
    );
    // The next ones do not wait for it (a probe may cost one connect
    // timeout, 1 s).
    for _ in 0..3 {
        let e = fast("a get from the paused store", client.get("only-paused"))
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::TransferFail, "{e}");
        let got = fast("a get of a replicated key", client.get("both")).await;
        assert_eq!(got.expect("the live replica"), value);
    }

    cluster.store(0).freeze(false);
    common::eventually(
        "the store to answer again",
        Duration::from_secs(30),
        async || client.get("only-paused").await.ok(),
    )
    .await;
}

/// With hedged reads on, a read of a replicated object whose first replica
/// is on a paused store asks the next replica after the hedge delay
/// (milliseconds) and answers from it, verified; a batch of such objects
/// too. Without the hedge each read would wait out the store's silence
/// (2 s) first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_read_answers_from_the_live_replica_while_the_first_is_paused() {
    let mut cluster = two_stores().await;
    let (paused, live) = (Cluster::store_name(0), Cluster::store_name(1));
    let client = patient_tcp_client(&cluster, true).await;
    let keys: Vec<String> = (0..8).map(|i| format!("hedged-{i}")).collect();
    let value = |i: usize| vec![i as u8 + 1; 64 << 10];
    for (i, k) in keys.iter().enumerate() {
        client
            .put(k, &value(i), &on(&[&paused, &live], 2))
            .await
            .expect(k);
        assert_eq!(client.get(k).await.expect(k), value(i));
    }
    let count =
        |c: &Client, series: &str| c.metrics().snapshot().get(series).copied().unwrap_or(0.0);
    let wins = |c: &Client| count(c, "kvpool_client_hedge_wins_total");
    assert_eq!(wins(&client), 0.0, "no hedge while both stores answer");

    cluster.store(0).freeze(true);
    // Under the store's 2 s silence, so only a hedge can answer in time.
    let quick = Duration::from_secs(1);
    for (i, k) in keys.iter().enumerate() {
        let t0 = Instant::now();
        let got = client.get(k).await.expect(k);
        let took = t0.elapsed();
        assert_eq!(got, value(i), "{k}");
        assert!(took < quick, "{k} took {took:?}: the read was not hedged");
    }
    assert!(wins(&client) >= 1.0, "hedges answered: {}", wins(&client));
    // The store that lost the race is read last for a while: the later
    // reads went to the live replica first, without a hedge each.
    let asked = count(&client, "kvpool_client_hedged_reads_total");
    assert!(
        asked < keys.len() as f64,
        "{asked} hedges for {} reads",
        keys.len()
    );
    let mut bufs = vec![vec![0u8; 64 << 10]; keys.len()];
    let t0 = Instant::now();
    let got = client
        .batch_get_into(&mut GetInto::each(&keys, &mut bufs))
        .await;
    let took = t0.elapsed();
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.as_ref().ok(), Some(&(64 << 10)), "{}", keys[i]);
        assert_eq!(bufs[i], value(i), "{}", keys[i]);
    }
    assert!(took < quick, "the batch took {took:?}");
    cluster.store(0).freeze(false);
}

/// With `fail_fast_after`, a master that stops answering costs a call
/// already waiting for it no more than that silence, not the retry budget:
/// the call ends with RPC_FAIL once the silence reaches the setting, calls
/// made after fail at once, and once the master is back the pool answers
/// and the key of the abandoned put can be written again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_on_a_silent_master_ends_at_fail_fast_after() {
    let mut cluster = two_stores().await;
    let client = cluster
        .client_with(|c| {
            c.protocol = Protocol::Tcp;
            c.retry_for = Duration::from_secs(30);
            c.retries = 1_000;
            c.fail_fast_after = Some(Duration::from_millis(1500));
        })
        .await;
    let value = vec![7u8; 4096];
    let plain = ReplicateConfig::default();
    client.put("ff-0", &value, &plain).await.expect("put");
    cluster.master_process().freeze(true);
    // Made at once, before the silence reaches the setting: it waits for
    // the master, then ends.
    let e = fast(
        "a put waiting on the paused master",
        client.put("ff-1", &value, &plain),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, Code::RpcFail, "{e}");
    let e = fast("an exist while the master is silent", client.exist("ff-0"))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::RpcFail, "{e}");
    cluster.master_process().freeze(false);
    // The abandoned put may have reached the master all the same: the
    // client cancels it once the master answers, so the key is free again
    // long before the master's put timeout (60 s) would free it.
    common::eventually(
        "the abandoned key written again",
        common::STARTUP,
        async || client.put("ff-1", &value, &plain).await.ok(),
    )
    .await;
    assert_eq!(client.get("ff-1").await.expect("get"), value);
    assert_eq!(client.get("ff-0").await.expect("get"), value);
}

/// A put whose write failed (its store paused) and whose revocation then
/// met a silent master: the client cancels the operation once the master
/// answers again, so the key is free long before the master's put timeout
/// (60 s) would free it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_the_master_never_answered_frees_its_key_once_it_is_back() {
    let mut cluster = two_stores().await;
    let client = cluster
        .client_with(|c| {
            c.protocol = Protocol::Tcp;
            c.retry_for = Duration::from_secs(30);
            // One pass: no second PutStart to go unanswered in its turn.
            c.retries = 0;
            c.fail_fast_after = Some(Duration::from_millis(1500));
        })
        .await;
    let value = vec![5u8; 4096];
    let paused = on(&[&Cluster::store_name(0)], 1);
    client.put("rv-0", &value, &paused).await.expect("put");
    cluster.store(0).freeze(true);
    let writer = client.clone();
    let put = tokio::spawn(async move { writer.put("rv-1", &[5u8; 4096], &paused).await });
    // The grant is in and the write waits on the paused store's silence
    // (2 s): the master goes silent before the write fails and the put
    // revokes its key.
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.master_process().freeze(true);
    let e = put.await.expect("joined").unwrap_err();
    assert_eq!(e.code, Code::TransferFail, "{e}");
    cluster.master_process().freeze(false);
    cluster.store(0).freeze(false);
    common::eventually(
        "the revoked key written again",
        common::STARTUP,
        async || {
            client
                .put("rv-1", &value, &ReplicateConfig::default())
                .await
                .ok()
        },
    )
    .await;
    assert_eq!(client.get("rv-1").await.expect("get"), value);
}
