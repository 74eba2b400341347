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
    /// For a stale read: when the replacing write or the removal it
    /// contradicts was acknowledged (history time), so that the master
    /// that acknowledged it can be named.
    pub acked_at: Option<u64>,
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
    /// Violations set aside, not counted: stale reads a previous release's
    /// leader acknowledged (see [`Self::set_aside`]).
    pub set_aside: Vec<Violation>,
}

impl Report {
    /// Total violations over every rule.
    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }

    /// Moves the violations `aside` picks out of the counts into
    /// [`Self::set_aside`].
    pub fn set_aside(&mut self, aside: impl Fn(&Violation) -> bool) {
        let (out, keep) = std::mem::take(&mut self.violations)
            .into_iter()
            .partition(|v| aside(v));
        self.violations = keep;
        for v in &out {
            if let Some(n) = self.counts.get_mut(v.rule.name()) {
                *n = n.saturating_sub(1);
            }
        }
        self.set_aside.extend::<Vec<Violation>>(out);
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
                        acked_at: None,
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
            acked_at: None,
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
                if let Some((done, op, what)) = stale {
                    let found = Violation {
                        acked_at: Some(done),
                        ..make(Rule::NoStaleRead, what, &[op, w.op], r, false)
                    };
                    flag(found, format!("stale v{v}"));
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
                        let v = Violation {
                            acked_at: o.ok_done,
                            ..make(
                                Rule::NoStaleRead,
                                "exist answered true after a removal, with no write since".into(),
                                &[o.op],
                                r,
                                false,
                            )
                        };
                        flag(v, format!("rm{} present", o.op));
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
    let gap = cfg.unreadable_bound_ns / 3;
    let runs = h.gets.split(|g| g.failed.is_none());
    for run in runs.flat_map(|run| observed(run, gap)) {
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
                acked_at: None,
            },
            format!("unreadable g{}", first.op),
        );
    }
}

/// `run` (failing gets, in invocation order) cut wherever nobody read the
/// key for longer than `gap`: the object may have been readable meanwhile
/// (its store faulted twice, say, and no get came between), so what
/// follows is another run, not the same outage.
fn observed(run: &[KGet], gap: u64) -> Vec<&[KGet]> {
    let mut seen = 0;
    let mut cuts = vec![0];
    for (i, g) in run.iter().enumerate() {
        if i > 0 && g.inv > seen + gap {
            cuts.push(i);
        }
        seen = seen.max(g.done);
    }
    cuts.push(run.len());
    cuts.windows(2).map(|w| &run[w[0]..w[1]]).collect()
}

mod render;
pub use render::render;
use render::{line, window};

#[cfg(test)]
mod tests;
