#!/usr/bin/env python3
"""A Mooncake storage node for the fault bench: lends --segment bytes through
MooncakeDistributedStore.setup (as bench/compare/store_proc.py does) and
prints `READY <rc> <segment name>` so the orchestrator can pin keys to it."""
import argparse, importlib, os, signal, sys, time

p = argparse.ArgumentParser()
p.add_argument("--module", default="mooncake.store")
p.add_argument("--segment", type=int, default=256 << 20)
p.add_argument("--local-buffer", type=int, default=16 << 20)
p.add_argument("--master", required=True)
p.add_argument("--metadata", default="P2PHANDSHAKE")
p.add_argument("--hostname", default="127.0.0.1")
p.add_argument("--lifetime", type=float, default=3600.0)
a = p.parse_args()

s = importlib.import_module(a.module).MooncakeDistributedStore()
rc = s.setup(a.hostname, a.metadata, a.segment, a.local_buffer, "tcp", "", a.master)
print(f"READY {rc} {s.get_hostname() if rc == 0 else '-'} pid={os.getpid()}", flush=True)
if rc != 0:
    sys.exit(1)
stop = False
def h(*_):
    global stop; stop = True
signal.signal(signal.SIGTERM, h); signal.signal(signal.SIGINT, h)
deadline = time.time() + a.lifetime
while not stop and time.time() < deadline:
    time.sleep(0.5)
os._exit(0)
