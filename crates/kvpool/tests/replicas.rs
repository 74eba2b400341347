//! Replication under a store crash: with two replicas per object, a `kill -9`
//! of one store loses nothing, before and after the master notices.

mod common;

use std::collections::HashMap;

use common::{random_bytes, Cluster, CLIENT_TTL, TTL_MARGIN};
use kvpool_client::{Client, GetInto, ReplicateConfig};
use kvpool_proto::msg::GetReplicaList;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const OBJECTS: usize = 50;
const MAX_LEN: usize = 2 << 20;
const SEED: u64 = 0x5EED_0001;

/// Reads every object with single gets and with one `batch_get_into`, and
/// checks the bytes.
async fn assert_all_readable(client: &Client, objects: &[(String, Vec<u8>)], when: &str) {
    for (k, v) in objects {
        match client.get(k).await {
            Ok(got) => assert!(
                got == *v,
                "{when}: get({k}) returned different bytes ({} vs {})",
                got.len(),
                v.len()
            ),
            Err(e) => panic!("{when}: get({k}) failed: {e}"),
        }
    }
    let mut bufs: Vec<Vec<u8>> = objects.iter().map(|(_, v)| vec![0u8; v.len()]).collect();
    let mut items: Vec<GetInto> = objects
        .iter()
        .zip(bufs.iter_mut())
        .map(|((k, _), b)| GetInto {
            key: k,
            dst: vec![&mut b[..]],
        })
        .collect();
    let results = client.batch_get_into(&mut items).await;
    drop(items);
    for (((k, v), r), b) in objects.iter().zip(results).zip(&bufs) {
        match r {
            Ok(n) => {
                assert_eq!(n, v.len(), "{when}: batch_get_into({k}) length");
                assert!(
                    b == v,
                    "{when}: batch_get_into({k}) returned different bytes"
                );
            }
            Err(e) => panic!("{when}: batch_get_into({k}) failed: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_survive_kill9_of_a_store() {
    let mut cluster = Cluster::builder()
        .stores(2)
        .segment_size("160MiB")
        .start()
        .await;
    let client = cluster.client().await;
    let mut rng = StdRng::seed_from_u64(SEED);
    let objects: Vec<(String, Vec<u8>)> = (0..OBJECTS)
        .map(|i| {
            let len = match i {
                0 => 1,
                1 => MAX_LEN,
                _ => rng.gen_range(1..=MAX_LEN),
            };
            (format!("replicas/{i:03}"), random_bytes(&mut rng, len))
        })
        .collect();
    let rc = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    for (k, v) in &objects {
        client
            .put(k, v, &rc)
            .await
            .unwrap_or_else(|e| panic!("put({k}, {} B): {e}", v.len()));
    }

    let st = client.status().await.expect("status");
    assert_eq!(st.keys, OBJECTS as u64);
    assert_eq!(st.segments.len(), 2);
    for seg in &st.segments {
        assert_eq!(
            seg.regions, OBJECTS as u64,
            "segment {} should hold one replica of every object",
            seg.info.name
        );
    }

    // Kill the store that readers try first for the most objects, so reads
    // after the crash have to fall back to the other replica.
    let keys: Vec<String> = objects.iter().map(|(k, _)| k.clone()).collect();
    let locations = cluster
        .master_link("replica-probe")
        .call(&GetReplicaList { keys })
        .await
        .expect("GetReplicaList");
    let mut first_by_endpoint: HashMap<String, usize> = HashMap::new();
    for (l, (k, _)) in locations.into_iter().zip(&objects) {
        let l = l.unwrap_or_else(|e| panic!("locate {k}: error {e}"));
        assert_eq!(l.replicas.len(), 2, "{k} should have 2 replicas");
        assert_ne!(
            l.replicas[0].segment, l.replicas[1].segment,
            "{k}: replicas on one segment"
        );
        *first_by_endpoint
            .entry(l.replicas[0].endpoint.clone())
            .or_default() += 1;
    }
    let (victim_endpoint, first_count) = first_by_endpoint
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .expect("some object has a first replica");
    let victim_seg = st
        .segments
        .iter()
        .find(|s| s.info.endpoint == victim_endpoint)
        .expect("the victim endpoint is a mounted segment");
    let victim = (0..2)
        .find(|&i| Cluster::store_name(i) == victim_seg.info.name)
        .expect("segment named after its store");
    let survivor_name = Cluster::store_name(1 - victim);
    eprintln!(
        "killing {} (first replica of {first_count} objects)",
        victim_seg.info.name
    );
    cluster.kill9_store(victim);

    assert_all_readable(&client, &objects, "right after kill -9").await;

    // The master drops the dead store's segment once it has been silent for client_ttl.
    let st = common::eventually(
        "the dead store's segment to be dropped",
        CLIENT_TTL + TTL_MARGIN,
        async || {
            let st = client.status().await.ok()?;
            (st.segments.len() == 1).then_some(st)
        },
    )
    .await;
    assert_eq!(
        st.segments[0].info.name, survivor_name,
        "the surviving segment is the live store's"
    );
    assert_eq!(
        st.keys, OBJECTS as u64,
        "no object may be lost while one replica lives"
    );
    assert_eq!(st.segments[0].regions, OBJECTS as u64);

    assert_all_readable(&client, &objects, "after the dead segment was dropped").await;
    cluster.assert_alive();
}
