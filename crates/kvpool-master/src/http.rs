//! The master's HTTP side: `/metrics`, `/health`, JSON admin endpoints, a
//! one-page human status, and the optional transfer-metadata service that
//! Mooncake clients expect (`GET/PUT/DELETE /metadata?key=K`).
//!
//! Both listeners are served within [`HttpLimits::conn`] (connections at
//! once, per peer address, header and request timeouts; see
//! [`kvpool_net::http`]). The metadata service stores values of at most
//! [`HttpLimits::metadata_max_value`] bytes (413 beyond), keys of at most
//! 4,096 bytes (414), and at most [`HttpLimits::metadata_max_keys`] keys
//! and [`HttpLimits::metadata_max_bytes`] bytes in all (507 beyond).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use kvpool_net::http::{HttpConnLimits, HttpRefusal};
use kvpool_net::tls::TlsAcceptor;
use kvpool_proto::MAX_METADATA_KEY_LEN;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::refusals::Refusal;
use crate::{status_page, Master};

/// Limits of the master's HTTP listeners and of the metadata service.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Connections each listener serves, and how long it waits.
    pub conn: HttpConnLimits,
    /// Largest value the metadata service stores (413 beyond).
    pub metadata_max_value: usize,
    /// Most keys the metadata service holds (507 for a new key beyond).
    pub metadata_max_keys: usize,
    /// Most bytes of keys and values the metadata service holds (507 beyond).
    pub metadata_max_bytes: u64,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            conn: HttpConnLimits::default(),
            metadata_max_value: 1 << 20,
            metadata_max_keys: 100_000,
            metadata_max_bytes: 256 << 20,
        }
    }
}

/// Routes of the admin/metrics port.
pub fn admin_router(master: Arc<Master>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "OK\n" }))
        .route("/api/status", get(status))
        .route("/api/segments", get(segments))
        .route("/api/keys/{key}", get(key))
        .route("/api/history", get(status_page::history))
        .route("/api/clients", get(status_page::clients))
        .route("/api/events", get(status_page::events))
        .route("/kv_events/status", get(kv_events_status))
        .route("/kv_events/snapshot", get(kv_events_snapshot))
        .route("/", get(status_page::page))
        .with_state(master)
}

/// The cluster status, counted off the runtime: it walks every key.
async fn cluster_status(m: &Arc<Master>) -> kvpool_proto::msg::ClusterStatus {
    let m = m.clone();
    tokio::task::spawn_blocking(move || {
        let mut st = m.state.status();
        st.role = m.role(Instant::now()).name().into();
        st
    })
    .await
    .expect("status does not panic")
}

async fn metrics(State(m): State<Arc<Master>>) -> Response {
    let status = cluster_status(&m).await;
    m.state.refusals().sync_connections();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.metrics
            .render(&status, &m.state.tenants(), &m.state.kv_events().status()),
    )
        .into_response()
}

async fn status(State(m): State<Arc<Master>>) -> Response {
    Json(cluster_status(&m).await).into_response()
}

async fn segments(State(m): State<Arc<Master>>) -> Response {
    Json(cluster_status(&m).await.segments).into_response()
}

async fn key(State(m): State<Arc<Master>>, Path(key): Path<String>) -> Response {
    match m.state.key_info(&key, Instant::now()) {
        Some(info) => Json(info).into_response(),
        None => (StatusCode::NOT_FOUND, format!("{key:?} not found\n")).into_response(),
    }
}

/// The KV event stream's counters and its most recent events.
async fn kv_events_status(State(m): State<Arc<Master>>) -> Response {
    let ev = m.state.kv_events();
    Json(serde_json::json!({"status": ev.status(), "recent": ev.recent()})).into_response()
}

/// `cursor` and `limit` of a snapshot page.
#[derive(serde::Deserialize)]
struct SnapshotQuery {
    /// Where the previous page ended (`shard.slot`), absent for the first.
    cursor: Option<String>,
    /// Keys per page (default and most: 10,000).
    limit: Option<usize>,
}

/// One page of what the pool holds, for a subscriber that saw a gap: the
/// keys with what their names say (as events carry it) and the last
/// event id given out when the page was read. A subscriber applies the
/// stream's events after the first page's `last_event_id` on top of the
/// pages; a key put or removed while it pages may be listed or missed,
/// and its event (later than that id) sets it right.
async fn kv_events_snapshot(
    State(m): State<Arc<Master>>,
    Query(q): Query<SnapshotQuery>,
) -> Response {
    let from = match q.cursor.as_deref().map(|c| c.split_once('.')) {
        None => (0, 0),
        Some(Some((a, b))) => match (a.parse(), b.parse()) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return (StatusCode::BAD_REQUEST, "cursor: shard.slot\n").into_response(),
        },
        Some(None) => return (StatusCode::BAD_REQUEST, "cursor: shard.slot\n").into_response(),
    };
    let limit = q.limit.unwrap_or(10_000).clamp(1, 10_000);
    let last_event_id = m.state.kv_events().last_event_id();
    let (keys, next) = m.state.list_keys(|_| true, from, limit, 4 << 20);
    let keys: Vec<serde_json::Value> = keys
        .into_iter()
        .map(|(k, len)| {
            let p = crate::kv_events::parse_key(&k);
            serde_json::json!({
                "object_key": k, "value_len": len, "engine": p.engine,
                "model_name": p.model, "rank": p.rank, "block_hash": p.block_hash,
                "seq_hashes": p.seq_hash.into_iter().collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(serde_json::json!({
        "last_event_id": last_event_id,
        "keys": keys,
        "next": next.map(|(a, b)| format!("{a}.{b}")),
    }))
    .into_response()
}

/// The metadata service's keys and values, and what they hold in all.
#[derive(Default)]
struct Entries {
    map: HashMap<String, Bytes>,
    /// Bytes of keys and values.
    bytes: u64,
}

/// State of the metadata service.
#[derive(Clone)]
struct MetadataStore {
    entries: Arc<Mutex<Entries>>,
    limits: Arc<HttpLimits>,
    master: Arc<Master>,
}

impl MetadataStore {
    /// Counts a refusal and answers it.
    fn refuse(&self, reason: Refusal, status: StatusCode, why: String) -> Response {
        self.master.state.refusals().record(reason, 1, &why);
        (status, why + "\n").into_response()
    }
}

/// Routes of the transfer-metadata service (Mooncake's HTTP metadata
/// server), within `limits`; refusals count in `master`'s metrics.
pub fn metadata_router(limits: &HttpLimits, master: Arc<Master>) -> Router {
    let store = MetadataStore {
        entries: Arc::default(),
        limits: Arc::new(limits.clone()),
        master,
    };
    Router::new()
        .route(
            "/metadata",
            get(meta_get)
                .put(meta_put)
                .post(meta_put)
                .delete(meta_delete),
        )
        .route("/health", get(|| async { "OK\n" }))
        // The body is refused once it passes the limit, before it is all read.
        .layer(DefaultBodyLimit::max(limits.metadata_max_value))
        .with_state(store)
}

#[derive(serde::Deserialize)]
struct KeyQuery {
    key: String,
}

async fn meta_get(State(s): State<MetadataStore>, Query(q): Query<KeyQuery>) -> Response {
    match s.entries.lock().map.get(&q.key) {
        Some(v) => (StatusCode::OK, v.clone()).into_response(),
        None => (StatusCode::NOT_FOUND, "metadata not found").into_response(),
    }
}

async fn meta_put(
    State(s): State<MetadataStore>,
    Query(q): Query<KeyQuery>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let max_value = s.limits.metadata_max_value;
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            let why = format!("metadata value over {max_value} bytes, the limit");
            return s.refuse(
                Refusal::MetadataValueSize,
                StatusCode::PAYLOAD_TOO_LARGE,
                why,
            );
        }
        Err(e) => return e.into_response(),
    };
    if q.key.len() > MAX_METADATA_KEY_LEN {
        let why = format!(
            "metadata key of {} bytes (at most {MAX_METADATA_KEY_LEN})",
            q.key.len()
        );
        return s.refuse(Refusal::KeyLength, StatusCode::URI_TOO_LONG, why);
    }
    let (max_keys, max_bytes) = (s.limits.metadata_max_keys, s.limits.metadata_max_bytes);
    let mut e = s.entries.lock();
    let old = e
        .map
        .get(&q.key)
        .map_or(0, |v| (q.key.len() + v.len()) as u64);
    let new = (q.key.len() + body.len()) as u64;
    if old == 0 && !e.map.contains_key(&q.key) && e.map.len() >= max_keys {
        drop(e);
        let why = format!("metadata service holds {max_keys} keys, the limit");
        return s.refuse(Refusal::MetadataKeys, StatusCode::INSUFFICIENT_STORAGE, why);
    }
    if e.bytes - old + new > max_bytes {
        drop(e);
        let why = format!("metadata service holds {max_bytes} bytes, the limit");
        return s.refuse(Refusal::MetadataKeys, StatusCode::INSUFFICIENT_STORAGE, why);
    }
    e.bytes = e.bytes - old + new;
    e.map.insert(q.key, body);
    (StatusCode::OK, "metadata updated").into_response()
}

async fn meta_delete(State(s): State<MetadataStore>, Query(q): Query<KeyQuery>) -> Response {
    let mut e = s.entries.lock();
    match e.map.remove(&q.key) {
        Some(v) => {
            e.bytes -= (q.key.len() + v.len()) as u64;
            (StatusCode::OK, "metadata deleted").into_response()
        }
        None => (StatusCode::NOT_FOUND, "metadata not found").into_response(),
    }
}

/// Serves `router` on `listener` until `shutdown`, within `limits`, over
/// TLS when `tls` is set (https); connections refused at the cap count in
/// `master`'s metrics. Returns once every connection has finished
/// (in-flight requests complete).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: &HttpLimits,
    tls: Option<TlsAcceptor>,
    master: Arc<Master>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let refused = |why: HttpRefusal, line: &str| {
        let reason = match why {
            HttpRefusal::PerIp => Refusal::HttpConnectionsPerIp,
            HttpRefusal::Total => Refusal::HttpConnections,
        };
        master.state.refusals().record(reason, 1, line);
    };
    kvpool_net::http::serve(listener, router, limits.conn, tls, refused, shutdown).await
}
