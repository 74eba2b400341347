//! Tests of the shell in `lib.rs`: request dispatch, the request policy,
//! and configuration checks.

use super::*;
use kvpool_net::server::ControlHandler;
use kvpool_proto::msg::{
    ClientId, PutEndItem, PutGrant, PutItem, ReplicateConfig, SegmentId, SegmentInfo,
};

/// An admin peer on a connection of this build's protocol.
const ADMIN: Peer = Peer {
    role: PeerRole::Admin,
    tenant: None,
    version: kvpool_proto::PROTOCOL_VERSION,
};

fn segment(id: u128) -> SegmentInfo {
    SegmentInfo {
        id: SegmentId(id),
        name: format!("s{id}"),
        endpoint: "127.0.0.1:1".into(),
        base: 4096,
        size: 1 << 20,
        path: None,
        tier: Default::default(),
    }
}

/// A store whose heartbeat connection closes (a crash closes it at once)
/// takes no new objects until it is heard from again, long before its
/// heartbeats would be missed.
#[test]
fn a_store_that_hangs_up_takes_no_new_objects_until_it_is_heard_from() {
    let master = Master::new(StateConfig::default());
    let s = &master.state;
    let (gone, other, writer) = (ClientId(1), ClientId(2), ClientId(3));
    for (id, name) in [(gone, "gone"), (other, "other"), (writer, "writer")] {
        s.register_client(id, name, Instant::now()).unwrap();
    }
    s.mount(gone, segment(1), 0, Instant::now()).unwrap();
    s.mount(other, segment(2), 0, Instant::now()).unwrap();
    let mut conn = None;
    let beat = msg::encode(&msg::Heartbeat {
        client_id: gone,
        io: Default::default(),
        held: Default::default(),
    });
    let (r, _) = master.handle(&mut conn, &ADMIN, Opcode::Heartbeat, &beat);
    r.unwrap();
    assert_eq!(conn, Some(gone), "the connection carries its heartbeats");
    let placed = |key: &str| {
        let item = PutItem {
            key: key.into(),
            value_len: 10,
            region_len: 100,
        };
        let rc = ReplicateConfig {
            preferred_segments: vec!["s1".into()],
            ..Default::default()
        };
        match s
            .put_start(writer, &[item], &rc, false, Instant::now())
            .remove(0)
        {
            Ok(msg::PutGrant::Write { replicas, .. }) => replicas[0].segment,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(placed("a"), SegmentId(1));
    master.closed(conn);
    assert_eq!(
        placed("b"),
        SegmentId(2),
        "hung up: placed elsewhere at once"
    );
    assert!(s.heartbeat(gone, Instant::now()));
    assert_eq!(placed("c"), SegmentId(1), "heard from again: placeable");
}

/// The sweeper task, driven by paused tokio time, drops a silent client's
/// segment and revokes its put, while a heartbeating client survives.
#[tokio::test(start_paused = true)]
async fn sweeper_expires_silent_clients_on_paused_time() {
    let cfg = StateConfig {
        client_ttl: Duration::from_secs(10),
        store_grace: Duration::ZERO,
        ..StateConfig::default()
    };
    let master = Master::new(cfg);
    let shutdown = CancellationToken::new();
    tokio::spawn(tasks::sweeper(master.clone(), shutdown.clone()));
    let s = &master.state;
    let (silent, alive) = (ClientId(1), ClientId(2));
    s.register_client(silent, "silent", Instant::now()).unwrap();
    s.register_client(alive, "alive", Instant::now()).unwrap();
    s.mount(silent, segment(1), 0, Instant::now()).unwrap();
    s.mount(alive, segment(2), 0, Instant::now()).unwrap();
    let item = PutItem {
        key: "k".into(),
        value_len: 10,
        region_len: 100,
    };
    let rc = ReplicateConfig {
        preferred_segments: vec!["s2".into()],
        ..Default::default()
    };
    assert!(s.put_start(silent, &[item], &rc, false, Instant::now())[0].is_ok());
    assert_eq!(s.status().pending, 1);

    for _ in 0..9 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(s.heartbeat(alive, Instant::now()));
    }
    // Not yet past the TTL: both still mounted.
    assert_eq!(s.status().segments.len(), 2);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(s.heartbeat(alive, Instant::now()));
    }
    let st = s.status();
    assert_eq!(st.segments.len(), 1, "silent client's segment must be gone");
    assert_eq!(st.segments[0].info.id, SegmentId(2));
    assert_eq!(st.pending, 0, "silent client's put must be revoked");
    // Its region is reused only once its write grant has expired: a
    // write of the silent client may still be on its way.
    assert_eq!(
        st.used, 128,
        "revoked put's region (rounded up) held for the pending TTL"
    );
    assert!(!s.heartbeat(silent, Instant::now()));
    for _ in 0..61 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(s.heartbeat(alive, Instant::now()));
        // The invalidator's part: the region is destroyed once more
        // before it is reused.
        let (_, through) = s.take_invalidations();
        s.invalidations_sent(through);
    }
    assert_eq!(
        s.status().used,
        0,
        "revoked put's region freed after the pending TTL"
    );
    shutdown.cancel();
}

/// A drain's delayed unmount is a task of the master: it fires on time,
/// and never after the master stopped.
#[tokio::test(start_paused = true)]
async fn a_drain_deadline_unmounts_unless_the_master_stopped() {
    for stop_first in [false, true] {
        let shutdown = CancellationToken::new();
        let master = Master::with_shutdown(StateConfig::default(), None, shutdown.clone());
        let c = ClientId(1);
        master
            .state
            .register_client(c, "c", Instant::now())
            .unwrap();
        master
            .state
            .mount(c, segment(1), 0, Instant::now())
            .unwrap();
        let drain = msg::encode(&msg::DrainSegment {
            segment: "s1".into(),
            unmount_after_ms: Some(10_000),
        });
        let (r, _) = master.handle(&mut None, &ADMIN, Opcode::DrainSegment, &drain);
        r.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        if stop_first {
            shutdown.cancel();
        }
        tokio::time::sleep(Duration::from_secs(6)).await;
        let mounted = master.state.status().segments.len();
        assert_eq!(
            mounted,
            usize::from(stop_first),
            "stopped first: {stop_first}"
        );
        shutdown.cancel();
        master.background.close();
        master.background.wait().await;
    }
}

/// A remove-by-regex is refused before any walk when its pattern is
/// over 4 KiB or compiles past the size limit; a plain one works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_removals_are_bounded_before_they_walk() {
    let master = Master::new(StateConfig::default());
    let remove = |pattern: String| {
        let req = msg::encode(&msg::RemoveByRegex {
            pattern,
            force: true,
        });
        master
            .handle(&mut None, &ADMIN, Opcode::RemoveByRegex, &req)
            .0
    };
    let long = remove("a".repeat(4097)).unwrap_err();
    assert_eq!(long.code, Code::InvalidParams);
    assert!(long.message.contains("4096"), "{long}");
    // A few bytes that expand to megabytes of automaton.
    let bomb = remove(r"\w{1000}".into()).unwrap_err();
    assert_eq!(bomb.code, Code::InvalidParams);
    assert!(bomb.message.contains("compiles to more than"), "{bomb}");
    let r = master.state.refusals();
    assert_eq!(r.count(Refusal::RegexPattern), 1);
    assert_eq!(r.count(Refusal::RegexSize), 1);
    let bad = remove("(".into()).unwrap_err();
    assert!(bad.message.contains("bad regex"), "{bad}");
    assert_eq!(
        r.count(Refusal::RegexSize),
        1,
        "a syntax error is no refusal"
    );
    let ok = remove("^k-[0-9]+$".into()).expect("a plain regex");
    assert_eq!(msg::decode::<u64>(&ok).unwrap(), 0);
}

/// A batch over the item limit is refused from its length prefix,
/// whatever its items; one at the limit is answered per key.
#[test]
fn batches_over_the_limit_are_refused_whole() {
    let master = Master::new(StateConfig::default());
    let keys = |n: usize| (0..n).map(|i| format!("k{i}")).collect::<Vec<_>>();
    let exist = |n| msg::encode(&msg::Exist { keys: keys(n) });
    let over = master.handle(
        &mut None,
        &ADMIN,
        Opcode::Exist,
        &exist(kvpool_proto::MAX_BATCH_KEYS + 1),
    );
    let e = over.0.unwrap_err();
    assert_eq!(e.code, Code::InvalidParams);
    assert!(e.message.contains("16384"), "{e}");
    assert_eq!(master.state.refusals().count(Refusal::BatchKeys), 1);
    let at = master.handle(
        &mut None,
        &ADMIN,
        Opcode::Exist,
        &exist(kvpool_proto::MAX_BATCH_KEYS),
    );
    let answers: Vec<msg::WireResult<u64>> = msg::decode(&at.0.unwrap()).unwrap();
    assert_eq!(answers.len(), kvpool_proto::MAX_BATCH_KEYS);
    // A claimed count is refused before the bytes for it are looked at.
    let mut lying = msg::encode(&msg::GetReplicaList { keys: keys(1) });
    lying[0] = 0xff;
    lying.insert(1, 0xff);
    let e = master
        .handle(&mut None, &ADMIN, Opcode::GetReplicaList, &lying)
        .0
        .unwrap_err();
    assert!(e.message.contains("exceeds the limit"), "{e}");
}

/// A new leader that did not run for part of its recovery grace
/// (paused, starved) gets that time back before it serves objects: the
/// chaos harness saw a leader paused through its grace answer "not
/// found" for objects whose stores had not re-mounted yet, and a put
/// then replace an acknowledged value.
#[test]
fn a_stall_extends_the_recovery_grace() {
    let master = Master::new(StateConfig::default());
    let t0 = Instant::now();
    let s = Duration::from_secs;
    master.set_role(Role::Recovering(t0 + s(1)));
    let exist = msg::encode(&msg::Exist {
        keys: vec!["k".into()],
    });
    let refused = |m: &Master| {
        m.handle(&mut None, &ADMIN, Opcode::Exist, &exist)
            .0
            .is_err_and(|e| e.code == Code::UnavailableInCurrentStatus)
    };
    assert!(refused(&master));
    // Paused for 2 s of the 1 s grace: 1 s of grace is still owed.
    master.recovery_tick(t0 + s(2), s(2));
    assert_eq!(master.role(t0), Role::Recovering(t0 + s(3)));
    assert!(refused(&master));
    master.recovery_tick(t0 + s(3), Duration::ZERO);
    assert_eq!(master.role(t0), Role::Leader);
    assert!(!refused(&master));
}

/// A new leader's recovery lasts until every segment its predecessor
/// listed in etcd is back (and then ends at once, grace or not), or has
/// been given up after the client TTL and the store grace. The chaos
/// harness saw a new leader serve while a store was cut off: "not
/// found" for its keys, old versions of keys whose new one it held, and
/// removed keys back when it re-mounted with their second replica.
#[test]
fn recovery_waits_for_the_segments_the_previous_leader_listed() {
    let cfg = StateConfig {
        client_ttl: Duration::from_secs(2),
        store_grace: Duration::from_secs(30),
        ..StateConfig::default()
    };
    let master = Master::new(cfg);
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let st = &master.state;
    st.expect_segments(Some(vec![SegmentId(1), SegmentId(2)]), t0);
    master.set_role(Role::Recovering(t0 + s(1)));
    master.recovery_tick(t0 + s(2), Duration::ZERO);
    assert!(
        matches!(master.role(t0), Role::Recovering(_)),
        "grace over, segments missing"
    );
    let c = ClientId(1);
    st.register_client(c, "store", t0).unwrap();
    st.mount(c, segment(1), 0, t0).unwrap();
    assert!(matches!(master.role(t0), Role::Recovering(_)));
    st.mount(c, segment(2), 0, t0).unwrap();
    assert_eq!(
        master.role(t0),
        Role::Leader,
        "every segment back: serving at once"
    );

    // Given up after TTL + grace.
    let master = Master::new(StateConfig {
        client_ttl: Duration::from_secs(2),
        store_grace: Duration::from_secs(30),
        ..StateConfig::default()
    });
    master.state.expect_segments(Some(vec![SegmentId(9)]), t0);
    master.set_role(Role::Recovering(t0 + s(1)));
    master.recovery_tick(t0 + s(31), Duration::ZERO);
    assert!(matches!(master.role(t0), Role::Recovering(_)));
    master.state.sweep(t0 + s(32));
    master.recovery_tick(t0 + s(32), Duration::ZERO);
    assert_eq!(master.role(t0), Role::Leader);
}

/// A store can re-mount with a new leader before the leader has read its
/// predecessor's segment list from etcd (mounts are served from the
/// election on). Its segment is still expected back until its inventory
/// is reconciled: before, the leader took it for back at once and answered
/// "not found" for every key the inventory had not reported yet, acknowledged
/// writes included (found reading the code behind chaos finding 17).
#[test]
fn a_segment_mounted_before_the_list_is_read_is_back_only_with_its_inventory() {
    let master = Master::new(StateConfig::default());
    let t0 = Instant::now();
    let st = &master.state;
    master.set_role(Role::Recovering(t0));
    let c = ClientId(1);
    st.register_client(c, "store", t0).unwrap();
    st.mount(c, segment(1), 1, t0).unwrap();
    st.expect_segments(Some(vec![SegmentId(1)]), t0);
    master.recovery_tick(t0 + Duration::from_secs(1), Duration::ZERO);
    assert!(
        matches!(master.role(t0), Role::Recovering(_)),
        "its inventory is still to come"
    );
    let item = msg::InventoryItem {
        key: "k".into(),
        generation: 1,
        value_len: 10,
        offset: 4096,
        region_len: 4096,
    };
    let verdict = st
        .report_objects(c, SegmentId(1), vec![item], true, t0)
        .unwrap();
    assert_eq!(verdict.accepted, 1);
    assert_eq!(master.role(t0), Role::Leader, "back with its objects");
    assert!(st.get_replica_list(&["k".to_string()], t0)[0].is_ok());
}

/// A store sends the last part of an inventory again when the master's
/// reconcile of the whole inventory outlasts its call's timeout (25 s for
/// 10M objects on a busy 2-core machine). Only one reconcile may run, and
/// it alone answers: the part sent again once reconciled alone, rejecting
/// each object of it the running reconcile had not reached, and the store
/// destroyed them (acknowledged writes lost; found by `bench/groups.sh`).
#[test]
fn an_inventory_part_sent_again_during_its_reconcile_is_refused() {
    let st = std::sync::Arc::new(MasterState::new(StateConfig::default()));
    let t0 = Instant::now();
    let c = ClientId(1);
    st.register_client(c, "store", t0).unwrap();
    let n = 200_000;
    let info = SegmentInfo {
        size: 1 << 30,
        ..segment(1)
    };
    st.mount(c, info, n as u64, t0).unwrap();
    let items: Vec<msg::InventoryItem> = (0..n)
        .map(|i| msg::InventoryItem {
            key: format!("k{i}"),
            generation: 1,
            value_len: 10,
            offset: 4096 + i as u64 * 64,
            region_len: 64,
        })
        .collect();
    let (first, last) = items.split_at(n - 1_000);
    st.report_objects(c, SegmentId(1), first.to_vec(), false, t0)
        .unwrap();
    let sent = {
        let (st, last) = (st.clone(), last.to_vec());
        std::thread::spawn(move || st.report_objects(c, SegmentId(1), last, true, t0))
    };
    let mut answers = Vec::new();
    while !sent.is_finished() {
        answers.push(st.report_objects(c, SegmentId(1), last.to_vec(), true, t0));
    }
    answers.push(sent.join().unwrap());
    let verdicts: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
    assert_eq!(verdicts.len(), 1, "one reconcile answers: {verdicts:?}");
    assert_eq!(
        (verdicts[0].accepted, verdicts[0].rejected.len()),
        (n as u64, 0)
    );
    for e in answers.iter().filter_map(|a| a.as_ref().err()) {
        assert!(
            matches!(
                e.code,
                Code::UnavailableInCurrentStatus | Code::InvalidParams
            ),
            "{e}"
        );
    }
    let keys: Vec<String> = items.iter().map(|i| i.key.clone()).collect();
    assert!(st.get_replica_list(&keys, t0).iter().all(|r| r.is_ok()));
}

/// While a new leader waits for a segment its predecessor listed, it
/// serves upserts into the segments already back (their versions beat
/// any copy the late segment brings), and nothing that could answer for
/// a key the late segment holds: write-once puts, existence, reads.
#[test]
fn a_recovering_leader_serves_upserts_once_a_segment_is_back() {
    let master = Master::new(StateConfig::default());
    let t0 = Instant::now();
    let st = &master.state;
    st.expect_segments(Some(vec![SegmentId(1), SegmentId(2)]), t0);
    master.set_role(Role::Recovering(t0));
    let c = ClientId(1);
    st.register_client(c, "client", t0).unwrap();
    let start = |upsert| {
        msg::encode(&msg::PutStart {
            client_id: c,
            op: if upsert { 3 } else { 5 },
            items: vec![msg::PutItem {
                key: "k".into(),
                value_len: 10,
                region_len: 4096,
            }],
            config: Default::default(),
            upsert,
        })
    };
    let code = |op, meta: &[u8]| {
        let r = master.handle(&mut None, &ADMIN, op, meta).0;
        r.err().map(|e| e.code)
    };
    let busy = Some(Code::UnavailableInCurrentStatus);
    assert_eq!(
        code(Opcode::PutStart, &start(true)),
        busy,
        "no segment back"
    );
    st.mount(c, segment(1), 0, t0).unwrap();
    assert!(matches!(master.role(t0), Role::Recovering(_)));
    assert_eq!(code(Opcode::PutStart, &start(true)), None, "an upsert goes");
    assert_eq!(code(Opcode::PutStart, &start(false)), busy, "a put waits");
    let exist = msg::encode(&msg::Exist {
        keys: vec!["k".into()],
    });
    assert_eq!(code(Opcode::Exist, &exist), busy);
    st.mount(c, segment(2), 0, t0).unwrap();
    assert_eq!(master.role(t0), Role::Leader);
    assert_eq!(code(Opcode::PutStart, &start(false)), None);
}

/// A leader whose etcd lease may have lapsed (etcd unreachable, or the
/// leader paused) serves nothing but status, even before it notices and
/// steps down: another master may lead by then. The chaos harness saw a
/// leader cut off from etcd keep committing puts after a standby could
/// have taken over.
#[test]
fn a_leader_past_its_lease_serves_only_status() {
    let master = Master::new(StateConfig::default());
    let exist = msg::encode(&msg::Exist {
        keys: vec!["k".into()],
    });
    let answer = |m: &Master, op, meta: &[u8]| m.handle(&mut None, &ADMIN, op, meta).0;
    master.lead_until(Some(Instant::now() + Duration::from_secs(60)));
    assert!(answer(&master, Opcode::Exist, &exist).is_ok());
    master.lead_until(Some(Instant::now()));
    let e = answer(&master, Opcode::Exist, &exist).unwrap_err();
    assert_eq!(e.code, Code::UnavailableInCurrentStatus);
    assert!(e.message.contains("lease"), "{e}");
    let status = msg::encode(&msg::Status {});
    assert!(answer(&master, Opcode::Status, &status).is_ok());
    // Without HA there is no lease to lapse.
    master.lead_until(None);
    assert!(answer(&master, Opcode::Exist, &exist).is_ok());
}

/// In a new leader's recovery, a commit of a key it knows a version of is
/// held like one of a key it knows nothing of: a store not back yet may
/// hold a newer version, which a client reads through the lease an
/// earlier leader granted (chaos finding 23: a segment back first had
/// brought an older version whose destruction its store had missed).
#[test]
fn a_commit_in_recovery_waits_for_old_leases_even_for_a_key_known_here() {
    let cfg = StateConfig::default();
    let half = cfg.lease_ttl / 2;
    let master = Master::new(cfg);
    let s = &master.state;
    let t0 = Instant::now();
    s.begin_term(t0);
    s.expect_segments(Some(vec![SegmentId(1), SegmentId(2)]), t0);
    master.set_role(Role::Recovering(t0 + Duration::from_secs(60)));
    let (store, writer) = (ClientId(1), ClientId(2));
    for (id, name) in [(store, "store"), (writer, "writer")] {
        s.register_client(id, name, t0).unwrap();
    }
    s.mount(store, segment(1), 0, t0).unwrap();
    let upsert = |now: Instant| {
        let item = PutItem {
            key: "k".into(),
            value_len: 10,
            region_len: 100,
        };
        let granted = s.put_start(writer, &[item], &ReplicateConfig::default(), true, now);
        let Ok(PutGrant::Write { generation, .. }) = granted[0] else {
            panic!("{granted:?}");
        };
        let end = msg::encode(&msg::PutEnd {
            client_id: writer,
            items: vec![PutEndItem {
                key: "k".into(),
                generation,
            }],
        });
        let mut fence = None;
        master
            .answer(Opcode::PutEnd, &ADMIN, &end, &mut fence)
            .unwrap();
        fence.and_then(|w| w.not_before)
    };
    let first = upsert(t0);
    assert!(first.is_some_and(|t| t >= t0 + half), "{first:?}");
    let known = upsert(Instant::now());
    assert!(
        known.is_some_and(|t| t >= t0 + half),
        "a key known here, segment 2 still away: {known:?}"
    );
    s.mount(store, segment(2), 0, t0).unwrap();
    // Every segment is back; the replaced versions' destructions, queued
    // before, are not sent yet.
    assert!(upsert(Instant::now()).is_some());
    let (_, through) = s.take_invalidations();
    s.invalidations_sent(through);
    assert_eq!(upsert(Instant::now()), None, "settled");
}

/// A lease granted under paused time blocks remove until it runs out.
#[tokio::test(start_paused = true)]
async fn lease_expires_with_time() {
    let master = Master::new(StateConfig::default());
    let s = &master.state;
    let c = ClientId(7);
    s.register_client(c, "c", Instant::now()).unwrap();
    s.mount(c, segment(1), 0, Instant::now()).unwrap();
    let item = PutItem {
        key: "k".into(),
        value_len: 10,
        region_len: 100,
    };
    let grant = s.put_start(
        c,
        &[item],
        &ReplicateConfig::default(),
        false,
        Instant::now(),
    );
    let Ok(PutGrant::Write { generation, .. }) = grant[0] else {
        panic!("{grant:?}");
    };
    let end = PutEndItem {
        key: "k".into(),
        generation,
    };
    s.put_end(c, &[end], Instant::now())[0].as_ref().unwrap();
    s.get_replica_list(&["k".into()], Instant::now())[0]
        .as_ref()
        .unwrap();
    let lease = StateConfig::default().lease_ttl;
    tokio::time::sleep(lease - Duration::from_secs(1)).await;
    let r = s.remove(&["k".into()], false, Instant::now());
    assert_eq!(r[0].as_ref().unwrap_err().code, Code::ObjectHasLease);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(s.remove(&["k".into()], false, Instant::now())[0].is_ok());
}

/// Grants are bound to the object's key only on segments whose store
/// checks such grants (mounted at protocol 7 or later): a v6 store would
/// take the binding bit for a bad signature and refuse every write.
#[test]
fn grants_are_bound_to_keys_only_where_the_store_checks_them() {
    let secret = kvpool_net::auth::Credentials::parse("a cluster secret long enough").unwrap();
    let grants = CapabilityKey::new(&secret);
    let master = Master::with_shutdown(StateConfig::default(), grants, CancellationToken::new());
    let (store, writer) = (ClientId(1), ClientId(2));
    for (id, name) in [(store, "store"), (writer, "writer")] {
        master
            .state
            .register_client(id, name, Instant::now())
            .unwrap();
    }
    for (id, version) in [(1, 6), (2, msg::Capability::KEY_SINCE)] {
        let mount = msg::encode(&msg::MountSegment {
            client_id: store,
            segment: segment(id),
            objects: 0,
            scan_age_ms: 0,
            possession: [id as u8; 16],
            fence: 1,
            held: Vec::new(),
        });
        let peer = Peer {
            role: PeerRole::Store,
            tenant: None,
            version,
        };
        let (r, _) = master.handle(&mut None, &peer, Opcode::MountSegment, &mount);
        r.unwrap();
    }
    let access_on = |name: &str| {
        let put = msg::encode(&msg::PutStart {
            client_id: writer,
            op: rand::random(),
            items: vec![PutItem {
                key: format!("on-{name}"),
                value_len: 10,
                region_len: 100,
            }],
            config: ReplicateConfig {
                preferred_segments: vec![name.into()],
                ..Default::default()
            },
            upsert: false,
        });
        let (r, _) = master.handle(&mut None, &ADMIN, Opcode::PutStart, &put);
        let mut granted: Vec<msg::WireResult<PutGrant>> = msg::decode(&r.unwrap()).unwrap();
        match granted.remove(0) {
            Ok(PutGrant::Write { replicas, .. }) => replicas[0].cap.expect("signed").access,
            other => panic!("{other:?}"),
        }
    };
    let rw = msg::Capability::READ | msg::Capability::WRITE;
    assert_eq!(access_on("s1"), rw, "a v6 store's segment");
    assert_eq!(access_on("s2"), rw | msg::Capability::KEY);
}
