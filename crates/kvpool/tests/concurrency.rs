//! Many clients at once: six independent clients write and read back their
//! own objects with every put and get flavour, then read each other's, with
//! zero errors and byte-exact values.

mod common;

use std::sync::Arc;

use common::{value_for, Cluster};
use kvpool_client::{Client, GetInto, ReplicateConfig};
use tokio::sync::Barrier;

const CLIENTS: usize = 6;
const OBJECTS: usize = 200;
const MAX_LEN: usize = 256 << 10;
/// Objects per put or get call group: the unit that switches between flavours.
const CHUNK: usize = 10;

fn keys_of(client: usize) -> Vec<String> {
    (0..OBJECTS)
        .map(|i| format!("conc/c{client}/{i:04}"))
        .collect()
}

fn value(key: &str) -> Vec<u8> {
    value_for(key, MAX_LEN)
}

/// Writes `keys` in chunks, alternating one-by-one puts, `put_parts`, and `batch_put`.
async fn write_all(client: &Client, keys: &[String]) {
    let rc = ReplicateConfig::default();
    for (c, chunk) in keys.chunks(CHUNK).enumerate() {
        let values: Vec<Vec<u8>> = chunk.iter().map(|k| value(k)).collect();
        match c % 3 {
            0 => {
                for (k, v) in chunk.iter().zip(&values) {
                    client
                        .put(k, v, &rc)
                        .await
                        .unwrap_or_else(|e| panic!("put({k}): {e}"));
                }
            }
            1 => {
                for (k, v) in chunk.iter().zip(&values) {
                    let (a, b) = v.split_at(v.len() / 2);
                    client
                        .put_parts(k, &[a, b], &rc)
                        .await
                        .unwrap_or_else(|e| panic!("put_parts({k}): {e}"));
                }
            }
            _ => {
                let items: Vec<(&str, &[u8])> = chunk
                    .iter()
                    .map(String::as_str)
                    .zip(values.iter().map(Vec::as_slice))
                    .collect();
                for (k, r) in chunk
                    .iter()
                    .zip(client.batch_put_values(&items, &rc, false).await)
                {
                    r.unwrap_or_else(|e| panic!("batch_put({k}): {e}"));
                }
            }
        }
    }
}

/// Reads `keys` in chunks, alternating `get`, `batch_get` and `batch_get_into`
/// (starting at flavour `shift`), and checks every byte.
async fn read_all(client: &Client, keys: &[String], shift: usize, who: &str) {
    for (c, chunk) in keys.chunks(CHUNK).enumerate() {
        let want: Vec<Vec<u8>> = chunk.iter().map(|k| value(k)).collect();
        let got: Vec<Vec<u8>> = match (c + shift) % 3 {
            0 => {
                let mut got = Vec::with_capacity(chunk.len());
                for k in chunk {
                    got.push(
                        client
                            .get(k)
                            .await
                            .unwrap_or_else(|e| panic!("{who}: get({k}): {e}")),
                    );
                }
                got
            }
            1 => {
                let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                let res = client.batch_get(&refs).await;
                chunk
                    .iter()
                    .zip(res)
                    .map(|(k, r)| r.unwrap_or_else(|e| panic!("{who}: batch_get({k}): {e}")))
                    .collect()
            }
            _ => {
                // Buffers one byte larger than the value: the length returned must be the value's.
                let mut bufs: Vec<Vec<u8>> = want.iter().map(|v| vec![0u8; v.len() + 1]).collect();
                let mut items = GetInto::each(chunk, &mut bufs);
                let res = client.batch_get_into(&mut items).await;
                drop(items);
                chunk
                    .iter()
                    .zip(res)
                    .zip(bufs)
                    .map(|((k, r), mut b)| {
                        let n = r.unwrap_or_else(|e| panic!("{who}: batch_get_into({k}): {e}"));
                        b.truncate(n);
                        b
                    })
                    .collect()
            }
        };
        for ((k, g), w) in chunk.iter().zip(&got).zip(&want) {
            assert!(
                g == w,
                "{who}: {k} read back {} bytes that differ from the {} written",
                g.len(),
                w.len()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_clients_write_and_cross_read_without_errors() {
    // Room for every object (about 150 MiB) without reaching the eviction watermark.
    let mut cluster = Cluster::builder()
        .stores(2)
        .segment_size("256MiB")
        .start()
        .await;
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = cluster.client().await;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let who = format!("client {c}");
            let mine = keys_of(c);
            write_all(&client, &mine).await;
            read_all(&client, &mine, c, &who).await;
            // Everyone has written: read a neighbour's objects.
            barrier.wait().await;
            read_all(&client, &keys_of((c + 1) % CLIENTS), c + 1, &who).await;
            client.close().await;
        }));
    }
    for (c, t) in tasks.into_iter().enumerate() {
        if let Err(e) = t.await {
            std::panic::resume_unwind(
                e.try_into_panic()
                    .unwrap_or_else(|e| panic!("client {c} task: {e}")),
            );
        }
    }
    let st = cluster.client().await.status().await.expect("status");
    assert_eq!(st.keys, (CLIENTS * OBJECTS) as u64);
    assert_eq!(st.pending, 0);
    assert_eq!(
        st.evictions, 0,
        "the pool was sized so that nothing is evicted"
    );
    assert!(
        st.segments.iter().all(|s| s.regions > 0),
        "both stores hold objects: {st:?}"
    );
    cluster.assert_alive();
}
