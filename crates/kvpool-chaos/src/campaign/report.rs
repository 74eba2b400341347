//! What a campaign measured besides the checker's verdict: failover
//! times, seconds with and without acknowledged writes (and the faults
//! they are put down to), and the human report of a campaign and of a
//! store-join run.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::Serialize;

use crate::checker::{self, Report};
use crate::history::{Event, Op, Outcome};
use crate::schedule::Scenario;

/// One leader kill and how long the pool took to serve writes again.
#[derive(Debug, Clone, Serialize)]
pub struct Failover {
    /// The fault's number.
    pub n: u32,
    /// The master killed.
    pub master: String,
    /// From the kill to the completion of the first successful write
    /// invoked after it; `None` if none succeeded before the next fault.
    pub serves_after_ms: Option<u64>,
}

/// Whether the pool kept taking writes through the faults: counted from the
/// history over the fault window (first fault's start to last fault's end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Availability {
    /// Whole seconds in the window.
    pub window_s: u64,
    /// Of those, the seconds in which no write (put, upsert) completed
    /// successfully.
    pub seconds_without_write: u64,
    /// The longest time in the window between successful write completions
    /// (or from the window's start to the first, or the last to its end).
    pub longest_gap_ms: u64,
    /// The seconds without a write, by what was faulted in them.
    pub without_write_by_cause: Causes,
}

impl std::fmt::Display for Availability {
    /// Two report lines: the share of seconds without a write, then why.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pct = 100 * self.seconds_without_write / self.window_s.max(1);
        writeln!(
            f,
            "availability: {} of {} s of faults without an acknowledged write ({pct}%), longest gap {} ms",
            self.seconds_without_write, self.window_s, self.longest_gap_ms
        )?;
        let c = self.without_write_by_cause;
        writeln!(
            f,
            "  of those, faulted: leader, etcd or a split {} s; only stores {} s; only clients or standbys {} s; nothing (aftermath) {} s",
            c.leader_etcd_or_split, c.stores, c.others, c.none
        )
    }
}

/// Seconds without an acknowledged write, each counted once, under the
/// first of these that had a fault active in it: what kvpool could still
/// serve through (stores) apart from what no lease-based pool serves
/// through (the leader and etcd).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Causes {
    /// The master leader, an etcd member, or a split (which may cut off
    /// either) was faulted.
    pub leader_etcd_or_split: u64,
    /// Only stores (and maybe clients or standby masters) were faulted.
    pub stores: u64,
    /// Only clients or standby masters were faulted.
    pub others: u64,
    /// No fault was active (the aftermath of one that had just ended).
    pub none: u64,
}

impl Causes {
    /// Counts one second in which the faults with `targets` were active.
    fn count<'a>(&mut self, targets: impl Iterator<Item = &'a str> + Clone) {
        let any = |f: fn(&str) -> bool| targets.clone().any(f);
        let slot =
            if any(|t| t.ends_with("(leader)") || t.starts_with("etcd-") || t.starts_with("split"))
            {
                &mut self.leader_etcd_or_split
            } else if any(|t| t.contains("store-")) {
                &mut self.stores
            } else if targets.clone().next().is_some() {
                &mut self.others
            } else {
                &mut self.none
            };
        *slot += 1;
    }
}

/// What a campaign found.
#[derive(Debug, Clone, Serialize)]
pub struct CampaignResult {
    /// The seed.
    pub seed: u64,
    /// The scenario.
    pub scenario: Scenario,
    /// Seconds of faults.
    pub duration_s: u64,
    /// Seconds the whole campaign took.
    pub wall_s: u64,
    /// Faults injected, per kind.
    pub faults: BTreeMap<String, u32>,
    /// Faults skipped (no leader known, or its host busy).
    pub skipped: u32,
    /// Leader kills and their failover times.
    pub failovers: Vec<Failover>,
    /// Writes taken through the fault window; `None` without faults.
    pub availability: Option<Availability>,
    /// Processes that exited or panicked unasked (a master stepping down
    /// after losing etcd is not one).
    pub crashes: Vec<String>,
    /// Masters that stepped down because they lost their lease.
    pub step_downs: u32,
    /// The pool evicted objects.
    pub evictions_possible: bool,
    /// Demotions and promotions during the campaign, as sampled, when the
    /// stores have a disk tier.
    pub tier_moves: Option<(u64, u64)>,
    /// The pool did not settle after the faults were healed.
    pub unsettled: Option<String>,
    /// The checker's report.
    pub report: Report,
    /// Where logs, histories and the report are.
    pub dir: PathBuf,
    /// Wall clock at the campaign's first event (time 0 of the report).
    pub started_at: String,
    /// The bug planted in the masters, if any.
    pub planted_bug: Option<String>,
    /// The earlier release masters and stores were switched to and from.
    pub previous: Option<PathBuf>,
    /// Odd-numbered client hosts ran the earlier release's client.
    pub previous_clients: bool,
}

impl CampaignResult {
    /// Violations of every rule, plus crashes: zero for a clean campaign.
    pub fn problems(&self) -> usize {
        self.report.total() + self.crashes.len()
    }

    /// p50, p99 and max of the failover times, in ms, if any were measured.
    pub fn failover_stats(&self) -> Option<(u64, u64, u64)> {
        let mut v: Vec<u64> = self
            .failovers
            .iter()
            .filter_map(|f| f.serves_after_ms)
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let pick = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
        Some((pick(0.5), pick(0.99), *v.last().unwrap()))
    }

    /// The human report.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "chaos campaign: scenario {:?}, seed {}, {} s of faults, {} s in all",
            self.scenario, self.seed, self.duration_s, self.wall_s
        );
        let _ = writeln!(
            s,
            "times below are seconds after {} (logs are in UTC)",
            self.started_at
        );
        if let Some(previous) = &self.previous {
            let _ = writeln!(
                s,
                "mixed versions: masters and stores switched between this build and {}",
                previous.display()
            );
        }
        if self.previous_clients {
            let _ = writeln!(
                s,
                "mixed versions: odd-numbered clients run the previous release's client"
            );
        }
        if let Some(bug) = &self.planted_bug {
            let caught = if self.report.total() > 0 {
                "caught"
            } else {
                "NOT caught"
            };
            let _ = writeln!(s, "PLANTED BUG {bug}: {caught}");
        }
        let kinds: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let kinds = if kinds.is_empty() {
            "none".to_string()
        } else {
            kinds.join(", ")
        };
        let _ = writeln!(s, "faults: {kinds} (skipped {})", self.skipped);
        if !self.failovers.is_empty() {
            let _ = writeln!(s, "leader kills: {}", self.failovers.len());
            if let Some((p50, p99, max)) = self.failover_stats() {
                let _ = writeln!(
                    s,
                    "  writes served again after: p50 {p50} ms, p99 {p99} ms, max {max} ms"
                );
            }
            let none = self
                .failovers
                .iter()
                .filter(|f| f.serves_after_ms.is_none())
                .count();
            if none > 0 {
                let _ = writeln!(s, "  {none} kills were followed by no successful write");
            }
        }
        if let Some(a) = self.availability {
            let _ = write!(s, "{a}");
        }
        let _ = writeln!(
            s,
            "masters that stepped down (lost their lease): {}",
            self.step_downs
        );
        let _ = writeln!(
            s,
            "evictions during the campaign: {}",
            self.evictions_possible
        );
        if let Some((demotions, promotions)) = self.tier_moves {
            let _ = writeln!(
                s,
                "tier moves during the campaign: {demotions} demotions, {promotions} promotions"
            );
        }
        if let Some(u) = &self.unsettled {
            let _ = writeln!(s, "the pool did not settle after healing: {u}");
        }
        let _ = writeln!(s, "crashes: {}", self.crashes.len());
        for c in &self.crashes {
            let _ = writeln!(s, "  {c}");
        }
        s.push_str(&checker::render(&self.report, 20));
        let _ = writeln!(s, "\nlogs and histories: {}", self.dir.display());
        s
    }
}

/// Failover times of the leader kills in `events`.
pub fn failovers(events: &[Event]) -> Vec<Failover> {
    let mut invokes: HashMap<u64, (u64, bool)> = HashMap::new();
    let mut writes: Vec<(u64, u64)> = Vec::new();
    for e in events {
        match e {
            Event::Invoke { id, t, op, .. } => {
                invokes.insert(*id, (*t, matches!(op, Op::Put { .. } | Op::Upsert { .. })));
            }
            Event::Complete { id, t, results } => {
                if let Some(&(inv, true)) = invokes.get(id) {
                    if results.iter().any(|r| matches!(r, Outcome::Ok)) {
                        writes.push((inv, *t));
                    }
                }
            }
            _ => {}
        }
    }
    let kills: Vec<(u32, u64, String)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Fault {
                t,
                n,
                phase,
                kind,
                target,
            } if phase == "start" && kind == "kill" && target.ends_with("(leader)") => {
                Some((*n, *t, target.trim_end_matches(" (leader)").to_string()))
            }
            _ => None,
        })
        .collect();
    kills
        .iter()
        .enumerate()
        .map(|(i, (n, t, master))| {
            let next = kills.get(i + 1).map_or(u64::MAX, |k| k.1);
            let served = writes
                .iter()
                .filter(|(inv, done)| *inv >= *t && *done < next)
                .map(|(_, done)| done - t)
                .min();
            Failover {
                n: *n,
                master: master.clone(),
                serves_after_ms: served.map(|d| d / 1_000_000),
            }
        })
        .collect()
}

/// Writes taken through the fault window of `events` (see [`Availability`]).
pub fn availability(events: &[Event]) -> Option<Availability> {
    // Each fault's span and target (an end names no target).
    let mut spans: Vec<(u64, u64, &str)> = Vec::new();
    let mut open: HashMap<u32, (u64, &str)> = HashMap::new();
    let (mut from, mut to) = (u64::MAX, 0);
    for e in events {
        let Event::Fault {
            t,
            n,
            phase,
            target,
            ..
        } = e
        else {
            continue;
        };
        if phase == "start" {
            from = from.min(*t);
            open.insert(*n, (*t, target));
        } else {
            to = to.max(*t);
            if let Some((start, target)) = open.remove(n) {
                spans.push((start, *t, target));
            }
        }
    }
    if from >= to {
        return None;
    }
    spans.extend(
        open.into_values()
            .map(|(start, target)| (start, to, target)),
    );
    let mut writes: HashMap<u64, bool> = HashMap::new();
    let mut done: Vec<u64> = Vec::new();
    for e in events {
        match e {
            Event::Invoke { id, op, .. } => {
                writes.insert(*id, matches!(op, Op::Put { .. } | Op::Upsert { .. }));
            }
            Event::Complete { id, t, results }
                if writes.get(id) == Some(&true)
                    && (from..to).contains(t)
                    && results.iter().any(|r| matches!(r, Outcome::Ok)) =>
            {
                done.push(*t)
            }
            _ => {}
        }
    }
    done.sort_unstable();
    const SEC: u64 = 1_000_000_000;
    let window_s = (to - from) / SEC;
    let mut served = vec![false; window_s as usize];
    for t in &done {
        if let Some(s) = served.get_mut(((t - from) / SEC) as usize) {
            *s = true;
        }
    }
    let edges = std::iter::once(from)
        .chain(done.iter().copied())
        .chain([to]);
    let longest = edges
        .clone()
        .zip(edges.skip(1))
        .map(|(a, b)| b - a)
        .max()
        .unwrap_or(0);
    let mut causes = Causes::default();
    for (i, _) in served.iter().enumerate().filter(|(_, s)| !**s) {
        let a = from + i as u64 * SEC;
        let active = spans
            .iter()
            .filter(|(start, end, _)| *start < a + SEC && *end > a)
            .map(|(_, _, target)| *target);
        causes.count(active);
    }
    Some(Availability {
        window_s,
        seconds_without_write: served.iter().filter(|s| !**s).count() as u64,
        longest_gap_ms: longest / 1_000_000,
        without_write_by_cause: causes,
    })
}

/// What the store-join measurement found.
#[derive(Debug, Clone, Serialize)]
pub struct JoinResult {
    /// The pool's used fraction when the store joined.
    pub fill: f64,
    /// Objects placed on each segment in the window, by name.
    pub placed: BTreeMap<String, u64>,
    /// The new store's share of the objects placed.
    pub share: f64,
    /// Its fair share: one over the number of stores.
    pub fair: f64,
    /// Seconds measured.
    pub window_s: u64,
    /// Objects the pool evicted in the window (placements are counted as
    /// regions gained, which evictions would blur).
    pub evictions: u64,
    /// Violations the checker found meanwhile.
    pub violations: usize,
    /// Where logs and histories are.
    pub dir: PathBuf,
}

impl JoinResult {
    /// The human report.
    pub fn render(&self) -> String {
        let mut s = format!(
            "store join: pool {:.1}% full when store-{} joined; over {} s it took {:.1}% of new objects, {:.2}x its fair share ({:.1}%)\n",
            self.fill * 100.0,
            self.placed.len() - 1,
            self.window_s,
            self.share * 100.0,
            self.share / self.fair,
            self.fair * 100.0
        );
        for (name, n) in &self.placed {
            s.push_str(&format!("  {name}: {n} objects\n"));
        }
        s.push_str(&format!(
            "evictions in the window: {}{}\n",
            self.evictions,
            if self.evictions > 0 {
                " (regions freed blur the count: write less per window)"
            } else {
                ""
            }
        ));
        s.push_str(&format!("checker violations: {}\n", self.violations));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn fault(t: u64, phase: &str) -> Event {
        fault_on(t, phase, 1, "store-0")
    }

    fn fault_on(t: u64, phase: &str, n: u32, target: &str) -> Event {
        Event::Fault {
            t: t * MS,
            n,
            phase: phase.into(),
            kind: "kill".into(),
            target: if phase == "start" {
                target.into()
            } else {
                String::new()
            },
        }
    }

    /// Invoke and completion of operation `id`, done at `done` ms.
    fn call(id: u64, op: Op, done: u64, ok: bool) -> [Event; 2] {
        let outcome = if ok {
            Outcome::Ok
        } else {
            Outcome::Err {
                code: -800,
                msg: "down".into(),
            }
        };
        [
            Event::Invoke {
                id,
                t: done * MS - MS,
                client: "client-0.0".into(),
                op,
            },
            Event::Complete {
                id,
                t: done * MS,
                results: vec![outcome],
            },
        ]
    }

    #[test]
    fn availability_counts_seconds_and_the_longest_gap_of_acknowledged_writes() {
        let put = || Op::Put { items: Vec::new() };
        let mut events = vec![fault(0, "start")];
        events.extend(call(1, put(), 500, true));
        events.extend(call(2, put(), 1_500, true));
        events.extend(call(3, put(), 2_500, false));
        events.extend(call(4, Op::Get { keys: Vec::new() }, 3_000, true));
        events.extend(call(5, Op::Upsert { items: Vec::new() }, 6_200, true));
        events.push(fault(10_000, "end"));
        events.extend(call(6, put(), 10_500, true));
        let a = availability(&events).expect("a fault window");
        assert_eq!(
            a,
            Availability {
                window_s: 10,
                seconds_without_write: 7,
                longest_gap_ms: 4_700,
                without_write_by_cause: Causes {
                    stores: 7,
                    ..Causes::default()
                },
            }
        );
        assert_eq!(availability(&events[1..7]), None, "no faults");
    }

    #[test]
    fn seconds_without_a_write_are_put_down_to_the_most_central_fault() {
        let mut events = vec![
            fault_on(0, "start", 1, "store-1"),
            fault_on(1_500, "start", 2, "master-0 (leader)"),
            fault_on(3_000, "end", 2, ""),
            fault_on(4_000, "end", 1, ""),
            fault_on(5_000, "start", 3, "client-2"),
            fault_on(6_000, "end", 3, ""),
            fault_on(7_000, "start", 4, "split {etcd-0,store-1} from the rest"),
        ];
        // One write in second 8 only; the split never ends: it lasts to the
        // window's end (the last end seen, 9 s).
        events.extend(call(1, Op::Put { items: Vec::new() }, 8_500, true));
        events.push(fault_on(9_000, "end", 9, ""));
        let a = availability(&events).expect("a fault window");
        assert_eq!(a.seconds_without_write, 8);
        assert_eq!(
            a.without_write_by_cause,
            Causes {
                // Seconds 1-2 (the leader), 7 (the split).
                leader_etcd_or_split: 3,
                // Seconds 0 and 3: the store alone.
                stores: 2,
                // Second 5: a client.
                others: 1,
                // Seconds 4 and 6: nothing active.
                none: 2,
            }
        );
    }
}
