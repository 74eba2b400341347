//! The status page on the admin port: the pool at a glance (HA role,
//! segments with their fill and tier, clients, hit rate and throughput over
//! the last minutes, evictions, recent events). The page is one static
//! HTML file that polls the JSON routes here every few seconds; a sampler
//! task keeps the last minutes of the master's counters for its chart.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use kvpool_proto::frame::Opcode;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, OpLabel};
use crate::Master;

/// The page itself: markup, style and script in one file.
const PAGE: &str = include_str!("status_page.html");

/// How often the sampler takes the counters.
const EVERY: Duration = Duration::from_secs(5);

/// Samples kept: ten minutes.
const KEEP: usize = 120;

/// The master's rates over one sampling interval.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// End of the interval (Unix milliseconds).
    pub at_ms: u64,
    /// Keys asked for by reads, per second.
    pub reads_per_s: f64,
    /// Share of those keys found; `None` when nothing was read.
    pub hit_ratio: Option<f64>,
    /// Keys written (puts and upserts started), per second.
    pub writes_per_s: f64,
    /// Objects evicted, per second.
    pub evictions_per_s: f64,
    /// Bytes reserved by objects at the end of the interval.
    pub used: u64,
    /// Committed objects at the end of the interval.
    pub keys: u64,
}

/// Counter readings a sample is the difference of.
#[derive(Clone, Copy, Default)]
struct Totals {
    reads: u64,
    misses: u64,
    writes: u64,
    evictions: u64,
}

impl Totals {
    fn read(m: &Metrics, evictions: u64) -> Self {
        let keys = |op: Opcode| m.keys.get_or_create(&OpLabel { op: op.name() }).get();
        let failed = |op: Opcode| m.failures.get_or_create(&OpLabel { op: op.name() }).get();
        Totals {
            reads: keys(Opcode::GetReplicaList),
            misses: failed(Opcode::GetReplicaList),
            writes: keys(Opcode::PutStart),
            evictions,
        }
    }
}

/// The last minutes of samples, and the readings the next one starts from.
#[derive(Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
    last: Mutex<Option<(Instant, Totals)>>,
}

impl History {
    /// Takes a sample: the rates since the previous call.
    fn sample(&self, m: &Metrics, used: u64, keys: u64, evictions: u64, now: Instant) {
        let t = Totals::read(m, evictions);
        let Some((then, before)) = self.last.lock().replace((now, t)) else {
            return;
        };
        let secs = now.saturating_duration_since(then).as_secs_f64().max(1e-3);
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
        let reads = t.reads.saturating_sub(before.reads);
        let misses = t.misses.saturating_sub(before.misses).min(reads);
        let s = Sample {
            at_ms: kvpool_net::capability::unix_ms(),
            reads_per_s: rate(t.reads, before.reads),
            hit_ratio: (reads > 0).then(|| 1.0 - misses as f64 / reads as f64),
            writes_per_s: rate(t.writes, before.writes),
            evictions_per_s: rate(t.evictions, before.evictions),
            used,
            keys,
        };
        let mut samples = self.samples.lock();
        if samples.len() == KEEP {
            samples.pop_front();
        }
        samples.push_back(s);
    }

    /// The samples kept, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().iter().copied().collect()
    }
}

/// Samples the master's counters every [`EVERY`] until `shutdown`.
pub(crate) async fn sampler(master: Arc<Master>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // A count per shard and segment, not a walk over the keys.
        let s = master.state.status();
        master
            .history
            .sample(&master.metrics, s.used, s.keys, s.evictions, Instant::now());
    }
}

/// `GET /`: the page.
pub(crate) async fn page() -> Html<&'static str> {
    Html(PAGE)
}

/// `GET /api/history`: the samples of the last minutes.
pub(crate) async fn history(State(m): State<Arc<Master>>) -> Response {
    Json(m.history.samples()).into_response()
}

/// `GET /api/clients`: registered clients and stores.
pub(crate) async fn clients(State(m): State<Arc<Master>>) -> Response {
    Json(m.state.clients(Instant::now())).into_response()
}

/// `GET /api/events`: recent log events of this process.
pub(crate) async fn events() -> Response {
    Json(crate::events::recent()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_rates_over_the_interval_and_the_ring_is_bounded() {
        let m = Metrics::default();
        let h = History::default();
        let t0 = Instant::now();
        h.sample(&m, 0, 0, 0, t0);
        assert!(h.samples().is_empty(), "the first reading only starts");
        m.record(Opcode::GetReplicaList, 100, 25);
        m.record(Opcode::PutStart, 50, 0);
        h.sample(&m, 4096, 50, 10, t0 + Duration::from_secs(5));
        let s = h.samples()[0];
        assert_eq!(
            (s.reads_per_s, s.writes_per_s, s.evictions_per_s),
            (20.0, 10.0, 2.0)
        );
        assert_eq!(s.hit_ratio, Some(0.75));
        assert_eq!((s.used, s.keys), (4096, 50));
        h.sample(&m, 4096, 50, 10, t0 + Duration::from_secs(10));
        assert_eq!(h.samples()[1].hit_ratio, None, "no reads: no ratio");
        for i in 0..2 * KEEP as u64 {
            h.sample(&m, 0, 0, 10, t0 + Duration::from_secs(15 + i));
        }
        assert_eq!(h.samples().len(), KEEP);
    }
}
