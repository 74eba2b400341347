#!/usr/bin/env python3
"""An engine's load on the pool through a rolling upgrade (bench/rollout.sh).

Runs as the ``prefill`` or ``decode`` role of the rollout group, through
the calls SGLang's HiCache makes on Mooncake's store
(``kvpool.mooncake.MooncakeDistributedStore``: ``batch_is_exist``,
``batch_put_from``, ``batch_get_into`` on a registered buffer), with
HiCache's page keys (``{sha256}_{rank}_{k|v}``).

- prefill writes the working set (--pages pages of --page-size, --replicas
  copies) once, then keeps writing new pages (one batch of 8 every 50 ms) and
  reading the working set;
- decode waits until the working set exists, then reads it in batches of 32
  random pages as fast as it can.

Every second each role appends a JSON line to --out: batches read, pages
hit (every byte back), pages missed, failed calls, the p99 of a batch read
in ms, and the same for its puts.
"""

import argparse
import ctypes
import hashlib
import json
import random
import threading
import time

from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig

BATCH = 32


def page_key(i: int, half: str) -> str:
    """HiCache's key of page i: the page's sha256, rank 0, K or V half."""
    return f"{hashlib.sha256(b'rollout page %d' % i).hexdigest()}_0_{half}"


class Second:
    """One second's counts of one kind of call."""

    def __init__(self) -> None:
        self.calls = self.hits = self.misses = self.errors = 0
        self.lat: list[float] = []

    def line(self, prefix: str) -> dict:
        lat = sorted(self.lat)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3 if lat else None
        return {
            f"{prefix}calls": self.calls,
            f"{prefix}hits": self.hits,
            f"{prefix}misses": self.misses,
            f"{prefix}errors": self.errors,
            f"{prefix}p99_ms": p99,
        }


class Load:
    """Counts per second, shared by the role's threads."""

    def __init__(self, out: str, role: str) -> None:
        self.out = open(out, "a", buffering=1)
        self.role = role
        self.lock = threading.Lock()
        self.reads = Second()
        self.puts = Second()

    def flush(self) -> None:
        with self.lock:
            reads, puts = self.reads, self.puts
            self.reads, self.puts = Second(), Second()
        line = {"t": round(time.time(), 3), "role": self.role}
        line.update(reads.line("get_"))
        line.update(puts.line("put_"))
        self.out.write(json.dumps(line) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["prefill", "decode"], required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--local", required=True, help="this instance's address")
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--page-size", type=int, default=64 << 10)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    store = MooncakeDistributedStore()
    rc = store.setup(a.local, "P2PHANDSHAKE", 0, 64 << 20, "tcp", "", a.master)
    if rc != 0:
        raise SystemExit(f"setup failed: {rc}")
    buf_len = BATCH * a.page_size
    buf = ctypes.create_string_buffer(buf_len)
    base = ctypes.addressof(buf)
    if store.register_buffer(base, buf_len) != 0:
        raise SystemExit("register_buffer failed")
    keys = [page_key(i, h) for i in range(a.pages) for h in ("k", "v")]
    load = Load(a.out, a.role)
    if a.role == "prefill":
        cfg = ReplicateConfig()
        cfg.replica_num = a.replicas
        fill(store, keys, base, a.page_size, cfg)
        threading.Thread(target=writer, args=(store, load, a.page_size, cfg), daemon=True).start()
    else:
        while not all(r == 1 for r in store.batch_is_exist(keys[:BATCH]) + store.batch_is_exist(keys[-BATCH:])):
            time.sleep(0.5)
    threading.Thread(target=reader, args=(store, load, keys, base, a.page_size), daemon=True).start()
    while True:
        time.sleep(1 - time.time() % 1)
        load.flush()


def fill(store: MooncakeDistributedStore, keys: list, base: int, size: int, cfg: ReplicateConfig) -> None:
    """Writes the working set, batch by batch, retrying failed batches."""
    ctypes.memset(base, 0x5A, BATCH * size)
    for i in range(0, len(keys), BATCH):
        part = keys[i : i + BATCH]
        ptrs = [base + j * size for j in range(len(part))]
        while any(r != 0 for r in store.batch_put_from(part, ptrs, [size] * len(part), cfg)):
            time.sleep(0.1)


def reader(store: MooncakeDistributedStore, load: Load, keys: list, base: int, size: int) -> None:
    """Reads batches of random working-set pages, as a prefix hit does."""
    ptrs = [base + j * size for j in range(BATCH)]
    sizes = [size] * BATCH
    while True:
        part = random.sample(keys, BATCH)
        t0 = time.monotonic()
        try:
            got = store.batch_get_into(part, ptrs, sizes)
        except Exception:  # noqa: BLE001 - any failure is counted, not fatal
            got = None
        dt = time.monotonic() - t0
        with load.lock:
            s = load.reads
            s.calls += 1
            s.lat.append(dt)
            if got is None:
                s.errors += 1
                continue
            s.hits += sum(1 for r in got if r == size)
            s.misses += sum(1 for r in got if r != size and r in (0, -704))
            s.errors += sum(1 for r in got if r != size and r not in (0, -704))


def writer(store: MooncakeDistributedStore, load: Load, size: int, cfg: ReplicateConfig) -> None:
    """Writes new pages, 8 every 50 ms, as prefill offloads new KV."""
    buf = ctypes.create_string_buffer(8 * size)
    base = ctypes.addressof(buf)
    store.register_buffer(base, 8 * size)
    ptrs = [base + j * size for j in range(8)]
    n = 0
    while True:
        part = [page_key(10_000_000 + n + j, "k") for j in range(8)]
        n += 8
        t0 = time.monotonic()
        try:
            rcs = store.batch_put_from(part, ptrs, [size] * 8, cfg)
        except Exception:  # noqa: BLE001
            rcs = [-1] * 8
        dt = time.monotonic() - t0
        with load.lock:
            s = load.puts
            s.calls += 1
            s.lat.append(dt)
            s.hits += sum(1 for r in rcs if r == 0)
            s.errors += sum(1 for r in rcs if r != 0)
        time.sleep(max(0.0, 0.05 - dt))


if __name__ == "__main__":
    main()
