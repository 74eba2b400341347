//! The history checker: a pure function from recorded events to a report of
//! rule violations. No I/O, no clocks; unit-tested over hand-made histories,
//! planted violations among them.
//!
//! Each key is a register with write-once `put`, overwriting `upsert` and
//! `remove`. An operation takes effect at one instant between its invoke and
//! its completion; one that failed or never completed *may* take effect at
//! any instant after its invoke (a commit whose answer was lost, a worker
//! killed mid-call). The rules (docs/chaos.md):
//!
//! 1. **Acknowledged writes stay readable** until removed, replaced or
//!    evicted: a read that began after a successful put or upsert finished
//!    returns that value, or one that could legally have replaced it (an
//!    upsert that could come after, a put after a removal that could come
//!    after), or not-found only if a removal could have come after.
//! 2. **No stale reads**: once an upsert or a removal finished, no read that
//!    begins later returns a value written before it began, through cached
//!    locations or otherwise.
//! 3. **No unwritten bytes**: every value read decodes to a version some
//!    write of that key produced, invoked before the read finished.
//! 4. **Clear errors**: every failure carries a code the operation can
//!    meaningfully fail with (API.md) and a message.
//! 5. **Acknowledged writes stay retrievable**: gets that began after a
//!    successful put or upsert finished may fail with transient errors (not
//!    not-found, rule 1's business) for at most a bound, counted only while
//!    no other write or removal of the key could have taken effect, so a
//!    destroyed object is caught even if a later write covers it.
//!
//! Checks only ever flag what no ordering of the operations within their
//! time windows explains, so a violation is a real anomaly, never the
//! checker's guess. Each violation comes with its witnesses (the
//! operations that prove it) and every other operation on the key and
//! fault that overlaps them: the minimal window to read.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use kvpool_proto::Code;
use serde::Serialize;

use crate::history::{Event, Op, Outcome};

/// Never: the end of the window of an operation that may still take effect.
const INF: u64 = u64::MAX;

/// What the checker may assume about the pool.
#[derive(Debug, Clone, Copy)]
pub struct CheckConfig {
    /// The pool evicted objects during the campaign: a missing or
    /// re-created key may be an eviction (reported, not a violation).
    pub evictions_possible: bool,
    /// Rule 5: the longest an acknowledged write may stay unreadable (ns).
    pub unreadable_bound_ns: u64,
}

impl Default for CheckConfig {
    /// No evictions; a 30 s bound: longer than any fault hold (at most 8 s)
    /// plus a store restart and remount, far shorter than a destroyed
    /// object stays unreadable (the rest of the run).
    fn default() -> Self {
        CheckConfig {
            evictions_possible: false,
            unreadable_bound_ns: 30_000_000_000,
        }
    }
}

/// The rules of the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Rule {
    /// Rule 1: an acknowledged write stays readable until removed, replaced or evicted.
    AckedWriteReadable,
    /// Rule 5: an acknowledged write does not stay unreadable past a bound.
    AckedWriteUnreadable,
    /// Rule 2: no read returns a value older than a finished upsert or removal.
    NoStaleRead,
    /// Rule 3: no read returns bytes no write of the key produced.
    NoUnwrittenBytes,
    /// Rule 4: every failure is a clear error code.
    ClearErrors,
}

impl Rule {
    /// Every rule, in report order.
    pub const ALL: [Rule; 5] = [
        Rule::AckedWriteReadable,
        Rule::AckedWriteUnreadable,
        Rule::NoStaleRead,
        Rule::NoUnwrittenBytes,
        Rule::ClearErrors,
    ];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Rule::AckedWriteReadable => "acked-write-readable",
            Rule::AckedWriteUnreadable => "acked-write-unreadable",
            Rule::NoStaleRead => "no-stale-read",
            Rule::NoUnwrittenBytes => "no-unwritten-bytes",
            Rule::ClearErrors => "clear-errors",
        }
    }
}

/// One anomaly, with the operations that prove it.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    /// The rule broken.
    pub rule: Rule,
    /// The key.
    pub key: String,
    /// One sentence on what happened.
    pub what: String,
    /// Reads (or failures) showing the same anomaly.
    pub count: usize,
    /// For rule 1: a later read found the acknowledged value again (it was
    /// unavailable, answered as missing, rather than lost).
    pub came_back: bool,
    /// The window: witnesses first, then the other operations on the key
    /// and the faults that overlap them, each on one line.
    pub window: Vec<String>,
}

/// Calls of one kind and how they ended.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OpCount {
    /// Every key answered without error.
    pub ok: u64,
    /// At least one key failed.
    pub failed: u64,
    /// Never completed (the worker was killed, or the campaign ended).
    pub unknown: u64,
}

/// What the checker found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Calls per operation name.
    pub ops: BTreeMap<String, OpCount>,
    /// Keys read (per key of every completed read, exist and not-found removal).
    pub observations: u64,
    /// Failures per error code.
    pub errors: BTreeMap<i32, u64>,
    /// Distinct violations per rule (every rule listed, zeros included).
    pub counts: BTreeMap<&'static str, usize>,
    /// Rule-1 violations where the value was read again later.
    pub came_back: usize,
    /// The violations, ordered by rule then time.
    pub violations: Vec<Violation>,
}

impl Report {
    /// Total violations over every rule.
    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }
}

/// An operation as the checker sees it.
struct OpRec<'a> {
    client: &'a str,
    inv: u64,
    /// `None`: never completed.
    done: Option<u64>,
    op: &'a Op,
    results: Option<&'a [Outcome]>,
}

/// A write of one key.
#[derive(Clone, Copy)]
struct KWrite {
    version: u64,
    upsert: bool,
    inv: u64,
    /// Last instant it may take effect: its completion if it succeeded, else never-ending.
    end: u64,
    /// Its completion if it succeeded (a definite effect).
    ok_done: Option<u64>,
    op: usize,
}

/// A removal of one key that may have taken effect.
#[derive(Clone, Copy)]
struct KRemove {
    inv: u64,
    end: u64,
    ok_done: Option<u64>,
    op: usize,
}

/// What a read saw.
#[derive(Clone, Debug)]
enum Obs {
    Version(u64),
    Absent,
    Present,
    Corrupt(String),
}

#[derive(Clone)]
struct KRead {
    inv: u64,
    done: u64,
    obs: Obs,
    op: usize,
}

/// A completed get of one key, for rule 5.
#[derive(Clone, Copy)]
struct KGet {
    inv: u64,
    done: u64,
    /// Its error code, unless it answered (a value, bytes, or not-found).
    failed: Option<i32>,
    op: usize,
}

#[derive(Default)]
struct KeyHistory {
    writes: Vec<KWrite>,
    removes: Vec<KRemove>,
    reads: Vec<KRead>,
    /// In invoke order, as `ops` is.
    gets: Vec<KGet>,
}

/// Whether `code` is one `op` can meaningfully fail with.
pub fn expected_error(op: &Op, code: i32) -> bool {
    let c = Code::from_i32(code);
    if c.as_i32() != code {
        return false;
    }
    let any = matches!(
        c,
        Code::RpcFail
            | Code::RpcTimeout
            | Code::TransferFail
            | Code::UnavailableInCurrentStatus
            | Code::ClientNotFound
            | Code::EtcdOperationError
    );
    any || match op {
        Op::Put { .. } | Op::Upsert { .. } => {
            matches!(c, Code::NoAvailableHandle | Code::ReplicaIsNotReady)
        }
        Op::Get { .. } => matches!(
            c,
            Code::ObjectNotFound
                | Code::LeaseExpired
                | Code::ChecksumMismatch
                | Code::ReplicaIsNotReady
        ),
        Op::Remove { .. } => matches!(c, Code::ObjectNotFound | Code::ObjectHasLease),
        Op::Exist { .. } => false,
    }
}

/// Checks `events` (any order) against the rules.
pub fn check(events: &[Event], cfg: CheckConfig) -> Report {
    let mut events: Vec<&Event> = events.iter().collect();
    events.sort_by_key(|e| e.t());
    let t0 = events.first().map_or(0, |e| e.t());
    let mut ops: Vec<OpRec> = Vec::new();
    let mut by_id: HashMap<u64, usize> = HashMap::new();
    let mut faults: Vec<(u64, u64, String)> = Vec::new();
    let mut open_faults: HashMap<u32, (u64, String)> = HashMap::new();
    for e in &events {
        match e {
            Event::Invoke { id, t, client, op } => {
                by_id.insert(*id, ops.len());
                ops.push(OpRec {
                    client,
                    inv: *t,
                    done: None,
                    op,
                    results: None,
                });
            }
            Event::Complete { id, t, results } => {
                if let Some(&i) = by_id.get(id) {
                    ops[i].done = Some(*t);
                    ops[i].results = Some(results);
                }
            }
            Event::Fault {
                t,
                n,
                phase,
                kind,
                target,
            } => {
                if phase == "start" {
                    open_faults.insert(*n, (*t, format!("fault {n}: {kind} {target}")));
                } else if let Some((s, what)) = open_faults.remove(n) {
                    faults.push((s, *t, what));
                }
            }
            Event::Mark { .. } => {}
        }
    }
    for (_, (s, what)) in open_faults {
        faults.push((s, INF, what));
    }

    let mut report = Report::default();
    let mut keys: BTreeMap<&str, KeyHistory> = BTreeMap::new();
    let mut found: Vec<Violation> = Vec::new();
    let mut seen: HashMap<(Rule, String, String), usize> = HashMap::new();
    let mut flag = |v: Violation, dedup: String, found: &mut Vec<Violation>| match seen.get(&(
        v.rule,
        v.key.clone(),
        dedup.clone(),
    )) {
        Some(&i) => found[i].count += 1,
        None => {
            seen.insert((v.rule, v.key.clone(), dedup), found.len());
            found.push(v);
        }
    };

    for (i, o) in ops.iter().enumerate() {
        let count = report.ops.entry(o.op.name().to_string()).or_default();
        match o.results {
            None => count.unknown += 1,
            Some(rs) if rs.iter().all(|r| !matches!(r, Outcome::Err { .. })) => count.ok += 1,
            Some(_) => count.failed += 1,
        }
        let keys_of = o.op.keys();
        for (k, key) in keys_of.iter().enumerate() {
            let r = o.results.and_then(|rs| rs.get(k));
            if let Some(Outcome::Err { code, msg }) = r {
                *report.errors.entry(*code).or_default() += 1;
                if !expected_error(o.op, *code) || msg.trim().is_empty() {
                    let what = format!(
                        "{} failed with {} ({code}){}",
                        o.op.name(),
                        Code::from_i32(*code).name(),
                        if msg.trim().is_empty() {
                            ", no message".to_string()
                        } else {
                            format!(": {msg}")
                        }
                    );
                    let v = Violation {
                        rule: Rule::ClearErrors,
                        key: key.to_string(),
                        what,
                        count: 1,
                        came_back: false,
                        window: vec![line(&ops, i, t0)],
                    };
                    flag(v, format!("{}:{code}", o.op.name()), &mut found);
                }
            }
            let h = keys.entry(key).or_default();
            let done = o.done;
            match o.op {
                Op::Put { items } | Op::Upsert { items } => {
                    let ok = matches!(r, Some(Outcome::Ok));
                    h.writes.push(KWrite {
                        version: items[k].version,
                        upsert: matches!(o.op, Op::Upsert { .. }),
                        inv: o.inv,
                        end: if ok { done.unwrap_or(INF) } else { INF },
                        ok_done: if ok { done } else { None },
                        op: i,
                    });
                }
                Op::Remove { .. } => match r {
                    Some(Outcome::Ok) => h.removes.push(KRemove {
                        inv: o.inv,
                        end: done.unwrap_or(INF),
                        ok_done: done,
                        op: i,
                    }),
                    // Not found, or under a read lease: no removal by this
                    // attempt, but the client retries transient failures,
                    // and an earlier attempt whose answer was lost may have
                    // removed the key: a removal that may have happened
                    // within the call.
                    Some(Outcome::Err { code, .. })
                        if *code == Code::ObjectNotFound.as_i32()
                            || *code == Code::ObjectHasLease.as_i32() =>
                    {
                        h.removes.push(KRemove {
                            inv: o.inv,
                            end: done.unwrap_or(INF),
                            ok_done: None,
                            op: i,
                        })
                    }
                    _ => h.removes.push(KRemove {
                        inv: o.inv,
                        end: INF,
                        ok_done: None,
                        op: i,
                    }),
                },
                Op::Get { .. } | Op::Exist { .. } => {
                    let obs = match r {
                        Some(Outcome::Value { version }) => Some(Obs::Version(*version)),
                        Some(Outcome::Corrupt { why }) => Some(Obs::Corrupt(why.clone())),
                        Some(Outcome::Exists { present: true }) => Some(Obs::Present),
                        Some(Outcome::Exists { present: false }) => Some(Obs::Absent),
                        Some(Outcome::Err { code, .. })
                            if *code == Code::ObjectNotFound.as_i32() =>
                        {
                            Some(Obs::Absent)
                        }
                        _ => None,
                    };
                    if let (Some(obs), Some(done)) = (obs, done) {
                        h.reads.push(KRead {
                            inv: o.inv,
                            done,
                            obs,
                            op: i,
                        });
                    }
                    // An exist answer says nothing of whether the bytes can
                    // be read back, so only gets count for rule 5.
                    if let (Op::Get { .. }, Some(r), Some(done)) = (o.op, r, done) {
                        let failed = match r {
                            Outcome::Err { code, .. } if *code != Code::ObjectNotFound.as_i32() => {
                                Some(*code)
                            }
                            _ => None,
                        };
                        h.gets.push(KGet {
                            inv: o.inv,
                            done,
                            failed,
                            op: i,
                        });
                    }
                }
            }
        }
    }

    for (key, h) in &keys {
        report.observations += h.reads.len() as u64;
        check_key(key, h, cfg, &ops, &faults, t0, &mut |v, d| {
            flag(v, d, &mut found)
        });
    }
    found.sort_by_key(|v| v.rule);
    for r in Rule::ALL {
        report
            .counts
            .insert(r.name(), found.iter().filter(|v| v.rule == r).count());
    }
    report.came_back = found.iter().filter(|v| v.came_back).count();
    report.violations = found;
    report
}

/// A removal that may lie after an operation that began at `after_inv` and
/// before an instant `before`.
fn removal_between(removes: &[KRemove], after_inv: u64, before: u64) -> bool {
    removes.iter().any(|r| r.end > after_inv && r.inv < before)
}

fn check_key(
    key: &str,
    h: &KeyHistory,
    cfg: CheckConfig,
    ops: &[OpRec],
    faults: &[(u64, u64, String)],
    t0: u64,
    flag: &mut dyn FnMut(Violation, String),
) {
    let writer: HashMap<u64, &KWrite> = h.writes.iter().map(|w| (w.version, w)).collect();
    // Can write `w` take effect after the definite operation that began at
    // `o_inv` (a write when `o_is_write`), and leave its value in place?
    let installs_after = |w: &KWrite, o_inv: u64, o_is_write: bool| -> bool {
        if w.end <= o_inv {
            return false;
        }
        // A put installs only where the key is absent: after a removal, or
        // an eviction, that can come after the other write.
        w.upsert
            || !o_is_write
            || cfg.evictions_possible
            || removal_between(&h.removes, o_inv, w.end)
    };
    let make =
        |rule: Rule, what: String, witnesses: &[usize], r: &KRead, came_back: bool| Violation {
            rule,
            key: key.to_string(),
            what,
            count: 1,
            came_back,
            window: window(ops, faults, key, witnesses, r.op, t0),
        };
    let after = |v: u64| -> Vec<&KRead> { h.reads.iter().filter(|r| r.inv > v).collect() };

    for r in &h.reads {
        match &r.obs {
            Obs::Corrupt(why) => flag(
                make(
                    Rule::NoUnwrittenBytes,
                    format!("read returned bytes no write produced: {why}"),
                    &[],
                    r,
                    false,
                ),
                format!("corrupt@{}", r.op),
            ),
            Obs::Version(v) => {
                let Some(w) = writer.get(v) else {
                    flag(
                        make(
                            Rule::NoUnwrittenBytes,
                            format!("read returned version {v:#x}, never written to this key"),
                            &[],
                            r,
                            false,
                        ),
                        format!("unwritten {v}"),
                    );
                    continue;
                };
                if w.inv > r.done {
                    flag(
                        make(
                            Rule::NoUnwrittenBytes,
                            format!("read returned version {v:#x} before its write began"),
                            &[w.op],
                            r,
                            false,
                        ),
                        format!("future {v}"),
                    );
                    continue;
                }
                // Of the operations this read contradicts, report the one
                // closest to it: the smallest window, and one violation per
                // stale value or lost write however many reads show it.
                let mut stale: Option<(u64, usize, String)> = None;
                let mut lost: Option<(u64, &KWrite)> = None;
                for o in h.writes.iter().filter(|o| o.op != w.op) {
                    let Some(o_done) = o.ok_done.filter(|&d| d < r.inv) else {
                        continue;
                    };
                    let pre_existing = !o.upsert && w.inv < o_done;
                    if installs_after(w, o.inv, true) || pre_existing {
                        continue;
                    }
                    if o.upsert && w.end < o.inv {
                        if stale.as_ref().is_none_or(|s| s.0 < o_done) {
                            let what = format!(
                                "read version {v:#x} after upsert {:#x} had replaced it",
                                o.version
                            );
                            stale = Some((o_done, o.op, what));
                        }
                    } else if lost.is_none_or(|l| l.0 < o_done) {
                        lost = Some((o_done, o));
                    }
                }
                for o in &h.removes {
                    let Some(o_done) = o.ok_done.filter(|&d| d < r.inv) else {
                        continue;
                    };
                    if !installs_after(w, o.inv, false)
                        && stale.as_ref().is_none_or(|s| s.0 < o_done)
                    {
                        let what = format!("read version {v:#x} after a removal had finished");
                        stale = Some((o_done, o.op, what));
                    }
                }
                if let Some((_, op, what)) = stale {
                    flag(
                        make(Rule::NoStaleRead, what, &[op, w.op], r, false),
                        format!("stale v{v}"),
                    );
                } else if let Some((_, o)) = lost {
                    let what = format!(
                        "acknowledged {} {:#x} lost: read version {v:#x}, which cannot replace it",
                        if o.upsert { "upsert" } else { "put" },
                        o.version
                    );
                    let back = after(r.done)
                        .iter()
                        .any(|l| matches!(l.obs, Obs::Version(x) if x == o.version));
                    flag(
                        make(Rule::AckedWriteReadable, what, &[o.op, w.op], r, back),
                        format!("lost w{}", o.op),
                    );
                }
            }
            Obs::Absent => {
                if cfg.evictions_possible {
                    continue;
                }
                let mut lost: Option<(u64, &KWrite)> = None;
                for o in &h.writes {
                    let Some(o_done) = o.ok_done.filter(|&d| d < r.inv) else {
                        continue;
                    };
                    if removal_between(&h.removes, o.inv, r.done) {
                        continue;
                    }
                    if lost.is_none_or(|l| l.0 < o_done) {
                        lost = Some((o_done, o));
                    }
                }
                if let Some((_, o)) = lost {
                    let back = after(r.done)
                        .iter()
                        .any(|l| matches!(l.obs, Obs::Version(x) if x == o.version));
                    flag(
                        make(
                            Rule::AckedWriteReadable,
                            format!(
                                "acknowledged {} {:#x} not found, and nothing removed it",
                                if o.upsert { "upsert" } else { "put" },
                                o.version
                            ),
                            &[o.op],
                            r,
                            back,
                        ),
                        format!("lost w{}", o.op),
                    );
                }
            }
            Obs::Present => {
                if !h.writes.iter().any(|w| w.inv < r.done) {
                    flag(
                        make(
                            Rule::NoUnwrittenBytes,
                            "exist answered true for a key never written".into(),
                            &[],
                            r,
                            false,
                        ),
                        "present-unwritten".into(),
                    );
                    continue;
                }
                for o in &h.removes {
                    if o.ok_done.is_none_or(|d| d >= r.inv) {
                        continue;
                    }
                    if !h.writes.iter().any(|w| w.end > o.inv && w.inv < r.done) {
                        flag(
                            make(
                                Rule::NoStaleRead,
                                "exist answered true after a removal, with no write since".into(),
                                &[o.op],
                                r,
                                false,
                            ),
                            format!("rm{} present", o.op),
                        );
                    }
                }
            }
        }
    }
    check_unreadable(key, h, cfg, ops, faults, t0, flag);
}

/// Rule 5: a run of failing gets that outlasts the bound after a write was
/// acknowledged, counted only until another write or removal could have
/// replaced it (a failed replacement may leave the key broken; an
/// acknowledged one is held to the rule in its turn).
fn check_unreadable(
    key: &str,
    h: &KeyHistory,
    cfg: CheckConfig,
    ops: &[OpRec],
    faults: &[(u64, u64, String)],
    t0: u64,
    flag: &mut dyn FnMut(Violation, String),
) {
    for run in h.gets.split(|g| g.failed.is_none()) {
        // Several writes may be outlasted by one run: blame the latest
        // acknowledged, the value the gets should have returned.
        let mut blamed: Option<(&KWrite, &[KGet], u64)> = None;
        for w in &h.writes {
            let Some(w_done) = w.ok_done else {
                continue;
            };
            let gets = &run[run.partition_point(|g| g.inv <= w_done)..];
            let (Some(first), Some(last_done)) = (gets.first(), gets.iter().map(|g| g.done).max())
            else {
                continue;
            };
            // Writes or removals invoked before `w` that may land late are
            // no excuse: a correct pool would still answer with a value or
            // not-found, and an old failed write would otherwise excuse the
            // key for the rest of the run.
            let covered = h
                .writes
                .iter()
                .filter(|o| o.op != w.op)
                .map(|o| (o.inv, o.end))
                .chain(h.removes.iter().map(|o| (o.inv, o.end)))
                .filter(|&(inv, end)| end > w_done && inv > w.inv)
                .map(|(inv, _)| inv)
                .min()
                .unwrap_or(INF);
            let until = last_done.min(covered);
            if first.inv < covered
                && until - first.inv >= cfg.unreadable_bound_ns
                && blamed.is_none_or(|b| b.0.ok_done < w.ok_done)
            {
                blamed = Some((w, gets, until));
            }
        }
        let Some((w, gets, until)) = blamed else {
            continue;
        };
        let first = &gets[0];
        let last = gets.iter().max_by_key(|g| g.done).unwrap_or(first);
        let mut codes: Vec<&str> = Vec::new();
        for code in gets.iter().filter_map(|g| g.failed) {
            let name = Code::from_i32(code).name();
            if !codes.contains(&name) {
                codes.push(name);
            }
        }
        let what = format!(
            "acknowledged {} {:#x} unreadable for {:.1}s while nothing could replace or remove it: {} gets failed ({})",
            if w.upsert { "upsert" } else { "put" },
            w.version,
            (until - first.inv) as f64 / 1e9,
            gets.len(),
            codes.join(", ")
        );
        let witnesses: &[usize] = if last.op == first.op {
            &[w.op]
        } else {
            &[w.op, first.op]
        };
        flag(
            Violation {
                rule: Rule::AckedWriteUnreadable,
                key: key.to_string(),
                what,
                count: gets.len(),
                came_back: false,
                window: window(ops, faults, key, witnesses, last.op, t0),
            },
            format!("unreadable g{}", first.op),
        );
    }
}

/// Seconds since the campaign's first event, for reports.
fn rel(t: u64, t0: u64) -> String {
    if t == INF {
        return "never".into();
    }
    format!("{:.3}s", t.saturating_sub(t0) as f64 / 1e9)
}

/// One operation on one line: its window, client, call, and answers.
fn line(ops: &[OpRec], i: usize, t0: u64) -> String {
    let o = &ops[i];
    let mut s = format!(
        "[{} .. {}] {} {}",
        rel(o.inv, t0),
        o.done.map_or("never".into(), |d| rel(d, t0)),
        o.client,
        o.op.name()
    );
    let keys = o.op.keys();
    for (k, key) in keys.iter().enumerate() {
        let _ = write!(s, " {key}");
        match o.op {
            Op::Put { items } | Op::Upsert { items } => {
                let _ = write!(s, "={:#x}", items[k].version);
            }
            Op::Remove { force: true, .. } => s.push_str("(force)"),
            _ => {}
        }
        let r = o.results.and_then(|rs| rs.get(k));
        let _ = match r {
            None => write!(s, " -> ?"),
            Some(Outcome::Ok) => write!(s, " -> ok"),
            Some(Outcome::Err { code, .. }) => write!(s, " -> {}", Code::from_i32(*code).name()),
            Some(Outcome::Value { version }) => write!(s, " -> {version:#x}"),
            Some(Outcome::Corrupt { why }) => write!(s, " -> CORRUPT ({why})"),
            Some(Outcome::Exists { present }) => write!(s, " -> exists={present}"),
        };
        if keys.len() > 1 {
            s.push(';');
        }
    }
    s
}

/// The minimal window of a violation: the witnesses and the read, then
/// every other operation on `key` and every fault overlapping their span.
fn window(
    ops: &[OpRec],
    faults: &[(u64, u64, String)],
    key: &str,
    witnesses: &[usize],
    read: usize,
    t0: u64,
) -> Vec<String> {
    let mut involved: Vec<usize> = witnesses.to_vec();
    involved.push(read);
    let from = involved.iter().map(|&i| ops[i].inv).min().unwrap_or(0);
    let to = ops[read].done.unwrap_or(INF);
    let mut out: Vec<String> = involved
        .iter()
        .map(|&i| format!("witness {}", line(ops, i, t0)))
        .collect();
    let mut context = 0;
    for (i, o) in ops.iter().enumerate() {
        if involved.contains(&i) || !o.op.keys().contains(&key) {
            continue;
        }
        if o.inv <= to && o.done.unwrap_or(INF) >= from {
            context += 1;
            if context <= 40 {
                out.push(format!("        {}", line(ops, i, t0)));
            }
        }
    }
    if context > 40 {
        out.push(format!(
            "        ... {} more operations on {key}",
            context - 40
        ));
    }
    for (s, e, what) in faults {
        if *s <= to && *e >= from {
            out.push(format!(
                "fault   [{} .. {}] {what}",
                rel(*s, t0),
                rel(*e, t0)
            ));
        }
    }
    out
}

/// The report as text: counts per rule, then each violation's window.
pub fn render(report: &Report, max_violations: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "operations:");
    for (name, c) in &report.ops {
        let _ = writeln!(
            s,
            "  {name:<13} ok {:>7}  failed {:>6}  unknown {:>4}",
            c.ok, c.failed, c.unknown
        );
    }
    let _ = writeln!(s, "keys observed by reads: {}", report.observations);
    if !report.errors.is_empty() {
        let _ = writeln!(s, "failures by code:");
        for (code, n) in &report.errors {
            let _ = writeln!(s, "  {:<30} {n}", Code::from_i32(*code).to_string());
        }
    }
    let _ = writeln!(s, "violations per rule:");
    for r in Rule::ALL {
        let _ = writeln!(s, "  {:<22} {}", r.name(), report.counts[r.name()]);
    }
    if report.came_back > 0 {
        let _ = writeln!(
            s,
            "  ({} of the rule-1 violations were read again later: answered missing, not lost)",
            report.came_back
        );
    }
    for v in report.violations.iter().take(max_violations) {
        let _ = writeln!(
            s,
            "\n{} on {} ({} time{}): {}",
            v.rule.name(),
            v.key,
            v.count,
            if v.count == 1 { "" } else { "s" },
            v.what
        );
        for l in &v.window {
            let _ = writeln!(s, "  {l}");
        }
    }
    if report.violations.len() > max_violations {
        let _ = writeln!(
            s,
            "\n... {} more violations",
            report.violations.len() - max_violations
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Written;

    /// Builds a history of calls on one clock, in the order written.
    #[derive(Default)]
    struct H {
        events: Vec<Event>,
        next: u64,
    }

    const NF: i32 = -704;
    const TRANSFER_FAIL: i32 = -800;
    const CHECKSUM_MISMATCH: i32 = -801;
    const RPC_TIMEOUT: i32 = -901;
    /// A second, in the histories' nanoseconds.
    const S: u64 = 1_000_000_000;

    impl H {
        fn call(
            &mut self,
            client: &str,
            inv: u64,
            done: Option<u64>,
            op: Op,
            results: Vec<Outcome>,
        ) -> u64 {
            self.next += 1;
            let id = self.next;
            self.events.push(Event::Invoke {
                id,
                t: inv,
                client: client.into(),
                op,
            });
            if let Some(t) = done {
                self.events.push(Event::Complete { id, t, results });
            }
            id
        }
        fn put(&mut self, inv: u64, done: u64, key: &str, v: u64, r: Outcome) {
            let op = Op::Put {
                items: vec![Written {
                    key: key.into(),
                    version: v,
                    len: 64,
                }],
            };
            self.call("w", inv, Some(done), op, vec![r]);
        }
        fn upsert(&mut self, inv: u64, done: Option<u64>, key: &str, v: u64, r: Outcome) {
            let op = Op::Upsert {
                items: vec![Written {
                    key: key.into(),
                    version: v,
                    len: 64,
                }],
            };
            self.call("w", inv, done, op, vec![r]);
        }
        fn get(&mut self, inv: u64, done: u64, key: &str, r: Outcome) {
            let op = Op::Get {
                keys: vec![key.into()],
            };
            self.call("r", inv, Some(done), op, vec![r]);
        }
        fn remove(&mut self, inv: u64, done: Option<u64>, key: &str, r: Outcome) {
            let op = Op::Remove {
                keys: vec![key.into()],
                force: false,
            };
            self.call("w", inv, done, op, vec![r]);
        }
        /// Gets of `key` once a second from `from` through `to` seconds,
        /// failing with transfer and checksum errors by turns; how many.
        fn failing_gets(&mut self, from: u64, to: u64, key: &str) -> usize {
            for t in from..=to {
                let code = if t % 2 == 0 {
                    TRANSFER_FAIL
                } else {
                    CHECKSUM_MISMATCH
                };
                self.get(t * S, t * S + S / 10, key, err(code));
            }
            (to - from + 1) as usize
        }
        fn check(&self) -> Report {
            check(&self.events, CheckConfig::default())
        }
    }

    fn val(v: u64) -> Outcome {
        Outcome::Value { version: v }
    }
    fn err(code: i32) -> Outcome {
        Outcome::Err {
            code,
            msg: "m".into(),
        }
    }

    fn counts(r: &Report) -> [usize; 5] {
        Rule::ALL.map(|x| r.counts[x.name()])
    }

    #[test]
    fn a_clean_history_has_no_violations() {
        let mut h = H::default();
        h.put(0, 10, "k", 1, Outcome::Ok);
        h.get(11, 12, "k", val(1));
        h.upsert(13, Some(20), "k", 2, Outcome::Ok);
        // Concurrent with the upsert: either value.
        h.get(14, 15, "k", val(1));
        h.get(16, 17, "k", val(2));
        h.get(21, 22, "k", val(2));
        // A write-once put of an existing key is a no-op success.
        h.put(23, 24, "k", 3, Outcome::Ok);
        h.get(25, 26, "k", val(2));
        h.remove(27, Some(28), "k", Outcome::Ok);
        h.get(29, 30, "k", err(NF));
        // Now absent: a put installs a new value.
        h.put(31, 32, "k", 4, Outcome::Ok);
        h.get(33, 34, "k", val(4));
        let r = h.check();
        assert_eq!(r.total(), 0, "{}", render(&r, 10));
        assert_eq!(r.observations, 7);
        assert_eq!(r.ops["put"].ok, 3);
    }

    #[test]
    fn a_stale_read_after_an_upsert_is_caught_with_its_window() {
        let mut h = H::default();
        h.put(0, 10, "k", 1, Outcome::Ok);
        h.upsert(20, Some(30), "k", 2, Outcome::Ok);
        h.get(31, 32, "k", val(1));
        h.get(40, 41, "other", err(NF));
        let r = h.check();
        assert_eq!(counts(&r), [0, 0, 1, 0, 0], "{}", render(&r, 10));
        let v = &r.violations[0];
        assert_eq!(v.key, "k");
        assert!(v.what.contains("after upsert 0x2"), "{}", v.what);
        let text = v.window.join("\n");
        assert!(text.contains("w upsert k=0x2 -> ok"), "{text}");
        assert!(text.contains("r get k -> 0x1"), "{text}");
        assert!(!text.contains("other"), "{text}");
    }

    #[test]
    fn a_read_of_a_removed_value_is_stale() {
        let mut h = H::default();
        h.upsert(0, Some(10), "k", 1, Outcome::Ok);
        h.remove(20, Some(30), "k", Outcome::Ok);
        h.get(31, 32, "k", val(1));
        let op = Op::Exist {
            keys: vec!["k".into()],
        };
        h.call(
            "r",
            33,
            Some(34),
            op,
            vec![Outcome::Exists { present: true }],
        );
        let r = h.check();
        assert_eq!(counts(&r), [0, 0, 2, 0, 0], "{}", render(&r, 10));
    }

    #[test]
    fn a_lost_put_is_caught_and_one_that_comes_back_is_marked() {
        let mut h = H::default();
        h.put(0, 10, "lost", 1, Outcome::Ok);
        h.get(20, 21, "lost", err(NF));
        h.get(22, 23, "lost", err(NF));
        h.put(0, 10, "back", 2, Outcome::Ok);
        h.get(20, 21, "back", err(NF));
        h.get(30, 31, "back", val(2));
        let r = h.check();
        assert_eq!(counts(&r), [2, 0, 0, 0, 0], "{}", render(&r, 10));
        let lost = r.violations.iter().find(|v| v.key == "lost").unwrap();
        assert_eq!((lost.count, lost.came_back), (2, false));
        let back = r.violations.iter().find(|v| v.key == "back").unwrap();
        assert!(back.came_back);
        assert_eq!(r.came_back, 1);
    }

    #[test]
    fn a_second_put_that_replaced_an_acknowledged_one_breaks_write_once() {
        let mut h = H::default();
        h.put(0, 10, "k", 1, Outcome::Ok);
        h.put(20, 30, "k", 2, Outcome::Ok);
        h.get(31, 32, "k", val(2));
        let r = h.check();
        assert_eq!(counts(&r), [1, 0, 0, 0, 0], "{}", render(&r, 10));
        assert!(r.violations[0].what.contains("put 0x1 lost"));
    }

    #[test]
    fn a_removal_that_may_have_happened_explains_a_miss_and_a_new_put() {
        let mut h = H::default();
        h.put(0, 10, "k", 1, Outcome::Ok);
        // Timed out: may have removed the key at any time after 15.
        h.remove(15, Some(16), "k", err(-901));
        h.put(20, 30, "k", 2, Outcome::Ok);
        h.get(31, 32, "k", val(2));
        h.put(0, 10, "j", 3, Outcome::Ok);
        h.remove(15, None, "j", Outcome::Ok);
        h.get(31, 32, "j", err(NF));
        let r = h.check();
        assert_eq!(r.total(), 0, "{}", render(&r, 10));
    }

    #[test]
    fn a_removal_answered_not_found_may_have_removed_on_an_earlier_attempt() {
        let mut h = H::default();
        h.upsert(0, Some(10), "k", 1, Outcome::Ok);
        // Its first attempt removed the key; the retry found nothing.
        h.remove(20, Some(30), "k", err(NF));
        h.get(40, 41, "k", err(NF));
        let r = h.check();
        assert_eq!(r.total(), 0, "{}", render(&r, 10));
        // But not after the call: a miss later still needs a removal.
        let mut h = H::default();
        h.upsert(0, Some(10), "k", 1, Outcome::Ok);
        h.remove(20, Some(30), "k", err(NF));
        h.upsert(31, Some(35), "k", 2, Outcome::Ok);
        h.get(40, 41, "k", err(NF));
        assert_eq!(counts(&h.check()), [1, 0, 0, 0, 0]);
    }

    #[test]
    fn an_unfinished_upsert_may_land_late_but_a_finished_one_may_not() {
        let mut h = H::default();
        h.put(0, 10, "k", 1, Outcome::Ok);
        // Never completed: may take effect long after.
        h.upsert(11, None, "k", 2, Outcome::Ok);
        h.upsert(20, Some(30), "k", 3, Outcome::Ok);
        h.get(100, 101, "k", val(2));
        // A failed upsert too.
        h.upsert(102, Some(103), "k", 4, err(-1010));
        h.get(200, 201, "k", val(4));
        let r = h.check();
        assert_eq!(r.total(), 0, "{}", render(&r, 10));
        assert_eq!(r.ops["upsert"].unknown, 1);

        let mut h = H::default();
        h.upsert(0, Some(10), "k", 2, Outcome::Ok);
        h.upsert(20, Some(30), "k", 3, Outcome::Ok);
        h.get(100, 101, "k", val(2));
        assert_eq!(counts(&h.check()), [0, 0, 1, 0, 0]);
    }

    #[test]
    fn unwritten_corrupt_and_future_values_are_caught() {
        let mut h = H::default();
        h.get(
            0,
            1,
            "k",
            Outcome::Corrupt {
                why: "no magic".into(),
            },
        );
        h.get(2, 3, "k", val(99));
        h.get(4, 5, "k", val(7));
        h.put(10, 20, "k", 7, Outcome::Ok);
        let op = Op::Exist {
            keys: vec!["never".into()],
        };
        h.call("r", 6, Some(7), op, vec![Outcome::Exists { present: true }]);
        let r = h.check();
        assert_eq!(counts(&r), [0, 0, 0, 4, 0], "{}", render(&r, 10));
    }

    #[test]
    fn unclear_errors_are_caught_and_expected_ones_are_not() {
        let mut h = H::default();
        h.get(0, 1, "k", err(NF));
        h.get(0, 1, "k", err(-1010));
        h.remove(0, Some(1), "k", err(-706));
        h.put(0, 1, "k", 1, err(-1));
        h.put(0, 1, "k", 2, err(-1100));
        h.put(0, 1, "k", 3, err(-12345));
        h.get(
            0,
            1,
            "k",
            Outcome::Err {
                code: -900,
                msg: " ".into(),
            },
        );
        let r = h.check();
        assert_eq!(counts(&r), [0, 0, 0, 0, 4], "{}", render(&r, 10));
        assert_eq!(r.errors[&-704], 1);
    }

    #[test]
    fn reported_evictions_excuse_misses_but_not_stale_reads() {
        let mut h = H::default();
        h.put(0, 10, "k", 1, Outcome::Ok);
        h.get(20, 21, "k", err(NF));
        h.put(0, 10, "j", 1, Outcome::Ok);
        h.upsert(20, Some(30), "j", 2, Outcome::Ok);
        h.get(40, 41, "j", val(1));
        let cfg = CheckConfig {
            evictions_possible: true,
            ..CheckConfig::default()
        };
        let r = check(&h.events, cfg);
        assert_eq!(counts(&r), [0, 0, 1, 0, 0], "{}", render(&r, 10));
    }

    #[test]
    fn faults_overlapping_a_violation_are_in_its_window() {
        let mut h = H::default();
        h.upsert(0, Some(10), "k", 1, Outcome::Ok);
        h.upsert(20, Some(30), "k", 2, Outcome::Ok);
        h.events.push(Event::Fault {
            t: 25,
            n: 3,
            phase: "start".into(),
            kind: "split".into(),
            target: "a|b".into(),
        });
        h.events.push(Event::Fault {
            t: 45,
            n: 3,
            phase: "end".into(),
            kind: "split".into(),
            target: "a|b".into(),
        });
        h.events.push(Event::Fault {
            t: 1000,
            n: 4,
            phase: "start".into(),
            kind: "kill".into(),
            target: "later".into(),
        });
        h.get(31, 32, "k", val(1));
        let r = h.check();
        let text = r.violations[0].window.join("\n");
        assert!(text.contains("fault 3: split a|b"), "{text}");
        assert!(!text.contains("later"), "{text}");
    }

    #[test]
    fn an_acked_write_unreadable_past_the_bound_is_caught_once() {
        assert_eq!(CheckConfig::default().unreadable_bound_ns, 30 * S);
        let mut h = H::default();
        h.put(0, 10 * S, "k", 1, Outcome::Ok);
        let n = h.failing_gets(11, 51, "k");
        // Neither an exist answer nor a get that never answered ends the run.
        let op = Op::Exist {
            keys: vec!["k".into()],
        };
        h.call(
            "r",
            30 * S + 1,
            Some(30 * S + 2),
            op,
            vec![Outcome::Exists { present: true }],
        );
        let op = Op::Get {
            keys: vec!["k".into()],
        };
        h.call("r", 31 * S + 1, None, op, vec![]);
        let r = h.check();
        assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
        let v = &r.violations[0];
        assert_eq!((v.key.as_str(), v.count, v.came_back), ("k", n, false));
        assert!(
            v.what.contains("put 0x1 unreadable for 40.1s"),
            "{}",
            v.what
        );
        assert!(
            v.what.contains("(CHECKSUM_MISMATCH, TRANSFER_FAIL)"),
            "{}",
            v.what
        );
        let text = v.window.join("\n");
        assert!(
            text.contains("witness [0.000s .. 10.000s] w put k=0x1 -> ok"),
            "{text}"
        );
        assert!(
            text.contains("witness [11.000s .. 11.100s] r get k -> CHECKSUM_MISMATCH"),
            "{text}"
        );
        assert!(
            text.contains("witness [51.000s .. 51.100s] r get k -> CHECKSUM_MISMATCH"),
            "{text}"
        );
        assert!(render(&r, 10).contains("acked-write-unreadable on k (41 times)"));
    }

    #[test]
    fn failures_within_the_bound_between_good_reads_are_no_violation() {
        let mut h = H::default();
        h.put(0, 10 * S, "k", 1, Outcome::Ok);
        h.failing_gets(11, 21, "k");
        h.get(22 * S, 22 * S + 1, "k", val(1));
        // Longer than the bound in all, but a good read splits it.
        h.failing_gets(23, 47, "k");
        h.get(48 * S, 48 * S + 1, "k", val(1));
        let r = h.check();
        assert_eq!(r.total(), 0, "{}", render(&r, 10));
    }

    #[test]
    fn failures_after_a_write_that_could_replace_the_acked_one_are_excused() {
        let mut h = H::default();
        h.put(0, 10 * S, "k", 1, Outcome::Ok);
        h.failing_gets(11, 51, "k");
        // Timed out: may have replaced the put at any time after 16 s.
        h.upsert(16 * S, Some(17 * S), "k", 2, err(RPC_TIMEOUT));
        let r = h.check();
        assert_eq!(r.total(), 0, "{}", render(&r, 10));

        // Acknowledged, the upsert is held to the rule in its turn.
        let mut h = H::default();
        h.put(0, 10 * S, "k", 1, Outcome::Ok);
        h.failing_gets(11, 51, "k");
        h.upsert(16 * S, Some(17 * S), "k", 2, Outcome::Ok);
        let r = h.check();
        assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
        let v = &r.violations[0];
        assert!(
            v.what.contains("upsert 0x2 unreadable for 33.1s"),
            "{}",
            v.what
        );
        assert_eq!(v.count, 34);
    }

    #[test]
    fn a_destroyed_write_is_caught_though_a_later_upsert_covers_it() {
        let mut h = H::default();
        h.put(0, 10 * S, "k", 1, Outcome::Ok);
        h.failing_gets(11, 46, "k");
        h.upsert(47 * S, Some(48 * S), "k", 2, Outcome::Ok);
        h.get(49 * S, 49 * S + 1, "k", val(2));
        let r = h.check();
        assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
        let v = &r.violations[0];
        assert!(
            v.what.contains("put 0x1 unreadable for 35.1s"),
            "{}",
            v.what
        );
        assert_eq!(v.count, 36);
    }

    #[test]
    fn a_removal_that_may_precede_the_failures_excuses_them_unless_older() {
        let mut h = H::default();
        h.put(0, 10 * S, "k", 1, Outcome::Ok);
        h.remove(10 * S + 1, Some(10 * S + 2), "k", err(RPC_TIMEOUT));
        h.failing_gets(11, 51, "k");
        h.put(0, 10 * S, "j", 1, Outcome::Ok);
        h.remove(10 * S + 1, Some(10 * S + 2), "j", Outcome::Ok);
        h.failing_gets(11, 51, "j");
        let r = h.check();
        assert_eq!(r.total(), 0, "{}", render(&r, 10));

        // A removal invoked before the put may land late, but would leave
        // the key not-found, not failing.
        let mut h = H::default();
        h.remove(S, Some(S + 1), "k", err(RPC_TIMEOUT));
        h.put(2 * S, 10 * S, "k", 1, Outcome::Ok);
        h.failing_gets(11, 51, "k");
        let r = h.check();
        assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
    }

    #[test]
    fn not_found_is_rule_one_business_and_ends_a_failing_run() {
        let mut h = H::default();
        h.put(0, 10 * S, "k", 1, Outcome::Ok);
        for t in 11..=51 {
            h.get(t * S, t * S + S / 10, "k", err(NF));
        }
        h.put(0, 10 * S, "j", 1, Outcome::Ok);
        h.failing_gets(11, 30, "j");
        h.get(31 * S, 31 * S + 1, "j", err(NF));
        h.failing_gets(32, 51, "j");
        let r = h.check();
        assert_eq!(counts(&r), [2, 0, 0, 0, 0], "{}", render(&r, 10));
    }

    #[test]
    fn evictions_do_not_excuse_unreadable_writes() {
        let mut h = H::default();
        h.put(0, 10 * S, "k", 1, Outcome::Ok);
        h.failing_gets(11, 51, "k");
        let cfg = CheckConfig {
            evictions_possible: true,
            ..CheckConfig::default()
        };
        let r = check(&h.events, cfg);
        assert_eq!(counts(&r), [0, 1, 0, 0, 0], "{}", render(&r, 10));
    }
}
