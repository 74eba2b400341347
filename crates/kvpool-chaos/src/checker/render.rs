//! The checker's report as text: counts, then each violation with the
//! operations around it on its key.

use super::*;

/// Seconds since the campaign's first event, for reports.
fn rel(t: u64, t0: u64) -> String {
    if t == INF {
        return "never".into();
    }
    format!("{:.3}s", t.saturating_sub(t0) as f64 / 1e9)
}

/// One operation on one line: its window, client, call, and answers.
pub(super) fn line(ops: &[OpRec], i: usize, t0: u64) -> String {
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
pub(super) fn window(
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
    if !report.set_aside.is_empty() {
        let _ = writeln!(
            s,
            "set aside, not counted: {} stale read(s) whose contradicted write or removal a \
             leader on the previous release acknowledged (it predates the fixes of chaos \
             findings 16 and 23), listed last",
            report.set_aside.len()
        );
    }
    let line = |s: &mut String, label: &str, v: &Violation| {
        let _ = writeln!(
            s,
            "\n{label}{} on {} ({} time{}): {}",
            v.rule.name(),
            v.key,
            v.count,
            if v.count == 1 { "" } else { "s" },
            v.what
        );
        for l in &v.window {
            let _ = writeln!(s, "  {l}");
        }
    };
    for v in report.violations.iter().take(max_violations) {
        line(&mut s, "", v);
    }
    if report.violations.len() > max_violations {
        let _ = writeln!(
            s,
            "\n... {} more violations",
            report.violations.len() - max_violations
        );
    }
    for v in &report.set_aside {
        line(&mut s, "set aside: ", v);
    }
    s
}
