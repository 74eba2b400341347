//! Replica management beside puts: copies of an object's current version
//! to more segments (a client reads the object and writes it into regions
//! reserved here, then commits them), moves (a copy that drops the source
//! replica), clearing replicas off a segment, and the table of replica
//! tasks (Mooncake's copy and move tasks) that clients carry out and report.
//!
//! A copy never changes the object's version: readers keep reading it from
//! its old replicas meanwhile, and a copy of a version replaced before its
//! commit is freed instead of attached.

use std::collections::{HashMap, HashSet, VecDeque};

use kvpool_proto::msg::{
    task_kind, task_status, to_wire, ClientId, ObjectLocation, Replica, ReplicaPlan, SegmentId,
    TaskInfo,
};
use kvpool_proto::{validate_key, Code, KvError, KvResult};
use tokio::time::Instant;

use crate::alloc::Region;

use super::objects::{Tick, Version};
use super::table::SegNo;
use super::{ms, wall_nanos, MasterState};

/// Tasks kept for queries; the oldest finished ones are forgotten beyond it.
const MAX_TASKS: usize = 100_000;

/// A region reserved on one segment for a copy of an object in flight.
pub(super) struct PendingCopy {
    owner: ClientId,
    started: Instant,
    generation: u64,
    region: Region,
    /// The fence of its segment's mount when it was reserved.
    fence: u64,
}

/// Copies in flight, by key and target segment.
pub(super) type Copies = HashMap<(Box<str>, SegmentId), PendingCopy>;

/// Replica tasks by id, and their ids oldest first.
#[derive(Default)]
pub(super) struct TaskTable {
    tasks: HashMap<u128, TaskInfo>,
    order: VecDeque<u128>,
}

fn wall_ms() -> u64 {
    wall_nanos() / 1_000_000
}

impl MasterState {
    /// The id of the mounted segment named `name` (or with that id in hex).
    fn segment_named(&self, name: &str) -> Option<SegmentId> {
        let segs = self.segments.read();
        segs.values()
            .find(|s| s.info.name == name)
            .or_else(|| segs.values().find(|s| s.info.id.to_string() == name))
            .map(|s| s.info.id)
    }

    /// Reserves regions for copies of `key`'s current version on `targets`
    /// (see [`kvpool_proto::msg::ReplicaAdd`]) and extends its read lease
    /// so the copying client may read it.
    pub fn replica_add(
        &self,
        client: ClientId,
        key: &str,
        targets: &[String],
        now: Instant,
    ) -> KvResult<ReplicaPlan> {
        self.require_client(client, now)?;
        let (location, region_len, on) = {
            let (value_len, generation, list) = self.with_lease(key, now, |objects, i| {
                let v = objects.at(i);
                let list: Vec<(SegNo, Region)> = objects.replicas(i).collect();
                (v.value_len, v.generation, list)
            })?;
            let region_len = list.iter().map(|(_, r)| r.len).max().unwrap_or(0);
            let on: Vec<SegmentId> = {
                let numbers = self.numbers.read();
                list.iter().map(|(no, _)| numbers.id(*no)).collect()
            };
            let location = ObjectLocation {
                value_len,
                generation,
                lease_ms: ms(self.cfg.lease_ttl),
                replicas: self.describe_numbered(list.into_iter()),
            };
            (location, region_len, on)
        };
        let placeable = self.placeable(now);
        let mut out = Vec::with_capacity(targets.len());
        for name in targets {
            out.push(self.reserve_copy(
                client, key, name, &on, &placeable, region_len, &location, now,
            ));
        }
        Ok(ReplicaPlan {
            value_len: location.value_len,
            generation: location.generation,
            lease_ms: location.lease_ms,
            sources: location.replicas,
            targets: out.into_iter().map(to_wire).collect(),
        })
    }

    /// One target of [`Self::replica_add`].
    #[allow(clippy::too_many_arguments)]
    fn reserve_copy(
        &self,
        client: ClientId,
        key: &str,
        target: &str,
        on: &[SegmentId],
        placeable: &HashSet<SegmentId>,
        region_len: u64,
        location: &ObjectLocation,
        now: Instant,
    ) -> KvResult<Option<Replica>> {
        let id = self.segment_named(target).ok_or_else(|| {
            KvError::new(
                Code::InvalidParams,
                format!("no segment named {target:?} is mounted"),
            )
        })?;
        if on.contains(&id) {
            return Ok(None);
        }
        if !placeable.contains(&id) {
            return Err(KvError::new(
                Code::UnavailableInCurrentStatus,
                format!("segment {target:?} takes no new objects right now"),
            ));
        }
        let mut copies = self.copies.lock();
        let slot = (Box::<str>::from(key), id);
        if copies.contains_key(&slot) {
            return Err(KvError::new(
                Code::ReplicaIsNotReady,
                format!("a copy of {key:?} to {target:?} is already in flight"),
            ));
        }
        // Not where this version was destroyed lately: the store would take
        // the copy for a late write of it and refuse it.
        let banned = self.invalidated_at(id, location.generation);
        let region = {
            let segs = self.segments.read();
            let mut alloc = segs.get(&id).map(|s| s.alloc.lock());
            let mut passed = Vec::new();
            let found = loop {
                let Some(r) = alloc.as_mut().and_then(|a| a.alloc(region_len)) else {
                    break None;
                };
                if !banned.contains(&r.offset) {
                    break Some(r);
                }
                passed.push(r);
            };
            if let Some(a) = alloc.as_mut() {
                for r in passed {
                    a.free(r);
                }
            }
            found
        }
        .ok_or_else(|| {
            KvError::new(
                Code::NoAvailableHandle,
                format!("segment {target:?} has no {region_len} free bytes"),
            )
        })?;
        copies.insert(
            slot,
            PendingCopy {
                owner: client,
                started: now,
                generation: location.generation,
                region,
                fence: self.fence_of(id),
            },
        );
        drop(copies);
        Ok(self.describe(&[(id, region)]).pop())
    }

    /// Ends a copy (see [`kvpool_proto::msg::ReplicaCommit`]).
    #[allow(clippy::too_many_arguments)]
    pub fn replica_commit(
        &self,
        client: ClientId,
        key: &str,
        generation: u64,
        written: &[SegmentId],
        failed: &[SegmentId],
        drop_from: &[SegmentId],
        now: Instant,
    ) -> KvResult<()> {
        validate_key(key)?;
        let take = |id: &SegmentId| -> KvResult<Option<(Region, u64)>> {
            let mut copies = self.copies.lock();
            let slot = (Box::<str>::from(key), *id);
            match copies.get(&slot) {
                None => Ok(None),
                Some(p) if p.owner != client => Err(KvError::new(
                    Code::IllegalClient,
                    format!("the copy of {key:?} to {id} belongs to another client"),
                )),
                Some(p) if p.generation != generation => Ok(None),
                Some(_) => Ok(copies.remove(&slot).map(|p| (p.region, p.fence))),
            }
        };
        let mut done = Vec::new();
        for id in written {
            match take(id)? {
                Some((r, fence)) if fence == self.fence_of(*id) => done.push((*id, r)),
                // Its segment was mounted again since: that mount's scan
                // may have found the copy and, the map not holding it,
                // had it destroyed. Attached, it would be a replica on no
                // store (and the source of a move dropped for it).
                Some((r, _)) => self.free_now(&[(*id, r)], Some(generation)),
                None => {}
            }
        }
        for id in failed {
            if let Some((r, _)) = take(id)? {
                // Possibly half written: its header goes too.
                self.free_now(&[(*id, r)], Some(generation));
            }
        }
        let mut shard = self.shard(key).lock();
        let current = shard
            .objects
            .find(key)
            .filter(|&i| shard.objects.at(i).generation == generation);
        let Some(i) = current else {
            drop(shard);
            self.free_now(&done, Some(generation));
            return Err(KvError::new(
                Code::ObjectNotFound,
                format!("{key:?} was removed or replaced while being copied"),
            ));
        };
        for (id, r) in &done {
            // Copies go only to placeable (mounted, hence numbered) segments.
            let Some(no) = self.numbers.read().get(*id) else {
                continue;
            };
            shard.objects.add_replica(i, no, *r);
        }
        let mut dropped = Vec::new();
        for id in drop_from {
            let Some(no) = self.numbers.read().get(*id) else {
                continue;
            };
            if let Some(r) = shard.objects.remove_replica(i, no) {
                dropped.push((*id, r));
            }
        }
        let lease_until = shard.objects.at(i).lease_until;
        drop(shard);
        if !dropped.is_empty() {
            self.drop_regions(key, generation, dropped, lease_until, now);
        }
        Ok(())
    }

    /// Frees replicas taken off a live object: their headers are destroyed
    /// at once, and under a live read lease their regions are reused only
    /// when it ends (as for a replaced version).
    fn drop_regions(
        &self,
        key: &str,
        generation: u64,
        replicas: Vec<(SegmentId, Region)>,
        lease_until: Tick,
        now: Instant,
    ) {
        let v = Version {
            value_len: 0,
            generation,
            replicas,
            lease_until,
            soft_pin_until: Tick(0),
            last_access: Tick(0),
            committed_at: Tick(0),
            hard_pin: None,
        };
        self.release(key, v, now);
    }

    /// Drops `keys`' replicas on `segment` (every replica: the object, for
    /// `None`); objects under a live read lease are left alone. Per key,
    /// whether something was dropped.
    pub fn replica_clear(&self, keys: &[String], segment: Option<&str>, now: Instant) -> Vec<bool> {
        let target = match segment {
            None => None,
            Some(name) => match self.segment_named(name) {
                Some(id) => Some(id),
                None => return vec![false; keys.len()],
            },
        };
        let no = target.and_then(|id| self.numbers.read().get(id));
        let at = self.tick(now);
        keys.iter()
            .map(|k| {
                if validate_key(k).is_err() {
                    return false;
                }
                let mut shard = self.shard(k).lock();
                let Some(i) = shard.objects.find(k) else {
                    return false;
                };
                let slot = shard.objects.at(i);
                if slot.lease_until > at {
                    return false;
                }
                let generation = slot.generation;
                let whole = match (target, no) {
                    (None, _) => true,
                    (Some(_), None) => return false,
                    (Some(_), Some(no)) => {
                        let list: Vec<SegNo> = shard.objects.replicas(i).map(|(s, _)| s).collect();
                        if !list.contains(&no) {
                            return false;
                        }
                        list.len() == 1
                    }
                };
                if whole {
                    let v = shard.objects.remove_at(i);
                    drop(shard);
                    let v = self.unpack(v);
                    self.retire(k, &v, true, 0);
                    return true;
                }
                let (Some(id), Some(no)) = (target, no) else {
                    return false;
                };
                let region = shard.objects.remove_replica(i, no);
                drop(shard);
                if let Some(r) = region {
                    let v = Version {
                        value_len: 0,
                        generation,
                        replicas: vec![(id, r)],
                        lease_until: Tick(0),
                        soft_pin_until: Tick(0),
                        last_access: Tick(0),
                        committed_at: Tick(0),
                        hard_pin: None,
                    };
                    self.retire(k, &v, false, 0);
                }
                true
            })
            .collect()
    }

    /// Frees the regions of copies older than the put TTL or whose client
    /// is gone (part of [`Self::sweep`]).
    pub(super) fn sweep_copies(&self, dead: &HashSet<ClientId>, now: Instant) {
        let stale: Vec<(SegmentId, Region, u64)> = {
            let mut copies = self.copies.lock();
            let mut out = Vec::new();
            copies.retain(|(_, id), p| {
                let gone = dead.contains(&p.owner)
                    || now.saturating_duration_since(p.started) > self.cfg.pending_ttl;
                if gone {
                    out.push((*id, p.region, p.generation));
                }
                !gone
            });
            out
        };
        for (id, r, generation) in stale {
            self.free_now(&[(id, r)], Some(generation));
        }
        if !dead.is_empty() {
            let mut t = self.tasks.lock();
            let at = wall_ms();
            for task in t.tasks.values_mut() {
                if task.status < task_status::FAILED && dead.contains(&task.assigned_client) {
                    task.status = task_status::FAILED;
                    task.message = "the client carrying the task out went away".into();
                    task.updated_ms = at;
                }
            }
        }
    }

    /// Records a replica task after checking it can be carried out: the
    /// object exists (`OBJECT_NOT_FOUND`), there are targets, each a mounted
    /// segment, and a move names a mounted source other than its target
    /// (`INVALID_PARAMS`).
    pub fn task_create(
        &self,
        client: ClientId,
        kind: u8,
        key: &str,
        source: &str,
        targets: &[String],
        now: Instant,
    ) -> KvResult<u128> {
        self.require_client(client, now)?;
        validate_key(key)?;
        let bad = |why: String| KvError::new(Code::InvalidParams, why);
        if kind != task_kind::COPY && kind != task_kind::MOVE {
            return Err(bad(format!("unknown task kind {kind}")));
        }
        if targets.is_empty() || targets.iter().any(|t| t.is_empty()) {
            return Err(bad("a task needs target segments".into()));
        }
        if kind == task_kind::MOVE && (targets.len() != 1 || targets[0] == source) {
            return Err(bad(format!(
                "a move goes from one segment to another ({source:?} -> {targets:?})"
            )));
        }
        let holders: Vec<SegNo> = {
            let shard = self.shard(key).lock();
            let Some(i) = shard.objects.find(key) else {
                return Err(KvError::new(
                    Code::ObjectNotFound,
                    format!("{key:?} not found"),
                ));
            };
            shard.objects.replicas(i).map(|(s, _)| s).collect()
        };
        // A move from a segment that holds no replica could only fail
        // later, as a task: refuse it now, as Mooncake does.
        if kind == task_kind::MOVE {
            let from = self
                .segment_named(source)
                .and_then(|id| self.numbers.read().get(id));
            if from.is_some_and(|no| !holders.contains(&no)) {
                return Err(bad(format!("{source:?} holds no replica of {key:?}")));
            }
        }
        let names = targets
            .iter()
            .map(String::as_str)
            .chain((kind == task_kind::MOVE).then_some(source));
        for name in names {
            if self.segment_named(name).is_none() {
                return Err(bad(format!("no segment named {name:?} is mounted")));
            }
        }
        let id: u128 = rand::random::<u128>().max(1);
        let at = wall_ms();
        let mut t = self.tasks.lock();
        if t.order.len() >= MAX_TASKS {
            // Forget the oldest finished task, if any (the others are live).
            if let Some(pos) = t.order.iter().position(|old| {
                t.tasks
                    .get(old)
                    .is_none_or(|x| x.status >= task_status::FAILED)
            }) {
                if let Some(old) = t.order.remove(pos) {
                    t.tasks.remove(&old);
                }
            } else {
                return Err(KvError::new(
                    Code::NoAvailableHandle,
                    format!("{MAX_TASKS} replica tasks are in flight"),
                ));
            }
        }
        t.tasks.insert(
            id,
            TaskInfo {
                id,
                kind,
                status: task_status::PENDING,
                created_ms: at,
                updated_ms: at,
                assigned_client: client,
                message: String::new(),
            },
        );
        t.order.push_back(id);
        Ok(id)
    }

    /// Records a task's progress; only its client may.
    pub fn task_update(
        &self,
        client: ClientId,
        id: u128,
        status: u8,
        message: &str,
    ) -> KvResult<()> {
        if status > task_status::SUCCESS {
            return Err(KvError::new(
                Code::InvalidParams,
                format!("unknown task status {status}"),
            ));
        }
        let mut t = self.tasks.lock();
        let task = t
            .tasks
            .get_mut(&id)
            .ok_or_else(|| KvError::new(Code::TaskNotFound, format!("no task {id:032x}")))?;
        if task.assigned_client != client {
            return Err(KvError::new(
                Code::IllegalClient,
                format!("task {id:032x} belongs to another client"),
            ));
        }
        task.status = status;
        task.message = message.chars().take(1024).collect();
        task.updated_ms = wall_ms();
        Ok(())
    }

    /// A task's state.
    pub fn task_query(&self, id: u128) -> KvResult<TaskInfo> {
        self.tasks
            .lock()
            .tasks
            .get(&id)
            .cloned()
            .ok_or_else(|| KvError::new(Code::TaskNotFound, format!("no task {id:032x}")))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kvpool_proto::msg::{PutEndItem, PutGrant, PutItem, ReplicateConfig, SegmentInfo, Tier};

    use super::*;
    use crate::state::StateConfig;

    const OBJ: u64 = 4096;

    fn segment(id: u128, name: &str) -> SegmentInfo {
        SegmentInfo {
            id: SegmentId(id),
            name: name.into(),
            endpoint: format!("10.0.0.{id}:7000"),
            base: 4096,
            size: 1 << 20,
            path: None,
            tier: Tier::Memory,
        }
    }

    /// A state with client 1 lending segments "a" (1) and "b" (2), and
    /// one committed object `k` on "a".
    fn pool() -> (MasterState, ClientId, Instant, u64) {
        let cfg = StateConfig {
            lease_ttl: Duration::from_secs(1),
            client_ttl: Duration::from_secs(3600),
            pending_ttl: Duration::from_secs(60),
            ..StateConfig::default()
        };
        let st = MasterState::new(cfg);
        let now = Instant::now();
        let c = ClientId(1);
        st.register_client(c, "host", now).unwrap();
        st.mount(c, segment(1, "a"), 0, now).unwrap();
        st.mount(c, segment(2, "b"), 0, now).unwrap();
        let item = PutItem {
            key: "k".into(),
            value_len: 100,
            region_len: OBJ,
        };
        let cfg = ReplicateConfig {
            preferred_segments: vec!["a".into()],
            ..ReplicateConfig::default()
        };
        let g = match st.put_start(c, &[item], &cfg, false, now).remove(0) {
            Ok(PutGrant::Write { generation, .. }) => generation,
            other => panic!("{other:?}"),
        };
        let end = PutEndItem {
            key: "k".into(),
            generation: g,
        };
        st.put_end(c, &[end], now).remove(0).unwrap();
        (st, c, now, g)
    }

    fn on(st: &MasterState, key: &str, now: Instant) -> Vec<u128> {
        let l = st
            .get_replica_list(&[key.to_string()], now)
            .remove(0)
            .unwrap();
        l.replicas.iter().map(|r| r.segment.0).collect()
    }

    /// A store refuses a write of a version at an offset where it
    /// destroyed that version (it takes it for a late write): a copy back
    /// to a segment the version was dropped from goes elsewhere on it. The
    /// Python suite's move back (`create_move_task`) failed that way.
    #[test]
    fn a_copy_avoids_the_offset_its_version_was_destroyed_at() {
        let (st, c, now, g) = pool();
        let first = |st: &MasterState, target: &str| {
            let plan = st.replica_add(c, "k", &[target.into()], now).unwrap();
            plan.targets[0].clone().unwrap().unwrap()
        };
        first(&st, "b");
        st.replica_commit(c, "k", g, &[SegmentId(2)], &[], &[], now)
            .unwrap();
        let at_a = st
            .get_replica_list(&["k".into()], now)
            .remove(0)
            .unwrap()
            .replicas[0]
            .offset;
        st.replica_clear(&["k".into()], Some("a"), now + Duration::from_secs(2));
        assert_eq!(on(&st, "k", now + Duration::from_secs(2)), [2]);
        let back = first(&st, "a");
        assert_eq!(back.segment, SegmentId(1));
        assert_ne!(back.offset, at_a, "the destroyed copy's offset");
    }

    #[test]
    fn a_copy_is_attached_only_when_committed() {
        let (st, c, now, g) = pool();
        let plan = st
            .replica_add(c, "k", &["b".into(), "a".into(), "zz".into()], now)
            .unwrap();
        assert_eq!((plan.generation, plan.value_len), (g, 100));
        assert_eq!(plan.sources.len(), 1);
        assert_eq!(
            plan.targets[0].as_ref().unwrap().as_ref().unwrap().segment,
            SegmentId(2)
        );
        assert_eq!(plan.targets[1], Ok(None), "already there");
        assert_eq!(plan.targets[2], Err(Code::InvalidParams.as_i32()));
        // A second copy to the same segment waits for the first.
        let again = st.replica_add(c, "k", &["b".into()], now).unwrap();
        assert_eq!(again.targets[0], Err(Code::ReplicaIsNotReady.as_i32()));
        assert_eq!(on(&st, "k", now), [1]);
        st.replica_commit(c, "k", g, &[SegmentId(2)], &[], &[], now)
            .unwrap();
        assert_eq!(on(&st, "k", now), [1, 2]);
        // Another client cannot commit someone's copy.
        let other = ClientId(9);
        st.register_client(other, "x", now).unwrap();
        assert!(
            st.replica_add(other, "k", &["b".into()], now)
                .unwrap()
                .targets[0]
                == Ok(None)
        );
    }

    #[test]
    fn a_move_drops_the_source_but_never_the_last_replica() {
        let (st, c, now, g) = pool();
        let used = st.status().used;
        st.replica_add(c, "k", &["b".into()], now).unwrap();
        assert_eq!(st.status().used, used + OBJ);
        st.replica_commit(c, "k", g, &[SegmentId(2)], &[], &[SegmentId(1)], now)
            .unwrap();
        assert_eq!(on(&st, "k", now), [2]);
        // The source region comes back once its read lease ends.
        st.sweep(now + Duration::from_secs(2));
        assert_eq!(st.status().used, used);
        // Dropping the only replica is refused silently: the object stays.
        st.replica_commit(c, "k", g, &[], &[], &[SegmentId(2)], now)
            .unwrap();
        assert_eq!(on(&st, "k", now), [2]);
    }

    /// A copy committed after its target was mounted again (its store cut
    /// off and back): that mount's scan may have found it and had it
    /// destroyed, the map not holding it then. Not attached, and the
    /// source of the move stays.
    #[test]
    fn a_copy_committed_after_its_target_was_mounted_again_is_not_attached() {
        let (st, c, now, g) = pool();
        let used = st.status().used;
        st.replica_add(c, "k", &["b".into()], now).unwrap();
        let spec = crate::state::MountSpec {
            fence: 2,
            ..Default::default()
        };
        st.mount_scanned(c, segment(2, "b"), spec, now).unwrap();
        st.replica_commit(c, "k", g, &[SegmentId(2)], &[], &[SegmentId(1)], now)
            .unwrap();
        assert_eq!(on(&st, "k", now), [1]);
        assert_eq!(st.status().used, used, "the copy's region was not freed");
        // Unmounted and mounted anew (a new allocator) meanwhile: not
        // attached either, and nothing freed into the new allocator.
        st.replica_add(c, "k", &["b".into()], now).unwrap();
        st.unmount(c, SegmentId(2)).unwrap();
        st.mount(c, segment(2, "b"), 0, now).unwrap();
        st.replica_commit(c, "k", g, &[SegmentId(2)], &[], &[SegmentId(1)], now)
            .unwrap();
        assert_eq!(on(&st, "k", now), [1]);
        assert_eq!(st.status().used, used);
    }

    #[test]
    fn a_copy_of_a_replaced_version_is_freed() {
        let (st, c, now, g) = pool();
        st.replica_add(c, "k", &["b".into()], now).unwrap();
        let used = st.status().used;
        st.remove(&["k".to_string()], true, now).remove(0).unwrap();
        let e = st
            .replica_commit(c, "k", g, &[SegmentId(2)], &[], &[], now)
            .unwrap_err();
        assert_eq!(e.code, Code::ObjectNotFound);
        assert_eq!(st.status().used, used - 2 * OBJ);
        // Failed and expired copies are freed too.
        let (st, c, now, g) = pool();
        let used = st.status().used;
        st.replica_add(c, "k", &["b".into()], now).unwrap();
        st.replica_commit(c, "k", g, &[], &[SegmentId(2)], &[], now)
            .unwrap();
        assert_eq!(st.status().used, used);
        st.replica_add(c, "k", &["b".into()], now).unwrap();
        st.sweep(now + Duration::from_secs(61));
        assert_eq!(st.status().used, used);
        assert_eq!(on(&st, "k", now), [1]);
    }

    #[test]
    fn clearing_respects_leases_and_removes_objects_left_bare() {
        let (st, c, now, g) = pool();
        st.replica_add(c, "k", &["b".into()], now).unwrap();
        st.replica_commit(c, "k", g, &[SegmentId(2)], &[], &[], now)
            .unwrap();
        let keys = vec!["k".to_string(), "missing".to_string()];
        // replica_add took a read lease.
        assert_eq!(st.replica_clear(&keys, Some("a"), now), [false, false]);
        let later = now + Duration::from_secs(2);
        assert_eq!(st.replica_clear(&keys, Some("nope"), later), [false, false]);
        assert_eq!(st.replica_clear(&keys, Some("a"), later), [true, false]);
        assert_eq!(on(&st, "k", later), [2]);
        let later = later + Duration::from_secs(2);
        assert_eq!(st.replica_clear(&keys, Some("b"), later), [true, false]);
        assert!(
            st.exist(&keys[..1])[0].is_err(),
            "the last replica took the object"
        );
    }

    #[test]
    fn tasks_are_checked_recorded_and_updated_by_their_client() {
        let (st, c, now, _) = pool();
        let e = |r: KvResult<u128>| r.unwrap_err().code;
        assert_eq!(
            e(st.task_create(c, task_kind::COPY, "nope", "", &["b".into()], now)),
            Code::ObjectNotFound
        );
        assert_eq!(
            e(st.task_create(c, task_kind::COPY, "k", "", &[], now)),
            Code::InvalidParams
        );
        assert_eq!(
            e(st.task_create(c, task_kind::COPY, "k", "", &["zz".into()], now)),
            Code::InvalidParams
        );
        assert_eq!(
            e(st.task_create(c, task_kind::MOVE, "k", "b", &["b".into()], now)),
            Code::InvalidParams
        );
        assert_eq!(
            e(st.task_create(c, task_kind::MOVE, "k", "zz", &["b".into()], now)),
            Code::InvalidParams
        );
        assert_eq!(
            e(st.task_create(c, 7, "k", "", &["b".into()], now)),
            Code::InvalidParams
        );
        let id = st
            .task_create(c, task_kind::MOVE, "k", "a", &["b".into()], now)
            .unwrap();
        let t = st.task_query(id).unwrap();
        assert_eq!(
            (t.kind, t.status, t.assigned_client),
            (task_kind::MOVE, task_status::PENDING, c)
        );
        assert_eq!(st.task_query(id ^ 1).unwrap_err().code, Code::TaskNotFound);
        let other = ClientId(9);
        assert_eq!(
            st.task_update(other, id, task_status::SUCCESS, "")
                .unwrap_err()
                .code,
            Code::IllegalClient
        );
        st.task_update(c, id, task_status::SUCCESS, "done").unwrap();
        let t = st.task_query(id).unwrap();
        assert_eq!(
            (t.status, t.message.as_str()),
            (task_status::SUCCESS, "done")
        );
        assert!(t.updated_ms >= t.created_ms);
        // A task whose client goes away fails.
        let id = st
            .task_create(c, task_kind::COPY, "k", "", &["b".into()], now)
            .unwrap();
        st.sweep_copies(&[c].into_iter().collect(), now);
        assert_eq!(st.task_query(id).unwrap().status, task_status::FAILED);
    }
}
