//! Recent events for the status page: this process's log lines at INFO and
//! above from kvpool's own crates (segments mounted and lost, stores
//! suspect, leaders elected, inventories reconciled), kept in a small ring.
//! The binary installs [`EventLayer`] beside its log output; the page reads
//! [`recent`].

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::LazyLock;

use parking_lot::Mutex;
use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing::{Event as TracingEvent, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Events kept; older ones are dropped.
const KEEP: usize = 200;

static RING: LazyLock<Mutex<VecDeque<Event>>> = LazyLock::new(Default::default);

/// One log line as the status page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// When it happened (Unix milliseconds).
    pub at_ms: u64,
    /// `ERROR`, `WARN` or `INFO`.
    pub level: &'static str,
    /// The module that logged it.
    pub target: String,
    /// The message and its fields (`key=value`).
    pub message: String,
}

/// The events kept, oldest first.
pub fn recent() -> Vec<Event> {
    RING.lock().iter().cloned().collect()
}

/// A tracing layer that keeps kvpool's INFO-and-above events for [`recent`].
pub struct EventLayer;

impl<S: Subscriber> Layer<S> for EventLayer {
    fn on_event(&self, event: &TracingEvent<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() > Level::INFO || !meta.target().starts_with("kvpool") {
            return;
        }
        let mut text = Text::default();
        event.record(&mut text);
        let e = Event {
            at_ms: kvpool_net::capability::unix_ms(),
            level: meta.level().as_str(),
            target: meta.target().to_string(),
            message: text.message + &text.fields,
        };
        let mut ring = RING.lock();
        if ring.len() == KEEP {
            ring.pop_front();
        }
        ring.push_back(e);
    }
}

/// The message of an event, and its other fields as ` key=value`.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}
