#!/usr/bin/env python3
"""One load process of the fault-latency bench: open-loop gets and puts at a
fixed rate through the MooncakeDistributedStore API (kvpool.mooncake or the
real mooncake.store), every operation recorded.

Pacing: a scheduler thread releases one get every 1/--get-rate s and one put
every 1/--put-rate s, on a fixed schedule that never waits for answers;
worker threads execute them. Latency is measured from the *scheduled* time,
so a stall shows as latency of every op it delayed (no coordinated
omission). Each key set (A, B, C) and the puts have their own workers
(--get-workers per set, --put-workers), all on one store client, so gets
stuck on a dead store cannot queue the other classes' ops inside this
harness; whatever slows them down is the client library's doing.

Keys: gets pick a set (A, B, C) uniformly, then a key of it, from the JSON
file --keys (rewritten by the orchestrator when it re-populates; polled every
0.2 s). Puts write new keys put/<gen>/<tag>/<seq> (gen = 10 s bucket of wall
time, so old generations can be removed between faults).

Each get uses get_into into a registered buffer (both systems answer bytes
read or a negative code the same way) and checks every byte against the
value derived from the key (common.value_for). Results:
  ok     bytes read and equal
  miss   -704 OBJECT_NOT_FOUND
  err    any other negative code (kept in `code`)
  wrong  bytes read but not the expected ones, or a short read  (loud)
  unfinished  still running when the process was told to stop

Output: CSV --out with columns
  sched,start,end,op,set,epoch,res,code
(wall-clock seconds; `end` of an unfinished op is the stop time).
Stops on SIGTERM/SIGINT or when --stop-file exists; waits up to --drain s
for running ops.
"""
import argparse
import importlib
import json
import os
import queue
import random
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import OBJECT_NOT_FOUND, value_for  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--module", default="kvpool.mooncake")
    p.add_argument("--master", required=True)
    p.add_argument("--metadata", default="P2PHANDSHAKE")
    p.add_argument("--hostname", default="127.0.0.1")
    p.add_argument("--keys", required=True, help="JSON file with the key sets")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", default="c0")
    p.add_argument("--get-rate", type=float, default=100.0)
    p.add_argument("--put-rate", type=float, default=20.0)
    p.add_argument("--size", type=int, default=65536)
    p.add_argument("--get-workers", type=int, default=4)
    p.add_argument("--put-workers", type=int, default=4)
    p.add_argument("--local-buffer", type=int, default=64 << 20)
    p.add_argument("--stop-file", default="")
    p.add_argument("--drain", type=float, default=20.0)
    p.add_argument("--max-seconds", type=float, default=3600.0)
    a = p.parse_args()

    mod = importlib.import_module(a.module)
    s = mod.MooncakeDistributedStore()
    deadline = time.time() + 60
    while True:
        rc = s.setup(a.hostname, a.metadata, 0, a.local_buffer, "tcp", "", a.master)
        if rc == 0 or time.time() > deadline:
            break
        time.sleep(1)
    print(f"[{a.tag}] setup rc={rc}", flush=True)
    if rc != 0:
        sys.exit(1)
    size = a.size
    nbuf = 3 * a.get_workers
    buf = np.zeros(nbuf * size, dtype=np.uint8)
    ptr = buf.ctypes.data
    rrc = s.register_buffer(ptr, buf.nbytes)
    if rrc != 0:
        print(f"[{a.tag}] register_buffer rc={rrc}", flush=True)
        sys.exit(1)
    view = memoryview(buf)

    # ---- key sets, reloaded when the file changes
    sets = {"epoch": -1, "A": [], "B": [], "C": []}
    sets_lock = threading.Lock()
    mtime = [0.0]

    def reload():
        try:
            st = os.stat(a.keys)
        except FileNotFoundError:
            return
        if st.st_mtime == mtime[0]:
            return
        try:
            with open(a.keys) as f:
                d = json.load(f)
        except (OSError, ValueError):
            return  # being rewritten; next poll
        mtime[0] = st.st_mtime
        with sets_lock:
            sets.update({"epoch": d.get("epoch", 0), "A": d.get("A", []), "B": d.get("B", []), "C": d.get("C", [])})

    reload()
    stop = threading.Event()

    def on_signal(*_):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    out = open(a.out, "w", buffering=1 << 16)
    out.write("sched,start,end,op,set,epoch,res,code\n")
    out_lock = threading.Lock()
    running = {}  # thread id -> (sched, start, op, set, epoch)
    run_lock = threading.Lock()

    def record(sched, start, end, op, kset, epoch, res, code):
        with out_lock:
            out.write(f"{sched:.6f},{start:.6f},{end:.6f},{op},{kset},{epoch},{res},{code}\n")

    getqs = {k: queue.Queue() for k in ("A", "B", "C")}
    putq: "queue.Queue" = queue.Queue()
    rng = random.Random(hash(a.tag) ^ os.getpid())

    def scheduler():
        t0 = time.time() + 0.05
        gi = 1.0 / a.get_rate if a.get_rate > 0 else None
        pi = 1.0 / a.put_rate if a.put_rate > 0 else None
        ng, np_ = t0, t0 + (pi or 0) / 2
        seq = 0
        last_poll = 0.0
        end_at = time.time() + a.max_seconds
        while not stop.is_set():
            now = time.time()
            if now - last_poll > 0.2:
                reload()
                last_poll = now
                if a.stop_file and os.path.exists(a.stop_file):
                    stop.set()
                    break
                if now > end_at:
                    stop.set()
                    break
            nxt = min(x for x in (ng if gi else None, np_ if pi else None) if x is not None)
            if nxt > now:
                time.sleep(min(nxt - now, 0.2))
                continue
            if gi and ng <= now:
                with sets_lock:
                    avail = [k for k in ("A", "B", "C") if sets[k]]
                    if avail:
                        ks = rng.choice(avail)
                        getqs[ks].put((ng, "get", ks, sets["epoch"], rng.choice(sets[ks])))
                ng += gi
            if pi and np_ <= now:
                seq += 1
                gen = int(np_ // 10)
                putq.put((np_, "put", "P", sets["epoch"], f"put/{gen}/{a.tag}/{seq}"))
                np_ += pi

    def get_worker(slot, getq):
        off = slot * size
        addr = ptr + off
        while True:
            item = getq.get()
            if item is None:
                return
            sched, op, ks, epoch, key = item
            start = time.time()
            with run_lock:
                running[threading.get_ident()] = (sched, start, op, ks, epoch)
            rc = s.get_into(key, addr, size)
            end = time.time()
            if rc == size:
                res = "ok" if bytes(view[off:off + size]) == value_for(key, size) else "wrong"
                code = 0
            elif rc == OBJECT_NOT_FOUND:
                res, code = "miss", rc
            elif rc < 0:
                res, code = "err", rc
            else:
                res, code = "wrong", rc  # short read
            if res == "wrong":
                print(f"[{a.tag}] WRONG BYTES for {key} (rc={rc})", flush=True)
            with run_lock:
                running.pop(threading.get_ident(), None)
            record(sched, start, end, op, ks, epoch, res, code)

    def put_worker():
        while True:
            item = putq.get()
            if item is None:
                return
            sched, op, ks, epoch, key = item
            value = value_for(key, size)
            start = time.time()
            with run_lock:
                running[threading.get_ident()] = (sched, start, op, ks, epoch)
            rc = s.put(key, value)
            end = time.time()
            with run_lock:
                running.pop(threading.get_ident(), None)
            record(sched, start, end, op, ks, epoch, "ok" if rc == 0 else "err", rc)

    workers = [threading.Thread(target=get_worker, args=(j * a.get_workers + i, getqs[k]), daemon=True)
               for j, k in enumerate(("A", "B", "C")) for i in range(a.get_workers)]
    workers += [threading.Thread(target=put_worker, daemon=True) for _ in range(a.put_workers)]
    for w in workers:
        w.start()
    sch = threading.Thread(target=scheduler, daemon=True)
    sch.start()
    print(f"[{a.tag}] running: {a.get_rate}/s gets, {a.put_rate}/s puts, size {size}", flush=True)
    while not stop.is_set():
        stop.wait(0.5)
        with out_lock:
            out.flush()
    sch.join(timeout=2)
    stop_t = time.time()
    # Ops scheduled but never started count as unfinished too.
    pending = []
    for q in (*getqs.values(), putq):
        while True:
            try:
                it = q.get_nowait()
            except queue.Empty:
                break
            if it is not None:
                pending.append(it)
    for q in getqs.values():
        for _ in range(a.get_workers):
            q.put(None)
    for _ in range(a.put_workers):
        putq.put(None)
    end_wait = time.time() + a.drain
    for w in workers:
        w.join(timeout=max(0.0, end_wait - time.time()))
    with run_lock:
        stuck = list(running.values())
    for sched, start, op, ks, epoch in stuck:
        record(sched, start, stop_t, op, ks, epoch, "unfinished", 0)
    for sched, op, ks, epoch, _key in pending:
        record(sched, stop_t, stop_t, op, ks, epoch, "unfinished", 0)
    with out_lock:
        out.flush()
        os.fsync(out.fileno())
    out.close()
    print(f"[{a.tag}] stopped ({len(stuck)} ops stuck, {len(pending)} never started)", flush=True)
    # Do not wait in close(): a client stuck on a dead peer may never return.
    os._exit(0)


if __name__ == "__main__":
    main()
