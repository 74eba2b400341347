"""Many Python threads on one client: byte-exact results, and the GIL is
released while a call waits."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import kvpool
from kvpool.mooncake import MooncakeDistributedStore


def _worker(store: MooncakeDistributedStore, client: kvpool.Client, prefix: str, tid: int, rounds: int) -> int:
    rng = np.random.default_rng(tid)
    checked = 0
    for r in range(rounds):
        size = int(rng.integers(1, 64 << 10))
        data = rng.integers(0, 256, size, dtype=np.uint8)
        key = f"{prefix}{tid}/{r}"
        if r % 3 == 0:
            assert store.put_from(key, data.ctypes.data, size) == 0
        elif r % 3 == 1:
            assert store.put(key, data.tobytes()) == 0
        else:
            client.put(key, data)
        out = np.zeros(size, dtype=np.uint8)
        assert store.get_into(key, out.ctypes.data, size) == size
        assert np.array_equal(out, data), f"bytes differ for {key}"
        assert client.get(key) == data.tobytes()
        checked += 2
        if r % 10 == 9:
            keys = [f"{prefix}{tid}/{r - i}" for i in range(4)]
            vals = store.get_batch(keys)
            assert all(len(v) > 0 for v in vals)
            assert store.batch_is_exist(keys) == [1] * 4
            checked += 4
    return checked


def test_many_threads_byte_exact(store, client, prefix):
    threads, rounds = 8, 60
    with ThreadPoolExecutor(threads) as pool:
        futs = [pool.submit(_worker, store, client, prefix, t, rounds) for t in range(threads)]
        total = sum(f.result(timeout=300) for f in futs)
    assert total >= threads * rounds * 2


def test_batch_zero_copy_from_threads(store, prefix):
    n, size = 16, 32 << 10

    def run(tid: int) -> None:
        src = np.random.default_rng(100 + tid).integers(0, 256, n * size, dtype=np.uint8)
        dst = np.zeros_like(src)
        keys = [f"{prefix}bz{tid}/{i}" for i in range(n)]
        for _ in range(5):
            assert store.batch_upsert_from(keys, [src.ctypes.data + i * size for i in range(n)], [size] * n) == [0] * n
            assert store.batch_get_into(keys, [dst.ctypes.data + i * size for i in range(n)], [size] * n) == [size] * n
            assert np.array_equal(dst, src)
            src[:] = np.roll(src, 1)

    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(run, t) for t in range(4)]:
            f.result(timeout=300)


def test_gil_released_while_waiting():
    """A call blocked on a silent master must not stop other Python threads."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    addr = "127.0.0.1:%d" % silent.getsockname()[1]
    done = threading.Event()
    outcome = []

    def blocked():
        try:
            kvpool.Client(addr, timeout=1.5, retries=0)
        except kvpool.KvpoolError as e:
            outcome.append(e)
        finally:
            done.set()

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.1)
    # Pure-Python work on this thread: it would stall if the GIL were held.
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < 0.5:
        n += 1
    assert not done.is_set(), "the native call returned too early to prove anything"
    assert n > 10_000
    t.join(30)
    silent.close()
    assert outcome and isinstance(outcome[0], (kvpool.Timeout, kvpool.Unavailable))
