//! The operator's Prometheus metrics and its HTTP port (`rbg operator
//! --metrics-addr`): `/metrics` (Prometheus text), `/healthz` (the process
//! serves: liveness) and `/readyz` (ready: the startup checks passed, the
//! leader election has had its first round and, on the leader, the
//! controller's cache of groups has had its first full list).
//!
//! One [`Metrics`] per process, shared as `Arc` through the controller's
//! [`super::Context`] (no global statics), so tests read the same numbers
//! the port serves.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// Label of the reconcile counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Label of the failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// [`super::Error::kind`]: `invalid`, `kube`, `build`.
    pub kind: &'static str,
}

/// The operator's metrics (`rbg_operator_*`) and readiness.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabel, Counter>,
    duration: Histogram,
    failures: Family<KindLabel, Counter>,
    leader: Gauge,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Fresh metrics, every series registered (so a scrape shows them at 0).
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("rbg_operator");
        let reconciles = Family::<ResultLabel, Counter>::default();
        // 1 ms .. ~16 s: a reconcile is a handful of API calls.
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let failures = Family::<KindLabel, Counter>::default();
        let leader = Gauge::default();
        registry.register(
            "reconciles",
            "Reconciles of RoleBasedGroups by result",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time one reconcile of a RoleBasedGroup took",
            duration.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Failed reconciles by error kind",
            failures.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and reconciles",
            leader.clone(),
        );
        for result in ["ok", "error"] {
            let _ = reconciles.get_or_create(&ResultLabel { result });
        }
        for kind in ["invalid", "kube", "build"] {
            let _ = failures.get_or_create(&KindLabel { kind });
        }
        Metrics {
            registry,
            reconciles,
            duration,
            failures,
            leader,
            ready: AtomicBool::new(false),
        }
    }

    /// Counts one reconcile that took `took` and failed with `error` (a
    /// [`super::Error::kind`]) or succeeded.
    pub fn reconciled(&self, took: Duration, error: Option<&'static str>) {
        let result = if error.is_some() { "error" } else { "ok" };
        self.reconciles.get_or_create(&ResultLabel { result }).inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// Counts one failure of `kind` (called by the error policy).
    pub fn failed(&self, kind: &'static str) {
        self.failures.get_or_create(&KindLabel { kind }).inc();
    }

    /// Failures counted so far of `kind`.
    pub fn failures_of(&self, kind: &'static str) -> u64 {
        self.failures.get_or_create(&KindLabel { kind }).get()
    }

    /// Reconciles counted so far with `result` (`ok` or `error`).
    pub fn reconciles_of(&self, result: &'static str) -> u64 {
        self.reconciles.get_or_create(&ResultLabel { result }).get()
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Whether this replica leads.
    pub fn is_leader(&self) -> bool {
        self.leader.get() == 1
    }

    /// Records whether this replica is ready (see the module docs).
    pub fn set_ready(&self, ready: bool) {
        // Relaxed: a lone flag read by the probe, ordering nothing else.
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether this replica is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The routes of the operator's HTTP port.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.render(),
                )
                    .into_response()
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(m): State<Arc<Metrics>>| async move {
                let role = if m.is_leader() { "leader" } else { "standby" };
                if m.is_ready() {
                    (StatusCode::OK, format!("ready ({role})\n"))
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not ready ({role})\n"),
                    )
                }
            }),
        )
        .with_state(metrics)
}

/// Serves [`router`] on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics))
        .with_graceful_shutdown(shutdown)
        .await
}
