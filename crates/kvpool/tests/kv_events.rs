//! The master's KV event stream, subscribed to as a router does: a ZMQ SUB
//! socket on a real master started with `--kv-events-endpoint`, engine
//! keys put, removed and evicted through a real store, and the snapshot a
//! subscriber resyncs from read over the admin port.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{free_port, http_get, Cluster};
use kvpool_client::{Client, ReplicateConfig};
use serde_json::Value;
use zeromq::{Socket, SocketRecv, SubSocket};

const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// A published batch: its sequence number and its events.
struct Batch {
    seq: u64,
    events: Vec<Value>,
}

/// The messages of a SUB socket, read by a task of their own: a timeout
/// on this channel never cancels a receive half-way.
type Sub = tokio::sync::mpsc::UnboundedReceiver<zeromq::ZmqMessage>;

/// The next message's frames.
async fn next_frames(sub: &mut Sub) -> Vec<Vec<u8>> {
    let msg = tokio::time::timeout(Duration::from_secs(10), sub.recv())
        .await
        .expect("a batch within 10 s")
        .expect("the subscriber is running");
    msg.into_vec().into_iter().map(|b| b.to_vec()).collect()
}

async fn next_batch(sub: &mut Sub) -> Batch {
    let frames = next_frames(sub).await;
    assert_eq!(frames.len(), 3, "topic, sequence, payload");
    assert!(frames[0].is_empty(), "empty topic");
    let seq = u64::from_be_bytes(frames[1].as_slice().try_into().expect("8-byte sequence"));
    // [timestamp_ms, [event map, ...], dp_rank]
    let (ms, events, dp_rank): (u64, Vec<Value>, u32) =
        rmp_serde::from_slice(&frames[2]).expect("msgpack payload");
    assert!(ms > 1_700_000_000_000, "a Unix millisecond timestamp: {ms}");
    assert_eq!(dp_rank, 0);
    Batch { seq, events }
}

/// A subscription's events, in order: each batch's sequence and every
/// event id checked to follow the previous one.
struct Stream {
    sub: Sub,
    /// The last batch sequence and event id received.
    last: (u64, u64),
    /// Every event received so far.
    seen: Vec<Value>,
    /// How many of `seen` [`Stream::until`] has looked at: a batch may
    /// carry events past the one a call waited for.
    looked: usize,
}

impl Stream {
    async fn subscribe(endpoint: &str, client: &Client) -> Stream {
        Stream {
            sub: subscribe(endpoint, client).await,
            last: (0, 0),
            seen: Vec::new(),
            looked: 0,
        }
    }

    /// The next event that is `wanted`, receiving batches as needed.
    async fn until(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
        loop {
            while let Some(e) = self.seen.get(self.looked) {
                self.looked += 1;
                if wanted(e) {
                    return e.clone();
                }
            }
            let b = next_batch(&mut self.sub).await;
            if self.last.0 != 0 {
                assert_eq!(b.seq, self.last.0 + 1, "batch sequence without gaps");
            }
            self.last.0 = b.seq;
            for e in b.events {
                let id = e["event_id"].as_u64().expect("event_id");
                if self.last.1 != 0 {
                    assert_eq!(id, self.last.1 + 1, "event ids without gaps");
                }
                self.last.1 = id;
                self.seen.push(e);
            }
        }
    }
}

/// An event of `kind` (`stored`, `removed`) for `key`.
fn of<'a>(key: &'a str, kind: &'static str) -> impl Fn(&Value) -> bool + 'a {
    move |e| e["object_key"] == key && e["event_type"] == kind
}

async fn subscribe(endpoint: &str, client: &Client) -> Sub {
    let mut socket = SubSocket::new();
    socket.connect(endpoint).await.expect("connect");
    socket.subscribe("").await.expect("subscribe");
    let (tx, mut sub) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(m) = socket.recv().await {
            if tx.send(m).is_err() {
                break;
            }
        }
    });
    // A subscription reaches the publisher a little after connect (ZMQ's
    // slow joiner): put probes until one is seen.
    for i in 0.. {
        let key = format!("probe/{i}");
        client
            .put(&key, b"p", &ReplicateConfig::default())
            .await
            .expect("probe put");
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), sub.recv()).await {
            break;
        }
        assert!(i < 50, "no event within 15 s of subscribing");
    }
    sub
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_removals_and_evictions_reach_a_subscriber() {
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    let cluster = Cluster::builder()
        .segment_size("16MiB")
        .master_flag("--kv-events-endpoint", &endpoint)
        .master_flag("--kv-events-backend-id", "pool-a")
        .start()
        .await;
    let client = cluster.client().await;
    let mut stream = Stream::subscribe(&endpoint, &client).await;

    let sglang = format!("meta-llama-Llama-3.1-8B-Instruct_{SHA}_1_k");
    let vllm =
        format!("meta-llama/Llama-3.1-8B-Instruct@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{SHA}");
    let lmcache = format!("lmcache/meta-llama/Llama-3.1-8B-Instruct@00000002@0@{SHA}");
    for key in [&sglang, &vllm, &lmcache] {
        client
            .put(key, &[7u8; 4096], &ReplicateConfig::default())
            .await
            .expect("put");
    }
    let e = stream.until(of(&sglang, "stored")).await;
    assert_eq!(e["type"], "BlockStored");
    assert_eq!(e["engine"], "sglang");
    assert_eq!(e["model_name"], "meta-llama-Llama-3.1-8B-Instruct");
    assert_eq!(e["rank"], 1);
    assert_eq!(e["block_hash"], SHA);
    assert_eq!(
        e["seq_hashes"],
        serde_json::json!([0x9f86_d081_884c_7d65u64])
    );
    assert_eq!(e["block_hashes"], e["seq_hashes"]);
    assert_eq!(e["medium"], "cpu");
    assert_eq!(e["backend_id"], "pool-a");
    assert_eq!(e["tenant_id"], "default");
    assert_eq!(e["base_block_idx"], 0);
    let e = stream.until(of(&vllm, "stored")).await;
    assert_eq!(
        (e["engine"].as_str(), e["rank"].as_u64()),
        (Some("vllm"), Some(0))
    );
    assert_eq!(e["model_name"], "meta-llama/Llama-3.1-8B-Instruct");
    let e = stream.until(of(&lmcache, "stored")).await;
    assert_eq!(
        (e["engine"].as_str(), e["rank"].as_u64()),
        (Some("lmcache"), Some(2))
    );

    client.remove(&vllm, false).await.expect("remove");
    let e = stream.until(of(&vllm, "removed")).await;
    assert_eq!(e["type"], "BlockRemoved");
    assert!(e["base_block_idx"].is_null());

    // The snapshot a subscriber resyncs from: every key held, paged.
    let (code, body) = http_get(&cluster.metrics_addr, "/kv_events/snapshot?limit=1").await;
    assert_eq!(code, 200, "{body}");
    let page: Value = serde_json::from_str(&body).expect("json");
    assert!(
        page["last_event_id"].as_u64() >= Some(stream.last.1),
        "{page}"
    );
    let mut listed = BTreeSet::new();
    let mut page = page;
    loop {
        for k in page["keys"].as_array().expect("keys") {
            listed.insert(k["object_key"].as_str().expect("key").to_string());
        }
        let Some(next) = page["next"].as_str() else {
            break;
        };
        let (code, body) = http_get(
            &cluster.metrics_addr,
            &format!("/kv_events/snapshot?limit=1&cursor={next}"),
        )
        .await;
        assert_eq!(code, 200, "{body}");
        page = serde_json::from_str(&body).expect("json");
    }
    assert!(
        listed.contains(&sglang) && listed.contains(&lmcache),
        "{listed:?}"
    );
    assert!(!listed.contains(&vllm), "removed");
    let (code, _) = http_get(&cluster.metrics_addr, "/kv_events/snapshot?cursor=x").await;
    assert_eq!(code, 400);

    // Filling past the capacity evicts: each evicted key's removal follows
    // its commit on the stream.
    let big = vec![1u8; 1 << 20];
    for i in 0..40 {
        client
            .put(&format!("fill/{i:03}"), &big, &ReplicateConfig::default())
            .await
            .expect("fill put (eviction makes room)");
    }
    let e = stream.until(of("fill/039", "stored")).await;
    assert_eq!(e["engine"], Value::Null, "a raw key");
    let stored: BTreeSet<&str> = stream
        .seen
        .iter()
        .filter(|e| e["event_type"] == "stored")
        .filter_map(|e| e["object_key"].as_str())
        .collect();
    let removed: Vec<&str> = stream
        .seen
        .iter()
        .filter(|e| e["event_type"] == "removed")
        .filter_map(|e| e["object_key"].as_str())
        .collect();
    assert!(removed.len() > 2, "evictions were published: {removed:?}");
    // (The probes' commits came while subscribing, before `seen`.)
    for k in removed.iter().filter(|k| !k.starts_with("probe/")) {
        assert!(stored.contains(k), "{k} removed before it was stored");
    }

    let (code, body) = http_get(&cluster.metrics_addr, "/kv_events/status").await;
    assert_eq!(code, 200);
    let st: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(st["status"]["enabled"], true);
    assert_eq!(st["status"]["dropped_events"], 0);
    assert!(
        st["status"]["published_events"].as_u64() >= Some(stream.last.1),
        "{st}"
    );
    assert!(!st["recent"].as_array().expect("recent").is_empty());
    let (_, metrics) = http_get(&cluster.metrics_addr, "/metrics").await;
    let published = metrics
        .lines()
        .find_map(|l| l.strip_prefix("kvpool_kv_events_published "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("kvpool_kv_events_published");
    assert!(
        published >= stream.last.1,
        "{published} < {}",
        stream.last.1
    );
    assert!(metrics.contains("kvpool_kv_events_dropped 0"), "{metrics}");
}

/// A store with a disk tier: objects the memory tier must make room for
/// move to disk, and each move is a `removed` on `cpu` then a `stored` on
/// `disk` for the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_to_the_disk_tier_is_published_with_its_medium() {
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    let dir = common::scratch_dir();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let disk = common::disk_dir();
    let master = common::spawn_master("master", &logs, |rpc, metrics| {
        [
            "master",
            "--rpc-port",
            &rpc.to_string(),
            "--metrics-port",
            &metrics.to_string(),
            "--demote-watermark",
            "0.5",
            "--kv-events-endpoint",
            &endpoint,
        ]
        .map(String::from)
        .to_vec()
    })
    .await;
    let extra = [
        "--disk-dir".to_string(),
        disk.path().to_string_lossy().into_owned(),
        "--disk-size".to_string(),
        "64MiB".to_string(),
    ];
    let mut store = common::spawn_store_with(
        std::path::Path::new(common::BIN),
        "store",
        "tiered",
        &master.rpc,
        "16MiB",
        &dir.path().join("mem"),
        &logs,
        &extra,
    );
    common::wait_for_segments(&master.rpc, 2, &mut [&mut store]).await;
    let client = Client::connect(kvpool_client::ClientConfig::new(&master.rpc))
        .await
        .expect("client");
    let mut stream = Stream::subscribe(&endpoint, &client).await;
    // 12 MiB into 16 MiB of memory demoted down to half of it.
    for i in 0..12 {
        client
            .put(
                &format!("tier/{i:02}"),
                &vec![3u8; 1 << 20],
                &ReplicateConfig::default(),
            )
            .await
            .expect("put");
    }
    // The oldest objects move first: the subscription's probes, then ours.
    let moved = stream
        .until(|e| e["medium"] == "disk" && e["event_type"] == "stored")
        .await;
    let key = moved["object_key"].as_str().expect("key").to_string();
    let off_memory = stream
        .seen
        .iter()
        .position(|e| e["object_key"] == key.as_str() && e["event_type"] == "removed")
        .expect("the move's removal from memory comes first");
    assert_eq!(stream.seen[off_memory]["medium"], "cpu");
    assert_eq!(moved["event_type"], "stored");
    let want = if key.starts_with("probe/") {
        b"p".to_vec()
    } else {
        vec![3u8; 1 << 20]
    };
    assert_eq!(client.get(&key).await.expect("read from disk"), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_cannot_be_bound_stops_the_master() {
    let out = common::run_kvpool(
        &[
            "master",
            "--rpc-port",
            "0",
            "--metrics-port",
            "0",
            "--kv-events-endpoint",
            "tcp://203.0.113.1:5557",
        ],
        Duration::from_secs(20),
    )
    .await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot bind the KV event stream on tcp://203.0.113.1:5557"),
        "{err}"
    );
}

/// A subscriber that missed batches asks the replay socket for them, as
/// vLLM's publisher serves it: a DEALER sends `[b"", start sequence]` and
/// gets every kept batch from there, byte for byte what was published,
/// then the end marker. A malformed request is ignored and the socket
/// keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_batches_are_replayed_from_the_sequence_asked() {
    use zeromq::{DealerSocket, SocketSend, ZmqMessage};
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    let replay = format!("tcp://127.0.0.1:{}", free_port());
    let cluster = Cluster::builder()
        .master_flag("--kv-events-endpoint", &endpoint)
        .master_flag("--kv-events-replay-endpoint", &replay)
        .start()
        .await;
    let client = cluster.client().await;
    let mut sub = subscribe(&endpoint, &client).await;
    // Published batches as they came: (sequence, payload).
    let mut published: Vec<(u64, Vec<u8>)> = Vec::new();
    for i in 0..5 {
        let key = format!("replayed/{i}");
        client
            .put(&key, b"v", &ReplicateConfig::default())
            .await
            .expect("put");
        loop {
            let frames = next_frames(&mut sub).await;
            let seq = u64::from_be_bytes(frames[1].as_slice().try_into().expect("8 bytes"));
            let mine = String::from_utf8_lossy(&frames[2]).contains(&key);
            published.push((seq, frames[2].clone()));
            if mine {
                break;
            }
        }
    }
    let from = published[1].0;

    let mut dealer = DealerSocket::new();
    dealer
        .connect(&replay)
        .await
        .expect("connect the replay socket");
    let request = |frames: Vec<Vec<u8>>| {
        let mut m = ZmqMessage::from(frames[0].clone());
        for f in &frames[1..] {
            m.push_back(f.clone().into());
        }
        m
    };
    dealer
        .send(request(vec![b"not a request".to_vec()]))
        .await
        .expect("send");
    dealer
        .send(request(vec![Vec::new(), from.to_be_bytes().to_vec()]))
        .await
        .expect("send");
    let mut replayed = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
            .await
            .expect("an answer within 10 s")
            .expect("replay answer");
        let frames: Vec<Vec<u8>> = msg.into_vec().into_iter().map(|b| b.to_vec()).collect();
        assert_eq!(frames.len(), 4, "delimiter, topic, sequence, payload");
        assert!(frames[0].is_empty() && frames[1].is_empty());
        if frames[2] == (-1i64).to_be_bytes() {
            assert!(frames[3].is_empty(), "the end marker has no payload");
            break;
        }
        let seq = u64::from_be_bytes(frames[2].as_slice().try_into().expect("8 bytes"));
        replayed.push((seq, frames[3].clone()));
    }
    let want: Vec<_> = published
        .iter()
        .filter(|(s, _)| *s >= from)
        .cloned()
        .collect();
    assert!(
        want.len() >= 4,
        "{} batches published from {from}",
        want.len()
    );
    assert_eq!(
        replayed[..want.len()],
        want[..],
        "every batch from the one asked, byte for byte"
    );
    assert!(
        replayed.windows(2).all(|w| w[1].0 == w[0].0 + 1),
        "consecutive sequences"
    );
}
