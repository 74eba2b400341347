//! The master's Prometheus metrics: one struct, passed as `Arc`, rendered by
//! `/metrics`. Gauges that describe the state (capacity, keys) are refreshed
//! from it at scrape time rather than tracked on every operation.

use kvpool_proto::frame::Opcode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvpool_proto::msg::{ClusterStatus, Tier};

use crate::kv_events::KvEventsStatus;
use crate::refusals::Refusals;
use crate::state::Usage;

/// Label of per-operation counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    /// Operation name (opcode).
    pub op: &'static str,
}

/// Label of per-tier gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    /// `memory` or `disk`.
    pub tier: &'static str,
}

/// Label of per-segment gauges: the segment's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SegmentLabel {
    /// The segment's name (`<store>/disk` for a disk tier).
    pub segment: String,
}

/// Label of a segment's per-segment gauges: its name and tier.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SegmentTierLabel {
    /// The segment's name.
    pub segment: String,
    /// `memory` or `disk`.
    pub tier: &'static str,
}

/// Label of a segment's state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SegmentStateLabel {
    /// The segment's name.
    pub segment: String,
    /// `live`, `suspect`, `draining` or `recovering`.
    pub state: String,
}

/// Label of a tenant's gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    /// The tenant's name.
    pub tenant: String,
}

/// What each tenant holds against its quota, refreshed at every scrape.
#[derive(Default)]
struct PerTenant {
    objects: Family<TenantLabel, Gauge>,
    bytes: Family<TenantLabel, Gauge>,
    clients: Family<TenantLabel, Gauge>,
    pinned: Family<TenantLabel, Gauge>,
    puts: Family<TenantLabel, Gauge>,
}

/// Label of the master's role gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabel {
    /// `leader`, `recovering` or `standby`.
    pub role: &'static str,
}

/// Each mounted segment's use and state, refreshed at every scrape (a
/// segment that went away leaves no series behind).
#[derive(Default)]
struct PerSegment {
    capacity: Family<SegmentTierLabel, Gauge>,
    used: Family<SegmentTierLabel, Gauge>,
    objects: Family<SegmentTierLabel, Gauge>,
    state: Family<SegmentStateLabel, Gauge>,
}

/// Disk I/O of one segment, as its store last reported it.
#[derive(Default)]
struct DiskIo {
    read_ops: Family<SegmentLabel, Gauge>,
    read_bytes: Family<SegmentLabel, Gauge>,
    read_seconds: Family<SegmentLabel, Gauge<f64, AtomicU64>>,
    write_ops: Family<SegmentLabel, Gauge>,
    write_bytes: Family<SegmentLabel, Gauge>,
    write_seconds: Family<SegmentLabel, Gauge<f64, AtomicU64>>,
    errors: Family<SegmentLabel, Gauge>,
}

/// Counters and gauges of one master process.
pub struct Metrics {
    registry: Registry,
    /// Requests handled, per operation.
    pub requests: Family<OpLabel, Counter>,
    /// Requests, or keys within batch requests, that failed, per operation.
    pub failures: Family<OpLabel, Counter>,
    /// Keys handled by batch operations, per operation.
    pub keys: Family<OpLabel, Counter>,
    /// Time from a request's decoding to its answer, per operation.
    pub handling: Family<OpLabel, Histogram, fn() -> Histogram>,
    /// Tier moves whose store did not answer in time (`--tier-move-timeout`).
    pub tier_moves_given_up: Counter,
    /// Given-up tier moves whose cancellation has not reached their store:
    /// the regions reserved for them stay reserved until it does.
    pub tier_moves_awaiting_cancel: Gauge,
    /// Tier moves sent to their stores and not answered yet.
    pub tier_moves_in_flight: Gauge,
    /// Longest handling time since the last scrape, in microseconds.
    longest_us: AtomicU64,
    longest: Gauge<f64, std::sync::atomic::AtomicU64>,
    capacity: Gauge,
    used: Gauge,
    objects: Gauge,
    pending: Gauge,
    segments: Gauge,
    clients: Gauge,
    evictions: Gauge,
    replicas_lost: Gauge,
    demotions: Gauge,
    promotions: Gauge,
    kv_events_published: Gauge,
    kv_events_dropped: Gauge,
    tier_capacity: Family<TierLabel, Gauge>,
    tier_used: Family<TierLabel, Gauge>,
    tier_objects: Family<TierLabel, Gauge>,
    disk: DiskIo,
    per_segment: PerSegment,
    per_tenant: PerTenant,
    role: Family<RoleLabel, Gauge>,
}

impl Metrics {
    /// The metrics of a master whose limits refuse into `refusals`.
    pub fn new(refusals: &Refusals) -> Self {
        let mut m = Metrics::default();
        m.registry.register(
            "refusals",
            "Requests and connections refused by a limit, per reason (see docs/operations.md, Limits)",
            refusals.family(),
        );
        m
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kvpool");
        let m = Metrics {
            requests: Family::default(),
            failures: Family::default(),
            keys: Family::default(),
            handling: Family::new_with_constructor(|| {
                // 10 µs to about 10 s.
                Histogram::new(exponential_buckets(1e-5, 4.0, 11))
            }),
            tier_moves_given_up: Counter::default(),
            tier_moves_awaiting_cancel: Gauge::default(),
            tier_moves_in_flight: Gauge::default(),
            longest_us: AtomicU64::new(0),
            longest: Gauge::default(),
            capacity: Gauge::default(),
            used: Gauge::default(),
            objects: Gauge::default(),
            pending: Gauge::default(),
            segments: Gauge::default(),
            clients: Gauge::default(),
            evictions: Gauge::default(),
            replicas_lost: Gauge::default(),
            demotions: Gauge::default(),
            promotions: Gauge::default(),
            kv_events_published: Gauge::default(),
            kv_events_dropped: Gauge::default(),
            tier_capacity: Family::default(),
            tier_used: Family::default(),
            tier_objects: Family::default(),
            disk: DiskIo::default(),
            per_segment: PerSegment::default(),
            per_tenant: PerTenant::default(),
            role: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "Requests handled by the master",
            m.requests.clone(),
        );
        registry.register("failures", "Failed requests or keys", m.failures.clone());
        registry.register(
            "request_handling_seconds",
            "Time the master spent on a request, from decoding to its answer (waits for master state included)",
            m.handling.clone(),
        );
        registry.register(
            "request_handling_longest_seconds",
            "Longest time the master spent on one request since the previous scrape",
            m.longest.clone(),
        );
        registry.register(
            "op_keys",
            "Keys handled by batch operations",
            m.keys.clone(),
        );
        registry.register(
            "capacity_bytes",
            "Bytes lent by mounted segments",
            m.capacity.clone(),
        );
        registry.register("used_bytes", "Bytes reserved by objects", m.used.clone());
        registry.register("keys", "Committed objects", m.objects.clone());
        registry.register(
            "pending_puts",
            "Puts started but not ended",
            m.pending.clone(),
        );
        registry.register("segments", "Mounted segments", m.segments.clone());
        registry.register(
            "clients",
            "Registered clients and stores",
            m.clients.clone(),
        );
        registry.register(
            "evictions",
            "Objects evicted since start",
            m.evictions.clone(),
        );
        registry.register(
            "kv_events_published",
            "KV events published on the event stream since start",
            m.kv_events_published.clone(),
        );
        registry.register(
            "kv_events_dropped",
            "KV events dropped because the stream's queue was full (subscribers see a gap and resync)",
            m.kv_events_dropped.clone(),
        );
        registry.register(
            "replicas_lost",
            "Replicas dropped since start because a remounted store no longer had them (each is logged with its key)",
            m.replicas_lost.clone(),
        );
        registry.register(
            "demotions",
            "Objects moved from memory to a disk tier since start",
            m.demotions.clone(),
        );
        registry.register(
            "promotions",
            "Objects moved from a disk tier back to memory since start",
            m.promotions.clone(),
        );
        registry.register(
            "tier_moves_given_up",
            "Tier moves whose store did not answer within --tier-move-timeout (each is cancelled on the store before its regions are reused)",
            m.tier_moves_given_up.clone(),
        );
        registry.register(
            "tier_moves_awaiting_cancel",
            "Given-up tier moves whose cancellation has not reached their store yet (their regions stay reserved)",
            m.tier_moves_awaiting_cancel.clone(),
        );
        registry.register(
            "tier_moves_in_flight",
            "Tier moves sent to their stores and not answered yet",
            m.tier_moves_in_flight.clone(),
        );
        registry.register(
            "tier_capacity_bytes",
            "Bytes lent by mounted segments, per tier",
            m.tier_capacity.clone(),
        );
        registry.register(
            "tier_used_bytes",
            "Bytes reserved by objects, per tier",
            m.tier_used.clone(),
        );
        registry.register(
            "tier_objects",
            "Object replicas held, per tier",
            m.tier_objects.clone(),
        );
        let t = &m.per_tenant;
        registry.register(
            "tenant_objects",
            "Objects a tenant holds, committed or being put (against --tenant-quota)",
            t.objects.clone(),
        );
        registry.register(
            "tenant_bytes",
            "Value bytes of a tenant's objects (against --tenant-quota)",
            t.bytes.clone(),
        );
        registry.register(
            "tenant_clients",
            "Client ids a tenant has registered (against --tenant-quota)",
            t.clients.clone(),
        );
        registry.register(
            "tenant_pinned_bytes",
            "Bytes of a tenant's hard-pinned objects, all replicas (against --tenant-quota)",
            t.pinned.clone(),
        );
        registry.register(
            "tenant_puts_in_flight",
            "Puts a tenant's clients have started and not ended (against --tenant-quota)",
            t.puts.clone(),
        );
        let p = &m.per_segment;
        registry.register(
            "segment_capacity_bytes",
            "Bytes a mounted segment lends",
            p.capacity.clone(),
        );
        registry.register(
            "segment_used_bytes",
            "Bytes of a mounted segment reserved by objects (puts in flight included)",
            p.used.clone(),
        );
        registry.register(
            "segment_objects",
            "Object replicas a mounted segment holds",
            p.objects.clone(),
        );
        registry.register(
            "segment_state",
            "1 for a mounted segment's state: live, suspect (its store missed heartbeats), draining or recovering",
            p.state.clone(),
        );
        registry.register(
            "master_role",
            "1 for this master's role: leader, recovering (a new leader waiting for stores) or standby",
            m.role.clone(),
        );
        let d = &m.disk;
        registry.register(
            "disk_read_ops",
            "Reads a store made from its disk tier since it started",
            d.read_ops.clone(),
        );
        registry.register(
            "disk_read_bytes",
            "Bytes a store read from its disk tier since it started",
            d.read_bytes.clone(),
        );
        registry.register(
            "disk_read_seconds",
            "Time a store spent in disk-tier reads since it started",
            d.read_seconds.clone(),
        );
        registry.register(
            "disk_write_ops",
            "Writes a store made to its disk tier since it started",
            d.write_ops.clone(),
        );
        registry.register(
            "disk_write_bytes",
            "Bytes a store wrote to its disk tier since it started",
            d.write_bytes.clone(),
        );
        registry.register(
            "disk_write_seconds",
            "Time a store spent in disk-tier writes since it started",
            d.write_seconds.clone(),
        );
        registry.register(
            "disk_errors",
            "I/O errors of a disk tier (the first takes it offline)",
            d.errors.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Counts one request of `op` carrying `keys` keys, `failed` of which failed.
    pub fn record(&self, op: Opcode, keys: usize, failed: usize) {
        // A static name: no allocation per request.
        let l = OpLabel { op: op.name() };
        self.requests.get_or_create(&l).inc();
        self.keys.get_or_create(&l).inc_by(keys as u64);
        if failed > 0 {
            self.failures.get_or_create(&l).inc_by(failed as u64);
        }
    }

    /// Records how long one request of `op` took to handle.
    pub fn observe_handling(&self, op: Opcode, took: Duration) {
        let l = OpLabel { op: op.name() };
        self.handling.get_or_create(&l).observe(took.as_secs_f64());
        self.longest_us
            .fetch_max(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// Prometheus text exposition, with state gauges refreshed from `s`
    /// and the tenants' usage.
    pub fn render(
        &self,
        s: &ClusterStatus,
        tenants: &[(String, Usage)],
        events: &KvEventsStatus,
    ) -> String {
        let longest = self.longest_us.swap(0, Ordering::Relaxed);
        self.longest.set(longest as f64 / 1e6);
        let g = |v: u64| v.min(i64::MAX as u64) as i64;
        self.capacity.set(g(s.capacity));
        self.used.set(g(s.used));
        self.objects.set(g(s.keys));
        self.pending.set(g(s.pending));
        self.segments.set(s.segments.len() as i64);
        self.clients.set(g(s.clients));
        self.evictions.set(g(s.evictions));
        self.replicas_lost.set(g(s.replicas_lost));
        self.demotions.set(g(s.demotions));
        self.promotions.set(g(s.promotions));
        self.kv_events_published.set(g(events.published_events));
        self.kv_events_dropped.set(g(events.dropped_events));
        for tier in Tier::ALL {
            let of = || s.segments.iter().filter(move |x| x.info.tier == tier);
            let l = TierLabel { tier: tier.name() };
            self.tier_capacity
                .get_or_create(&l)
                .set(g(of().map(|x| x.info.size).sum()));
            self.tier_used
                .get_or_create(&l)
                .set(g(of().map(|x| x.used).sum()));
            self.tier_objects
                .get_or_create(&l)
                .set(g(of().map(|x| x.regions).sum()));
        }
        for role in ["leader", "recovering", "standby"] {
            let is = i64::from(s.role == role);
            self.role.get_or_create(&RoleLabel { role }).set(is);
        }
        let p = &self.per_segment;
        for f in [&p.capacity, &p.used, &p.objects] {
            f.clear();
        }
        p.state.clear();
        for seg in &s.segments {
            let l = SegmentTierLabel {
                segment: seg.info.name.clone(),
                tier: seg.info.tier.name(),
            };
            p.capacity.get_or_create(&l).set(g(seg.info.size));
            p.used.get_or_create(&l).set(g(seg.used));
            p.objects.get_or_create(&l).set(g(seg.regions));
            let l = SegmentStateLabel {
                segment: l.segment,
                state: seg.state.clone(),
            };
            p.state.get_or_create(&l).set(1);
        }
        let t = &self.per_tenant;
        for f in [&t.objects, &t.bytes, &t.clients, &t.pinned, &t.puts] {
            f.clear();
        }
        for (name, u) in tenants {
            let l = TenantLabel {
                tenant: name.clone(),
            };
            t.objects.get_or_create(&l).set(g(u.objects));
            t.bytes.get_or_create(&l).set(g(u.bytes));
            t.clients.get_or_create(&l).set(g(u.clients));
            t.pinned.get_or_create(&l).set(g(u.pinned));
            t.puts.get_or_create(&l).set(g(u.puts));
        }
        let d = &self.disk;
        for seg in &s.segments {
            let Some(io) = seg.io else { continue };
            let l = SegmentLabel {
                segment: seg.info.name.clone(),
            };
            d.read_ops.get_or_create(&l).set(g(io.read_ops));
            d.read_bytes.get_or_create(&l).set(g(io.read_bytes));
            d.read_seconds
                .get_or_create(&l)
                .set(io.read_us as f64 / 1e6);
            d.write_ops.get_or_create(&l).set(g(io.write_ops));
            d.write_bytes.get_or_create(&l).set(g(io.write_bytes));
            d.write_seconds
                .get_or_create(&l)
                .set(io.write_us as f64 / 1e6);
            d.errors.get_or_create(&l).set(g(io.errors));
        }
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
