#!/usr/bin/env python3
"""Fills a pool with N small objects through the MooncakeDistributedStore API
(put_batch of 64-byte values under 13-byte keys, as an engine's small pages
would), and at each checkpoint prints one JSON line: the master's resident
memory per key, the fill rate since the previous checkpoint, and single
get/put latency (p50/p99 µs), and the rate of a burst of batched puts. For
kvpool, gets are also timed from a client without a location cache, so each
one asks the master, as every Mooncake get does: that is the master's cost
at this key count, whatever fits a client's cache. The same script drives kvpool
(`--module kvpool.mooncake`) and Mooncake (`--module mooncake.store`), so
both masters see the same load in the same run. Loopback only."""
import argparse
import importlib
import json
import os
import random
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--module", default="kvpool.mooncake")
p.add_argument("--system", default="kvpool")
p.add_argument("--master", default="127.0.0.1:50051")
p.add_argument("--metadata", default="P2PHANDSHAKE")
p.add_argument("--master-pid", type=int, required=True, help="pid whose RSS is measured")
p.add_argument("--keys", type=int, default=1_000_000)
p.add_argument("--checkpoints", default="10000,100000,1000000")
p.add_argument("--batch", type=int, default=128)
p.add_argument("--value-size", type=int, default=64)
p.add_argument("--samples", type=int, default=2000)
p.add_argument("--settle", type=float, default=3.0,
               help="seconds between the end of a fill and its samples, for both systems alike")
p.add_argument("--burst", type=int, default=64, help="put_batch calls timed per checkpoint")
a = p.parse_args()


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def key(i):
    return f"k{i:012d}"  # 13 bytes


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] * 1e6


s = importlib.import_module(a.module).MooncakeDistributedStore()
rc = s.setup("127.0.0.1", a.metadata, 0, 64 << 20, "tcp", "", a.master)
if rc != 0:
    sys.exit(f"setup failed: {rc}")
cold = None
if a.system == "kvpool":
    os.environ["KVPOOL_LOCATION_CACHE"] = "0"
    cold = importlib.import_module(a.module).MooncakeDistributedStore()
    if cold.setup("127.0.0.1", a.metadata, 0, 16 << 20, "tcp", "", a.master) != 0:
        sys.exit("setup of the uncached client failed")
    del os.environ["KVPOOL_LOCATION_CACHE"]
value = os.urandom(a.value_size)
base = rss(a.master_pid)
marks = sorted({int(c) for c in a.checkpoints.split(",") if int(c) < a.keys} | {a.keys})
filled, extra, added = 0, 10**11, 0
for mark in marks:
    t = time.time()
    while filled < mark:
        n = min(a.batch, mark - filled)
        ks = [key(i) for i in range(filled, filled + n)]
        r = s.put_batch(ks, [value] * n)
        if r != 0:
            sys.exit(f"put_batch at {filled} returned {r}")
        filled += n
    rate = (mark - (marks[marks.index(mark) - 1] if marks.index(mark) else 0)) / (time.time() - t)
    time.sleep(a.settle)
    gets, puts = [], []
    for _ in range(a.samples):
        k = key(random.randrange(mark))
        t0 = time.perf_counter()
        got = s.get(k)
        gets.append(time.perf_counter() - t0)
        if got != value:
            sys.exit(f"wrong or missing value for {k}")
    cold_gets = []
    for _ in range(a.samples if cold else 0):
        k = key(random.randrange(mark))
        t0 = time.perf_counter()
        got = cold.get(k)
        cold_gets.append(time.perf_counter() - t0)
        if got != value:
            sys.exit(f"wrong or missing value for {k} (uncached)")
    t0 = time.perf_counter()
    for _ in range(a.burst):
        ks = [key(extra + i) for i in range(a.batch)]
        extra += a.batch
        if s.put_batch(ks, [value] * a.batch) != 0:
            sys.exit("burst put_batch failed")
    burst_rate = a.burst * a.batch / (time.perf_counter() - t0)
    added += a.burst * a.batch + a.samples
    for _ in range(a.samples):
        t0 = time.perf_counter()
        r = s.put(key(extra), value)
        puts.append(time.perf_counter() - t0)
        extra += 1
        if r != 0:
            sys.exit(f"put returned {r}")
    mem = rss(a.master_pid) - base
    print(json.dumps({
        "system": a.system, "keys": mark, "master_rss_mib": round(rss(a.master_pid) / 2**20, 1),
        "bytes_per_key": round(mem / (mark + added), 1),
        "fill_keys_per_s": round(rate), "burst_put_keys_per_s": round(burst_rate),
        "get_p50_us": round(pct(gets, 0.5), 1), "get_p99_us": round(pct(gets, 0.99), 1),
        **({"uncached_get_p50_us": round(pct(cold_gets, 0.5), 1),
            "uncached_get_p99_us": round(pct(cold_gets, 0.99), 1)} if cold_gets else {}),
        "put_p50_us": round(pct(puts, 0.5), 1), "put_p99_us": round(pct(puts, 0.99), 1),
    }), flush=True)
s.close()
if cold:
    cold.close()
