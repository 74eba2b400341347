//! The KV event stream: every object the master commits or removes
//! (removals, evictions, lost stores and tier moves included) as an event
//! on a ZMQ PUB socket, in the wire format of Mooncake's master publisher
//! (RFC 1527 of Mooncake, as Dynamo's KV indexer reads it): three frames,
//! an empty topic, an 8-byte big-endian batch sequence number, and a
//! msgpack `[timestamp_ms, [event map, ...], 0]`.
//!
//! Engine key schemes are parsed where they are known ([`parse_key`]:
//! SGLang, vLLM, LMCache), so a router learns (model, rank, block hash)
//! from one stream whatever engine wrote the object.
//!
//! Bounded: the object table hands events to a bounded queue without
//! waiting; when it is full the event is dropped and counted, and the next
//! published event's `event_id` skips the ones lost, so a subscriber sees
//! the gap (as it sees a batch sequence gap when its own socket's
//! high-water mark drops batches) and resyncs from the snapshot
//! (`GET /kv_events/snapshot` on the admin port). The master never waits
//! for a subscriber.
//!
//! Replay: with a replay endpoint the master also binds a ZMQ ROUTER socket
//! and keeps the last [`REPLAY_BATCHES`] batches (at most [`REPLAY_BYTES`]).
//! A subscriber that saw a batch sequence gap asks there from the sequence
//! it missed, as vLLM's publisher serves it: a DEALER sends `[b"", 8-byte
//! big-endian start sequence]` and gets `[b"", topic, sequence, payload]`
//! for each kept batch from there, then `[b"", b"", -1 as 8 bytes, b""]`.
//! A gap older than what is kept still needs the snapshot.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use kvpool_proto::msg::Tier;
use kvpool_proto::tenant;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Events the queue between the object table and the publisher holds.
pub const QUEUE: usize = 65_536;
/// Events per published batch, at most.
pub const BATCH: usize = 64;
/// Events kept for `GET /kv_events/status` (the most recent ones).
const RECENT: usize = 32;
/// Batches kept for replay, at most (vLLM's publisher keeps as many).
pub const REPLAY_BATCHES: usize = 10_000;
/// Bytes of batches kept for replay, at most.
pub const REPLAY_BYTES: usize = 64 << 20;
/// The sequence number that ends a replay: -1 as a signed 8-byte integer.
pub const END_SEQ: [u8; 8] = [0xff; 8];

/// Where and as whom the master publishes.
#[derive(Debug, Clone)]
pub struct KvEventsConfig {
    /// The ZMQ endpoint the PUB socket binds, e.g. `tcp://0.0.0.0:5557`.
    pub endpoint: String,
    /// `backend_id` of every event: which pool published it.
    pub backend_id: String,
    /// The ZMQ endpoint a ROUTER socket binds to serve replays of recent
    /// batches, if any.
    pub replay_endpoint: Option<String>,
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Committed (a put, or a move onto a tier).
    Stored,
    /// Gone (removed, evicted, lost, or moved off a tier).
    Removed,
}

/// An event as the object table hands it over: cheap to make under a
/// shard lock.
#[derive(Debug)]
pub(crate) struct Raw {
    kind: Kind,
    key: Box<str>,
    /// The segment number of the replica it concerns (its tier).
    segment: u32,
}

/// The stream's state, shared by every shard's table and the publisher.
#[derive(Default)]
pub struct KvEvents {
    tx: OnceLock<mpsc::Sender<Raw>>,
    /// Events dropped at the queue since the publisher last looked.
    dropped: AtomicU64,
    dropped_total: AtomicU64,
    /// The last event id given out (0: none yet).
    last_id: AtomicU64,
    batches: AtomicU64,
    published: AtomicU64,
    running: AtomicBool,
    recent: Mutex<std::collections::VecDeque<Event>>,
    /// The batches kept for replay, set only when replays are served:
    /// `(sequence, payload)`, oldest first, and their payloads' bytes.
    replay: OnceLock<Mutex<Kept>>,
}

/// Batches kept for replay and their bytes (see [`KvEvents::keep`]).
type Kept = (std::collections::VecDeque<(u64, bytes::Bytes)>, usize);

/// A bound stream: its PUB socket, its replay socket if any, and the
/// events the table hands over.
pub(crate) type Bound = (
    zeromq::PubSocket,
    Option<zeromq::RouterSocket>,
    mpsc::Receiver<Raw>,
);

/// Counters of the stream, for `GET /kv_events/status` and metrics.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KvEventsStatus {
    /// Whether the master publishes.
    pub enabled: bool,
    /// Batches sent.
    pub published_batches: u64,
    /// Events sent.
    pub published_events: u64,
    /// Events dropped because the queue was full (seen as id gaps).
    pub dropped_events: u64,
    /// The id of the last event sent (0: none yet).
    pub last_event_id: u64,
}

impl KvEvents {
    /// Whether events are wanted: the table only builds them then.
    pub(crate) fn enabled(&self) -> bool {
        self.tx.get().is_some()
    }

    /// Hands an event to the publisher, or drops and counts it when the
    /// queue is full; never waits.
    pub(crate) fn emit(&self, kind: Kind, key: &str, segment: u32) {
        let Some(tx) = self.tx.get() else { return };
        let raw = Raw {
            kind,
            key: key.into(),
            segment,
        };
        if tx.try_send(raw).is_err() {
            self.dropped.fetch_add(1, Relaxed);
            self.dropped_total.fetch_add(1, Relaxed);
        }
    }

    /// The stream's counters.
    pub fn status(&self) -> KvEventsStatus {
        KvEventsStatus {
            enabled: self.running.load(Relaxed),
            published_batches: self.batches.load(Relaxed),
            published_events: self.published.load(Relaxed),
            dropped_events: self.dropped_total.load(Relaxed),
            last_event_id: self.last_id.load(Relaxed),
        }
    }

    /// The most recent events sent, oldest first.
    pub fn recent(&self) -> Vec<Event> {
        self.recent.lock().iter().cloned().collect()
    }

    /// The id of the last event given out, for a snapshot's starting point.
    pub fn last_event_id(&self) -> u64 {
        self.last_id.load(Relaxed)
    }

    /// The id of the next event published: one more than the last, plus
    /// the events dropped at the queue since, so the gap shows there.
    fn next_id(&self) -> u64 {
        let lost = self.dropped.swap(0, Relaxed);
        self.last_id.fetch_add(lost + 1, Relaxed) + lost + 1
    }

    /// Binds `cfg.endpoint` (and the replay endpoint, if any: then batches
    /// are kept for [`KvEvents::serve_replays`]) and starts taking events;
    /// [`KvEvents::run`] publishes them. Fails when an endpoint cannot be
    /// bound, or when the stream was started already.
    pub(crate) async fn bind(&self, cfg: &KvEventsConfig) -> Result<Bound, String> {
        use zeromq::Socket;
        let mut publish = zeromq::PubSocket::new();
        publish
            .bind(&cfg.endpoint)
            .await
            .map_err(|e| format!("cannot bind the KV event stream on {}: {e}", cfg.endpoint))?;
        let replay = match &cfg.replay_endpoint {
            Some(endpoint) => {
                let mut router = zeromq::RouterSocket::new();
                router.bind(endpoint).await.map_err(|e| {
                    format!("cannot bind the KV event replay socket on {endpoint}: {e}")
                })?;
                Some(router)
            }
            None => None,
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        self.tx
            .set(tx)
            .map_err(|_| "the KV event stream is started already".to_string())?;
        self.running.store(true, Relaxed);
        if replay.is_some() {
            let _ = self.replay.set(Mutex::default());
        }
        Ok((publish, replay, rx))
    }

    /// Keeps batch `seq` for replay, when replays are served, dropping the
    /// oldest beyond the bounds.
    fn keep(&self, seq: u64, payload: &bytes::Bytes) {
        let Some(kept) = self.replay.get() else {
            return;
        };
        let (batches, bytes) = &mut *kept.lock();
        let payload = payload.clone();
        *bytes += payload.len();
        batches.push_back((seq, payload));
        while batches.len() > REPLAY_BATCHES || *bytes > REPLAY_BYTES {
            let Some((_, old)) = batches.pop_front() else {
                break;
            };
            *bytes -= old.len();
        }
    }

    /// The kept batches from sequence `from` on.
    fn kept_from(&self, from: u64) -> Vec<(u64, bytes::Bytes)> {
        let Some(kept) = self.replay.get() else {
            return Vec::new();
        };
        let batches = &kept.lock().0;
        let first = batches.partition_point(|(seq, _)| *seq < from);
        batches.range(first..).cloned().collect()
    }

    /// Answers replay requests on `socket` until `shutdown`; a request that
    /// is not `[b"", 8-byte sequence]` is ignored.
    pub(crate) async fn serve_replays(
        &self,
        mut socket: zeromq::RouterSocket,
        shutdown: CancellationToken,
    ) {
        use zeromq::{SocketRecv, SocketSend};
        loop {
            let request = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = socket.recv() => r,
            };
            let frames = match request {
                Ok(m) => m.into_vec(),
                Err(e) => {
                    tracing::debug!("KV event replay request not received: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let from = match frames.as_slice() {
                [_, empty, seq] if empty.is_empty() => {
                    (<[u8; 8]>::try_from(seq.as_ref()).ok()).map(u64::from_be_bytes)
                }
                _ => None,
            };
            let Some(from) = from else {
                tracing::debug!(
                    frames = frames.len(),
                    "KV event replay request malformed; ignored"
                );
                continue;
            };
            let peer = frames[0].clone();
            let reply = |parts: [bytes::Bytes; 3]| {
                let mut msg = zeromq::ZmqMessage::from(peer.clone());
                msg.push_back(bytes::Bytes::new());
                for p in parts {
                    msg.push_back(p);
                }
                msg
            };
            for (seq, payload) in self.kept_from(from) {
                let seq = bytes::Bytes::copy_from_slice(&seq.to_be_bytes());
                if socket
                    .send(reply([bytes::Bytes::new(), seq, payload]))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            let end = bytes::Bytes::from_static(&END_SEQ);
            let _ = socket
                .send(reply([bytes::Bytes::new(), end, bytes::Bytes::new()]))
                .await;
        }
    }

    /// Publishes what the table hands over until `shutdown`, in batches of
    /// at most [`BATCH`]; `tier` names a segment number's tier.
    pub(crate) async fn run(
        &self,
        mut socket: zeromq::PubSocket,
        mut rx: mpsc::Receiver<Raw>,
        backend_id: String,
        tier: impl Fn(u32) -> Tier,
        shutdown: CancellationToken,
    ) {
        use zeromq::SocketSend;
        let mut raws = Vec::with_capacity(BATCH);
        let mut seq: u64 = 0;
        loop {
            raws.clear();
            tokio::select! {
                _ = shutdown.cancelled() => break,
                n = rx.recv_many(&mut raws, BATCH) => if n == 0 { break },
            }
            let ms = kvpool_net::capability::unix_ms();
            let events: Vec<Event> = raws
                .iter()
                .map(|r| Event::new(self.next_id(), ms, r, &backend_id, tier(r.segment)))
                .collect();
            seq += 1;
            let payload = match rmp_serde::to_vec_named(&(ms, &events, 0u32)) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("KV event batch not encoded: {e}");
                    continue;
                }
            };
            let payload = bytes::Bytes::from(payload);
            let mut msg = zeromq::ZmqMessage::from(Vec::<u8>::new());
            msg.push_back(seq.to_be_bytes().to_vec().into());
            self.keep(seq, &payload);
            msg.push_back(payload);
            if let Err(e) = socket.send(msg).await {
                tracing::warn!("KV event batch not sent: {e}");
            }
            self.batches.fetch_add(1, Relaxed);
            self.published.fetch_add(events.len() as u64, Relaxed);
            let mut recent = self.recent.lock();
            for e in events {
                if recent.len() == RECENT {
                    recent.pop_front();
                }
                recent.push_back(e);
            }
        }
        self.running.store(false, Relaxed);
    }
}

/// One event as published: Mooncake's field names (and its legacy
/// aliases `type`, `block_hashes`, `parent_block_hash`), plus what kvpool
/// parses out of engine keys (`engine`, `rank`, `block_hash`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Event {
    /// Increases by one per event; a jump is a gap.
    pub event_id: u64,
    /// When the batch was made (Unix milliseconds).
    pub timestamp: u64,
    /// `stored` or `removed`.
    pub event_type: &'static str,
    /// `BlockStored` or `BlockRemoved` (vLLM's and SGLang's name).
    #[serde(rename = "type")]
    pub legacy_type: &'static str,
    /// The model, where the key names it.
    pub model_name: Option<String>,
    /// Unknown to the pool.
    pub block_size: Option<u32>,
    /// Unknown to the pool.
    pub additional_salt: Option<String>,
    /// Unknown to the pool.
    pub lora_name: Option<String>,
    /// The tenant the key belongs to (`default` outside tenants).
    pub tenant_id: String,
    /// Which pool published it.
    pub backend_id: String,
    /// `cpu` (memory tier) or `disk`.
    pub medium: &'static str,
    /// Unknown to the pool.
    pub dp_rank: Option<u32>,
    /// The object's key as written.
    pub object_key: String,
    /// The block's hash as a u64: the key itself when it is one (decimal
    /// or `0x` hex, as Mooncake parses it), else the first 8 bytes of the
    /// engine's block hash; empty for keys of neither kind.
    pub seq_hashes: Vec<u64>,
    /// `seq_hashes` under vLLM's and SGLang's name.
    pub block_hashes: Vec<u64>,
    /// Depth of the first block: 0 for a stored object, nil for a removal.
    pub base_block_idx: Option<u32>,
    /// Unknown to the pool.
    pub parent_hash: Option<u64>,
    /// Unknown to the pool.
    pub parent_block_hash: Option<u64>,
    /// Unknown to the pool.
    pub token_ids: Option<Vec<u32>>,
    /// `sglang`, `vllm` or `lmcache` when the key has that engine's shape.
    pub engine: Option<&'static str>,
    /// The engine's rank (tensor-parallel rank, or LMCache's kv rank).
    pub rank: Option<u32>,
    /// The engine's block hash, lowercase hex, as the key has it.
    pub block_hash: Option<String>,
}

impl Event {
    fn new(id: u64, ms: u64, r: &Raw, backend_id: &str, tier: Tier) -> Event {
        let parsed = parse_key(&r.key);
        let seq = parsed.seq_hash.into_iter().collect::<Vec<_>>();
        let stored = r.kind == Kind::Stored;
        Event {
            event_id: id,
            timestamp: ms,
            event_type: if stored { "stored" } else { "removed" },
            legacy_type: if stored {
                "BlockStored"
            } else {
                "BlockRemoved"
            },
            model_name: parsed.model,
            block_size: None,
            additional_salt: None,
            lora_name: None,
            tenant_id: tenant::tenant_of(&r.key)
                .filter(|t| !t.is_empty())
                .unwrap_or("default")
                .to_string(),
            backend_id: backend_id.to_string(),
            medium: match tier {
                Tier::Memory => "cpu",
                Tier::Disk => "disk",
            },
            dp_rank: None,
            object_key: r.key.to_string(),
            block_hashes: seq.clone(),
            seq_hashes: seq,
            base_block_idx: stored.then_some(0),
            parent_hash: None,
            parent_block_hash: None,
            token_ids: None,
            engine: parsed.engine,
            rank: parsed.rank,
            block_hash: parsed.block_hash,
        }
    }
}

/// What a key says about the block it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedKey {
    /// The engine whose key shape it has.
    pub engine: Option<&'static str>,
    /// The model it names (SGLang writes `/` as `-`).
    pub model: Option<String>,
    /// The engine's rank.
    pub rank: Option<u32>,
    /// The block hash, lowercase hex.
    pub block_hash: Option<String>,
    /// A u64 for `seq_hashes`.
    pub seq_hash: Option<u64>,
}

fn is_hex(s: &str) -> bool {
    s.len() >= 16
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex_prefix_u64(s: &str) -> Option<u64> {
    u64::from_str_radix(s.get(..16)?, 16).ok()
}

/// Parses the key shapes engines write (a tenant's `@t/` prefix is taken
/// off first):
/// - SGLang HiCache: `{model with / as -}_{page hash}_{tp rank}_{k|v}`
///   (or without the rank, MLA);
/// - vLLM's store connector: `{model}@tp_rank:{r}@...@{block hash}`;
/// - kvpool's LMCache adapter: `{prefix}{model}@{kv rank, 8 hex}@{group}@{chunk hash}[@salt]`;
/// - a bare u64 (decimal or `0x` hex), as Mooncake's publisher parses keys.
pub fn parse_key(key: &str) -> ParsedKey {
    let key = key
        .strip_prefix(tenant::MARK)
        .and_then(|rest| rest.split_once(tenant::MARK))
        .map_or(key, |(_, k)| k);
    let bare = key
        .strip_prefix("0x")
        .or_else(|| key.strip_prefix("0X"))
        .map_or_else(
            || key.parse::<u64>().ok(),
            |h| u64::from_str_radix(h, 16).ok(),
        );
    if bare.is_some() {
        return ParsedKey {
            seq_hash: bare,
            ..ParsedKey::default()
        };
    }
    let at: Vec<&str> = key.split('@').collect();
    if at.len() >= 3 {
        if let Some(rank) = at.iter().find_map(|f| f.strip_prefix("tp_rank:")) {
            if let Some(hash) = at.iter().rev().find(|f| is_hex(f)) {
                return ParsedKey {
                    engine: Some("vllm"),
                    model: Some(at[0].to_string()),
                    rank: rank.parse().ok(),
                    block_hash: Some(hash.to_string()),
                    seq_hash: hex_prefix_u64(hash),
                };
            }
        }
        if (4..=5).contains(&at.len()) && at[1].len() == 8 && is_hex(at[3]) {
            if let Ok(rank) = u32::from_str_radix(at[1], 16) {
                let model = at[0].split_once('/').map_or(at[0], |(_, m)| m);
                return ParsedKey {
                    engine: Some("lmcache"),
                    model: Some(model.to_string()),
                    rank: Some(rank),
                    block_hash: Some(at[3].to_string()),
                    seq_hash: hex_prefix_u64(at[3]),
                };
            }
        }
    }
    let parts: Vec<&str> = key.rsplitn(4, '_').collect();
    // rsplitn gives the end first: [k|v, rank, hash, model] or [k|v, hash, model].
    if matches!(parts.first(), Some(&"k") | Some(&"v")) && parts.len() >= 3 {
        let (rank, hash, model) = match parts.as_slice() {
            [_, r, h, m] if r.parse::<u32>().is_ok() && is_hex(h) => (r.parse().ok(), *h, Some(*m)),
            [_, h, rest @ ..] if is_hex(h) => (None, *h, rest.first().copied()),
            _ => return ParsedKey::default(),
        };
        return ParsedKey {
            engine: Some("sglang"),
            model: model.map(str::to_string),
            rank,
            block_hash: Some(hash.to_string()),
            seq_hash: hex_prefix_u64(hash),
        };
    }
    ParsedKey::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn replay_keeps_the_newest_batches_within_its_bounds() {
        let ev = KvEvents::default();
        ev.keep(1, &bytes::Bytes::from_static(b"x"));
        assert!(ev.kept_from(0).is_empty(), "nothing kept without replays");
        let _ = ev.replay.set(Mutex::default());
        let n = REPLAY_BATCHES as u64 + 5;
        for seq in 1..=n {
            ev.keep(seq, &bytes::Bytes::from(seq.to_be_bytes().to_vec()));
        }
        let kept = ev.kept_from(1);
        assert_eq!(kept.len(), REPLAY_BATCHES, "the count bound");
        assert_eq!((kept[0].0, kept[kept.len() - 1].0), (6, n));
        assert_eq!(ev.kept_from(n).len(), 1);
        assert!(ev.kept_from(n + 1).is_empty());
        // Big batches: the byte bound keeps fewer.
        let big = bytes::Bytes::from(vec![0u8; REPLAY_BYTES / 4]);
        for seq in n + 1..=n + 6 {
            ev.keep(seq, &big);
        }
        let kept = ev.kept_from(0);
        assert!(kept.iter().map(|(_, p)| p.len()).sum::<usize>() <= REPLAY_BYTES);
        assert_eq!(kept.first().map(|k| k.0), Some(n + 3), "the newest four");
    }

    #[test]
    fn engine_keys_are_parsed() {
        let sglang = parse_key(&format!("meta-llama-Llama-3.1-8B-Instruct_{SHA}_1_k"));
        assert_eq!(sglang.engine, Some("sglang"));
        assert_eq!(
            sglang.model.as_deref(),
            Some("meta-llama-Llama-3.1-8B-Instruct")
        );
        assert_eq!(sglang.rank, Some(1));
        assert_eq!(sglang.block_hash.as_deref(), Some(SHA));
        assert_eq!(sglang.seq_hash, Some(0x9f86_d081_884c_7d65));
        let mla = parse_key(&format!("m_{SHA}_k"));
        assert_eq!((mla.engine, mla.rank), (Some("sglang"), None));

        let vllm = parse_key(&format!(
            "meta-llama/Llama-3.1-8B-Instruct@tp_rank:2@pcp0@dcp0@pp_rank:0@group:0@{SHA}"
        ));
        assert_eq!(vllm.engine, Some("vllm"));
        assert_eq!(
            vllm.model.as_deref(),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
        assert_eq!(vllm.rank, Some(2));
        assert_eq!(vllm.block_hash.as_deref(), Some(SHA));

        let lmcache = parse_key(&format!("lmcache/meta-llama/Llama-3.1-8B@0000000a@0@{SHA}"));
        assert_eq!(lmcache.engine, Some("lmcache"));
        assert_eq!(lmcache.model.as_deref(), Some("meta-llama/Llama-3.1-8B"));
        assert_eq!(lmcache.rank, Some(10));

        assert_eq!(parse_key("42").seq_hash, Some(42));
        assert_eq!(parse_key("0x2a").seq_hash, Some(42));
        for raw in ["k000000000001", "a_b_k", "x@y@z", "", "_k", "0xzz"] {
            assert_eq!(parse_key(raw), ParsedKey::default(), "{raw}");
        }
    }

    #[test]
    fn a_full_queue_drops_and_the_next_id_shows_the_gap() {
        let ev = KvEvents::default();
        assert!(!ev.enabled());
        ev.emit(Kind::Stored, "before", 0);
        let (tx, mut rx) = mpsc::channel(1);
        ev.tx.set(tx).expect("set once");
        for k in ["a", "b", "c"] {
            ev.emit(Kind::Stored, k, 0);
        }
        assert_eq!(ev.status().dropped_events, 2);
        assert_eq!(rx.try_recv().expect("queued").key.as_ref(), "a");
        assert_eq!(ev.next_id(), 3, "ids 1 and 2 were dropped");
        assert_eq!(ev.next_id(), 4);
    }

    #[test]
    fn tenant_prefix_is_taken_off() {
        let key = tenant::scoped(Some("acme"), &format!("m_{SHA}_0_v"));
        let p = parse_key(&key);
        assert_eq!((p.engine, p.rank), (Some("sglang"), Some(0)));
    }
}
