#!/usr/bin/env python3
"""Median table of repeated side-by-side runs (compare.sh with REPEAT > 1).

Usage: compare_runs.py OUTDIR
Reads OUTDIR/r<N>/<system>/results.json for every repetition N, where the
first system named in OUTDIR/systems (one per line) is the reference. For
every (test, size, batch) of the reference it prints each system's median
throughput over the repetitions and, for the others, the median of the
per-repetition ratios to the reference (each repetition ran the systems
back to back, so a drift of the machine cancels) with the lowest and
highest in brackets: x thr (>1 = faster), x p99 (<1 = better). A row whose
spread straddles a target is not met by luck of one run.

With OUTDIR/r<N>/limits/raw_limits.json (compare.sh measures them before
each repetition), it first prints the machine's limits, and for each row
moving at least 512 KiB a call, each kvpool system's throughput as a share
of its limit in the same repetition (median [lowest-highest]): over TCP one
loopback stream of 4 MiB writes from and into 1 GiB buffers, over shared
memory memcpy of 1 GiB."""
import json
import os
import statistics
import sys

from compare import size



def rows(path):
    with open(path) as f:
        d = json.load(f)
    return {(r["test"], r["size"], r["batch"]): r for r in d["results"]}


def spread(values):
    v = sorted(values)
    return f"{statistics.median(v):.2f} [{v[0]:.2f}-{v[-1]:.2f}]"


LIMITS = {  # name in raw_limits.json -> (label, field, unit)
    "memcpy_1GiB": ("memcpy, 1 GiB", "avg_GBps", "GB/s"),
    "tcp_stream_python_4194304": ("one loopback TCP stream (CUBIC, memory to memory), 4 MiB writes", "GBps", "GB/s"),
    "tcp_stream_python_65536": ("one loopback TCP stream (CUBIC, memory to memory), 64 KiB writes", "GBps", "GB/s"),
    "tcp_pingpong_4096_unpinned": ("TCP ping-pong of 4 KiB between processes, p50", "p50_us", "us"),
}
BULK = 512 * 1024  # bytes a call from which a row is held against a bandwidth limit


def limit_of(system, limits):
    """The bandwidth (GB/s) a system's bulk rows are held against."""
    name = "memcpy_1GiB" if system.endswith("shm") else "tcp_stream_python_4194304"
    got = limits.get(name)
    return got and got[LIMITS[name][1]]


def print_limits(limits):
    print("| limit, measured before each repetition | median [lowest-highest] |")
    print("|---|---|")
    for name, (label, field, unit) in LIMITS.items():
        v = [lim[name][field] for lim in limits if name in lim]
        if v:
            print(f"| {label} | {spread(v)} {unit} |")
    print()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    with open(os.path.join(out, "systems")) as f:
        systems = [s.strip() for s in f if s.strip()]
    reps = sorted(
        (d for d in os.listdir(out) if d.startswith("r") and d[1:].isdigit()),
        key=lambda d: int(d[1:]),
    )
    runs = []  # per repetition: {system: rows}
    limits = []  # per repetition (of those in runs): raw_limits.json
    for r in reps:
        got = {}
        lim = os.path.join(out, r, "limits", "raw_limits.json")
        for s in systems:
            p = os.path.join(out, r, s, "results.json")
            if os.path.exists(p):
                got[s] = rows(p)
        if systems[0] in got:
            runs.append(got)
            limits.append(json.load(open(lim)) if os.path.exists(lim) else {})
    if not runs:
        sys.exit(f"no runs of {systems[0]} under {out}")
    ref, others = systems[0], systems[1:]
    print(f"{len(runs)} repetitions; median [lowest-highest] of the per-repetition ratios to {ref}.")
    print()
    measured = any(limits)
    if measured:
        print_limits(limits)
    head = f"| test | size | B | {ref} GB/s |"
    for s in others:
        head += f" {s} GB/s | x thr | x p99 |" + (" of limit |" if measured else "")
    print(head)
    print("|" + "---|" * (4 + (4 if measured else 3) * len(others)))
    for key in runs[0][ref]:
        base = [run[ref][key] for run in runs if key in run[ref]]
        line = f"| {key[0]} | {size(key[1])} | {key[2]} | {statistics.median(r['GBps'] for r in base):.3f} |"
        for s in others:
            pairs = [
                (run[ref][key], run[s][key], lim)
                for run, lim in zip(runs, limits)
                if s in run and key in run[s] and key in run[ref] and run[ref][key]["ops_per_s"]
            ]
            if not pairs:
                line += " - | - | - |" + (" - |" if measured else "")
                continue
            gbs = statistics.median(o["GBps"] for _, o, _ in pairs)
            thr = spread(o["ops_per_s"] / r["ops_per_s"] for r, o, _ in pairs)
            p99 = spread(o["p99_us"] / r["p99_us"] for r, o, _ in pairs if r["p99_us"])
            errors = sum(o.get("errors", 0) for _, o, _ in pairs)
            err = f" ({errors} err)" if errors else ""
            line += f" {gbs:.3f}{err} | {thr} | {p99} |"
            if measured:
                shares = [
                    o["GBps"] / limit_of(s, lim)
                    for _, o, lim in pairs
                    if key[1] * key[2] >= BULK and limit_of(s, lim)
                ]
                line += f" {spread(shares)} |" if shares else " - |"
        print(line)


if __name__ == "__main__":
    main()
