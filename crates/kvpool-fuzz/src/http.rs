//! The master's HTTP services, driven in-process through their axum routers
//! (no sockets): the admin API and Mooncake's transfer-metadata service.
//! The bearer-token layer is crate-private to the master and is not reached.
//!
//! An input is a few lines `METHOD URI [BODY]`; each goes to both routers.
//! The metadata service is checked against a map model: what a GET returns,
//! and exactly when a PUT is refused (413, 414, 507) under small limits.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Query;
use axum::http::{Method, Request, StatusCode, Uri};
use axum::Router;
use kvpool_master::http::{admin_router, metadata_router, HttpLimits};
use kvpool_master::{Master, StateConfig};
use kvpool_proto::MAX_METADATA_KEY_LEN;
use tower::ServiceExt;

thread_local! {
    /// One runtime per thread, reused: building one per input costs more
    /// than the requests.
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    /// One master per thread, reused likewise. HTTP cannot change its
    /// objects (the admin API only reads); its refusal counters do grow.
    static MASTER: Arc<Master> = Master::new(StateConfig::default());
}

/// The metadata service's query, as its handlers extract it.
#[derive(serde::Deserialize)]
struct KeyQuery {
    key: String,
}

/// Limits small enough for short inputs to reach every refusal.
fn limits() -> HttpLimits {
    HttpLimits {
        metadata_max_value: 64,
        metadata_max_keys: 4,
        metadata_max_bytes: 256,
        ..HttpLimits::default()
    }
}

/// Up to 16 requests, one per line, against fresh routers (an empty
/// metadata service) of an empty master.
pub fn http(data: &[u8]) {
    let master = MASTER.with(Arc::clone);
    let limits = limits();
    let meta = metadata_router(&limits, master.clone());
    let admin = admin_router(master);
    let mut model = HashMap::new();
    RUNTIME.with(|rt| {
        rt.block_on(async {
            for line in data.split(|b| *b == b'\n').take(16) {
                let mut parts = line.splitn(3, |b| *b == b' ');
                let (Some(method), Some(uri)) = (parts.next(), parts.next()) else {
                    continue;
                };
                let body = parts.next().unwrap_or_default().to_vec();
                let (Ok(method), Ok(uri)) = (Method::from_bytes(method), Uri::try_from(uri)) else {
                    continue;
                };
                let (status, _) = call(&admin, &method, &uri, body.clone()).await;
                assert!(!status.is_server_error(), "admin {method} {uri}: {status}");
                let (status, got) = call(&meta, &method, &uri, body.clone()).await;
                check_metadata(&mut model, &limits, &method, &uri, &body, status, &got);
            }
        })
    });
}

/// Sends one request through `router`; the status and the whole body.
async fn call(router: &Router, method: &Method, uri: &Uri, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
    let req = Request::builder()
        .method(method.clone())
        .uri(uri.clone())
        .body(Body::from(body))
        .expect("method and uri already parsed");
    let resp = match router.clone().oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("in-memory body");
    (status, body.to_vec())
}

/// Checks one metadata-service answer against `model` and updates it.
fn check_metadata(
    model: &mut HashMap<String, Vec<u8>>,
    limits: &HttpLimits,
    method: &Method,
    uri: &Uri,
    body: &[u8],
    status: StatusCode,
    got: &[u8],
) {
    let what = format!("metadata {method} {uri} answered {status}");
    if uri.path() != "/metadata" {
        return;
    }
    let Ok(Query(KeyQuery { key })) = Query::<KeyQuery>::try_from_uri(uri) else {
        let routed = [
            Method::GET,
            Method::HEAD,
            Method::PUT,
            Method::POST,
            Method::DELETE,
        ];
        assert!(
            status.is_client_error() || !routed.contains(method),
            "{what}"
        );
        return;
    };
    let held = model.get(&key);
    match *method {
        Method::GET | Method::HEAD => match status {
            StatusCode::OK => {
                assert!(held.is_some(), "{what}: not stored");
                if *method == Method::GET {
                    assert_eq!(held.map(Vec::as_slice), Some(got), "{what}");
                }
            }
            StatusCode::NOT_FOUND => assert!(held.is_none(), "{what}: stored"),
            _ => panic!("{what}"),
        },
        Method::PUT | Method::POST => {
            let bytes: usize = model.iter().map(|(k, v)| k.len() + v.len()).sum();
            let after = bytes - held.map_or(0, |v| key.len() + v.len()) + key.len() + body.len();
            let expected = if body.len() > limits.metadata_max_value {
                StatusCode::PAYLOAD_TOO_LARGE
            } else if key.len() > MAX_METADATA_KEY_LEN {
                StatusCode::URI_TOO_LONG
            } else if (held.is_none() && model.len() >= limits.metadata_max_keys)
                || after as u64 > limits.metadata_max_bytes
            {
                StatusCode::INSUFFICIENT_STORAGE
            } else {
                StatusCode::OK
            };
            assert_eq!(status, expected, "{what}");
            if status == StatusCode::OK {
                model.insert(key, body.to_vec());
            }
        }
        Method::DELETE => {
            let expected = match held {
                Some(_) => StatusCode::OK,
                None => StatusCode::NOT_FOUND,
            };
            assert_eq!(status, expected, "{what}");
            model.remove(&key);
        }
        _ => assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{what}"),
    }
}
