"""kvpool's ``mooncake.engine.TransferEngine`` between two real processes.

The decode side runs in a subprocess that imports the engine the way SGLang
and vLLM do (``from mooncake.engine import TransferEngine``, through
``kvpool.engine.install_mooncake_shim``) and registers a numpy buffer with a
guard page on each side that it does not register. This process plays
prefill: it writes KV pages into decode's buffer, decode reports what its
memory holds, and this side reads pages back. No kvpool cluster is needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from kvpool.engine import TransferEngine, TransferNotify, TransferOpcode

PAGE = 4096
PAGES = 64
GUARD = 0xEE

DECODE = r"""
import hashlib, json, sys
import numpy as np
from kvpool.engine import install_mooncake_shim
install_mooncake_shim()
from mooncake.engine import TransferEngine

PAGE, PAGES, GUARD = %d, %d, %d
te = TransferEngine()
assert TransferEngine.__module__ == "kvpool.engine", TransferEngine.__module__
assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
whole = np.full((PAGES + 2) * PAGE, GUARD, dtype=np.uint8)
kv = whole[PAGE:-PAGE]
kv[:] = 0
addr = kv.ctypes.data
assert te.register_memory(addr, kv.nbytes) == 0
session = te.get_session_id()
assert session.endswith(":%%d" %% te.get_rpc_port())
assert te.get_first_buffer_address(session) == addr
print(json.dumps({"session": session, "addr": addr}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "sha":
        print(json.dumps({"sha": hashlib.sha256(whole.tobytes()).hexdigest()}), flush=True)
    elif cmd["op"] == "notifies":
        print(json.dumps({"notifies": [[n.name, n.msg] for n in te.get_notifies()]}), flush=True)
    elif cmd["op"] == "exit":
        break
"""


class Decode:
    """The decode process: its session id, buffer address and memory digest.
    ``same_host`` is its ``KVPOOL_ENGINE_SAME_HOST`` (None: unset)."""

    def __init__(self, same_host: "str | None" = None) -> None:
        env = dict(os.environ, MC_TRANSFER_TIMEOUT="10")
        env.pop("KVPOOL_ENGINE_SAME_HOST", None)
        if same_host is not None:
            env["KVPOOL_ENGINE_SAME_HOST"] = same_host
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DECODE % (PAGE, PAGES, GUARD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        hello = self._reply()
        self.session: str = hello["session"]
        self.addr: int = hello["addr"]

    def _reply(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"decode process exited: {self.proc.wait(10)}")
        return json.loads(line)

    def sha(self) -> str:
        """sha256 of decode's whole buffer, guard pages included."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "sha"}) + "\n")
        self.proc.stdin.flush()
        return self._reply()["sha"]

    def notifies(self) -> list:
        """The notifies decode's engine received since last asked."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "notifies"}) + "\n")
        self.proc.stdin.flush()
        return self._reply()["notifies"]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def expected(kv: np.ndarray) -> str:
    """The digest decode reports when its registered pages hold ``kv``."""
    guard = np.full(PAGE, GUARD, dtype=np.uint8)
    return hashlib.sha256(np.concatenate([guard, kv, guard]).tobytes()).hexdigest()


@pytest.fixture(params=["copy", "socket", "tcp"])
def decode(request):
    """Decode as a peer on this host reaches it: memory copied straight
    between the processes, bytes through its Unix socket, or TCP."""
    d = Decode({"copy": None, "socket": "socket", "tcp": "0"}[request.param])
    d.link = request.param
    yield d
    d.close()


@pytest.fixture
def prefill():
    te = TransferEngine()
    assert te.initialize("127.0.0.1:0", "P2PHANDSHAKE", "tcp", "") == 0
    return te


def test_prefill_writes_pages_decode_sees_them_and_reads_back(decode, prefill):
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, size=PAGES * PAGE, dtype=np.uint8)
    back = np.zeros_like(src)
    assert prefill.register_memory(src.ctypes.data, src.nbytes) == 0
    assert prefill.batch_register_memory([back.ctypes.data], [back.nbytes]) == 0
    # KV pages land scattered, as a page table maps them: prefill page i
    # goes to decode page perm[i].
    perm = rng.permutation(PAGES)
    rc = prefill.batch_transfer_sync_write(
        decode.session,
        [src.ctypes.data + i * PAGE for i in range(PAGES)],
        [decode.addr + int(p) * PAGE for p in perm],
        [PAGE] * PAGES,
    )
    assert rc == 0
    want = np.zeros_like(src)
    for i, p in enumerate(perm):
        want[p * PAGE : (p + 1) * PAGE] = src[i * PAGE : (i + 1) * PAGE]
    assert decode.sha() == expected(want)
    # Read it all back in one call, then one page alone.
    assert prefill.transfer_sync_read(decode.session, back.ctypes.data, decode.addr, back.nbytes) == 0
    assert np.array_equal(back, want)
    back[:PAGE] = 0
    assert prefill.transfer_sync_read(decode.session, back.ctypes.data, decode.addr + 5 * PAGE, PAGE) == 0
    assert np.array_equal(back[:PAGE], want[5 * PAGE : 6 * PAGE])
    assert prefill._engine().link(decode.session) == decode.link
    assert prefill.batch_unregister_memory([src.ctypes.data, back.ctypes.data]) == 0


def test_outside_the_peers_registered_memory_fails_and_lands_nothing(decode, prefill):
    src = np.full(2 * PAGE, 0x5A, dtype=np.uint8)
    assert prefill.register_memory(src.ctypes.data, src.nbytes) == 0
    before = decode.sha()
    end = decode.addr + PAGES * PAGE
    for remote, length in [
        (end - PAGE // 2, PAGE),  # runs past the end into the guard page
        (decode.addr - PAGE, PAGE),  # the guard page before
        (decode.addr - 1, 2),
        (end, 1),
        (8, PAGE),
    ]:
        assert prefill.transfer_sync_write(decode.session, src.ctypes.data, remote, length) == -1, hex(remote)
        assert prefill.transfer_sync_read(decode.session, src.ctypes.data, remote, length) == -1, hex(remote)
    # One bad item fails the batch; the good item beside it still lands.
    rc = prefill.batch_transfer_sync_write(
        decode.session, [src.ctypes.data, src.ctypes.data], [decode.addr, end], [PAGE, PAGE]
    )
    assert rc == -1
    want = np.zeros(PAGES * PAGE, dtype=np.uint8)
    want[:PAGE] = 0x5A
    assert decode.sha() == expected(want) != before
    # A local buffer this engine did not register is refused, unread.
    assert prefill.transfer_sync_write(decode.session, 16, decode.addr, PAGE) == -1
    # The same peer, afterwards: fine.
    assert prefill.transfer_sync_write(decode.session, src.ctypes.data, decode.addr + PAGE, PAGE) == 0
    want[PAGE : 2 * PAGE] = 0x5A
    assert decode.sha() == expected(want)


def test_registration_codes_are_mooncakes(prefill):
    buf = np.zeros(4 * PAGE, dtype=np.uint8)
    a = buf.ctypes.data
    assert prefill.register_memory(a, 0) == -1
    assert prefill.register_memory(a, buf.nbytes) == 0
    assert prefill.register_memory(a + PAGE, PAGE) == -7
    other = np.zeros(PAGE, dtype=np.uint8)
    # All or nothing: `other` is registered, then rolled back.
    assert prefill.batch_register_memory([other.ctypes.data, a], [PAGE, PAGE]) == -7
    assert prefill.register_memory(other.ctypes.data, PAGE) == 0
    assert prefill.unregister_memory(a + 1) == -3
    assert prefill.unregister_memory(a) == 0
    assert prefill.unregister_memory(a) == -3
    assert prefill.get_first_buffer_address("elsewhere:1") == 0


def test_a_dead_peer_fails_fast(prefill):
    buf = np.zeros(PAGE, dtype=np.uint8)
    assert prefill.register_memory(buf.ctypes.data, buf.nbytes) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    t0 = time.monotonic()
    assert prefill.batch_transfer_sync_write(dead, [buf.ctypes.data] * 3, [4096] * 3, [PAGE] * 3) == -1
    assert prefill.transfer_sync_read(dead, buf.ctypes.data, 4096, PAGE) == -1
    assert time.monotonic() - t0 < 10


def test_the_store_accepts_the_engine_as_sglang_shares_it(master, prefill):
    """SGLang's HiCache passes its PD engine to the store's setup
    (``get_engine()``); the store takes it and both keep working."""
    from kvpool.mooncake import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master, prefill.get_engine())
    assert rc == 0
    try:
        assert store.put("engine-shared", b"kv") == 0
        assert store.get("engine-shared") == b"kv"
        src = np.full(PAGE, 3, dtype=np.uint8)
        dst = np.zeros(PAGE, dtype=np.uint8)
        assert prefill.register_memory(src.ctypes.data, PAGE) == 0
        assert prefill.register_memory(dst.ctypes.data, PAGE) == 0
        # The engine still moves bytes (here to itself) after the store set up.
        me = prefill.get_session_id()
        assert prefill.transfer_sync_write(me, src.ctypes.data, dst.ctypes.data, PAGE) == 0
        assert (dst == 3).all()
    finally:
        store.remove("engine-shared", True)
        store.close()


def _status(te: TransferEngine, batch: int) -> int:
    """``transfer_check_status`` once the batch is over."""
    deadline = time.monotonic() + 20
    while (rc := te.transfer_check_status(batch)) == 0:
        assert time.monotonic() < deadline, "batch never finished"
        time.sleep(0.001)
    return rc


def test_async_batches_answer_by_id_once(decode, prefill):
    rng = np.random.default_rng(11)
    src = rng.integers(0, 256, size=8 * PAGE, dtype=np.uint8)
    back = np.zeros_like(src)
    assert prefill.batch_register_memory([src.ctypes.data, back.ctypes.data], [src.nbytes, back.nbytes]) == 0
    ids = [
        prefill.batch_transfer_async_write(decode.session, [src.ctypes.data + i * PAGE], [decode.addr + i * PAGE], [PAGE])
        for i in range(4)
    ]
    ids.append(
        prefill.batch_transfer_async(
            decode.session,
            [src.ctypes.data + i * PAGE for i in range(4, 8)],
            [decode.addr + i * PAGE for i in range(4, 8)],
            [PAGE] * 4,
            TransferOpcode.Write,
        )
    )
    assert 0 not in ids and len(set(ids)) == 5
    assert prefill.get_batch_transfer_status(ids) == 0
    want = np.zeros(PAGES * PAGE, dtype=np.uint8)
    want[: 8 * PAGE] = src
    assert decode.sha() == expected(want)
    # A batch id is spent once its status was read as over.
    assert prefill.get_batch_transfer_status(ids[:1]) == -1
    # Reads, asynchronously, the integer opcode as Mooncake's enum allows.
    rid = prefill.batch_transfer_async(decode.session, [back.ctypes.data], [decode.addr], [back.nbytes], 0)
    assert rid != 0 and prefill.get_batch_transfer_status([rid]) == 0
    assert np.array_equal(back, src)
    rid = prefill.batch_transfer_async_read(decode.session, [back.ctypes.data], [decode.addr + PAGES * PAGE], [PAGE])
    assert rid != 0 and prefill.get_batch_transfer_status([rid]) == -1
    # One write submitted and polled: 1 when done, then the id is spent.
    wid = prefill.transfer_submit_write(decode.session, src.ctypes.data, decode.addr + 9 * PAGE, PAGE)
    assert wid > 0 and _status(prefill, wid) == 1
    assert prefill.transfer_check_status(wid) == -1
    want[9 * PAGE : 10 * PAGE] = src[:PAGE]
    assert decode.sha() == expected(want)
    # Outside decode's memory: the write fails and lands nothing.
    bad = prefill.transfer_submit_write(decode.session, src.ctypes.data, decode.addr - PAGE, PAGE)
    assert bad > 0 and _status(prefill, bad) == -1
    assert decode.sha() == expected(want)
    # What cannot start is a failed id, not an exception.
    assert prefill.batch_transfer_async(decode.session, [src.ctypes.data], [decode.addr], [PAGE], 7) == 0
    assert prefill.batch_transfer_async_write(decode.session, [src.ctypes.data], [], [PAGE]) == 0


def test_notifies_follow_the_bytes_and_only_a_good_batch_sends_one(decode, prefill):
    src = np.full(2 * PAGE, 0x33, dtype=np.uint8)
    assert prefill.register_memory(src.ctypes.data, src.nbytes) == 0
    note = TransferNotify("prefill-0", "req-1 kv ready")
    rc = prefill.batch_transfer_sync(
        decode.session, [src.ctypes.data], [decode.addr], [PAGE], TransferOpcode.Write, note
    )
    assert rc == 0
    assert prefill.transfer_sync(decode.session, src.ctypes.data, decode.addr + PAGE, PAGE, TransferOpcode.Read) == 0
    assert prefill.transfer_sync(decode.session, src.ctypes.data, decode.addr + PAGES * PAGE, PAGE, TransferOpcode.Write, TransferNotify("prefill-0", "lost")) == -1
    assert decode.notifies() == [["prefill-0", "req-1 kv ready"]]
    assert decode.notifies() == []
    assert prefill.transfer_sync(decode.session, src.ctypes.data, decode.addr, PAGE, "write") == -1


def test_probe_peer_buffers_and_managed_memory(decode, prefill):
    assert prefill.send_probe(decode.session) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    assert prefill.send_probe(dead) == -1
    assert prefill.get_first_buffer_address(decode.session) == decode.addr
    assert prefill.get_first_buffer_address(dead) == 0
    addr = prefill.allocate_managed_buffer(3 * PAGE)
    assert addr != 0
    assert prefill.read_bytes_from_buffer(addr, 4) == b"\0" * 4
    assert prefill.write_bytes_to_buffer(addr, b"hello kv", 5) == 0
    assert prefill.read_bytes_from_buffer(addr, 8) == b"hello\0\0\0"
    assert prefill.write_bytes_to_buffer(addr, b"xy", 3) == -1
    assert prefill.write_bytes_to_buffer(addr + 3 * PAGE - 1, b"xy", 2) == -1
    assert prefill.transfer_sync_write(decode.session, addr, decode.addr, PAGE) == 0
    want = np.zeros(PAGES * PAGE, dtype=np.uint8)
    want[:5] = np.frombuffer(b"hello", dtype=np.uint8)
    assert decode.sha() == expected(want)
    assert prefill.free_managed_buffer(addr, 3 * PAGE) == 0
    assert prefill.free_managed_buffer(addr, 3 * PAGE) == -1
    assert prefill.write_bytes_to_buffer(addr, b"x", 1) == -1
    assert prefill.get_local_topology() and prefill.get_engine_ptr() != 0


# A prefill process whose KV lives in GPU memory, with the stand-in CUDA
# driver (crates/kvpool-engine/tests/fake_cuda.c) loaded as libcuda.so.1: its
# device memory is address space the CPU cannot touch, reached only through
# the driver's copies, so an engine that read or wrote it directly would
# fault or fail here as on a GPU.
GPU_PREFILL = r"""
import ctypes, sys
import numpy as np
lib, session, peer, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cuda = ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
cuda.fake_cuda_alloc.restype = ctypes.c_uint64
cuda.fake_cuda_alloc.argtypes = [ctypes.c_size_t]
cuda.fake_cuda_poke.argtypes = cuda.fake_cuda_peek.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t]
cuda.fake_cuda_copies.restype = ctypes.c_ulong
from kvpool.engine import TransferEngine

def peek(addr, length):
    out = np.zeros(length, dtype=np.uint8)
    assert cuda.fake_cuda_peek(out.ctypes.data, addr, length) == 0
    return out

te = TransferEngine()
assert te.initialize("127.0.0.1:0", "P2PHANDSHAKE", "tcp", "") == 0
kv = np.random.default_rng(11).integers(0, 256, size=n, dtype=np.uint8)
gpu, back = cuda.fake_cuda_alloc(n), cuda.fake_cuda_alloc(n)
assert cuda.fake_cuda_poke(gpu, kv.ctypes.data, n) == 0
assert te.batch_register_memory([gpu, back], [n, n]) == 0
# The first half in one call (the shared runtime's path), the second page
# by page (the caller's own thread, once the peer answered).
half = n // 2
assert te.transfer_sync_write(session, gpu, peer, half) == 0
page = 4096
assert te.batch_transfer_sync_write(
    session, list(range(gpu + half, gpu + n, page)), list(range(peer + half, peer + n, page)), [page] * (half // page)
) == 0
assert te.transfer_sync_read(session, back, peer, n) == 0
assert np.array_equal(peek(back, n), kv)
# After a CUDA stream's queued work (any stream: the stand-in waits for
# none), as Mooncake's CUDA builds offer.
cuda.fake_cuda_syncs.restype = ctypes.c_ulong
syncs = cuda.fake_cuda_syncs()
assert te.transfer_write_on_cuda(session, gpu, peer, page, 0x5EED) == 0
assert te.batch_transfer_read_on_cuda(session, [back, back + page], [peer, peer + page], [page, page], 0x5EED) == 0
assert cuda.fake_cuda_syncs() - syncs >= 2 + 2
assert np.array_equal(peek(back, n), kv)
assert te.transfer_read_on_cuda(session, back, peer, 8) == 0
assert te.write_bytes_to_buffer(back, b"hello kv", 5) == 0
assert te.read_bytes_from_buffer(back, 8) == b"hello" + kv[5:8].tobytes()
assert cuda.fake_cuda_copies() >= 2 + half // page + 2
print("ok", flush=True)
"""


def test_gpu_memory_goes_through_the_cuda_drivers_copies(decode, tmp_path):
    """KV in GPU memory is written to and read from a peer's host memory
    through the CUDA driver's copies, on each link, on the shared path and
    the caller's own thread (with a stand-in driver: no GPU here)."""
    lib = tmp_path / "libcuda.so.1"
    src = os.path.join(os.path.dirname(__file__), "..", "..", "kvpool-engine", "tests", "fake_cuda.c")
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", str(lib), src], check=True)
    n = PAGES * PAGE
    out = subprocess.run(
        [sys.executable, "-c", GPU_PREFILL, str(lib), decode.session, str(decode.addr), str(n)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr[-3000:]
    kv = np.random.default_rng(11).integers(0, 256, size=n, dtype=np.uint8)
    assert decode.sha() == expected(kv)


SPAWNS = r"""
import multiprocessing as mp
import sys


def child(q):
    import mooncake.engine
    import mooncake.store
    q.put([mooncake.engine.TransferEngine.__module__, mooncake.store.__name__])


if __name__ == "__main__":
    import mooncake.engine
    print(mooncake.engine.TransferEngine.__module__, getattr(sys, "shadowed_ran", False))
    ctx = mp.get_context("spawn")  # as SGLang and vLLM start their workers
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    print(*q.get())
    p.join()
"""


def test_the_shim_directory_reaches_spawned_workers(tmp_path):
    """``PYTHONPATH=$(python3 -m kvpool.shim)`` makes every interpreter,
    workers started with ``spawn`` included, import kvpool as Mooncake,
    and still runs the ``sitecustomize`` it shadows."""
    shim = subprocess.run([sys.executable, "-m", "kvpool.shim"], capture_output=True, text=True, check=True)
    shim_dir = shim.stdout.strip()
    assert os.path.isfile(os.path.join(shim_dir, "sitecustomize.py"))
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nsys.shadowed_ran = True\n")
    script = tmp_path / "spawns.py"
    script.write_text(SPAWNS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([shim_dir, str(other)]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["kvpool.engine True", "kvpool.engine kvpool.mooncake"]
