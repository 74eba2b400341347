"""fork() safety: a child reconnects on first use (as a pure client) and the
parent's connection keeps working afterwards."""

from __future__ import annotations

import multiprocessing
import os
import threading
import traceback
import warnings

import numpy as np
import pytest

import kvpool
from kvpool.mooncake import MooncakeDistributedStore

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def run_in_child(fn) -> None:
    """Forks, runs ``fn()`` in the child, and asserts it succeeded."""
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a process with threads (our runtime).
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "child failed (see its traceback above)"


def test_child_uses_parent_store(store, prefix):
    assert store.put(prefix + "parent", b"from-parent") == 0

    def child():
        assert store.get(prefix + "parent") == b"from-parent"
        assert store.put(prefix + "child", b"from-child") == 0
        assert store.is_exist(prefix + "child") == 1
        a = np.arange(4096, dtype=np.uint8)
        assert store.put_from(prefix + "child-zc", a.ctypes.data, a.nbytes) == 0
        out = np.zeros_like(a)
        assert store.get_into(prefix + "child-zc", out.ctypes.data, out.nbytes) == a.nbytes
        assert np.array_equal(out, a)
        assert store.health_check() == 0

    run_in_child(child)
    # The parent still works and sees what the child wrote.
    assert store.get(prefix + "child") == b"from-child"
    assert store.put(prefix + "after", b"x") == 0
    assert store.get(prefix + "after") == b"x"


def test_child_of_lending_parent_is_pure_client(cluster, master, prefix):
    before = cluster.segments()
    with kvpool.Client(master, segment_size="16MiB") as c:
        assert c.lent_bytes > 0
        c.put(prefix + "p", b"v", config=kvpool.ReplicateConfig(prefer_alloc_in_same_node=True))

        def child():
            assert c.lent_bytes == 0
            assert c.get(prefix + "p") == b"v"  # read from the parent's segment
            c.put(prefix + "c", b"w")
            c.close()  # closes the child's connection only

        run_in_child(child)
        assert cluster.segments() == before + 1  # the parent's segment is still lent
        assert c.get(prefix + "c") == b"w"
        c.put(prefix + "p2", b"z")
        assert c.get(prefix + "p2") == b"z"
        c.remove_all(force=True)
    assert cluster.segments() == before


def test_fork_while_another_thread_is_busy(store, prefix):
    stop = threading.Event()
    errors = []

    def busy():
        i = 0
        while not stop.is_set():
            k = f"{prefix}busy{i % 8}"
            if store.upsert(k, b"x" * 1024) != 0 or store.get(k) != b"x" * 1024:
                errors.append(k)
            i += 1

    t = threading.Thread(target=busy)
    t.start()
    try:
        for n in range(3):

            def child(n=n):
                assert store.put(f"{prefix}fork{n}", b"c") == 0
                assert store.get(f"{prefix}fork{n}") == b"c"

            run_in_child(child)
    finally:
        stop.set()
        t.join(60)
    assert not errors


_MP_STORE = None


def _mp_task(args):
    key, value = args
    assert _MP_STORE.put(key, value) == 0
    return _MP_STORE.get(key)


def test_multiprocessing_fork_pool(store, prefix):
    global _MP_STORE
    _MP_STORE = store
    ctx = multiprocessing.get_context("fork")
    items = [(f"{prefix}mp{i}", bytes([i]) * 100) for i in range(16)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with ctx.Pool(2) as pool:
            results = pool.map(_mp_task, items)
    assert results == [v for _, v in items]
    assert store.get_batch([k for k, _ in items]) == [v for _, v in items]
