//! A store's Prometheus metrics (`kvpool_store_*`) and the HTTP port that
//! serves them (`kvpool store --metrics-port`): the data plane's counters
//! ([`kvpool_transfer::metrics::DataMetrics`]), what the restart scan found
//! ([`Recovery`]), and gauges read from the node at scrape time (segments,
//! capacity, disk tiers, refused connections, drain).
//!
//! What a store cannot know is not here: bytes used by objects are the
//! master's to allocate (`kvpool_segment_used_bytes` on the master), and
//! shared-memory transfers never reach the store process (clients count
//! them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use kvpool_format::scan::ScanStats;
use kvpool_net::http::{HttpConnLimits, HttpRefusal};
use kvpool_net::tls::TlsAcceptor;
use kvpool_proto::msg::Tier;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::DataNode;

/// Label of per-tier series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    /// `memory` or `disk`.
    pub tier: &'static str,
}

/// Label of the restart scan's counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecoveryLabel {
    /// `memory` or `disk`.
    pub tier: &'static str,
    /// `found` (intact objects), `torn` (failed their check), `accepted`
    /// (the master took them back) or `invalidated` (the master rejected
    /// them: removed, replaced or never committed).
    pub outcome: &'static str,
}

/// Label of a disk tier's state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SegmentLabel {
    /// The segment's name (`<store>/disk`).
    pub segment: String,
}

/// Label of refused connections.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `max_connections` or `per_ip`.
    pub reason: &'static str,
}

/// What the scans that mount a node's segments found; a scan runs at start
/// and again whenever the segments are mounted anew (a master restart).
#[derive(Default)]
pub struct Recovery {
    objects: Family<RecoveryLabel, Gauge>,
    seconds: Family<TierLabel, Gauge<f64, AtomicU64>>,
    checksum_failures: Family<TierLabel, Counter>,
    scans: Family<TierLabel, Counter>,
}

impl Recovery {
    /// Records one mount of a `tier` segment: what its scan (`took`) found
    /// and what the master `accepted` and had `invalidated`.
    pub fn record(
        &self,
        tier: Tier,
        stats: &ScanStats,
        accepted: u64,
        invalidated: u64,
        took: Duration,
    ) {
        let tier = tier.name();
        for (outcome, n) in [
            ("found", stats.objects),
            ("torn", stats.torn),
            ("accepted", accepted),
            ("invalidated", invalidated),
        ] {
            let l = RecoveryLabel { tier, outcome };
            self.objects.get_or_create(&l).set(n as i64);
        }
        let l = TierLabel { tier };
        self.seconds.get_or_create(&l).set(took.as_secs_f64());
        self.checksum_failures.get_or_create(&l).inc_by(stats.torn);
        self.scans.get_or_create(&l).inc();
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "recovery_objects",
            "Objects the latest mount scan of a tier found, found torn, had accepted and had invalidated by the master",
            self.objects.clone(),
        );
        r.register(
            "recovery_scan_seconds",
            "Duration of the latest mount scan of a tier",
            self.seconds.clone(),
        );
        r.register(
            "recovery_scans",
            "Mount scans run (at start, and when the master asks for the segments again)",
            self.scans.clone(),
        );
        r.register(
            "checksum_failures",
            "Objects a mount scan found whose value failed its checksum (memory tier) or whose header claimed bytes past the file (disk tier); never served",
            self.checksum_failures.clone(),
        );
    }
}

/// Every metric of one store process, rendered by its `/metrics`.
pub struct StoreMetrics {
    registry: Registry,
    node: Arc<DataNode>,
    segments: Family<TierLabel, Gauge>,
    capacity: Family<TierLabel, Gauge>,
    disk_online: Family<SegmentLabel, Gauge>,
    refused: Family<ReasonLabel, Gauge>,
    /// HTTP connections the metrics port closed at accept: over its total,
    /// over one address's share.
    http_refused: [AtomicU64; 2],
    /// 1 from the shutdown signal on: placements stopped, transfers in
    /// flight finishing (`connections_open` shows how many remain).
    pub draining: Gauge,
    /// Bytes of the memory segment in huge pages when it was mapped.
    pub huge_page_bytes: Gauge,
}

impl StoreMetrics {
    /// The metrics of the store serving `node`.
    pub fn new(node: Arc<DataNode>) -> Self {
        let mut registry = Registry::with_prefix("kvpool_store");
        node.table_metrics().register(&mut registry);
        node.recovery().register(&mut registry);
        let m = StoreMetrics {
            registry: Registry::default(),
            node,
            segments: Family::default(),
            capacity: Family::default(),
            disk_online: Family::default(),
            refused: Family::default(),
            http_refused: Default::default(),
            draining: Gauge::default(),
            huge_page_bytes: Gauge::default(),
        };
        registry.register(
            "segments",
            "Segments this store serves, per tier",
            m.segments.clone(),
        );
        registry.register(
            "capacity_bytes",
            "Bytes of object area this store lends, per tier",
            m.capacity.clone(),
        );
        registry.register(
            "disk_online",
            "1 while a disk tier serves, 0 once an I/O error took it offline (withdrawn from the pool)",
            m.disk_online.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections this process's accept loops closed at a limit (per_ip, max_connections) or, still in their handshake, to make room for a newer one (preauth_evicted), process-wide (in `kvpool up` the master's too); and HTTP connections the metrics port closed at its limits (http_max_connections, http_per_ip)",
            m.refused.clone(),
        );
        registry.register(
            "draining",
            "1 once the store is shutting down: no new placements, transfers in flight finishing",
            m.draining.clone(),
        );
        registry.register(
            "huge_page_bytes",
            "Bytes of the memory segment the kernel backed with huge pages when the store mapped it (hugetlbfs, or a tmpfs mounted with huge=); 0: 4 KiB pages, each built into every client's page tables on first touch",
            m.huge_page_bytes.clone(),
        );
        StoreMetrics { registry, ..m }
    }

    /// Prometheus text exposition, with gauges refreshed from the node.
    pub fn render(&self) -> String {
        let infos = self.node.segment_infos();
        for tier in [Tier::Memory, Tier::Disk] {
            let of = || infos.iter().filter(move |s| s.tier == tier);
            let l = TierLabel { tier: tier.name() };
            self.segments.get_or_create(&l).set(of().count() as i64);
            let bytes: u64 = of().map(|s| s.size).sum();
            self.capacity.get_or_create(&l).set(bytes as i64);
        }
        for (name, online) in self.node.disk_states() {
            let l = SegmentLabel { segment: name };
            self.disk_online.get_or_create(&l).set(online as i64);
        }
        use kvpool_net::server::{
            PREAUTH_EVICTED, REFUSED_CONNECTIONS, REFUSED_CONNECTIONS_PER_IP,
        };
        let [http_total, http_per_ip] = &self.http_refused;
        for (reason, n) in [
            ("max_connections", &REFUSED_CONNECTIONS),
            ("per_ip", &REFUSED_CONNECTIONS_PER_IP),
            ("preauth_evicted", &PREAUTH_EVICTED),
            ("http_max_connections", http_total),
            ("http_per_ip", http_per_ip),
        ] {
            let n = n.load(Ordering::Relaxed) as i64;
            self.refused.get_or_create(&ReasonLabel { reason }).set(n);
        }
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Serves `/metrics` and `/health` of `metrics` on `listener` until
/// `shutdown`, within `limits` (connections in all and per address,
/// header and request timeouts, the master's `--http-*` flags), so no peer
/// keeps the store's probes from its orchestrator; over https when `tls`
/// is set (the store's own certificate, as the master's HTTP ports use
/// theirs).
pub async fn serve_metrics(
    listener: TcpListener,
    metrics: Arc<StoreMetrics>,
    limits: HttpConnLimits,
    tls: Option<TlsAcceptor>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let router = Router::new()
        .route(
            "/metrics",
            get(
                |axum::extract::State(m): axum::extract::State<Arc<StoreMetrics>>| async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.render(),
                    )
                        .into_response()
                },
            ),
        )
        .route("/health", get(|| async { "OK\n" }))
        .with_state(metrics.clone());
    let refused = move |why: HttpRefusal, line: &str| {
        let [total, per_ip] = &metrics.http_refused;
        let n = match why {
            HttpRefusal::Total => total,
            HttpRefusal::PerIp => per_ip,
        };
        if n.fetch_add(1, Ordering::Relaxed).is_power_of_two() {
            tracing::warn!("metrics port: {line} (logged at powers of two)");
        }
    };
    kvpool_net::http::serve(listener, router, limits, tls, refused, shutdown).await
}
