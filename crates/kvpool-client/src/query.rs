//! Metadata-only calls: existence, sizes, removal, key listing and cluster
//! status. Each is one master round trip; removals also drop the keys' cached
//! locations, so this client never reads a removed object through them.

use kvpool_proto::msg::{self, ClusterStatus, KeyPage};
use kvpool_proto::tenant;
use kvpool_proto::{validate_key, Code, KvResult};
use tokio::time::Instant;

use crate::rpc::one;
use crate::Client;

impl Client {
    /// Whether `key` exists (committed); does not extend its life.
    pub async fn exist(&self, key: &str) -> KvResult<bool> {
        one(self.batch_exist(&[key]).await)
    }

    /// Existence of many keys; one result per key.
    pub async fn batch_exist(&self, keys: &[&str]) -> Vec<KvResult<bool>> {
        let t0 = Instant::now();
        let out: Vec<KvResult<bool>> = self
            .sizes(keys)
            .await
            .into_iter()
            .map(|r| match r {
                Ok(_) => Ok(true),
                Err(e) if e.code == Code::ObjectNotFound => Ok(false),
                Err(e) => Err(e),
            })
            .collect();
        (self.inner.metrics).record("exist", &out, |_, _| 0, t0.elapsed());
        out
    }

    /// Value size of `key`.
    pub async fn get_size(&self, key: &str) -> KvResult<u64> {
        one(self.sizes(&[key]).await)
    }

    async fn sizes(&self, keys: &[&str]) -> Vec<KvResult<u64>> {
        let scoped = self.tenant_keys(keys);
        let refs: Vec<&str> = scoped.iter().map(String::as_str).collect();
        let keys = if scoped.is_empty() { keys } else { &refs[..] };
        // One bad key fails the batch before the master sees it.
        if let Some(e) = keys.iter().find_map(|k| validate_key(k).err()) {
            return keys
                .iter()
                .map(|k| validate_key(k).and(Err(e.clone())))
                .collect();
        }
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let exist = |keys| msg::Exist { keys };
        self.call_split(keys, String::as_str, exist).await
    }

    /// Removes `key`; `force` ignores a live read lease.
    pub async fn remove(&self, key: &str, force: bool) -> KvResult<()> {
        one(self.batch_remove(&[key], force).await)
    }

    /// Removes many keys; one result per key.
    pub async fn batch_remove(&self, keys: &[&str], force: bool) -> Vec<KvResult<()>> {
        let t0 = Instant::now();
        let owned: Vec<String> = keys.iter().map(|k| self.scoped(k).into_owned()).collect();
        let remove = |keys| msg::Remove { keys, force };
        let out = self.call_split(owned.clone(), String::as_str, remove).await;
        for k in &owned {
            self.inner.cache.forget(k);
        }
        (self.inner.metrics).record("remove", &out, |_, _| 0, t0.elapsed());
        out
    }

    /// Removes keys matching a regex; returns how many.
    pub async fn remove_by_regex(&self, pattern: &str, force: bool) -> KvResult<u64> {
        self.inner.cache.clear();
        let pattern = pattern.to_string();
        self.call(&msg::RemoveByRegex { pattern, force }).await
    }

    /// Removes every object; returns how many.
    pub async fn remove_all(&self, force: bool) -> KvResult<u64> {
        self.inner.cache.clear();
        self.call(&msg::RemoveAll { force }).await
    }

    /// One page of the keys starting with `prefix`, with their value sizes,
    /// from `cursor` (empty to start; a page's `cursor` after, empty once
    /// done). A page holds at most `limit` keys (capped at 10,000) and may
    /// hold fewer, or none, before the end: the master bounds each call's
    /// work. A tenant's client lists its own namespace, without its prefix.
    pub async fn list_keys(&self, prefix: &str, cursor: &[u8], limit: u32) -> KvResult<KeyPage> {
        let mut page: KeyPage = self
            .call(&msg::ListKeys {
                prefix: self.scoped(prefix).into_owned(),
                cursor: cursor.to_vec(),
                limit,
            })
            .await?;
        if let Some(ns) = self.tenant().map(tenant::prefix) {
            for (k, _) in &mut page.keys {
                if let Some(own) = k.strip_prefix(&ns) {
                    *k = own.to_string();
                }
            }
        }
        Ok(page)
    }

    /// The cluster as the master sees it.
    pub async fn status(&self) -> KvResult<ClusterStatus> {
        self.call(&msg::Status {}).await
    }
}
