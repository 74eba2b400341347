//! Bugs planted on purpose, so the chaos harness can show that its checker
//! catches them (docs/chaos.md, "Planted bugs"). This module exists only in
//! builds with the `planted-bugs` cargo feature, which nothing turns on by
//! default, and a planted bug acts only when `KVPOOL_PLANTED_BUG` names it;
//! the master then says so at start, loudly.

use std::sync::OnceLock;

/// The environment variable that names the planted bug to switch on.
pub const ENV: &str = "KVPOOL_PLANTED_BUG";

/// Bugs that can be planted, and what each breaks.
pub const BUGS: &[(&str, &str)] = &[(
    "skip-upsert-fence",
    "an upsert answers before the old version is destroyed on its stores",
)];

fn named() -> Option<&'static str> {
    static NAMED: OnceLock<Option<String>> = OnceLock::new();
    NAMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Whether the planted bug `name` is switched on.
pub(crate) fn active(name: &str) -> bool {
    named() == Some(name)
}

/// Logs the planted bug in force, if any, at start.
pub(crate) fn announce() {
    if let Some(n) = named() {
        let what = BUGS
            .iter()
            .find(|(b, _)| *b == n)
            .map_or("unknown: nothing is planted", |(_, w)| *w);
        tracing::error!(
            bug = n,
            what,
            "THIS MASTER RUNS WITH A PLANTED BUG, for testing the chaos checker only"
        );
    }
}
