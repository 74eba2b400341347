"""Drop-in for ``mooncake.store``: :class:`MooncakeDistributedStore` with every
method of Mooncake 0.3.13's class, and every public name of the module
(enums, descriptors, tensor-parallel requests, host memory, buffer pools,
the Engram store; see :mod:`kvpool.mooncake_types`).

Same method names, argument order and return conventions as Mooncake:
integers (0 = OK, negative = Mooncake's error code), ``b""`` from a failed
``get``, ``1``/``0``/negative from ``is_exist``, one entry per key from batch
calls, ``None`` from a failed tensor read. Switching is
``from kvpool.mooncake import MooncakeDistributedStore``. Type errors in
arguments raise ``TypeError``, as Mooncake's binding does. Where kvpool
differs from Mooncake on purpose (wrong bytes Mooncake stores, calls that
crash it), docs/python.md says so.
"""

from __future__ import annotations

import ctypes
import logging
import os
import random
import socket
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from . import _native, _tensor
from .client import _connect, _track_lender
from .config import ReplicateConfig, SoftPinAction
from .errors import KvpoolError
from .mooncake_types import (
    BufferLease,
    BufferLeaseView,
    BufferPool,
    Descriptor,
    DiskDescriptor,
    EngramStore,
    EngramStoreConfig,
    MemoryDescriptor,
    MooncakeDistributedNoFRegister,
    MooncakeHostMemAllocator,
    ObjectDataType,
    ParallelAxis,
    QueryTaskResponse,
    ReadTarget,
    RegisteredBufferLease,
    RegisteredBufferLeaseView,
    RegisteredBufferPool,
    ReplicaDescriptor,
    ReplicaStatus,
    TaskStatus,
    TaskType,
    TensorParallelism,
    bind_to_numa_node,
    get_alloc_func_addr,
    get_free_func_addr,
    segment_id_hex,
    segment_id_text,
    task_id_int,
    task_id_tuple,
)

BufferHandle = _native.Buffer
"""What ``get_buffer`` returns: buffer protocol, ``ptr()``, ``size()``."""

# Module-level enum members, as ``mooncake.store`` exports them.
UNKNOWN, KVCACHE, TENSOR, WEIGHT, SAMPLE = (ObjectDataType(i) for i in range(5))
ACTIVATION, GRADIENT, OPTIMIZER_STATE, METADATA, GENERAL = (ObjectDataType(i) for i in range(5, 10))
UNDEFINED, INITIALIZED, COMPLETE, REMOVED = (
    ReplicaStatus.UNDEFINED,
    ReplicaStatus.INITIALIZED,
    ReplicaStatus.COMPLETE,
    ReplicaStatus.REMOVED,
)
PENDING, PROCESSING, FAILED, SUCCESS = TaskStatus.PENDING, TaskStatus.PROCESSING, TaskStatus.FAILED, TaskStatus.SUCCESS
REPLICA_COPY, REPLICA_MOVE = TaskType.REPLICA_COPY, TaskType.REPLICA_MOVE

__all__ = [
    "ACTIVATION", "BufferHandle", "BufferLease", "BufferLeaseView", "BufferPool", "COMPLETE", "Descriptor",
    "DiskDescriptor", "EngramStore", "EngramStoreConfig", "FAILED", "GENERAL", "GRADIENT", "INITIALIZED",
    "KVCACHE", "METADATA", "MemoryDescriptor", "MooncakeDistributedNoFRegister", "MooncakeDistributedStore",
    "MooncakeHostMemAllocator", "OPTIMIZER_STATE", "ObjectDataType", "PENDING", "PROCESSING", "ParallelAxis",
    "QueryTaskResponse", "REMOVED", "REPLICA_COPY", "REPLICA_MOVE", "ReadTarget", "RegisteredBufferLease",
    "RegisteredBufferLeaseView", "RegisteredBufferPool", "ReplicaDescriptor", "ReplicaStatus", "ReplicateConfig",
    "SAMPLE", "SUCCESS", "SoftPinAction", "TENSOR", "TaskStatus", "TaskType", "TensorParallelism", "UNDEFINED",
    "UNKNOWN", "WEIGHT", "bind_to_numa_node", "get_alloc_func_addr", "get_free_func_addr",
]

logger = logging.getLogger("kvpool.mooncake")

OK = 0
INTERNAL_ERROR = -1
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
TRANSFER_FAIL = -800
NOT_SUPPORTED = -1012

#: Longest soft pin a write may ask for (Mooncake's limit: one day).
MAX_SOFT_PIN_MS = 86_400_000
#: Ports Mooncake picks its own from when ``local_hostname`` has none.
CLIENT_PORTS = (12300, 14300)

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


def _has_port(host: str) -> bool:
    """Whether ``host`` ends in ``:port`` (``[v6]:port`` included)."""
    h = host.strip()
    if h.startswith("["):
        return "]:" in h
    head, sep, port = h.rpartition(":")
    return bool(sep) and ":" not in head and port.isdigit()


def _port_range() -> Tuple[int, int]:
    """``MC_STORE_CLIENT_MIN_PORT`` .. ``MC_STORE_CLIENT_MAX_PORT`` (Mooncake's 12300..14300)."""
    lo, hi = CLIENT_PORTS
    try:
        lo = int(os.environ.get("MC_STORE_CLIENT_MIN_PORT", lo))
        hi = int(os.environ.get("MC_STORE_CLIENT_MAX_PORT", hi))
    except ValueError:
        pass
    if not 0 < lo <= hi < 65536:
        lo, hi = CLIENT_PORTS
    return lo, hi


def _free_ports(address: str, n: int) -> List[int]:
    """Up to ``n`` ports of the client range nobody listens on at ``address``
    now (random ones where the address is not this machine's)."""
    lo, hi = _port_range()
    candidates = random.sample(range(lo, hi + 1), min(hi - lo + 1, 200))
    out: List[int] = []
    for p in candidates:
        try:
            with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
                s.bind((address, p))
        except OSError as e:
            if e.errno in (99, 22):  # address not local / invalid: cannot probe
                return candidates[:n]
            continue
        out.append(p)
        if len(out) == n:
            break
    return out or candidates[:n]


class _Preferring:
    """A config with preferred segments filled in where it names none (an
    engine attached to a storage process puts into that process's segments)."""

    def __init__(self, base: Any, names: List[str]) -> None:
        self._base = base if base is not None else ReplicateConfig()
        self.preferred_segments = list(names)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


class _PutSession:
    """An object reserved by ``batch_put_session_start``, filled by ranges."""

    def __init__(self, size: int, config: Any) -> None:
        self.data = bytearray(size)
        self.config = config
        self.addr = ctypes.addressof((ctypes.c_char * size).from_buffer(self.data)) if size else 0


class MooncakeDistributedStore:
    """Mooncake's store client API, served by kvpool. Call :meth:`setup`
    (or :meth:`setup_dummy`) first; every call before it answers −600."""

    def __init__(self) -> None:
        self._client: Optional[_native.Client] = None
        self._settings: Dict[str, Any] = {}
        self._hostname = ""
        self._registered: List[Tuple[int, int]] = []
        self._lock = threading.Lock()
        self._put_sessions: Dict[str, _PutSession] = {}
        self._get_sessions: Set[str] = set()
        self._prefer: List[str] = []
        self._pool: Tuple[int, int, int] = (0, 0, 0)  # address, size, used

    # ------------------------------------------------------------ setup

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """``setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, device_name, master_server_addr, engine=None,
        ...)`` or ``setup(config: dict)`` (sizes may be ``"16MB"``/``"4gb"``).
        Missing values come from ``KVPOOL_*``, then ``MOONCAKE_*``/``MC_*`` env
        vars, then the file in ``KVPOOL_CONFIG_PATH``/``MOONCAKE_CONFIG_PATH``.
        Returns 0 or a negative code."""
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
        environment. −600 on a store already set up (Mooncake's answer)."""
        if self._client is not None:
            return INVALID_PARAMS
        return self._setup({"protocol": protocol, "device_name": device_name, "global_segment_size": mount_segment_size})

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Attaches to the storage process (``kvpool store``) whose data
        plane is at ``server_address``, as SGLang's standalone-storage mode
        does: the store owns the memory and survives engine restarts, this
        process lends none, objects go to that store's segments first, and
        bytes move through shared memory where the store's segment file maps
        here. ``mem_pool_size`` bytes of host memory back
        :meth:`alloc_from_mem_pool`. 0 or a negative code."""
        if int(mem_pool_size) < 0 or int(local_buffer_size) < 0 or not server_address:
            return INVALID_PARAMS
        try:
            base = _native.resolve_settings({})
        except KvpoolError as e:
            return e.code
        try:
            about = _native.store_about(
                str(server_address), 5.0, base["secret"], base["insecure"], base["tls_ca"], base["tls_cert"], base["tls_key"]
            )
        except KvpoolError as e:
            logger.error("kvpool setup_dummy: no storage process answers at %s: %s", server_address, e)
            return e.code
        if not about["master"] or not about["segments"]:
            logger.error("kvpool setup_dummy: %s serves no mounted segment", server_address)
            return INVALID_PARAMS
        pool = 0
        if int(mem_pool_size) > 0:
            pool = _native.host_alloc(int(mem_pool_size))
            if not pool:
                return NO_AVAILABLE_HANDLE
        rc = self._setup(
            {
                "master_server_addr": about["master"],
                "global_segment_size": 0,
                "local_buffer_size": int(local_buffer_size),
                "protocol": "auto",
            }
        )
        if rc != OK:
            if pool:
                _native.host_free(pool)
            return rc
        with self._lock:
            self._prefer = [s["name"] for s in about["segments"]]
            self._pool = (pool, int(mem_pool_size), 0)
        return OK

    def alloc_from_mem_pool(self, size: int) -> int:
        """``size`` bytes (64-byte aligned) of the memory pool
        :meth:`setup_dummy` made; their address, or 0 when the pool is
        exhausted or there is none."""
        size = int(size)
        with self._lock:
            base, total, used = self._pool
            start = (used + 63) & ~63
            if not base or size <= 0 or start + size > total:
                return 0
            self._pool = (base, total, start + size)
            return base + start

    def _setup(self, explicit: Dict[str, Any]) -> int:
        try:
            s = _native.resolve_settings(explicit)
        except KvpoolError as e:
            logger.error("kvpool setup refused: %s", e)
            return e.code
        if s["ignored"]:
            logger.debug("kvpool setup: accepted but not used: %s", ", ".join(s["ignored"]))
        for note in s["notes"]:
            logger.warning("kvpool setup: %s", note)
        host = s["local_hostname"]
        ports = [0]
        if not _has_port(host):
            # Mooncake names a client host:port with a port it picks itself;
            # the name is also the lent segment's, so it must be unique.
            ports = _free_ports(s["segment_address"], 4)
        client = None
        err: Optional[KvpoolError] = None
        for port in ports:
            if port:
                s = dict(s, local_hostname=f"{host}:{port}", segment_port=port if s["global_segment_size"] else 0)
            try:
                client = _connect(s)
                break
            except KvpoolError as e:
                err = e
                if e.code != -102:  # the port was taken meanwhile: try another
                    break
        if client is None:
            assert err is not None
            logger.error("kvpool setup: cannot connect to %s: %s", s["master_server_addr"], err)
            return err.code
        with self._lock:
            old, self._client, self._settings = self._client, client, s
            self._hostname = s["local_hostname"]
            self._prefer = []
            self._put_sessions.clear()
            self._get_sessions.clear()
        if old is not None:
            try:
                old.close()
            except KvpoolError:
                pass
        return OK

    def close(self) -> int:
        """Withdraws the lent segments and disconnects. Returns 0."""
        with self._lock:
            c, self._client = self._client, None
            self._put_sessions.clear()
            self._get_sessions.clear()
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
        """This client's ``host:port`` name (the lent segment's name), with
        the port picked from 12300–14300 when setup gave none; ``""`` before
        setup."""
        return self._hostname if self._client is not None else ""

    def _native_client(self) -> "_native.Client":
        """The native client (for kvpool's own helpers); raises before setup."""
        c = self._client
        if c is None:
            raise KvpoolError("the store is not set up", INVALID_PARAMS)
        return c

    # ------------------------------------------------------------ helpers

    def _lends(self) -> bool:
        c = self._client
        return c is not None and (c.lent_bytes > 0 or bool(c.lent_segments()))

    def _config(self, config: Any, keys: int = 1) -> Tuple[Optional[int], Any]:
        """Checks the ReplicateConfig of a write of ``keys`` keys as Mooncake
        does: a soft-pin TTL needs ``soft_pin_action=ENABLE`` (or kvpool's
        ``with_soft_pin``) and at most a day; ``prefer_alloc_in_same_node``
        needs lent memory; ``group_ids``, a placement hint not used here,
        names one group per key; NVMe-oF and DFS replicas do not exist here.
        Returns (code or None, the config to use)."""
        if config is None:
            return None, (_Preferring(None, self._prefer) if self._prefer else None)
        ttl = getattr(config, "soft_pin_ttl_ms", None)
        if ttl is not None:
            action = int(getattr(config, "soft_pin_action", SoftPinAction.PRESERVE) or 0)
            pinned = action == SoftPinAction.ENABLE or (
                action == SoftPinAction.PRESERVE and bool(getattr(config, "with_soft_pin", False))
            )
            if not pinned or int(ttl) > MAX_SOFT_PIN_MS:
                return INVALID_PARAMS, None
        if getattr(config, "prefer_alloc_in_same_node", False) and not self._lends():
            return INVALID_PARAMS, None
        groups = getattr(config, "group_ids", None)
        if groups and len(groups) != keys:
            return INVALID_PARAMS, None
        if int(getattr(config, "nof_replica_num", 0) or 0) > 0 or int(getattr(config, "dfs_replica_num", 0) or 0) > 0:
            return NOT_SUPPORTED, None
        if self._prefer and not list(getattr(config, "preferred_segments", []) or []) and not getattr(config, "preferred_segment", ""):
            return None, _Preferring(config, self._prefer)
        return None, config

    def _copying(self) -> Optional[_native.Client]:
        """The client for put/get calls that use the local buffer (None when refused)."""
        c = self._client
        if c is None or self._settings.get("local_buffer_size", 0) == 0:
            return None
        return c

    def _refused(self) -> int:
        """Why a copying call is refused: not set up, or no local buffer (both −600)."""
        return INVALID_PARAMS

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
            return INVALID_PARAMS
        try:
            return call(c)
        except KvpoolError as e:
            return e.code

    def _ints(self, n: int, call: Callable[[_native.Client], List[int]]) -> List[int]:
        """:meth:`_int` for a batch call over ``n`` keys: one code per key on failure."""
        c = self._client
        if c is None:
            return [INVALID_PARAMS] * n
        try:
            return call(c)
        except KvpoolError as e:
            return [e.code] * n

    @staticmethod
    def _dedupe(keys: Sequence[str], keep_last: bool) -> Tuple[List[int], List[int]]:
        """For a batch that may name a key twice: the positions to send (one
        per key: its first or last) and, per position, the one it takes its
        result from."""
        chosen: Dict[str, int] = {}
        for i, k in enumerate(keys):
            if keep_last or k not in chosen:
                chosen[k] = i
        send = sorted(chosen.values())
        return send, [chosen[k] for k in keys]

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
            return self._refused()
        if not key or _nbytes(value) == 0:
            return INVALID_PARAMS
        bad, cfg = self._config(config)
        if bad is not None:
            return bad
        return self._rc(c.put, key, value, None, cfg, upsert)

    def put_parts(self, key: str, *parts: Any, config: Optional[ReplicateConfig] = None) -> int:
        """Stores the concatenation of ``parts`` as one object (empty parts
        are skipped; all empty stores nothing and returns 0, as Mooncake)."""
        return self._put_parts(key, parts, config, False)

    def upsert_parts(self, key: str, *parts: Any, config: Optional[ReplicateConfig] = None) -> int:
        """``put_parts`` that replaces an existing value."""
        return self._put_parts(key, parts, config, True)

    def _put_parts(self, key: str, parts: Sequence[Any], config: Any, upsert: bool) -> int:
        c = self._copying()
        if c is None:
            return self._refused()
        if not key:
            return INVALID_PARAMS
        bad, cfg = self._config(config)
        if bad is not None:
            return bad
        kept = [p for p in parts if _nbytes(p) > 0]
        if not kept:
            return OK
        return self._rc(c.put_parts, key, kept, cfg, upsert)

    def put_batch(self, keys: List[str], values: List[Any], config: Optional[ReplicateConfig] = None) -> int:
        """Stores many objects; 0 if all were stored, else the first failure's
        code (the others are stored: use ``batch_put_from`` for per-key codes).
        A key given twice keeps its first value, as in Mooncake."""
        return self._put_batch(keys, values, config, False)

    def upsert_batch(self, keys: List[str], values: List[Any], config: Optional[ReplicateConfig] = None) -> int:
        """``put_batch`` that replaces existing values (a repeated key keeps its first value)."""
        return self._put_batch(keys, values, config, True)

    def _put_batch(self, keys: List[str], values: List[Any], config: Any, upsert: bool) -> int:
        c = self._copying()
        if c is None:
            return self._refused()
        if len(keys) != len(values) or any(_nbytes(v) == 0 for v in values):
            return INVALID_PARAMS
        bad, cfg = self._config(config, len(keys))
        if bad is not None:
            return bad
        send, _ = self._dedupe(keys, keep_last=False)
        send = [i for i in send if keys[i]]
        worst = INVALID_PARAMS if any(not k for k in keys) else OK
        if not send:
            return worst
        try:
            codes = c.batch_put([keys[i] for i in send], [values[i] for i in send], None, cfg, upsert)
        except KvpoolError as e:
            return e.code
        return next((rc for rc in codes if rc != 0), worst)

    # ------------------------------------------------------------ copying gets

    def get(self, key: str) -> bytes:
        """The value, or ``b""`` on a miss or any error."""
        c = self._copying()
        if c is None or not key:
            return b""
        try:
            return c.get(key)
        except KvpoolError:
            return b""

    def get_batch(self, keys: List[str]) -> List[bytes]:
        """Values of many keys (``b""`` where missing or failed); ``[b""]``
        for no keys, as Mooncake."""
        c = self._copying()
        if not keys or self._client is None:
            return [b""]  # Mooncake's answer to no keys, and before setup
        if c is None:
            return [b""] * len(keys)
        try:
            ask = [k for k in keys if k]
            got = dict(zip(ask, c.batch_get(ask))) if ask else {}
        except KvpoolError:
            return [b""] * len(keys)
        return [b"" if isinstance(got.get(k, b""), int) else got.get(k, b"") for k in keys]

    def get_buffer(self, key: str) -> Optional[BufferHandle]:
        """The value as a buffer object (``ptr()``, ``size()``), or ``None``."""
        c = self._copying()
        if c is None or not key:
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
        if not keys:
            return []
        try:
            return [None if isinstance(v, int) else v for v in c.batch_get_buffer(list(keys))]
        except KvpoolError:
            return [None] * len(keys)

    # ------------------------------------------------------------ queries and removal

    def is_exist(self, key: str) -> int:
        """1 if ``key`` exists, 0 if not, negative on error. Takes a read
        lease, as Mooncake does: a ``remove`` right after is refused (−706)."""
        if not key:
            return 0 if self._client is not None else INVALID_PARAMS
        return self._int(lambda c: 1 if c.exists(key, True) else 0)

    def batch_is_exist(self, keys: List[str]) -> List[int]:
        """Per key: 1, 0, or a negative code (leases as for :meth:`is_exist`)."""
        if self._client is not None and any(not k for k in keys):
            ask = [k for k in keys if k]
            got = dict(zip(ask, self._ints(len(ask), lambda c: c.batch_exists(ask, True)))) if ask else {}
            return [got.get(k, 0) if k else 0 for k in keys]
        return self._ints(len(keys), lambda c: c.batch_exists(list(keys), True))

    def get_size(self, key: str) -> int:
        """Value size in bytes, or a negative code (−704 if missing); takes a read lease."""
        if not key:
            return OBJECT_NOT_FOUND if self._client is not None else INVALID_PARAMS
        return self._int(lambda c: c.get_size(key, True))

    def remove(self, key: str, force: bool = False) -> int:
        """0, −704 if missing, −706 while a read lease is live (unless ``force``)."""
        c = self._client
        if c is None:
            return INVALID_PARAMS
        if not key:
            return OBJECT_NOT_FOUND
        with self._lock:
            self._get_sessions.discard(key)
        return self._rc(c.remove, key, force)

    def batch_remove(self, keys: List[str], force: bool = False) -> List[int]:
        """Per key: 0 or a negative code."""
        if self._client is not None and any(not k for k in keys):
            ask = [k for k in keys if k]
            got = dict(zip(ask, self._ints(len(ask), lambda c: c.batch_remove(ask, force)))) if ask else {}
            return [got[k] if k else OBJECT_NOT_FOUND for k in keys]
        return self._ints(len(keys), lambda c: c.batch_remove(list(keys), force))

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Number of objects removed, or a negative code."""
        return self._int(lambda c: c.remove_by_regex(regex_pattern, force))

    def remove_all(self, force: bool = False) -> int:
        """Number of objects removed, or a negative code."""
        return self._int(lambda c: c.remove_all(force))

    # ------------------------------------------------------------ registered memory

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Registers memory for zero-copy calls: 0, or −600 for a null or
        empty region or one that overlaps a registered region (Mooncake's
        rule). Ranged reads (``get_into_ranges``) write only inside
        registered regions; the other zero-copy calls take any memory."""
        if self._client is None:
            return INVALID_PARAMS
        ptr, size = int(buffer_ptr), int(size)
        if ptr <= 0 or size <= 0:
            return INVALID_PARAMS
        with self._lock:
            if any(p < ptr + size and ptr < p + n for p, n in self._registered):
                return INVALID_PARAMS
            self._registered.append((ptr, size))
        return OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """0, or −600 if ``buffer_ptr`` does not start a registered region."""
        if self._client is None:
            return INVALID_PARAMS
        with self._lock:
            for i, (p, _) in enumerate(self._registered):
                if p == int(buffer_ptr):
                    del self._registered[i]
                    return OK
        return INVALID_PARAMS

    def _registered_end(self, ptr: int) -> Optional[int]:
        """The end of the registered region holding address ``ptr``, if any."""
        with self._lock:
            for p, n in self._registered:
                if p <= ptr < p + n:
                    return p + n
        return None

    # ------------------------------------------------------------ zero-copy

    def put_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        """Stores ``size`` bytes at address ``buffer_ptr``; a size of 0
        stores nothing and returns 0, as Mooncake."""
        return self._put_from(key, buffer_ptr, size, config, False)

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        """``put_from`` that replaces an existing value."""
        return self._put_from(key, buffer_ptr, size, config, True)

    def _put_from(self, key: str, ptr: int, size: int, config: Any, upsert: bool) -> int:
        c = self._client
        if c is None or not key or int(size) < 0:
            return INVALID_PARAMS
        bad, cfg = self._config(config)
        if bad is not None:
            return bad
        if int(size) == 0:
            return OK
        return self._rc(c.put, key, ptr, size, cfg, upsert)

    def put_from_with_metadata(
        self, key: str, buffer_ptr: int, metadata_buffer_ptr: int, size: int, metadata_size: int,
        config: Optional[ReplicateConfig] = None,
    ) -> int:
        """Stores ``metadata_size`` bytes at ``metadata_buffer_ptr`` followed
        by ``size`` bytes at ``buffer_ptr`` as one object (Mooncake's layout)."""
        c = self._client
        if c is None or not key or int(size) < 0 or int(metadata_size) < 0:
            return INVALID_PARAMS
        bad, cfg = self._config(config)
        if bad is not None:
            return bad
        ptrs, sizes = [], []
        for p, n in ((metadata_buffer_ptr, metadata_size), (buffer_ptr, size)):
            if int(n) > 0:
                ptrs.append(p)
                sizes.append(int(n))
        if not ptrs:
            return OK
        try:
            return c.batch_put([key], [ptrs], [sizes], cfg, False)[0]
        except KvpoolError as e:
            return e.code

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Reads into ``size`` bytes at ``buffer_ptr``: bytes read, or negative
        (−600 if the buffer is too small, −704 if missing)."""
        if not key:
            return OBJECT_NOT_FOUND if self._client is not None else INVALID_PARAMS
        return self._int(lambda c: c.get_into(key, buffer_ptr, size))

    def batch_put_from(
        self, keys: List[str], buffer_ptrs: List[int], sizes: List[int], config: Optional[ReplicateConfig] = None
    ) -> List[int]:
        """Per key: 0 or a negative code (−200 when the pool is full). A key
        given twice keeps its last value, as in Mooncake."""
        return self._batch_put_from(keys, buffer_ptrs, sizes, config, False, keep_last=True)

    def batch_upsert_from(
        self, keys: List[str], buffer_ptrs: List[int], sizes: List[int], config: Optional[ReplicateConfig] = None
    ) -> List[int]:
        """``batch_put_from`` that replaces existing values."""
        return self._batch_put_from(keys, buffer_ptrs, sizes, config, True, keep_last=True)

    def batch_put_from_multi_buffers(
        self,
        keys: List[str],
        all_buffer_ptrs: List[List[int]],
        all_sizes: List[List[int]],
        config: Optional[ReplicateConfig] = None,
    ) -> List[int]:
        """Each object is the concatenation of its buffers; per key 0 or
        negative (a repeated key keeps its first value, as in Mooncake)."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        return self._batch_put_from(
            keys, [list(p) for p in all_buffer_ptrs], [list(s) for s in all_sizes], config, False, keep_last=False
        )

    def _batch_put_from(
        self, keys: Sequence[str], ptrs: Sequence[Any], sizes: Sequence[Any], config: Any, upsert: bool, keep_last: bool
    ) -> List[int]:
        c = self._client
        if c is None:
            return [INVALID_PARAMS] * len(keys)
        if len(ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        bad, cfg = self._config(config, len(keys))
        if bad is not None:
            return [bad] * len(keys)
        out = [INVALID_PARAMS] * len(keys)
        send, source = self._dedupe(keys, keep_last)

        def total(s: Any) -> int:
            return sum(s) if isinstance(s, (list, tuple)) else int(s)

        send = [i for i in send if keys[i] and total(sizes[i]) > 0]
        if send:
            try:
                codes = c.batch_put([keys[i] for i in send], [ptrs[i] for i in send], [sizes[i] for i in send], cfg, upsert)
            except KvpoolError as e:
                codes = [e.code] * len(send)
            got = dict(zip(send, codes))
            out = [got.get(source[i], INVALID_PARAMS) if keys[i] else INVALID_PARAMS for i in range(len(keys))]
            # A repeated key whose own size was bad keeps its own answer.
            out = [out[i] if total(sizes[i]) > 0 else INVALID_PARAMS for i in range(len(keys))]
        return out

    def batch_get_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        """Per key: bytes read, or negative (≤ 0 is a miss for LMCache).
        Destinations that share bytes are all filled, one after another in
        batch order (where they overlap, the later key's bytes stay)."""
        return self._batch_get_into(keys, buffer_ptrs, sizes)

    def batch_get_into_multi_buffers(
        self,
        keys: List[str],
        all_buffer_ptrs: List[List[int]],
        all_sizes: List[List[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> List[int]:
        """Each object fills its buffers in order; per key bytes read or
        negative. The buffers must add up to the object's size exactly, as in
        Mooncake: buffers too small are −600, an object shorter than its
        buffers is −800 (TRANSFER_FAIL), never a short count that reads as
        success (vLLM's Mooncake store connector takes any count ≥ 0 as a
        loaded block; the buffers' bytes are then not the object's)."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [INVALID_PARAMS] * len(keys)
        sizes = [list(s) for s in all_sizes]
        got = self._batch_get_into(keys, [list(p) for p in all_buffer_ptrs], sizes)
        # Checked on the count the read returns (the object's size at read
        # time), not on a size asked for earlier, which a replacement could
        # change in between; a buffer touched by a failed read is not valid.
        return [TRANSFER_FAIL if 0 <= rc != sum(int(n) for n in want) else rc for rc, want in zip(got, sizes)]

    def _batch_get_into(self, keys: Sequence[str], ptrs: Sequence[Any], sizes: Sequence[Any]) -> List[int]:
        n = len(keys)
        if len(ptrs) != n or len(sizes) != n:
            return self._ints(n, lambda c: [INVALID_PARAMS] * n)
        if self._client is not None and any(not k for k in keys):
            idx = [i for i, k in enumerate(keys) if k]
            got = self._ints(len(idx), lambda c: c.batch_get_into([keys[i] for i in idx], [ptrs[i] for i in idx], [sizes[i] for i in idx]))
            out = [OBJECT_NOT_FOUND] * n
            for i, rc in zip(idx, got):
                out[i] = rc
            return out
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
        ``all_src_offsets[i][j][k]`` (length ``all_sizes[i][j][k]``) of the
        object to ``buffer_ptrs[i] + all_dst_offsets[i][j][k]``. Results per
        buffer, per key, per range: bytes copied or a negative code. A key
        whose lists disagree in length, a range past the object's end or past
        the end of the registered buffer it writes to (``register_buffer``),
        and any range of an unregistered buffer get −600 and write nothing; a
        missing key gets −704; the other keys and ranges are still served."""
        c = self._client
        nb = len(buffer_ptrs)

        def fail(i: int, code: int) -> List[List[int]]:
            keys = all_keys[i] if i < len(all_keys) else [None]
            dsts = all_dst_offsets[i] if i < len(all_dst_offsets) else []
            return [[code] * max(1, len(dsts[j]) if j < len(dsts) else 1) for j in range(len(keys))]

        if c is None:
            return [fail(i, INVALID_PARAMS) for i in range(nb)]
        if not (len(all_keys) == nb == len(all_dst_offsets) == len(all_src_offsets) == len(all_sizes)):
            return [fail(i, INVALID_PARAMS) for i in range(nb)]
        out: List[List[List[int]]] = []
        flat_keys: List[str] = []
        flat_ranges: List[List[Tuple[int, int, int]]] = []
        slots: List[Tuple[int, int, List[int]]] = []  # (buffer, key, range positions sent)
        for i, base in enumerate(buffer_ptrs):
            keys, dsts, srcs, lens = all_keys[i], all_dst_offsets[i], all_src_offsets[i], all_sizes[i]
            if not (len(keys) == len(dsts) == len(srcs) == len(lens)):
                out.append(fail(i, INVALID_PARAMS))
                continue
            end = self._registered_end(int(base))
            per_buffer: List[List[int]] = []
            for j, key in enumerate(keys):
                d, s, n = dsts[j], srcs[j], lens[j]
                if not (len(d) == len(s) == len(n)):
                    per_buffer.append([INVALID_PARAMS] * max(1, len(d)))
                    continue
                res = [INVALID_PARAMS] * len(d)
                sent_ranges: List[Tuple[int, int, int]] = []
                sent_pos: List[int] = []
                for k, (dd, ss, nn) in enumerate(zip(d, s, n)):
                    dd, ss, nn = int(dd), int(ss), int(nn)
                    if min(dd, ss, nn) < 0:
                        raise TypeError("offsets and sizes must be non-negative ints")
                    if end is None or int(base) + dd + nn > end:
                        continue
                    if nn == 0:
                        res[k] = 0
                        continue
                    sent_ranges.append((int(base) + dd, ss, nn))
                    sent_pos.append(k)
                per_buffer.append(res)
                if sent_ranges:
                    flat_keys.append(key)
                    flat_ranges.append(sent_ranges)
                    slots.append((len(out), j, sent_pos))
            out.append(per_buffer)
        if flat_keys:
            try:
                got = c.read_ranges(flat_keys, flat_ranges)
            except KvpoolError as e:
                got = [[e.code] * len(r) for r in flat_ranges]
            for (i, j, pos), codes in zip(slots, got):
                if any(cd == OBJECT_NOT_FOUND for cd in codes):
                    out[i][j] = [OBJECT_NOT_FOUND] * len(out[i][j])
                    continue
                for k, cd in zip(pos, codes):
                    out[i][j][k] = cd
        return out

    # ------------------------------------------------------------ sessions

    def batch_put_session_start(self, keys: List[str], sizes: List[int], config: Optional[ReplicateConfig] = None) -> List[int]:
        """Reserves objects of ``sizes`` bytes to fill with
        :meth:`batch_put_from_multi_buffer_ranges` and publish with
        :meth:`batch_put_session_end`. Per key: 0, −705 if the key exists,
        −600 for an empty key, a size ≤ 0 or a session already open."""
        c = self._client
        if c is None or len(keys) != len(sizes):
            return [INVALID_PARAMS] * len(keys)
        bad, cfg = self._config(config, len(keys))
        if bad is not None:
            return [bad] * len(keys)
        ask = [k for k in keys if k]
        try:
            exists = dict(zip(ask, c.batch_exists(ask))) if ask else {}
        except KvpoolError as e:
            return [e.code] * len(keys)
        out = []
        with self._lock:
            for k, n in zip(keys, sizes):
                if not k or int(n) <= 0 or k in self._put_sessions:
                    out.append(INVALID_PARAMS)
                elif exists.get(k) == 1:
                    out.append(OBJECT_ALREADY_EXISTS)
                elif exists.get(k, 0) < 0:
                    out.append(exists[k])
                else:
                    self._put_sessions[k] = _PutSession(int(n), cfg)
                    out.append(OK)
        return out

    def batch_put_from_multi_buffer_ranges(
        self, keys: List[str], all_buffer_ptrs: List[List[int]], all_sizes: List[List[int]], all_dst_offsets: List[List[int]]
    ) -> List[int]:
        """Copies each buffer ``all_buffer_ptrs[i][k]`` (``all_sizes[i][k]``
        bytes) into session object ``keys[i]`` at ``all_dst_offsets[i][k]``.
        Per key: bytes copied, or −600 (no session, lists that disagree, a
        range past the object's reserved size)."""
        n = len(keys)
        if self._client is None or not (len(all_buffer_ptrs) == len(all_sizes) == len(all_dst_offsets) == n):
            return [INVALID_PARAMS] * n
        out = []
        with self._lock:
            for k, ptrs, lens, offs in zip(keys, all_buffer_ptrs, all_sizes, all_dst_offsets):
                sess = self._put_sessions.get(k)
                if sess is None or not (len(ptrs) == len(lens) == len(offs)):
                    out.append(INVALID_PARAMS)
                    continue
                if any(int(o) < 0 or int(m) < 0 or int(o) + int(m) > len(sess.data) for o, m in zip(offs, lens)):
                    out.append(INVALID_PARAMS)
                    continue
                copied = 0
                for p, m, o in zip(ptrs, lens, offs):
                    if int(m):
                        ctypes.memmove(sess.addr + int(o), int(p), int(m))
                        copied += int(m)
                out.append(copied)
        return out

    def batch_put_session_end(self, keys: List[str]) -> List[int]:
        """Publishes session objects (bytes never written are zero); per key 0
        or negative (−600 without a session)."""
        c = self._client
        if c is None:
            return [INVALID_PARAMS] * len(keys)
        with self._lock:
            sessions = {k: self._put_sessions.pop(k) for k in dict.fromkeys(keys) if k in self._put_sessions}
        out = {k: INVALID_PARAMS for k in keys}
        by_cfg: Dict[int, List[str]] = {}
        for k, s in sessions.items():
            by_cfg.setdefault(id(s.config), []).append(k)
        for ks in by_cfg.values():
            cfg = sessions[ks[0]].config
            try:
                codes = c.batch_put(ks, [sessions[k].data for k in ks], None, cfg, False)
            except KvpoolError as e:
                codes = [e.code] * len(ks)
            out.update(zip(ks, codes))
        return [out[k] for k in keys]

    def batch_put_session_revoke(self, keys: List[str]) -> List[int]:
        """Abandons session objects; per key 0, or −600 without a session."""
        if self._client is None:
            return [INVALID_PARAMS] * len(keys)
        with self._lock:
            return [OK if self._put_sessions.pop(k, None) is not None else INVALID_PARAMS for k in keys]

    def batch_get_session_start(self, keys: List[str]) -> List[int]:
        """Locates objects once (taking their read leases) for ranged reads
        with :meth:`batch_get_into_multi_buffer_ranges`; per key 0 or −704."""
        c = self._client
        if c is None:
            return [INVALID_PARAMS] * len(keys)
        codes = self._ints(len(keys), lambda c: c.batch_exists(list(keys), True))
        out = []
        with self._lock:
            for k, rc in zip(keys, codes):
                if rc == 1:
                    self._get_sessions.add(k)
                    out.append(OK)
                else:
                    out.append(OBJECT_NOT_FOUND if rc == 0 else rc)
        return out

    def batch_get_session_end(self, keys: List[str]) -> int:
        """Ends get sessions; 0."""
        if self._client is None:
            return INVALID_PARAMS
        with self._lock:
            for k in keys:
                self._get_sessions.discard(k)
        return OK

    def batch_get_into_multi_buffer_ranges(
        self, keys: List[str], all_buffer_ptrs: List[List[int]], all_sizes: List[List[int]], all_src_offsets: List[List[int]]
    ) -> List[int]:
        """For each key in a get session, copies ``all_sizes[i][k]`` bytes at
        ``all_src_offsets[i][k]`` of the object into ``all_buffer_ptrs[i][k]``.
        Per key: bytes copied, or negative (−600 without a session, for lists
        that disagree or a range past the object's end)."""
        c = self._client
        n = len(keys)
        if c is None or not (len(all_buffer_ptrs) == len(all_sizes) == len(all_src_offsets) == n):
            return [INVALID_PARAMS] * n
        out = [INVALID_PARAMS] * n
        ask: List[int] = []
        ranges: List[List[Tuple[int, int, int]]] = []
        with self._lock:
            open_ = set(self._get_sessions)
        for i, (k, ptrs, lens, srcs) in enumerate(zip(keys, all_buffer_ptrs, all_sizes, all_src_offsets)):
            if k not in open_ or not (len(ptrs) == len(lens) == len(srcs)):
                continue
            rs = [(int(p), int(s), int(m)) for p, m, s in zip(ptrs, lens, srcs) if int(m) > 0]
            if not rs:
                out[i] = 0
                continue
            ask.append(i)
            ranges.append(rs)
        if ask:
            try:
                got = c.read_ranges([keys[i] for i in ask], ranges)
            except KvpoolError as e:
                got = [[e.code] * len(r) for r in ranges]
            for i, codes in zip(ask, got):
                bad = [cd for cd in codes if cd < 0]
                out[i] = bad[0] if bad else sum(codes)
        return out

    # ------------------------------------------------------------ replicas and tasks

    def _descs(self, keys: List[str]) -> List[Any]:
        c = self._client
        if c is None or not keys:
            return [INVALID_PARAMS] * len(keys)
        try:
            return c.replica_descs(list(keys))
        except KvpoolError as e:
            return [e.code] * len(keys)

    @staticmethod
    def _desc_objects(raw: Any) -> List[ReplicaDescriptor]:
        if isinstance(raw, int):
            return []
        return [
            ReplicaDescriptor(MemoryDescriptor(Descriptor(offset, size, name)), ReplicaStatus.COMPLETE)
            for name, _id, _endpoint, offset, size in raw
        ]

    def get_replica_desc(self, key: str) -> List[ReplicaDescriptor]:
        """The object's replicas (``[]`` if missing); takes a read lease."""
        if not key:
            return []
        return self._desc_objects(self._descs([key])[0])

    def batch_get_replica_desc(self, keys: List[str]) -> Dict[str, List[ReplicaDescriptor]]:
        """Replicas of the keys that exist, by key."""
        ask = [k for k in dict.fromkeys(keys) if k]
        return {k: self._desc_objects(r) for k, r in zip(ask, self._descs(ask)) if not isinstance(r, int)}

    def batch_replica_clear(self, keys: List[str], segment_name: str = "") -> List[str]:
        """Drops the keys' replicas on segment ``segment_name`` (every
        replica, so the objects, for ``""``); objects under a live read lease
        are left alone, and one losing its last replica is removed. Returns
        the keys cleared."""
        c = self._client
        ask = [k for k in dict.fromkeys(keys) if k]
        if c is None or not ask:
            return []
        try:
            done = c.clear_replicas(ask, segment_name or None)
        except KvpoolError:
            return []
        return [k for k, d in zip(ask, done) if d]

    def create_copy_task(self, key: str, targets: List[str]) -> Tuple[Tuple[int, int], int]:
        """Copies the object to the segments named ``targets`` in the
        background: ``((task id), 0)``, or ``((0, 0), code)`` (−704 missing
        key, −600 no or unknown targets)."""
        c = self._client
        if c is None or not key:
            return (0, 0), INVALID_PARAMS
        try:
            return task_id_tuple(c.start_task("copy", key, list(targets))), OK
        except KvpoolError as e:
            return (0, 0), e.code

    def create_move_task(self, key: str, source: str, target: str) -> Tuple[Tuple[int, int], int]:
        """Moves the object's replica from segment ``source`` to ``target``
        in the background (``(task id, 0)`` or ``((0, 0), code)``)."""
        c = self._client
        if c is None or not key:
            return (0, 0), INVALID_PARAMS
        try:
            return task_id_tuple(c.start_task("move", key, [target], source)), OK
        except KvpoolError as e:
            return (0, 0), e.code

    def query_task(self, task_id: Tuple[int, int]) -> Tuple[Optional[QueryTaskResponse], int]:
        """``(QueryTaskResponse, 0)``, or ``(None, code)`` (−1400 unknown task)."""
        c = self._client
        if c is None:
            return None, INVALID_PARAMS
        try:
            return QueryTaskResponse(c.query_task(task_id_int(task_id))), OK
        except KvpoolError as e:
            return None, e.code

    # ------------------------------------------------------------ segments

    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp", location: str = "") -> Dict[str, Any]:
        """Lends ``size`` more bytes of this process's memory as a new
        segment: ``{"ret": 0, "segment_ids": [id], "allocated_size": size}``
        or ``{"ret": code, "segment_ids": [], "allocated_size": 0}``.
        ``location`` (a NUMA hint) is accepted and not used."""
        rc, ids = self._mount(int(size), None, 0, protocol)
        return {"ret": rc, "segment_ids": ids, "allocated_size": int(size) if rc == OK else 0}

    def mount_segment(self, path: str, size: int, offset: int = 0, protocol: str = "tcp", location: str = "") -> Dict[str, Any]:
        """Lends ``size`` bytes at ``offset`` (page-aligned) of the file at
        ``path`` as a new segment, served by this process over TCP:
        ``{"ret": 0, "segment_ids": [id]}`` or ``{"ret": code, "segment_ids": []}``."""
        rc, ids = self._mount(int(size), str(path), int(offset), protocol)
        return {"ret": rc, "segment_ids": ids}

    def _mount(self, size: int, path: Optional[str], offset: int, protocol: str) -> Tuple[int, List[str]]:
        c = self._client
        if c is None or size <= 0 or offset < 0:
            return INVALID_PARAMS, []
        if str(protocol).lower() not in ("tcp", "rdma", "shm", "auto", ""):
            return INVALID_PARAMS, []
        try:
            info = c.mount_segment(size, path, offset)
        except KvpoolError as e:
            return e.code, []
        _track_lender(c)
        return OK, [segment_id_text(info["id"])]

    def unmount_segment(self, segment_ids: List[str], grace_period_seconds: int = 0) -> int:
        """Takes back segments this process lends (ids as mount calls gave
        them), after ``grace_period_seconds`` (in the background); objects
        with no other replica go with them. 0, or −1 for an id it does not
        lend (Mooncake's answer)."""
        c = self._client
        if c is None:
            return INVALID_PARAMS
        mine = {s["id"]: s for s in c.lent_segments()}
        hexes = [segment_id_hex(s) for s in segment_ids]
        if not hexes or any(h is None or h not in mine for h in hexes):
            return INTERNAL_ERROR

        def run() -> None:
            for h in hexes:
                try:
                    c.unmount_segment(h)
                except KvpoolError as e:
                    logger.warning("unmount of segment %s failed: %s", h, e)

        if int(grace_period_seconds) > 0:
            t = threading.Timer(int(grace_period_seconds), run)
            t.daemon = True
            t.start()
        else:
            run()
        return OK

    def unmount_and_free_segment(self, segment_ids: List[str], grace_period_seconds: int = 0) -> int:
        """:meth:`unmount_segment`; the memory is given back as the segment goes."""
        return self.unmount_segment(segment_ids, grace_period_seconds)

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        """−1012: kvpool has no local-disk (SSD offload) segments."""
        return NOT_SUPPORTED

    def get_offload_rpc_read_count(self) -> int:
        """Reads served by the SSD-offload RPC: 0, as kvpool has no offload tier."""
        return 0

    # ------------------------------------------------------------ tensors

    def _put_tensors(self, keys: Sequence[str], tensors: Sequence[Any], config: Any, upsert: bool,
                     shard: Optional[Callable[[Any], List[Tuple[str, bytes, Any]]]] = None) -> List[int]:
        """Stores tensors as header + bytes, one batch; ``shard`` turns one
        (key, tensor) into the (key, header, data) objects to store."""
        c = self._client
        n = len(keys)
        if c is None or len(tensors) != n:
            return [INVALID_PARAMS] * n
        bad, cfg = self._config(config, n)
        if bad is not None:
            return [bad] * n
        objects: List[Tuple[int, str, bytes, Any]] = []
        out = [OK] * n
        for i, (k, t) in enumerate(zip(keys, tensors)):
            try:
                if not k or not _tensor.is_tensor(t):
                    raise _tensor.BadTensor("a key and a torch tensor are needed")
                if shard is None:
                    t = _tensor.contiguous(t)
                    parts = [(k, _tensor.header(t), t)]
                else:
                    parts = shard((k, t))
                objects.extend((i, pk, h, d) for pk, h, d in parts)
            except _tensor.BadTensor as e:
                logger.debug("tensor %r refused: %s", k, e)
                out[i] = INVALID_PARAMS
        if objects:
            values = [[h, _tensor.data_view(d)] if d.numel() else [h] for _, _, h, d in objects]
            try:
                codes = c.batch_put([pk for _, pk, _, _ in objects], values, None, cfg, upsert)
            except KvpoolError as e:
                codes = [e.code] * len(objects)
            for (i, _, _, _), rc in zip(objects, codes):
                if rc != OK and out[i] == OK:
                    out[i] = rc
        return out

    def _get_tensor(self, key: str) -> Any:
        """The tensor stored under ``key`` (read straight into a buffer the
        tensor then views), or None."""
        c = self._client
        if c is None or not key:
            return None
        try:
            buf = c.get_buffer(key)
            meta = _tensor.parse(buf, len(buf))
            return _tensor.from_buffer(buf, meta)
        except (KvpoolError, _tensor.BadTensor):
            return None

    def put_tensor(self, key: str, tensor: Any) -> int:
        """Stores a torch tensor (any dtype Mooncake's layout numbers, up to 8
        dimensions; non-contiguous tensors are stored in C order); write-once."""
        return self._put_tensors([key], [tensor], None, False)[0]

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        """:meth:`put_tensor` that replaces an existing value."""
        return self._put_tensors([key], [tensor], None, True)[0]

    def pub_tensor(self, key: str, tensor: Any, config: Optional[ReplicateConfig] = None) -> int:
        """:meth:`put_tensor` with a ReplicateConfig."""
        return self._put_tensors([key], [tensor], config, False)[0]

    def upsert_pub_tensor(self, key: str, tensor: Any, config: Optional[ReplicateConfig] = None) -> int:
        """:meth:`upsert_tensor` with a ReplicateConfig."""
        return self._put_tensors([key], [tensor], config, True)[0]

    def batch_put_tensor(self, keys: List[str], tensors_list: List[Any]) -> List[int]:
        """:meth:`put_tensor` for many keys; per key 0 or negative."""
        return self._put_tensors(keys, tensors_list, None, False)

    def batch_upsert_tensor(self, keys: List[str], tensors_list: List[Any]) -> List[int]:
        """:meth:`upsert_tensor` for many keys."""
        return self._put_tensors(keys, tensors_list, None, True)

    def batch_pub_tensor(self, keys: List[str], tensors_list: List[Any], config: Optional[ReplicateConfig] = None) -> List[int]:
        """:meth:`pub_tensor` for many keys."""
        return self._put_tensors(keys, tensors_list, config, False)

    def batch_upsert_pub_tensor(self, keys: List[str], tensors_list: List[Any], config: Optional[ReplicateConfig] = None) -> List[int]:
        """:meth:`upsert_pub_tensor` for many keys."""
        return self._put_tensors(keys, tensors_list, config, True)

    def get_tensor(self, key: str) -> Any:
        """The tensor stored under ``key`` (same dtype and shape), or None."""
        return self._get_tensor(key)

    def batch_get_tensor(self, keys: List[str]) -> List[Any]:
        """:meth:`get_tensor` for many keys (None where missing)."""
        return [self._get_tensor(k) for k in keys]

    def _check_tensor_buffer(self, ptr: int, size: int) -> bool:
        """Whether ``size`` bytes at ``ptr`` hold one tensor object exactly."""
        if int(ptr) <= 0 or int(size) < _tensor.HEADER:
            return False
        try:
            _tensor.parse((ctypes.c_ubyte * _tensor.HEADER).from_address(int(ptr)), int(size))
            return True
        except _tensor.BadTensor:
            return False

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Stores a tensor from a buffer holding header + data (the layout
        :meth:`get_tensor_into` leaves); −600 if the buffer is not exactly that."""
        if self._client is None or not self._check_tensor_buffer(buffer_ptr, size):
            return INVALID_PARAMS
        return self._put_from(key, buffer_ptr, size, None, False)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """:meth:`put_tensor_from` that replaces an existing value."""
        if self._client is None or not self._check_tensor_buffer(buffer_ptr, size):
            return INVALID_PARAMS
        return self._put_from(key, buffer_ptr, size, None, True)

    def batch_put_tensor_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        """:meth:`put_tensor_from` for many keys."""
        return self._batch_tensor_from(keys, buffer_ptrs, sizes, False)

    def batch_upsert_tensor_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        """:meth:`upsert_tensor_from` for many keys."""
        return self._batch_tensor_from(keys, buffer_ptrs, sizes, True)

    def _batch_tensor_from(self, keys: List[str], ptrs: List[int], sizes: List[int], upsert: bool) -> List[int]:
        if self._client is None or not (len(keys) == len(ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(keys)
        ok = [self._check_tensor_buffer(p, s) for p, s in zip(ptrs, sizes)]
        # Like Mooncake, one bad buffer fails the whole batch (nothing stored).
        idx = list(range(len(keys))) if all(ok) else []
        out = [INVALID_PARAMS] * len(keys)
        if idx:
            got = self._batch_put_from([keys[i] for i in idx], [ptrs[i] for i in idx], [sizes[i] for i in idx], None, upsert, True)
            for i, rc in zip(idx, got):
                out[i] = rc
        return out

    def _tensor_into(self, key: str, ptr: int, size: int) -> Any:
        """Reads tensor object ``key`` into ``size`` bytes at ``ptr``; a
        tensor viewing the data there, or None."""
        c = self._client
        if c is None or not key or int(ptr) <= 0 or int(size) < _tensor.HEADER:
            return None
        try:
            n = c.get_into(key, int(ptr), int(size))
            arr = (ctypes.c_ubyte * n).from_address(int(ptr))
            return _tensor.from_buffer(arr, _tensor.parse(arr, n))
        except (KvpoolError, _tensor.BadTensor):
            return None

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Reads the tensor object (header + data) into the buffer and returns
        a tensor viewing its data there (no copy), or None (missing, or the
        buffer too small)."""
        return self._tensor_into(key, buffer_ptr, size)

    def batch_get_tensor_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[Any]:
        """:meth:`get_tensor_into` for many keys."""
        if len(keys) != len(buffer_ptrs) or len(keys) != len(sizes):
            return [None] * len(keys)
        return [self._tensor_into(k, p, s) for k, p, s in zip(keys, buffer_ptrs, sizes)]

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        """Reads the tensor stored under ``key`` into CUDA tensor ``tensor``
        (same number of bytes): 0 or negative. Raises
        :class:`kvpool.errors.NotSupported` where torch has no CUDA."""
        return self.batch_get_tensor_into_cuda([key], [tensor])[0]

    def batch_get_tensor_into_cuda(self, keys: List[str], tensors_list: List[Any]) -> List[int]:
        """:meth:`get_tensor_into_cuda` for many keys."""
        from .errors import NotSupported

        torch = _tensor.torch_module()
        if not torch.cuda.is_available():
            raise NotSupported("the _into_cuda reads need torch with CUDA; this torch has no CUDA device", NOT_SUPPORTED)
        if self._client is None or len(keys) != len(tensors_list):
            return [INVALID_PARAMS] * len(keys)
        out = []
        for k, dst in zip(keys, tensors_list):
            if not _tensor.is_tensor(dst) or dst.device.type != "cuda" or not dst.is_contiguous():
                out.append(INVALID_PARAMS)
                continue
            src = self._get_tensor(k)
            if src is None:
                out.append(OBJECT_NOT_FOUND)
                continue
            if src.numel() * src.element_size() != dst.numel() * dst.element_size():
                out.append(INVALID_PARAMS)
                continue
            dst.view(torch.uint8).reshape(-1).copy_(src.reshape(-1).view(torch.uint8), non_blocking=False)
            out.append(OK)
        return out

    # ------------------------------------------------------------ tensor parallelism

    @staticmethod
    def _tp_key(key: str, rank: int) -> str:
        return f"{key}_tp_{rank}"

    def _tp_shards(self, tp_size: int, split_dim: int) -> Callable[[Any], List[Tuple[str, bytes, Any]]]:
        def shard(kt: Any) -> List[Tuple[str, bytes, Any]]:
            key, t = kt
            full = tuple(t.shape)
            return [(self._tp_key(key, ax[0]), _tensor.header(s, full, ax), s) for s, ax in _tensor.split(t, tp_size, split_dim)]

        return shard

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        """Splits the tensor into ``tp_size`` shards along ``split_dim``
        (evenly, else −600) and stores every rank's shard under
        ``{key}_tp_{rank}``; ``tp_size`` 1 stores it whole under ``key``."""
        return self._put_with_tp([key], [tensor], None, tp_size, split_dim, False)[0]

    def pub_tensor_with_tp(self, key: str, tensor: Any, config: Optional[ReplicateConfig] = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        """:meth:`put_tensor_with_tp` with a ReplicateConfig."""
        return self._put_with_tp([key], [tensor], config, tp_size, split_dim, False)[0]

    def batch_put_tensor_with_tp(self, base_keys: List[str], tensors_list: List[Any], tp_rank: int = 0,
                                 tp_size: int = 1, split_dim: int = 0) -> List[int]:
        """:meth:`put_tensor_with_tp` for many keys."""
        return self._put_with_tp(base_keys, tensors_list, None, tp_size, split_dim, False)

    def batch_pub_tensor_with_tp(self, base_keys: List[str], tensors_list: List[Any], config: Optional[ReplicateConfig] = None,
                                 tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> List[int]:
        """:meth:`pub_tensor_with_tp` for many keys."""
        return self._put_with_tp(base_keys, tensors_list, config, tp_size, split_dim, False)

    def _put_with_tp(self, keys: List[str], tensors: List[Any], config: Any, tp_size: int, split_dim: int, upsert: bool) -> List[int]:
        if int(tp_size) <= 1:
            return self._put_tensors(keys, tensors, config, upsert)
        return self._put_tensors(keys, tensors, config, upsert, self._tp_shards(int(tp_size), int(split_dim)))

    def _tensor_at(self, ptr: int, size: int) -> Any:
        """The tensor a header + data buffer holds (viewing it), or None."""
        if not self._check_tensor_buffer(ptr, size):
            return None
        arr = (ctypes.c_ubyte * int(size)).from_address(int(ptr))
        return _tensor.from_buffer(arr, _tensor.parse(arr, int(size)))

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> int:
        """:meth:`put_tensor_with_tp` of the whole tensor a header + data buffer holds."""
        t = self._tensor_at(buffer_ptr, size)
        if t is None or self._client is None:
            return INVALID_PARAMS
        return self._put_with_tp([key], [t], None, tp_size, split_dim, False)[0]

    def batch_put_tensor_with_tp_from(self, base_keys: List[str], buffer_ptrs: List[int], sizes: List[int], tp_rank: int = 0,
                                      tp_size: int = 1, split_dim: int = 0) -> List[int]:
        """:meth:`put_tensor_with_tp_from` for many keys."""
        if len(base_keys) != len(buffer_ptrs) or len(base_keys) != len(sizes):
            return [INVALID_PARAMS] * len(base_keys)
        return [self.put_tensor_with_tp_from(k, p, s, tp_rank, tp_size, split_dim) for k, p, s in zip(base_keys, buffer_ptrs, sizes)]

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> Any:
        """The shard ``{key}_tp_{tp_rank}`` (``tp_size`` 1: the tensor under
        ``key``), or None. As in Mooncake, the shard is read as stored:
        ``tp_size`` and ``split_dim`` only choose between whole and shard."""
        return self._get_tensor(key if int(tp_size) <= 1 else self._tp_key(key, int(tp_rank)))

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> Any:
        """:meth:`get_tensor_with_tp` read into a buffer (see :meth:`get_tensor_into`)."""
        return self._tensor_into(key if int(tp_size) <= 1 else self._tp_key(key, int(tp_rank)), buffer_ptr, size)

    def batch_get_tensor_with_tp(self, base_keys: List[str], tp_rank: int = 0, tp_size: int = 1) -> List[Any]:
        """:meth:`get_tensor_with_tp` for many keys."""
        return [self.get_tensor_with_tp(k, tp_rank, tp_size) for k in base_keys]

    def batch_get_tensor_with_tp_into(self, base_keys: List[str], buffer_ptrs: List[int], sizes: List[int], tp_rank: int = 0,
                                      tp_size: int = 1) -> List[Any]:
        """:meth:`get_tensor_with_tp_into` for many keys."""
        if len(base_keys) != len(buffer_ptrs) or len(base_keys) != len(sizes):
            return [None] * len(base_keys)
        return [self.get_tensor_with_tp_into(k, p, s, tp_rank, tp_size) for k, p, s in zip(base_keys, buffer_ptrs, sizes)]

    @staticmethod
    def _tp_axis(parallelism: Any) -> Tuple[int, int, int]:
        """(rank, size, split_dim) of a layout of one tensor-parallel axis."""
        axes = list(getattr(parallelism, "axes", None) or [])
        if len(axes) != 1:
            raise _tensor.BadTensor("kvpool stores layouts of exactly one tensor-parallel axis")
        a = axes[0]
        if str(getattr(a, "kind", "")).lower() != "tp":
            raise _tensor.BadTensor(f"unsupported axis kind {getattr(a, 'kind', '')!r} (kvpool stores 'tp' axes)")
        rank, size = int(getattr(a, "rank", 0)), int(getattr(a, "size", 1))
        split = getattr(a, "split_dim", None)
        split = 0 if split is None else int(split)
        if size <= 0 or not 0 <= rank < size:
            raise _tensor.BadTensor(f"rank {rank} of {size}")
        return rank, size, split

    @staticmethod
    def _partition(p: Any) -> Tuple[int, int, int]:
        """(rank, size, split_dim) of a writer partition (dict or object)."""
        get = (lambda n: p.get(n)) if isinstance(p, dict) else (lambda n: getattr(p, n, None))
        rank, size, split = get("rank"), get("size"), get("split_dim")
        if rank is None or size is None or split is None:
            raise _tensor.BadTensor("writer_partition must provide rank, size, and split_dim")
        return int(rank), int(size), int(split)

    def _parallel_shard(self, parallelism: Any, writer_partition: Any) -> Callable[[Any], List[Tuple[str, bytes, Any]]]:
        if parallelism is not None and writer_partition is not None:
            raise _tensor.BadTensor("writer_partition cannot be combined with parallelism")

        def shard(kt: Any) -> List[Tuple[str, bytes, Any]]:
            key, t = kt
            if parallelism is None and writer_partition is None:
                # No layout: the tensor is stored whole under its key (Mooncake's answer).
                t = _tensor.contiguous(t)
                return [(key, _tensor.header(t), t)]
            if parallelism is not None:
                # The tensor is this rank's shard of a bigger one.
                rank, size, split = self._tp_axis(parallelism)
                t = _tensor.contiguous(t)
                if not 0 <= split < max(1, t.dim()):
                    raise _tensor.BadTensor(f"no dimension {split} to split along")
                full = list(t.shape)
                full[split] *= size
                ax = (rank, size, split, rank * t.shape[split])
                return [(self._tp_key(key, rank), _tensor.header(t, tuple(full), ax), t)]
            # The tensor is whole: this writer stores its partition's shard.
            rank, size, split = self._partition(writer_partition)
            if not 0 <= rank < size:
                raise _tensor.BadTensor(f"rank {rank} of {size}")
            s, ax = _tensor.split(t, size, split)[rank]
            return [(self._tp_key(key, rank), _tensor.header(s, tuple(t.shape), ax), s)]

        return shard

    def _put_parallel(self, keys: List[str], tensors: List[Any], parallelisms: Any, config: Any, writer_partitions: Any,
                      upsert: bool) -> List[int]:
        n = len(keys)
        pars = list(parallelisms) if isinstance(parallelisms, (list, tuple)) else [parallelisms] * n
        parts = list(writer_partitions) if isinstance(writer_partitions, (list, tuple)) else [writer_partitions] * n
        if len(pars) != n or len(parts) != n or len(tensors) != n:
            return [INVALID_PARAMS] * n
        out = []
        for k, t, p, w in zip(keys, tensors, pars, parts):
            try:
                shard = self._parallel_shard(p, w)
            except _tensor.BadTensor:
                out.append(INVALID_PARAMS)
                continue
            out.append(self._put_tensors([k], [t], config, upsert, shard)[0])
        return out

    def put_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None, config: Optional[ReplicateConfig] = None,
                                    writer_partition: Any = None) -> int:
        """Stores ``tensor`` as the shard ``rank`` of a tensor-parallel
        layout (``parallelism``: one ``"tp"`` axis) under ``{key}_tp_{rank}``;
        or, with ``writer_partition`` (rank, size, split_dim), cuts that
        shard from the whole ``tensor``. Other axis kinds are −600."""
        return self._put_parallel([key], [tensor], parallelism, config, writer_partition, False)[0]

    def upsert_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None,
                                       config: Optional[ReplicateConfig] = None, writer_partition: Any = None) -> int:
        """:meth:`put_tensor_with_parallelism` that replaces existing shards."""
        return self._put_parallel([key], [tensor], parallelism, config, writer_partition, True)[0]

    def batch_put_tensor_with_parallelism(self, keys: List[str], tensors_list: List[Any], parallelisms: Any = None,
                                          config: Optional[ReplicateConfig] = None, writer_partitions: Any = None) -> List[int]:
        """:meth:`put_tensor_with_parallelism` for many keys (one layout per key, or one for all)."""
        return self._put_parallel(keys, tensors_list, parallelisms, config, writer_partitions, False)

    def batch_upsert_tensor_with_parallelism(self, keys: List[str], tensors_list: List[Any], parallelisms: Any = None,
                                             config: Optional[ReplicateConfig] = None, writer_partitions: Any = None) -> List[int]:
        """:meth:`upsert_tensor_with_parallelism` for many keys."""
        return self._put_parallel(keys, tensors_list, parallelisms, config, writer_partitions, True)

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                         config: Optional[ReplicateConfig] = None, writer_partition: Any = None) -> int:
        """:meth:`put_tensor_with_parallelism` of the tensor a header + data buffer holds."""
        t = self._tensor_at(buffer_ptr, size)
        if t is None or self._client is None:
            return INVALID_PARAMS
        return self._put_parallel([key], [t], parallelism, config, writer_partition, False)[0]

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                            config: Optional[ReplicateConfig] = None, writer_partition: Any = None) -> int:
        """:meth:`upsert_tensor_with_parallelism` of the tensor a buffer holds."""
        t = self._tensor_at(buffer_ptr, size)
        if t is None or self._client is None:
            return INVALID_PARAMS
        return self._put_parallel([key], [t], parallelism, config, writer_partition, True)[0]

    def batch_put_tensor_with_parallelism_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                                               parallelisms: Any = None, config: Optional[ReplicateConfig] = None,
                                               writer_partitions: Any = None) -> List[int]:
        """:meth:`put_tensor_with_parallelism_from` for many keys."""
        return self._batch_parallel_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, False)

    def batch_upsert_tensor_with_parallelism_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                                                  parallelisms: Any = None, config: Optional[ReplicateConfig] = None,
                                                  writer_partitions: Any = None) -> List[int]:
        """:meth:`upsert_tensor_with_parallelism_from` for many keys."""
        return self._batch_parallel_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, True)

    def _batch_parallel_from(self, keys: List[str], ptrs: List[int], sizes: List[int], parallelisms: Any, config: Any,
                             writer_partitions: Any, upsert: bool) -> List[int]:
        n = len(keys)
        if self._client is None or len(ptrs) != n or len(sizes) != n:
            return [INVALID_PARAMS] * n
        tensors = [self._tensor_at(p, s) for p, s in zip(ptrs, sizes)]
        ok = [i for i, t in enumerate(tensors) if t is not None]
        out = [INVALID_PARAMS] * n
        pars = list(parallelisms) if isinstance(parallelisms, (list, tuple)) else [parallelisms] * n
        parts = list(writer_partitions) if isinstance(writer_partitions, (list, tuple)) else [writer_partitions] * n
        if len(pars) != n or len(parts) != n:
            return out
        for i in ok:
            out[i] = self._put_parallel([keys[i]], [tensors[i]], pars[i], config, parts[i], upsert)[0]
        return out

    def _read_parallel(self, key: str, target: Any) -> Any:
        """The tensor a :class:`ReadTarget` asks for, or None."""
        torch = _tensor.torch_module()
        mode = str(getattr(target, "mode", "as_stored") if target is not None else "as_stored").lower()
        par = getattr(target, "parallelism", None) if target is not None else None
        if mode == "as_stored":
            return self._get_tensor(key)
        if mode not in ("full", "shard"):
            return None
        if mode == "full" and par is None:
            return self._get_tensor(key)
        try:
            rank, size, split = self._tp_axis(par)
        except _tensor.BadTensor:
            return None
        whole = self._gather(key)
        if whole is None:
            if mode == "shard":
                return None
            return self._get_tensor(key)
        if mode == "full":
            return whole
        if not 0 <= split < whole.dim() or whole.shape[split] % size:
            return None
        return whole.split(whole.shape[split] // size, dim=split)[rank].contiguous()

    def _gather(self, key: str) -> Any:
        """The whole tensor put together from its stored TP shards, or None."""
        torch = _tensor.torch_module()
        c = self._client
        if c is None:
            return None
        try:
            first = c.get_buffer(self._tp_key(key, 0))
            meta = _tensor.parse(first, len(first))
        except (KvpoolError, _tensor.BadTensor):
            return None
        if meta.axis is None:
            return None
        _, size, split, _ = meta.axis
        shards = [_tensor.from_buffer(first, meta)]
        for r in range(1, size):
            try:
                b = c.get_buffer(self._tp_key(key, r))
                m = _tensor.parse(b, len(b))
            except (KvpoolError, _tensor.BadTensor):
                return None
            if m.axis is None or m.axis[1:3] != (size, split) or m.dtype != meta.dtype or m.full != meta.full:
                return None
            shards.append(_tensor.from_buffer(b, m))
        whole = torch.cat(shards, dim=split) if shards[0].dim() else shards[0]
        return whole if tuple(whole.shape) == tuple(meta.full) else None

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        """The tensor ``target`` asks for: ``as_stored`` (default) the object
        under ``key``; ``full`` the whole tensor put together from its
        ``{key}_tp_{r}`` shards (with ``target.parallelism`` naming a TP
        axis; the object under ``key`` if there are no shards); ``shard``
        the ``parallelism``'s rank cut from the whole tensor. None when it
        cannot be had."""
        try:
            return self._read_parallel(key, target)
        except _tensor.BadTensor:
            return None

    def batch_get_tensor_with_parallelism(self, keys: List[str], targets: Any = None) -> List[Any]:
        """:meth:`get_tensor_with_parallelism` for many keys (one target per key, or one for all)."""
        ts = list(targets) if isinstance(targets, (list, tuple)) else [targets] * len(keys)
        if len(ts) != len(keys):
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, ts)]

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int, target: Any = None) -> Any:
        """:meth:`get_tensor_with_parallelism` written into a buffer as
        header + data; a tensor viewing the data there, or None."""
        t = self.get_tensor_with_parallelism(key, target)
        if t is None:
            return None
        try:
            t = _tensor.contiguous(t)
            head = _tensor.header(t)
        except _tensor.BadTensor:
            return None
        data = _tensor.data_view(t)
        total = len(head) + len(data)
        if int(buffer_ptr) <= 0 or int(size) < total:
            return None
        ctypes.memmove(int(buffer_ptr), head, len(head))
        if len(data):
            ctypes.memmove(int(buffer_ptr) + len(head), (ctypes.c_ubyte * len(data)).from_buffer_copy(data), len(data))
        arr = (ctypes.c_ubyte * total).from_address(int(buffer_ptr))
        return _tensor.from_buffer(arr, _tensor.parse(arr, total))

    def batch_get_tensor_with_parallelism_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                                               targets: Any = None) -> List[Any]:
        """:meth:`get_tensor_with_parallelism_into` for many keys."""
        ts = list(targets) if isinstance(targets, (list, tuple)) else [targets] * len(keys)
        if not (len(keys) == len(buffer_ptrs) == len(sizes) == len(ts)):
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism_into(k, p, s, t) for k, p, s, t in zip(keys, buffer_ptrs, sizes, ts)]

    # ------------------------------------------------------------ safetensors

    def save_tensor_to_safetensor(self, key: str, file_name: Any = None) -> int:
        """Writes the tensor under ``key`` to a safetensors file
        (``file_name``, default the key) as tensor ``key``: 0, −704 if missing,
        −600 if it cannot be written."""
        t = self._get_tensor(key)
        if t is None:
            return OBJECT_NOT_FOUND if self._client is not None else INVALID_PARAMS
        path = str(file_name) if file_name else key
        try:
            blob = _tensor.safetensors_bytes(key, t)
            with open(path, "wb") as f:
                f.write(blob)
        except (OSError, _tensor.BadTensor) as e:
            logger.error("cannot save %r to %s: %s", key, path, e)
            return INVALID_PARAMS
        return OK

    def load_tensor_from_safetensor(self, key: Any = None, file_name: Optional[str] = None) -> Any:
        """Reads a tensor from safetensors file ``file_name`` (the one named
        ``key``, else the file's first, with a warning) and stores it under
        ``key`` (default: the file name); returns the tensor, or None."""
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor() missing required argument: 'file_name'")
        try:
            with open(file_name, "rb") as f:
                blob = f.read()
            name, t, found = _tensor.safetensors_load(blob, key)
        except (OSError, ValueError) as e:
            logger.error("cannot load %s: %s", file_name, e)
            return None
        if key is not None and not found:
            logger.warning("%s holds no tensor named %r; storing its first tensor %r", file_name, key, name)
        store_key = str(key) if key is not None else str(file_name)
        rc = self.upsert_tensor(store_key, t)
        return t if rc == OK else None
