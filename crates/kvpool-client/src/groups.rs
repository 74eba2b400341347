//! Metadata groups: the prototype of docs/scaling.md's pool past one master.
//!
//! A pool's keys are split by *slot* over several kvpool clusters, each a
//! whole pool of today (its masters elected through etcd under its own
//! cluster id, its own stores). A key's slot is xxh3-64 of its bytes mod
//! [`SLOTS`], the same in every process and version; the slot map in etcd
//! (`/kvpool/<pool>/slots`) names each slot's group. [`GroupedClient`]
//! routes each key to its group's client, splits a batch by group, runs the
//! parts at once and answers per key in the caller's order, so a single-key
//! operation touches one group and keeps that group's guarantees.
//!
//! Not built yet (the prototype's limits, docs/scaling.md): moving slots
//! between groups (the map is written once and its epoch never changes),
//! stores lending extents to several groups (each store serves one group),
//! and calls that span the pool (listing keys, removal by pattern).

use std::future::Future;

use futures::future::join_all;
use kvpool_net::etcd::Etcd;
use kvpool_proto::{Code, KvError, KvResult};
use serde_json::{json, Value};

use crate::{Client, ClientConfig, ReplicateConfig};

/// Slots a pool's keys hash into; each belongs to one group.
pub const SLOTS: usize = 4096;

/// The etcd key holding `pool`'s slot map.
pub fn slots_key(pool: &str) -> String {
    format!("/kvpool/{pool}/slots")
}

/// The slot of `key`: stable across processes, hosts and versions.
pub fn slot_of(key: &str) -> usize {
    (xxhash_rust::xxh3::xxh3_64(key.as_bytes()) % SLOTS as u64) as usize
}

/// Which group owns each slot, and how to reach each group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    /// Raised by every change of ownership (a prototype map stays at 1).
    pub epoch: u64,
    /// Each group's master address (`etcd://endpoints/cluster-id`).
    pub groups: Vec<String>,
    /// The group of each slot.
    owner: Vec<u16>,
}

impl SlotMap {
    /// `groups` owning equal runs of consecutive slots.
    pub fn even(groups: Vec<String>) -> KvResult<SlotMap> {
        if groups.is_empty() || groups.len() > SLOTS {
            return Err(KvError::new(
                Code::InvalidParams,
                format!("a pool has 1 to {SLOTS} groups, not {}", groups.len()),
            ));
        }
        let n = groups.len();
        let owner = (0..SLOTS).map(|s| (s * n / SLOTS) as u16).collect();
        Ok(SlotMap {
            epoch: 1,
            groups,
            owner,
        })
    }

    /// The group of `key`.
    pub fn group_of(&self, key: &str) -> usize {
        self.owner[slot_of(key)] as usize
    }

    /// Slots each group owns.
    pub fn slots_per_group(&self) -> Vec<usize> {
        let mut n = vec![0; self.groups.len()];
        for &g in &self.owner {
            n[g as usize] += 1;
        }
        n
    }

    /// The map as stored in etcd: runs of slots `[from, to)` per group.
    pub fn to_json(&self) -> String {
        let mut runs: Vec<Value> = Vec::new();
        let mut from = 0;
        for s in 1..=SLOTS {
            if s == SLOTS || self.owner[s] != self.owner[from] {
                runs.push(json!([from, s, self.owner[from]]));
                from = s;
            }
        }
        json!({ "epoch": self.epoch, "groups": self.groups, "slots": runs }).to_string()
    }

    /// Reads a stored map, refusing one that leaves a slot unowned, owns
    /// one twice or names a group it does not list.
    pub fn from_json(text: &str) -> KvResult<SlotMap> {
        let bad = |why: String| KvError::new(Code::InvalidParams, format!("slot map: {why}"));
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let epoch = v["epoch"].as_u64().ok_or_else(|| bad("no epoch".into()))?;
        let groups: Vec<String> = v["groups"]
            .as_array()
            .ok_or_else(|| bad("no groups".into()))?
            .iter()
            .map(|g| g.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("a group is not a string".into()))?;
        let mut owner = vec![u16::MAX; SLOTS];
        for run in v["slots"]
            .as_array()
            .ok_or_else(|| bad("no slots".into()))?
        {
            let field = |i: usize| run.get(i).and_then(Value::as_u64);
            let (Some(from), Some(to), Some(g)) = (field(0), field(1), field(2)) else {
                return Err(bad(format!("{run} is not [from, to, group]")));
            };
            let (from, to) = (from as usize, to as usize);
            if from >= to || to > SLOTS || g as usize >= groups.len() {
                return Err(bad(format!("{run} is out of range")));
            }
            for o in &mut owner[from..to] {
                if *o != u16::MAX {
                    return Err(bad(format!("slot {from}..{to} owned twice")));
                }
                *o = g as u16;
            }
        }
        if let Some(s) = owner.iter().position(|&o| o == u16::MAX) {
            return Err(bad(format!("slot {s} has no group")));
        }
        Ok(SlotMap {
            epoch,
            groups,
            owner,
        })
    }
}

/// Splits `pool` (`etcd://endpoints/pool`) into its endpoints and name.
pub fn parse_pool(pool: &str) -> KvResult<(&str, &str)> {
    pool.strip_prefix("etcd://")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(e, name)| !e.is_empty() && !name.is_empty() && !name.contains('/'))
        .ok_or_else(|| {
            KvError::new(
                Code::InvalidParams,
                format!("a grouped pool is etcd://host:port[;host:port...]/NAME, not {pool:?}"),
            )
        })
}

/// Stores `map` as `pool`'s slot map unless it has one; answers the map
/// the pool has now (the one given, or the one found).
pub async fn publish_map(pool: &str, map: &SlotMap) -> KvResult<SlotMap> {
    let (endpoints, name) = parse_pool(pool)?;
    let etcd = Etcd::new(endpoints, None)?;
    etcd.create(&slots_key(name), &map.to_json(), 0).await?;
    read_map(&etcd, name).await
}

async fn read_map(etcd: &Etcd, name: &str) -> KvResult<SlotMap> {
    let text = etcd.get(&slots_key(name)).await?.ok_or_else(|| {
        KvError::new(
            Code::InvalidParams,
            format!("pool {name} has no slot map in etcd"),
        )
    })?;
    SlotMap::from_json(&text)
}

/// A client of a grouped pool: one [`Client`] per group, each key sent to
/// its slot's group.
pub struct GroupedClient {
    map: SlotMap,
    clients: Vec<Client>,
}

impl GroupedClient {
    /// Reads `pool`'s slot map from etcd and connects to every group with
    /// `cfg` (its `master` replaced by each group's address).
    pub async fn connect(pool: &str, cfg: ClientConfig) -> KvResult<GroupedClient> {
        let (endpoints, name) = parse_pool(pool)?;
        Self::with_map(read_map(&Etcd::new(endpoints, None)?, name).await?, cfg).await
    }

    /// Connects to every group of `map` (as [`publish_map`] answered it).
    pub async fn with_map(map: SlotMap, cfg: ClientConfig) -> KvResult<GroupedClient> {
        let connects = map.groups.iter().map(|master| {
            let cfg = ClientConfig {
                master: master.clone(),
                ..cfg.clone()
            };
            Client::connect(cfg)
        });
        let clients = join_all(connects)
            .await
            .into_iter()
            .collect::<KvResult<Vec<_>>>()?;
        Ok(GroupedClient { map, clients })
    }

    /// The slot map this client routes by.
    pub fn map(&self) -> &SlotMap {
        &self.map
    }

    /// The client of group `g`.
    pub fn group(&self, g: usize) -> &Client {
        &self.clients[g]
    }

    /// The client of `key`'s group.
    fn client_of(&self, key: &str) -> &Client {
        &self.clients[self.map.group_of(key)]
    }

    /// Runs `call` once per group on that group's share of `n` items (their
    /// indexes, in order), all groups at once, and puts each answer back in
    /// its item's place. (`Client` clones share everything: the clone only
    /// lets each group's future own its client.)
    async fn split<T, F, Fut>(&self, n: usize, key: impl Fn(usize) -> usize, call: F) -> Vec<T>
    where
        F: Fn(Client, Vec<usize>) -> Fut,
        Fut: Future<Output = Vec<T>>,
    {
        let mut by_group: Vec<Vec<usize>> = vec![Vec::new(); self.clients.len()];
        for i in 0..n {
            by_group[key(i)].push(i);
        }
        let parts: Vec<(usize, Vec<usize>)> = (by_group.into_iter().enumerate())
            .filter(|(_, idx)| !idx.is_empty())
            .collect();
        let calls = (parts.iter()).map(|(g, idx)| call(self.clients[*g].clone(), idx.clone()));
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
        let done = join_all(calls).await;
        for ((_, idx), answers) in parts.iter().zip(done) {
            for (&i, a) in idx.iter().zip(answers) {
                out[i] = Some(a);
            }
        }
        out.into_iter()
            .map(|a| a.expect("each group answers each of its keys"))
            .collect()
    }

    /// [`GroupedClient::batch_put`] of values that are one part each.
    pub async fn batch_put_values(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<KvResult<()>> {
        let group = |i: usize| self.map.group_of(items[i].0);
        self.split(items.len(), group, |c, idx| async move {
            let part: Vec<(&str, &[u8])> = idx.iter().map(|&i| items[i]).collect();
            c.batch_put_values(&part, config, upsert).await
        })
        .await
    }

    /// Stores many objects, each in its key's group; one result per key.
    pub async fn batch_put(
        &self,
        items: &[(&str, &[&[u8]])],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<KvResult<()>> {
        let group = |i: usize| self.map.group_of(items[i].0);
        self.split(items.len(), group, |c, idx| async move {
            let part: Vec<(&str, &[&[u8]])> = idx.iter().map(|&i| items[i]).collect();
            c.batch_put(&part, config, upsert).await
        })
        .await
    }

    /// Reads many values, each from its key's group; one result per key.
    pub async fn batch_get(&self, keys: &[&str]) -> Vec<KvResult<Vec<u8>>> {
        let group = |i: usize| self.map.group_of(keys[i]);
        self.split(keys.len(), group, |c, idx| async move {
            let part: Vec<&str> = idx.iter().map(|&i| keys[i]).collect();
            c.batch_get(&part).await
        })
        .await
    }

    /// Removes many keys, each in its group; one result per key.
    pub async fn batch_remove(&self, keys: &[&str], force: bool) -> Vec<KvResult<()>> {
        let group = |i: usize| self.map.group_of(keys[i]);
        self.split(keys.len(), group, |c, idx| async move {
            let part: Vec<&str> = idx.iter().map(|&i| keys[i]).collect();
            c.batch_remove(&part, force).await
        })
        .await
    }

    /// Stores `value` under `key` (write-once).
    pub async fn put(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> KvResult<()> {
        self.client_of(key).put(key, value, config).await
    }

    /// Stores `value` under `key`, replacing any existing value.
    pub async fn upsert(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> KvResult<()> {
        self.client_of(key).upsert(key, value, config).await
    }

    /// Reads `key`'s value.
    pub async fn get(&self, key: &str) -> KvResult<Vec<u8>> {
        self.client_of(key).get(key).await
    }

    /// Whether `key` exists.
    pub async fn exist(&self, key: &str) -> KvResult<bool> {
        self.client_of(key).exist(key).await
    }

    /// Removes `key`.
    pub async fn remove(&self, key: &str, force: bool) -> KvResult<()> {
        self.client_of(key).remove(key, force).await
    }

    /// Closes every group's client.
    pub async fn close(&self) {
        join_all(self.clients.iter().map(Client::close)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_stable_and_spread() {
        // Pinned: a slot may never change meaning between versions.
        assert_eq!(
            slot_of(""),
            (xxhash_rust::xxh3::xxh3_64(b"") % 4096) as usize
        );
        let mut per = [0usize; 4];
        let map = SlotMap::even((0..4).map(|g| format!("etcd://e/g{g}")).collect()).unwrap();
        for i in 0..40_000 {
            per[map.group_of(&format!("key-{i}"))] += 1;
        }
        for n in per {
            assert!((9_000..11_000).contains(&n), "{per:?}");
        }
        assert_eq!(map.slots_per_group(), vec![1024; 4]);
    }

    #[test]
    fn maps_round_trip_and_bad_ones_are_refused() {
        let map = SlotMap::even(vec!["a".into(), "b".into(), "c".into()]).unwrap();
        assert_eq!(SlotMap::from_json(&map.to_json()).unwrap(), map);
        for bad in [
            r#"{"epoch":1,"groups":["a"],"slots":[[0,4095,0]]}"#,
            r#"{"epoch":1,"groups":["a"],"slots":[[0,4096,1]]}"#,
            r#"{"epoch":1,"groups":["a"],"slots":[[0,4096,0],[5,6,0]]}"#,
            r#"{"epoch":1,"groups":["a"],"slots":[[0,4097,0]]}"#,
            r#"{"groups":["a"],"slots":[[0,4096,0]]}"#,
            "not json",
        ] {
            let e = SlotMap::from_json(bad).unwrap_err();
            assert_eq!(e.code, Code::InvalidParams, "{bad}");
        }
        assert!(SlotMap::even(Vec::new()).is_err());
    }

    #[test]
    fn pool_addresses_parse() {
        assert_eq!(
            parse_pool("etcd://127.0.0.1:2379;h:1/prod").unwrap(),
            ("127.0.0.1:2379;h:1", "prod")
        );
        for bad in [
            "127.0.0.1:2379",
            "etcd://h:1",
            "etcd://h:1/",
            "etcd:///p",
            "etcd://h/a/b",
        ] {
            assert!(parse_pool(bad).is_err(), "{bad}");
        }
    }
}
