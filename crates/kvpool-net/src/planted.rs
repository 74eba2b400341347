//! Bugs planted on purpose, so the chaos harness and the fault tests can
//! show that they catch them (docs/chaos.md, "Planted bugs"). This module
//! exists only in builds with the `planted-bugs` cargo feature (turned on
//! through `kvpool-master/planted-bugs` or `kvpool-transfer/planted-bugs`),
//! which nothing turns on by default, and a planted bug acts only when
//! `KVPOOL_PLANTED_BUG` names it; the master or store then says so at
//! start, loudly.

use std::sync::OnceLock;

/// The environment variable that names the planted bug to switch on.
pub const ENV: &str = "KVPOOL_PLANTED_BUG";

/// Bugs that can be planted, and what each breaks.
pub const BUGS: &[(&str, &str)] = &[
    (
        "skip-upsert-fence",
        "an upsert answers before the old version is destroyed on its stores",
    ),
    (
        "skip-write-fence",
        "a store writes for grants of an earlier mount of the segment (a previous leader's)",
    ),
];

fn named() -> Option<&'static str> {
    static NAMED: OnceLock<Option<String>> = OnceLock::new();
    NAMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Whether the planted bug `name` is switched on.
pub fn active(name: &str) -> bool {
    named() == Some(name)
}

/// Logs the planted bug in force, if any, at start.
pub fn announce() {
    if let Some(n) = named() {
        let what = BUGS
            .iter()
            .find(|(b, _)| *b == n)
            .map_or("unknown: nothing is planted", |(_, w)| *w);
        tracing::error!(
            bug = n,
            what,
            "THIS PROCESS RUNS WITH A PLANTED BUG, for testing the chaos checker only"
        );
    }
}
