//! Which master led when, and on which build, read back from a campaign's
//! master logs. In a mixed-version campaign the previous release leads part
//! of the time, and it keeps the bugs fixed after it was cut (v0.1.0
//! predates the fixes of chaos findings 16 and 23: a forced removal, and a
//! commit during a new leader's recovery, answered while an old lease could
//! still read the version they replaced). A stale read whose contradicted
//! acknowledgement such a leader gave is that release's: reported apart, not
//! counted against this build.

use std::path::Path;

use crate::checker::{Report, Rule};
use crate::history::{parse_wall_clock, Event};

/// The binary a host runs while on the previous release (the pool copies
/// it there; hosts start on it).
const PREVIOUS_BIN: &str = "/bin/kvpool-a ";

/// Sets aside the stale reads in `report` whose contradicted write or
/// removal a leader on the previous release acknowledged, when the
/// campaign in `dir` mixed versions.
pub fn set_aside_previous_release(
    dir: &Path,
    events: &[Event],
    report: &mut Report,
) -> anyhow::Result<()> {
    let mixed = events.iter().any(
        |e| matches!(e, Event::Mark { what, .. } if what.starts_with("mixed versions: hosts start on")),
    );
    let setup = events.iter().find_map(|e| match e {
        Event::Mark { t, what } => what
            .strip_prefix("setup; wall clock ")
            .and_then(parse_wall_clock)
            .map(|wall| (*t, wall)),
        _ => None,
    });
    let (true, Some((t0, wall0))) = (mixed, setup) else {
        return Ok(());
    };
    let mut logs = Vec::new();
    for e in std::fs::read_dir(dir.join("logs"))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("master-") && name.ends_with(".log") {
            logs.push(std::fs::read_to_string(e.path())?);
        }
    }
    let spans = previous_leading(&logs, t0, wall0);
    report.set_aside(|v| {
        v.rule == Rule::NoStaleRead
            && v.acked_at
                .is_some_and(|t| spans.iter().any(|&(a, b)| a <= t && t < b))
    });
    Ok(())
}

/// Spans of history time in which a master on the previous release led,
/// from the masters' logs: each start line names the binary (and gives the
/// monotonic clock the history uses), each election its wall-clock time,
/// mapped through the setup mark (`t0` is `wall0`). A leader leads from its
/// election until the next election anywhere or its own restart.
fn previous_leading(logs: &[String], t0: u64, wall0: u64) -> Vec<(u64, u64)> {
    let to_history = |wall: u64| (t0 + wall).saturating_sub(wall0);
    // (time, master, what): a start on the previous release or not, or an
    // election.
    let mut events: Vec<(u64, usize, Option<bool>)> = Vec::new();
    for (m, log) in logs.iter().enumerate() {
        for line in log.lines() {
            if let Some(rest) = line.strip_prefix("===== start ") {
                let t = rest
                    .split_once(" at ")
                    .and_then(|(_, r)| r.split_once("s (monotonic)"))
                    .and_then(|(secs, _)| secs.parse::<f64>().ok());
                if let Some(secs) = t {
                    events.push(((secs * 1e9) as u64, m, Some(line.contains(PREVIOUS_BIN))));
                }
            } else if line.contains("elected master leader") {
                if let Some(wall) = line.split_whitespace().next().and_then(parse_wall_clock) {
                    events.push((to_history(wall), m, None));
                }
            }
        }
    }
    events.sort_unstable();
    let mut on_previous = vec![false; logs.len()];
    let mut leading: Option<(u64, usize)> = None;
    let mut spans = Vec::new();
    let mut close = |leading: &mut Option<(u64, usize)>, at: u64, prev: &[bool]| {
        if let Some((from, m)) = leading.take() {
            if prev[m] {
                spans.push((from, at));
            }
        }
    };
    for (t, m, what) in events {
        match what {
            Some(previous) => {
                if leading.is_some_and(|(_, l)| l == m) {
                    close(&mut leading, t, &on_previous);
                }
                on_previous[m] = previous;
            }
            None => {
                close(&mut leading, t, &on_previous);
                leading = Some((t, m));
            }
        }
    }
    close(&mut leading, u64::MAX, &on_previous);
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader on the previous release leads from its election until the
    /// next election or its own restart; one on this build does not count.
    #[test]
    fn previous_release_leadership_spans_come_from_starts_and_elections() {
        let start = |at: &str, bin: &str| {
            format!("===== start 1 at {at}s (monotonic): /x/bin/kvpool-{bin} master --rpc-port 1")
        };
        let elected =
            |at: &str| format!("{at}  INFO kvpool_master::ha: elected master leader; rebuilding");
        // The setup mark: history time 100 s is 12:00:00.
        let (t0, wall0) = (
            100_000_000_000,
            parse_wall_clock("2026-11-30T12:00:00.000Z").unwrap(),
        );
        let m0 = [
            start("100.5", "a"),
            elected("2026-11-30T12:00:01.000000Z"),
            start("105.0", "b"),
            elected("2026-11-30T12:00:06.000000Z"),
        ]
        .join("\n");
        let m1 = [start("100.5", "a"), elected("2026-11-30T12:00:08.000000Z")].join("\n");
        let s = 1_000_000_000u64;
        assert_eq!(
            previous_leading(&[m0, m1], t0, wall0),
            [(101 * s, 105 * s), (108 * s, u64::MAX)]
        );
    }
}
