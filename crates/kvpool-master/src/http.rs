//! The master's HTTP side: `/metrics`, `/health`, JSON admin endpoints, a
//! one-page human status, and the optional transfer-metadata service that
//! Mooncake clients expect (`GET/PUT/DELETE /metadata?key=K`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Master;

/// Routes of the admin/metrics port.
pub fn admin_router(master: Arc<Master>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "OK\n" }))
        .route("/api/status", get(status))
        .route("/api/segments", get(segments))
        .route("/api/keys/{key}", get(key))
        .route("/", get(page))
        .with_state(master)
}

/// The cluster status, counted off the runtime: it walks every key.
async fn cluster_status(m: &Arc<Master>) -> kvpool_proto::msg::ClusterStatus {
    let m = m.clone();
    tokio::task::spawn_blocking(move || m.state.status())
        .await
        .expect("status does not panic")
}

async fn metrics(State(m): State<Arc<Master>>) -> Response {
    let status = cluster_status(&m).await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.metrics.render(&status),
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

async fn page(State(m): State<Arc<Master>>) -> Html<String> {
    let s = cluster_status(&m).await;
    let mut rows = String::new();
    for seg in &s.segments {
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            html_escape(&seg.info.name),
            html_escape(&seg.info.endpoint),
            seg.info.size,
            seg.used,
            seg.regions,
            seg.state
        ));
    }
    Html(format!(
        "<!doctype html><title>kvpool master</title><h1>kvpool master</h1>\
         <p>segments: {} &middot; capacity: {} B &middot; used: {} B &middot; keys: {} &middot; \
         puts in flight: {} &middot; clients: {} &middot; evictions: {}</p>\
         <table border=1><tr><th>name</th><th>endpoint</th><th>size</th><th>used</th><th>regions</th><th>state</th></tr>{rows}</table>\
         <p><a href=/metrics>metrics</a> &middot; <a href=/api/status>status JSON</a></p>",
        s.segments.len(),
        s.capacity,
        s.used,
        s.keys,
        s.pending,
        s.clients,
        s.evictions
    ))
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

type MetadataStore = Arc<Mutex<HashMap<String, Bytes>>>;

/// Routes of the transfer-metadata service (Mooncake's HTTP metadata server).
pub fn metadata_router() -> Router {
    let store: MetadataStore = Arc::default();
    Router::new()
        .route(
            "/metadata",
            get(meta_get)
                .put(meta_put)
                .post(meta_put)
                .delete(meta_delete),
        )
        .route("/health", get(|| async { "OK\n" }))
        .with_state(store)
}

#[derive(serde::Deserialize)]
struct KeyQuery {
    key: String,
}

async fn meta_get(State(s): State<MetadataStore>, Query(q): Query<KeyQuery>) -> Response {
    match s.lock().get(&q.key) {
        Some(v) => (StatusCode::OK, v.clone()).into_response(),
        None => (StatusCode::NOT_FOUND, "metadata not found").into_response(),
    }
}

async fn meta_put(
    State(s): State<MetadataStore>,
    Query(q): Query<KeyQuery>,
    body: Bytes,
) -> Response {
    s.lock().insert(q.key, body);
    (StatusCode::OK, "metadata updated").into_response()
}

async fn meta_delete(State(s): State<MetadataStore>, Query(q): Query<KeyQuery>) -> Response {
    match s.lock().remove(&q.key) {
        Some(_) => (StatusCode::OK, "metadata deleted").into_response(),
        None => (StatusCode::NOT_FOUND, "metadata not found").into_response(),
    }
}

/// Serves `router` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
