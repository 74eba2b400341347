#!/usr/bin/env python3
"""kvpool's transfer engine against Mooncake's, in the same run.

What it measures: the prefill -> decode path of PD disaggregation. For each
system a receiver process ("decode") registers a 128 MiB buffer and an
initiator process ("prefill") registers its own; the initiator calls
batch_transfer_sync_write / batch_transfer_sync_read (the calls SGLang's
and vLLM's PD code make; batch 1 uses them too) with blocks of 4 KiB,
64 KiB, 512 KiB and 4 MiB, one or 32 blocks per call, again and again for
--seconds. Every row is checked once: the receiver's sha256 of its region
must match what the initiator wrote (or read), so a broken engine cannot
post a fast number. Each row runs --rounds times with the two systems back
to back, the order alternating per round, because the machine is shared
and noisy.

How to read the table: GB/s is bytes moved / wall time of the timed loop,
the median across rounds with (min-max) after it; kvpool/Mooncake is the
ratio of those medians (above 1: kvpool faster). p50 / p99 are per-call
latencies in microseconds, each the median across rounds. The TCP limit
line is one plain socket stream (Python sendall of 4 MiB chunks) over the
same path, measured each round right before the 4 MiB x 32 write row: the
ceiling for one connection, which is what kvpool's engine uses per call.

Modes: loopback (both sides on 127.0.0.1, kvpool forced onto TCP with
KVPOOL_ENGINE_SAME_HOST=0, so both systems use TCP), samehost (both on
127.0.0.1, kvpool as it runs by default: a peer on the same host copies
straight between the two processes' memories; Mooncake's engine, without
RDMA, still uses TCP) and netns (the receiver in the network namespace
--netns, reached over a veth pair that bench/engine_compare.sh sets up).
"""
import argparse
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

PEER = str(Path(__file__).with_name("engine_peer.py"))
SYSTEMS = ("kvpool", "mooncake")
NAMES = {"kvpool": "kvpool", "mooncake": "Mooncake"}
DISTS = {"kvpool": "kvpool", "mooncake": "mooncake-transfer-engine-non-cuda"}
OPS = ("write", "read")
BATCHES = (1, 32)
KiB, MiB = 1 << 10, 1 << 20
STARTUP_S = 60  # importing torch-free engines is quick, but the box is busy
COMMAND_S = 30  # fill / sha of at most 128 MiB
ROW_SLACK_S = 30  # past --seconds before a row counts as hung


class PeerError(Exception):
    pass


def die_with_parent():
    # A peer must not outlive the driver, however the driver ends.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Peer:
    """An engine_peer.py child; ask() sends one command and waits for the answer."""

    def __init__(self, role, args, log, netns=None, env=None):
        cmd = [sys.executable, PEER, role, *args]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.role = role
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                     env={**os.environ, **(env or {})}, preexec_fn=die_with_parent)
        self.pending = b""

    def ask(self, timeout, **command):
        if command:
            try:
                self.proc.stdin.write(json.dumps(command).encode() + b"\n")
                self.proc.stdin.flush()
            except OSError:
                raise PeerError(f"{self.role} exited (rc {self.proc.wait()})") from None
        deadline = time.monotonic() + timeout
        while True:
            line, nl, rest = self.pending.partition(b"\n")
            if nl:
                self.pending = rest
                if line.startswith(b"@@ "):
                    return json.loads(line[3:])
                continue
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise PeerError(f"{self.role}: no answer in {timeout:.0f} s")
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise PeerError(f"{self.role} exited (rc {self.proc.wait()})")
            self.pending += chunk

    def close(self, kill=False):
        """EOF ends a healthy peer; a hung or failed one is killed."""
        try:
            if kill:
                raise OSError
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class Pair:
    """One system's receiver and initiator, started on first use."""

    def __init__(self, system, mode, log):
        self.system, self.mode, self.log = system, mode, log
        self.rx = self.tx = None

    def start(self):
        m = self.mode
        env = m["env"] if self.system == "kvpool" else {}
        self.rx = Peer("receiver", ["--system", self.system, "--host", m["rx_host"]], self.log, m["netns"], env)
        self.target = self.rx.ask(STARTUP_S)
        self.tx = Peer("initiator", ["--system", self.system, "--host", m["tx_host"]], self.log, None, env)
        self.tx.ask(STARTUP_S)

    def close(self, kill=False):
        for p in (self.tx, self.rx):
            if p:
                p.close(kill)
        self.rx = self.tx = None

    def run(self, op, size, batch, seconds, seed):
        """One timed row; on any failure the pair is closed so the next row starts fresh."""
        n = size * batch
        try:
            if not self.rx:
                self.start()
            self.rx.ask(COMMAND_S, cmd="fill", nbytes=n, seed=seed if op == "read" else None)
            r = self.tx.ask(seconds + ROW_SLACK_S, cmd="run", op=op, size=size, batch=batch, seconds=seconds,
                            seed=seed, **self.target)
            if r["ok"] and self.rx.ask(COMMAND_S, cmd="sha", nbytes=n)["sha"] != r.pop("sha"):
                r = {"ok": False, "error": "data check failed"}
        except PeerError as e:
            r = {"ok": False, "error": str(e)}
        if not r["ok"]:
            self.close(kill=True)
        return r


def tcp_limit(mode, log, seconds=1.0):
    """GB/s of one TCP stream of 4 MiB sendall()s, until the sink has every byte."""
    sink = Peer("sink", ["--host", mode["rx_host"]], log, mode["netns"])
    try:
        port = sink.ask(STARTUP_S)["port"]
        chunk = bytes(4 * MiB)
        with socket.create_connection((mode["rx_host"], port)) as s:
            sent, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                s.sendall(chunk)
                sent += len(chunk)
            s.shutdown(socket.SHUT_WR)
            got = sink.ask(COMMAND_S)["bytes"]
            wall = time.perf_counter() - t0
        return got / wall / 1e9 if got == sent else None
    except (PeerError, OSError):
        return None
    finally:
        sink.close()


def memcpy_limit(seconds=1.0):
    """GB/s of one core copying 128 MiB between two buffers: the ceiling of
    a same-host copy, which is one memcpy by the kernel."""
    import numpy as np
    src = np.ones(128 * MiB, dtype=np.uint8)
    dst = np.zeros_like(src)
    np.copyto(dst, src)  # fault the pages in outside the timed loop
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        np.copyto(dst, src)
        n += 1
    return n * src.nbytes / (time.perf_counter() - t0) / 1e9


def parse_size(text):
    text = text.strip()
    for suffix, unit in (("KiB", KiB), ("MiB", MiB), ("K", KiB), ("M", MiB)):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * unit
    return int(text)


def human(size):
    return f"{size // MiB} MiB" if size % MiB == 0 else f"{size // KiB} KiB" if size % KiB == 0 else f"{size} B"


def num(x):
    return f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def summary(runs):
    """Medians across rounds of the successful runs (None if none succeeded)."""
    ok = [r for r in runs if r["ok"]]
    if not ok:
        return None
    g = [r["gbps"] for r in ok]
    return {"gbps": statistics.median(g), "min": min(g), "max": max(g), "ok": len(ok), "n": len(runs),
            "p50": statistics.median(r["p50_us"] for r in ok), "p99": statistics.median(r["p99_us"] for r in ok)}


def cells(runs):
    s = summary(runs)
    if s is None:
        errors = sorted({r["error"] for r in runs})
        return f"failed ({'; '.join(errors)})", "failed"
    partial = f" [{s['ok']}/{s['n']} ok]" if s["ok"] < s["n"] else ""
    return (f"{num(s['gbps'])} ({num(s['min'])}–{num(s['max'])}){partial}", f"{num(s['p50'])} / {num(s['p99'])}")


def table(results, config):
    v = config["versions"]
    out = [f"kvpool {v['kvpool']} (native module built {config['kvpool_build']}) vs Mooncake {v['mooncake']} transfer engine over TCP, {config['cpus']} CPUs, "
           f"{config['rounds']} round(s) of ~{config['seconds']} s per row per system, {config['date']}. "
           "GB/s: median (min–max) across rounds; p50 / p99: per-call µs, median across rounds.", *config["notes"]]
    for mode in config["modes"]:
        def runs(system, op, batch, size):
            return [r for r in results["runs"]
                    if (r["mode"], r["system"], r["op"], r["batch"], r["size"]) == (mode, system, op, batch, size)]

        out += ["", f"### {mode} ({config['paths'][mode]})", "",
                "| op | block × batch | kvpool GB/s | Mooncake GB/s | kvpool/Mooncake | kvpool p50 / p99 µs | Mooncake p50 / p99 µs |",
                "|---|---|---|---|---|---|---|"]
        for op, batch, size in config["rows"]:
            k, m = runs("kvpool", op, batch, size), runs("mooncake", op, batch, size)
            (kg, kl), (mg, ml), ks, ms = cells(k), cells(m), summary(k), summary(m)
            ratio = f"{ks['gbps'] / ms['gbps']:.2f}×" if ks and ms else "–"
            out.append(f"| {op} | {human(size)} × {batch} | {kg} | {mg} | {ratio} | {kl} | {ml} |")
        out.append("")
        lim = [x for x in results["limits"][mode] if x is not None]
        if not lim:
            out.append("Limit: measurement failed.")
            continue
        limit = statistics.median(lim)
        op, batch, size = config["limit_row"]
        what = ("memcpy limit (one core copying 128 MiB, 1 s" if mode == "samehost" else
                "Single-stream TCP limit on this path (Python sendall of 4 MiB chunks, 1 s")
        out.append(f"{what}, measured next to "
                   f"the {human(size)} × {batch} {op} row each round): {num(limit)} GB/s median "
                   f"({num(min(lim))}–{num(max(lim))}).")
        for s in SYSTEMS:
            sm = summary(runs(s, op, batch, size))
            if sm:
                out.append(f"{NAMES[s]} {human(size)} × {batch} {op} as a fraction of that limit: "
                           f"{sm['gbps'] / limit:.2f} ({num(sm['gbps'])} / {num(limit)} GB/s).")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="loopback", help="comma list of loopback, samehost, netns")
    ap.add_argument("--netns", help="namespace holding --peer-ip (netns mode)")
    ap.add_argument("--host-ip", default="10.99.0.1", help="initiator's address in netns mode")
    ap.add_argument("--peer-ip", default="10.99.0.2", help="receiver's address in netns mode")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0, help="timed loop per row per system")
    ap.add_argument("--sizes", default="4KiB,64KiB,512KiB,4MiB")
    ap.add_argument("--note", action="append", default=[], help="a line to print under the title")
    ap.add_argument("--out", default="/tmp/engine_compare")
    a = ap.parse_args()
    # SIGTERM must unwind through the finally below, which ends the peers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    modes = {"loopback": {"rx_host": "127.0.0.1", "tx_host": "127.0.0.1", "netns": None,
                          "env": {"KVPOOL_ENGINE_SAME_HOST": "0"}},
             "samehost": {"rx_host": "127.0.0.1", "tx_host": "127.0.0.1", "netns": None, "env": {}},
             # kvpool refuses to serve off loopback without a cluster secret; Mooncake has none to set.
             "netns": {"rx_host": a.peer_ip, "tx_host": a.host_ip, "netns": a.netns, "env": {"KVPOOL_INSECURE": "1"}}}
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    config = {"modes": [m for m in a.modes.split(",") if m], "rounds": a.rounds, "seconds": a.seconds,
              "sizes": sizes, "rows": [(op, batch, size) for op in OPS for batch in BATCHES for size in sizes],
              # The limit is measured next to the row it is compared with, as the load on the box drifts.
              "limit_row": ("write", 32, max(sizes)), "notes": a.note, "cpus": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "versions": {s: importlib.metadata.version(d) for s, d in DISTS.items()},
              # kvpool's engine is under active work: say which build of its native module ran.
              "kvpool_build": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(
                  os.path.getmtime(importlib.util.find_spec("kvpool._native").origin))),
              "paths": {"loopback": "127.0.0.1 to 127.0.0.1, kvpool on TCP",
                        "samehost": "127.0.0.1 to 127.0.0.1, kvpool's same-host copies, Mooncake on TCP",
                        "netns": f"{a.host_ip} to {a.peer_ip} in namespace {a.netns}, over a veth pair"}}
    if "netns" in config["modes"] and not a.netns:
        ap.error("netns mode needs --netns")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"config": config, "limits": {}, "runs": []}
    seed = 0
    with open(out / "peers.log", "ab") as log:
        for name in config["modes"]:
            mode = modes[name]
            pairs = {s: Pair(s, mode, log) for s in SYSTEMS}
            results["limits"][name] = []
            try:
                for rnd in range(a.rounds):
                    order = SYSTEMS if rnd % 2 == 0 else SYSTEMS[::-1]
                    for op, batch, size in config["rows"]:
                        if (op, batch, size) == config["limit_row"]:
                            limit = memcpy_limit() if name == "samehost" else tcp_limit(mode, log)
                            results["limits"][name].append(limit)
                            print(f"{name} round {rnd + 1}: limit {limit and round(limit, 2)} GB/s",
                                  file=sys.stderr)
                        for s in order:
                            seed += 1
                            r = pairs[s].run(op, size, batch, a.seconds, seed)
                            results["runs"].append({"mode": name, "round": rnd, "system": s, "op": op,
                                                    "size": size, "batch": batch, **r})
                            shown = f"{r['gbps']:.3g} GB/s, p50 {r['p50_us']:.0f} µs" if r["ok"] else r["error"]
                            print(f"{name} round {rnd + 1}: {op} {human(size)} x{batch} {s}: {shown}",
                                  file=sys.stderr, flush=True)
            finally:
                for p in pairs.values():
                    p.close()
    (out / "results.json").write_text(json.dumps(results, indent=1))
    text = table(results, config)
    (out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
