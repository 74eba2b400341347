//! Eviction under a full pool: writing twice the capacity always succeeds,
//! the oldest objects make room, and a read never returns wrong bytes.

mod common;

use std::time::Duration;

use common::{random_bytes, seed_of, Cluster};
use kvpool_client::{Client, ReplicateConfig};
use kvpool_proto::Code;
use rand::rngs::StdRng;
use rand::SeedableRng;

const OBJECT_LEN: usize = 256 << 10;
/// Read lease of this test's master: short, so read objects become evictable again soon.
const LEASE: Duration = Duration::from_secs(1);

fn key(i: usize) -> String {
    format!("evict/{i:06}")
}

fn value(i: usize) -> Vec<u8> {
    random_bytes(&mut StdRng::seed_from_u64(seed_of(&key(i))), OBJECT_LEN)
}

/// Puts objects `range` one after the other; every put must succeed.
async fn fill(client: &Client, range: std::ops::Range<usize>) {
    for i in range {
        if let Err(e) = client
            .put(&key(i), &value(i), &ReplicateConfig::default())
            .await
        {
            panic!("put #{i} failed (eviction must make room): {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filling_twice_the_capacity_evicts_oldest_first() {
    let lease_ms = LEASE.as_millis().to_string();
    let mut cluster = Cluster::builder()
        .segment_size("64MiB")
        .master_flag("--default-kv-lease-ttl", &lease_ms)
        .start()
        .await;
    let client = cluster.client().await;
    let capacity = client.status().await.expect("status").capacity;
    let n = (2 * capacity).div_ceil(OBJECT_LEN as u64) as usize;

    // No reads during the fill, so no lease pins anything.
    fill(&client, 0..n).await;

    // Oldest first; a read leases and refreshes, which is fine from here on.
    let mut readable = vec![false; n];
    for (i, ok) in readable.iter_mut().enumerate() {
        match client.get(&key(i)).await {
            Ok(v) => {
                assert!(
                    v == value(i),
                    "get({}) returned bytes of another object",
                    key(i)
                );
                *ok = true;
            }
            Err(e) if e.code == Code::ObjectNotFound => {}
            Err(e) => panic!(
                "get({}) failed with {e}; only the value or OBJECT_NOT_FOUND is allowed",
                key(i)
            ),
        }
    }
    let survivors = readable.iter().filter(|r| **r).count();
    eprintln!("{survivors} of {n} objects survived");
    let newest = n - n * 2 / 5;
    assert!(
        readable[newest..].iter().all(|r| *r),
        "the newest 40% must be readable; missing: {:?}",
        (newest..n).filter(|&i| !readable[i]).collect::<Vec<_>>()
    );
    assert!(
        readable[..n / 4].iter().all(|r| !*r),
        "the oldest 25% must be evicted; still there: {:?}",
        (0..n / 4).filter(|&i| readable[i]).collect::<Vec<_>>()
    );
    // With no reads during the fill, least recently used is oldest written:
    // the survivors are exactly the newest objects.
    let first = readable
        .iter()
        .position(|r| *r)
        .expect("some object survives");
    assert!(
        readable[first..].iter().all(|r| *r),
        "survivors must be a run of the newest objects"
    );
    let st = client.status().await.expect("status");
    assert!(st.evictions > 0, "evictions counter must count: {st:?}");
    assert_eq!(st.keys, survivors as u64);
    assert_eq!(st.pending, 0);

    // A read refreshes: re-read the oldest survivor, let every lease end, and
    // write half the pool again. It outlives its never-re-read neighbour.
    let (refreshed, neighbour) = (first, first + 1);
    assert!(client.get(&key(refreshed)).await.expect("get") == value(refreshed));
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    fill(&client, n..n + survivors / 2).await;
    assert!(
        client.exist(&key(refreshed)).await.expect("exist"),
        "the re-read object was evicted"
    );
    assert!(
        !client.exist(&key(neighbour)).await.expect("exist"),
        "the least recently read object survived"
    );
    assert!(client.get(&key(refreshed)).await.expect("get") == value(refreshed));
    cluster.assert_alive();
}
