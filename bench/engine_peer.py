#!/usr/bin/env python3
"""One side of bench/engine_compare.py, driven over stdin/stdout.

Roles:
  receiver   the decode side: an engine with one registered buffer that the
             initiator writes into and reads from
  initiator  the prefill side: an engine with its own registered buffer; runs
             the timed transfer loops
  sink       a plain TCP socket that drains one stream, for the link's limit

Each command is one JSON line on stdin; each answer is one line on stdout
starting with "@@ " (Mooncake logs to the same process, so the driver skips
every other line). EOF on stdin ends the process.
"""
import argparse
import hashlib
import importlib
import json
import socket
import sys
import time

import numpy as np

MODULES = {"kvpool": "kvpool.engine", "mooncake": "mooncake.engine"}
WARMUP_S = 0.1
MIN_CALLS = 5


def reply(**fields):
    print("@@ " + json.dumps(fields), flush=True)


def commands():
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)


def fill(buf, nbytes, seed):
    """Random bytes from `seed` (both sides derive the same ones), or zeros."""
    if seed is None:
        buf[:nbytes] = 0
    else:
        buf[:nbytes] = np.frombuffer(np.random.default_rng(seed).bytes(nbytes), np.uint8)


def start_engine(system, host, nbytes):
    te = importlib.import_module(MODULES[system]).TransferEngine()
    if te.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
        sys.exit(f"{system}: initialize({host}) failed")
    # Touch every page now so first-touch faults are not timed.
    buf = np.ones(nbytes, np.uint8)
    if te.register_memory(buf.ctypes.data, nbytes) != 0:
        sys.exit(f"{system}: register_memory failed")
    return te, buf


def receiver(a):
    te, buf = start_engine(a.system, a.host, a.nbytes)
    reply(session=f"{a.host}:{te.get_rpc_port()}", addr=buf.ctypes.data)
    for c in commands():
        if c["cmd"] == "fill":
            fill(buf, c["nbytes"], c["seed"])
            reply(ok=True)
        elif c["cmd"] == "sha":
            reply(sha=hashlib.sha256(buf[: c["nbytes"]]).hexdigest())


def run_row(te, buf, c):
    """Times one row: the same batch again and again for c["seconds"].

    Local block i goes to remote block batch-1-i, so an engine that mixes up
    addresses fails the check; the answer carries the sha256 the receiver's
    region must have afterwards (write) or had (read).
    """
    size, batch = c["size"], c["batch"]
    n = size * batch
    args = (c["session"], [buf.ctypes.data + i * size for i in range(batch)],
            [c["addr"] + (batch - 1 - i) * size for i in range(batch)], [size] * batch)
    if c["op"] == "write":
        fill(buf, n, c["seed"])
        call = te.batch_transfer_sync_write
    else:
        fill(buf, n, None)  # a read that moves nothing must fail the check
        call = te.batch_transfer_sync_read

    def loop(seconds, min_calls):
        lat_ns = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds or len(lat_ns) < min_calls:
            t = time.perf_counter_ns()
            rc = call(*args)
            lat_ns.append(time.perf_counter_ns() - t)
            if rc != 0:
                raise RuntimeError(f"{c['op']} returned {rc}")
        return lat_ns, time.perf_counter() - t0

    try:
        loop(WARMUP_S, 1)  # connection setup and handshakes stay out of the timing
        lat_ns, wall = loop(c["seconds"], MIN_CALLS)
    except RuntimeError as e:
        return {"ok": False, "error": str(e)}
    view = hashlib.sha256()
    for i in reversed(range(batch)):
        view.update(buf[i * size:(i + 1) * size])
    us = np.asarray(lat_ns) / 1e3
    return {"ok": True, "calls": len(lat_ns), "wall_s": wall, "gbps": len(lat_ns) * n / wall / 1e9,
            "p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)),
            "sha": view.hexdigest()}


def initiator(a):
    te, buf = start_engine(a.system, a.host, a.nbytes)
    reply(ok=True)
    for c in commands():
        reply(**run_row(te, buf, c))


def sink(a):
    ls = socket.create_server((a.host, 0))
    reply(port=ls.getsockname()[1])
    conn, _ = ls.accept()
    mv = memoryview(bytearray(4 << 20))
    got = 0
    while n := conn.recv_into(mv):
        got += n
    reply(bytes=got)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["receiver", "initiator", "sink"])
    ap.add_argument("--system", choices=sorted(MODULES))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--nbytes", type=int, default=128 << 20)
    a = ap.parse_args()
    {"receiver": receiver, "initiator": initiator, "sink": sink}[a.role](a)


if __name__ == "__main__":
    main()
