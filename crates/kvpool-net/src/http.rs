//! Serving HTTP within limits, for every kvpool HTTP port (the master's
//! admin and metadata ports, a store's metrics port): at most
//! [`HttpConnLimits::max_connections`] connections at once and at most
//! [`HttpConnLimits::max_connections_per_ip`] from one peer address (more
//! are closed at accept, so one address cannot keep `/health` and
//! `/metrics` from everyone else); a connection whose request header does
//! not arrive within [`HttpConnLimits::header_read_timeout`] is closed
//! (idle keep-alive connections included), and a request not handled
//! within [`HttpConnLimits::request_timeout`] is answered 408.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::tls::TlsAcceptor;

/// What one HTTP port serves at once, and how long it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpConnLimits {
    /// Connections served at once; more are closed at accept.
    pub max_connections: usize,
    /// Connections served at once from one peer address (0: no cap).
    pub max_connections_per_ip: usize,
    /// A request's header must arrive within this long of the connection
    /// opening or the previous response; else the connection is closed.
    pub header_read_timeout: Duration,
    /// A request (its body included) must be handled within this long; 408 after.
    pub request_timeout: Duration,
}

impl Default for HttpConnLimits {
    fn default() -> Self {
        HttpConnLimits {
            max_connections: 1024,
            max_connections_per_ip: 64,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Which limit closed a connection at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpRefusal {
    /// The port's [`HttpConnLimits::max_connections`].
    Total,
    /// The peer address's [`HttpConnLimits::max_connections_per_ip`].
    PerIp,
}

/// Serves `router` on `listener` until `shutdown`, within `limits`, over
/// TLS when `tls` is set (https); `refused` hears of each connection
/// closed at accept, with a line for the log. Returns once every
/// connection has finished (in-flight requests complete).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpConnLimits,
    tls: Option<TlsAcceptor>,
    refused: impl Fn(HttpRefusal, &str),
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use hyper_util::rt::TokioTimer;

    let timeout = limits.request_timeout;
    let router = router.layer(axum::middleware::from_fn(move |req, next| {
        within(timeout, req, next)
    }));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let per_ip = match limits.max_connections_per_ip {
        0 => usize::MAX,
        n => n,
    };
    // Open connections per peer address; an entry goes when its last does.
    let by_ip: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    let tracker = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let ip = peer.ip();
        let held = by_ip.lock().get(&ip).copied().unwrap_or(0);
        if held >= per_ip {
            let why = format!("{peer}: {ip} holds {held} HTTP connections, its limit; closed");
            refused(HttpRefusal::PerIp, &why);
            continue;
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            let why = format!(
                "{peer}: {} HTTP connections open, the limit; closed",
                limits.max_connections
            );
            refused(HttpRefusal::Total, &why);
            continue;
        };
        *by_ip.lock().entry(ip).or_default() += 1;
        let (http, router, stop, tls) =
            (http.clone(), router.clone(), shutdown.clone(), tls.clone());
        let by_ip = by_ip.clone();
        let handshake_limit = limits.header_read_timeout;
        tracker.spawn(async move {
            let r = match tls {
                None => serve_one(&http, stream, router, stop).await,
                Some(acceptor) => {
                    // The TLS handshake counts against the header timeout.
                    match tokio::time::timeout(handshake_limit, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => serve_one(&http, stream, router, stop).await,
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err("TLS handshake timed out".to_string()),
                    }
                }
            };
            if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "HTTP connection closed");
            }
            drop(slot);
            let mut open = by_ip.lock();
            if let Some(n) = open.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    open.remove(&ip);
                }
            }
        });
    }
    tracker.close();
    tracker.wait().await;
    Ok(())
}

/// Answers 408 to a request not handled within `limit`.
async fn within(limit: Duration, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!("request not completed within {limit:?}\n"),
        )
            .into_response(),
    }
}

/// Serves HTTP/1 on one connection until it closes or `stop` fires (the
/// request in flight is finished first).
async fn serve_one<S>(
    http: &hyper::server::conn::http1::Builder,
    stream: S,
    router: Router,
    stop: CancellationToken,
) -> Result<(), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;

    let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    let mut conn = std::pin::pin!(conn);
    let r = tokio::select! {
        r = conn.as_mut() => r,
        _ = stop.cancelled() => {
            // Finish the request in flight, take no more.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    r.map_err(|e| e.to_string())
}
