// Long on purpose: one suite over MasterState's public API, sections by concern sharing the fixtures at the top and the property-test model at the bottom; split files would each copy them.
//! Tests of the master's metadata state through its public API: puts and
//! reads, write ownership, read leases, pins and eviction, client liveness,
//! segment ownership, and a property test of its invariants over random
//! sequences of operations.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Debug;
use std::time::Duration;

use kvpool_master::state::{
    ClientLimits, Evicted, FenceWait, MasterState, MountSpec, StateConfig, Tombstone,
};
use kvpool_master::Refusal;
use kvpool_proto::msg::{
    ClientId, InventoryItem, ObjectLocation, PutEndItem, PutGrant, PutItem, Replica,
    ReplicateConfig, SegmentId, SegmentInfo, TouchItem,
};
use kvpool_proto::tenant::Scope;
use kvpool_proto::{KvResult, MAX_KEY_LEN};
use proptest::prelude::*;
use tokio::time::Instant;

// Mooncake's numbers for the codes the state answers with.
const UNAVAILABLE: i32 = -1010;
const SEGMENT_NOT_FOUND: i32 = -101;
const SEGMENT_ALREADY_EXISTS: i32 = -102;
const CLIENT_NOT_FOUND: i32 = -103;
const NO_AVAILABLE_HANDLE: i32 = -200;
const INVALID_KEY: i32 = -400;
const INVALID_PARAMS: i32 = -600;
const ILLEGAL_CLIENT: i32 = -601;
const REPLICA_IS_NOT_READY: i32 = -703;
const OBJECT_NOT_FOUND: i32 = -704;
const OBJECT_HAS_LEASE: i32 = -706;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
/// Milliseconds in a second, for `Pool::at`.
const SEC: u64 = 1000;
/// Bytes of a region that do not hold value bytes (the object header).
const HEADER: u64 = 64;
/// First usable offset of every segment mounted here.
const BASE: u64 = 4096;
/// Region size used where the size does not matter.
const OBJ: u64 = 64 * KIB;

/// A 1 s read lease, eviction of one object at a time, clients and puts
/// that never expire, and stores dropped at the TTL (no grace); tests override what they are about.
fn config() -> StateConfig {
    StateConfig {
        lease_ttl: Duration::from_secs(1),
        soft_pin_ttl: Duration::from_secs(60),
        high_watermark: 0.95,
        eviction_ratio: 0.01,
        demote_watermark: 0.9,
        promote: true,
        tier_move_timeout: Duration::from_secs(60),
        client_ttl: Duration::from_secs(3600),
        store_grace: Duration::ZERO,
        pending_ttl: Duration::from_secs(3600),
        limits: Default::default(),
        tenants: Default::default(),
    }
}

/// The Mooncake number of an expected error.
/// What the master's invalidation sender does: takes what is queued and
/// reports it sent, which lets the regions waiting on it go.
fn deliver(st: &MasterState) {
    let (_, through) = st.take_invalidations();
    st.invalidations_sent(through);
}

fn code<T: Debug>(r: KvResult<T>) -> i32 {
    r.expect_err("expected an error").code.as_i32()
}

/// An object taking `region_len` bytes, header included.
fn item(key: &str, region_len: u64) -> PutItem {
    PutItem {
        key: key.into(),
        value_len: region_len - HEADER,
        region_len,
    }
}

fn replicas(n: u32) -> ReplicateConfig {
    ReplicateConfig {
        replica_num: n,
        ..Default::default()
    }
}

fn preferring(names: &[&str], n: u32) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: names.iter().map(|s| s.to_string()).collect(),
        ..replicas(n)
    }
}

fn hard_pin() -> ReplicateConfig {
    ReplicateConfig {
        with_hard_pin: true,
        ..replicas(1)
    }
}

fn soft_pin(ttl_ms: Option<u64>) -> ReplicateConfig {
    ReplicateConfig {
        with_soft_pin: true,
        soft_pin_ttl_ms: ttl_ms,
        ..replicas(1)
    }
}

fn segment(id: u128, name: &str, size: u64) -> SegmentInfo {
    SegmentInfo {
        id: SegmentId(id),
        name: name.into(),
        endpoint: format!("10.0.0.{id}:7000"),
        base: BASE,
        size,
        path: None,
        tier: Default::default(),
    }
}

fn segment_ids(reps: &[Replica]) -> Vec<u128> {
    reps.iter().map(|r| r.segment.0).collect()
}

/// A batch of one key.
fn one(key: &str) -> Vec<String> {
    vec![key.to_string()]
}

/// A state under test and the instant its tests count time from.
struct Pool {
    st: MasterState,
    t0: Instant,
    /// Generation of the last put granted per key, for `end`.
    granted: RefCell<HashMap<String, u64>>,
}

impl Pool {
    fn new(cfg: StateConfig) -> Self {
        Pool {
            st: MasterState::new(cfg),
            t0: Instant::now(),
            granted: RefCell::default(),
        }
    }

    /// A pool with client 1 owning one segment (id 1, name "a") of `size` bytes.
    fn with_segment(cfg: StateConfig, size: u64) -> (Self, ClientId) {
        let p = Pool::new(cfg);
        let c = p.client(1);
        p.mount(c, 1, "a", size);
        (p, c)
    }

    /// `ms` milliseconds after the start of the test.
    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// Registers client `id` at the start of the test.
    fn client(&self, id: u128) -> ClientId {
        let c = ClientId(id);
        self.st
            .register_client(c, &format!("host-{id}"), self.t0)
            .expect("register");
        c
    }

    fn mount(&self, owner: ClientId, id: u128, name: &str, size: u64) {
        self.st
            .mount(owner, segment(id, name, size), 0, self.t0)
            .expect("mount");
    }

    fn put_with(
        &self,
        c: ClientId,
        key: &str,
        len: u64,
        cfg: &ReplicateConfig,
        upsert: bool,
        now: Instant,
    ) -> KvResult<PutGrant> {
        let mut r = self.st.put_start(c, &[item(key, len)], cfg, upsert, now);
        assert_eq!(r.len(), 1);
        if let Ok(PutGrant::Write { generation, .. }) = &r[0] {
            self.granted
                .borrow_mut()
                .insert(key.to_string(), *generation);
        }
        r.remove(0)
    }

    /// An insert of one replica.
    fn put(&self, c: ClientId, key: &str, len: u64, now: Instant) -> KvResult<PutGrant> {
        self.put_with(c, key, len, &replicas(1), false, now)
    }

    /// A put that must be granted: its generation and regions.
    fn start_with(
        &self,
        c: ClientId,
        key: &str,
        len: u64,
        cfg: &ReplicateConfig,
        upsert: bool,
        now: Instant,
    ) -> (u64, Vec<Replica>) {
        match self.put_with(c, key, len, cfg, upsert, now) {
            Ok(PutGrant::Write {
                generation,
                replicas,
            }) => (generation, replicas),
            other => panic!("put_start of {key:?}: {other:?}"),
        }
    }

    fn start(&self, c: ClientId, key: &str, len: u64, now: Instant) -> (u64, Vec<Replica>) {
        self.start_with(c, key, len, &replicas(1), false, now)
    }

    fn upsert(&self, c: ClientId, key: &str, len: u64, now: Instant) -> (u64, Vec<Replica>) {
        self.start_with(c, key, len, &replicas(1), true, now)
    }

    /// An insert that must be granted and committed.
    fn commit_with(
        &self,
        c: ClientId,
        key: &str,
        len: u64,
        cfg: &ReplicateConfig,
        now: Instant,
    ) -> (u64, Vec<Replica>) {
        let grant = self.start_with(c, key, len, cfg, false, now);
        self.end(c, key, now).expect("put_end");
        grant
    }

    fn commit(&self, c: ClientId, key: &str, len: u64, now: Instant) -> (u64, Vec<Replica>) {
        self.commit_with(c, key, len, &replicas(1), now)
    }

    /// Commits the last put granted for `key` (generation 0 if none was).
    fn end(&self, c: ClientId, key: &str, now: Instant) -> KvResult<()> {
        let generation = self.granted.borrow().get(key).copied().unwrap_or(0);
        self.end_gen(c, key, generation, now)
    }

    fn end_gen(&self, c: ClientId, key: &str, generation: u64, now: Instant) -> KvResult<()> {
        let item = PutEndItem {
            key: key.to_string(),
            generation,
        };
        self.st.put_end(c, &[item], now).remove(0)
    }

    fn revoke(&self, c: ClientId, key: &str) -> KvResult<()> {
        self.st.put_revoke(c, &one(key), self.t0).remove(0)
    }

    fn get(&self, key: &str, now: Instant) -> KvResult<ObjectLocation> {
        self.st.get_replica_list(&one(key), now).remove(0)
    }

    fn exist(&self, key: &str) -> KvResult<u64> {
        self.st.exist(&one(key)).remove(0)
    }

    fn present(&self, key: &str) -> bool {
        self.exist(key).is_ok()
    }

    fn remove(&self, key: &str, force: bool, now: Instant) -> KvResult<()> {
        self.st.remove(&one(key), force, now).remove(0)
    }

    fn used(&self) -> u64 {
        self.st.status().used
    }

    /// Fills with `n` objects `{prefix}{i}` of `OBJ` bytes, object `i` written
    /// at second `i + 1`, the first `hard` of them hard-pinned.
    fn fill(&self, c: ClientId, prefix: &str, n: u64, hard: u64) {
        for i in 0..n {
            let cfg = if i < hard { hard_pin() } else { replicas(1) };
            self.commit_with(
                c,
                &format!("{prefix}{i}"),
                OBJ,
                &cfg,
                self.at((i + 1) * SEC),
            );
        }
    }
}

// ------------------------------------------------------------ puts and reads

#[test]
fn committed_put_is_readable_and_write_once() {
    let (p, c) = Pool::with_segment(config(), MIB);
    let now = p.at(0);
    let (generation, reps) = p.start(c, "k", 1000, now);
    assert_eq!(segment_ids(&reps), [1]);
    let r = &reps[0];
    assert_eq!(r.endpoint, "10.0.0.1:7000");
    assert!(
        r.len >= 1000 && r.offset >= BASE && r.offset + r.len <= BASE + MIB,
        "{r:?}"
    );

    // Reserved but not visible before the commit.
    assert_eq!(code(p.get("k", now)), OBJECT_NOT_FOUND);
    assert_eq!(code(p.exist("k")), OBJECT_NOT_FOUND);
    assert!(p.st.key_info("k", now).is_none());
    let s = p.st.status();
    assert_eq!((s.keys, s.pending, s.used), (0, 1, r.len));

    p.end(c, "k", now).unwrap();
    let want = ObjectLocation {
        value_len: 1000 - HEADER,
        generation,
        lease_ms: 1000,
        replicas: reps.clone(),
    };
    assert_eq!(p.get("k", now).unwrap(), want);
    assert_eq!(p.exist("k").unwrap(), 1000 - HEADER);
    let s = p.st.status();
    assert_eq!((s.keys, s.pending, s.used), (1, 0, r.len));

    // Write-once: a second insert, by anyone, changes nothing.
    let other = p.client(2);
    assert_eq!(p.put(c, "k", 1000, now).unwrap(), PutGrant::Exists);
    assert_eq!(
        p.put_with(other, "k", 5000, &replicas(2), false, now)
            .unwrap(),
        PutGrant::Exists
    );
    assert_eq!(p.get("k", now).unwrap(), want);
    assert_eq!(p.used(), r.len);

    assert_eq!(code(p.get("missing", now)), OBJECT_NOT_FOUND);
    assert_eq!(code(p.exist("missing")), OBJECT_NOT_FOUND);
}

#[test]
fn bad_keys_and_parameters_are_rejected_per_item() {
    let (p, c) = Pool::with_segment(config(), MIB);
    let now = p.at(0);
    let longest = "y".repeat(MAX_KEY_LEN);
    let items = [
        item("", 128),
        item(&"x".repeat(MAX_KEY_LEN + 1), 128),
        item(&longest, 128),
        PutItem {
            key: "value-bigger-than-region".into(),
            value_len: 200,
            region_len: 100,
        },
        PutItem {
            key: "empty-region".into(),
            value_len: 0,
            region_len: 0,
        },
    ];
    let mut out =
        p.st.put_start(c, &items, &replicas(1), false, now)
            .into_iter();
    assert_eq!(code(out.next().unwrap()), INVALID_KEY);
    assert_eq!(code(out.next().unwrap()), INVALID_KEY);
    let Ok(PutGrant::Write { generation, .. }) = out.next().unwrap() else {
        panic!("the valid item must be granted");
    };
    assert_eq!(code(out.next().unwrap()), INVALID_PARAMS);
    assert_eq!(code(out.next().unwrap()), INVALID_PARAMS);
    assert!(out.next().is_none());
    assert_eq!(
        code(p.put_with(c, "no-replicas", 128, &replicas(0), false, now)),
        INVALID_PARAMS
    );

    // Only the valid item reserved anything.
    let s = p.st.status();
    assert_eq!((s.pending, s.used), (1, 128));
    p.end_gen(c, &longest, generation, now).unwrap();
    assert_eq!(p.exist(&longest).unwrap(), 128 - HEADER);
}

// ------------------------------------------------------------ placement

#[test]
fn replicas_go_to_distinct_and_preferred_segments() {
    let p = Pool::new(config());
    let c = p.client(1);
    p.mount(c, 1, "a", 2 * MIB);
    p.mount(c, 2, "b", MIB);
    let now = p.at(0);
    let placed = |key: &str, cfg: &ReplicateConfig| {
        segment_ids(&p.start_with(c, key, 4 * KIB, cfg, false, now).1)
    };

    // A preferred name first; otherwise drawn by free space (see placement.rs).
    assert_eq!(placed("pref-b", &preferring(&["b"], 1)), [2]);
    assert_eq!(placed("pref-unknown", &preferring(&["zz"], 1)).len(), 1);
    let mut two = placed("two", &replicas(2));
    two.sort_unstable();
    assert_eq!(two, [1, 2]);
    assert_eq!(placed("two-pref", &preferring(&["b", "a"], 2)), [2, 1]);
    // `a` has twice `b`'s room: it takes more of the plain puts, `b` some.
    let on_a = (0..60)
        .filter(|i| placed(&format!("plain-{i}"), &replicas(1)) == [1])
        .count();
    assert!(
        (30..60).contains(&on_a),
        "{on_a} of 60 on the emptier segment"
    );
}

#[test]
fn more_replicas_than_segments_is_best_effort_without_eviction() {
    let p = Pool::new(config());
    let c = p.client(1);
    p.mount(c, 1, "a", MIB);
    p.mount(c, 2, "b", MIB);
    p.fill(c, "o", 4, 0);

    let (_, reps) = p.commit_with(c, "wide", OBJ, &replicas(3), p.at(10 * SEC));
    let mut ids = segment_ids(&reps);
    ids.sort_unstable();
    assert_eq!(ids, [1, 2]);
    assert_eq!(p.get("wide", p.at(10 * SEC)).unwrap().replicas, reps);
    // The pool is mostly empty: nothing had to make room.
    assert_eq!(p.st.evictions(), 0);
    assert!((0..4).all(|i| p.present(&format!("o{i}"))));
    assert_eq!(p.used(), 6 * OBJ);
}

// ------------------------------------------------------------ writers

/// A writer that gave up on an operation it never heard back from cancels
/// it: its puts in flight are revoked (the keys free for its next put, not
/// held until the put timeout), a late `PutStart` of it is refused, and
/// nothing else of the writer's, or of other writers, is touched.
#[test]
fn a_cancelled_operation_frees_its_keys_and_is_refused_if_it_comes_late() {
    let (p, a) = Pool::with_segment(config(), MIB);
    let b = p.client(2);
    let now = p.at(0);
    let start = |c, op, key: &str| {
        p.st.put_start_op((c, op), &[item(key, 4 * KIB)], &replicas(1), true, now)
            .remove(0)
    };
    start(a, 7, "x").unwrap();
    start(a, 7, "y").unwrap();
    start(a, 8, "z").unwrap();
    start(b, 7, "w").unwrap();
    assert_eq!(code(start(a, 9, "x")), REPLICA_IS_NOT_READY);
    assert_eq!(p.st.put_cancel(a, &[7], now), 2);
    assert_eq!(p.st.status().pending, 2, "a's op 8 and b's op 7 stay");
    start(a, 9, "x").unwrap();
    // The cancelled operation's request arriving late starts nothing.
    assert_eq!(code(start(a, 7, "v")), INVALID_PARAMS);
    assert_eq!(p.st.put_cancel(a, &[7, 1234], now), 0);
    assert_eq!(p.st.status().pending, 3);
}

#[test]
fn only_the_writer_ends_or_revokes_and_retries_are_idempotent() {
    let (p, a) = Pool::with_segment(config(), MIB);
    let b = p.client(2);
    let now = p.at(0);
    let grant = p.put(a, "k", 4 * KIB, now).unwrap();

    // The writer's retry gets the same regions, and reserves nothing more.
    assert_eq!(p.put(a, "k", 4 * KIB, now).unwrap(), grant);
    assert_eq!((p.st.status().pending, p.used()), (1, 4 * KIB));

    // So does the same operation asking again, and only it: another call
    // of the same client is another writer (the chaos harness saw a
    // write-once put and an upsert of one client granted one region, both
    // acknowledged, one's bytes in it).
    let it = [item("j", 4 * KIB)];
    let first =
        p.st.put_start_op((a, 7), &it, &replicas(1), true, now)
            .remove(0);
    let again =
        p.st.put_start_op((a, 7), &it, &replicas(1), true, now)
            .remove(0);
    assert_eq!(again, first);
    let other =
        p.st.put_start_op((a, 8), &it, &replicas(1), false, now)
            .remove(0);
    assert_eq!(code(other), REPLICA_IS_NOT_READY);
    p.revoke(a, "j").unwrap();

    // Anyone else must wait, insert or upsert.
    assert_eq!(code(p.put(b, "k", 4 * KIB, now)), REPLICA_IS_NOT_READY);
    assert_eq!(
        code(p.put_with(b, "k", 4 * KIB, &replicas(1), true, now)),
        REPLICA_IS_NOT_READY
    );
    assert_eq!(code(p.end(b, "k", now)), ILLEGAL_CLIENT);
    assert_eq!(code(p.revoke(b, "k")), ILLEGAL_CLIENT);
    assert_eq!(p.st.status().pending, 1);

    p.end(a, "k", now).unwrap();
    // A retried commit (its answer was lost) succeeds again.
    p.end(a, "k", now).unwrap();
    let PutGrant::Write {
        generation,
        replicas: reps,
    } = grant
    else {
        unreachable!()
    };
    let loc = p.get("k", now).unwrap();
    assert_eq!((loc.generation, loc.replicas), (generation, reps));

    assert_eq!(code(p.end(a, "never-started", now)), OBJECT_NOT_FOUND);
    assert_eq!(code(p.revoke(a, "never-started")), OBJECT_NOT_FOUND);
    assert_eq!(code(p.put(ClientId(99), "x", 128, now)), CLIENT_NOT_FOUND);
}

/// A revoked put's key is gone at once; its space comes back once every
/// write grant on it has expired (a pending TTL), since a write of its
/// writer may still be on its way: the chaos harness saw such a late write
/// land on an object placed in the same region meanwhile.
#[test]
fn revoke_frees_the_space_and_hides_the_key() {
    let cfg = StateConfig {
        pending_ttl: Duration::from_secs(5),
        ..config()
    };
    let (p, c) = Pool::with_segment(cfg, MIB);
    let now = p.at(0);
    let (_, first) = p.start(c, "k", OBJ, now);
    assert_eq!(p.used(), OBJ);

    p.revoke(c, "k").unwrap();
    let s = p.st.status();
    assert_eq!(
        (s.keys, s.pending, s.used, s.segments[0].regions),
        (0, 0, OBJ, 1),
        "held while a write granted on it may still land"
    );
    // A put now gets other room.
    let (_, other) = p.start(c, "j", OBJ, now);
    assert_ne!(other[0].offset, first[0].offset);
    p.revoke(c, "j").unwrap();
    p.st.sweep(p.at(5 * SEC));
    deliver(&p.st);
    let s = p.st.status();
    assert_eq!(
        (s.keys, s.pending, s.used, s.segments[0].regions),
        (0, 0, 0, 0)
    );
    assert_eq!(code(p.get("k", now)), OBJECT_NOT_FOUND);
    assert_eq!(code(p.exist("k")), OBJECT_NOT_FOUND);
    assert_eq!(code(p.end(c, "k", now)), OBJECT_NOT_FOUND);
    assert_eq!(code(p.revoke(c, "k")), OBJECT_NOT_FOUND);

    // The freed space is handed out again.
    let (g1, second) = p.commit(c, "k", OBJ, now);
    assert_eq!(second, first);

    // Revoking an upsert keeps the committed version.
    p.upsert(c, "k", OBJ, now);
    assert_eq!(p.used(), 2 * OBJ);
    p.revoke(c, "k").unwrap();
    assert_eq!(p.get("k", now).unwrap().generation, g1);
    assert_eq!(p.used(), 2 * OBJ, "the revoked upsert's region is held");
    p.st.sweep(p.at(10 * SEC));
    deliver(&p.st);
    assert_eq!(p.used(), OBJ);
}

// ------------------------------------------------------------ leases

/// A client's report of reads through cached locations counts as reads
/// made when they happened: the lease runs from then. A report about a
/// replaced version changes nothing.
#[test]
fn touches_extend_leases_of_the_version_read() {
    let (p, c) = Pool::with_segment(config(), MIB);
    let (g, _) = p.commit(c, "k", OBJ, p.at(0));
    let touch = |generation, age_ms: u64, now| {
        let item = TouchItem {
            key: "k".into(),
            generation,
            age_us: age_ms * 1000,
        };
        p.st.touch(&[item], now)
    };
    // Read 100 ms before the report at 600, with a 1 s lease: until 1500.
    assert_eq!(touch(g, 100, p.at(600)), vec![true]);
    assert_eq!(
        p.st.key_info("k", p.at(600)).unwrap().lease_remaining_ms,
        900
    );
    assert_eq!(touch(g + 1, 0, p.at(700)), vec![false]);
    assert_eq!(
        p.st.key_info("k", p.at(700)).unwrap().lease_remaining_ms,
        800
    );
    assert_eq!(code(p.remove("k", false, p.at(1400))), OBJECT_HAS_LEASE);
    p.remove("k", false, p.at(1500)).unwrap();
    assert_eq!(touch(g, 0, p.at(1600)), vec![false], "gone");
}

/// A leased existence check (Mooncake's `is_exist`) holds the object as a
/// read does, and answers the size; a plain one holds nothing.
#[test]
fn a_leased_existence_check_leases_as_a_read_does() {
    let (p, c) = Pool::with_segment(config(), MIB);
    p.commit(c, "k", OBJ, p.at(0));
    assert_eq!(p.exist("k").unwrap(), OBJ - HEADER);
    assert!(p.st.key_info("k", p.at(0)).unwrap().lease_remaining_ms == 0);
    let keys = [String::from("k"), String::from("missing")];
    let got = p.st.exist_leased(&keys, p.at(300));
    assert_eq!(got[0].as_ref().ok(), Some(&(OBJ - HEADER)));
    assert_eq!(code(got[1].clone()), OBJECT_NOT_FOUND);
    assert_eq!(code(p.remove("k", false, p.at(1200))), OBJECT_HAS_LEASE);
    p.remove("k", false, p.at(1301)).unwrap();
}

/// Every key in the listing's pages, following cursors to the end; also
/// checks each page against `limit`.
fn list_all(st: &MasterState, keep: &dyn Fn(&str) -> bool, limit: usize) -> Vec<(String, u64)> {
    let (mut all, mut from, mut pages) = (Vec::new(), (0, 0), 0);
    loop {
        let (page, next) = st.list_keys(keep, from, limit, usize::MAX);
        assert!(page.len() <= limit, "page of {} over {limit}", page.len());
        all.extend(page);
        pages += 1;
        assert!(pages < 10_000, "the listing does not end");
        match next {
            Some(n) => {
                assert!(n > from, "cursor {n:?} does not move on from {from:?}");
                from = n;
            }
            None => return all,
        }
    }
}

/// A listing pages through the object table: each key held throughout is
/// listed once with its size, pages keep to the limit, the prefix filters,
/// and a tenant's scope sees its own namespace only.
#[test]
fn listing_keys_pages_through_each_key_once() {
    let (p, c) = Pool::with_segment(config(), 64 * MIB);
    let t = kvpool_proto::tenant::prefix("acme");
    let mut want: Vec<String> = (0..300).map(|i| format!("m1@{i}")).collect();
    want.extend((0..50).map(|i| format!("m2@{i}")));
    for k in &want {
        p.commit(c, k, BASE, p.at(0));
    }
    for i in 0..40 {
        p.commit(c, &format!("{t}m1@{i}"), BASE, p.at(0));
    }
    // A put in flight is not listed.
    p.start_with(c, "m1@pending", BASE, &replicas(1), false, p.at(0));
    let sorted = |mut v: Vec<(String, u64)>| {
        v.sort();
        v
    };
    let untenanted = |k: &str| Scope::Untenanted.may_write(k);
    let got = sorted(list_all(&p.st, &untenanted, 7));
    let mut expect: Vec<(String, u64)> = want.iter().map(|k| (k.clone(), BASE - HEADER)).collect();
    expect.sort();
    assert_eq!(got, expect);
    let m2 = |k: &str| k.starts_with("m2@") && Scope::Untenanted.may_write(k);
    assert_eq!(list_all(&p.st, &m2, 1000).len(), 50);
    let acme = |k: &str| k.starts_with(&format!("{t}m1@")) && Scope::Tenant("acme").may_write(k);
    let got = list_all(&p.st, &acme, 16);
    assert_eq!(got.len(), 40);
    assert!(got.iter().all(|(k, _)| k.starts_with(&t)));
    let other = |k: &str| Scope::Tenant("other").may_write(k);
    assert!(list_all(&p.st, &other, 100).is_empty());
    // A cursor past the last shard ends the listing.
    assert_eq!(
        p.st.list_keys(|_| true, (u32::MAX, 0), 10, usize::MAX),
        (vec![], None)
    );
}

/// A page that matches nothing still ends after a bounded walk (65,536
/// slots), with a cursor to go on: no call walks every key.
#[test]
fn a_listing_page_is_bounded_work_even_when_nothing_matches() {
    let (p, c) = Pool::with_segment(config(), 2048 * MIB);
    for i in 0..80_000 {
        p.commit(c, &format!("k{i}"), BASE, p.at(0));
    }
    let (page, next) = p.st.list_keys(|_| false, (0, 0), 10, usize::MAX);
    assert!(page.is_empty());
    let next = next.expect("stopped before the end");
    assert!(next.0 < 4096, "{next:?}");
    assert_eq!(list_all(&p.st, &|k: &str| k == "k79999", 10).len(), 1);
    // A page ends at its byte budget, holding one key at least.
    let (page, next) = p.st.list_keys(|_| true, (0, 0), 10, 1);
    assert_eq!(page.len(), 1);
    assert!(next.is_some());
}

#[test]
fn remove_waits_for_read_leases_unless_forced() {
    let (p, c) = Pool::with_segment(config(), MIB);
    p.commit(c, "k", OBJ, p.at(0));
    p.get("k", p.at(0)).unwrap();
    assert_eq!(
        p.st.key_info("k", p.at(400)).unwrap().lease_remaining_ms,
        600
    );
    assert_eq!(code(p.remove("k", false, p.at(500))), OBJECT_HAS_LEASE);
    // A second read extends the lease.
    p.get("k", p.at(800)).unwrap();
    assert_eq!(code(p.remove("k", false, p.at(1200))), OBJECT_HAS_LEASE);
    assert_eq!(p.exist("k").unwrap(), OBJ - HEADER);
    p.remove("k", false, p.at(1801)).unwrap();
    assert_eq!(code(p.exist("k")), OBJECT_NOT_FOUND);
    assert_eq!(code(p.remove("k", false, p.at(1801))), OBJECT_NOT_FOUND);

    let (_, f) = p.commit(c, "f", OBJ, p.at(0));
    p.get("f", p.at(0)).unwrap();
    p.remove("f", true, p.at(100)).unwrap();
    assert_eq!(code(p.get("f", p.at(100))), OBJECT_NOT_FOUND);
    assert_eq!(code(p.exist("f")), OBJECT_NOT_FOUND);
    // A forced remove frees at once (docs/operations.md): a reader still in
    // flight fails its header or checksum check instead.
    assert_eq!(p.used(), 0);
    let (_, reused) = p.start(c, "new", OBJ, p.at(100));
    assert_eq!(reused, f);
}

#[test]
fn replaced_version_under_lease_is_reused_only_after_the_lease() {
    // Three of the four objects are pinned: past the pool's default share.
    let (p, c) = Pool::with_segment(limited(|l| l.max_hard_pinned_ratio = 1.0), 4 * OBJ);
    p.fill(c, "pin", 2, 2);
    let (_, old) = p.commit(c, "k", OBJ, p.at(3 * SEC));
    p.get("k", p.at(10 * SEC)).unwrap();
    // The upsert takes the last free slot, pinned so that nothing is evictable.
    p.start_with(c, "k", OBJ, &hard_pin(), true, p.at(10 * SEC));
    p.end(c, "k", p.at(10_500)).unwrap();

    // The old bytes stay reserved while a reader may still be reading them.
    assert_eq!(p.used(), 4 * OBJ);
    assert_eq!(
        code(p.put(c, "new", OBJ, p.at(10_500))),
        NO_AVAILABLE_HANDLE
    );
    p.st.sweep(p.at(10_900));
    assert_eq!(p.used(), 4 * OBJ);
    assert_eq!(p.st.evictions(), 0);

    p.st.sweep(p.at(11_001));
    assert_eq!(p.used(), 3 * OBJ);
    let (_, reused) = p.start(c, "new", OBJ, p.at(11_001));
    assert_eq!(reused, old);
}

// ------------------------------------------------------------ eviction

#[test]
fn eviction_takes_the_least_recently_read_first() {
    let (p, c) = Pool::with_segment(config(), 16 * OBJ);
    p.fill(c, "o", 16, 0);
    assert_eq!(p.used(), 16 * OBJ);
    assert!(p.st.above_watermark());

    // o0 is read (refreshed); o1 is only checked for, which keeps it old.
    p.get("o0", p.at(20 * SEC)).unwrap();
    p.exist("o1").unwrap();

    let mut live: Vec<String> = (0..16).map(|i| format!("o{i}")).collect();
    let mut order = Vec::new();
    for i in 0..16 {
        p.commit(c, &format!("n{i}"), OBJ, p.at(30 * SEC + i));
        let (gone, kept): (Vec<String>, Vec<String>) =
            live.into_iter().partition(|k| !p.present(k));
        assert_eq!(gone.len(), 1, "put {i} evicted {gone:?}");
        order.extend(gone);
        live = kept;
    }
    let mut want: Vec<String> = (1..16).map(|i| format!("o{i}")).collect();
    want.push("o0".into());
    assert_eq!(order, want);
    assert_eq!(p.st.evictions(), 16);
    assert_eq!(p.st.status().evictions, 16);
}

#[test]
fn pins_and_leases_constrain_eviction() {
    let (p, c) = Pool::with_segment(config(), 4 * OBJ);
    p.commit_with(c, "hard", OBJ, &hard_pin(), p.at(SEC));
    p.commit_with(c, "soft", OBJ, &soft_pin(None), p.at(2 * SEC));
    p.commit(c, "plain", OBJ, p.at(3 * SEC));
    p.commit(c, "read", OBJ, p.at(4 * SEC));
    let now = p.at(10 * SEC);
    p.get("read", now).unwrap();

    // Unpinned first even though the soft-pinned one is older; leased skipped.
    p.start(c, "n0", OBJ, now);
    assert!(!p.present("plain"));
    p.start(c, "n1", OBJ, now);
    assert!(!p.present("soft"));
    // Left: a hard pin, a leased object, two puts in flight.
    assert_eq!(code(p.put(c, "n2", OBJ, now)), NO_AVAILABLE_HANDLE);
    assert!(p.present("hard") && p.present("read"));
    let s = p.st.status();
    assert_eq!((s.keys, s.pending, s.used, s.evictions), (2, 2, 4 * OBJ, 2));

    // Once the lease is over, the leased object can go; the hard pin never.
    let later = p.at(11_001);
    p.start(c, "n2", OBJ, later);
    assert!(!p.present("read"));
    assert_eq!(code(p.put(c, "n3", OBJ, later)), NO_AVAILABLE_HANDLE);
    assert!(p.present("hard"));
    assert_eq!(p.st.evictions(), 3);
}

#[test]
fn expired_soft_pin_no_longer_protects() {
    let (p, c) = Pool::with_segment(config(), 2 * OBJ);
    p.commit_with(c, "soft", OBJ, &soft_pin(Some(2000)), p.at(0));
    p.commit(c, "plain", OBJ, p.at(SEC));
    assert_eq!(
        p.st.key_info("soft", p.at(500))
            .unwrap()
            .soft_pin_remaining_ms,
        Some(1500)
    );
    assert_eq!(
        p.st.key_info("plain", p.at(500))
            .unwrap()
            .soft_pin_remaining_ms,
        None
    );

    p.commit(c, "n0", OBJ, p.at(1500));
    assert!(p.present("soft") && !p.present("plain"));
    // Past its pin, "soft" is just the least recently used object.
    p.commit(c, "n1", OBJ, p.at(3 * SEC));
    assert!(!p.present("soft") && p.present("n0"));
}

#[test]
fn full_pool_of_leased_and_pinned_objects_refuses_puts_without_loss() {
    let (p, c) = Pool::with_segment(config(), 4 * OBJ);
    p.fill(c, "o", 4, 2);
    let now = p.at(10 * SEC);
    p.get("o2", now).unwrap();
    p.get("o3", now).unwrap();

    assert_eq!(code(p.put(c, "new", OBJ, now)), NO_AVAILABLE_HANDLE);
    assert_eq!(code(p.put(c, "tiny", 64, now)), NO_AVAILABLE_HANDLE);
    assert!((0..4).all(|i| p.present(&format!("o{i}"))));
    let s = p.st.status();
    assert_eq!((s.keys, s.pending, s.used, s.evictions), (4, 0, 4 * OBJ, 0));
}

#[test]
fn evict_frees_at_least_the_configured_ratio() {
    let cfg = StateConfig {
        eviction_ratio: 0.25,
        ..config()
    };
    let (p, c) = Pool::with_segment(cfg, 16 * OBJ);
    p.fill(c, "o", 16, 4);
    assert!(p.st.above_watermark());
    let now = p.at(20 * SEC);
    let gone = |from: u64, to: u64| (from..to).all(|i| !p.present(&format!("o{i}")));

    // A quarter of the capacity, oldest unpinned first.
    assert_eq!(
        p.st.evict(now, 0),
        Evicted {
            objects: 4,
            bytes: 4 * OBJ
        }
    );
    assert!(gone(4, 8) && p.present("o8"));
    assert!(!p.st.above_watermark());
    // More when asked for more.
    assert_eq!(
        p.st.evict(now, 4 * OBJ + 1),
        Evicted {
            objects: 5,
            bytes: 5 * OBJ
        }
    );
    assert!(gone(8, 13) && p.present("o13"));
    // As much as possible when not enough is evictable.
    assert_eq!(
        p.st.evict(now, 16 * OBJ),
        Evicted {
            objects: 3,
            bytes: 3 * OBJ
        }
    );
    assert_eq!(p.st.evict(now, 0), Evicted::default());
    assert!((0..4).all(|i| p.present(&format!("o{i}"))));
    assert_eq!(p.used(), 4 * OBJ);
    assert_eq!(p.st.evictions(), 12);
}

#[test]
fn a_batch_into_a_full_pool_is_placed_on_the_room_its_evictions_make() {
    // The batch reads the segments' free space once; every object here
    // finds none there and must look again after evicting.
    let (p, c) = Pool::with_segment(config(), 4 * OBJ);
    p.mount(c, 2, "b", 4 * OBJ);
    p.fill(c, "o", 8, 0);
    let now = p.at(20 * SEC);
    let items: Vec<PutItem> = (0..4).map(|i| item(&format!("new{i}"), OBJ)).collect();
    let grants = p.st.put_start(c, &items, &replicas(1), false, now);
    for (i, g) in grants.iter().enumerate() {
        assert!(matches!(g, Ok(PutGrant::Write { .. })), "new{i}: {g:?}");
    }
    assert!(p.st.evictions() >= 4);
}

#[test]
fn a_batch_spreads_over_equal_segments() {
    let (p, c) = Pool::with_segment(config(), 64 * OBJ);
    for (id, name) in [(2, "b"), (3, "c"), (4, "d")] {
        p.mount(c, id, name, 64 * OBJ);
    }
    let items: Vec<PutItem> = (0..64).map(|i| item(&format!("k{i}"), OBJ)).collect();
    let mut per_segment: HashMap<SegmentId, u32> = HashMap::new();
    for g in p.st.put_start(c, &items, &replicas(1), false, p.at(0)) {
        let Ok(PutGrant::Write { replicas, .. }) = g else {
            panic!("{g:?}")
        };
        *per_segment.entry(replicas[0].segment).or_default() += 1;
    }
    assert_eq!(per_segment.len(), 4, "{per_segment:?}");
    assert!(per_segment.values().all(|n| *n >= 5), "{per_segment:?}");
}

// ------------------------------------------------------------ upsert

#[test]
fn upsert_publishes_the_new_version_on_commit() {
    let (p, c) = Pool::with_segment(config(), MIB);
    let now = p.at(0);
    let (g1, r1) = p.commit(c, "k", 4 * KIB, now);
    let (g2, r2) = p.upsert(c, "k", 8 * KIB, now);
    assert!(g2 > g1, "{g2} after {g1}");
    assert_ne!(r1, r2);

    // The old version is served until the new one is committed.
    let old = p.get("k", now).unwrap();
    assert_eq!(
        (old.generation, old.value_len, &old.replicas),
        (g1, 4 * KIB - HEADER, &r1)
    );
    assert!(p.st.key_info("k", now).unwrap().put_in_flight);
    p.end(c, "k", p.at(100)).unwrap();
    let new = p.get("k", p.at(100)).unwrap();
    assert_eq!(
        (new.generation, new.value_len, &new.replicas),
        (g2, 8 * KIB - HEADER, &r2)
    );
    assert!(!p.st.key_info("k", p.at(100)).unwrap().put_in_flight);

    // The old regions were read under a lease: freed when it ends.
    assert_eq!(p.used(), 12 * KIB);
    p.st.sweep(p.at(1001));
    assert_eq!(p.used(), 8 * KIB);

    // Unread old regions are freed at once.
    let later = p.at(5 * SEC);
    let (g3, r3) = p.upsert(c, "k", 4 * KIB, later);
    assert!(g3 > g2);
    p.end(c, "k", later).unwrap();
    assert_eq!(p.used(), 4 * KIB);
    assert_eq!(p.get("k", later).unwrap().replicas, r3);

    // An upsert of a new key is a plain put.
    let (g4, _) = p.upsert(c, "fresh", 4 * KIB, later);
    p.end(c, "fresh", later).unwrap();
    assert_eq!(p.get("fresh", later).unwrap().generation, g4);
}

// ------------------------------------------------------------ liveness

#[test]
fn silent_client_loses_its_segment_and_puts() {
    let p = Pool::new(StateConfig {
        client_ttl: Duration::from_secs(10),
        ..config()
    });
    let (s1, s2, w) = (p.client(1), p.client(2), p.client(3));
    let reply = p.st.register_client(w, "host-3", p.t0).expect("register");
    assert_eq!(
        (reply.heartbeat_interval_ms, reply.client_ttl_ms),
        (1000, 10_000)
    );
    p.mount(s1, 1, "s1", MIB);
    p.mount(s2, 2, "s2", MIB);
    let now = p.at(SEC);
    let (_, solo) = p.commit_with(w, "solo", OBJ, &preferring(&["s1"], 1), now);
    let (_, both) = p.commit_with(w, "both", OBJ, &preferring(&["s1", "s2"], 2), now);
    let (_, safe) = p.commit_with(w, "safe", OBJ, &preferring(&["s2"], 1), now);
    assert_eq!(
        (segment_ids(&solo), segment_ids(&both), segment_ids(&safe)),
        (vec![1], vec![1, 2], vec![2])
    );
    // The dying client writes to the surviving segment; w writes to the dying one.
    p.start_with(s1, "s1-put", OBJ, &preferring(&["s2"], 1), false, now);
    p.start_with(w, "w-put", OBJ, &preferring(&["s1"], 1), false, now);

    assert!(p.st.heartbeat(s2, p.at(8 * SEC)) && p.st.heartbeat(w, p.at(8 * SEC)));
    assert!(p.st.sweep(p.at(9 * SEC)).is_empty());
    assert_eq!(p.st.sweep(p.at(12 * SEC)), vec![s1]);

    let s = p.st.status();
    assert_eq!(
        s.segments.iter().map(|s| s.info.id).collect::<Vec<_>>(),
        [SegmentId(2)]
    );
    assert_eq!((s.clients, s.keys, s.pending), (2, 2, 0));
    // The dying client's put on s2 is held until its write grant expires.
    assert_eq!((s.used, s.segments[0].regions), (3 * OBJ, 3));
    let now = p.at(12 * SEC);
    assert_eq!(code(p.get("solo", now)), OBJECT_NOT_FOUND);
    assert_eq!(p.get("both", now).unwrap().replicas, both[1..]);
    assert_eq!(p.get("safe", now).unwrap().replicas, safe);
    assert_eq!(code(p.end(w, "w-put", now)), OBJECT_NOT_FOUND);

    assert!(!p.st.heartbeat(s1, now));
    assert_eq!(code(p.put(s1, "x", 128, now)), CLIENT_NOT_FOUND);
    assert_eq!(
        code(p.st.mount(s1, segment(1, "s1", MIB), 0, p.t0)),
        CLIENT_NOT_FOUND
    );

    // Back after registering again, with an empty segment.
    p.st.register_client(s1, "host-1", now).expect("register");
    p.mount(s1, 1, "s1", MIB);
    assert_eq!(
        p.st.status()
            .segments
            .iter()
            .map(|s| s.used)
            .collect::<Vec<_>>(),
        [0, 3 * OBJ]
    );
}

#[test]
fn stale_puts_in_flight_are_revoked_by_sweep() {
    let cfg = StateConfig {
        pending_ttl: Duration::from_secs(5),
        ..config()
    };
    let (p, c) = Pool::with_segment(cfg, MIB);
    let (g1, _) = p.commit(c, "old", OBJ, p.at(0));
    p.start(c, "fresh", OBJ, p.at(0));
    p.upsert(c, "old", OBJ, p.at(0));
    p.start(c, "late", OBJ, p.at(3 * SEC));

    assert!(p.st.heartbeat(c, p.at(4 * SEC)));
    assert!(p.st.sweep(p.at(4 * SEC)).is_empty());
    assert_eq!(p.st.status().pending, 3);
    assert!(p.st.sweep(p.at(6 * SEC)).is_empty());
    let s = p.st.status();
    // The two revoked puts' regions are held until their grants expire.
    assert_eq!((s.keys, s.pending, s.used), (1, 1, 4 * OBJ));
    assert_eq!(code(p.end(c, "fresh", p.at(6 * SEC))), OBJECT_NOT_FOUND);
    assert_eq!(p.get("old", p.at(6 * SEC)).unwrap().generation, g1);
    p.end(c, "late", p.at(6 * SEC)).unwrap();
    assert_eq!(p.exist("late").unwrap(), OBJ - HEADER);
    assert!(p.st.heartbeat(c, p.at(11 * SEC)));
    assert!(p.st.sweep(p.at(11 * SEC)).is_empty());
    deliver(&p.st);
    assert_eq!(p.st.status().used, 2 * OBJ, "the held regions are back");
}

// ------------------------------------------------------------ segments

#[test]
fn segment_mount_and_unmount_rules() {
    let p = Pool::new(config());
    let (a, b) = (p.client(1), p.client(2));
    assert_eq!(
        code(p.st.mount(ClientId(9), segment(1, "a", MIB), 0, p.t0)),
        CLIENT_NOT_FOUND
    );
    assert_eq!(
        code(p.st.mount(a, segment(1, "a", 0), 0, p.t0)),
        INVALID_PARAMS
    );
    p.mount(a, 1, "a", MIB);
    let now = p.at(0);
    p.commit(a, "k", OBJ, now);

    // Mounting again is harmless for the owner; another shape under the same
    // id is refused. (Another client mounting it is a store restart: see
    // `restarted_store_takes_over_its_segment`.)
    p.st.mount(a, segment(1, "a", MIB), 0, p.t0).unwrap();
    assert_eq!((p.st.status().segments.len(), p.used()), (1, OBJ));
    assert!(p.present("k"));
    assert_eq!(
        code(p.st.mount(a, segment(1, "a", 2 * MIB), 0, p.t0)),
        SEGMENT_ALREADY_EXISTS
    );

    assert_eq!(code(p.st.unmount(b, SegmentId(1))), ILLEGAL_CLIENT);
    assert!(p.present("k"));
    assert_eq!(code(p.st.unmount(a, SegmentId(7))), SEGMENT_NOT_FOUND);
    p.st.unmount(a, SegmentId(1)).unwrap();
    let s = p.st.status();
    assert_eq!((s.segments.len(), s.keys, s.capacity, s.used), (0, 0, 0, 0));
    assert_eq!(code(p.get("k", now)), OBJECT_NOT_FOUND);
    assert_eq!(code(p.st.unmount(a, SegmentId(1))), SEGMENT_NOT_FOUND);
    assert_eq!(code(p.put(a, "k", OBJ, now)), NO_AVAILABLE_HANDLE);
}

#[test]
fn remove_matching_and_status_counts() {
    let p = Pool::new(config());
    let (a, b) = (p.client(1), p.client(2));
    p.mount(b, 2, "b", MIB);
    p.mount(a, 1, "a", MIB);
    let now = p.at(0);
    for k in ["a/1", "a/2", "a/3", "b/1"] {
        p.commit(a, k, 4 * KIB, now);
    }
    p.start(b, "a/pending", 4 * KIB, now);
    p.get("a/1", now).unwrap();

    let s = p.st.status();
    assert_eq!(
        (
            s.keys,
            s.pending,
            s.used,
            s.capacity,
            s.clients,
            s.evictions
        ),
        (4, 1, 20 * KIB, 2 * MIB, 2, 0)
    );
    assert_eq!(
        s.segments
            .iter()
            .map(|s| s.info.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(s.segments.iter().map(|s| s.regions).sum::<u64>(), 5);

    let in_a = |k: &str| k.starts_with("a/");
    assert_eq!(p.st.remove_matching(in_a, false, now), 2);
    assert!(p.present("a/1") && !p.present("a/2") && !p.present("a/3"));
    assert_eq!(p.st.remove_matching(in_a, true, now), 1);
    let s = p.st.status();
    assert_eq!((s.keys, s.pending), (1, 1));
    assert_eq!(p.st.remove_matching(|_| true, false, p.at(500)), 1);
    let s = p.st.status();
    assert_eq!((s.keys, s.pending, s.used), (0, 1, 4 * KIB));
    p.end(b, "a/pending", p.at(500)).unwrap();
    assert_eq!(p.st.status().keys, 1);
}

// ------------------------------------------------------------ property test

const KEYS: usize = 4;
const CLIENTS: usize = 2;
const SEGMENT: u64 = 32 * KIB;
const LEASE: Duration = Duration::from_secs(1);
const PENDING_TTL: Duration = Duration::from_secs(4);
const RATIO: f64 = 0.1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pin {
    None,
    Soft,
    Hard,
}

#[derive(Debug, Clone)]
enum Op {
    Put {
        client: usize,
        key: usize,
        region: u64,
        replicas: u32,
        upsert: bool,
        pin: Pin,
    },
    End {
        client: usize,
        key: usize,
    },
    Revoke {
        client: usize,
        key: usize,
    },
    Get {
        key: usize,
    },
    Remove {
        key: usize,
        force: bool,
    },
    Evict,
    /// Advance the clock, then sweep.
    Advance {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let client = 0..CLIENTS;
    let key = 0..KEYS;
    let region = prop::sample::select(vec![KIB, 4 * KIB, 8 * KIB, 12 * KIB]);
    let pin = prop_oneof![6 => Just(Pin::None), 2 => Just(Pin::Soft), 1 => Just(Pin::Hard)];
    prop_oneof![
        4 => (client.clone(), key.clone(), region, 1..=3u32, any::<bool>(), pin).prop_map(
            |(client, key, region, replicas, upsert, pin)| Op::Put { client, key, region, replicas, upsert, pin }
        ),
        3 => (client.clone(), key.clone()).prop_map(|(client, key)| Op::End { client, key }),
        1 => (client, key.clone()).prop_map(|(client, key)| Op::Revoke { client, key }),
        2 => key.clone().prop_map(|key| Op::Get { key }),
        1 => (key, any::<bool>()).prop_map(|(key, force)| Op::Remove { key, force }),
        1 => Just(Op::Evict),
        2 => (0..1500u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// A version as the model expects it.
#[derive(Debug, Clone)]
struct Version {
    generation: u64,
    value_len: u64,
    replicas: Vec<Replica>,
    lease_until: Instant,
    hard: bool,
    /// The client that put it (its hard pin counts against that client).
    owner: usize,
}

#[derive(Debug)]
struct InFlight {
    owner: usize,
    started: Instant,
    version: Version,
}

/// The state under test beside a model of what it must hold.
struct Sim {
    st: MasterState,
    clients: [ClientId; CLIENTS],
    now: Instant,
    committed: HashMap<usize, Version>,
    pending: HashMap<usize, InFlight>,
    /// Regions of versions replaced under a lease, with its end.
    deferred: Vec<(Instant, Replica)>,
    last_generation: u64,
    evicted: u64,
}

fn key_name(k: usize) -> String {
    format!("key-{k}")
}

fn bytes(reps: &[Replica]) -> u64 {
    reps.iter().map(|r| r.len).sum()
}

impl Sim {
    fn new() -> Self {
        let st = MasterState::new(StateConfig {
            lease_ttl: LEASE,
            soft_pin_ttl: Duration::from_secs(3),
            high_watermark: 0.9,
            eviction_ratio: RATIO,
            demote_watermark: 0.9,
            promote: true,
            tier_move_timeout: Duration::from_secs(60),
            client_ttl: Duration::from_secs(24 * 3600),
            store_grace: Duration::ZERO,
            pending_ttl: PENDING_TTL,
            limits: Default::default(),
            tenants: Default::default(),
        });
        let now = Instant::now();
        let clients = [ClientId(1), ClientId(2)];
        for (i, c) in clients.iter().enumerate() {
            st.register_client(*c, "host", now).expect("register");
            st.mount(
                *c,
                segment(i as u128 + 1, &format!("s{i}"), SEGMENT),
                0,
                now,
            )
            .expect("mount");
        }
        Sim {
            st,
            clients,
            now,
            committed: HashMap::new(),
            pending: HashMap::new(),
            deferred: Vec::new(),
            last_generation: 0,
            evicted: 0,
        }
    }

    /// A version replaced by an upsert: its regions wait for its lease.
    fn release(&mut self, v: Version) {
        if v.lease_until > self.now {
            self.deferred
                .extend(v.replicas.into_iter().map(|r| (v.lease_until, r)));
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.now;
        match *op {
            Op::Put {
                client,
                key,
                region,
                replicas,
                upsert,
                pin,
            } => {
                let cfg = ReplicateConfig {
                    replica_num: replicas,
                    with_soft_pin: pin == Pin::Soft,
                    with_hard_pin: pin == Pin::Hard,
                    ..Default::default()
                };
                let it = item(&key_name(key), region);
                let got = self
                    .st
                    .put_start(
                        self.clients[client],
                        std::slice::from_ref(&it),
                        &cfg,
                        upsert,
                        now,
                    )
                    .remove(0);
                match self.pending.get(&key) {
                    Some(p) if p.owner == client && p.version.value_len == it.value_len => {
                        let want = PutGrant::Write {
                            generation: p.version.generation,
                            replicas: p.version.replicas.clone(),
                        };
                        prop_assert_eq!(got, Ok(want));
                    }
                    Some(_) => prop_assert_eq!(code(got), REPLICA_IS_NOT_READY),
                    None if self.committed.contains_key(&key) && !upsert => {
                        prop_assert_eq!(got, Ok(PutGrant::Exists))
                    }
                    None => match got {
                        Ok(PutGrant::Write {
                            generation,
                            replicas: reps,
                        }) => {
                            prop_assert!(
                                (1..=replicas.min(2) as usize).contains(&reps.len()),
                                "{reps:?}"
                            );
                            prop_assert!(
                                reps.len() < 2 || reps[0].segment != reps[1].segment,
                                "{reps:?}"
                            );
                            prop_assert!(reps.iter().all(|r| r.len >= region), "{reps:?}");
                            prop_assert!(generation > self.last_generation);
                            self.last_generation = generation;
                            let version = Version {
                                generation,
                                value_len: it.value_len,
                                replicas: reps,
                                lease_until: now,
                                hard: pin == Pin::Hard,
                                owner: client,
                            };
                            self.pending.insert(
                                key,
                                InFlight {
                                    owner: client,
                                    started: now,
                                    version,
                                },
                            );
                        }
                        other => prop_assert_eq!(code(other), NO_AVAILABLE_HANDLE),
                    },
                }
                self.check(true).map(drop)
            }
            Op::End { client, key } => {
                // The writer commits what it was granted; anyone else retries the
                // committed generation (must succeed only for that version).
                let generation = match (self.pending.get(&key), self.committed.get(&key)) {
                    (Some(p), _) => p.version.generation,
                    (None, Some(v)) => v.generation,
                    (None, None) => 0,
                };
                let item = PutEndItem {
                    key: key_name(key),
                    generation,
                };
                let got = self
                    .st
                    .put_end(self.clients[client], &[item], now)
                    .remove(0);
                match self.pending.get(&key) {
                    Some(p) if p.owner == client => {
                        prop_assert_eq!(got, Ok(()));
                        let p = self.pending.remove(&key).expect("pending");
                        if let Some(old) = self.committed.insert(key, p.version) {
                            self.release(old);
                        }
                    }
                    Some(_) => prop_assert_eq!(code(got), ILLEGAL_CLIENT),
                    None if self.committed.contains_key(&key) => prop_assert_eq!(got, Ok(())),
                    None => prop_assert_eq!(code(got), OBJECT_NOT_FOUND),
                }
                self.check(false).map(drop)
            }
            Op::Revoke { client, key } => {
                let got = self
                    .st
                    .put_revoke(self.clients[client], &[key_name(key)], self.now)
                    .remove(0);
                match self.pending.get(&key) {
                    Some(p) if p.owner == client => {
                        prop_assert_eq!(got, Ok(()));
                        // Held until its write grants have expired.
                        let p = self.pending.remove(&key).expect("pending");
                        let until = self.now + PENDING_TTL;
                        self.deferred
                            .extend(p.version.replicas.into_iter().map(|r| (until, r)));
                    }
                    Some(_) => prop_assert_eq!(code(got), ILLEGAL_CLIENT),
                    None => prop_assert_eq!(code(got), OBJECT_NOT_FOUND),
                }
                self.check(false).map(drop)
            }
            Op::Get { key } => {
                let got = self.st.get_replica_list(&[key_name(key)], now).remove(0);
                match self.committed.get_mut(&key) {
                    Some(v) => {
                        let loc =
                            got.map_err(|e| TestCaseError::fail(format!("get {key}: {e}")))?;
                        prop_assert_eq!(loc.generation, v.generation);
                        prop_assert_eq!(loc.value_len, v.value_len);
                        prop_assert_eq!(&loc.replicas, &v.replicas);
                        v.lease_until = v.lease_until.max(now + LEASE);
                    }
                    None => prop_assert_eq!(code(got), OBJECT_NOT_FOUND),
                }
                self.check(false).map(drop)
            }
            Op::Remove { key, force } => {
                let got = self.st.remove(&[key_name(key)], force, now).remove(0);
                match self.committed.get(&key) {
                    Some(v) if v.lease_until > now && !force => {
                        prop_assert_eq!(code(got), OBJECT_HAS_LEASE)
                    }
                    Some(_) => {
                        // Freed at once, even under a lease (forced), unless
                        // an older version of the key is still to be
                        // destroyed (the next delivery frees it then).
                        prop_assert_eq!(got, Ok(()));
                        let v = self.committed.remove(&key).expect("committed");
                        self.deferred
                            .extend(v.replicas.into_iter().map(|r| (now, r)));
                    }
                    None => prop_assert_eq!(code(got), OBJECT_NOT_FOUND),
                }
                self.check(false).map(drop)
            }
            Op::Evict => {
                let evictable: u64 = self
                    .committed
                    .values()
                    .filter(|v| !v.hard && v.lease_until <= now)
                    .map(|v| bytes(&v.replicas))
                    .sum();
                let out = self.st.evict(now, 0);
                deliver(&self.st);
                self.deferred.retain(|(t, _)| *t > now);
                let (objects, freed) = self.check(true)?;
                prop_assert_eq!(
                    out,
                    Evicted {
                        objects,
                        bytes: freed
                    }
                );
                let target = (2.0 * SEGMENT as f64 * RATIO) as u64;
                prop_assert!(
                    freed >= target.min(evictable),
                    "freed {freed} of {evictable} evictable"
                );
                Ok(())
            }
            Op::Advance { ms } => {
                self.now += Duration::from_millis(ms);
                let now = self.now;
                prop_assert!(self.st.sweep(now).is_empty());
                deliver(&self.st);
                let expired: Vec<_> = self
                    .pending
                    .iter()
                    .filter(|(_, p)| now.saturating_duration_since(p.started) > PENDING_TTL)
                    .map(|(k, _)| *k)
                    .collect();
                for k in expired {
                    // Abandoned: held until its write grants have expired.
                    let p = self.pending.remove(&k).expect("pending");
                    let until = now + PENDING_TTL;
                    self.deferred
                        .extend(p.version.replicas.into_iter().map(|r| (until, r)));
                }
                self.deferred.retain(|(t, _)| *t > now);
                self.check(false).map(drop)
            }
        }
    }

    /// Compares the state with the model after an operation; objects may have
    /// been evicted only if `may_evict`. Returns the objects and bytes evicted.
    fn check(&mut self, may_evict: bool) -> Result<(u64, u64), TestCaseError> {
        let now = self.now;
        let (mut objects, mut freed) = (0, 0);
        for k in 0..KEYS {
            let info = self.st.key_info(&key_name(k), now);
            match (self.committed.get(&k), info) {
                (Some(v), Some(i)) => {
                    prop_assert_eq!(i.generation, v.generation);
                    prop_assert_eq!(i.value_len, v.value_len);
                    prop_assert_eq!(&i.replicas, &v.replicas);
                    prop_assert_eq!(i.hard_pin, v.hard);
                    prop_assert_eq!(i.put_in_flight, self.pending.contains_key(&k));
                }
                (Some(v), None) => {
                    prop_assert!(may_evict, "key {k} vanished");
                    prop_assert!(
                        !v.hard && v.lease_until <= now,
                        "key {k} evicted while protected: {v:?}"
                    );
                    objects += 1;
                    freed += bytes(&v.replicas);
                    // Its regions go at once, or at the next delivery when
                    // an older version of the key is still to be destroyed.
                    let v = self.committed.remove(&k).expect("committed");
                    self.deferred
                        .extend(v.replicas.into_iter().map(|r| (now, r)));
                }
                (None, Some(i)) => prop_assert!(false, "key {k} came back: {i:?}"),
                (None, None) => {}
            }
        }
        self.evicted += objects;
        prop_assert_eq!(self.st.evictions(), self.evicted);

        let status = self.st.status();
        prop_assert_eq!(status.keys, self.committed.len() as u64);
        prop_assert_eq!(status.pending, self.pending.len() as u64);
        // What each client holds against its limits follows every put's
        // whole life: started, committed, replaced, removed, evicted.
        for (c, &id) in self.clients.iter().enumerate() {
            let pending = self.pending.values().filter(|p| p.owner == c).count() as u64;
            let pinned: u64 = self
                .committed
                .values()
                .chain(self.pending.values().map(|p| &p.version))
                .filter(|v| v.hard && v.owner == c)
                .map(|v| bytes(&v.replicas))
                .sum();
            prop_assert_eq!(self.st.held_by(id), (pending, pinned), "client {}", c);
        }
        prop_assert_eq!(
            status.used,
            status.segments.iter().map(|s| s.used).sum::<u64>()
        );

        // Regions certainly reserved, and regions whose lease ended but which
        // only a sweep or an eviction pass hands back.
        let certain: Vec<&Replica> = self
            .committed
            .values()
            .chain(self.pending.values().map(|p| &p.version))
            .flat_map(|v| &v.replicas)
            .chain(
                self.deferred
                    .iter()
                    .filter(|(t, _)| *t > now)
                    .map(|(_, r)| r),
            )
            .collect();
        let maybe: Vec<&Replica> = self
            .deferred
            .iter()
            .filter(|(t, _)| *t <= now)
            .map(|(_, r)| r)
            .collect();
        for seg in &status.segments {
            let id = seg.info.id;
            let mut mine: Vec<&Replica> = certain
                .iter()
                .copied()
                .filter(|r| r.segment == id)
                .collect();
            mine.sort_by_key(|r| r.offset);
            for r in &mine {
                prop_assert!(
                    r.offset >= BASE && r.offset + r.len <= BASE + SEGMENT,
                    "{r:?} outside"
                );
            }
            for w in mine.windows(2) {
                prop_assert!(
                    w[0].offset + w[0].len <= w[1].offset,
                    "overlap: {:?} {:?}",
                    w[0],
                    w[1]
                );
            }
            let extra: Vec<&Replica> = maybe.iter().copied().filter(|r| r.segment == id).collect();
            let (sure_b, sure_n) = (mine.iter().map(|r| r.len).sum::<u64>(), mine.len() as u64);
            let (extra_b, extra_n) = (extra.iter().map(|r| r.len).sum::<u64>(), extra.len() as u64);
            prop_assert!(
                (sure_b..=sure_b + extra_b).contains(&seg.used),
                "{id}: used {} not in {sure_b}+{extra_b}",
                seg.used
            );
            prop_assert!(
                (sure_n..=sure_n + extra_n).contains(&seg.regions),
                "{id}: {} regions, {sure_n}+{extra_n}",
                seg.regions
            );
        }
        Ok((objects, freed))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_the_invariants(ops in prop::collection::vec(op(), 1..100)) {
        let mut sim = Sim::new();
        for op in &ops {
            sim.apply(op)?;
        }
    }
}

/// A commit retried after its upsert was revoked must fail: success would
/// claim the new value is stored while readers get the old one.
#[test]
fn commit_of_a_revoked_upsert_fails_and_the_old_value_stays() {
    let cfg = StateConfig {
        pending_ttl: Duration::from_secs(5),
        ..StateConfig::default()
    };
    let (p, c) = Pool::with_segment(cfg, 1 << 20);
    let (g1, _) = p.commit(c, "k", 1000, p.at(0));
    let (g2, _) = p.upsert(c, "k", 1000, p.at(0));
    assert_ne!(g1, g2);
    p.st.sweep(p.at(6_000));
    assert_eq!(code(p.end_gen(c, "k", g2, p.at(6_000))), OBJECT_NOT_FOUND);
    assert_eq!(p.get("k", p.at(6_000)).unwrap().generation, g1);
    // A retry of the commit that did land still answers success.
    assert_eq!(p.end_gen(c, "k", g1, p.at(6_000)), Ok(()));
}

// ------------------------------------------------------------ recovery

fn inventory(key: &str, generation: u64, replica: &Replica) -> InventoryItem {
    InventoryItem {
        key: key.into(),
        generation,
        value_len: replica.len - HEADER,
        offset: replica.offset,
        region_len: replica.len,
    }
}

/// The state of each mounted segment, by name.
fn segment_states(p: &Pool) -> Vec<(String, String)> {
    p.st.status()
        .segments
        .into_iter()
        .map(|s| (s.info.name, s.state))
        .collect()
}

/// A store silent past the TTL is suspect, not forgotten: its objects stay
/// readable (its replicas offered last), it gets no new objects, and a
/// heartbeat within the grace period makes it live with nothing lost. Only
/// silence past TTL + grace drops its segment.
#[test]
fn suspect_store_keeps_its_objects_through_the_grace_period() {
    let p = Pool::new(StateConfig {
        client_ttl: Duration::from_secs(10),
        store_grace: Duration::from_secs(30),
        ..config()
    });
    let (s1, s2, w) = (p.client(1), p.client(2), p.client(3));
    p.mount(s1, 1, "a", MIB);
    p.mount(s2, 2, "b", MIB);
    let now = p.at(0);
    p.commit_with(w, "solo", OBJ, &preferring(&["a"], 1), now);
    p.commit_with(w, "both", OBJ, &preferring(&["a", "b"], 2), now);
    let alive = |at: u64| assert!(p.st.heartbeat(s2, p.at(at)) && p.st.heartbeat(w, p.at(at)));

    alive(9 * SEC);
    assert!(
        p.st.sweep(p.at(12 * SEC)).is_empty(),
        "a store is not dropped at the TTL"
    );
    assert_eq!(
        segment_states(&p),
        [("a".into(), "suspect".into()), ("b".into(), "live".into())]
    );
    let now = p.at(12 * SEC);
    assert_eq!(segment_ids(&p.get("solo", now).unwrap().replicas), vec![1]);
    assert_eq!(
        segment_ids(&p.get("both", now).unwrap().replicas),
        vec![2, 1],
        "the live replica first"
    );
    let g = p.put_with(w, "new", OBJ, &preferring(&["a"], 1), false, now);
    let Ok(PutGrant::Write { replicas, .. }) = g else {
        panic!("{g:?}");
    };
    assert_eq!(
        segment_ids(&replicas),
        vec![2],
        "no new object on a suspect store"
    );

    // Back within the grace period: live again, nothing re-mounted.
    assert!(p.st.heartbeat(s1, p.at(30 * SEC)));
    assert_eq!(
        segment_states(&p),
        [("a".into(), "live".into()), ("b".into(), "live".into())]
    );
    alive(30 * SEC);
    assert!(p.st.sweep(p.at(31 * SEC)).is_empty());
    assert_eq!(p.st.status().keys, 2);

    // Silent again, now past TTL + grace: dropped with its objects.
    alive(39 * SEC);
    alive(48 * SEC);
    alive(57 * SEC);
    alive(66 * SEC);
    assert!(p.st.sweep(p.at(69 * SEC)).is_empty());
    assert_eq!(segment_states(&p)[0].1, "suspect");
    assert_eq!(p.st.sweep(p.at(71 * SEC)), vec![s1]);
    let now = p.at(71 * SEC);
    assert_eq!(segment_states(&p), [("b".into(), "live".into())]);
    assert_eq!(code(p.get("solo", now)), OBJECT_NOT_FOUND);
    assert_eq!(segment_ids(&p.get("both", now).unwrap().replicas), vec![2]);
    assert!(!p.st.heartbeat(s1, now), "it must register and mount again");
}

/// Time the master itself did not run is not the clients' silence.
#[test]
fn a_master_stall_is_not_counted_against_clients() {
    let p = Pool::new(StateConfig {
        client_ttl: Duration::from_secs(10),
        ..config()
    });
    let (s1, c) = (p.client(1), p.client(2));
    p.mount(s1, 1, "a", MIB);
    p.st.forgive_stall(Duration::from_secs(8), p.at(15 * SEC));
    assert!(p.st.sweep(p.at(15 * SEC)).is_empty());
    assert_eq!(p.st.status().segments.len(), 1);
    assert_eq!(
        p.st.sweep(p.at(19 * SEC)).len(),
        2,
        "{c} and {s1} expire later"
    );
}

/// A part of an inventory sent twice (its answer was lost, the store sent it
/// again) counts once.
#[test]
fn inventory_parts_sent_twice_count_once() {
    let p = Pool::new(config());
    let s1 = p.client(1);
    let now = p.at(0);
    let at = |offset: u64| region_at(offset, OBJ);
    p.st.mount(s1, segment(1, "a", MIB), 2, p.t0).unwrap();
    for _ in 0..2 {
        let v = p.st.report_objects(
            s1,
            SegmentId(1),
            vec![inventory("x", 5, &at(BASE))],
            false,
            now,
        );
        assert_eq!(v.unwrap().accepted, 0);
    }
    let v = p.st.report_objects(
        s1,
        SegmentId(1),
        vec![inventory("y", 6, &at(BASE + OBJ))],
        true,
        now,
    );
    assert_eq!(v.unwrap().accepted, 2);
    assert_eq!((p.st.status().keys, p.used()), (2, 2 * OBJ));
}

/// An inventory that does not fit its segment is refused and the segment
/// unmounted: opened empty, new objects would overwrite the ones it holds.
#[test]
fn a_refused_inventory_never_opens_the_segment_empty() {
    let p = Pool::new(config());
    let s1 = p.client(1);
    let now = p.at(0);
    let at = region_at;
    p.st.mount(s1, segment(1, "a", MIB), 2, p.t0).unwrap();
    let overlapping = vec![
        inventory("x", 5, &at(BASE, 2 * OBJ)),
        inventory("y", 6, &at(BASE + OBJ, OBJ)),
    ];
    let r =
        p.st.report_objects(s1, SegmentId(1), overlapping, true, now);
    assert_eq!(code(r), INVALID_PARAMS);
    assert!(p.st.status().segments.is_empty());
    assert_eq!(code(p.put(s1, "z", 128, now)), NO_AVAILABLE_HANDLE);
}

/// A replica of `len` bytes at `offset`, as an inventory reports it.
fn region_at(offset: u64, len: u64) -> Replica {
    Replica {
        segment: SegmentId(0),
        endpoint: String::new(),
        offset,
        len,
        cap: None,
        tier: Default::default(),
        fence: 1,
    }
}

/// A store restarted within the TTL remounts its segment under a new client:
/// the master's map decides what survives.
#[test]
fn restarted_store_takes_over_its_segment() {
    let (p, old) = Pool::with_segment(config(), MIB);
    let now = p.at(0);
    let (g_kept, r_kept) = p.commit(old, "kept", OBJ, now);
    let (_, _r_lost) = p.commit(old, "lost", OBJ, now);
    let (g_gone, r_gone) = p.commit(old, "removed", OBJ, now);
    p.remove("removed", false, now).unwrap();
    let used = p.used();

    let new = p.client(2);
    // The store's scan began well after those commits.
    let spec = MountSpec {
        objects: 2,
        fence: 2,
        ..MountSpec::default()
    };
    (p.st
        .mount_scanned(new, segment(1, "a", MIB), spec, p.at(5 * SEC)))
    .unwrap();
    // The store found "kept" and the stale bytes of "removed"; "lost" was torn.
    let verdict =
        p.st.report_objects(
            new,
            SegmentId(1),
            vec![
                inventory("kept", g_kept, &r_kept[0]),
                inventory("removed", g_gone, &r_gone[0]),
            ],
            true,
            now,
        )
        .unwrap();
    assert_eq!(verdict.accepted, 1);
    assert_eq!(verdict.rejected, vec![(r_gone[0].offset, g_gone)]);
    assert_eq!(p.get("kept", now).unwrap().generation, g_kept);
    assert_eq!(code(p.get("lost", now)), OBJECT_NOT_FOUND);
    assert_eq!(code(p.get("removed", now)), OBJECT_NOT_FOUND);
    assert_eq!(
        p.used(),
        used - OBJ,
        "the lost object's region is free again"
    );
    assert_eq!(
        p.st.status().replicas_lost,
        1,
        "\"lost\" is counted (and logged)"
    );
    // Grants from now on name the remount's fence.
    let (_, fresh) = p.start(new, "after", OBJ, p.at(5 * SEC));
    assert_eq!(fresh[0].fence, 2);
    // The old owner's expiry no longer takes the segment away.
    let ttl = config().client_ttl;
    assert!(p.st.heartbeat(new, p.t0 + ttl));
    assert_eq!(p.st.sweep(p.t0 + ttl + Duration::from_secs(1)), vec![old]);
    assert_eq!(p.st.status().segments.len(), 1);
}

/// A store that mounts a segment new to this master (a failover) with
/// regions held back, because shared-memory writers of the previous
/// leader's grants were still copying into them: nothing is placed there
/// until the store stops reporting them, with or without an inventory.
#[test]
fn held_regions_are_placed_nowhere_until_released() {
    let p = Pool::new(config());
    let (s1, s2) = (p.client(1), p.client(2));
    let now = p.at(0);
    let base = 4096;
    // An empty segment, whose first region a paused writer holds.
    let spec = |objects, held: Vec<(u64, u64)>| MountSpec {
        objects,
        fence: 7,
        held,
        ..MountSpec::default()
    };
    (p.st
        .mount_scanned(s1, segment(1, "a", MIB), spec(0, vec![(base, OBJ)]), now))
    .unwrap();
    // One with an inventory, and a held region after its object.
    let held2 = (base + 2 * OBJ, OBJ);
    (p.st
        .mount_scanned(s2, segment(2, "b", MIB), spec(1, vec![held2]), now))
    .unwrap();
    let v = p.st.report_objects(
        s2,
        SegmentId(2),
        vec![inventory("kept", 5, &region_at(base, OBJ))],
        true,
        now,
    );
    assert_eq!(v.unwrap().accepted, 1);
    assert_eq!(p.used(), 3 * OBJ, "an object and two held regions");
    let mut placed = Vec::new();
    // Room for 26 more: fill it, and nothing lands on the held regions.
    for i in 0..26 {
        let (_, r) = p.start(s1, &format!("k{i}"), OBJ, now);
        assert_eq!(r[0].fence, 7, "grants name the mount's fence");
        placed.push((r[0].segment.0, r[0].offset));
    }
    assert!(!placed.contains(&(1, base)), "placed over a held region");
    assert!(!placed.contains(&(2, held2.0)), "placed over a held region");
    // Still reported: still held. No longer reported: free again.
    p.st.record_held(s1, &[(SegmentId(1), base, OBJ)]);
    p.st.record_held(s2, &[(SegmentId(2), held2.0, held2.1)]);
    assert_eq!(p.used(), 29 * OBJ);
    // A store's report releases its own regions only.
    p.st.record_held(s1, &[]);
    assert_eq!(p.used(), 28 * OBJ, "s1's region released, s2's still held");
    p.st.record_held(s2, &[]);
    assert_eq!(p.used(), 27 * OBJ);
    assert!(p.put(s1, "now-there-is-room", OBJ, now).is_ok());
}

/// A master that never saw a segment (it restarted, or took over) rebuilds
/// the map from inventories: the newest generation of a key wins, an equal
/// generation on another segment is another replica.
#[test]
fn new_master_rebuilds_from_inventories() {
    let p = Pool::new(config());
    let (s1, s2) = (p.client(1), p.client(2));
    let now = p.at(0);
    let region = |offset: u64| region_at(offset, OBJ);
    let base = 4096;
    p.st.mount(s1, segment(1, "a", MIB), 3, p.t0).unwrap();
    p.st.mount(s2, segment(2, "b", MIB), 2, p.t0).unwrap();
    // Recovering segments take no new objects: a retryable refusal.
    assert_eq!(code(p.put(s1, "new", 128, now)), UNAVAILABLE);
    let v1 =
        p.st.report_objects(
            s1,
            SegmentId(1),
            vec![
                inventory("both", 50, &region(base)),
                inventory("upserted", 60, &region(base + OBJ)),
            ],
            false,
            now,
        )
        .unwrap();
    assert_eq!(v1.accepted, 0, "nothing is decided before the last part");
    let v1 =
        p.st.report_objects(
            s1,
            SegmentId(1),
            vec![inventory("solo", 40, &region(base + 2 * OBJ))],
            true,
            now,
        )
        .unwrap();
    assert_eq!((v1.accepted, v1.rejected.len()), (3, 0));
    let v2 =
        p.st.report_objects(
            s2,
            SegmentId(2),
            vec![
                inventory("both", 50, &region(base)),
                inventory("upserted", 70, &region(base + OBJ)),
            ],
            true,
            now,
        )
        .unwrap();
    assert_eq!((v2.accepted, v2.rejected.len()), (2, 0));
    let both = p.get("both", now).unwrap();
    assert_eq!(segment_ids(&both.replicas), vec![1, 2]);
    let up = p.get("upserted", now).unwrap();
    assert_eq!((up.generation, segment_ids(&up.replicas)), (70, vec![2]));
    assert_eq!(p.get("solo", now).unwrap().generation, 40);
    // The superseded version was freed and queued for destruction.
    let (inv, _) = p.st.take_invalidations();
    assert_eq!(inv.len(), 1);
    assert_eq!(
        (inv[0].0, &inv[0].2),
        (SegmentId(1), &vec![(base + OBJ, 60)])
    );
    // New puts get generations above everything recovered, and the segments
    // are open again.
    let (g, _) = p.commit(s1, "new", 128, now);
    assert!(g > 70);
}

/// Every free of written bytes is queued for destruction on its store.
#[test]
fn frees_are_queued_for_invalidation() {
    let (p, c) = Pool::with_segment(config(), MIB);
    let now = p.at(0);
    let (g1, r1) = p.commit(c, "removed", OBJ, now);
    let (g2, r2) = p.start(c, "revoked", OBJ, now);
    p.remove("removed", false, now).unwrap();
    p.revoke(c, "revoked").unwrap();
    let (mut got, _) = p.st.take_invalidations();
    assert_eq!(got.len(), 1);
    got[0].2.sort();
    let mut want = vec![(r1[0].offset, g1), (r2[0].offset, g2)];
    want.sort();
    assert_eq!(got[0].2, want);
    assert!(p.st.take_invalidations().0.is_empty());
}

/// A put given up before its bytes arrived may still have them written (its
/// writer cut off, its frames delivered later): when its grants expire, its
/// regions are destroyed again before any reuse, so no late object survives
/// to be found by a scan (a new leader would take a removed key back).
#[test]
fn an_abandoned_put_is_destroyed_again_when_its_grants_expire() {
    let cfg = StateConfig {
        pending_ttl: Duration::from_secs(5),
        ..config()
    };
    let (p, c) = Pool::with_segment(cfg, MIB);
    let (g, r) = p.start(c, "cut-off", OBJ, p.at(0));
    p.revoke(c, "cut-off").unwrap();
    let (inv, through) = p.st.take_invalidations();
    assert_eq!(inv[0].2, vec![(r[0].offset, g)]);
    p.st.invalidations_sent(through);
    assert_eq!(p.st.status().used, OBJ, "held while a grant may be used");

    assert!(p.st.heartbeat(c, p.at(6 * SEC)));
    assert!(p.st.sweep(p.at(6 * SEC)).is_empty());
    let (inv, through) = p.st.take_invalidations();
    assert_eq!(inv.len(), 1, "destroyed again");
    assert_eq!(inv[0].2, vec![(r[0].offset, g)]);
    assert_eq!(p.st.status().used, OBJ, "reused only once that was sent");
    p.st.invalidations_sent(through);
    assert_eq!(p.st.status().used, 0);
}

/// A removed key, and a key upserted while its old version is leased, are
/// fenced until the old headers are sent for destruction; the leased
/// version's regions stay reserved until its lease ends.
#[test]
fn removals_and_upserts_fence_their_keys_until_invalidated() {
    let (p, c) = Pool::with_segment(config(), MIB);
    let now = p.at(0);
    p.commit(c, "gone", OBJ, now);
    let (g_old, r_old) = p.commit(c, "leased", OBJ, now);
    p.get("leased", now).unwrap();
    assert!(!p.st.has_fences());
    p.remove("gone", false, now).unwrap();
    let used = p.st.usage().1;
    let (g_new, _) = p.upsert(c, "leased", OBJ, now);
    p.end(c, "leased", now).unwrap();
    assert!(g_new > g_old);
    let fence = p.st.fence(["gone", "leased"], now).expect("fenced");
    assert!(p.st.fence(["other"], now).is_none());
    let (inv, through) = p.st.take_invalidations();
    assert!(!p.st.fence_done(&fence, now));
    assert!(inv[0].2.contains(&(r_old[0].offset, g_old)), "{inv:?}");
    // Still leased: the old region is not free yet.
    assert_eq!(p.st.usage().1, used + r_old[0].len);
    p.st.invalidations_delivered(SegmentId(1));
    p.st.invalidations_sent(through);
    assert!(p.st.fence_done(&fence, now));
    assert!(p.st.fence(["gone", "leased"], now).is_none());
    assert!(!p.st.has_fences());
}

/// An upsert whose old version's store could not be told to destroy it
/// (down, or cut off from the master while clients still reach it) is
/// fenced until the store is told, or until no client can read the old
/// version through a young cached location: the chaos harness saw cached
/// reads of replaced values when the fence let go of undelivered
/// invalidations.
#[test]
fn an_undelivered_invalidation_fences_until_no_young_lease_can_read_the_old_version() {
    let cfg = StateConfig {
        lease_ttl: Duration::from_secs(10),
        ..config()
    };
    let (p, c) = Pool::with_segment(cfg, MIB);
    let t = |ms| p.at(ms);
    p.commit(c, "k", OBJ, t(0));
    p.commit(c, "j", OBJ, t(0));
    // A reader's lease: 10 s, of which it reads without asking for 5 s.
    p.get("k", t(6_000)).unwrap();
    p.upsert(c, "k", OBJ, t(6_100));
    p.end(c, "k", t(6_100)).unwrap();
    let w = p.st.fence(["k"], t(6_100)).expect("fenced");
    assert_eq!(
        w.until,
        t(11_000),
        "the lease's first half, past FENCE_WAIT"
    );
    // The store is unreachable: requeued, and the pass is over.
    let (inv, through) = p.st.take_invalidations();
    for (id, _, regions) in inv {
        p.st.requeue_invalidations(id, regions);
    }
    p.st.invalidations_sent(through);
    assert!(
        !p.st.fence_done(&w, t(6_200)),
        "undelivered: the reply waits"
    );
    assert!(!p.st.fence_done(&w, t(10_999)));
    // A later removal of the key waits as well.
    assert!(p.st.fence(["k"], t(7_000)).is_some());
    assert!(
        p.st.fence_done(&w, t(11_000)),
        "no young lease can read it any more"
    );
    p.st.sweep(t(11_000));
    assert!(p.st.fence(["k"], t(11_000)).is_none());

    // Delivered on a later pass: the reply goes at once.
    p.get("j", t(12_000)).unwrap();
    p.upsert(c, "j", OBJ, t(12_000));
    p.end(c, "j", t(12_000)).unwrap();
    let w = p.st.fence(["j"], t(12_000)).expect("fenced");
    let (inv, through) = p.st.take_invalidations();
    for (id, _, regions) in inv {
        p.st.requeue_invalidations(id, regions);
    }
    p.st.invalidations_sent(through);
    assert!(!p.st.fence_done(&w, t(12_100)));
    let (inv, through) = p.st.take_invalidations();
    assert_eq!(inv.len(), 1, "the requeued regions go again");
    p.st.invalidations_delivered(inv[0].0);
    p.st.invalidations_sent(through);
    assert!(p.st.fence_done(&w, t(12_100)));
}

/// A key's last version is destroyed only after every older version of it
/// is (chaos finding 13): the old version of "k" stays on an unreachable
/// store, the new one is removed, and if the new one's bytes went first, a
/// new leader rebuilding from the stores would serve the old value again.
#[test]
fn a_last_version_is_destroyed_only_after_the_older_ones() {
    // The old one's store cannot be told.
    let (p, now, g2) = replaced_on_another_segment();
    let undelivered = |p: &Pool| {
        let (inv, through) = p.st.take_invalidations();
        for (id, _, regions) in inv.iter().cloned() {
            if id == SegmentId(1) {
                p.st.requeue_invalidations(id, regions);
            }
        }
        p.st.invalidations_sent(through);
        inv
    };
    undelivered(&p);
    let used = p.used();
    p.remove("k", true, now).unwrap();
    let inv = undelivered(&p);
    assert!(
        inv.iter().all(|(id, ..)| *id == SegmentId(1)),
        "the new version is not destroyed before the old one: {inv:?}"
    );
    assert_eq!(p.used(), used, "its region is held meanwhile");
    let reply = p.st.fence(["k"], now).expect("the removal's reply waits");
    // Delivered at last: the new version goes next, and the reply waits
    // for that too. It went between the two, and a client read the removed
    // version through its cached location 4 ms after the removal was
    // answered (chaos, mixed seed 1).
    let (inv, through) = p.st.take_invalidations();
    for (id, ..) in &inv {
        p.st.invalidations_delivered(*id);
    }
    p.st.invalidations_sent(through);
    assert!(
        !p.st.fence_done(&reply, now),
        "the new version is not destroyed yet"
    );
    assert!(p.st.fence(["k"], now).is_some(), "nor may a later reply go");
    let (inv, through) = p.st.take_invalidations();
    assert_eq!(inv.len(), 1);
    assert_eq!(inv[0].0, SegmentId(2));
    assert_eq!(inv[0].2[0].1, g2);
    p.st.invalidations_sent(through);
    assert!(p.st.fence_done(&reply, now));
    assert_eq!(p.used(), used - OBJ);
}

/// "k" committed on segment 1 ("a"), then upserted onto segment 2 ("b"):
/// the pool, the instant, and the new version's generation.
fn replaced_on_another_segment() -> (Pool, Instant, u64) {
    let p = Pool::new(config());
    let (a, b) = (p.client(1), p.client(2));
    p.mount(a, 1, "a", MIB);
    let now = p.at(0);
    let on = |seg: &str| ReplicateConfig {
        preferred_segments: vec![seg.into()],
        ..replicas(1)
    };
    p.start_with(a, "k", OBJ, &on("a"), false, now);
    p.end(a, "k", now).unwrap();
    p.mount(b, 2, "b", MIB);
    let (g2, reps) = p.start_with(a, "k", OBJ, &on("b"), true, now);
    assert_eq!(reps[0].segment, SegmentId(2));
    p.end(a, "k", now).unwrap();
    (p, now, g2)
}

/// The same when the old version's destruction is first sent in the very
/// round that releases the new one (its store was only slow to be told):
/// that round's sequence number covers the old version's batch, not the
/// new one's, and the key's fence must outlive it.
#[test]
fn a_held_back_version_stays_fenced_until_its_own_destruction_is_sent() {
    let (p, now, _) = replaced_on_another_segment();
    // The old version's destruction is queued, not sent, when "k" goes.
    p.remove("k", true, now).unwrap();
    let reply = p.st.fence(["k"], now).expect("the removal's reply waits");
    let (inv, through) = p.st.take_invalidations();
    assert!(inv.iter().all(|(id, ..)| *id == SegmentId(1)), "{inv:?}");
    p.st.invalidations_sent(through);
    assert!(
        !p.st.fence_done(&reply, now),
        "the new version is not destroyed yet"
    );
    assert!(p.st.fence(["k"], now).is_some(), "the key is still fenced");
    let (inv, through) = p.st.take_invalidations();
    assert_eq!(inv.len(), 1, "{inv:?}");
    assert_eq!(inv[0].0, SegmentId(2));
    p.st.invalidations_sent(through);
    assert!(p.st.fence_done(&reply, now));
    assert!(p.st.fence(["k"], now).is_none());
}

/// A removal whose store cannot be told is kept as a tombstone, and answers
/// once no young lease can read the removed version and the tombstone is
/// durable: at once without HA (no other master takes over), once written
/// to etcd with HA, and at the latest when the store can no longer come
/// back (TTL + grace). A new leader given the tombstones rejects the
/// removed version from the store's inventory: the chaos harness saw a
/// removed key come back when its store re-mounted with a new leader, and
/// waiting for the store instead made removes answer a timeout (issue 28).
#[test]
fn a_removal_is_answered_once_durable_and_never_comes_back() {
    let cfg = StateConfig {
        client_ttl: Duration::from_secs(2),
        store_grace: Duration::from_secs(30),
        ..config()
    };
    for ha in [false, true] {
        let (p, c) = Pool::with_segment(cfg.clone(), MIB);
        if ha {
            p.st.keep_tombstones(Vec::new(), p.t0);
        }
        let t = |ms| p.at(ms);
        let (g, r) = p.commit(c, "k", OBJ, t(0));
        p.remove("k", false, t(10_000)).unwrap();
        let w = p.st.fence(["k"], t(10_000)).expect("fenced");
        assert_eq!(w.until, t(42_000), "at the latest");
        let (inv, through) = p.st.take_invalidations();
        for (id, _, regions) in inv {
            p.st.requeue_invalidations(id, regions);
        }
        p.st.invalidations_sent(through);
        assert!(!p.st.fence_done(&w, t(11_999)), "FENCE_WAIT first");
        let (_, written, tombs) = p.st.tombstones_to_write(0, t(12_000)).expect("changed");
        assert_eq!(
            tombs,
            [Tombstone {
                key: "k".into(),
                generation: g
            }]
        );
        assert_eq!(p.st.fence_done(&w, t(12_000)), !ha, "ha: {ha}");
        p.st.tombstones_written(written);
        assert!(p.st.fence_done(&w, t(12_000)), "durable");

        // A new leader, told the tombstones, rejects the removed copy; a
        // newer version of the key (written after the removal) is taken.
        let q = Pool::new(cfg.clone());
        q.st.keep_tombstones(tombs, q.t0);
        let (s1, s2) = (q.client(1), q.client(2));
        q.st.mount(s1, segment(1, "a", MIB), 1, q.t0).unwrap();
        q.st.mount(s2, segment(2, "b", MIB), 1, q.t0).unwrap();
        let report = |s, id, item| {
            q.st.report_objects(s, SegmentId(id), vec![item], true, q.t0)
                .unwrap()
        };
        let v = report(s1, 1, inventory("k", g, &r[0]));
        assert_eq!((v.accepted, v.rejected), (0, vec![(r[0].offset, g)]));
        assert_eq!(code(q.get("k", q.t0)), OBJECT_NOT_FOUND);
        let v = report(s2, 2, inventory("k", g + 1, &r[0]));
        assert_eq!(v.accepted, 1);
        assert_eq!(q.get("k", q.t0).unwrap().generation, g + 1);

        // Delivered later, the tombstone is dropped.
        let (inv, through) = p.st.take_invalidations();
        p.st.invalidations_delivered(inv[0].0);
        p.st.invalidations_sent(through);
        let (_, _, left) = p.st.tombstones_to_write(1, t(13_000)).expect("changed");
        assert!(left.is_empty());
    }
}

/// Two upserts in a row, the first one's old version still undelivered
/// when the second replaces the first: the second's reply waits for both.
/// The chaos harness read the oldest version through a cached location
/// after the second upsert answered, because its fence had replaced the
/// first one's.
#[test]
fn a_second_upsert_waits_for_the_first_ones_undelivered_old_version() {
    let cfg = StateConfig {
        lease_ttl: Duration::from_secs(10),
        ..config()
    };
    let p = Pool::new(cfg);
    let (a, b) = (p.client(1), p.client(2));
    p.mount(a, 1, "a", MIB);
    p.mount(b, 2, "b", MIB);
    let t = |ms| p.at(ms);
    p.commit_with(a, "k", OBJ, &preferring(&["a"], 1), t(6_000));
    p.get("k", t(6_000)).unwrap();
    // The first upsert (on b) replaces the version on a; a is unreachable.
    p.start_with(a, "k", OBJ, &preferring(&["b"], 1), true, t(6_100));
    p.end(a, "k", t(6_100)).unwrap();
    let (inv, through) = p.st.take_invalidations();
    for (id, _, regions) in inv {
        p.st.requeue_invalidations(id, regions);
    }
    p.st.invalidations_sent(through);
    // The second upsert replaces the first; b is reachable.
    p.start_with(b, "k", OBJ, &preferring(&["b"], 1), true, t(6_200));
    p.end(b, "k", t(6_200)).unwrap();
    let w = p.st.fence(["k"], t(6_200)).expect("fenced");
    let (inv, through) = p.st.take_invalidations();
    for (id, _, regions) in inv {
        if id == SegmentId(1) {
            p.st.requeue_invalidations(id, regions);
        } else {
            p.st.invalidations_delivered(id);
        }
    }
    p.st.invalidations_sent(through);
    assert!(
        !p.st.fence_done(&w, t(6_300)),
        "the version on a is still readable through a young cached location"
    );
}

/// A segment that cannot take objects right now (its owner is late on
/// heartbeats) is no reason to evict: the put is refused with a retryable
/// code and nothing is lost.
#[test]
fn unplaceable_segments_never_trigger_eviction() {
    let cfg = StateConfig {
        client_ttl: Duration::from_secs(10),
        ..config()
    };
    let (p, c) = Pool::with_segment(cfg, MIB);
    let writer = p.client(2);
    for i in 0..8 {
        p.commit(writer, &format!("k{i}"), OBJ, p.at(0));
    }
    // The owner has been silent for 6 s (> TTL/2): placement skips it.
    assert!(p.st.heartbeat(writer, p.at(6 * SEC)));
    let late = p.at(6 * SEC);
    assert_eq!(code(p.put(writer, "new", OBJ, late)), UNAVAILABLE);
    assert_eq!(p.st.evictions(), 0);
    assert!((0..8).all(|i| p.present(&format!("k{i}"))));
    // Back in time: the put goes through.
    assert!(p.st.heartbeat(c, late));
    p.commit(writer, "new", OBJ, late);
}

/// A store's inventory cannot outbid what this master committed, nor claim
/// a generation nobody issued: a forged claim on a live key is rejected,
/// the key keeps its version, and the generation counter does not wrap.
#[test]
fn an_inventory_cannot_outbid_this_masters_versions() {
    let p = Pool::new(config());
    let (s1, w, thief) = (p.client(1), p.client(2), p.client(3));
    p.mount(s1, 1, "a", MIB);
    let now = p.at(0);
    let (g, _) = p.commit(w, "victim", OBJ, now);
    p.st.mount(thief, segment(2, "b", MIB), 2, now).unwrap();
    let claims = vec![
        inventory("victim", g + 1, &region_at(BASE, OBJ)),
        inventory("anything", u64::MAX, &region_at(BASE + OBJ, OBJ)),
    ];
    let v =
        p.st.report_objects(thief, SegmentId(2), claims, true, now)
            .unwrap();
    assert_eq!(v.accepted, 0);
    assert_eq!(v.rejected, vec![(BASE, g + 1), (BASE + OBJ, u64::MAX)]);
    let got = p.get("victim", now).unwrap();
    assert_eq!((got.generation, segment_ids(&got.replicas)), (g, vec![1]));
    assert_eq!(code(p.get("anything", now)), OBJECT_NOT_FOUND);
    let (next, _) = p.commit(w, "later", OBJ, now);
    assert!(next > g && next < u64::MAX / 2, "{next} after {g}");
}

/// An inventory big enough to be reconciled by several threads decides
/// each object as one thread would: new keys are taken, while a key held
/// in a newer version, a claim newer than this master's own version, a key
/// removed meanwhile and a generation nobody issued are rejected, their
/// regions freed once their destruction is sent.
#[test]
fn a_big_inventory_is_decided_object_by_object() {
    const N: u64 = 60_000;
    const SMALL: u64 = 128;
    let p = Pool::new(config());
    let (s1, w, s2) = (p.client(1), p.client(2), p.client(3));
    p.mount(s1, 1, "a", MIB);
    let now = p.at(0);
    let (g7, _) = p.commit(w, "k7", OBJ, now);
    let (g9, _) = p.commit(w, "k9", OBJ, now);
    let (g11, _) = p.commit(w, "k11", OBJ, now);
    p.remove("k11", true, now).unwrap();
    let used = p.used();
    let size = BASE + N * SMALL;
    p.st.mount(s2, segment(2, "b", size), N, now).unwrap();
    let claim = |i: u64| match i {
        7 => g7 - 1,
        9 => g9 + 1,
        11 => g11,
        13 => u64::MAX,
        _ => i + 1,
    };
    let items: Vec<InventoryItem> = (0..N)
        .map(|i| {
            inventory(
                &format!("k{i}"),
                claim(i),
                &region_at(BASE + i * SMALL, SMALL),
            )
        })
        .collect();
    let parts: Vec<_> = items.chunks(16_384).collect();
    for part in &parts[..parts.len() - 1] {
        p.st.report_objects(s2, SegmentId(2), part.to_vec(), false, now)
            .unwrap();
    }
    let last = parts[parts.len() - 1].to_vec();
    let v =
        p.st.report_objects(s2, SegmentId(2), last, true, now)
            .unwrap();
    let rejected: Vec<(u64, u64)> = [7, 9, 11, 13]
        .iter()
        .map(|&i| (BASE + i * SMALL, claim(i)))
        .collect();
    assert_eq!((v.accepted, v.rejected), (N - 4, rejected));
    for i in [0, 5, 12, N / 2, N - 1] {
        let got = p.get(&format!("k{i}"), now).unwrap();
        assert_eq!(
            (got.generation, segment_ids(&got.replicas)),
            (i + 1, vec![2])
        );
    }
    for (k, g) in [("k7", g7), ("k9", g9)] {
        let got = p.get(k, now).unwrap();
        assert_eq!((got.generation, segment_ids(&got.replicas)), (g, vec![1]));
    }
    assert_eq!(code(p.get("k11", now)), OBJECT_NOT_FOUND);
    assert_eq!(code(p.get("k13", now)), OBJECT_NOT_FOUND);
    // A rejected copy's region is reused once this master's destruction of
    // it is sent (its store destroys it on the verdict too).
    assert_eq!(p.used(), used + N * SMALL);
    let (_, through) = p.st.take_invalidations();
    p.st.invalidations_sent(through);
    assert_eq!(p.used(), used + (N - 4) * SMALL);
}

// ------------------------------------------------------------ limits

/// `config()` with the client limits `f` sets.
fn limited(f: impl FnOnce(&mut ClientLimits)) -> StateConfig {
    let mut cfg = config();
    f(&mut cfg.limits);
    cfg
}

#[test]
fn new_clients_beyond_the_limit_are_refused_and_registered_ones_keep_working() {
    let p = Pool::new(limited(|l| l.max_clients = 2));
    let (a, b) = (p.client(1), p.client(2));
    let third = p.st.register_client(ClientId(3), "host-3", p.t0);
    assert_eq!(code(third), UNAVAILABLE);
    assert_eq!(p.st.refusals().count(Refusal::Clients), 1);
    // Registered clients refresh and work as before.
    p.st.register_client(a, "host-1", p.at(SEC))
        .expect("refresh");
    p.mount(a, 1, "a", MIB);
    p.commit(b, "k", OBJ, p.at(SEC));
    assert_eq!(p.st.status().clients, 2);
    // A slot frees when a client expires.
    let cfg_ttl = Duration::from_secs(3600);
    assert!(p.st.heartbeat(a, p.t0 + cfg_ttl));
    assert_eq!(p.st.sweep(p.t0 + cfg_ttl + Duration::from_secs(2)), vec![b]);
    p.st.register_client(ClientId(3), "host-3", p.t0 + cfg_ttl)
        .expect("a slot freed");
}

#[test]
fn segments_beyond_the_per_client_limit_are_refused() {
    let p = Pool::new(limited(|l| l.max_segments_per_client = 2));
    let (a, b) = (p.client(1), p.client(2));
    p.mount(a, 1, "a1", MIB);
    p.mount(a, 2, "a2", MIB);
    let third = p.st.mount(a, segment(3, "a3", MIB), 0, p.t0);
    assert_eq!(code(third), INVALID_PARAMS);
    assert_eq!(p.st.refusals().count(Refusal::SegmentsPerClient), 1);
    // Mounting one again is no new segment; another client has its own share.
    p.mount(a, 1, "a1", MIB);
    p.mount(b, 3, "b1", MIB);
    assert_eq!(p.st.status().segments.len(), 3);
    // An inventory cannot announce more objects than the segment can hold.
    let big =
        p.st.mount(b, segment(4, "b2", 64 * KIB), 64 * KIB / 64 + 1, p.t0);
    assert_eq!(code(big), INVALID_PARAMS);
}

#[test]
fn puts_in_flight_beyond_the_per_client_limit_are_refused_per_key() {
    let (p, c) = Pool::with_segment(limited(|l| l.max_pending_per_client = 3), MIB);
    let items: Vec<PutItem> = (0..5).map(|i| item(&format!("k{i}"), KIB)).collect();
    let got = p.st.put_start(c, &items, &replicas(1), false, p.t0);
    let codes: Vec<Option<i32>> = got
        .iter()
        .map(|r| r.as_ref().err().map(|e| e.code.as_i32()))
        .collect();
    assert_eq!(
        codes,
        [
            None,
            None,
            None,
            Some(NO_AVAILABLE_HANDLE),
            Some(NO_AVAILABLE_HANDLE)
        ]
    );
    assert_eq!(p.st.held_by(c), (3, 0));
    assert_eq!(p.st.refusals().count(Refusal::PendingPuts), 2);
    // Another client is not held back by this one.
    let other = p.client(2);
    p.commit(other, "other", KIB, p.t0);
    // A retry of a put in flight holds nothing more; an end or a revoke gives one back.
    let again = p.st.put_start(c, &items[..1], &replicas(1), false, p.t0);
    assert!(again[0].is_ok());
    assert_eq!(p.st.held_by(c), (3, 0));
    let generation = match &got[0] {
        Ok(PutGrant::Write { generation, .. }) => *generation,
        g => panic!("{g:?}"),
    };
    p.end_gen(c, "k0", generation, p.t0).unwrap();
    p.st.put_revoke(c, &one("k1"), p.t0)[0].as_ref().unwrap();
    assert_eq!(p.st.held_by(c), (1, 0));
    let more = p.st.put_start(c, &items[3..], &replicas(1), false, p.t0);
    assert!(more.iter().all(|r| r.is_ok()), "{more:?}");
    assert_eq!(p.st.held_by(c), (3, 0));
    // Puts that expire give theirs back too.
    let cfg_ttl = Duration::from_secs(3600);
    assert!(p.st.heartbeat(c, p.t0 + cfg_ttl));
    p.st.sweep(p.t0 + cfg_ttl + Duration::from_secs(2));
    assert_eq!(p.st.held_by(c), (0, 0));
}

#[test]
fn hard_pins_beyond_the_per_client_limit_are_refused() {
    let (p, c) = Pool::with_segment(limited(|l| l.max_hard_pinned_per_client = 2 * OBJ), MIB);
    p.commit_with(c, "p1", OBJ, &hard_pin(), p.t0);
    p.start_with(c, "p2", OBJ, &hard_pin(), false, p.t0);
    assert_eq!(p.st.held_by(c), (1, 2 * OBJ));
    assert_eq!(
        code(p.put_with(c, "p3", OBJ, &hard_pin(), false, p.t0)),
        NO_AVAILABLE_HANDLE
    );
    assert_eq!(p.st.refusals().count(Refusal::HardPinnedBytes), 1);
    // Unpinned puts and other clients' pins are not limited by it.
    p.commit(c, "plain", OBJ, p.t0);
    let other = p.client(2);
    p.commit_with(other, "q1", OBJ, &hard_pin(), p.t0);
    // Removing a pinned object gives its bytes back.
    p.remove("p1", true, p.t0).unwrap();
    assert_eq!(p.st.held_by(c), (1, OBJ));
    p.commit_with(c, "p3", OBJ, &hard_pin(), p.t0);
    p.revoke(c, "p2").unwrap();
    assert_eq!(p.st.held_by(c), (0, OBJ));
}

/// A tenant's usage follows every way its objects come and go: a put in
/// flight, its commit, an upsert over it, a revoke, a removal, evictions.
#[test]
fn a_tenants_usage_follows_its_objects() {
    let (p, c) = Pool::with_segment(config(), 8 * OBJ);
    let k = |i: u64| kvpool_proto::tenant::scoped(Some("t"), &format!("o{i}"));
    let usage = || p.st.tenant_usage("t");
    p.start(c, &k(0), OBJ, p.t0);
    assert_eq!(usage().objects, 1, "a put in flight counts");
    p.end(c, &k(0), p.t0).unwrap();
    let one = usage();
    assert_eq!(one.objects, 1);
    assert!(one.bytes > 0);
    p.upsert(c, &k(0), OBJ, p.at(1));
    p.end(c, &k(0), p.at(1)).unwrap();
    assert_eq!(usage(), one, "an upsert replaces");
    p.start(c, &k(1), OBJ, p.at(2));
    p.revoke(c, &k(1)).unwrap();
    assert_eq!(usage(), one, "a revoke gives back");
    p.remove(&k(0), true, p.at(3)).unwrap();
    assert_eq!(usage(), Default::default());
    // Twice the pool, half of it the tenant's: evictions give back too.
    for i in 0..16 {
        p.commit(c, &k(i), OBJ, p.at(10 + i));
        p.commit(c, &format!("plain-{i}"), OBJ, p.at(10 + i));
    }
    let present = (0..16).filter(|&i| p.present(&k(i))).count() as u64;
    assert!(present < 16, "nothing was evicted");
    assert_eq!(usage().objects, present);
    assert_eq!(usage().bytes, present * one.bytes);
}

/// Attack 4 of the tenancy issue, its first half: a holder of the client
/// key registers client ids in a loop. It gets nine tenths of the limit;
/// restarted stores (proving the store key) still register.
#[test]
fn client_key_holders_cannot_take_the_slots_kept_for_stores() {
    use kvpool_proto::policy::Role;
    let p = Pool::new(limited(|l| l.max_clients = 10));
    let engine = |id: u128, at| {
        p.st.register_client_as(ClientId(id), "pod", at, (Role::Client, None))
    };
    for id in 1..=9 {
        engine(id, p.t0).expect("within the engines' share");
    }
    assert_eq!(code(engine(10, p.t0)), UNAVAILABLE);
    // A registered engine refreshes; a store takes a kept slot.
    engine(3, p.at(SEC)).expect("refresh");
    (p.st
        .register_client_as(ClientId(100), "store", p.t0, (Role::Store, None)))
    .expect("a store registers");
    assert_eq!(
        code(p.st.register_client_as(ClientId(101), "store", p.t0, (Role::Store, None))),
        UNAVAILABLE
    );
    // Expired engines give their share back.
    let later = p.at(3601 * SEC);
    let expired = p.st.sweep(later);
    assert!(expired.contains(&ClientId(1)));
    engine(10, later).expect("room again");
}

/// A small limit still keeps a slot for stores: nine tenths of 5 rounds
/// down to 4.
#[test]
fn a_small_client_limit_still_keeps_a_slot_for_stores() {
    use kvpool_proto::policy::Role;
    let p = Pool::new(limited(|l| l.max_clients = 5));
    let register = |id: u128, role| {
        p.st.register_client_as(ClientId(id), "pod", p.t0, (role, None))
    };
    for id in 1..=4 {
        register(id, Role::Client).expect("within the engines' share");
    }
    assert_eq!(code(register(5, Role::Client)), UNAVAILABLE);
    register(100, Role::Store).expect("a store registers");
}

/// Attack 4 of the tenancy issue: one key holder registers many client
/// ids and hard-pins up to each one's limit. The pool's share of pins
/// bounds them all together, so the rest of the pool stays evictable and
/// everyone's puts keep succeeding.
#[test]
fn hard_pins_of_many_clients_leave_the_pool_room_for_puts() {
    let (p, _) = Pool::with_segment(limited(|l| l.max_hard_pinned_ratio = 0.5), 16 * OBJ);
    let mut pinned = 0;
    for id in 10..30 {
        let c = p.client(id);
        let key = format!("pin{id}");
        if p.put_with(c, &key, OBJ, &hard_pin(), false, p.t0).is_ok() {
            p.end(c, &key, p.t0).unwrap();
            pinned += 1;
        }
    }
    assert_eq!(pinned, 8, "half of 16 objects' room");
    assert!(p.st.refusals().count(Refusal::HardPinnedPool) >= 1);
    // Another client's plain puts keep working, by evicting each other.
    let victim = p.client(99);
    for i in 0..40 {
        p.commit(victim, &format!("plain{i}"), OBJ, p.at(10 * (i + 1)));
        assert!(p.present(&format!("plain{i}")));
    }
    // Giving pins back makes room for new ones.
    p.remove("pin10", true, p.at(500)).unwrap();
    let c = p.client(50);
    p.commit_with(c, "pin50", OBJ, &hard_pin(), p.at(510));
}

/// Every put asks which segments take objects; that answer once walked
/// every registered client, so 300k client ids made each put 3000x slower.
/// Now it costs one look-up per segment owner.
#[test]
fn puts_cost_the_same_with_300k_registered_clients() {
    let time_puts = |clients: u128| {
        let p = Pool::new(limited(|l| l.max_clients = 400_000));
        let c = p.client(1);
        p.mount(c, 1, "a", 64 * MIB);
        for id in 2..=clients {
            p.st.register_client(ClientId(id), "h", p.t0).unwrap();
        }
        let started = std::time::Instant::now();
        for i in 0..2000 {
            p.st.put_start(c, &[item(&format!("k{i}"), KIB)], &replicas(1), false, p.t0)[0]
                .as_ref()
                .expect("put");
        }
        started.elapsed()
    };
    let few = time_puts(1);
    let many = time_puts(300_000);
    // Walking 300k clients per put took seconds for these 2000 puts.
    assert!(
        many < few * 10 + Duration::from_millis(200),
        "2000 puts: {few:?} with 1 client, {many:?} with 300k"
    );
}

/// Numbers a caller chooses freely cannot make the master allocate for
/// them or overflow its clock: a replica count of u32::MAX places as many
/// replicas as there are segments, a soft pin of u64::MAX ms pins for good.
#[test]
fn caller_chosen_numbers_are_bounded() {
    let (p, c) = Pool::with_segment(config(), MIB);
    let (_, reps) = p.start_with(c, "many", OBJ, &replicas(u32::MAX), false, p.t0);
    assert_eq!(reps.len(), 1);
    p.commit_with(c, "forever", OBJ, &soft_pin(Some(u64::MAX)), p.t0);
    let info = p.st.key_info("forever", p.t0).expect("committed");
    assert!(info
        .soft_pin_remaining_ms
        .is_some_and(|ms| ms > 100 * 365 * 24 * 3600 * 1000));
    assert_eq!(p.st.held_by(c), (1, 0));
}

// ------------------------------------------------------------ membership across failovers

/// A new leader expects back the segments its predecessor listed in etcd;
/// each counts as back once it has re-mounted with its whole inventory
/// (an empty one at once). The master's recovery lasts until then.
#[test]
fn a_new_leader_expects_back_every_segment_its_predecessor_listed() {
    let cfg = StateConfig {
        client_ttl: Duration::from_secs(2),
        store_grace: Duration::from_secs(30),
        ..config()
    };
    let p = Pool::new(cfg);
    let (s1, s2) = (p.client(1), p.client(2));
    let now = p.at(0);
    p.st.expect_segments(Some(vec![SegmentId(1), SegmentId(2)]), now);
    assert_eq!((p.st.expecting(), p.st.recovered()), (2, false));
    p.mount(s1, 1, "a", MIB);
    assert_eq!((p.st.expecting(), p.st.recovered()), (1, false));
    assert_eq!(p.st.membership(), vec![SegmentId(1), SegmentId(2)]);
    p.st.mount(s2, segment(2, "b", MIB), 1, now).unwrap();
    assert_eq!(p.st.expecting(), 1, "back only once its inventory is in");
    let items = vec![inventory("on-b", 2, &region_at(BASE, OBJ))];
    p.st.report_objects(s2, SegmentId(2), items, true, now)
        .unwrap();
    assert_eq!((p.st.expecting(), p.st.recovered()), (0, true));
    assert!(p.get("on-b", now).is_ok());
}

/// While segments of before a failover are expected back, a commit of a
/// key the new leader knows no version of is answered only once every
/// lease an earlier leader granted is past its first half: until then a
/// client may read the key's old version, on a segment not back yet,
/// through its cache without asking.
#[test]
fn a_new_leader_holds_commits_until_old_leases_are_past_their_first_half() {
    let p = Pool::new(config());
    let t0 = p.at(0);
    p.st.begin_term(t0);
    assert_eq!(p.st.recovery_wait(t0), None, "nothing expected back");
    p.st.expect_segments(Some(vec![SegmentId(1)]), t0);
    let half = t0 + Duration::from_millis(500);
    assert_eq!(p.st.recovery_wait(t0), Some(half));
    assert_eq!(
        p.st.recovery_wait(half),
        None,
        "the leases' first half is over"
    );
    p.mount(p.client(1), 1, "a", MIB);
    assert_eq!(p.st.recovery_wait(t0), None, "every segment is back");
}

/// That hold ends sooner once every expected segment is back and the
/// copies they brought that the new leader rejected are destroyed (its own
/// invalidations delivered), not while such a destruction is owed: until
/// then an old lease may still read one.
#[test]
fn a_recovery_hold_ends_once_every_segment_is_back_and_its_rejected_copies_destroyed() {
    let p = Pool::new(config());
    let t0 = p.at(0);
    p.st.begin_term(t0);
    p.st.expect_segments(Some(vec![SegmentId(1), SegmentId(2)]), t0);
    let (s1, s2, w) = (p.client(1), p.client(2), p.client(3));
    p.mount(s1, 1, "a", MIB);
    let hold = FenceWait::at(p.st.recovery_wait(t0).expect("a segment is away"));
    let now = p.at(10);
    assert!(!p.st.fence_done(&hold, now), "a segment is still away");
    // Segment 2 comes back with an older copy of a key written since.
    p.commit_with(w, "k", OBJ, &preferring(&["a"], 1), now);
    p.st.mount(s2, segment(2, "b", MIB), 1, t0).unwrap();
    let old = inventory("k", 5, &region_at(BASE, OBJ));
    let v = p.st.report_objects(s2, SegmentId(2), vec![old], true, now);
    assert_eq!(v.unwrap().rejected, [(BASE, 5)]);
    assert!(
        !p.st.fence_done(&hold, now),
        "every segment is back, the rejected copy not destroyed yet"
    );
    // Its destruction is not delivered: the store owes it.
    let (batches, through) = p.st.take_invalidations();
    assert_eq!(batches.len(), 1);
    p.st.requeue_invalidations(SegmentId(2), batches[0].2.clone());
    p.st.invalidations_sent(through);
    assert!(!p.st.fence_done(&hold, now), "a store owes a destruction");
    let (_, through) = p.st.take_invalidations();
    p.st.invalidations_delivered(SegmentId(2));
    p.st.invalidations_sent(through);
    assert!(p.st.recovery_settled());
    assert!(
        p.st.fence_done(&hold, now),
        "settled before the leases' half"
    );
}

/// A new leader that evicts a key's newest version while a segment its
/// predecessor listed is still away must not take an older version of the
/// key from that segment when it comes back: the upsert that replaced it
/// was acknowledged. The chaos harness read replaced values that way after
/// failovers with big values, which evict during every recovery (finding
/// 25).
#[test]
fn a_key_evicted_during_a_recovery_is_not_taken_back_from_a_late_segment() {
    let p = Pool::new(config());
    let t0 = p.at(0);
    p.st.begin_term(t0);
    p.st.keep_tombstones(Vec::new(), t0);
    p.st.expect_segments(Some(vec![SegmentId(1), SegmentId(2)]), t0);
    let (s1, s2) = (p.client(1), p.client(2));
    p.st.mount(s1, segment(1, "a", MIB), 1, t0).unwrap();
    let newer = inventory("k", 7, &region_at(BASE, OBJ));
    let v = p.st.report_objects(s1, SegmentId(1), vec![newer], true, t0);
    assert_eq!(v.unwrap().accepted, 1);
    let now = p.at(10);
    assert!(p.st.evict(now, MIB).objects >= 1);
    assert_eq!(code(p.get("k", now)), OBJECT_NOT_FOUND);
    p.st.mount(s2, segment(2, "b", MIB), 1, now).unwrap();
    let older = inventory("k", 5, &region_at(BASE, OBJ));
    let v =
        p.st.report_objects(s2, SegmentId(2), vec![older], true, now);
    assert_eq!(v.unwrap().rejected, [(BASE, 5)], "the replaced version");
    assert_eq!(code(p.get("k", now)), OBJECT_NOT_FOUND);
    // In etcd for a leader taking over meanwhile; dropped once the
    // recovery settled (the rejected copy destroyed).
    let kept = || {
        let (_, _, tombs) = p.st.tombstones_to_write(u64::MAX, now).unwrap();
        tombs.into_iter().map(|t| t.key).collect::<Vec<_>>()
    };
    assert_eq!(kept(), ["k"]);
    deliver(&p.st);
    assert!(p.st.recovery_settled());
    assert!(kept().is_empty());
}

/// A pool with a 10 s client TTL (no grace): stores 1 and 2 own segments
/// "a" and "b", and client 3 writes.
fn two_stores() -> (Pool, ClientId, ClientId, ClientId) {
    let p = Pool::new(StateConfig {
        client_ttl: Duration::from_secs(10),
        ..config()
    });
    let (s1, s2, w) = (p.client(1), p.client(2), p.client(3));
    p.mount(s1, 1, "a", MIB);
    p.mount(s2, 2, "b", MIB);
    (p, s1, s2, w)
}

/// A store silent past the client TTL and the grace is given up; if it
/// comes back with its segment, a key written meanwhile and evicted since,
/// or removed meanwhile, must not be taken back from it (that copy is the
/// version the write or removal ended), while a key nobody wrote is, as
/// before.
#[test]
fn a_given_up_segment_does_not_bring_back_a_key_written_and_evicted_meanwhile() {
    let (p, s1, s2, w) = two_stores();
    let t0 = p.at(0);
    let (gk, rk) = p.commit_with(w, "k", OBJ, &preferring(&["a"], 1), t0);
    let (gj, rj) = p.commit_with(w, "j", OBJ, &preferring(&["a", "b"], 2), t0);
    let (gr, rr) = p.commit_with(w, "r", OBJ, &preferring(&["a", "b"], 2), t0);
    let now = p.at(11 * SEC);
    assert!(p.st.heartbeat(s2, now) && p.st.heartbeat(w, now));
    assert_eq!(p.st.sweep(now), vec![s1], "given up");
    p.commit_with(w, "k", OBJ, &preferring(&["b"], 1), now);
    p.remove("r", true, now).unwrap();
    deliver(&p.st);
    // Destroyed on every segment this master has: r's tombstone goes.
    let (_, _, tombs) = p.st.tombstones_to_write(0, now).unwrap();
    assert!(tombs.is_empty());
    assert!(p.st.evict(now, 64 * MIB).objects >= 1);
    assert_eq!(code(p.get("k", now)), OBJECT_NOT_FOUND);
    // The store comes back with what it held.
    p.st.register_client(s1, "host-1", now).unwrap();
    p.st.mount(s1, segment(1, "a", MIB), 2, now).unwrap();
    let items = vec![
        inventory("k", gk, &rk[0]),
        inventory("j", gj, &rj[0]),
        inventory("r", gr, &rr[0]),
    ];
    let v = p.st.report_objects(s1, SegmentId(1), items, true, now);
    let v = v.unwrap();
    assert_eq!(
        v.rejected,
        [(rk[0].offset, gk), (rr[0].offset, gr)],
        "k was written and r removed meanwhile (its tombstone gone with its delivery)"
    );
    assert_eq!(v.accepted, 1);
    assert_eq!(code(p.get("r", now)), OBJECT_NOT_FOUND);
    assert_eq!(code(p.get("k", now)), OBJECT_NOT_FOUND);
    assert_eq!(p.get("j", now).unwrap().generation, gj, "nobody wrote j");
}

/// A store given up may still serve its clients (cut off from the
/// master, not from them), and a client holding a young read lease on a
/// copy there reads it through its cached location without asking. A
/// write or removal of such a key is answered only once that lease's
/// first half is over, and reading there does not renew the lease: the
/// chaos harness read replaced values from a given-up store that way,
/// 0.1-0.5 s after the write was acknowledged (finding 27).
#[test]
fn a_write_of_a_key_read_on_a_given_up_store_waits_out_its_young_leases() {
    let (p, s1, s2, w) = two_stores();
    let t0 = p.at(0);
    p.commit_with(w, "k", OBJ, &preferring(&["a"], 1), t0);
    p.commit_with(w, "r", OBJ, &preferring(&["a", "b"], 2), t0);
    p.commit_with(w, "cold", OBJ, &preferring(&["a"], 1), t0);
    let (gj, _) = p.commit_with(w, "j", OBJ, &preferring(&["a", "b"], 2), t0);
    // Read just before the give-up: leased until 11.9 s, young until 11.4 s.
    let read = p.at(10_900);
    assert!(p.get("k", read).is_ok() && p.get("r", read).is_ok());
    let now = p.at(11 * SEC);
    assert!(p.st.heartbeat(s2, now) && p.st.heartbeat(w, now));
    assert_eq!(p.st.sweep(now), vec![s1], "given up");
    p.commit_with(w, "k", OBJ, &preferring(&["b"], 1), now);
    p.remove("r", true, now).unwrap();
    p.commit_with(w, "cold", OBJ, &preferring(&["b"], 1), now);
    // Every store this master can reach has destroyed what it was told to.
    deliver(&p.st);
    assert!(p.st.fence(["cold"], now).is_none(), "nobody read it lately");
    for key in ["k", "r"] {
        let wait = p.st.fence([key], now).expect("fenced");
        assert!(!p.st.fence_done(&wait, now), "{key}");
        assert!(!p.st.fence_done(&wait, p.at(11_399)), "{key}");
        assert!(p.st.fence_done(&wait, p.at(11_400)), "{key}");
    }
    // Nor does a read through a location cached before the give-up renew
    // its lease (it may name the given-up copy), until every such location
    // stopped being young: renewed, it would outlast the fence.
    let touch = |at_ms: u64| {
        let item = TouchItem {
            key: "j".into(),
            generation: gj,
            age_us: 0,
        };
        p.st.touch(&[item], p.at(at_ms))[0]
    };
    assert!(!touch(11_100), "read on a location that may name the copy");
    assert!(touch(11_500), "a location cached since");
}

/// A segment an earlier leader gave up (so left off the list it wrote)
/// that comes back to a new leader with objects: nothing tells the new
/// leader which of its keys were written and evicted meanwhile, so it takes
/// copies of versions it holds and rejects the rest. Without a list in
/// etcd (no earlier leader) it takes everything, as a restart recovery.
#[test]
fn a_segment_given_up_before_this_leader_brings_back_only_versions_it_holds() {
    for listed in [true, false] {
        let p = Pool::new(config());
        let t0 = p.at(0);
        p.st.begin_term(t0);
        p.st.expect_segments(listed.then(|| vec![SegmentId(1)]), t0);
        let (s1, s2) = (p.client(1), p.client(2));
        p.st.mount(s1, segment(1, "a", MIB), 1, t0).unwrap();
        let both = inventory("both", 7, &region_at(BASE, OBJ));
        let v =
            p.st.report_objects(s1, SegmentId(1), vec![both.clone()], true, t0);
        assert_eq!(v.unwrap().accepted, 1);
        p.st.mount(s2, segment(2, "b", MIB), 1, t0).unwrap();
        let only = inventory("only-b", 5, &region_at(BASE + OBJ, OBJ));
        let v =
            p.st.report_objects(s2, SegmentId(2), vec![both, only], true, t0);
        let v = v.unwrap();
        if listed {
            assert_eq!(v.rejected, [(BASE + OBJ, 5)], "listed: {listed}");
            assert_eq!(code(p.get("only-b", t0)), OBJECT_NOT_FOUND);
        } else {
            assert_eq!(v.accepted, 2, "listed: {listed}");
            assert!(p.get("only-b", t0).is_ok());
        }
        assert_eq!(p.get("both", t0).unwrap().replicas.len(), 2);
    }
}

/// A store given up while the list in etcd still names it (the leader
/// has not written the list since) would be taken back as it is by a
/// leader taking over now. So the newest version of a key it holds an
/// older copy of, evicted meanwhile, keeps its bytes until the list drops
/// the segment, or until the segment is back and that copy destroyed.
/// Chaos finding 26's last case: the newer bytes went with the give-up,
/// the leader stepped down before it could write the list, and the next
/// leader served the replaced version from the returning store. Back
/// empty (its store restarted with nothing), it releases them too: it
/// was held for good before, being listed again once mounted.
#[test]
fn a_segment_given_up_while_listed_holds_a_newer_version_back_until_unlisted() {
    for back in [None, Some(false), Some(true)] {
        let (p, s1, s2, w) = two_stores();
        p.st.expect_segments(Some(vec![]), p.at(0));
        p.st.membership_written(&[SegmentId(1), SegmentId(2)]);
        let t0 = p.at(0);
        let (g1, r1) = p.commit_with(w, "k", OBJ, &preferring(&["a"], 1), t0);
        p.start_with(w, "k", OBJ, &preferring(&["b"], 1), true, t0);
        p.end(w, "k", t0).unwrap();
        // The replaced copy's store cannot be told.
        let (inv, through) = p.st.take_invalidations();
        for (id, _, regions) in inv {
            p.st.requeue_invalidations(id, regions);
        }
        p.st.invalidations_sent(through);
        let now = p.at(11 * SEC);
        assert!(p.st.heartbeat(s2, now) && p.st.heartbeat(w, now));
        assert!(p.st.evict(now, 64 * MIB).objects >= 1);
        assert_eq!(p.st.sweep(now), vec![s1], "given up");
        // One round of the invalidation sender: which segments it told.
        let round = |p: &Pool| {
            let (inv, through) = p.st.take_invalidations();
            p.st.invalidations_sent(through);
            inv.into_iter().map(|(id, ..)| id).collect::<Vec<_>>()
        };
        assert_eq!(round(&p), [], "the newer version is held (back: {back:?})");
        if back == Some(false) {
            p.st.register_client(s1, "host-1", now).unwrap();
            p.st.mount(s1, segment(1, "a", MIB), 0, now).unwrap();
            p.st.membership_written(&[SegmentId(1), SegmentId(2)]);
        } else if back == Some(true) {
            p.st.register_client(s1, "host-1", now).unwrap();
            p.st.mount(s1, segment(1, "a", MIB), 1, now).unwrap();
            let items = vec![inventory("k", g1, &r1[0])];
            let v = p.st.report_objects(s1, SegmentId(1), items, true, now);
            assert_eq!(v.unwrap().rejected, [(r1[0].offset, g1)]);
            // A pass of the sender that has not sent the rejected copy's
            // destruction yet releases nothing.
            p.st.invalidations_sent(0);
            assert_eq!(round(&p), [SegmentId(1)], "the rejected copy first");
        } else {
            assert_eq!(p.st.membership(), [SegmentId(2)]);
            p.st.membership_written(&[SegmentId(2)]);
        }
        assert_eq!(round(&p), [SegmentId(2)], "then the newer version");
    }
}

/// A store this leader had mounted, given up while etcd's list still
/// names it, is one a leader taking over would take back as it is, like an
/// expected segment given up (finding 28): a key whose only copy it held,
/// written again and evicted meanwhile, would come back at its old
/// version. So the recovery is not settled until the list drops it, and
/// the eviction leaves a tombstone.
#[test]
fn a_store_given_up_while_listed_keeps_evictions_tombstoned_until_unlisted() {
    let (p, s1, s2, w) = two_stores();
    let t0 = p.at(0);
    p.st.expect_segments(Some(vec![]), t0);
    p.st.membership_written(&[SegmentId(1), SegmentId(2)]);
    p.st.keep_tombstones(Vec::new(), t0);
    p.commit_with(w, "k", OBJ, &preferring(&["a"], 1), t0);
    assert!(p.st.recovery_settled());
    let now = p.at(11 * SEC);
    assert!(p.st.heartbeat(s2, now) && p.st.heartbeat(w, now));
    assert_eq!(p.st.sweep(now), vec![s1], "given up");
    assert!(!p.st.recovery_settled(), "etcd's list still names it");
    p.commit_with(w, "k", OBJ, &preferring(&["b"], 1), now);
    assert!(p.st.evict(p.at(12 * SEC), 64 * MIB).objects >= 1);
    let (_, _, tombs) = p.st.tombstones_to_write(0, now).unwrap();
    assert!(
        tombs.iter().any(|t| t.key == "k"),
        "the eviction is tombstoned"
    );
    p.st.membership_written(&[SegmentId(2)]);
    assert!(p.st.recovery_settled());
}

/// A new leader (client TTL 2 s) that expected segments 1 and 9 back
/// after a failover: 1 came back with `items`, all taken; 9 was given up
/// at the instant returned, while etcd's list still names it.
fn segment_9_given_up(items: Vec<InventoryItem>) -> (Pool, Instant) {
    let p = Pool::new(StateConfig {
        client_ttl: Duration::from_secs(2),
        ..config()
    });
    let t0 = p.at(0);
    p.st.begin_term(t0);
    p.st.keep_tombstones(Vec::new(), t0);
    p.st.expect_segments(Some(vec![SegmentId(1), SegmentId(9)]), t0);
    let s1 = p.client(1);
    p.st.mount(s1, segment(1, "a", MIB), 1, t0).unwrap();
    let n = items.len() as u64;
    let v = p.st.report_objects(s1, SegmentId(1), items, true, t0);
    assert_eq!(v.unwrap().accepted, n);
    let now = p.at(3 * SEC);
    assert!(p.st.heartbeat(s1, now));
    p.st.sweep(now);
    deliver(&p.st);
    assert_eq!(p.st.expecting(), 0, "segment 9 given up");
    assert!(!p.st.recovery_settled(), "etcd's list still names it");
    (p, now)
}

/// A new leader gives up a listed segment that did not come back, then
/// evicts a key before it could write the shorter list to etcd. A leader
/// taking over would expect that segment back and take an older version
/// of the key from it, so the recovery has not settled until the list
/// drops it: the eviction leaves a tombstone, and the evicted bytes stay
/// until the tombstone is in etcd; a removal answers only once its
/// tombstone is there. The chaos harness read replaced values
/// after such a step-down (finding 28).
#[test]
fn an_eviction_before_a_given_up_segment_is_unlisted_waits_for_its_tombstone() {
    let k = inventory("k", 7, &region_at(BASE, OBJ));
    let r = inventory("r", 8, &region_at(BASE + OBJ, OBJ));
    let (p, now) = segment_9_given_up(vec![k, r]);
    // A removal answers only once its tombstone is in etcd, delivered or
    // not, and keeps it there.
    p.remove("r", true, now).unwrap();
    let reply = p.st.fence(["r"], now).expect("fenced");
    deliver(&p.st);
    let (_, through, _) = p.st.tombstones_to_write(0, now).unwrap();
    assert!(!p.st.fence_done(&reply, now), "not durable yet");
    p.st.tombstones_written(through);
    assert!(p.st.fence_done(&reply, now));
    assert!(p.st.evict(now, MIB).objects >= 1);
    let round = |p: &Pool| {
        let (inv, through) = p.st.take_invalidations();
        p.st.invalidations_sent(through);
        inv.into_iter().map(|(id, ..)| id).collect::<Vec<_>>()
    };
    assert_eq!(round(&p), [], "held until its tombstone is durable");
    let (_, through, tombs) = p.st.tombstones_to_write(0, now).unwrap();
    assert_eq!(
        tombs.iter().map(|t| &*t.key).collect::<Vec<_>>(),
        ["r", "k"]
    );
    p.st.tombstones_written(through);
    assert_eq!(round(&p), [SegmentId(1)], "then destroyed");
    p.st.membership_written(&[SegmentId(1)]);
    assert!(p.st.recovery_settled());
}

/// A segment given up while etcd's list still named it that comes back
/// before the list drops it is mounted, so the next list names it again.
/// Its copies are reconciled here (the older ones rejected), so once those
/// are destroyed the recovery settles; it stayed unsettled for the rest of
/// the term before, with every eviction waiting for its tombstone.
#[test]
fn a_given_up_segment_back_before_the_list_drops_it_lets_the_recovery_settle() {
    let (p, now) = segment_9_given_up(vec![inventory("k", 7, &region_at(BASE, OBJ))]);
    // Back before the list was written, with a copy of a key this master
    // holds no version of: rejected.
    let s9 = p.client(9);
    p.st.mount(s9, segment(9, "b", MIB), 1, now).unwrap();
    let old = inventory("old", 5, &region_at(BASE, OBJ));
    let v = p.st.report_objects(s9, SegmentId(9), vec![old], true, now);
    assert_eq!(v.unwrap().rejected, [(BASE, 5)]);
    p.st.membership_written(&[SegmentId(1), SegmentId(9)]);
    assert!(
        !p.st.recovery_settled(),
        "its rejected copy is not destroyed yet"
    );
    deliver(&p.st);
    assert!(p.st.recovery_settled());
}

/// A listed segment that stays away past the client TTL and the store
/// grace is given up, as a silent store is, and left off the next list.
#[test]
fn an_expected_segment_that_never_returns_is_given_up_after_ttl_and_grace() {
    let cfg = StateConfig {
        client_ttl: Duration::from_secs(2),
        store_grace: Duration::from_secs(30),
        ..config()
    };
    let p = Pool::new(cfg);
    p.st.expect_segments(Some(vec![SegmentId(7)]), p.at(0));
    p.st.sweep(p.at(31 * SEC));
    assert_eq!(p.st.expecting(), 1);
    p.st.sweep(p.at(32 * SEC));
    assert_eq!((p.st.expecting(), p.st.recovered()), (0, true));
    assert!(p.st.membership().is_empty());
    // Without a list (a pool's first leader) nothing is expected, and the
    // recovery is not known to be complete: it runs its grace.
    p.st.expect_segments(None, p.at(40 * SEC));
    assert_eq!((p.st.expecting(), p.st.recovered()), (0, false));
}

/// With HA, a segment takes objects only once the list in etcd names it,
/// so the next leader always expects every segment that holds objects.
#[test]
fn a_segment_takes_objects_only_once_the_list_names_it() {
    let p = Pool::new(config());
    let c = p.client(1);
    p.st.expect_segments(Some(vec![]), p.at(0));
    p.mount(c, 1, "a", MIB);
    assert_eq!(code(p.put(c, "k", OBJ, p.at(0))), UNAVAILABLE);
    p.st.membership_written(&[SegmentId(1)]);
    assert!(p.put(c, "k", OBJ, p.at(0)).is_ok());
}
