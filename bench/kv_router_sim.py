"""A cache-aware router fed by kvpool's KV event stream, simulated.

Several pools (a kvpool master each, started with `--kv-events-endpoint`)
serve multi-turn conversations. Engines write each served request's pages
to the pool it ran on, named as SGLang's HiCache names them
(`{model}_{page hash}_{tp}_k|v`, page hashes chained with SHA-256 as
`engine_keys.py` does). A router subscribes to every pool's stream (ZMQ
SUB, msgpack, the format of Mooncake's master publisher), keeps per pool
the set of block hashes the events say it holds, and sends each request to
the pool holding its longest cached prefix. A random router is the
baseline. Printed per router: the hit rate (pages of a request already in
the pool it was sent to, checked against the pool itself), how often the
router's view matched the pool, and how long events took to arrive.

Usage (pools running):
  python bench/kv_router_sim.py --pool 127.0.0.1:50051,tcp://127.0.0.1:5557,127.0.0.1:9003 \
                                --pool 127.0.0.1:50052,tcp://127.0.0.1:5558,127.0.0.1:9004
Each --pool is `master RPC address,event endpoint,admin HTTP address`.
Needs the `kvpool` Python package, pyzmq and msgpack.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import struct
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set

import msgpack
import zmq

PAGE_TOKENS = 64
PAGE_BYTES = 4096


@dataclass
class Pool:
    """One pool: where to write, where its events come from, its view."""

    master: str
    events: str
    admin: str
    client: object = None
    #: Block hashes the stream says the pool holds, per model.
    held: Dict[str, Set[str]] = field(default_factory=dict)
    last_id: int = 0
    last_seq: int = 0
    gaps: int = 0
    restarts: int = 0
    #: put time of each key written, for the event delay.
    written: Dict[str, float] = field(default_factory=dict)
    delays: List[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: threading.Condition = None

    def __post_init__(self) -> None:
        self.seen = threading.Condition(self.lock)

    def apply(self, e: dict) -> None:
        if e.get("engine") != "sglang" or not e.get("block_hash"):
            return
        hashes = self.held.setdefault(e.get("model_name") or "", set())
        if e["event_type"] == "stored":
            hashes.add(e["block_hash"])
        elif e["event_type"] == "removed":
            hashes.discard(e["block_hash"])
        t = self.written.pop(e["object_key"], None)
        if t is not None:
            self.delays.append(time.monotonic() - t)

    def resync(self) -> None:
        """Rebuilds the view from the snapshot after a gap in event ids."""
        held: Dict[str, Set[str]] = {}
        cursor = None
        first = None
        while True:
            url = f"http://{self.admin}/kv_events/snapshot?limit=10000"
            if cursor:
                url += f"&cursor={cursor}"
            page = json.load(urllib.request.urlopen(url, timeout=10))
            first = page["last_event_id"] if first is None else first
            for k in page["keys"]:
                if k.get("engine") == "sglang" and k.get("block_hash"):
                    held.setdefault(k.get("model_name") or "", set()).add(k["block_hash"])
            cursor = page.get("next")
            if not cursor:
                break
        self.held = held
        self.last_id = first
        self.last_seq = 0

    def listen(self, ctx: zmq.Context, stop: threading.Event, ready: threading.Event) -> None:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.events)
        # The view starts from the snapshot; events it already covers are skipped.
        with self.lock:
            self.resync()
        ready.set()
        while not stop.is_set():
            if not sub.poll(100):
                continue
            _topic, seq, payload = sub.recv_multipart()
            _ms, events, _dp_rank = msgpack.unpackb(payload, raw=False)
            seq = struct.unpack(">Q", seq)[0]
            with self.lock:
                if seq <= self.last_seq:
                    # A restarted (or newly elected) master counts from 1 again.
                    self.restarts += 1
                    self.resync()
                self.last_seq = seq
                for e in events:
                    eid = e["event_id"]
                    if eid > self.last_id + 1:
                        # Events were lost (the master's queue, or this
                        # socket's high-water mark): start over from a snapshot.
                        self.gaps += 1
                        self.resync()
                    if eid <= self.last_id:
                        continue
                    self.last_id = eid
                    self.apply(e)
                self.seen.notify_all()
        sub.close(0)

    def wait_for(self, keys: Sequence[str], timeout: float = 5.0) -> None:
        """Waits until the events of `keys` arrived (the router is current)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while any(k in self.written for k in keys) and time.monotonic() < deadline:
                self.seen.wait(0.05)


def page_hashes(tokens: List[int]) -> List[str]:
    """SGLang's chained page hashes of a token sequence (full pages only)."""
    out: List[str] = []
    prior = b""
    for i in range(0, len(tokens) - PAGE_TOKENS + 1, PAGE_TOKENS):
        data = struct.pack(f"<{PAGE_TOKENS}I", *tokens[i:i + PAGE_TOKENS])
        digest = hashlib.sha256(prior + data).hexdigest()
        out.append(digest)
        prior = bytes.fromhex(digest)
    return out


def conversations(n: int, turns: int, systems: int, seed: int) -> List[List[List[int]]]:
    """`n` conversations of `turns` requests each; a request is its whole
    context (system prompt, earlier turns, new turn), as engines see it."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(128256) for _ in range(4 * PAGE_TOKENS)] for _ in range(systems)]
    out = []
    for _ in range(n):
        ctx = list(rng.choice(prompts))
        reqs = []
        for _ in range(turns):
            ctx += [rng.randrange(128256) for _ in range(2 * PAGE_TOKENS)]
            reqs.append(list(ctx))
        out.append(reqs)
    return out


def cached_prefix(pool: Pool, model: str, hashes: List[str]) -> int:
    held = pool.held.get(model, set())
    n = 0
    while n < len(hashes) and hashes[n] in held:
        n += 1
    return n


def simulate(pools: List[Pool], router: str, model: str, convs, seed: int) -> dict:
    """Serves every request through `router` (`prefix` or `random`)."""
    rng = random.Random(seed)
    prefix_model = model.replace("/", "-")
    hits = total = agree = requests = 0
    # Turns interleave across conversations, as a serving fleet sees them.
    order = [(c, t) for t in range(len(convs[0])) for c in range(len(convs))]
    for c, t in order:
        hashes = page_hashes(convs[c][t])
        if router == "prefix":
            with_lock = []
            for p in pools:
                with p.lock:
                    with_lock.append(cached_prefix(p, prefix_model, hashes))
            best = max(with_lock)
            choice = rng.choice([i for i, n in enumerate(with_lock) if n == best])
            predicted = best
        else:
            choice = rng.randrange(len(pools))
            with pools[choice].lock:
                predicted = cached_prefix(pools[choice], prefix_model, hashes)
        pool = pools[choice]
        keys = [f"{prefix_model}_{h}_0_{kv}" for h in hashes for kv in "kv"]
        present = pool.client.batch_exists(keys)
        actual = 0
        while actual < len(hashes) and present[2 * actual] and present[2 * actual + 1]:
            actual += 1
        hits += actual
        total += len(hashes)
        agree += predicted == actual
        requests += 1
        # The engine writes back the pages the pool lacked.
        missing = [k for k, p in zip(keys, present) if not p]
        if missing:
            now = time.monotonic()
            with pool.lock:
                for k in missing:
                    pool.written[k] = now
            pool.client.batch_put(missing, [bytes(PAGE_BYTES)] * len(missing))
            pool.wait_for(missing)
    return {"hit_rate": hits / total, "view_agrees": agree / requests, "requests": requests}


def percentile(xs: List[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(specs: Sequence[str], conversations_n: int = 24, turns: int = 4, systems: int = 4,
        seed: int = 7, model: str = "sim/model") -> Dict[str, dict]:
    """Runs both routers on the pools of `specs` (`master,events,admin`)."""
    import kvpool

    ctx = zmq.Context()
    stop = threading.Event()
    pools = []
    threads = []
    for s in specs:
        master, events, admin = s.split(",")
        p = Pool(master=master, events=events, admin=admin, client=kvpool.Client(master))
        ready = threading.Event()
        th = threading.Thread(target=p.listen, args=(ctx, stop, ready), daemon=True)
        th.start()
        ready.wait()
        pools.append(p)
        threads.append(th)
    # ZMQ's slow joiner: the subscription reaches each publisher shortly after connect.
    time.sleep(0.5)
    convs = conversations(conversations_n, turns, systems, seed)
    out = {}
    try:
        for router in ("random", "prefix"):
            # Each router gets its own model name, so their pages never meet.
            out[router] = simulate(pools, router, f"{model}-{router}", convs, seed)
        delays = [d for p in pools for d in p.delays]
        out["events"] = {
            "delay_p50_ms": percentile(delays, 0.5) * 1e3,
            "delay_p99_ms": percentile(delays, 0.99) * 1e3,
            "gaps": sum(p.gaps for p in pools),
            "unseen": sum(len(p.written) for p in pools),
        }
    finally:
        stop.set()
        for th in threads:
            th.join()
        for p in pools:
            p.client.close()
        ctx.term()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", action="append", required=True, help="master,events endpoint,admin address")
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--systems", type=int, default=4, help="distinct system prompts")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    r = run(a.pool, a.conversations, a.turns, a.systems, a.seed)
    for router in ("random", "prefix"):
        x = r[router]
        print(f"{router:>6}: hit rate {x['hit_rate']:.3f}, router view agrees {x['view_agrees']:.3f}, "
              f"{x['requests']} requests")
    e = r["events"]
    print(f"events: delay p50 {e['delay_p50_ms']:.2f} ms, p99 {e['delay_p99_ms']:.2f} ms, "
          f"gaps {e['gaps']}, unseen {e['unseen']}")


if __name__ == "__main__":
    main()
