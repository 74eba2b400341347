//! What a client counts (`kvpool_client_*`): keys per operation and
//! result, errors per code, value bytes, bytes moved per transport, and
//! call latency. An engine embedding the client exports them itself:
//! [`ClientMetrics::render`] is Prometheus text, [`ClientMetrics::snapshot`]
//! the same numbers by series name (Python's `Client.get_metrics()`).
//!
//! Shared-memory transfers show only here: they never reach a store process.

use std::collections::BTreeMap;
use std::time::Duration;

use kvpool_proto::KvResult;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Label of keys counted per operation and result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `get` (batch, into-buffer and located forms included), `put`,
    /// `exist` or `remove`.
    pub op: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Label of failed keys.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    /// The operation.
    pub op: &'static str,
    /// The error code's Mooncake name (`OBJECT_NOT_FOUND`, ...).
    pub code: &'static str,
}

/// Label of per-operation series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    /// The operation.
    pub op: &'static str,
}

/// Label of bytes moved.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransferLabel {
    /// `read` or `write`.
    pub direction: &'static str,
    /// `tcp` or `shm`.
    pub transport: &'static str,
}

/// The counters of one client (shared by its clones).
pub struct ClientMetrics {
    registry: Registry,
    keys: Family<ResultLabel, Counter>,
    errors: Family<ErrorLabel, Counter>,
    bytes: Family<OpLabel, Counter>,
    transfer: Family<TransferLabel, Counter>,
    latency: Family<OpLabel, Histogram, fn() -> Histogram>,
    hedges: Counter,
    hedge_wins: Counter,
}

impl Default for ClientMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kvpool_client");
        let m = ClientMetrics {
            registry: Registry::default(),
            keys: Family::default(),
            errors: Family::default(),
            bytes: Family::default(),
            transfer: Family::default(),
            // 10 µs to about 10 s.
            latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-5, 4.0, 11))
            }),
            hedges: Counter::default(),
            hedge_wins: Counter::default(),
        };
        registry.register(
            "keys",
            "Keys handled per operation and result (a batch counts each key)",
            m.keys.clone(),
        );
        registry.register(
            "errors",
            "Keys that failed, per operation and error code",
            m.errors.clone(),
        );
        registry.register(
            "value_bytes",
            "Value bytes of successful gets and puts",
            m.bytes.clone(),
        );
        registry.register(
            "transfer_bytes",
            "Bytes of object reads and writes issued per transport, headers and failed attempts included",
            m.transfer.clone(),
        );
        registry.register(
            "call_seconds",
            "Time of one call (a batch is one call), retries included",
            m.latency.clone(),
        );
        registry.register(
            "hedged_reads",
            "Second reads of an object from its next replica, asked because the first was slower than most",
            m.hedges.clone(),
        );
        registry.register(
            "hedge_wins",
            "Hedged reads whose answer was used (the first replica's reads were dropped)",
            m.hedge_wins.clone(),
        );
        ClientMetrics { registry, ..m }
    }
}

impl ClientMetrics {
    /// Counts one call of `op` that took `took` and answered `results`;
    /// `bytes` gives the value bytes of result `i` when it succeeded.
    pub(crate) fn record<T>(
        &self,
        op: &'static str,
        results: &[KvResult<T>],
        bytes: impl Fn(usize, &T) -> u64,
        took: Duration,
    ) {
        let (mut ok, mut moved) = (0, 0);
        for (i, r) in results.iter().enumerate() {
            if let Ok(v) = r {
                ok += 1;
                moved += bytes(i, v);
            }
        }
        self.failures(op, results);
        if ok > 0 {
            let l = ResultLabel { op, result: "ok" };
            self.keys.get_or_create(&l).inc_by(ok);
        }
        if moved > 0 {
            self.bytes.get_or_create(&OpLabel { op }).inc_by(moved);
        }
        let l = OpLabel { op };
        self.latency.get_or_create(&l).observe(took.as_secs_f64());
    }

    /// Counts only the keys of `results` that failed, as keys of `op`
    /// (a lookup whose successes are counted when they are read).
    pub(crate) fn failures<T>(&self, op: &'static str, results: &[KvResult<T>]) {
        let mut failed = 0;
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            failed += 1;
            let l = ErrorLabel {
                op,
                code: e.code.name(),
            };
            self.errors.get_or_create(&l).inc();
        }
        if failed > 0 {
            let l = ResultLabel {
                op,
                result: "error",
            };
            self.keys.get_or_create(&l).inc_by(failed);
        }
    }

    /// Counts `tcp` and `shm` bytes issued in one `direction`.
    pub(crate) fn transferred(&self, direction: &'static str, tcp: u64, shm: u64) {
        for (transport, n) in [("tcp", tcp), ("shm", shm)] {
            if n > 0 {
                let l = TransferLabel {
                    direction,
                    transport,
                };
                self.transfer.get_or_create(&l).inc_by(n);
            }
        }
    }

    /// Counts `n` hedged reads asked.
    pub(crate) fn hedged(&self, n: u64) {
        self.hedges.inc_by(n);
    }

    /// Counts `n` hedged reads whose answer was used.
    pub(crate) fn hedges_won(&self, n: u64) {
        self.hedge_wins.inc_by(n);
    }

    /// Prometheus text exposition of every counter.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Every series of [`Self::render`] by its name and labels as written
    /// there (`kvpool_client_keys_total{op="get",result="ok"}`).
    pub fn snapshot(&self) -> BTreeMap<String, f64> {
        self.render()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_string(), value.parse().ok()?))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpool_proto::{Code, KvError};

    #[test]
    fn a_batch_counts_each_key_and_each_code() {
        let m = ClientMetrics::default();
        let results = vec![
            Ok(vec![0u8; 10]),
            Err(KvError::from(Code::ObjectNotFound)),
            Ok(vec![0u8; 5]),
        ];
        m.record(
            "get",
            &results,
            |_, v| v.len() as u64,
            Duration::from_millis(1),
        );
        m.transferred("read", 100, 0);
        let s = m.snapshot();
        let at = |k: &str| s.get(k).copied().unwrap_or_else(|| panic!("{k} in {s:#?}"));
        assert_eq!(at(r#"kvpool_client_keys_total{op="get",result="ok"}"#), 2.0);
        assert_eq!(
            at(r#"kvpool_client_keys_total{op="get",result="error"}"#),
            1.0
        );
        assert_eq!(
            at(r#"kvpool_client_errors_total{op="get",code="OBJECT_NOT_FOUND"}"#),
            1.0
        );
        assert_eq!(at(r#"kvpool_client_value_bytes_total{op="get"}"#), 15.0);
        assert_eq!(
            at(r#"kvpool_client_transfer_bytes_total{direction="read",transport="tcp"}"#),
            100.0
        );
        assert_eq!(at(r#"kvpool_client_call_seconds_count{op="get"}"#), 1.0);
    }
}
