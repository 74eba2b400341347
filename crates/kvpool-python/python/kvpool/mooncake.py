"""Drop-in for ``mooncake.store``: :class:`MooncakeDistributedStore`,
:class:`ReplicateConfig`, :class:`SoftPinAction`.

Same method names, argument order and return conventions as Mooncake 0.3.13:
integers (0 = OK, negative = Mooncake's error code), ``b""`` from a failed
``get``, ``1``/``0``/negative from ``is_exist``, one entry per key from batch
calls. Switching is ``from kvpool.mooncake import MooncakeDistributedStore``.
Type errors in arguments still raise ``TypeError``, as Mooncake's binding does.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _native
from .client import _connect
from .config import ReplicateConfig, SoftPinAction
from .errors import KvpoolError

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "BufferHandle"]

logger = logging.getLogger("kvpool.mooncake")

BufferHandle = _native.Buffer
"""What ``get_buffer`` returns: buffer protocol, ``ptr()``, ``size()``."""

OK = 0
INVALID_PARAMS = -600
UNAVAILABLE = -1010  # not set up, or closed

_SETUP_NAMES = (
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "device_name",
    "master_server_addr",
)
_SETUP_EXTRA = (
    "engine",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
    "enable_client_http_server",
    "client_http_port",
)


def _nbytes(value: Any) -> int:
    """Length in bytes of a buffer-protocol value."""
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    return memoryview(value).nbytes


class MooncakeDistributedStore:
    """Mooncake's store client API, served by kvpool. Call :meth:`setup` first."""

    def __init__(self) -> None:
        self._client: Optional[_native.Client] = None
        self._settings: Dict[str, Any] = {}
        self._registered: Dict[int, int] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ setup

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """``setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, device_name, master_server_addr, engine=None,
        ...)`` or ``setup(config: dict)`` (sizes may be ``"16MB"``/``"4gb"``).
        Missing values come from ``KVPOOL_*``, then ``MOONCAKE_*`` env vars, then
        the file in ``KVPOOL_CONFIG_PATH``/``MOONCAKE_CONFIG_PATH``. Returns 0
        or a negative code (``-1012`` for ``protocol="rdma"``)."""
        if len(args) == 1 and not kwargs and isinstance(args[0], dict):
            explicit = dict(args[0])
        else:
            if "rdma_devices" in kwargs:
                kwargs.setdefault("device_name", kwargs.pop("rdma_devices"))
            names = _SETUP_NAMES + _SETUP_EXTRA
            if len(args) > len(names):
                raise TypeError(f"setup() takes at most {len(names)} positional arguments ({len(args)} given)")
            explicit = dict(zip(names, args))
            for k, v in kwargs.items():
                if k not in names:
                    raise TypeError(f"setup() got an unexpected keyword argument {k!r}")
                if k in explicit:
                    raise TypeError(f"setup() got multiple values for argument {k!r}")
                explicit[k] = v
            missing = [n for n in _SETUP_NAMES if n not in explicit]
            if missing:
                raise TypeError(f"setup() missing required arguments: {', '.join(missing)} (or pass one dict)")
        if explicit.get("engine") is not None:
            logger.info("kvpool ignores the transfer engine passed to setup(); it uses its own transport")
        explicit.pop("engine", None)
        return self._setup(explicit)

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        """Mooncake's ``init_all``: ``setup`` with the other values from the
        environment (or defaults: master ``127.0.0.1:50051``, 16 MiB local buffer)."""
        return self._setup({"protocol": protocol, "device_name": device_name, "global_segment_size": mount_segment_size})

    def _setup(self, explicit: Dict[str, Any]) -> int:
        try:
            s = _native.resolve_settings(explicit)
        except KvpoolError as e:
            logger.error("kvpool setup refused: %s", e)
            return e.code
        if s["ignored"]:
            logger.debug("kvpool setup: accepted but not used: %s", ", ".join(s["ignored"]))
        try:
            client = _connect(s)
        except KvpoolError as e:
            logger.error("kvpool setup: cannot connect to %s: %s", s["master_server_addr"], e)
            return e.code
        with self._lock:
            old, self._client, self._settings = self._client, client, s
        if old is not None:
            try:
                old.close()
            except KvpoolError:
                pass
        return OK

    def close(self) -> int:
        """Withdraws the lent segment and disconnects. Returns 0."""
        with self._lock:
            c, self._client = self._client, None
        if c is not None:
            try:
                c.close()
            except KvpoolError as e:
                return e.code
        return OK

    def health_check(self) -> int:
        """0 healthy, 1 not set up (or closed), 2 master unreachable."""
        c = self._client
        if c is None or c.closed:
            return 1
        return 0 if c.ping(2.0) else 2

    def get_hostname(self) -> str:
        """The ``local_hostname`` this store was set up with (``""`` before setup)."""
        return self._settings.get("local_hostname", "") if self._client is not None else ""

    # ------------------------------------------------------------ helpers

    def _copying(self) -> Optional[_native.Client]:
        """The client for put/get calls that use the local buffer (None when refused)."""
        c = self._client
        if c is None or self._settings.get("local_buffer_size", 0) == 0:
            return None
        return c

    @staticmethod
    def _rc(fn: Any, *args: Any) -> int:
        try:
            fn(*args)
            return OK
        except KvpoolError as e:
            return e.code

    def _int(self, call: Callable[[_native.Client], int]) -> int:
        """``call(client)``, or the Mooncake code when not set up or it raises."""
        c = self._client
        if c is None:
            return UNAVAILABLE
        try:
            return call(c)
        except KvpoolError as e:
            return e.code

    def _ints(self, n: int, call: Callable[[_native.Client], List[int]]) -> List[int]:
        """:meth:`_int` for a batch call over ``n`` keys: one code per key on failure."""
        c = self._client
        if c is None:
            return [UNAVAILABLE] * n
        try:
            return call(c)
        except KvpoolError as e:
            return [e.code] * n

    # ------------------------------------------------------------ copying puts

    def put(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int:
        """Stores ``value``; an existing key is kept and the call returns 0."""
        return self._put(key, value, config, False)

    def upsert(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int:
        """Stores ``value``, replacing an existing one."""
        return self._put(key, value, config, True)

    def _put(self, key: str, value: Any, config: Any, upsert: bool) -> int:
        c = self._copying()
        if c is None:
            return UNAVAILABLE if self._client is None else INVALID_PARAMS
        if _nbytes(value) == 0:
            return INVALID_PARAMS
        return self._rc(c.put, key, value, None, config, upsert)

    def put_parts(self, key: str, *parts: Any, config: Optional[ReplicateConfig] = None) -> int:
        """Stores the concatenation of ``parts`` as one object."""
        return self._put_parts(key, parts, config, False)

    def upsert_parts(self, key: str, *parts: Any, config: Optional[ReplicateConfig] = None) -> int:
        """``put_parts`` that replaces an existing value."""
        return self._put_parts(key, parts, config, True)

    def _put_parts(self, key: str, parts: Sequence[Any], config: Any, upsert: bool) -> int:
        c = self._copying()
        if c is None:
            return UNAVAILABLE if self._client is None else INVALID_PARAMS
        if sum(_nbytes(p) for p in parts) == 0:
            return INVALID_PARAMS
        return self._rc(c.put_parts, key, list(parts), config, upsert)

    def put_batch(self, keys: List[str], values: List[Any], config: Optional[ReplicateConfig] = None) -> int:
        """Stores many objects; 0 if all were stored, else the first failure's
        code (the others are stored: use ``batch_put_from`` for per-key codes)."""
        return self._put_batch(keys, values, config, False)

    def upsert_batch(self, keys: List[str], values: List[Any], config: Optional[ReplicateConfig] = None) -> int:
        """``put_batch`` that replaces existing values."""
        return self._put_batch(keys, values, config, True)

    def _put_batch(self, keys: List[str], values: List[Any], config: Any, upsert: bool) -> int:
        c = self._copying()
        if c is None:
            return UNAVAILABLE if self._client is None else INVALID_PARAMS
        if len(keys) != len(values) or any(_nbytes(v) == 0 for v in values):
            return INVALID_PARAMS
        try:
            codes = c.batch_put(list(keys), list(values), None, config, upsert)
        except KvpoolError as e:
            return e.code
        return next((rc for rc in codes if rc != 0), OK)

    # ------------------------------------------------------------ copying gets

    def get(self, key: str) -> bytes:
        """The value, or ``b""`` on a miss or any error."""
        c = self._copying()
        if c is None:
            return b""
        try:
            return c.get(key)
        except KvpoolError:
            return b""

    def get_batch(self, keys: List[str]) -> List[bytes]:
        """Values of many keys (``b""`` where missing or failed)."""
        c = self._copying()
        if c is None:
            return [b""] * len(keys)
        try:
            return [b"" if isinstance(v, int) else v for v in c.batch_get(list(keys))]
        except KvpoolError:
            return [b""] * len(keys)

    def get_buffer(self, key: str) -> Optional[BufferHandle]:
        """The value as a buffer object (``ptr()``, ``size()``), or ``None``."""
        c = self._copying()
        if c is None:
            return None
        try:
            return c.get_buffer(key)
        except KvpoolError:
            return None

    def batch_get_buffer(self, keys: List[str]) -> List[Optional[BufferHandle]]:
        """Values as buffer objects (``None`` where missing or failed)."""
        c = self._copying()
        if c is None:
            return [None] * len(keys)
        try:
            return [None if isinstance(v, int) else v for v in c.batch_get_buffer(list(keys))]
        except KvpoolError:
            return [None] * len(keys)

    # ------------------------------------------------------------ queries and removal

    def is_exist(self, key: str) -> int:
        """1 if ``key`` exists, 0 if not, negative on error."""
        return self._int(lambda c: 1 if c.exists(key) else 0)

    def batch_is_exist(self, keys: List[str]) -> List[int]:
        """Per key: 1, 0, or a negative code."""
        return self._ints(len(keys), lambda c: c.batch_exists(list(keys)))

    def get_size(self, key: str) -> int:
        """Value size in bytes, or a negative code (−704 if missing)."""
        return self._int(lambda c: c.get_size(key))

    def remove(self, key: str, force: bool = False) -> int:
        """0, −704 if missing, −706 while a read lease is live (unless ``force``)."""
        c = self._client
        return UNAVAILABLE if c is None else self._rc(c.remove, key, force)

    def batch_remove(self, keys: List[str], force: bool = False) -> List[int]:
        """Per key: 0 or a negative code."""
        return self._ints(len(keys), lambda c: c.batch_remove(list(keys), force))

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Number of objects removed, or a negative code."""
        return self._int(lambda c: c.remove_by_regex(regex_pattern, force))

    def remove_all(self, force: bool = False) -> int:
        """Number of objects removed, or a negative code."""
        return self._int(lambda c: c.remove_all(force))

    # ------------------------------------------------------------ registered memory

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Registers memory for zero-copy calls (bookkeeping only over TCP:
        zero-copy calls work on any memory). 0, or −600 for a null/empty region."""
        if self._client is None:
            return UNAVAILABLE
        if buffer_ptr <= 0 or size <= 0:
            return INVALID_PARAMS
        with self._lock:
            self._registered[buffer_ptr] = size
        return OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """0, or −600 if ``buffer_ptr`` was not registered."""
        with self._lock:
            return OK if self._registered.pop(buffer_ptr, None) is not None else INVALID_PARAMS

    # ------------------------------------------------------------ zero-copy

    def put_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        """Stores ``size`` bytes at address ``buffer_ptr``."""
        return self._put_from(key, buffer_ptr, size, config, False)

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        """``put_from`` that replaces an existing value."""
        return self._put_from(key, buffer_ptr, size, config, True)

    def _put_from(self, key: str, ptr: int, size: int, config: Any, upsert: bool) -> int:
        c = self._client
        if c is None:
            return UNAVAILABLE
        if size <= 0:
            return INVALID_PARAMS
        return self._rc(c.put, key, ptr, size, config, upsert)

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Reads into ``size`` bytes at ``buffer_ptr``: bytes read, or negative
        (−600 if the buffer is too small, −704 if missing)."""
        return self._int(lambda c: c.get_into(key, buffer_ptr, size))

    def batch_put_from(
        self, keys: List[str], buffer_ptrs: List[int], sizes: List[int], config: Optional[ReplicateConfig] = None
    ) -> List[int]:
        """Per key: 0 or a negative code (−200 when the pool is full)."""
        return self._batch_put_from(keys, buffer_ptrs, sizes, config, False)

    def batch_upsert_from(
        self, keys: List[str], buffer_ptrs: List[int], sizes: List[int], config: Optional[ReplicateConfig] = None
    ) -> List[int]:
        """``batch_put_from`` that replaces existing values."""
        return self._batch_put_from(keys, buffer_ptrs, sizes, config, True)

    def batch_put_from_multi_buffers(
        self,
        keys: List[str],
        all_buffer_ptrs: List[List[int]],
        all_sizes: List[List[int]],
        config: Optional[ReplicateConfig] = None,
    ) -> List[int]:
        """Each object is the concatenation of its buffers; per key 0 or negative."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        return self._batch_put_from(keys, [list(p) for p in all_buffer_ptrs], [list(s) for s in all_sizes], config, False)

    def _batch_put_from(self, keys: Sequence[str], ptrs: Sequence[Any], sizes: Sequence[Any], config: Any, upsert: bool) -> List[int]:
        c = self._client
        if c is None:
            return [UNAVAILABLE] * len(keys)
        if len(ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        empty = {i for i, s in enumerate(sizes) if (sum(s) if isinstance(s, (list, tuple)) else s) <= 0}
        try:
            if not empty:
                return c.batch_put(list(keys), list(ptrs), list(sizes), config, upsert)
            keep = [i for i in range(len(keys)) if i not in empty]
            out = [INVALID_PARAMS] * len(keys)
            if keep:
                codes = c.batch_put([keys[i] for i in keep], [ptrs[i] for i in keep], [sizes[i] for i in keep], config, upsert)
                for i, rc in zip(keep, codes):
                    out[i] = rc
            return out
        except KvpoolError as e:
            return [e.code] * len(keys)

    def batch_get_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        """Per key: bytes read, or negative (≤ 0 is a miss for LMCache)."""
        return self._batch_get_into(keys, buffer_ptrs, sizes)

    def batch_get_into_multi_buffers(
        self,
        keys: List[str],
        all_buffer_ptrs: List[List[int]],
        all_sizes: List[List[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> List[int]:
        """Each object fills its buffers in order; per key bytes read or negative."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        return self._batch_get_into(keys, [list(p) for p in all_buffer_ptrs], [list(s) for s in all_sizes])

    def _batch_get_into(self, keys: Sequence[str], ptrs: Sequence[Any], sizes: Sequence[Any]) -> List[int]:
        n = len(keys)
        if len(ptrs) != n or len(sizes) != n:
            return self._ints(n, lambda c: [INVALID_PARAMS] * n)
        return self._ints(n, lambda c: c.batch_get_into(list(keys), list(ptrs), list(sizes)))

    def get_into_ranges(
        self,
        buffer_ptrs: List[int],
        all_keys: List[List[str]],
        all_dst_offsets: List[List[List[int]]],
        all_src_offsets: List[List[List[int]]],
        all_sizes: List[List[List[int]]],
    ) -> List[List[List[int]]]:
        """For buffer ``i`` and its key ``j``, copies each range
        ``all_src_offsets[i][j][k]`` (length ``all_sizes[i][j][k]``) of the object
        to ``buffer_ptrs[i] + all_dst_offsets[i][j][k]``. Per range: bytes
        copied or a negative code."""
        shape_ok = len(all_keys) == len(buffer_ptrs) == len(all_dst_offsets) == len(all_src_offsets) == len(all_sizes) and all(
            len(keys) == len(ds) == len(ss) == len(ns) and all(len(d) == len(s) == len(n) for d, s, n in zip(ds, ss, ns))
            for keys, ds, ss, ns in zip(all_keys, all_dst_offsets, all_src_offsets, all_sizes)
        )
        if not shape_ok:
            return [[[INVALID_PARAMS] * len(r) for r in rs] for rs in all_sizes] if isinstance(all_sizes, list) else []
        flat_keys: List[str] = []
        flat_ranges: List[List[Tuple[int, int, int]]] = []
        for i, keys in enumerate(all_keys):
            base = buffer_ptrs[i]
            for j, key in enumerate(keys):
                flat_keys.append(key)
                flat_ranges.append(
                    [
                        (base + d, s, n)
                        for d, s, n in zip(all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j])
                    ]
                )
        c = self._client
        if c is None:
            flat = [[UNAVAILABLE] * len(r) for r in flat_ranges]
        else:
            try:
                flat = c.read_ranges(flat_keys, flat_ranges)
            except KvpoolError as e:
                flat = [[e.code] * len(r) for r in flat_ranges]
        out: List[List[List[int]]] = []
        it = iter(flat)
        for keys in all_keys:
            out.append([next(it) for _ in keys])
        return out
