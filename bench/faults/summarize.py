#!/usr/bin/env python3
"""Summarizes a fault-latency run (bench/faults_latency.sh OUTDIR).

Reads OUTDIR/<system>/phases.json and OUTDIR/<system>/ops-*.csv and writes
  OUTDIR/per_second.csv   system,cluster,t,phase,class,n,ok,err,miss,wrong,unfinished,p50_ms,p99_ms,max_ms
                          (t = seconds since that system's start, by the
                          ops' scheduled time; class get_A/get_B/get_C/put)
  OUTDIR/summary.json     the numbers of the tables
  OUTDIR/summary.md       the tables, also printed to stdout

Latency of an op = its completion minus its *scheduled* start (the load is
open-loop), in ms; an op still running when its load process stopped
("unfinished") counts as an error with latency up to the stop. Ops belong to
a fault window by scheduled time. Classes in the table:
  get live   keys with a replica on the surviving store (sets B and C)
  get dead   keys whose only replica is on the victim store (set A)
  put        new keys
("get dead" in the leader phase is still set A: there no store dies.)
Writes: over [fault start, end of the "after" phase], the 1-s buckets with
no successful put completing ("s w/o put") and the longest interval between
consecutive successful put completions that overlaps it ("longest gap").
"""
import csv
import glob
import json
import os
import sys
from collections import Counter, defaultdict

SYSTEMS = ("kvpool", "mooncake")
NAMES = {"kvpool": "kvpool", "mooncake": "Mooncake 0.3.13"}
FAULTS = [("kill", "kill -9 victim store"), ("stop", "SIGSTOP victim store (10 s)"),
          ("leader", "kill -9 master leader"), ("netns", "victim store cut off (netns link down)")]
CLASSES = [("live", "get, key with a live replica (B+C)", ("B", "C")),
           ("dead", "get, key only on the victim (A)", ("A",)),
           ("put", "put (new keys)", ("P",))]


def pct(sorted_vals, q):
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, int(round(q / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[i]


def load(out, system):
    d = os.path.join(out, system)
    pj = os.path.join(d, "phases.json")
    if not os.path.exists(pj):
        return None
    with open(pj) as f:
        meta = json.load(f)
    ops = []
    for path in sorted(glob.glob(os.path.join(d, "ops-*.csv"))):
        cluster = os.path.basename(path).split("-")[1]
        with open(path) as f:
            for r in csv.DictReader(f):
                try:
                    ops.append((float(r["sched"]), float(r["start"]), float(r["end"]), r["op"], r["set"],
                                r["res"], int(r["code"]), cluster))
                except (KeyError, ValueError):
                    pass  # a torn last line
    ops.sort()
    return meta, ops


def stats(rows):
    lat = sorted((e - s) * 1000.0 for s, _st, e, *_ in rows)
    res = Counter(r[5] for r in rows)
    codes = Counter(r[6] for r in rows if r[5] in ("err", "miss"))
    return {
        "n": len(rows), "ok": res["ok"], "err": res["err"] + res["unfinished"], "miss": res["miss"],
        "wrong": res["wrong"], "unfinished": res["unfinished"],
        "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "max_ms": lat[-1] if lat else None,
        "codes": {str(k): v for k, v in sorted(codes.items())},
    }


def phase_at(phases, t):
    best = None
    for ph in phases:
        end = ph.get("end") or float("inf")
        if ph["start"] <= t < end:
            if best is None or ph["kind"] == "fault":
                best = ph
    return best["name"] if best else "-"


def writes(ops, start, end):
    """(seconds without a successful put, longest gap) over [start, end]."""
    done = sorted(e for s, _st, e, op, _k, res, _c, _cl in ops if op == "put" and res == "ok")
    if end <= start:
        return None, None
    buckets = set(int(t - start) for t in done if start <= t < end)
    nsec = int(end - start + 0.999)
    without = sum(1 for b in range(nsec) if b not in buckets)
    before = [t for t in done if t < start]
    inside = [t for t in done if start <= t <= end]
    after = [t for t in done if t > end]
    seq = ([before[-1]] if before else [start]) + inside + ([after[0]] if after else [end])
    gap = max((b - a for a, b in zip(seq, seq[1:])), default=end - start)
    return without, gap


def fmt_ms(v, unfinished=0):
    if v is None:
        return "-"
    s = f"{v:.0f}" if v >= 100 else f"{v:.1f}"
    return (">" + s) if unfinished else s


def table_head(first, systems, columns):
    """The header and rule lines of a table: `first` (markdown cells, with
    their rule, e.g. [("fault", "---")]), then `columns` once per system,
    the first named after it, all right-aligned."""
    hdr = "|" + "".join(f" {c} |" for c, _ in first)
    sep = "|" + "".join(f"{r}|" for _, r in first)
    for s in systems:
        hdr += "".join(f" {c.format(NAMES[s])} |" for c in columns)
        sep += "---:|" * len(columns)
    return [hdr, sep]


def skipped(fr):
    """Whether a system's results for a fault are missing (not run, or skipped)."""
    return fr is None or "skipped" in fr


def main():
    out = sys.argv[1]
    data = {s: load(out, s) for s in SYSTEMS}
    data = {s: v for s, v in data.items() if v}
    summary = {"systems": {}, "config": {}}
    # ---------------------------------------------------------------- per second
    with open(os.path.join(out, "per_second.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "cluster", "t", "phase", "class", "n", "ok", "err", "miss", "wrong", "unfinished",
                    "p50_ms", "p99_ms", "max_ms"])
        for s, (meta, ops) in data.items():
            t0 = meta["t0"]
            groups = defaultdict(list)
            for r in ops:
                cls = "put" if r[3] == "put" else f"get_{r[4]}"
                groups[(r[7], int(r[0] - t0), cls)].append(r)
            for (cl, sec, cls), rows in sorted(groups.items()):
                st = stats(rows)
                w.writerow([s, cl, sec, phase_at(meta["phases"], t0 + sec + 0.5), cls, st["n"], st["ok"], st["err"],
                            st["miss"], st["wrong"], st["unfinished"],
                            *(f"{st[k]:.2f}" if st[k] is not None else "" for k in ("p50_ms", "p99_ms", "max_ms"))])
    # ---------------------------------------------------------------- windows
    for s, (meta, ops) in data.items():
        summary["config"][s] = meta.get("config", {})
        res = {"faults": {}, "populations": meta.get("populations", []),
               "wrong_total": sum(1 for r in ops if r[5] == "wrong")}
        # Baseline: the steady period before each cluster's first fault (later
        # steady periods may still carry the previous fault's after-effects;
        # per_second.csv shows them).
        phs = meta["phases"]
        steady = [ph for i, ph in enumerate(phs) if ph["kind"] == "steady" and ph.get("end")
                  and i > 0 and phs[i - 1]["kind"] == "warmup"]
        # ...ending 2 s before the fault, so that no op of it can be caught by the fault.
        rows = [r for r in ops if any(ph["start"] <= r[0] < ph["end"] - 2.0 for ph in steady)]
        res["steady"] = {c: stats([r for r in rows if r[4] in sets]) for c, _l, sets in CLASSES}
        for fault, _label in FAULTS:
            phs = [ph for ph in meta["phases"] if ph["kind"] == "fault" and ph["fault"] == fault]
            if not phs:
                continue
            ph = phs[-1]
            if ph.get("skipped"):
                res["faults"][fault] = {"skipped": ph["skipped"]}
                continue
            start, end = ph["start"], ph["end"] or ph["start"]
            after = [p for p in meta["phases"] if p["kind"] == "recovery" and p["fault"] == fault]
            wend = (after[-1].get("end") or end) if after else end
            win = [r for r in ops if start <= r[0] < end]
            fr = {"window_s": end - start, "start": start}
            for c, _l, sets in CLASSES:
                fr[c] = stats([r for r in win if r[4] in sets])
            for k in ("B", "C"):
                fr["get_" + k] = stats([r for r in win if r[4] == k])
            fr["s_without_put"], fr["longest_put_gap_s"] = writes(ops, start, wend)
            fr["writes_span_s"] = wend - start
            res["faults"][fault] = fr
        ev = [e for e in meta.get("events", []) if e["what"].startswith(("cluster failed", "no leader", "WARNING", "leader phase skipped"))]
        ev += [dict(e, what="preferred_segment was not honoured for a probe key; keys were filed by where "
                            "batch_get_replica_desc put them", error="")
               for e in meta.get("events", []) if e["what"] == "pinning check" and not e.get("pinning_works")][:1]
        res["notes"] = ev
        summary["systems"][s] = res
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    # ---------------------------------------------------------------- markdown
    sysl = [s for s in SYSTEMS if s in data]
    L = []
    L.append("## Fault latency: " + " vs ".join(NAMES[s] for s in sysl))
    L.append("")
    cfg = next(iter(summary["config"].values()), {})
    if cfg:
        L.append(f"{cfg.get('clients')} load processes x ({cfg.get('get_rate'):g} gets/s + {cfg.get('put_rate'):g} puts/s), "
                 f"values {cfg.get('size')} B, {cfg.get('keys_per_set')} keys per set, open-loop (latency from the "
                 f"scheduled time, ms); window = the fault itself (kill: {cfg.get('fault'):g} s until restart, "
                 f"SIGSTOP: {cfg.get('stop_secs'):g} s, leader: {cfg.get('fault'):g} s until restart as standby). "
                 "err counts failed calls other than misses (−704), unfinished ones included.")
        L.append("")
    L += table_head([("fault", "---"), ("op class", "---")], sysl,
                    ["{} n", "p50", "p99", "max", "err", "miss"])
    na_notes = []

    def cells(st):
        if st is None:
            return " n/a | | | | | |"
        u = st["unfinished"]
        e = f"{st['err']}" + (f" ({u} unfin.)" if u else "")
        if st["wrong"]:
            e += f" **{st['wrong']} WRONG**"
        return (f" {st['n']} | {fmt_ms(st['p50_ms'])} | {fmt_ms(st['p99_ms'])} | {fmt_ms(st['max_ms'], u)} |"
                f" {e} | {st['miss']} |")

    ran = {ph["fault"] for s in sysl for ph in data[s][0]["phases"] if ph["kind"] == "fault"}
    faults = [f for f in FAULTS if f[0] in ran]
    rows_spec = [("steady", "no fault (steady load before each cluster's first fault, less its last 2 s)")] + faults
    for fault, label in rows_spec:
        for c, clabel, _sets in CLASSES:
            line = f"| {label} | {clabel} |"
            for s in sysl:
                r = summary["systems"][s]
                if fault == "steady":
                    line += cells(r["steady"].get(c))
                else:
                    fr = r["faults"].get(fault)
                    if skipped(fr):
                        why = (fr or {}).get("skipped", "phase not run")
                        if c == "live":
                            na_notes.append(f"{NAMES[s]}, {label}: n/a: {why}")
                        line += " n/a | | | | | |"
                    else:
                        line += cells(fr[c])
            L.append(line)
    L.append("")
    L.append("Writes during each fault (from the fault's start to the end of the period after it):")
    L.append("")
    L += table_head([("fault", "---"), ("span s", "---:")], sysl,
                    ["{}: s without a successful put", "longest put gap s"])
    for fault, label in faults:
        line = f"| {label} |"
        span = None
        cellz = ""
        for s in sysl:
            fr = summary["systems"][s]["faults"].get(fault)
            if skipped(fr):
                cellz += " n/a | n/a |"
            else:
                span = fr["writes_span_s"]
                cellz += f" {fr['s_without_put']} | {fr['longest_put_gap_s']:.2f} |"
        L.append(line + (f" {span:.0f} |" if span else " - |") + cellz)
    L.append("")
    L.append("Detail: gets by set during the window (B = replicas on both stores, C = only on the survivor) and "
             "result codes of failed calls (code x count):")
    L.append("")
    for s in sysl:
        for fault, label in faults:
            fr = summary["systems"][s]["faults"].get(fault)
            if skipped(fr):
                continue
            parts = []
            for c in ("get_B", "get_C", "dead", "put"):
                st = fr[c]
                codes = ", ".join(f"{k}x{v}" for k, v in st["codes"].items()) or "none"
                parts.append(f"{c}: n={st['n']} p99={fmt_ms(st['p99_ms'])} max={fmt_ms(st['max_ms'], st['unfinished'])} "
                             f"codes {codes}")
            L.append(f"- {NAMES[s]}, {label}: " + "; ".join(parts))
    L.append("")
    for s in sysl:
        pops = summary["systems"][s]["populations"]
        if pops:
            L.append(f"- {NAMES[s]} key sets per epoch (A/B/C after classification by replica location): " +
                     "; ".join(f"e{p['epoch']}: {p['A']}/{p['B']}/{p['C']}"
                               + (f" ({p['refiled']} refiled, {p['unclassified']} unclassified, {p['put_failed']} puts failed)"
                                  if p['refiled'] or p['unclassified'] or p['put_failed'] else "")
                               for p in pops))
    for n in na_notes:
        L.append(f"- {n}")
    for s in sysl:
        for e in summary["systems"][s]["notes"]:
            L.append(f"- {NAMES[s]}: {e['what']} {e.get('error', '')}")
    for s in sysl:
        meta = data[s][0]
        cpus = [e for e in meta.get("events", []) if e["what"] == "cluster down" and e.get("cpu_seconds")]
        if cpus:
            L.append(f"- {NAMES[s]} CPU seconds used (process kind: seconds) per cluster: " + "; ".join(
                f"{e['cluster']} ({e.get('seconds', 0):.0f} s): " + ", ".join(f"{k} {v}" for k, v in sorted(e["cpu_seconds"].items()))
                for e in cpus))
    wrong = {s: summary["systems"][s]["wrong_total"] for s in sysl}
    if any(wrong.values()):
        L.append("")
        L.append("**!!! WRONG BYTES RETURNED: " + ", ".join(f"{NAMES[s]}: {v}" for s, v in wrong.items()) +
                 " (see the load logs) !!!**")
    else:
        L.append(f"- every byte read was checked: 0 wrong values ({', '.join(NAMES[s] for s in sysl)})")
    text = "\n".join(L) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 2 if any(wrong.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
