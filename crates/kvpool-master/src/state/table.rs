//! The committed objects of one shard, laid out for tens of millions of
//! keys: a hash index of 4-byte slot numbers, dense 64-byte slots, and the
//! keys packed in one arena (compact where they can be, see `keys.rs`).
//! A `HashMap<Box<str>, Version>` paid for a
//! 16-byte key pointer, a key allocation, a replica `Vec` and its
//! allocation, and the table's spare room on all of that (about 260 bytes
//! per object); here the spare room is on 4 bytes, the first replica lives
//! in the slot, and segments are named by a 4-byte number.
//!
//! Second replicas live in chunks beside the slots' (16 bytes each, a chunk
//! made when one of its objects first has one). Rare things live in maps
//! keyed by slot number: replicas after the second, soft pins, and who a
//! hard pin is charged to (given back to the [`Ledger`] when the object
//! leaves the table, however it leaves).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;
use kvpool_proto::msg::{SegmentId, Tier};
use kvpool_proto::tenant;

use super::keys::Dict;
use super::ledger::{Ledger, Pin};
use super::objects::{KeyHasher, Tick, Version};
use crate::alloc::{Region, ALIGN};
use crate::kv_events::{Kind, KvEvents};

/// A segment as objects name it: 4 bytes where a [`SegmentId`] takes 16.
/// The master numbers each segment id the first time it sees it, and a
/// number never changes meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct SegNo(u32);

/// The segment ids the master has numbered, both ways, and each one's
/// tier. Append-only: a segment mounted again keeps its number.
#[derive(Default)]
pub(super) struct SegNumbers {
    ids: Vec<SegmentId>,
    tiers: Vec<Tier>,
    numbers: HashMap<SegmentId, SegNo>,
}

impl SegNumbers {
    /// The number of `id` (a segment of `tier`), given one now if it has none.
    pub(super) fn number(&mut self, id: SegmentId, tier: Tier) -> SegNo {
        if let Some(&no) = self.numbers.get(&id) {
            return no;
        }
        // Four billion mounts of distinct segments within one master's life.
        let no = SegNo(u32::try_from(self.ids.len()).expect("segment numbers exhausted"));
        self.ids.push(id);
        self.tiers.push(tier);
        self.numbers.insert(id, no);
        no
    }

    /// The tier of segment `no`.
    pub(super) fn tier(&self, no: SegNo) -> Tier {
        self.tiers.get(no.0 as usize).copied().unwrap_or_default()
    }

    /// The tier of the segment numbered `no` (the memory tier for a
    /// number not given out).
    pub(super) fn tier_of(&self, no: u32) -> Tier {
        self.tier(SegNo(no))
    }

    /// The number of `id`, if it has one.
    pub(super) fn get(&self, id: SegmentId) -> Option<SegNo> {
        self.numbers.get(&id).copied()
    }

    /// The segment id numbered `no`.
    pub(super) fn id(&self, no: SegNo) -> SegmentId {
        self.ids[no.0 as usize]
    }
}

const HARD_PIN: u8 = 1;
const SOFT_PIN: u8 = 2;
/// It has replicas after the second, in `more`.
const MORE: u8 = 4;
/// Not an object: a free slot, chained through `key_at`.
const VACANT: u8 = 8;
/// Read once while only on disk: the next read promotes it.
const DISK_READ: u8 = 16;
/// It has a second replica, in `second`.
const SECOND: u8 = 32;

/// Slots per chunk (4 KiB): growing never moves the slots a shard has.
const CHUNK: usize = 64;
const NONE: u32 = u32::MAX;

/// One committed object, in 64 bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    key_at: u32,
    key_len: u16,
    flags: u8,
    /// Where the first replica lives.
    segment: SegNo,
    /// Seconds since the epoch when it was committed or recovered, rounded
    /// up: only compared with a store's scan start, where a later time errs
    /// on the side of keeping a replica the scan did not see.
    committed_s: u32,
    /// The key's hash, as the index places it (growing the index rehashes
    /// from these, without reading or decoding a key).
    hash: u32,
    /// The first replica's region: its offset, and its length in
    /// [`ALIGN`] units (regions are at most
    /// [`MAX_REGION`](crate::alloc::MAX_REGION) long).
    offset: u64,
    units: u32,
    /// Value bytes.
    pub(super) value_len: u64,
    /// Put generation.
    pub(super) generation: u64,
    /// End of the last read lease.
    pub(super) lease_until: Tick,
    /// When written or last read.
    pub(super) last_access: Tick,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 64);

impl Slot {
    /// Never evicted.
    pub(super) fn hard_pinned(&self) -> bool {
        self.flags & HARD_PIN != 0
    }

    /// When it was committed or recovered (rounded up to a second).
    pub(super) fn committed_at(&self) -> Tick {
        Tick(u64::from(self.committed_s) * 1_000_000_000)
    }

    fn vacant(&self) -> bool {
        self.flags & VACANT != 0
    }

    /// Where the first replica lives in its segment.
    fn region(&self) -> Region {
        region(self.offset, self.units)
    }

    fn set_region(&mut self, r: Region) {
        self.offset = r.offset;
        self.units = units(r.len);
    }
}

/// The committed objects of one shard.
#[derive(Default)]
pub(super) struct ObjectTable {
    /// Slot numbers, placed by the hash each slot keeps.
    index: HashTable<u32>,
    slots: Vec<Vec<Slot>>,
    /// Slots ever used (the next new one is this number).
    filled: u32,
    /// First vacant slot, or `NONE`.
    vacant: Option<u32>,
    /// Keys in their stored form (see `keys.rs`).
    keys: Vec<u8>,
    /// The texts compact keys name.
    dict: Dict,
    /// Bytes of `keys` no slot refers to any more.
    garbage: usize,
    /// Second replicas, a chunk per chunk of slots that has one.
    second: Vec<Option<Box<[Extra; CHUNK]>>>,
    more: HashMap<u32, Vec<(SegNo, Region)>, KeyHasher>,
    soft_pins: HashMap<u32, Tick, KeyHasher>,
    /// Whose limit each hard-pinned object counts against.
    hard_pins: HashMap<u32, Pin, KeyHasher>,
    /// Where hard pins are given back.
    ledger: Arc<Ledger>,
    /// Where commits and removals are told (when the stream is on).
    events: Arc<KvEvents>,
    hasher: KeyHasher,
}

/// The stored key of `s`.
fn key_bytes<'a>(keys: &'a [u8], s: &Slot) -> &'a [u8] {
    &keys[s.key_at as usize..s.key_at as usize + usize::from(s.key_len)]
}

/// The table hash of a key's 32 kept bits: its low bits pick the bucket,
/// its top 7 the control byte.
fn spread(h: u32) -> u64 {
    u64::from(h) << 32 | u64::from(h)
}

fn at(slots: &[Vec<Slot>], i: u32) -> &Slot {
    &slots[i as usize / CHUNK][i as usize % CHUNK]
}

impl ObjectTable {
    /// An empty table whose hard pins are charged in `ledger`, telling
    /// `events` of its commits and removals.
    pub(super) fn new(ledger: Arc<Ledger>, events: Arc<KvEvents>) -> Self {
        ObjectTable {
            ledger,
            events,
            ..Default::default()
        }
    }

    /// Tells the event stream about slot `i`'s replica on `segment`.
    fn tell(&self, kind: Kind, i: u32, segment: SegNo) {
        if self.events.enabled() {
            self.events.emit(kind, &self.key(i), segment.0);
        }
    }

    /// Gives back slot `i`'s hard pin, if it has one.
    fn unpin(&mut self, i: u32) {
        if let Some(p) = self.hard_pins.remove(&i) {
            self.ledger.unpin(&self.key(i), p);
        }
    }

    /// Objects held.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// The slot of `key`, if it is held.
    pub(super) fn find(&self, key: &str) -> Option<u32> {
        let h = self.hash(key.as_bytes());
        self.index
            .find(spread(h), |&i| {
                let s = at(&self.slots, i);
                s.hash == h && self.dict.matches(key_bytes(&self.keys, s), key.as_bytes())
            })
            .copied()
    }

    /// The 32 bits of `key`'s hash its slot keeps.
    fn hash(&self, key: &[u8]) -> u32 {
        (self.hasher.hash_one(key) >> 32) as u32
    }

    /// Whether `key` is held.
    pub(super) fn contains(&self, key: &str) -> bool {
        self.find(key).is_some()
    }

    /// The object under `key`.
    pub(super) fn get(&self, key: &str) -> Option<&Slot> {
        self.find(key).map(|i| self.at(i))
    }

    /// Slots ever used: every occupied slot is below it, and slot numbers
    /// never move, so a listing can resume at a slot number.
    pub(super) fn filled(&self) -> u32 {
        self.filled
    }

    /// Slot `i`, if it holds an object.
    pub(super) fn occupied(&self, i: u32) -> Option<&Slot> {
        (i < self.filled)
            .then(|| self.at(i))
            .filter(|s| !s.vacant())
    }

    /// Slot `i`.
    pub(super) fn at(&self, i: u32) -> &Slot {
        at(&self.slots, i)
    }

    /// Slot `i`, to update its times.
    pub(super) fn at_mut(&mut self, i: u32) -> &mut Slot {
        &mut self.slots[i as usize / CHUNK][i as usize % CHUNK]
    }

    /// The key of slot `i` (built when it is stored compact).
    pub(super) fn key(&self, i: u32) -> Cow<'_, str> {
        self.dict.decode(key_bytes(&self.keys, self.at(i)))
    }

    /// End of slot `i`'s soft pin (`Tick(0)`: none).
    pub(super) fn soft_pin_until(&self, i: u32) -> Tick {
        if self.at(i).flags & SOFT_PIN == 0 {
            return Tick(0);
        }
        self.soft_pins.get(&i).copied().unwrap_or_default()
    }

    /// Where slot `i`'s replicas live.
    pub(super) fn replicas(&self, i: u32) -> impl Iterator<Item = (SegNo, Region)> + '_ {
        let s = self.at(i);
        let second = (s.flags & SECOND != 0)
            .then(|| self.second.get(i as usize / CHUNK)?.as_ref())
            .flatten()
            .map(|c| c[i as usize % CHUNK].replica());
        let more = match s.flags & MORE {
            0 => &[][..],
            _ => self.more.get(&i).map_or(&[][..], Vec::as_slice),
        };
        std::iter::once((s.segment, s.region()))
            .chain(second)
            .chain(more.iter().copied())
    }

    /// Bytes slot `i` takes over all its replicas.
    pub(super) fn bytes(&self, i: u32) -> u64 {
        self.replicas(i).map(|(_, r)| r.len).sum()
    }

    /// Notes a read of slot `i` while it is on disk only; true when it had
    /// been read so before (the promotion policy's second access).
    pub(super) fn read_on_disk(&mut self, i: u32) -> bool {
        let s = self.at_mut(i);
        let before = s.flags & DISK_READ != 0;
        s.flags |= DISK_READ;
        before
    }

    /// Moves slot `i`'s replica at `from` (segment and offset) to `to`;
    /// returns the region it left, or `None` when it has no such replica.
    pub(super) fn move_replica(
        &mut self,
        i: u32,
        from: (SegNo, u64),
        to: (SegNo, Region),
    ) -> Option<Region> {
        let list: Vec<(SegNo, Region)> = self.replicas(i).collect();
        let at = list.iter().position(|&(s, r)| (s, r.offset) == from)?;
        let old = list[at].1;
        let mut list = list;
        list[at] = to;
        self.set_replicas(i, &list);
        if from.0 != to.0 {
            self.tell(Kind::Removed, i, from.0);
            self.tell(Kind::Stored, i, to.0);
        }
        // Its reads on disk counted towards a promotion; that starts over.
        self.at_mut(i).flags &= !DISK_READ;
        Some(old)
    }

    /// Adds a replica to slot `i`, unless it has one on `no` already.
    pub(super) fn add_replica(&mut self, i: u32, no: SegNo, region: Region) {
        let mut list: Vec<(SegNo, Region)> = self.replicas(i).collect();
        if list.iter().any(|&(s, _)| s == no) {
            return;
        }
        list.push((no, region));
        self.set_replicas(i, &list);
    }

    /// Takes slot `i`'s replica on `no` away, unless it is the only one;
    /// returns its region.
    pub(super) fn remove_replica(&mut self, i: u32, no: SegNo) -> Option<Region> {
        let list: Vec<(SegNo, Region)> = self.replicas(i).collect();
        if list.len() < 2 {
            return None;
        }
        let gone = list.iter().find(|(s, _)| *s == no).map(|(_, r)| *r)?;
        let kept: Vec<(SegNo, Region)> = list.into_iter().filter(|(s, _)| *s != no).collect();
        self.set_replicas(i, &kept);
        Some(gone)
    }

    /// The occupied slots, in slot order (sequential memory).
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &Slot)> {
        self.slots
            .iter()
            .flatten()
            .enumerate()
            .filter(|(_, s)| !s.vacant())
            .map(|(i, s)| (i as u32, s))
    }

    /// Stores `v` under `key`; returns the version it replaces.
    pub(super) fn insert(&mut self, key: &str, v: Version<SegNo>) -> Option<Version<SegNo>> {
        debug_assert!(!v.replicas.is_empty());
        if let Some(i) = self.find(key) {
            let old = self.unpack(i);
            self.unpin(i);
            let s = *self.at(i);
            self.write(i, (s.key_at, s.key_len, s.hash), &v);
            self.ledger.tenant_release(key, old.value_len);
            self.ledger.tenant_charge(key, v.value_len);
            self.tell(Kind::Stored, i, v.replicas[0].0);
            return Some(old);
        }
        self.insert_new(key, v);
        None
    }

    /// Inserts `key`, which the table does not hold (the caller just
    /// looked): one hash lookup fewer than [`insert`](Self::insert).
    pub(super) fn insert_new(&mut self, key: &str, v: Version<SegNo>) {
        debug_assert!(self.find(key).is_none());
        self.ledger.tenant_charge(key, v.value_len);
        let (key_at, key_len) = self.store_key(key.as_bytes());
        let i = match self.vacant {
            Some(i) => {
                let next = self.at(i).key_at;
                self.vacant = (next != NONE).then_some(next);
                i
            }
            None => {
                if self.slots.last().is_none_or(|c| c.len() == CHUNK) {
                    self.slots.push(Vec::new());
                }
                let chunk = self.slots.last_mut().expect("a chunk with room");
                chunk.push(placeholder());
                self.filled += 1;
                self.filled - 1
            }
        };
        let h = self.hash(key.as_bytes());
        self.write(i, (key_at, key_len, h), &v);
        let slots = &self.slots;
        self.index
            .insert_unique(spread(h), i, |&j| spread(at(slots, j).hash));
        self.tell(Kind::Stored, i, v.replicas[0].0);
    }

    /// Room for `more` objects beyond those held, so that a bulk insert
    /// (a reconcile) does not rehash the index as it grows.
    pub(super) fn reserve(&mut self, more: usize) {
        let slots = &self.slots;
        self.index.reserve(more, |&j| spread(at(slots, j).hash));
    }

    /// Takes `key`'s object out.
    pub(super) fn remove(&mut self, key: &str) -> Option<Version<SegNo>> {
        self.find(key).map(|i| self.remove_at(i))
    }

    /// Takes slot `i`'s object out.
    pub(super) fn remove_at(&mut self, i: u32) -> Version<SegNo> {
        let v = self.unpack(i);
        let s = *self.at(i);
        self.tell(Kind::Removed, i, s.segment);
        // Only a tenant's key (rare) is built: eviction removes millions.
        if self.dict.first_byte(key_bytes(&self.keys, &s)) == Some(tenant::MARK as u8) {
            self.ledger.tenant_release(&self.key(i), v.value_len);
        }
        self.dict.release(key_bytes(&self.keys, &s));
        if let Ok(e) = self.index.find_entry(spread(s.hash), |&j| j == i) {
            e.remove();
        }
        self.more.remove(&i);
        self.soft_pins.remove(&i);
        self.unpin(i);
        let next = self.vacant.unwrap_or(NONE);
        *self.at_mut(i) = Slot {
            key_at: next,
            flags: VACANT,
            ..placeholder()
        };
        self.vacant = Some(i);
        self.garbage += usize::from(s.key_len);
        if self.garbage > 4096 && self.garbage * 2 > self.keys.len() {
            self.compact_keys();
        }
        v
    }

    /// Drops the replicas `keep` says no to; objects left with none are
    /// removed. Returns how many objects were removed.
    pub(super) fn retain_replicas(
        &mut self,
        mut keep: impl FnMut(&Slot, SegNo, Region) -> bool,
    ) -> usize {
        let mut removed = 0;
        for i in 0..self.filled {
            if self.at(i).vacant() {
                continue;
            }
            let s = *self.at(i);
            if s.flags & (SECOND | MORE) == 0 {
                // The common case, without building lists.
                if !keep(&s, s.segment, s.region()) {
                    self.remove_at(i);
                    removed += 1;
                }
                continue;
            }
            let before: Vec<(SegNo, Region)> = self.replicas(i).collect();
            let kept: Vec<(SegNo, Region)> = before
                .iter()
                .copied()
                .filter(|&(no, r)| keep(&s, no, r))
                .collect();
            if kept.len() == before.len() {
                continue;
            }
            if kept.is_empty() {
                self.remove_at(i);
                removed += 1;
            } else {
                self.set_replicas(i, &kept);
            }
        }
        removed
    }

    fn set_replicas(&mut self, i: u32, list: &[(SegNo, Region)]) {
        let s = self.at_mut(i);
        s.segment = list[0].0;
        s.set_region(list[0].1);
        s.flags &= !(SECOND | MORE);
        if let Some(&second) = list.get(1) {
            s.flags |= SECOND;
            let chunk = i as usize / CHUNK;
            if self.second.len() <= chunk {
                self.second.resize_with(chunk + 1, || None);
            }
            let extras =
                self.second[chunk].get_or_insert_with(|| Box::new([Extra::default(); CHUNK]));
            extras[i as usize % CHUNK] = Extra::new(second);
        }
        if list.len() > 2 {
            self.at_mut(i).flags |= MORE;
            self.more.insert(i, list[2..].to_vec());
        } else {
            self.more.remove(&i);
        }
    }

    /// Fills slot `i` with `v`, under the key stored at `key_at` (`key_len`
    /// bytes) whose hash is `hash`.
    fn write(&mut self, i: u32, (key_at, key_len, hash): (u32, u16, u32), v: &Version<SegNo>) {
        let mut flags = 0;
        if let Some(pin) = v.hard_pin {
            flags |= HARD_PIN;
            self.hard_pins.insert(i, pin);
        }
        if v.soft_pin_until > Tick(0) {
            flags |= SOFT_PIN;
            self.soft_pins.insert(i, v.soft_pin_until);
        } else {
            self.soft_pins.remove(&i);
        }
        *self.at_mut(i) = Slot {
            key_at,
            key_len,
            flags,
            committed_s: v
                .committed_at
                .0
                .div_ceil(1_000_000_000)
                .min(u64::from(u32::MAX)) as u32,
            hash,
            value_len: v.value_len,
            generation: v.generation,
            lease_until: v.lease_until,
            last_access: v.last_access,
            // Where the replicas live is set next.
            ..placeholder()
        };
        self.set_replicas(i, &v.replicas);
    }

    fn unpack(&self, i: u32) -> Version<SegNo> {
        let s = self.at(i);
        Version {
            value_len: s.value_len,
            generation: s.generation,
            replicas: self.replicas(i).collect(),
            lease_until: s.lease_until,
            soft_pin_until: self.soft_pin_until(i),
            last_access: s.last_access,
            committed_at: s.committed_at(),
            hard_pin: self.hard_pins.get(&i).copied(),
        }
    }

    /// Appends `key`'s stored form to the arena; returns where it starts
    /// and its length.
    fn store_key(&mut self, key: &[u8]) -> (u32, u16) {
        if self.keys.capacity() - self.keys.len() < key.len() {
            // Grow by a quarter, not double: the spare room is resident.
            self.keys.reserve_exact(key.len().max(self.keys.len() / 4));
        }
        let at = self.keys.len();
        self.dict.encode(key, &mut self.keys);
        // 4 GiB of keys in one of thousands of shards: terabytes in all.
        let at = u32::try_from(at).expect("key arena of one shard over 4 GiB");
        // `validate_key` caps keys at 64 KiB - 1, and a stored form is never longer.
        (at, (self.keys.len() - at as usize) as u16)
    }

    /// Rewrites the arena with only the keys still referred to.
    fn compact_keys(&mut self) {
        let live = self.keys.len() - self.garbage;
        let mut keys = Vec::with_capacity(live + live / 4);
        for chunk in self.slots.iter_mut() {
            for s in chunk.iter_mut().filter(|s| !s.vacant()) {
                let at = keys.len() as u32;
                keys.extend_from_slice(key_bytes(&self.keys, s));
                s.key_at = at;
            }
        }
        self.keys = keys;
        self.garbage = 0;
    }
}

/// A region's length in [`ALIGN`] units, as slots keep it.
fn units(len: u64) -> u32 {
    // The allocator hands out and rebuilds nothing longer.
    (len / ALIGN).min(u64::from(u32::MAX)) as u32
}

/// The region at `offset` of `units` [`ALIGN`] units.
fn region(offset: u64, units: u32) -> Region {
    Region {
        offset,
        len: u64::from(units) * ALIGN,
    }
}

/// A second replica, in 16 bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Extra {
    segment: u32,
    /// Length in [`ALIGN`] units.
    units: u32,
    offset: u64,
}

impl Extra {
    fn new((no, r): (SegNo, Region)) -> Self {
        Extra {
            segment: no.0,
            units: units(r.len),
            offset: r.offset,
        }
    }

    fn replica(&self) -> (SegNo, Region) {
        (SegNo(self.segment), region(self.offset, self.units))
    }
}

/// A slot's value before it is written.
fn placeholder() -> Slot {
    Slot {
        key_at: 0,
        key_len: 0,
        flags: 0,
        segment: SegNo(0),
        committed_s: 0,
        hash: 0,
        offset: 0,
        units: 0,
        value_len: 0,
        generation: 0,
        lease_until: Tick(0),
        last_access: Tick(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl ObjectTable {
        fn dict_held(&self) -> usize {
            self.dict.held().0
        }
    }

    fn region(offset: u64) -> Region {
        Region { offset, len: 64 }
    }

    fn version(generation: u64, replicas: &[(u32, u64)]) -> Version<SegNo> {
        Version {
            value_len: 10,
            generation,
            replicas: replicas
                .iter()
                .map(|&(s, o)| (SegNo(s), region(o)))
                .collect(),
            lease_until: Tick(5),
            soft_pin_until: Tick(0),
            last_access: Tick(7),
            committed_at: Tick(3_000_000_000),
            hard_pin: None,
        }
    }

    #[test]
    fn insert_find_replace_remove() {
        let mut t = ObjectTable::default();
        assert!(t.insert("a", version(1, &[(0, 0)])).is_none());
        assert!(t.insert("bb", version(2, &[(0, 64), (1, 0)])).is_none());
        assert_eq!(t.len(), 2);
        assert_eq!(t.get("a").map(|s| s.generation), Some(1));
        let i = t.find("bb").unwrap();
        assert_eq!(t.key(i), "bb");
        assert_eq!(t.replicas(i).count(), 2);
        assert_eq!(t.bytes(i), 128);
        assert_eq!(t.at(i).committed_at(), Tick(3_000_000_000));
        let old = t.insert("a", version(3, &[(2, 128)])).unwrap();
        assert_eq!(old.generation, 1);
        assert_eq!(old.replicas, vec![(SegNo(0), region(0))]);
        let removed = t.remove("bb").unwrap();
        assert_eq!(removed.replicas.len(), 2);
        assert!(t.get("bb").is_none());
        assert_eq!(t.len(), 1);
        // The vacant slot is reused.
        t.insert("c", version(4, &[(0, 0)]));
        assert_eq!(t.find("c"), Some(i));
        assert!(t.more.is_empty());
    }

    #[test]
    fn pins_and_extra_replicas_live_beside_the_slot() {
        let ledger = Arc::new(Ledger::default());
        let mut t = ObjectTable::new(ledger.clone(), Arc::default());
        let mut v = version(1, &[(0, 0)]);
        v.soft_pin_until = Tick(99);
        let owner = kvpool_proto::msg::ClientId(5);
        let none = Default::default();
        assert!(ledger
            .reserve_pin((owner, "k"), 64, (64, 64), &none)
            .is_ok());
        v.hard_pin = Some(Pin { owner, bytes: 64 });
        t.insert("k", v);
        let i = t.find("k").unwrap();
        assert_eq!(t.soft_pin_until(i), Tick(99));
        assert!(t.at(i).hard_pinned());
        t.add_replica(i, SegNo(1), region(64));
        t.add_replica(i, SegNo(1), region(64));
        assert_eq!(t.replicas(i).count(), 2);
        // Dropping the first replica promotes the second into the slot.
        let removed = t.retain_replicas(|_, no, _| no != SegNo(0));
        assert_eq!(removed, 0);
        assert_eq!(
            t.replicas(i).collect::<Vec<_>>(),
            vec![(SegNo(1), region(64))]
        );
        assert_eq!(ledger.held(owner).pinned, 64);
        // One replica at a time: never the last.
        assert_eq!(t.remove_replica(i, SegNo(1)), None);
        t.add_replica(i, SegNo(2), region(128));
        assert_eq!(t.remove_replica(i, SegNo(3)), None);
        assert_eq!(t.remove_replica(i, SegNo(1)), Some(region(64)));
        assert_eq!(
            t.replicas(i).collect::<Vec<_>>(),
            vec![(SegNo(2), region(128))]
        );
        // A second replica beside the slot, a third in the map; dropping the
        // second moves the third into its place.
        t.add_replica(i, SegNo(3), region(192));
        t.add_replica(i, SegNo(4), region(256));
        assert!(t.more.contains_key(&i));
        assert_eq!(t.bytes(i), 3 * 64);
        assert_eq!(t.remove_replica(i, SegNo(3)), Some(region(192)));
        assert!(t.more.is_empty());
        assert_eq!(
            t.replicas(i).collect::<Vec<_>>(),
            vec![(SegNo(2), region(128)), (SegNo(4), region(256))]
        );
        assert_eq!(t.retain_replicas(|_, _, _| false), 1);
        assert_eq!(t.len(), 0);
        assert!(t.soft_pins.is_empty() && t.more.is_empty() && t.hard_pins.is_empty());
        // The object is gone, and with it the bytes its writer had pinned.
        assert_eq!(ledger.held(owner).pinned, 0);
    }

    #[test]
    fn a_replaced_or_removed_hard_pin_is_given_back() {
        let ledger = Arc::new(Ledger::default());
        let mut t = ObjectTable::new(ledger.clone(), Arc::default());
        let owner = kvpool_proto::msg::ClientId(9);
        let policy = Default::default();
        let pinned = |key, bytes| {
            let limits = (u64::MAX, u64::MAX);
            assert!(ledger
                .reserve_pin((owner, key), bytes, limits, &policy)
                .is_ok());
            let mut v = version(1, &[(0, 0)]);
            v.hard_pin = Some(Pin { owner, bytes });
            v
        };
        // `b` is a tenant's: its pin counts against the tenant too.
        let b = "\u{1}acme\u{1}b";
        t.insert("a", pinned("a", 100));
        t.insert(b, pinned(b, 10));
        assert_eq!(ledger.held(owner).pinned, 110);
        assert_eq!(ledger.tenant_usage("acme").pinned, 10);
        t.insert("a", version(2, &[(0, 64)]));
        assert_eq!(ledger.held(owner).pinned, 10);
        t.remove(b);
        assert_eq!(ledger.held(owner).pinned, 0);
        assert_eq!(ledger.tenant_usage("acme").pinned, 0);
        assert!(t.hard_pins.is_empty());
    }

    #[test]
    fn many_keys_survive_churn_and_arena_compaction() {
        // Plain keys, and engine keys stored compact (odd digit runs too).
        let plain = |n: u64| format!("key-{n}");
        let engine = |n: u64| format!("model_{:064x}_0_{}", n * 7919, ["k", "v"][n as usize % 2]);
        let odd = |n: u64| format!("{:017x}@{}", n, n % 5);
        for key in [&plain as &dyn Fn(u64) -> String, &engine, &odd] {
            let mut t = ObjectTable::default();
            for n in 0..20_000u64 {
                t.insert(&key(n), version(n, &[(0, n * 64)]));
            }
            for n in (0..20_000u64).filter(|n| n % 3 != 0) {
                assert_eq!(t.remove(&key(n)).unwrap().generation, n);
            }
            for n in 20_000..25_000u64 {
                t.insert(&key(n), version(n, &[(0, n * 64)]));
            }
            assert!(t.garbage * 2 <= t.keys.len() || t.garbage <= 4096);
            let want: Vec<u64> = (0..20_000)
                .filter(|n| n % 3 == 0)
                .chain(20_000..25_000)
                .collect();
            assert_eq!(t.len(), want.len());
            for &n in &want {
                let i = t.find(&key(n)).expect("kept");
                assert_eq!(t.key(i), key(n));
                assert_eq!(t.at(i).generation, n);
                assert!(t.find(&key(n + 1_000_000)).is_none());
            }
            assert_eq!(t.iter().count(), t.len());
            for n in want {
                t.remove(&key(n)).expect("kept");
            }
            // The last key of a prefix takes its text along.
            assert_eq!(t.dict_held(), 0);
        }
    }
}
