"""LMCache's Mooncake L2 adapter, with Mooncake's Python binding in place
of LMCache's C++ Mooncake extension, for bench/lmcache_l2.sh.

LMCache's `mooncake_store` adapter is its generic `NativeConnectorL2Adapter`
(tasks, event fds, locks, bitmaps: Python) over `LMCacheMooncakeClient`, a
C++ extension that calls Mooncake's `RealClient` (`batch_put_from`,
`batch_get_into`, `batch_is_exist`) on its worker threads. LMCache's wheel
does not ship that extension, and building it needs Mooncake's C++ build.
`MooncakeBindingClient` is the same connector interface on the same
`RealClient` calls, made through `mooncake.store.MooncakeDistributedStore`
(the real Mooncake wheel, which releases the GIL in them) from a thread
pool of the same size; `MooncakeBindingL2Adapter` is LMCache's own
`NativeConnectorL2Adapter` over it. One difference, in Mooncake's favour:
LMCache's factory registers the L1 arena with Mooncake only for RDMA; here
it is always registered (`register_buffer`), as Mooncake's own benchmarks
and bench/compare do (over TCP, puts from unregistered memory ran at 0.26-
0.38 GB/s here against 1.8-2.0 registered).

Loaded as a plugin (this directory on PYTHONPATH):

    {"type": "plugin", "module_path": "lmcache_mooncake_binding",
     "class_name": "MooncakeBindingL2Adapter",
     "adapter_params": {"setup_config": {"master_server_address": "...",
        "metadata_server": "...", "protocol": "tcp", ...}, "num_workers": 4,
        "key_prefix": "row-1/"}}
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Tuple

from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import NativeConnectorL2Adapter
from mooncake.store import MooncakeDistributedStore

Completion = Tuple[int, bool, str, Optional[List[bool]]]


def _address(view: memoryview) -> int:
    """The address of a writable byte view's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class MooncakeBindingClient:
    """LMCache's native-connector interface (``event_fd``,
    ``submit_batch_set/get/exists``, ``drain_completions``, ``close``) on
    ``MooncakeDistributedStore``."""

    def __init__(self, setup_config: dict, num_workers: int = 4, key_prefix: str = "") -> None:
        c = {k: str(v) for k, v in setup_config.items()}
        # LMCache's key strings carry no prefix; the benchmark's rows need
        # keys of their own (a put of a key already there is a no-op).
        self._prefix = key_prefix
        self._store = MooncakeDistributedStore()
        rc = self._store.setup(
            c.get("local_hostname", "127.0.0.1"),
            c.get("metadata_server", "P2PHANDSHAKE"),
            int(c.get("global_segment_size", 0)),
            int(c.get("local_buffer_size", 16 << 20)),
            c.get("protocol", "tcp"),
            c.get("device_name", ""),
            c["master_server_address"],
        )
        if rc != 0:
            raise RuntimeError(f"MooncakeDistributedStore.setup failed: {rc}")
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._workers = ThreadPoolExecutor(num_workers, thread_name_prefix="mooncake-binding")
        self._lock = threading.Lock()
        self._next = 1
        self._done: List[Completion] = []

    def register(self, ptr: int, size: int) -> None:
        """Registers host memory the batches move to and from."""
        rc = self._store.register_buffer(ptr, size)
        if rc != 0:
            raise RuntimeError(f"register_buffer({size} bytes) failed: {rc}")

    def event_fd(self) -> int:
        """Signalled when a submitted batch completes."""
        return self._efd

    def submit_batch_set(self, keys: List[str], views: List[memoryview]) -> int:
        """Stores each view under its key (``batch_put_from``)."""
        keys, ptrs, sizes = self._keys(keys), [_address(v) for v in views], [len(v) for v in views]
        return self._submit(lambda: [c == 0 for c in self._store.batch_put_from(keys, ptrs, sizes)])

    def submit_batch_get(self, keys: List[str], views: List[memoryview]) -> int:
        """Reads each key into its view (``batch_get_into``)."""
        keys, ptrs, sizes = self._keys(keys), [_address(v) for v in views], [len(v) for v in views]
        return self._submit(lambda: [c == n for c, n in zip(self._store.batch_get_into(keys, ptrs, sizes), sizes)])

    def submit_batch_exists(self, keys: List[str]) -> int:
        """Which keys the pool holds (``batch_is_exist``)."""
        keys = self._keys(keys)
        return self._submit(lambda: [c == 1 for c in self._store.batch_is_exist(keys)])

    def drain_completions(self) -> List[Completion]:
        """Batches completed since the last call: ``(id, all ok, error, per key)``."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Waits for submitted batches, then leaves the pool."""
        self._workers.shutdown(wait=True)
        self._store.close()
        os.close(self._efd)

    def _keys(self, keys: List[str]) -> List[str]:
        return [self._prefix + k for k in keys] if self._prefix else list(keys)

    def _submit(self, run: Callable[[], List[bool]]) -> int:
        with self._lock:
            fid, self._next = self._next, self._next + 1

        def task() -> None:
            try:
                per_key = run()
                done: Completion = (fid, all(per_key), "", per_key)
            except Exception as e:  # noqa: BLE001 - reported as a failed batch
                done = (fid, False, str(e), None)
            with self._lock:
                self._done.append(done)
            os.eventfd_write(self._efd, 1)

        self._workers.submit(task)
        return fid


class MooncakeBindingL2Adapter(NativeConnectorL2Adapter):  # type: ignore[misc]
    """LMCache's ``NativeConnectorL2Adapter`` over :class:`MooncakeBindingClient`."""

    def __init__(self, params: Any = None, l1_memory_desc: Any = None) -> None:
        params = dict(params or {})
        client = MooncakeBindingClient(
            params["setup_config"], int(params.get("num_workers", 4)), str(params.get("key_prefix", ""))
        )
        ptr, size = (int(getattr(l1_memory_desc, a, 0) or 0) for a in ("ptr", "size"))
        if ptr and size:
            client.register(ptr, size)
        super().__init__(client, type_name="mooncake_store (Python binding)")
