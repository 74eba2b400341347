//! The disk tier in the master's state: demotions keep a store's memory
//! below the watermark with its least recently used objects, a second read
//! on disk promotes, a move of a version that changed meanwhile is undone,
//! and a full disk tier evicts its own least recently used objects. The
//! store's side of a move is stood in for by answering the tickets.

use std::time::Duration;

use kvpool_master::state::{MasterState, MountSpec, MoveTicket, StateConfig};
use kvpool_proto::msg::{
    ClientId, InventoryItem, PutEndItem, PutGrant, PutItem, ReplicateConfig, SegmentId,
    SegmentInfo, Tier, TouchItem, DISK_BLOCK,
};
use kvpool_proto::{Code, KvError};
use tokio::time::Instant;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const MEMORY: u128 = 1;
const DISK: u128 = 2;
/// Region bytes of each object put here (the key is 5 bytes: "k-NNN").
const OBJ: u64 = 64 * KIB;

fn segment(id: u128, tier: Tier, size: u64) -> SegmentInfo {
    SegmentInfo {
        id: SegmentId(id),
        name: format!("seg-{id}"),
        endpoint: "10.0.0.1:7000".into(),
        base: DISK_BLOCK,
        size,
        path: None,
        tier,
    }
}

struct Pool {
    st: MasterState,
    t0: Instant,
    store: ClientId,
}

impl Pool {
    /// One store lending `memory` bytes of memory and `disk` of disk.
    fn new(memory: u64, disk: u64) -> Pool {
        let st = MasterState::new(StateConfig {
            lease_ttl: Duration::from_millis(100),
            demote_watermark: 0.5,
            eviction_ratio: 0.1,
            client_ttl: Duration::from_secs(3600),
            ..StateConfig::default()
        });
        let t0 = Instant::now();
        let store = ClientId(1);
        st.register_client(store, "store", t0).unwrap();
        st.mount(store, segment(MEMORY, Tier::Memory, memory), 0, t0)
            .unwrap();
        st.mount(store, segment(DISK, Tier::Disk, disk), 0, t0)
            .unwrap();
        Pool { st, t0, store }
    }

    /// A store whose memory is past the demotion watermark: 40 objects
    /// (`k-000`..`k-039`, put at 0-39 ms) in 4 MiB, and 16 MiB of disk.
    fn filled() -> Pool {
        let p = Pool::new(4 * MIB, 16 * MIB);
        for i in 0..40 {
            p.put(&format!("k-{i:03}"), i, false);
        }
        p
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// Puts `key` (committed) at `ms`; its generation.
    fn put(&self, key: &str, ms: u64, upsert: bool) -> u64 {
        let item = PutItem {
            key: key.into(),
            value_len: OBJ - 64,
            region_len: OBJ,
        };
        let g = self
            .st
            .put_start(
                self.store,
                &[item],
                &ReplicateConfig::default(),
                upsert,
                self.at(ms),
            )
            .remove(0)
            .unwrap();
        let PutGrant::Write {
            generation,
            replicas,
        } = g
        else {
            panic!("{key} exists");
        };
        assert_eq!(replicas[0].segment, SegmentId(MEMORY), "puts go to memory");
        let end = PutEndItem {
            key: key.into(),
            generation,
        };
        self.st
            .put_end(self.store, &[end], self.at(ms))
            .remove(0)
            .unwrap();
        generation
    }

    /// Where `key` lives now, reading it at `ms` (a read lease, and a read
    /// on disk counts towards a promotion).
    fn where_is(&self, key: &str, ms: u64) -> Vec<(u128, u64)> {
        self.st
            .get_replica_list(&[key.to_string()], self.at(ms))
            .remove(0)
            .map(|l| l.replicas.iter().map(|r| (r.segment.0, r.offset)).collect())
            .unwrap_or_default()
    }

    fn plan(&self, ms: u64) -> Vec<MoveTicket> {
        self.st
            .plan_tier_moves(self.at(ms))
            .into_iter()
            .flat_map(|(endpoint, t)| {
                assert_eq!(endpoint, "10.0.0.1:7000");
                t
            })
            .collect()
    }

    /// Answers every ticket as the store would have (all copied), and
    /// sends the invalidations that queued, as the master's task would.
    fn finish(&self, tickets: Vec<MoveTicket>, ms: u64) {
        let done = tickets.into_iter().map(|t| (t, Ok(()))).collect();
        self.st.finish_tier_moves(done, self.at(ms));
        self.invalidate();
    }

    /// What the invalidator task does: takes what is queued and reports it sent.
    fn invalidate(&self) -> Vec<(SegmentId, Vec<(u64, u64)>)> {
        let (batches, through) = self.st.take_invalidations();
        self.st.invalidations_sent(through);
        batches.into_iter().map(|(s, _, r)| (s, r)).collect()
    }
}

#[test]
fn demotions_move_the_least_recently_used_and_keep_them_readable() {
    let p = Pool::new(4 * MIB, 16 * MIB);
    // 40 objects of 64 KiB, one every 100 ms: 2.5 MiB of 4, above the 0.5
    // watermark.
    for i in 0..40 {
        p.put(&format!("k-{i:03}"), i * 100, false);
    }
    // k-000..k-009 read again at 4.5 s: recent, they stay.
    for i in 0..10 {
        p.where_is(&format!("k-{i:03}"), 4500);
    }
    let tickets = p.plan(5000);
    assert!(!tickets.is_empty());
    let moved: Vec<&str> = tickets.iter().map(|t| t.key.as_str()).collect();
    for t in &tickets {
        assert!(!t.promote);
        assert_eq!((t.mv.from, t.mv.to), (SegmentId(MEMORY), SegmentId(DISK)));
        assert_eq!(
            t.mv.to_offset % DISK_BLOCK,
            0,
            "disk regions are block-aligned"
        );
        assert_eq!(t.mv.len, 40 + 5 + OBJ - 64, "header and value are copied");
    }
    // Down to 0.4 of 4 MiB: 0.9 of the 2.5 MiB used (15 objects) must go,
    // the oldest first (to within the 1/8 of an idle time LRU ranks by).
    assert_eq!(tickets.len(), 15);
    assert!(
        moved.iter().all(|k| ("k-010".."k-030").contains(k)),
        "{moved:?}"
    );
    assert!(
        moved.contains(&"k-010") && moved.contains(&"k-015"),
        "{moved:?}"
    );
    // Planned twice, nothing moves twice.
    assert!(p
        .plan(5001)
        .iter()
        .all(|t| !moved.contains(&t.key.as_str())));
    let mem_used_before = p.st.tier_usage(Tier::Memory).1;
    let first = tickets[0].clone();
    let done = tickets.into_iter().map(|t| (t, Ok(()))).collect();
    p.st.finish_tier_moves(done, p.at(5100));
    assert_eq!(
        p.where_is(&first.key, 5200),
        vec![(DISK, first.mv.to_offset)]
    );
    assert_eq!(p.st.demotions(), 15);
    // The memory copy left behind is destroyed on the store, and its room
    // is free only once that was sent.
    assert_eq!(p.st.tier_usage(Tier::Memory).1, mem_used_before);
    let inv = p.invalidate();
    assert!(inv.iter().any(|(seg, regions)| *seg == SegmentId(MEMORY)
        && regions.contains(&(first.mv.from_offset, first.mv.generation))));
    assert!(p.st.tier_usage(Tier::Memory).1 < mem_used_before);
    assert!(p.st.tier_usage(Tier::Disk).1 > 0);
    let st = p.st.status();
    assert_eq!(st.demotions, p.st.demotions());
}

#[test]
fn a_second_read_on_disk_promotes() {
    let p = Pool::filled();
    let tickets = p.plan(1000);
    let key = tickets[0].key.clone();
    p.finish(tickets, 1100);
    assert_eq!(
        p.where_is(&key, 1200)[0].0,
        DISK,
        "first read: stays on disk"
    );
    assert!(p.plan(1300).iter().all(|t| !t.promote));
    p.where_is(&key, 1400);
    let promoted: Vec<MoveTicket> = p.plan(1500).into_iter().filter(|t| t.promote).collect();
    assert_eq!(promoted.len(), 1, "second read: promoted");
    let t = &promoted[0];
    assert_eq!(
        (t.key.as_str(), t.mv.from, t.mv.to),
        (key.as_str(), SegmentId(DISK), SegmentId(MEMORY))
    );
    let to = t.mv.to_offset;
    p.finish(promoted, 1600);
    assert_eq!(p.where_is(&key, 1700), vec![(MEMORY, to)]);
    assert_eq!(p.st.promotions(), 1);
}

/// A reader may hold a moved object's old location in its cache and read
/// it without asking the master; a replace or a removal destroys only the
/// replicas the master lists. So the copy a move leaves behind is destroyed
/// at once, even under a live read lease: only the region's reuse waits
/// for the lease.
#[test]
fn the_copy_a_move_leaves_is_destroyed_at_once_even_under_a_lease() {
    let p = Pool::filled();
    let tickets = p.plan(1000);
    let (t, moved) = (tickets[0].clone(), tickets.len() as u64);
    // Read (and leased, 100 ms) where it is before the move finishes.
    assert_eq!(p.where_is(&t.key, 1050), vec![(MEMORY, t.mv.from_offset)]);
    let memory_used = p.st.tier_usage(Tier::Memory).1;
    let done = tickets.into_iter().map(|t| (t, Ok(()))).collect();
    p.st.finish_tier_moves(done, p.at(1060));
    assert_eq!(p.where_is(&t.key, 1070), vec![(DISK, t.mv.to_offset)]);
    let inv = p.invalidate();
    assert!(
        inv.iter().any(|(seg, regions)| *seg == SegmentId(MEMORY)
            && regions.contains(&(t.mv.from_offset, t.mv.generation))),
        "the leased copy left behind is not destroyed: {inv:?}"
    );
    // Its room stays reserved until the lease ends; the others' is free.
    let left = memory_used - (moved - 1) * OBJ;
    assert_eq!(p.st.tier_usage(Tier::Memory).1, left);
}

/// The copy a move left behind under a read lease, whose store could not
/// be told to destroy it, is as readable as a replica to a client holding
/// its old location: an upsert or a removal of the key must wait for it as
/// for the replicas the master lists, until it is destroyed or no young
/// lease can read it. The chaos harness read a replaced 1 MiB value that
/// way, 0.4 s after the upsert answered (finding 25).
#[test]
fn an_undelivered_copy_left_by_a_move_fences_the_next_upsert_and_removal() {
    let p = Pool::new(4 * MIB, 16 * MIB);
    p.st.keep_tombstones(Vec::new(), p.at(0));
    for i in 0..40 {
        p.put(&format!("k-{i:03}"), i, false);
    }
    let tickets = p.plan(1000);
    let (upserted, removed) = (tickets[0].key.clone(), tickets[1].key.clone());
    // Read (leased for 100 ms, young for 50) where they are, then moved.
    for k in [&upserted, &removed] {
        assert_eq!(p.where_is(k, 1010)[0].0, MEMORY);
    }
    let done = tickets.into_iter().map(|t| (t, Ok(()))).collect();
    p.st.finish_tier_moves(done, p.at(1020));
    // The memory segment's store is unreachable: the copies stay.
    let deliver_disk_only = || {
        let (inv, through) = p.st.take_invalidations();
        for (id, _, regions) in inv {
            if id == SegmentId(MEMORY) {
                p.st.requeue_invalidations(id, regions);
            } else {
                p.st.invalidations_delivered(id);
            }
        }
        p.st.invalidations_sent(through);
    };
    deliver_disk_only();
    p.put(&upserted, 1030, true);
    p.st.remove(std::slice::from_ref(&removed), true, p.at(1030))
        .remove(0)
        .unwrap();
    let waits: Vec<_> = [&upserted, &removed]
        .iter()
        .map(|k| p.st.fence([k.as_str()], p.at(1030)).expect("fenced"))
        .collect();
    deliver_disk_only();
    for w in &waits {
        assert!(
            !p.st.fence_done(w, p.at(1040)),
            "the left copy is still readable through a young cached location"
        );
    }
    // The removal's tombstone outlives the copies it knew of: a new leader
    // must not take the key back from the left copy's inventory.
    let tombs = |ms| {
        let (_, through, tombs) = p.st.tombstones_to_write(u64::MAX, p.at(ms)).unwrap();
        p.st.tombstones_written(through);
        tombs.into_iter().map(|t| t.key).collect::<Vec<_>>()
    };
    assert_eq!(tombs(1040), vec![removed.clone()]);
    // Delivered at last: the replies go.
    let (inv, through) = p.st.take_invalidations();
    for (id, ..) in inv {
        p.st.invalidations_delivered(id);
    }
    p.st.invalidations_sent(through);
    for w in &waits {
        assert!(p.st.fence_done(w, p.at(1041)));
    }
    assert!(tombs(1041).is_empty(), "every copy is destroyed");
}

/// The move's fence holds the next upsert while a location cached before
/// the move is young, but a read through such a location renewed its lease
/// (same version), so the client kept reading the copy the move left, on a
/// store cut off from the master only, past the fence and after the upsert
/// was answered. Reads before every such location stopped being young now
/// renew nothing; later ones do, as only a location handed out since the
/// move can be young then.
#[test]
fn a_read_through_a_location_cached_before_a_move_renews_no_lease() {
    let p = Pool::filled();
    let tickets = p.plan(1000);
    let (key, generation) = (tickets[0].key.clone(), tickets[0].mv.generation);
    // Leased for 100 ms from 1010, so young until 1060.
    assert_eq!(p.where_is(&key, 1010)[0].0, MEMORY);
    let done = tickets.into_iter().map(|t| (t, Ok(()))).collect();
    p.st.finish_tier_moves(done, p.at(1020));
    let touch = |read_ms: u64, at_ms: u64| {
        let item = TouchItem {
            key: key.clone(),
            generation,
            age_us: (at_ms - read_ms) * 1000,
        };
        p.st.touch(&[item], p.at(at_ms))[0]
    };
    assert!(!touch(1050, 1055), "the location may name the left copy");
    assert!(
        !touch(1059, 1200),
        "reported late: still a read before 1060"
    );
    assert!(touch(1060, 1065), "a location cached since the move");
    // Other keys' renewals are not held up.
    let other = "k-039";
    let read = p.st.get_replica_list(&[other.into()], p.at(1030));
    let item = TouchItem {
        key: other.into(),
        generation: read[0].as_ref().unwrap().generation,
        age_us: 0,
    };
    assert!(p.st.touch(&[item], p.at(1040))[0]);
}

/// A move answered only after its destination was mounted again (its store
/// cut off and back, the answer held up in the cut): the new mount's scan
/// found the copy and the map, not holding it there, rejected it, so the
/// store destroys it. The late answer must leave the object where it was,
/// readable, and give the copy's room back; taken as moved, it lost its
/// source too, and the object was on no store (chaos finding 22).
#[test]
fn a_move_answered_after_its_destination_was_mounted_again_keeps_its_source() {
    let p = Pool::filled();
    let tickets = p.plan(1000);
    assert!(!tickets.is_empty(), "nothing to demote");
    let memory_used = p.st.tier_usage(Tier::Memory).1;
    // Every copy landed before the store was cut off; it mounts its disk
    // again under a new fence and reports what its scan found.
    let mut items: Vec<InventoryItem> = tickets
        .iter()
        .map(|t| InventoryItem {
            key: t.key.clone(),
            generation: t.mv.generation,
            value_len: OBJ - 64,
            offset: t.mv.to_offset,
            region_len: t.mv.len.next_multiple_of(DISK_BLOCK),
        })
        .collect();
    items.sort_unstable_by_key(|i| i.offset);
    let spec = MountSpec {
        objects: items.len() as u64,
        fence: 2,
        ..MountSpec::default()
    };
    p.st.mount_scanned(
        p.store,
        segment(DISK, Tier::Disk, 16 * MIB),
        spec,
        p.at(1100),
    )
    .unwrap();
    let verdict =
        p.st.report_objects(p.store, SegmentId(DISK), items.clone(), true, p.at(1100))
            .unwrap();
    assert_eq!(verdict.accepted, 0);
    assert_eq!(
        verdict.rejected.len(),
        items.len(),
        "the copies are not the map's"
    );
    // Then the answers arrive.
    let first = tickets[0].clone();
    p.finish(tickets, 1200);
    assert_eq!(
        p.where_is(&first.key, 1300),
        vec![(MEMORY, first.mv.from_offset)],
        "the object left its source for a copy its store destroyed"
    );
    assert_eq!(
        p.st.tier_usage(Tier::Memory).1,
        memory_used,
        "a source was freed"
    );
    p.invalidate();
    assert_eq!(
        p.st.tier_usage(Tier::Disk).1,
        0,
        "the copies' room was never given back"
    );
}

/// A pool keeping tombstones (as with HA) with 40 keys and moves planned
/// at 1 s: the tickets, a key being moved and one that is not.
fn moves_under_way() -> (Pool, Vec<MoveTicket>, String, String) {
    let p = Pool::new(4 * MIB, 16 * MIB);
    p.st.keep_tombstones(Vec::new(), p.at(0));
    for i in 0..40 {
        p.put(&format!("k-{i:03}"), i, false);
    }
    let tickets = p.plan(1000);
    let moving = tickets[0].key.clone();
    let resting = (0..40)
        .map(|i| format!("k-{i:03}"))
        .find(|k| tickets.iter().all(|t| &t.key != k))
        .expect("a key not moving");
    (p, tickets, moving, resting)
}

/// A key removed while a move copies it: the copy may land after the
/// removal and is destroyed only when the move finishes, so the removal's
/// tombstone (which makes a new leader reject inventory copies of the key)
/// outlives the destruction of the replicas it knew.
#[test]
fn a_removal_during_a_move_keeps_its_tombstone_past_the_replicas() {
    let (p, tickets, moving, resting) = moves_under_way();
    for k in [&moving, &resting] {
        p.st.remove(std::slice::from_ref(k), true, p.at(1050))
            .remove(0)
            .unwrap();
    }
    p.invalidate();
    let kept = |ms| {
        let (_, _, tombs) = p.st.tombstones_to_write(u64::MAX, p.at(ms)).unwrap();
        tombs.into_iter().map(|t| t.key).collect::<Vec<_>>()
    };
    assert_eq!(
        kept(1100),
        vec![moving.clone()],
        "only the moving key's stays"
    );
    let done = tickets.into_iter().map(|t| (t, Ok(()))).collect();
    p.st.finish_tier_moves(done, p.at(1200));
    assert!(
        p.where_is(&moving, 1300).is_empty(),
        "the copy was not attached"
    );
}

/// A removal of a key whose tier move is in flight is answered only once
/// its tombstone is durable (in etcd, with HA), even though the replicas'
/// destruction was delivered: the move's copy is destroyed only when the
/// move finishes, and if the leader dies first only the tombstone keeps
/// the next leader from taking that copy back (chaos finding 24: a
/// removed key back after two failovers). A key not moving goes once its
/// destruction is delivered.
#[test]
fn a_removal_during_a_move_is_answered_once_its_tombstone_is_durable() {
    let (p, _, moving, resting) = moves_under_way();
    let now = p.at(1050);
    let mut waits = Vec::new();
    for k in [&moving, &resting] {
        p.st.remove(std::slice::from_ref(k), false, now)
            .remove(0)
            .unwrap();
        waits.push(p.st.fence([k.as_str()], now).expect("a removal waits"));
    }
    p.invalidate();
    let later = p.at(1060);
    assert!(
        p.st.fence_done(&waits[1], later),
        "the resting key's is delivered"
    );
    assert!(
        !p.st.fence_done(&waits[0], later),
        "the moving key's tombstone is not in etcd yet"
    );
    let (_, through, _) = p.st.tombstones_to_write(u64::MAX, later).unwrap();
    p.st.tombstones_written(through);
    assert!(p.st.fence_done(&waits[0], later), "durable now");
}

/// A key upserted while a move of its old version is in flight, and then
/// evicted: the move's copy of the old version is destroyed only when the
/// move finishes, so the new version's bytes must stay until then. Destroyed
/// first, they leave that copy the newest of the key on the stores, and a
/// leader that dies before the move finishes hands the next one the
/// replaced value (chaos finding 25: a store cut off with moves in flight,
/// the key upserted and evicted meanwhile, the leader gone).
#[test]
fn a_version_evicted_while_an_older_one_moves_outlives_the_moves_copy() {
    let (p, tickets, moving, _) = moves_under_way();
    let t = tickets.iter().find(|t| t.key == moving).unwrap().clone();
    let newer = p.put(&moving, 1050, true);
    p.invalidate();
    assert!(p.st.evict(p.at(1100), 64 * MIB).objects > 0);
    assert!(p.where_is(&moving, 1100).is_empty(), "evicted");
    let destroys = |inv: &[(SegmentId, Vec<(u64, u64)>)], generation: u64| {
        inv.iter()
            .flat_map(|(_, regions)| regions)
            .any(|&(_, g)| g == generation)
    };
    assert!(
        !destroys(&p.invalidate(), newer),
        "the new version goes while the old one's copy may still land"
    );
    // The move ends: its copy goes, and then the new version.
    p.st.finish_tier_moves(vec![(t.clone(), Ok(()))], p.at(1200));
    let first = p.invalidate();
    assert!(first
        .iter()
        .any(|(s, r)| *s == SegmentId(DISK) && r.contains(&(t.mv.to_offset, t.mv.generation))));
    let then = p.invalidate();
    assert!(
        !destroys(&first, newer) && destroys(&then, newer),
        "after the move's copy: {first:?} then {then:?}"
    );
}

#[test]
fn a_move_of_a_version_replaced_meanwhile_is_undone() {
    let p = Pool::filled();
    let tickets = p.plan(1000);
    let (replaced_key, removed_key, failed_key) = (
        tickets[0].key.clone(),
        tickets[1].key.clone(),
        tickets[2].key.clone(),
    );
    let failed_from = tickets[2].mv.from_offset;
    let new_gen = p.put(&replaced_key, 1050, true);
    p.st.remove(std::slice::from_ref(&removed_key), true, p.at(1050))
        .remove(0)
        .unwrap();
    let copies: Vec<(u64, u64)> = tickets[..3]
        .iter()
        .map(|t| (t.mv.to_offset, t.mv.generation))
        .collect();
    p.invalidate();
    let mut done: Vec<_> = tickets.into_iter().map(|t| (t, Ok(()))).collect();
    done[2].1 = Err(KvError::from(Code::TransferFail));
    p.st.finish_tier_moves(done, p.at(1100));
    // The upserted key is its new version, in memory; the failed move left
    // its object where it was; the removed key stays removed.
    let l =
        p.st.get_replica_list(std::slice::from_ref(&replaced_key), p.at(1200))
            .remove(0)
            .unwrap();
    assert_eq!(
        (l.generation, l.replicas[0].segment),
        (new_gen, SegmentId(MEMORY))
    );
    assert_eq!(p.where_is(&failed_key, 1200), vec![(MEMORY, failed_from)]);
    assert!(p.where_is(&removed_key, 1200).is_empty());
    // All three copies on disk are destroyed.
    let on_disk: Vec<(u64, u64)> = p
        .invalidate()
        .into_iter()
        .filter(|(s, _)| *s == SegmentId(DISK))
        .flat_map(|(_, r)| r)
        .collect();
    for c in copies {
        assert!(on_disk.contains(&c), "{c:?} not destroyed: {on_disk:?}");
    }
}

#[test]
fn a_full_disk_tier_evicts_its_own_least_recently_used() {
    // 1 MiB of disk holds 16 objects (each takes 16 blocks of 4 KiB).
    let p = Pool::new(4 * MIB, MIB);
    // The keys each planning round demoted (within a round, in scan order).
    let mut rounds: Vec<Vec<String>> = Vec::new();
    for round in 0..6u64 {
        for i in 0..10 {
            p.put(&format!("k-{round}{i:02}"), round * 1000 + i, false);
        }
        let t = p.plan(round * 1000 + 500);
        rounds.push(t.iter().map(|t| t.key.clone()).collect());
        p.finish(t, round * 1000 + 600);
        // Disk regions the evictions freed come back once destroyed.
        p.invalidate();
    }
    rounds.retain(|r| !r.is_empty());
    let demoted: usize = rounds.iter().map(Vec::len).sum();
    assert!(demoted > 16, "more demoted than the disk holds: {demoted}");
    let (cap, used) = p.st.tier_usage(Tier::Disk);
    assert!(used <= cap);
    // Some demoted objects were evicted from disk: not found, never wrong.
    let gone = |r: &Vec<String>| r.iter().filter(|k| p.where_is(k, 9000).is_empty()).count();
    assert!(
        gone(&rounds[0]) > 0,
        "the oldest round lost objects: {rounds:?}"
    );
    assert!(p.st.evictions() > 0);
    // The most recently demoted are all still on disk.
    for k in rounds.last().unwrap() {
        assert_eq!(p.where_is(k, 9000)[0].0, DISK, "{k}");
    }
}

#[test]
fn a_full_disk_tier_evicts_once_until_its_store_destroyed_what_went() {
    // 1 MiB of disk holds 16 objects; memory's watermark is 32 of 64.
    let p = Pool::new(4 * MIB, MIB);
    for i in 0..40 {
        p.put(&format!("k-{i:03}"), i, false);
    }
    let t = p.plan(500);
    assert_eq!(t.len(), 15);
    p.finish(t, 600);
    for i in 40..60 {
        p.put(&format!("k-{i:03}"), 1000 + i, false);
    }
    // The disk tier fills: the round evicts from it, and those regions are
    // reused once the store has destroyed the objects in them.
    let _in_flight = p.plan(1500);
    let evicted = p.st.evictions();
    assert!(evicted > 0, "the full disk tier evicted");
    // Rounds until then evict nothing more: the room is on its way.
    for ms in [1510, 1520, 1530] {
        assert!(p.plan(ms).is_empty());
        assert_eq!(p.st.evictions(), evicted, "evicted again at {ms} ms");
    }
    p.invalidate();
    assert!(!p.plan(1600).is_empty(), "the room freed is used");
}

#[test]
fn stores_without_a_disk_tier_plan_nothing() {
    let st = MasterState::new(StateConfig {
        demote_watermark: 0.1,
        ..StateConfig::default()
    });
    let t0 = Instant::now();
    st.register_client(ClientId(1), "s", t0).unwrap();
    st.mount(ClientId(1), segment(MEMORY, Tier::Memory, 4 * MIB), 0, t0)
        .unwrap();
    // A disk segment of another store does not take this store's objects.
    st.register_client(ClientId(2), "t", t0).unwrap();
    st.mount(ClientId(2), segment(DISK, Tier::Disk, 4 * MIB), 0, t0)
        .unwrap();
    let item = PutItem {
        key: "x".into(),
        value_len: MIB,
        region_len: MIB + 64,
    };
    let g = st
        .put_start(ClientId(1), &[item], &ReplicateConfig::default(), false, t0)
        .remove(0)
        .unwrap();
    let PutGrant::Write {
        generation,
        replicas,
    } = g
    else {
        panic!()
    };
    assert_eq!(
        replicas[0].segment,
        SegmentId(MEMORY),
        "never placed on disk"
    );
    st.put_end(
        ClientId(1),
        &[PutEndItem {
            key: "x".into(),
            generation,
        }],
        t0,
    )
    .remove(0)
    .unwrap();
    assert!(st.has_disk_tier());
    assert!(st.plan_tier_moves(t0 + Duration::from_secs(1)).is_empty());
}
