//! Restart recovery: the inventories remounted segments report, taken in
//! parts and reconciled with the object map (objects the master knows,
//! objects it forgot, versions it superseded meanwhile).

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use kvpool_proto::msg::{ClientId, InventoryItem, InventoryVerdict, SegmentId};
use kvpool_proto::{Code, KvError, KvResult};
use tokio::time::Instant;

use crate::alloc::Region;
use crate::refusals::Refusal;

use super::segments::rebuild;
use super::*;

/// Replicas a reconcile names one by one in the log; the rest are counted.
const LOST_LOGGED: usize = 100;

impl MasterState {
    /// Takes part of a remounted segment's inventory; on the last part,
    /// reconciles it with the object map and opens the segment.
    pub fn report_objects(
        &self,
        client: ClientId,
        id: SegmentId,
        items: Vec<InventoryItem>,
        last: bool,
        now: Instant,
    ) -> KvResult<InventoryVerdict> {
        // Reporting is a sign of life: a big inventory can outlast the TTL.
        self.require_client(client, now)?;
        let (mut all, fresh, info, wanted) = {
            let mut segs = self.segments.write();
            let s = segs.get_mut(&id).ok_or_else(|| {
                KvError::new(
                    Code::SegmentNotFound,
                    format!("segment {id} is not mounted"),
                )
            })?;
            if s.owner != client {
                return Err(KvError::new(
                    Code::IllegalClient,
                    format!("segment {id} belongs to another client"),
                ));
            }
            if s.reconciling {
                return Err(super::segments::reconciling(id));
            }
            let Some(inv) = s.recovering.as_mut() else {
                return Err(KvError::new(
                    Code::InvalidParams,
                    format!("segment {id} announced no inventory"),
                ));
            };
            let reported = (inv.len() + items.len()) as u64;
            if reported > s.announced.saturating_mul(2) {
                let announced = s.announced;
                drop(segs);
                return Err(self.refusals.refuse(
                    Refusal::Inventory,
                    KvError::new(
                        Code::InvalidParams,
                        format!(
                            "inventory of {id}: {reported} objects reported, {announced} announced"
                        ),
                    ),
                ));
            }
            inv.extend(items);
            if !last {
                return Ok(InventoryVerdict::default());
            }
            // Still `recovering` (empty) until reconciled: it takes no new
            // objects while the rest runs without the segment lock.
            let all = std::mem::take(inv);
            s.reconciling = true;
            // A segment that holds no live region yet was new to this master.
            let fresh = s.alloc.lock().live_regions() == 0;
            (all, fresh, s.info.clone(), std::mem::take(&mut s.wanted))
        };
        // A part sent again (its answer was lost) reports the same regions.
        all.sort_unstable_by_key(|i| i.offset);
        all.dedup_by_key(|i| i.offset);
        // The regions of a fresh segment's inventory, in its (offset) order.
        let mut regions = Vec::new();
        if fresh {
            let alloc = rebuild(&info, &all, &wanted).map(|(alloc, items, held)| {
                regions = items;
                (alloc, held)
            });
            let mut segs = self.segments.write();
            let slot = segs
                .get_mut(&id)
                .filter(|s| s.owner == client && s.recovering.is_some());
            match (slot, alloc) {
                (Some(s), Ok((alloc, held))) => {
                    *s.alloc.lock() = alloc;
                    s.held = held;
                }
                (None, _) => {
                    return Err(KvError::new(
                        Code::SegmentNotFound,
                        format!("segment {id} was unmounted or taken over during its inventory"),
                    ))
                }
                (Some(_), Err(e)) => {
                    // Never open it empty: new objects would overwrite the
                    // ones it holds. Unmounted, its store mounts it again.
                    drop(segs);
                    self.drop_segment(id);
                    tracing::error!(segment = %id, error = %e, "inventory rejected; segment unmounted");
                    return Err(KvError::new(
                        Code::InvalidParams,
                        format!("inventory of {id}: {e}"),
                    ));
                }
            }
        }
        let bound = self.generation_bound();
        if let Some(max) = all
            .iter()
            .map(|i| i.generation)
            .filter(|&g| g <= bound)
            .max()
        {
            self.next_generation.fetch_max(max + 1, Ordering::Relaxed);
        }
        let started = std::time::Instant::now();
        let verdict = if fresh {
            self.reconcile_fresh(id, all, regions, now)
        } else {
            self.reconcile_known(id, &all)
        };
        tracing::info!(segment = %id, accepted = verdict.accepted, rejected = verdict.rejected.len(),
            fresh, reconcile_ms = started.elapsed().as_millis() as u64, "inventory reconciled");
        Ok(verdict)
    }

    /// The highest generation an inventory may claim: what this master will
    /// issue next or the wall clock, plus a minute for clocks that differ
    /// between the masters of a pool (or were stepped back).
    fn generation_bound(&self) -> u64 {
        const SKEW_NS: u64 = 60_000_000_000;
        let issued = self.next_generation.load(Ordering::Relaxed);
        issued.max(super::wall_nanos()).saturating_add(SKEW_NS)
    }

    /// A segment new to this master (after a master restart or failover, or a
    /// store back after its TTL): its objects become readable unless the map
    /// already has a newer version of the key. Every reported region is
    /// already reserved in the segment's allocator; rejected ones are freed.
    pub(super) fn reconcile_fresh(
        &self,
        id: SegmentId,
        items: Vec<InventoryItem>,
        regions: Vec<Region>,
        now: Instant,
    ) -> InventoryVerdict {
        let mut v = InventoryVerdict::default();
        let Some(no) = self.numbers.read().get(id) else {
            return v;
        };
        let at = self.tick(now);
        let bound = self.generation_bound();
        debug_assert_eq!(items.len(), regions.len());
        let mut logged = 0;
        for (it, region) in items.into_iter().zip(regions) {
            let mut shard = self.shard(&it.key).lock();
            let objects = &mut shard.objects;
            let first = self.first_generation.load(Ordering::Relaxed);
            let found = objects.find(&it.key);
            let held = found.map(|i| objects.at(i).generation);
            let keep = match found {
                // Never issued by anyone: forged (or a clock far off).
                _ if it.generation > bound => Err("never issued"),
                // Removed while its store was away.
                _ if self.tombstoned(&it.key, it.generation) => Err("removed"),
                Some(i) if objects.at(i).generation > it.generation => {
                    Err("older than the version known")
                }
                // This master issued the version it holds, so it would have
                // issued the newer one too, and committed it: forged, or a
                // put that never committed.
                Some(i)
                    if objects.at(i).generation >= first
                        && it.generation > objects.at(i).generation =>
                {
                    Err("newer than this master's own version: never committed")
                }
                Some(i) if objects.at(i).generation == it.generation => {
                    objects.add_replica(i, no, region);
                    Ok(())
                }
                _ => {
                    let old = objects.insert(
                        &it.key,
                        Version {
                            value_len: it.value_len,
                            generation: it.generation,
                            replicas: vec![(no, region)],
                            lease_until: at,
                            soft_pin_until: Tick(0),
                            last_access: at,
                            committed_at: at,
                            hard_pin: None,
                        },
                    );
                    drop(shard);
                    if let Some(old) = old {
                        self.release(&it.key, self.unpack(old), now);
                    }
                    Ok(())
                }
            };
            match keep {
                Ok(()) => v.accepted += 1,
                Err(why) => {
                    if logged < LOST_LOGGED {
                        logged += 1;
                        tracing::info!(segment = %id, key = it.key, generation = it.generation, offset = it.offset,
                            known = ?held, "inventory object not taken: {why}");
                    }
                    self.free_now(&[(id, region)], None);
                    v.rejected.push((it.offset, it.generation));
                }
            }
        }
        self.open_segment(id);
        v
    }

    /// A segment this master still has, remounted by a restarted store: the
    /// map decides. Replicas whose bytes did not survive are dropped (unless
    /// committed after the store's scan began); objects the map does not hold
    /// there are rejected.
    pub(super) fn reconcile_known(
        &self,
        id: SegmentId,
        items: &[InventoryItem],
    ) -> InventoryVerdict {
        let cutoff = match self.segments.read().get(&id) {
            Some(s) => self.tick(s.scan_cutoff),
            None => return InventoryVerdict::default(),
        };
        let Some(no) = self.numbers.read().get(id) else {
            return InventoryVerdict::default();
        };
        // One read-only pass collects what the map holds on this segment;
        // a sort and a merge with the inventory (sorted by offset) decide,
        // with no set as large as the segment.
        let mut held: Vec<(u64, u64, bool, u32)> = Vec::new();
        let mut in_flight = HashSet::new();
        for (n, shard) in self.shards.iter().enumerate() {
            let sh = shard.lock();
            // Written but not committed yet: its writer decides, not the store.
            for p in sh.pending.values() {
                for (s, r) in &p.version.replicas {
                    if *s == id {
                        in_flight.insert((r.offset, p.version.generation));
                    }
                }
            }
            for (i, v) in sh.objects.iter() {
                for (s, r) in sh.objects.replicas(i) {
                    if s == no {
                        held.push((r.offset, v.generation, v.committed_at() >= cutoff, n as u32));
                    }
                }
            }
        }
        held.sort_unstable_by_key(|h| h.0);
        let mut reported = vec![false; items.len()];
        let mut lost = Vec::new();
        let mut i = 0;
        for (offset, generation, recent, shard) in held {
            while i < items.len() && items[i].offset < offset {
                i += 1;
            }
            let found = items
                .get(i)
                .filter(|it| it.offset == offset && it.generation == generation);
            match found {
                Some(_) => reported[i] = true,
                // Committed after the scan began: missing from it, not lost.
                None if recent => {}
                None => lost.push((shard, offset, generation)),
            }
        }
        // Replicas whose bytes did not survive, one pass per shard that has
        // any. Each is named in the log (the first LOST_LOGGED of them): an
        // acknowledged object may be gone.
        lost.sort_unstable();
        let mut freed = Vec::new();
        let mut logged = 0;
        for group in lost.chunk_by(|a, b| a.0 == b.0) {
            let gone: HashSet<(u64, u64)> = group.iter().map(|&(_, o, g)| (o, g)).collect();
            let mut sh = self.shards[group[0].0 as usize].lock();
            for (i, v) in sh.objects.iter() {
                for (s, r) in sh.objects.replicas(i) {
                    if logged < LOST_LOGGED && s == no && gone.contains(&(r.offset, v.generation)) {
                        logged += 1;
                        let key = sh.objects.key(i);
                        tracing::warn!(segment = %id, key = &*key, offset = r.offset, generation = v.generation,
                            "replica lost: missing from its remounted store's inventory");
                    }
                }
            }
            self.replicas_lost
                .fetch_add(group.len() as u64, Ordering::Relaxed);
            sh.objects.retain_replicas(|v, s, r| {
                let lost = s == no && gone.contains(&(r.offset, v.generation));
                if lost {
                    freed.push((id, r));
                }
                !lost
            });
        }
        if lost.len() > LOST_LOGGED {
            tracing::warn!(segment = %id, lost = lost.len(), "replicas lost in all (the first {LOST_LOGGED} named above)");
        }
        self.free_now(&freed, None);
        self.open_segment(id);
        InventoryVerdict {
            accepted: reported.iter().filter(|&&r| r).count() as u64,
            rejected: items
                .iter()
                .zip(&reported)
                .filter(|(it, &r)| !r && !in_flight.contains(&(it.offset, it.generation)))
                .map(|(it, _)| (it.offset, it.generation))
                .collect(),
        }
    }
}
