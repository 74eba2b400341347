"""One call sequence on the real Mooncake transfer engine and on kvpool's,
compared: return codes, the bytes that landed, the notifies delivered.

Each system runs in its own interpreter (Mooncake's engine and kvpool's
shim must not meet in one), with two engines in it standing for prefill and
decode, as two processes would over loopback TCP. The sequence covers what
SGLang's and vLLM's PD code calls and the rest of Mooncake 0.3.13's surface
whose outcome Mooncake defines (calls on which Mooncake crashes or reads
arbitrary memory, such as a spent batch id, are compared nowhere: kvpool's
answers for those are in test_engine.py). Skipped only when the Mooncake
wheel is not installed (``KVPOOL_TEST_MOONCAKE=0``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("mooncake.engine", reason="the Mooncake wheel is not installed (KVPOOL_TEST_MOONCAKE=0)")

SEQUENCE = r"""
import hashlib, json, socket, sys, time
import numpy as np
if sys.argv[1] == "mooncake":
    from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode
else:
    from kvpool.engine import TransferEngine, TransferNotify, TransferOpcode

PAGE, PAGES = 4096, 64
out = {}
prefill, decode = TransferEngine(), TransferEngine()
out["initialize"] = [e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") for e in (prefill, decode)]
peer = "127.0.0.1:%d" % decode.get_rpc_port()
me = "127.0.0.1:%d" % prefill.get_rpc_port()
rng = np.random.default_rng(5)
src = rng.integers(0, 256, size=PAGES * PAGE, dtype=np.uint8)
back = np.zeros_like(src)
dst = np.zeros(PAGES * PAGE, dtype=np.uint8)
out["register"] = [
    prefill.register_memory(src.ctypes.data, src.nbytes),
    prefill.register_memory(src.ctypes.data + PAGE, PAGE),  # overlaps: -7
    prefill.batch_register_memory([back.ctypes.data], [back.nbytes]),
    decode.register_memory(dst.ctypes.data, dst.nbytes),
    prefill.unregister_memory(src.ctypes.data + 1),  # not registered: -3
]
out["first_buffer"] = [
    prefill.get_first_buffer_address(peer) == dst.ctypes.data,
    decode.get_first_buffer_address(peer) == dst.ctypes.data,
]
perm = [int(p) for p in rng.permutation(PAGES)]
out["scatter_write"] = prefill.batch_transfer_sync_write(
    peer, [src.ctypes.data + i * PAGE for i in range(PAGES)], [dst.ctypes.data + p * PAGE for p in perm], [PAGE] * PAGES)
out["after_scatter"] = hashlib.sha256(dst.tobytes()).hexdigest()
out["read_back"] = prefill.batch_transfer_sync_read(peer, [back.ctypes.data], [dst.ctypes.data], [back.nbytes])
out["back"] = hashlib.sha256(back.tobytes()).hexdigest()
out["sync"] = [
    prefill.transfer_sync_write(peer, src.ctypes.data, dst.ctypes.data, 3 * PAGE),
    prefill.transfer_sync_read(peer, back.ctypes.data, dst.ctypes.data + 9 * PAGE, 2 * PAGE),
    prefill.transfer_sync(peer, src.ctypes.data + PAGE, dst.ctypes.data + 20 * PAGE, PAGE, TransferOpcode.Write),
]
ids = [prefill.batch_transfer_async_write(peer, [src.ctypes.data + i * PAGE], [dst.ctypes.data + (40 + i) * PAGE], [PAGE])
       for i in range(3)]
ids.append(prefill.batch_transfer_async(peer, [back.ctypes.data], [dst.ctypes.data + 50 * PAGE], [PAGE], TransferOpcode.Read))
ids.append(prefill.batch_transfer_async_read(peer, [back.ctypes.data + PAGE], [dst.ctypes.data + 51 * PAGE], [PAGE]))
out["async_ids_nonzero"] = [i != 0 for i in ids]
out["async_status"] = prefill.get_batch_transfer_status(ids)
one = prefill.transfer_submit_write(peer, src.ctypes.data + 5 * PAGE, dst.ctypes.data + 60 * PAGE, PAGE)
deadline = time.monotonic() + 20
while (st := prefill.transfer_check_status(one)) == 0 and time.monotonic() < deadline:
    time.sleep(0.001)
out["check_status"] = st
out["notify"] = prefill.batch_transfer_sync(
    peer, [src.ctypes.data], [dst.ctypes.data + 63 * PAGE], [PAGE], TransferOpcode.Write, TransferNotify("prefill-0", "req-7"))
deadline = time.monotonic() + 5
notes = []
while not notes and time.monotonic() < deadline:
    notes = [[n.name, n.msg] for n in decode.get_notifies()]
out["notifies"] = notes
out["notifies_again"] = [[n.name, n.msg] for n in decode.get_notifies()]
out["final"] = hashlib.sha256(dst.tobytes()).hexdigest()
out["back_final"] = hashlib.sha256(back.tobytes()).hexdigest()
managed = prefill.allocate_managed_buffer(2 * PAGE)
out["managed"] = [
    managed != 0,
    prefill.write_bytes_to_buffer(managed, b"kv bytes", 8),
    prefill.read_bytes_from_buffer(managed, 8).decode(),
    prefill.transfer_sync_write(peer, managed, dst.ctypes.data + 62 * PAGE, 8),
    bytes(dst[62 * PAGE: 62 * PAGE + 8]).decode(),
    prefill.free_managed_buffer(managed, 2 * PAGE),
]
out["probe"] = prefill.send_probe(peer)
out["mismatched_lists"] = prefill.batch_transfer_async_write(peer, [src.ctypes.data], [], [PAGE])
out["unregister"] = [prefill.unregister_memory(src.ctypes.data), prefill.batch_unregister_memory([back.ctypes.data])]
out["session"] = me.startswith("127.0.0.1:")
print("RESULT " + json.dumps(out), flush=True)
"""


def run(system: str) -> dict:
    env = dict(os.environ, MC_TRANSFER_TIMEOUT="10")
    proc = subprocess.run(
        [sys.executable, "-c", SEQUENCE, system], capture_output=True, text=True, timeout=120, env=env
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{system} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_the_same_calls_give_the_same_codes_bytes_and_notifies():
    mooncake, kvpool = run("mooncake"), run("kvpool")
    # Mooncake's own run is the reference: it must have done what the
    # sequence expects, or the comparison proves nothing.
    assert mooncake["register"] == [0, -7, 0, 0, -3]
    assert mooncake["scatter_write"] == 0 and mooncake["notifies"] == [["prefill-0", "req-7"]]
    for key in mooncake:
        assert kvpool[key] == mooncake[key], f"{key}: kvpool {kvpool[key]!r}, Mooncake {mooncake[key]!r}"
    assert kvpool.keys() == mooncake.keys()
