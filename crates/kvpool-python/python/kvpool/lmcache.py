"""``KvpoolL2Adapter``: an LMCache (0.5.6, multiprocess mode) L2 adapter on kvpool.

LMCache loads it through its plugin adapter type::

    --l2-adapter '{"type": "plugin", "module_path": "kvpool.lmcache",
        "class_name": "KvpoolL2Adapter",
        "adapter_params": {"master": "127.0.0.1:50051"}}'

Stores and loads move bytes straight between LMCache's memory objects (host
memory, by address) and the pool: no copy in Python. A lookup *locks* the
keys it finds by holding the pool's read lease on them, renewed in the
background until :meth:`KvpoolL2Adapter.submit_unlock`: the master never
evicts an object under a live lease. Listeners hear of stores, loads and
deletes made through the adapter, not of the pool's own evictions;
:meth:`KvpoolL2Adapter.list_l2_keys` pages through the pool's keys in
bounded master calls. See ``docs/lmcache.md``.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Optional, Tuple

from lmcache.lmcache_native import Bitmap  # type: ignore[import-untyped]
from lmcache.v1.distributed.api import KeyEntry, KeyListPage, ObjectKey  # type: ignore[import-untyped]
from lmcache.v1.distributed.internal_api import L2StoreResult  # type: ignore[import-untyped]
from lmcache.v1.distributed.l2_adapters.base import (  # type: ignore[import-untyped]
    AdapterUsage,
    L2AdapterInterface,
    L2TaskId,
)
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase  # type: ignore[import-untyped]

from . import _native
from ._reach import SILENCE, Reachability
from .client import Client
from .errors import KvpoolError, NotFound

__all__ = ["KvpoolL2Adapter", "KvpoolL2AdapterConfig"]

logger = logging.getLogger(__name__)

# Adapter params handed to kvpool.Client as keyword arguments.
_CLIENT_OPTIONS = (
    "hostname",
    "segment_size",
    "segment_address",
    "timeout",
    "retries",
    "conns_per_store",
    "protocol",
    "location_cache",
    "secret_file",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "fail_fast_after",
)


# Most entries one list_l2_keys page asks for: the master's cap per ListKeys.
_MAX_PAGE = 10_000

# list_l2_keys tokens: this tag, then the master's cursor bytes in hex.
_CURSOR_TAG = "kvpool1:"


def _decode_cursor(token: str) -> bytes:
    """The master's cursor in a ``next_page_token``; ``ValueError`` if it is none."""
    if not isinstance(token, str) or not token.startswith(_CURSOR_TAG):
        raise ValueError(f"malformed list_l2_keys cursor {token!r}")
    try:
        raw = bytes.fromhex(token[len(_CURSOR_TAG):])
    except ValueError:
        raw = b""
    # Empty bytes would restart the listing, which no token means; the
    # master checks the rest (InvalidArgument, a ValueError).
    if not raw:
        raise ValueError(f"malformed list_l2_keys cursor {token!r}")
    return raw


class KvpoolL2AdapterConfig(L2AdapterConfigBase):  # type: ignore[misc]
    """``adapter_params`` of :class:`KvpoolL2Adapter`.

    - ``master``: the master address (default: ``KVPOOL_MASTER``, ...).
    - ``key_prefix``: prepended to every key in the pool (default ``"lmcache/"``).
    - ``num_workers``: threads running pool calls (default 4).
    - ``lock_renew_s``: how often locked keys' leases are renewed; must stay
      below the master's ``--default-kv-lease-ttl`` (default 2.0; 5 s lease).
    - ``hostname``, ``segment_size``, ``timeout``, ``retries``, ``protocol``,
      ``secret_file``, ``tls_*``, ...: :class:`kvpool.Client` options.
    """

    def __init__(
        self,
        master: Optional[str] = None,
        key_prefix: str = "lmcache/",
        num_workers: int = 4,
        lock_renew_s: float = 2.0,
        client_options: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.master = master
        self.key_prefix = key_prefix
        self.num_workers = L2AdapterConfigBase._validate_num_workers(num_workers)
        if isinstance(lock_renew_s, bool) or not isinstance(lock_renew_s, (int, float)) or not lock_renew_s > 0:
            raise ValueError("lock_renew_s must be a positive number of seconds")
        self.lock_renew_s = float(lock_renew_s)
        self.client_options = dict(client_options or {})

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "KvpoolL2AdapterConfig":
        """Parses ``adapter_params``; unknown keys are an error, not ignored."""
        known = {"master", "key_prefix", "num_workers", "lock_renew_s", *_CLIENT_OPTIONS}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown kvpool adapter params: {unknown}")
        prefix = d.get("key_prefix", "lmcache/")
        if not isinstance(prefix, str):
            raise ValueError("key_prefix must be a string")
        return cls(
            master=d.get("master"),
            key_prefix=prefix,
            num_workers=d.get("num_workers", 4),
            lock_renew_s=d.get("lock_renew_s", 2.0),
            client_options={k: d[k] for k in _CLIENT_OPTIONS if k in d},
        )

    @classmethod
    def help(cls) -> str:
        """What ``adapter_params`` may hold."""
        return cls.__doc__ or ""


class KvpoolL2Adapter(L2AdapterInterface):  # type: ignore[misc]
    """LMCache L2 adapter storing LMCache's objects in a kvpool cluster.

    Built by LMCache's plugin factory as ``KvpoolL2Adapter(config,
    l1_memory_desc=...)``; ``config`` may also be a plain dict.
    """

    config_class_name = "KvpoolL2AdapterConfig"

    def __init__(self, config: Any = None, l1_memory_desc: Any = None) -> None:
        if not isinstance(config, KvpoolL2AdapterConfig):
            config = KvpoolL2AdapterConfig.from_dict(dict(config or {}))
        # No aggregate capacity, so supports_global_eviction is False: the
        # pool evicts on its own (sparing leased, i.e. locked, objects) and is
        # shared, so LMCache must not evict from it by the bytes it counted.
        # The base also keeps the listeners, the backend identity events are
        # tagged with, and the per-salt byte counts.
        super().__init__(max_capacity_bytes=0)
        self._config = config
        # A call already waiting on a master that went silent ends with the
        # silence Reachability skips the pool after, not with the retries.
        options = {"fail_fast_after": SILENCE, **config.client_options}
        self._client = Client(config.master, **options)
        # The native client answers per-key codes for batches instead of
        # raising BatchError, which is what bitmaps need.
        self._native: _native.Client = self._client._native
        self._reach = Reachability(logger)
        # kvpool reads and writes any host address, but an address it was
        # not told about is first checked page by page (so that unmapped
        # memory fails the task instead of the process). LMCache's L1 arena
        # is registered with an L2 adapter for the adapter's life, as
        # Mooncake's adapter registers it: the memory objects inside it are
        # used as given.
        self._l1: Optional[Tuple[int, int]] = None
        ptr, size = (int(getattr(l1_memory_desc, a, 0) or 0) for a in ("ptr", "size"))
        if ptr > 0 and size > 0:
            try:
                _native.note_registered(ptr, size)
                self._l1 = (ptr, size)
            except KvpoolError:
                logger.warning("LMCache's L1 arena at %#x of %d bytes is not a valid region; probing its pages", ptr, size)
        # LMCache waits on these with poll() and drains them with a
        # non-blocking read: one counter per kind of task.
        flags = os.EFD_NONBLOCK | os.EFD_CLOEXEC
        self._store_efd = os.eventfd(0, flags)
        self._lookup_efd = os.eventfd(0, flags)
        self._load_efd = os.eventfd(0, flags)
        self._lock = threading.Lock()  # guards everything below it
        self._next_task_id: L2TaskId = 0
        self._stores: Dict[L2TaskId, L2StoreResult] = {}
        self._lookups: Dict[L2TaskId, Bitmap] = {}
        self._loads: Dict[L2TaskId, Bitmap] = {}
        self._locked: Dict[str, int] = {}  # pool key -> lookups not yet unlocked
        self._last_error: Optional[str] = None
        self._closed = threading.Event()
        self._workers = ThreadPoolExecutor(config.num_workers, thread_name_prefix="kvpool-lmcache")
        self._renewer = threading.Thread(target=self._renew_leases, name="kvpool-lmcache-locks", daemon=True)
        self._renewer.start()

    # ------------------------------------------------------------ event fds

    def get_store_event_fd(self) -> int:
        """The eventfd signalled when a store task completes."""
        return self._store_efd

    def get_lookup_and_lock_event_fd(self) -> int:
        """The eventfd signalled when a lookup-and-lock task completes."""
        return self._lookup_efd

    def get_load_event_fd(self) -> int:
        """The eventfd signalled when a load task completes."""
        return self._load_efd

    # ------------------------------------------------------------ tasks

    def submit_store_task(self, keys: List[Any], objects: List[Any]) -> L2TaskId:
        """Writes ``objects[i]`` under ``keys[i]`` in the background (write-once:
        a key already in the pool keeps its value)."""
        names, ptrs, sizes = self._regions(keys, objects)

        def run() -> L2StoreResult:
            codes = self._native.batch_put(names, ptrs, sizes, None, False)
            ok = [i for i, c in enumerate(codes) if c == 0]
            self._report_failures("store", names, codes, lambda c: c == 0)
            if ok:
                self._notify_keys_stored([keys[i] for i in ok], [sizes[i] for i in ok])
            return L2StoreResult(len(ok) == len(codes), sum(sizes[i] for i in ok))

        return self._submit(run, self._stores, self._store_efd, lambda: L2StoreResult(False, 0))

    def pop_completed_store_tasks(self) -> Dict[L2TaskId, L2StoreResult]:
        """Results of the store tasks completed since the last call."""
        # Emptied in place: a task still running holds this dict and adds
        # its result to it once done, to be popped by the next call.
        with self._lock:
            done = dict(self._stores)
            self._stores.clear()
        return done

    def submit_lookup_and_lock_task(self, keys: List[Any], group_layout_descs: Any = None) -> L2TaskId:
        """Finds which keys the pool holds and locks those (their read
        lease is held until :meth:`submit_unlock`)."""
        names = [self._name(k) for k in keys]

        def run() -> Bitmap:
            # The lease is taken by the same call that answers "found", so
            # nothing can evict a found key between the answer and the lock.
            codes = self._native.batch_exists(names, True)
            self._report_failures("lookup", names, codes, lambda c: c >= 0)
            found = [i for i, c in enumerate(codes) if c == 1]
            with self._lock:
                for i in found:
                    self._locked[names[i]] = self._locked.get(names[i], 0) + 1
            return self._bitmap(len(names), found)

        return self._submit(run, self._lookups, self._lookup_efd, lambda: Bitmap(len(names)))

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Optional[Bitmap]:
        """The lookup's bitmap (1 = found and locked) once, or ``None`` while running."""
        with self._lock:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys: List[Any]) -> None:
        """Drops one lock per key; a key no longer locked stops being renewed
        and its lease runs out within the master's lease TTL."""
        with self._lock:
            for k in keys:
                name = self._name(k)
                n = self._locked.get(name, 0)
                if n > 1:
                    self._locked[name] = n - 1
                else:
                    self._locked.pop(name, None)

    def submit_load_task(self, keys: List[Any], objects: List[Any]) -> L2TaskId:
        """Reads ``keys[i]`` straight into ``objects[i]`` in the background."""
        names, ptrs, sizes = self._regions(keys, objects)

        def run() -> Bitmap:
            # A value of another size than the buffer is not the object
            # LMCache asked for: too big is refused (-600), too small is a miss.
            codes = self._native.batch_get_into(names, ptrs, sizes)
            self._report_failures("load", names, codes, lambda c: c >= 0 or c == NotFound.code)
            hits = [i for i, c in enumerate(codes) if c == sizes[i]]
            if hits:
                self._notify_keys_accessed([keys[i] for i in hits])
            return self._bitmap(len(names), hits)

        return self._submit(run, self._loads, self._load_efd, lambda: Bitmap(len(names)))

    def query_load_result(self, task_id: L2TaskId) -> Optional[Bitmap]:
        """The load's bitmap (1 = filled with the stored bytes) once, or ``None`` while running."""
        with self._lock:
            return self._loads.pop(task_id, None)

    # ------------------------------------------------------------ eviction, usage, status

    def delete(self, keys: List[Any]) -> None:
        """Removes keys from the pool; a key under a read lease (locked, or
        being read by anyone) stays. Listeners hear of the keys removed, with
        the sizes the pool held (objects the pool evicts by itself are not
        reported: the master has no event stream of them)."""
        names = [self._name(k) for k in keys]
        sizes: Dict[str, int] = {}
        for name in names:
            try:
                sizes[name] = self._native.get_size(name, False)
            except Exception:  # noqa: BLE001 - missing (or unreachable): nothing to remove
                continue
        gone = list(sizes)
        if not gone:
            return
        codes = self._native.batch_remove(gone, False)
        removed = {n for n, c in zip(gone, codes) if c == 0}
        done = [(k, sizes[n]) for k, n in zip(keys, names) if n in removed]
        if done:
            self._notify_keys_deleted([k for k, _ in done], [s for _, s in done])

    def list_l2_keys(self, model_name: Optional[str] = None, page_size: int = 500,
                     cursor: Optional[str] = None) -> KeyListPage:
        """One page of the keys this adapter's ``key_prefix`` holds in the pool
        (``model_name``: that model's only), with their sizes.

        One bounded master call per page (``ListKeys``): a page holds at most
        ``page_size`` entries (capped at 10,000), and may hold fewer, or none,
        with a ``next_page_token`` to go on; ``None`` once every key was seen.
        Keys stored or removed while paging may be missed or listed twice.
        Pool keys under the prefix that are no LMCache key are skipped.
        """
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
            raise ValueError(f"page_size must be a positive integer (got {page_size!r})")
        raw = b"" if cursor is None else _decode_cursor(cursor)
        prefix = self._config.key_prefix + (f"{model_name}@" if model_name is not None else "")
        names, nxt = self._native.list_keys(prefix, raw, min(page_size, _MAX_PAGE))
        entries = []
        for name, size in names:
            key = self._key(name)
            if key is not None:
                entries.append(KeyEntry(key=key.to_encoded_object_key(), size_bytes=size))
        return KeyListPage(entries=tuple(entries), next_page_token=_CURSOR_TAG + nxt.hex() if nxt else None)

    def get_usage(self) -> AdapterUsage:
        """The pool's used and total bytes (all tenants), with LMCache's
        per-``cache_salt`` bytes as written through this adapter."""
        mine = super().get_usage()
        try:
            st = self._client.status()
        except Exception as e:  # noqa: BLE001 - usage is advisory; keep LMCache running
            self._failed(f"status: {e}")
            return mine
        return AdapterUsage(
            total_bytes_used=int(st["used"]),
            total_capacity_bytes=int(st["capacity"]),
            bytes_by_cache_salt=MappingProxyType(dict(mine.bytes_by_cache_salt)),
        )

    def report_status(self) -> Dict[str, Any]:
        """Health (the master answers) and the pool's and the adapter's numbers."""
        with self._lock:
            status: Dict[str, Any] = {
                "type": type(self).__name__,
                "master": self._client.master,
                "locked_keys": len(self._locked),
                "last_error": self._last_error,
            }
        healthy = not self._closed.is_set() and self._client.ping(2.0)
        status["is_healthy"] = healthy
        if healthy:
            try:
                st = self._client.status()
                status.update(pool_used=st["used"], pool_capacity=st["capacity"], pool_keys=st["keys"])
            except Exception as e:  # noqa: BLE001
                status["is_healthy"] = False
                status["last_error"] = f"status: {e}"
        return status

    def close(self) -> None:
        """Finishes submitted tasks, stops renewing locks, disconnects and
        closes the eventfds."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._workers.shutdown(wait=True)
        self._renewer.join()
        self._client.close()
        for fd in (self._store_efd, self._lookup_efd, self._load_efd):
            os.close(fd)
        if self._l1 is not None:
            _native.note_unregistered(*self._l1)
            self._l1 = None

    # ------------------------------------------------------------ helpers

    def _name(self, key: Any) -> str:
        """The pool key of an LMCache ``ObjectKey``: the prefix, then the
        fields LMCache's native connectors use, ``@``-separated."""
        name = f"{self._config.key_prefix}{key.model_name}@{key.kv_rank:08x}@{key.object_group_id:x}@{key.chunk_hash.hex()}"
        return f"{name}@{key.cache_salt}" if key.cache_salt else name

    def _key(self, name: str) -> Optional[Any]:
        """The ``ObjectKey`` :meth:`_name` made ``name`` from, or ``None`` for
        another pool key under the prefix."""
        fields = name[len(self._config.key_prefix):].split("@")
        if not name.startswith(self._config.key_prefix) or len(fields) not in (4, 5):
            return None
        try:
            return ObjectKey(chunk_hash=bytes.fromhex(fields[3]), model_name=fields[0], kv_rank=int(fields[1], 16),
                             object_group_id=int(fields[2], 16), cache_salt=fields[4] if len(fields) == 5 else "")
        except ValueError:
            return None

    def _regions(self, keys: List[Any], objects: List[Any]) -> tuple:
        """Pool keys, host addresses and byte sizes of memory objects: the
        pool reads and writes that memory directly."""
        if len(keys) != len(objects):
            raise ValueError(f"{len(keys)} keys but {len(objects)} memory objects")
        return [self._name(k) for k in keys], [o.data_ptr for o in objects], [o.get_size() for o in objects]

    @staticmethod
    def _bitmap(n: int, ones: List[int]) -> Bitmap:
        b = Bitmap(n)
        if ones:
            b.batched_set(ones)
        return b

    def _submit(self, run: Callable[[], Any], done: Dict[L2TaskId, Any], efd: int, failed: Callable[[], Any]) -> L2TaskId:
        """Runs ``run`` on a worker; its result (or ``failed()`` if it
        raised) lands in ``done`` under the new task id, then ``efd`` fires."""
        with self._lock:
            task_id = self._next_task_id
            self._next_task_id += 1

        def task() -> None:
            try:
                # A pool whose master does not answer costs a miss or a
                # failed store at once, not the client's retries.
                if self._reach.check(self._native):
                    result = run()
                else:
                    # Reachability logged the change once; every task need not.
                    self._failed("the pool's master does not answer", log=False)
                    result = failed()
            except Exception as e:  # noqa: BLE001 - a failed task is reported, not raised
                self._failed(f"task {task_id}: {e}")
                result = failed()
            with self._lock:
                done[task_id] = result
            os.eventfd_write(efd, 1)

        self._workers.submit(task)
        return task_id

    def _report_failures(self, what: str, names: List[str], codes: List[int], ok: Callable[[int], bool]) -> None:
        """Logs (and remembers) the first key a batch call failed for."""
        bad = [(n, c) for n, c in zip(names, codes) if not ok(c)]
        if bad:
            n, c = bad[0]
            self._failed(f"{what}: {len(bad)} of {len(codes)} keys failed, first {n!r}: {_native.code_name(c)} ({c})")

    def _failed(self, message: str, log: bool = True) -> None:
        """Remembers ``message`` as the last error (``report_status``), and
        logs it unless told not to."""
        with self._lock:
            self._last_error = message
        if log:
            logger.warning("kvpool L2 adapter: %s", message)

    def _renew_leases(self) -> None:
        """Keeps locked keys' read leases alive until they are unlocked."""
        while not self._closed.wait(self._config.lock_renew_s):
            with self._lock:
                names = list(self._locked)
            if not names:
                continue
            try:
                codes = self._native.batch_exists(names, True)
            except Exception as e:  # noqa: BLE001 - retried at the next tick
                self._failed(f"lock renewal: {e}")
                continue
            self._report_failures("lock renewal", names, codes, lambda c: c == 1)

