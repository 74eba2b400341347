//! Requests refused by a limit: why, counted per reason for `/metrics`
//! (`kvpool_refusals_total{reason}`), and logged at most once a second per
//! reason, so a flood of refused requests cannot flood the log too.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kvpool_proto::KvError;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Which limit refused a request; the `reason` label of the counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A batch request or inventory part with more than 16,384 items.
    BatchKeys,
    /// An empty key or one over 4,096 bytes.
    KeyLength,
    /// A hostname, segment name or path over its length limit.
    NameLength,
    /// A segment endpoint that is not `host:port`.
    Endpoint,
    /// A put preferring more than 64 segments.
    PreferredSegments,
    /// A remove-by-regex pattern over 4 KiB.
    RegexPattern,
    /// A regex whose compiled form is over its size limit.
    RegexSize,
    /// A new client beyond `--max-clients`.
    Clients,
    /// A segment beyond `--max-segments-per-client`.
    SegmentsPerClient,
    /// An inventory larger than its segment announced.
    Inventory,
    /// A put beyond `--max-pending-puts-per-client`.
    PendingPuts,
    /// A hard pin beyond `--max-hard-pinned-per-client`.
    HardPinnedBytes,
    /// A hard pin beyond `--max-hard-pinned-ratio` of the pool, over all
    /// clients.
    HardPinnedPool,
    /// A hard pin beyond its tenant's `--tenant-quota NAME:pinned=SIZE`.
    HardPinnedTenant,
    /// An HTTP connection beyond `--http-max-connections`.
    HttpConnections,
    /// An HTTP connection from an address that holds
    /// `--http-max-connections-per-ip` on that listener already.
    HttpConnectionsPerIp,
    /// A metadata value over `--metadata-max-value-size`.
    MetadataValueSize,
    /// A new metadata key beyond `--metadata-max-keys` (or total bytes).
    MetadataKeys,
    /// A connection from an IP that holds its share of the RPC port already
    /// (counted by the accept loop of `kvpool-net`).
    ConnectionsPerIp,
    /// A connection beyond the RPC port's total (counted likewise).
    Connections,
    /// A connection still in its handshake, closed to make room for a
    /// newer one (the handshake budget of `kvpool-net`'s accept loop).
    PreauthEvicted,
    /// A put or client id beyond its tenant's `--tenant-quota`.
    Quota,
    /// A request naming a key outside its peer's tenant namespace.
    Namespace,
}

impl Refusal {
    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::BatchKeys => "batch_keys",
            Refusal::KeyLength => "key_length",
            Refusal::NameLength => "name_length",
            Refusal::Endpoint => "endpoint",
            Refusal::PreferredSegments => "preferred_segments",
            Refusal::RegexPattern => "regex_pattern",
            Refusal::RegexSize => "regex_size",
            Refusal::Clients => "clients",
            Refusal::SegmentsPerClient => "segments_per_client",
            Refusal::Inventory => "inventory",
            Refusal::PendingPuts => "pending_puts_per_client",
            Refusal::HardPinnedBytes => "hard_pinned_bytes_per_client",
            Refusal::HardPinnedPool => "hard_pinned_bytes_pool",
            Refusal::HardPinnedTenant => "hard_pinned_bytes_tenant",
            Refusal::HttpConnections => "http_connections",
            Refusal::HttpConnectionsPerIp => "http_connections_per_ip",
            Refusal::MetadataValueSize => "metadata_value_size",
            Refusal::MetadataKeys => "metadata_keys",
            Refusal::ConnectionsPerIp => "connections_per_ip",
            Refusal::Connections => "connections",
            Refusal::PreauthEvicted => "preauth_evicted",
            Refusal::Quota => "tenant_quota",
            Refusal::Namespace => "tenant_namespace",
        }
    }
}

/// Label of the refusal counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// [`Refusal::label`].
    pub reason: &'static str,
}

/// Least time between two log lines for one reason.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// Refusals of one master process.
#[derive(Default)]
pub struct Refusals {
    counts: Family<ReasonLabel, Counter>,
    /// Per reason: when it was last logged, and refusals since.
    logged: Mutex<HashMap<Refusal, (Instant, u64)>>,
    /// Connection refusals of `kvpool-net`'s accept loops already counted.
    synced: Mutex<(u64, u64, u64)>,
}

impl Refusals {
    /// The counters, to register with the metrics registry.
    pub fn family(&self) -> Family<ReasonLabel, Counter> {
        self.counts.clone()
    }

    /// Refusals counted so far for `reason`.
    pub fn count(&self, reason: Refusal) -> u64 {
        self.counts
            .get_or_create(&ReasonLabel {
                reason: reason.label(),
            })
            .get()
    }

    /// Counts `n` refusals for `reason` and logs `detail` unless this reason
    /// was logged less than a second ago.
    pub fn record(&self, reason: Refusal, n: u64, detail: &str) {
        if n == 0 {
            return;
        }
        let label = ReasonLabel {
            reason: reason.label(),
        };
        self.counts.get_or_create(&label).inc_by(n);
        let now = Instant::now();
        let since = {
            let mut logged = self.logged.lock();
            let e = logged.entry(reason).or_insert((now - LOG_EVERY, 0));
            e.1 += n;
            if now.duration_since(e.0) < LOG_EVERY {
                return;
            }
            let since = e.1;
            *e = (now, 0);
            since
        };
        tracing::warn!(
            reason = reason.label(),
            refused = since,
            "refused: {detail} (logged at most once a second per reason)"
        );
    }

    /// Counts one refusal of `e` for `reason` (see [`Self::record`]) and
    /// hands `e` back, for `return Err(refusals.refuse(..))`.
    pub fn refuse(&self, reason: Refusal, e: KvError) -> KvError {
        self.record(reason, 1, &e.message);
        e
    }

    /// Adds the connections refused by this process's accept loops since
    /// the last call (they count in `kvpool-net`, which has no metrics).
    pub fn sync_connections(&self) {
        use kvpool_net::server::{
            PREAUTH_EVICTED, REFUSED_CONNECTIONS, REFUSED_CONNECTIONS_PER_IP,
        };
        let mut synced = self.synced.lock();
        let per_ip = REFUSED_CONNECTIONS_PER_IP.load(Ordering::Relaxed);
        let total = REFUSED_CONNECTIONS.load(Ordering::Relaxed);
        let evicted = PREAUTH_EVICTED.load(Ordering::Relaxed);
        let count = |r: Refusal, n: u64| {
            self.counts
                .get_or_create(&ReasonLabel { reason: r.label() })
                .inc_by(n);
        };
        count(Refusal::ConnectionsPerIp, per_ip.saturating_sub(synced.0));
        count(Refusal::Connections, total.saturating_sub(synced.1));
        count(Refusal::PreauthEvicted, evicted.saturating_sub(synced.2));
        *synced = (
            per_ip.max(synced.0),
            total.max(synced.1),
            evicted.max(synced.2),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpool_proto::Code;

    #[test]
    fn refusals_are_counted_per_reason() {
        let r = Refusals::default();
        let e = r.refuse(
            Refusal::BatchKeys,
            KvError::new(Code::InvalidParams, "too many"),
        );
        assert_eq!(e.code, Code::InvalidParams);
        r.record(Refusal::BatchKeys, 3, "more");
        r.record(Refusal::KeyLength, 0, "none");
        assert_eq!(r.count(Refusal::BatchKeys), 4);
        assert_eq!(r.count(Refusal::KeyLength), 0);
        // Within the second only the first was logged; the rest are owed.
        assert_eq!(r.logged.lock()[&Refusal::BatchKeys].1, 3);
    }
}
