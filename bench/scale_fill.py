#!/usr/bin/env python3
"""Fills a pool with N small objects through the MooncakeDistributedStore API
(put_batch of 64-byte values under keys an engine would use: `--key-shape`,
see engine_keys.py; 13-byte keys by default), and at each checkpoint prints
one JSON line: the master's resident memory per key, the fill rate since the
previous checkpoint (put calls only: generating engine keys is not timed), and single
get/put latency (p50/p99 µs), and the rate of a burst of batched puts.
Gets read a hot set of `--hot` keys spread evenly over all the keys so far
(read once before timing) through a reader client of their own, so what its
location cache holds is the same at every key count (the filler's own cache
churns with what it writes, and holds every key of a small pool) and only
the pool's size differs. For kvpool, gets
of random keys are also timed from a client without a location cache, so
each one asks the master, as every Mooncake get does: that is the master's
cost at this key count, whatever fits a client's cache. The same script drives kvpool
(`--module kvpool.mooncake`) and Mooncake (`--module mooncake.store`), so
both masters see the same load in the same run. Loopback only."""
import argparse
import importlib
import json
import os
import random
import sys
import time

from engine_keys import SHAPES, key_fn

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
p.add_argument("--samples", type=int, default=2000, help="single gets/puts timed per checkpoint")
p.add_argument("--rounds", type=int, default=5,
               help="samples and burst are split in this many rounds, 0.5 s apart; each figure is the "
                    "median over rounds, so one transient (a page-fault storm, a GC) moves no figure")
p.add_argument("--settle", type=float, default=3.0,
               help="seconds between the end of a fill and its samples, for both systems alike")
p.add_argument("--burst", type=int, default=320, help="put_batch calls timed per checkpoint")
p.add_argument("--key-shape", default="plain", choices=SHAPES)
p.add_argument("--hot", type=int, default=1000,
               help="keys the timed gets read, spread evenly over the keys so far")
a = p.parse_args()


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


key = key_fn(a.key_shape)


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] * 1e6


def median(v):
    return sorted(v)[len(v) // 2]


def timed(n, op):
    """Latencies (s) of n calls of op()."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        op()
        out.append(time.perf_counter() - t0)
    return out


s = importlib.import_module(a.module).MooncakeDistributedStore()
rc = s.setup("127.0.0.1", a.metadata, 0, 64 << 20, "tcp", "", a.master)
if rc != 0:
    sys.exit(f"setup failed: {rc}")
# The reader: a client that only reads, like an engine's loading side.
reader = importlib.import_module(a.module).MooncakeDistributedStore()
if reader.setup("127.0.0.1", a.metadata, 0, 16 << 20, "tcp", "", a.master) != 0:
    sys.exit("setup of the reader failed")
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
    spent = 0.0
    while filled < mark:
        n = min(a.batch, mark - filled)
        ks = [key(i) for i in range(filled, filled + n)]
        t = time.perf_counter()
        r = s.put_batch(ks, [value] * n)
        spent += time.perf_counter() - t
        if r != 0:
            sys.exit(f"put_batch at {filled} returned {r}")
        filled += n
    rate = (mark - (marks[marks.index(mark) - 1] if marks.index(mark) else 0)) / spent
    time.sleep(a.settle)
    per = max(1, a.samples // a.rounds)
    calls = max(1, a.burst // a.rounds)
    gets, cold_gets, puts, bursts = [], [], [], []

    def check_get(client, k, what):
        if client.get(k) != value:
            sys.exit(f"wrong or missing value for {k}{what}")

    def put_one(k):
        if s.put(k, value) != 0:
            sys.exit("put failed")

    hot = [key(j * mark // min(a.hot, mark)) for j in range(min(a.hot, mark))]
    uncached = [key(random.randrange(mark)) for _ in range(per * a.rounds)] if cold else []
    for k in hot:
        check_get(reader, k, " (hot set)")
    for _ in range(a.rounds):
        gets.append(timed(per, lambda: check_get(reader, random.choice(hot), "")))
        if cold:
            cold_gets.append(timed(per, lambda: check_get(cold, uncached.pop(), " (uncached)")))
        batches = [[key(extra + c * a.batch + i) for i in range(a.batch)] for c in range(calls)]
        extra += calls * a.batch
        t0 = time.perf_counter()
        for ks in batches:
            if s.put_batch(ks, [value] * a.batch) != 0:
                sys.exit("burst put_batch failed")
        bursts.append(calls * a.batch / (time.perf_counter() - t0))
        singles = [key(extra + i) for i in range(per)]
        extra += per
        puts.append(timed(per, lambda: put_one(singles.pop())))
        added += calls * a.batch + per
        time.sleep(0.5)
    burst_rate = median(bursts)

    def fig(rounds, q):
        return round(median([pct(r, q) for r in rounds]), 1)

    mem = rss(a.master_pid) - base
    print(json.dumps({
        "system": a.system, "key_shape": a.key_shape, "keys": mark, "master_rss_mib": round(rss(a.master_pid) / 2**20, 1),
        "bytes_per_key": round(mem / (mark + added), 1),
        "fill_keys_per_s": round(rate), "burst_put_keys_per_s": round(burst_rate),
        "get_p50_us": fig(gets, 0.5), "get_p99_us": fig(gets, 0.99),
        **({"uncached_get_p50_us": fig(cold_gets, 0.5),
            "uncached_get_p99_us": fig(cold_gets, 0.99)} if cold_gets else {}),
        "put_p50_us": fig(puts, 0.5), "put_p99_us": fig(puts, 0.99),
    }), flush=True)
s.close()
reader.close()
if cold:
    cold.close()
