//! Transport conformance: the same scenarios over TCP and over shared memory
//! (the client maps the store's segment file), against real processes. Bytes
//! written through one transport read back through the other; reads under
//! concurrent eviction and overwrite never return wrong bytes.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use kvpool_client::{Client, GetInto, Protocol, ReplicateConfig};
use kvpool_proto::{Code, KvError, KvResult};
use parking_lot::Mutex;

const PROTOCOLS: [Protocol; 2] = [Protocol::Tcp, Protocol::Shm];

async fn client(cluster: &Cluster, protocol: Protocol) -> Client {
    cluster.client_with(|c| c.protocol = protocol).await
}

/// Every put and get form round-trips byte-exact, whichever transport wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_form_round_trips_across_transports() {
    let cluster = Cluster::builder().segment_size("128MiB").start().await;
    let rc = ReplicateConfig::default();
    for writer in PROTOCOLS {
        let w = client(&cluster, writer).await;
        let tag = format!("{writer:?}");
        let keys: Vec<String> = (0..60).map(|i| format!("{tag}-{i}")).collect();
        for (i, key) in keys.iter().enumerate() {
            let v = value_for(key, 1 << 20);
            match i % 3 {
                0 => w.put(key, &v, &rc).await,
                1 => {
                    let (a, b) = v.split_at(v.len() / 2);
                    w.put_parts(key, &[a, b], &rc).await
                }
                _ => w.upsert(key, &v, &rc).await,
            }
            .unwrap_or_else(|e| panic!("{tag} put {key}: {e}"));
        }
        for reader in PROTOCOLS {
            let r = client(&cluster, reader).await;
            for key in &keys[..20] {
                assert_eq!(
                    r.get(key).await.expect("get"),
                    value_for(key, 1 << 20),
                    "{tag}->{reader:?} {key}"
                );
            }
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            for (key, v) in keys.iter().zip(r.batch_get(&refs).await) {
                assert_eq!(
                    v.expect("batch_get"),
                    value_for(key, 1 << 20),
                    "{tag}->{reader:?} {key}"
                );
            }
            // Buffers the caller makes at each value's size: a buffer the
            // allocator refuses fails that key alone, as does a missing key.
            // (A new client: one that cached the locations would take a
            // failed read through them for stale and ask again.)
            let fresh = client(&cluster, reader).await;
            let ask = [refs[0], refs[1], "absent", refs[2]];
            let alloc = |lens: &[usize]| -> Vec<KvResult<Vec<u8>>> {
                let made = lens.iter().enumerate();
                made.map(|(i, &n)| match i == 1 {
                    true => Err(KvError::new(Code::InvalidParams, "refused")),
                    false => Ok(vec![0xa5; n]),
                })
                .collect()
            };
            let got = fresh.batch_get_with(&ask, alloc).await;
            let codes: Vec<_> = got
                .iter()
                .map(|g| g.as_ref().err().map(|e| e.code))
                .collect();
            let want = [
                None,
                Some(Code::InvalidParams),
                Some(Code::ObjectNotFound),
                None,
            ];
            assert_eq!(codes, want, "{tag}->{reader:?}");
            for i in [0, 3] {
                let v = got[i].as_ref().expect("read");
                assert_eq!(
                    *v,
                    value_for(ask[i], 1 << 20),
                    "{tag}->{reader:?} {}",
                    ask[i]
                );
            }
            // Values scattered over three caller buffers, with room to spare.
            let mut bufs: Vec<Vec<u8>> =
                (0..keys.len() * 3).map(|_| vec![0u8; 400 << 10]).collect();
            let mut chunks = bufs.chunks_mut(3);
            let mut items: Vec<GetInto> = keys
                .iter()
                .map(|k| GetInto {
                    key: k,
                    dst: chunks
                        .next()
                        .expect("3 buffers")
                        .iter_mut()
                        .map(|b| &mut b[..])
                        .collect(),
                })
                .collect();
            let got = r.batch_get_into(&mut items).await;
            drop(items);
            for (i, (key, n)) in keys.iter().zip(got).enumerate() {
                let n = n.expect("batch_get_into");
                let v = value_for(key, 1 << 20);
                assert_eq!(n, v.len());
                let joined: Vec<u8> = bufs[i * 3..i * 3 + 3].concat();
                assert_eq!(&joined[..n], &v[..], "{tag}->{reader:?} {key}");
            }
            let mut small = vec![0u8; 1];
            let big = keys
                .iter()
                .find(|k| value_for(k, 1 << 20).len() > 1)
                .expect("a value > 1 byte");
            assert_eq!(
                r.get_into(big, &mut small)
                    .await
                    .expect_err("too small")
                    .code,
                Code::InvalidParams
            );
            assert_eq!(
                r.get("never-written").await.expect_err("missing").code,
                Code::ObjectNotFound
            );
        }
    }
}

/// Readers racing eviction (the pool is filled to 3x its size) and upserts
/// get the exact bytes of some committed version, or not-found; never other
/// bytes, on either transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_under_concurrent_eviction_and_overwrite_are_never_wrong() {
    // Short leases and paced readers: readers this fast would otherwise keep
    // every object leased, and a pool where nothing is evictable rightly
    // refuses puts (-200).
    let cluster = Cluster::builder()
        .segment_size("16MiB")
        .master_flag("--default-kv-lease-ttl", "50ms")
        .start()
        .await;
    for protocol in PROTOCOLS {
        let writer = client(&cluster, protocol).await;
        let committed: Arc<Mutex<Vec<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (hits, misses) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut readers = Vec::new();
        for _ in 0..2 {
            let r = client(&cluster, protocol).await;
            let (committed, stop, hits, misses) = (
                committed.clone(),
                stop.clone(),
                hits.clone(),
                misses.clone(),
            );
            readers.push(tokio::spawn(async move {
                let mut n = 1usize;
                while !stop.load(Ordering::Relaxed) {
                    let keys: Vec<String> = {
                        let c = committed.lock();
                        (0..if c.is_empty() { 0 } else { 8 })
                            .map(|_| {
                                n = n
                                    .wrapping_mul(6364136223846793005)
                                    .wrapping_add(1442695040888963407);
                                c[(n >> 33) % c.len()].clone()
                            })
                            .collect()
                    };
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    if keys.is_empty() {
                        continue;
                    }
                    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                    for (key, got) in keys.iter().zip(r.batch_get(&refs).await) {
                        match got {
                            Ok(v) => {
                                // The value is one of the versions ever written.
                                let ok = v == value_for(key, 256 << 10)
                                    || v == value_for(&format!("{key}/v2"), 256 << 10);
                                assert!(ok, "{protocol:?}: wrong bytes for {key}");
                                hits.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) if e.code == Code::ObjectNotFound => {
                                misses.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("{protocol:?}: unexpected error for {key}: {e}"),
                        }
                    }
                }
            }));
        }
        let rc = ReplicateConfig::default();
        // ~3x the segment in values of up to 256 KiB, with upserts mixed in.
        let (mut written, mut refused) = (0usize, 0usize);
        let mut i = 0;
        while written < 48 << 20 {
            let key = format!("{protocol:?}-evict-{i}");
            let v = value_for(&key, 256 << 10);
            match writer.put(&key, &v, &rc).await {
                Ok(()) => {
                    written += v.len();
                    committed.lock().push(key.clone());
                }
                // Everything evictable was leased at that instant: honest, and rare.
                Err(e) if e.code == Code::NoAvailableHandle => refused += 1,
                Err(e) => panic!("{protocol:?}: put {key}: {e}"),
            }
            if i % 7 == 3 {
                let old = format!("{protocol:?}-evict-{}", i / 2);
                match writer
                    .upsert(&old, &value_for(&format!("{old}/v2"), 256 << 10), &rc)
                    .await
                {
                    Ok(()) => {}
                    Err(e) if e.code == Code::NoAvailableHandle => refused += 1,
                    Err(e) => panic!("{protocol:?}: upsert {old}: {e}"),
                }
            }
            i += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.await
                .expect("a reader saw wrong bytes or an unexpected error");
        }
        let (h, m) = (hits.load(Ordering::Relaxed), misses.load(Ordering::Relaxed));
        assert!(
            refused * 20 < i,
            "{protocol:?}: {refused} of {i} puts refused"
        );
        assert!(
            h > 50,
            "{protocol:?}: too few reads to mean anything ({h} hits, {m} misses)"
        );
        let st = writer.status().await.expect("status");
        assert!(st.evictions > 0, "{protocol:?}: the pool never evicted");
        eprintln!(
            "{protocol:?}: {h} hits, {m} misses under eviction, {} evictions",
            st.evictions
        );
    }
}

/// Repeat reads go straight to a replica from the location cache, and a
/// cached location never outlives another client's update: once an upsert,
/// a remove, or a put after eviction returns, the reader sees the new state
/// on its next read, on either transport and through every get form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_locations_never_outlive_updates() {
    let cluster = Cluster::builder()
        .segment_size("16MiB")
        .master_flag("--default-kv-lease-ttl", "2s")
        .start()
        .await;
    let rc = ReplicateConfig::default();
    for protocol in PROTOCOLS {
        let (w, r) = (
            client(&cluster, protocol).await,
            client(&cluster, protocol).await,
        );
        let keys: Vec<String> = (0..40)
            .map(|i| format!("{protocol:?}-cached-{i}"))
            .collect();
        let v2 = |k: &str| value_for(&format!("{k}/v2"), 8 << 10);
        for k in &keys {
            w.put(k, &value_for(k, 8 << 10), &rc).await.expect("put");
            for _ in 0..2 {
                assert_eq!(r.get(k).await.expect("get"), value_for(k, 8 << 10));
            }
        }
        assert!(
            r.cache_stats().hits >= keys.len() as u64,
            "{protocol:?}: repeat reads did not use the cache: {:?}",
            r.cache_stats()
        );

        for (i, k) in keys.iter().enumerate() {
            w.upsert(k, &v2(k), &rc).await.expect("upsert");
            let got = match i % 3 {
                0 => r.get(k).await.expect("get"),
                1 => {
                    let mut buf = vec![0u8; 16 << 10];
                    let n = r.get_into(k, &mut buf).await.expect("get_into");
                    buf.truncate(n);
                    buf
                }
                _ => r.batch_get(&[k]).await.remove(0).expect("batch_get"),
            };
            assert!(
                got == v2(k),
                "{protocol:?}: read of {k} after its upsert is stale"
            );
        }
        for k in &keys[..20] {
            w.remove(k, true).await.expect("remove");
            assert_eq!(
                r.get(k).await.expect_err("removed").code,
                Code::ObjectNotFound,
                "{protocol:?}: {k} readable after its remove"
            );
        }
        let stats = r.cache_stats();
        assert!(
            stats.stale >= 20,
            "{protocol:?}: stale path not taken: {stats:?}"
        );

        // A writer's own puts are hints: read while the master confirms
        // them. Another client's upsert in between is seen, never missed.
        for i in 0..10 {
            let k = format!("{protocol:?}-own-{i}");
            w.put(&k, &value_for(&k, 8 << 10), &rc).await.expect("put");
            if i % 2 == 1 {
                r.upsert(&k, &v2(&k), &rc).await.expect("upsert");
            }
            let want = if i % 2 == 1 {
                v2(&k)
            } else {
                value_for(&k, 8 << 10)
            };
            assert!(
                w.get(&k).await.expect("get") == want,
                "{protocol:?}: {k} read wrong"
            );
        }
        // ... and the read took a lease, as Mooncake's get does.
        let k = format!("{protocol:?}-own-0");
        assert_eq!(
            w.remove(&k, false).await.expect_err("leased").code,
            Code::ObjectHasLease
        );

        // Evict the rest (their leases have ended), then put new values
        // under the same keys: the reader must see those, never the old.
        tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
        for i in 0..160 {
            let k = format!("{protocol:?}-filler-{i}");
            w.put(&k, &value_for(&k, 512 << 10), &rc)
                .await
                .expect("filler");
        }
        let mut replaced = 0;
        for k in &keys[20..] {
            let v3 = value_for(&format!("{k}/v3"), 8 << 10);
            let evicted = !w.exist(k).await.expect("exist");
            w.put(k, &v3, &rc).await.expect("put after eviction");
            let want = if evicted { v3 } else { v2(k) };
            assert!(
                r.get(k).await.expect("get") == want,
                "{protocol:?}: {k} (evicted: {evicted}) read back the wrong version"
            );
            replaced += usize::from(evicted);
        }
        assert!(
            replaced > 10,
            "{protocol:?}: only {replaced} keys were evicted"
        );
    }
}

/// A segment that cannot be mapped (a client's in-process memory) is an
/// error with protocol shm (at once: no retries) and served over TCP with
/// auto; segment files are owner-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmappable_segments_fall_back_or_fail_clearly() {
    let cluster = Cluster::builder().start().await;
    let lender = cluster
        .client_with(|c| {
            c.hostname = "lender".into();
            c.segment_size = 8 << 20;
        })
        .await;
    let rc = ReplicateConfig {
        preferred_segments: vec!["lender".into()],
        ..Default::default()
    };
    lender
        .put("lent", b"in a client's memory", &rc)
        .await
        .expect("put");
    let loc = lender.status().await.expect("status");
    assert!(loc
        .segments
        .iter()
        .any(|s| s.info.name == "lender" && s.info.path.is_none() && s.regions == 1));

    // Final at once (no transport this client allows will reach it on a
    // retry), for reads and for writes placed there.
    let forced = client(&cluster, Protocol::Shm).await;
    assert_eq!(
        forced.get("lent").await.expect_err("not mappable").code,
        Code::TransferFail
    );
    assert_eq!(
        (forced.put("forced", b"x", &rc).await)
            .expect_err("placed where shm cannot reach")
            .code,
        Code::TransferFail
    );
    let auto = client(&cluster, Protocol::Auto).await;
    assert_eq!(
        auto.get("lent").await.expect("over tcp"),
        b"in a client's memory"
    );

    let path = loc
        .segments
        .iter()
        .find_map(|s| s.info.path.clone())
        .expect("the store's segment file");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path)
        .expect("segment file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{path} must be owner-only");
    assert_eq!(
        "rdma".parse::<Protocol>().expect_err("rdma").code,
        Code::NotSupported
    );
}
