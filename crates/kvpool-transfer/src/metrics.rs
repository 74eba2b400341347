//! What a data-plane server counts: requests, bytes and latency per
//! operation, errors per code, connections, invalidations and tier moves.
//! One [`DataMetrics`] lives in each `SegmentTable`, so the request handlers
//! reach it without another argument; the store registers it under the
//! `kvpool_store_` prefix and serves it on its `/metrics` port.
//!
//! Everything here is atomics (prometheus-client's counters): an increment
//! on the data path takes no lock, and a label set is created once per
//! operation, then found by hash.

use std::time::Duration;

use kvpool_proto::frame::Opcode;
use kvpool_proto::Code;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Label of per-operation series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    /// The request's opcode name (`Read`, `Write`, `Invalidate`, ...).
    pub op: &'static str,
}

/// Label of failed requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    /// The request's opcode name.
    pub op: &'static str,
    /// The error code's Mooncake name (`SEGMENT_NOT_FOUND`, ...).
    pub code: &'static str,
}

/// Label of tier moves.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MoveLabel {
    /// `demote` (memory to disk) or `promote` (disk to memory).
    pub direction: &'static str,
    /// `ok`, `stale` (the source failed verification) or `error`.
    pub result: &'static str,
}

/// Label of writes refused by the fence checks.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabel {
    /// `fence` (granted under an earlier mount of the segment),
    /// `generation` (not the version granted, or a newer one is there) or
    /// `invalidated` (the master invalidated the version: removed, replaced
    /// or given up).
    pub reason: &'static str,
}

/// Counters of one data-plane server.
pub struct DataMetrics {
    /// Requests answered, per operation.
    pub requests: Family<OpLabel, Counter>,
    /// Requests answered with an error, per operation and code.
    pub errors: Family<ErrorLabel, Counter>,
    /// Payload bytes received (`Write`) and sent (`Read`).
    pub bytes: Family<OpLabel, Counter>,
    /// Of the bytes `Read` sent, those the kernel took from the segment
    /// file's pages (`sendfile`) without the store copying them.
    pub bytes_from_file: Counter,
    /// Time from a request's header to its answer handed to the socket.
    pub latency: Family<OpLabel, Histogram, fn() -> Histogram>,
    /// Connections that completed the handshake and are being served.
    pub connections_open: Gauge,
    /// Connections that completed the handshake since start.
    pub connections_accepted: Counter,
    /// Of those, connections on the same-host socket (no TCP).
    pub same_host_connections: Counter,
    /// Objects the master asked this store to destroy.
    pub invalidations_received: Counter,
    /// Of those, objects destroyed (the rest were gone or newer already).
    pub invalidations_applied: Counter,
    /// Invalidation requests refused: decided under an earlier mount.
    pub invalidations_refused: Counter,
    /// Copies between this store's memory and disk tiers, per direction and result.
    pub tier_moves: Family<MoveLabel, Counter>,
    /// Writes refused before landing: stale grants, per reason.
    pub writes_refused: Family<RefusedLabel, Counter>,
}

fn latency_histogram() -> Histogram {
    // 10 µs to about 10 s.
    Histogram::new(exponential_buckets(1e-5, 4.0, 11))
}

impl Default for DataMetrics {
    fn default() -> Self {
        DataMetrics {
            requests: Family::default(),
            errors: Family::default(),
            bytes: Family::default(),
            bytes_from_file: Counter::default(),
            latency: Family::new_with_constructor(latency_histogram),
            connections_open: Gauge::default(),
            connections_accepted: Counter::default(),
            same_host_connections: Counter::default(),
            invalidations_received: Counter::default(),
            invalidations_applied: Counter::default(),
            invalidations_refused: Counter::default(),
            tier_moves: Family::default(),
            writes_refused: Family::default(),
        }
    }
}

impl DataMetrics {
    /// Counts one request of `op` answered after `took`, moving `bytes` of
    /// payload, failed with `error` if it did.
    pub fn served(&self, op: Opcode, bytes: u64, took: Duration, error: Option<Code>) {
        // A static name: no allocation per request.
        let l = OpLabel { op: op.name() };
        self.requests.get_or_create(&l).inc();
        match error {
            Some(code) => {
                let e = ErrorLabel {
                    op: l.op,
                    code: code.name(),
                };
                self.errors.get_or_create(&e).inc();
            }
            None if bytes > 0 => {
                self.bytes.get_or_create(&l).inc_by(bytes);
            }
            None => {}
        }
        self.latency.get_or_create(&l).observe(took.as_secs_f64());
    }

    /// Counts one tier move (a `promote` from disk, else a demotion) that
    /// ended with `code`.
    pub fn tier_move(&self, promote: bool, code: Code) {
        let direction = if promote { "promote" } else { "demote" };
        let result = match code {
            Code::Ok => "ok",
            // The source no longer holds an intact object of that generation.
            // Not a checksum failure as such: replaced during the copy is
            // the usual reason.
            Code::ObjectNotFound => "stale",
            _ => "error",
        };
        self.tier_moves
            .get_or_create(&MoveLabel { direction, result })
            .inc();
    }

    /// Counts a write refused by the fence checks, for `reason`.
    pub fn write_refused(&self, reason: &'static str) {
        self.writes_refused
            .get_or_create(&RefusedLabel { reason })
            .inc();
    }

    /// Registers every series in `registry` (the store gives it the
    /// `kvpool_store` prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "requests",
            "Data-plane requests answered, per operation",
            self.requests.clone(),
        );
        registry.register(
            "errors",
            "Data-plane requests answered with an error, per operation and code",
            self.errors.clone(),
        );
        registry.register(
            "bytes",
            "Payload bytes served over TCP: received by Write, sent by Read",
            self.bytes.clone(),
        );
        registry.register(
            "bytes_from_file",
            "Payload bytes Read sent from the segment file's pages (sendfile), not copied by the store",
            self.bytes_from_file.clone(),
        );
        registry.register(
            "request_seconds",
            "Time from a data-plane request's header to its answer handed to the socket",
            self.latency.clone(),
        );
        registry.register(
            "connections_open",
            "Data-plane connections being served",
            self.connections_open.clone(),
        );
        registry.register(
            "connections_accepted",
            "Data-plane connections that completed the handshake",
            self.connections_accepted.clone(),
        );
        registry.register(
            "same_host_connections",
            "Data-plane connections from this host's processes on the same-host socket, without TCP",
            self.same_host_connections.clone(),
        );
        registry.register(
            "invalidations_received",
            "Objects the master asked this store to destroy",
            self.invalidations_received.clone(),
        );
        registry.register(
            "invalidations_applied",
            "Objects destroyed on the master's request (the rest were gone or newer)",
            self.invalidations_applied.clone(),
        );
        registry.register(
            "invalidations_refused",
            "Invalidation requests refused: decided under an earlier mount of the segment (a deposed leader's)",
            self.invalidations_refused.clone(),
        );
        registry.register(
            "tier_moves",
            "Copies between this store's memory and disk tiers, per direction and result",
            self.tier_moves.clone(),
        );
        registry.register(
            "writes_refused",
            "Writes refused before landing, per reason: granted under an earlier mount (fence), for another version (generation), or for a version the master invalidated (invalidated)",
            self.writes_refused.clone(),
        );
    }
}
