"""The public types of ``mooncake.store`` besides the store class: enums and
their module-level members, replica and task descriptors, the options of
existence queries (Mooncake 0.3.14), tensor-parallel request types, host
memory, buffer pools, the Engram embedding store, and the names kvpool
cannot give a meaning (which raise :class:`kvpool.errors.NotSupported`).

Enum members compare equal to Mooncake's integers and print as Mooncake's do
(``TaskStatus.SUCCESS``)."""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional, Tuple

from . import _native
from .config import ObjectDataType, SoftPinAction, _Enum, _flag
from .errors import InvalidArgument, NotSupported

__all__ = [
    "ObjectDataType",
    "ReplicaStatus",
    "TaskStatus",
    "TaskType",
    "SoftPinAction",
    "Descriptor",
    "DiskDescriptor",
    "MemoryDescriptor",
    "ReplicaDescriptor",
    "QueryTaskResponse",
    "ExistOptions",
    "ParallelAxis",
    "TensorParallelism",
    "ReadTarget",
    "MooncakeHostMemAllocator",
    "get_alloc_func_addr",
    "get_free_func_addr",
    "bind_to_numa_node",
    "MooncakeDistributedNoFRegister",
    "BufferLease",
    "BufferLeaseView",
    "BufferPool",
    "RegisteredBufferLease",
    "RegisteredBufferLeaseView",
    "RegisteredBufferPool",
    "EngramStoreConfig",
    "EngramStore",
    "task_id_tuple",
    "task_id_int",
    "segment_id_text",
    "segment_id_hex",
]


class ReplicaStatus(_Enum):
    """State of one replica; kvpool shows only committed replicas (``COMPLETE``)."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class TaskStatus(_Enum):
    """State of a replica copy or move task (Mooncake's numbers: FAILED=2, SUCCESS=3)."""

    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class TaskType(_Enum):
    """What a replica task does."""

    REPLICA_COPY = 0
    REPLICA_MOVE = 1


# ---------------------------------------------------------------- ids


def task_id_tuple(v: int) -> Tuple[int, int]:
    """A 128-bit task id as Mooncake's ``(high, low)`` pair of 64-bit ints."""
    return (v >> 64) & (2**64 - 1), v & (2**64 - 1)


def task_id_int(t: Any) -> int:
    """Mooncake's ``(high, low)`` task id (or an int) as one 128-bit int."""
    if isinstance(t, int):
        return t
    hi, lo = t
    return (int(hi) << 64) | int(lo)


def segment_id_text(hex_id: str) -> str:
    """A segment id as Mooncake writes ids: ``"high-low"`` in decimal."""
    hi, lo = task_id_tuple(int(hex_id, 16))
    return f"{hi}-{lo}"


def segment_id_hex(text: str) -> Optional[str]:
    """A segment id in Mooncake's ``"high-low"`` form (or kvpool's hex) as hex; None if neither."""
    t = str(text).strip()
    if "-" in t:
        hi, _, lo = t.partition("-")
        if hi.isdigit() and lo.isdigit():
            return f"{(int(hi) << 64) | int(lo):032x}"
        return None
    try:
        return f"{int(t, 16):032x}"
    except ValueError:
        return None


# ---------------------------------------------------------------- replica and task descriptors


class Descriptor:
    """Where a replica's bytes are: ``transport_endpoint`` is the name of
    the segment holding it (what copies and moves name), ``buffer_address``
    the value's offset in that segment (kvpool's segments are files or
    memory of other processes; it is no address in this process), ``size``
    the value's bytes."""

    def __init__(self, buffer_address: int = 0, size: int = 0, transport_endpoint: str = "") -> None:
        self.buffer_address = buffer_address
        self.size = size
        self.transport_endpoint = transport_endpoint

    def __repr__(self) -> str:
        return f"Descriptor(transport_endpoint={self.transport_endpoint!r}, buffer_address={self.buffer_address}, size={self.size})"


class MemoryDescriptor:
    """A replica in memory: its :class:`Descriptor`."""

    def __init__(self, buffer_descriptor: Optional[Descriptor] = None) -> None:
        self.buffer_descriptor = buffer_descriptor or Descriptor()


class DiskDescriptor:
    """A replica on disk (kvpool has no disk replicas; kept for the type)."""

    def __init__(self, file_path: str = "", object_size: int = 0) -> None:
        self.file_path = file_path
        self.object_size = object_size


class ReplicaDescriptor:
    """One replica of an object (``get_replica_desc``); always a committed
    memory replica in kvpool."""

    def __init__(self, memory: MemoryDescriptor, status: ReplicaStatus = ReplicaStatus.COMPLETE) -> None:
        self._memory = memory
        self.status = status

    def is_memory_replica(self) -> bool:
        """True: kvpool's replicas live in segment memory."""
        return True

    def is_disk_replica(self) -> bool:
        """False: kvpool has no disk replicas."""
        return False

    def is_local_disk_replica(self) -> bool:
        """False: kvpool has no local-disk replicas."""
        return False

    def get_memory_descriptor(self) -> MemoryDescriptor:
        """Where the replica's bytes are."""
        return self._memory

    def get_disk_descriptor(self) -> DiskDescriptor:
        """Raises :class:`NotSupported`: kvpool has no disk replicas."""
        raise NotSupported("kvpool has no disk replicas; this is a memory replica")

    def __repr__(self) -> str:
        return f"ReplicaDescriptor({self._memory.buffer_descriptor!r}, status={self.status})"


class QueryTaskResponse:
    """A replica task as ``query_task`` reports it."""

    def __init__(self, d: Optional[Dict[str, Any]] = None) -> None:
        d = d or {}
        self.id: Tuple[int, int] = task_id_tuple(int(d.get("id", 0)))
        self.type = TaskType(int(d.get("kind", 0)))
        self.status = TaskStatus(int(d.get("status", 0)))
        self.created_at_ms_epoch: int = int(d.get("created_ms", 0))
        self.last_updated_at_ms_epoch: int = int(d.get("updated_ms", 0))
        self.assigned_client: Tuple[int, int] = task_id_tuple(int(d.get("assigned_client", 0)))
        self.message: str = str(d.get("message", ""))

    def __repr__(self) -> str:
        return (
            f"QueryTaskResponse(id={self.id[0]}-{self.id[1]}, type={int(self.type)}, status={int(self.status)}, "
            f"created_at={self.created_at_ms_epoch}, last_updated_at={self.last_updated_at_ms_epoch}, "
            f"assigned_client={self.assigned_client[0]}-{self.assigned_client[1]}, message={self.message!r})"
        )


# ---------------------------------------------------------------- existence options


class ExistOptions:
    """Options of ``is_exist``/``batch_is_exist`` (Mooncake 0.3.14):
    ``prefetch_to_memory`` asks Mooncake to promote SSD-only objects to
    memory. kvpool accepts it and does nothing with it: it has no client
    SSD tier, and a store's disk tier promotes what is read by itself."""

    __slots__ = ("_prefetch_to_memory",)

    def __init__(self, prefetch_to_memory: bool = False) -> None:
        self.prefetch_to_memory = prefetch_to_memory

    @property
    def prefetch_to_memory(self) -> bool:
        """Promote SSD-only objects to memory (default False; no effect in kvpool)."""
        return self._prefetch_to_memory

    @prefetch_to_memory.setter
    def prefetch_to_memory(self, v: bool) -> None:
        self._prefetch_to_memory = _flag("prefetch_to_memory", v)

    def __str__(self) -> str:
        return f"ExistOptions: {{ prefetch_to_memory: {int(self.prefetch_to_memory)} }}"


# ---------------------------------------------------------------- tensor-parallel requests


class ParallelAxis:
    """One axis of a tensor's parallel layout. kvpool stores tensor-parallel
    shards (``kind = "tp"``: ``rank`` of ``size``, split along
    ``split_dim``); other kinds are refused with −600, as Mooncake refuses
    unknown ones."""

    def __init__(self, kind: str = "", rank: int = 0, size: int = 1, split_dim: Optional[int] = None,
                 expert_id: Optional[int] = None, stage_id: Optional[int] = None) -> None:
        self.kind = kind
        self.rank = rank
        self.size = size
        self.split_dim = split_dim
        self.expert_id = expert_id
        self.stage_id = stage_id

    def __repr__(self) -> str:
        return f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}, split_dim={self.split_dim})"


class TensorParallelism:
    """A tensor's parallel layout: a list of :class:`ParallelAxis`."""

    def __init__(self, axes: Optional[List[ParallelAxis]] = None) -> None:
        self.axes: List[ParallelAxis] = list(axes or [])


_READ_MODES = ("as_stored", "full", "shard")


class ReadTarget:
    """What a parallel read returns: ``mode`` ``"as_stored"`` (the object
    under the key as written), ``"full"`` (the whole tensor put together from
    its shards) or ``"shard"`` (one shard of ``parallelism``'s layout, cut
    from the whole tensor)."""

    def __init__(self, mode: str = "as_stored", parallelism: Optional[TensorParallelism] = None) -> None:
        # Mooncake's constructor takes no arguments (TypeError for any);
        # kvpool's takes these two, and a mode it cannot take is a TypeError too.
        try:
            self.mode = mode
        except RuntimeError as e:
            raise TypeError(str(e)) from None
        self.parallelism = parallelism

    @property
    def mode(self) -> str:
        """``"as_stored"``, ``"full"`` or ``"shard"``."""
        return self._mode

    @mode.setter
    def mode(self, v: str) -> None:
        # As Mooncake's setter: a str, any case, one of the three modes;
        # another type is a TypeError, another str a RuntimeError.
        if not isinstance(v, str):
            raise TypeError(f"ReadTarget.mode must be a str, got {type(v).__name__} {v!r}")
        m = v.lower()
        if m not in _READ_MODES:
            raise RuntimeError(f"Unsupported ReadTarget mode {v!r} (use 'as_stored', 'full' or 'shard')")
        self._mode = m


# ---------------------------------------------------------------- host memory


class MooncakeHostMemAllocator:
    """Host memory by address (SGLang's host KV pool in standalone-storage
    mode): zeroed, page-aligned blocks; ``alloc(size)`` gives the address
    (0 if the memory cannot be had), ``free(ptr)`` gives 0, or −1 for an
    address it did not hand out."""

    def alloc(self, size: int) -> int:
        """A zeroed block of ``size`` bytes; its address, or 0."""
        if int(size) < 0:
            return 0
        return _native.host_alloc(int(size))

    def free(self, ptr: int) -> int:
        """Frees a block this allocator handed out: 0, or −1."""
        return _native.host_free(int(ptr))


def get_alloc_func_addr() -> int:
    """Address of the C function ``void* alloc(size_t size, int device,
    void* stream)`` over the same host memory (PyTorch's pluggable
    allocator signature)."""
    return _native.host_alloc_functions()[0]


def get_free_func_addr() -> int:
    """Address of the C function ``void free(void* ptr, size_t size, int
    device, void* stream)`` matching :func:`get_alloc_func_addr`."""
    return _native.host_alloc_functions()[1]


_NUMA_ROOT = "/sys/devices/system/node"


def _parse_cpulist(text: str) -> List[int]:
    cpus: List[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def bind_to_numa_node(node: int) -> None:
    """Binds the calling thread to the CPUs of NUMA node ``node`` and
    prefers that node's memory for its allocations. Raises
    :class:`NotSupported` where the machine reports no such node (Mooncake
    returns silently there)."""
    node = int(node)
    path = os.path.join(_NUMA_ROOT, f"node{node}")
    if node < 0 or not os.path.isdir(path):
        have = sorted(n for n in os.listdir(_NUMA_ROOT) if n.startswith("node")) if os.path.isdir(_NUMA_ROOT) else []
        raise NotSupported(f"NUMA node {node} does not exist on this machine (nodes: {have or 'none reported'})")
    with open(os.path.join(path, "cpulist")) as f:
        cpus = _parse_cpulist(f.read())
    if not cpus:
        raise NotSupported(f"NUMA node {node} has no CPUs to run on")
    os.sched_setaffinity(0, cpus)
    _prefer_numa_memory(node)


def _prefer_numa_memory(node: int) -> None:
    """``set_mempolicy(MPOL_PREFERRED, {node})`` for the calling thread."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    nodemask = ctypes.c_ulong(1 << node)
    mpol_preferred = 1
    sys_set_mempolicy = 238  # x86_64
    if os.uname().machine != "x86_64":
        return  # affinity alone; the policy syscall number differs elsewhere
    if libc.syscall(sys_set_mempolicy, mpol_preferred, ctypes.byref(nodemask), ctypes.c_ulong(64)) != 0:
        err = ctypes.get_errno()
        raise NotSupported(f"set_mempolicy for NUMA node {node} failed: {os.strerror(err)}")


class MooncakeDistributedNoFRegister:
    """Mooncake's NVMe-over-Fabrics segment registration. kvpool has no
    NVMe-oF tier: both methods raise :class:`NotSupported`."""

    def real_register(self, *args: Any) -> int:
        """Raises :class:`NotSupported` (no NVMe-oF tier)."""
        raise NotSupported("kvpool has no NVMe-over-Fabrics tier; NoF segments cannot be registered")

    def real_unregister_by_endpoint(self, *args: Any) -> int:
        """Raises :class:`NotSupported` (no NVMe-oF tier)."""
        raise NotSupported("kvpool has no NVMe-over-Fabrics tier; NoF segments cannot be unregistered")


# ---------------------------------------------------------------- buffer pools


class BufferLeaseView:
    """A lease's memory as a writable buffer-protocol object."""

    def __init__(self, lease: "BufferLease") -> None:
        self._lease = lease

    @property
    def buffer(self) -> memoryview:
        """The leased bytes."""
        return self._lease.buffer


class BufferLease:
    """``size`` bytes at ``ptr`` from a :class:`BufferPool` until
    :meth:`release` (or garbage collection) gives them back."""

    def __init__(self, pool: "BufferPool", block: int, cls_size: int, size: int) -> None:
        self._pool: Optional[BufferPool] = pool
        self._block = block
        self._cls = cls_size
        self.ptr = block
        self.size = size
        import ctypes

        self._array = (ctypes.c_ubyte * size).from_address(block) if size else None

    @property
    def buffer(self) -> memoryview:
        """The leased bytes as a writable ``memoryview`` (format ``B``)."""
        if self._pool is None:
            raise InvalidArgument("this lease was released")
        return memoryview(self._array).cast("B") if self._array is not None else memoryview(b"")

    def release(self) -> None:
        """Gives the memory back to the pool (once)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._give(self._block, self._cls)
            self._array = None
            self.ptr, self.size = 0, 0

    def __enter__(self) -> "BufferLease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


class RegisteredBufferLease(BufferLease):
    """A lease from a :class:`RegisteredBufferPool` (its memory is registered)."""


class RegisteredBufferLeaseView(BufferLeaseView):
    """A registered lease's memory as a buffer."""


class BufferPool:
    """Reusable host buffers for zero-copy calls, in power-of-two size
    classes from ``min_size_class`` up (``max_size_class`` caps a class;
    larger requests get an exact block). ``max_bytes`` (0: no limit) caps
    the memory held; when it is reached, ``acquire`` waits for a release
    (``block_on_exhaustion``, up to ``timeout`` seconds) or raises
    :class:`kvpool.errors.NoSpace`."""

    _lease_type = BufferLease

    def __init__(self, store: Any, max_bytes: int = 0, min_size_class: int = 65536, max_size_class: Optional[int] = None,
                 alignment: int = 8 << 20, block_on_exhaustion: bool = True, default_timeout: Optional[float] = None,
                 max_regions: Optional[int] = None, prewarm_size: Optional[int] = None, prewarm_count: int = 0) -> None:
        if min_size_class <= 0 or (max_bytes and max_bytes < 0):
            raise InvalidArgument("sizes must be positive")
        self._store = store
        self._max_bytes = int(max_bytes)
        self._min = int(min_size_class)
        self._max_class = int(max_size_class) if max_size_class else None
        self._block = bool(block_on_exhaustion)
        self._timeout = default_timeout
        self._max_regions = max_regions
        self._free: Dict[int, List[int]] = {}
        self._held = 0
        self._regions = 0
        self._blocks: List[int] = []
        self._cv = threading.Condition()
        self._closed = False
        if prewarm_size and prewarm_count:
            self.prewarm(int(prewarm_size), int(prewarm_count))

    def _class_of(self, size: int) -> int:
        c = self._min
        while c < size:
            c <<= 1
        if self._max_class is not None and c > self._max_class:
            return size
        return c

    def _new_block(self, cls_size: int) -> int:
        ptr = _native.host_alloc(cls_size)
        if not ptr:
            raise MemoryError(f"cannot allocate {cls_size} bytes of host memory")
        self._blocks.append(ptr)
        self._regions += 1
        self._on_new_block(ptr, cls_size)
        return ptr

    def _on_new_block(self, ptr: int, size: int) -> None:
        """Hook for pools that register their memory."""

    def prewarm(self, size: int, count: int) -> None:
        """Allocates ``count`` buffers of ``size``'s class up front."""
        cls_size = self._class_of(int(size))
        with self._cv:
            for _ in range(int(count)):
                if self._max_bytes and self._held + cls_size > self._max_bytes:
                    break
                self._free.setdefault(cls_size, []).append(self._new_block(cls_size))
                self._held += cls_size

    def acquire(self, size: int, block: Optional[bool] = None, timeout: Optional[float] = None) -> BufferLease:
        """A lease of ``size`` bytes (see the class docs for waiting)."""
        size = int(size)
        if size <= 0:
            raise InvalidArgument(f"size must be positive, got {size}")
        cls_size = self._class_of(size)
        block = self._block if block is None else bool(block)
        timeout = self._timeout if timeout is None else timeout
        with self._cv:
            while True:
                if self._closed:
                    raise InvalidArgument("the pool is closed")
                free = self._free.get(cls_size)
                if free:
                    ptr = free.pop()
                    break
                room = not self._max_bytes or self._held + cls_size <= self._max_bytes
                regions_ok = self._max_regions is None or self._regions < int(self._max_regions)
                if room and regions_ok:
                    ptr = self._new_block(cls_size)
                    self._held += cls_size
                    break
                if not block or not self._cv.wait(timeout=timeout):
                    from .errors import NoSpace

                    raise NoSpace(f"buffer pool exhausted ({self._held} of {self._max_bytes} bytes held)")
        return self._lease_type(self, ptr, cls_size, size)

    buffer = acquire

    def _give(self, ptr: int, cls_size: int) -> None:
        with self._cv:
            if self._closed:
                return
            self._free.setdefault(cls_size, []).append(ptr)
            self._cv.notify()

    def close(self) -> None:
        """Frees the pool's memory; leases still out must not be used after."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            blocks, self._blocks = self._blocks, []
            self._free.clear()
            self._cv.notify_all()
        for ptr in blocks:
            self._on_free_block(ptr)
            _native.host_free(ptr)

    def _on_free_block(self, ptr: int) -> None:
        """Hook for pools that register their memory."""


class RegisteredBufferPool(BufferPool):
    """A :class:`BufferPool` whose memory is registered with its store
    (``register_buffer``), so ranged reads may target it."""

    _lease_type = RegisteredBufferLease

    def _on_new_block(self, ptr: int, size: int) -> None:
        rc = self._store.register_buffer(ptr, size)
        if rc != 0:
            raise InvalidArgument(f"cannot register the pool's buffer: {rc}", rc)

    def _on_free_block(self, ptr: int) -> None:
        try:
            self._store.unregister_buffer(ptr)
        except Exception:
            pass


# ---------------------------------------------------------------- Engram


class EngramStoreConfig:
    """Shape of an Engram embedding store: ``embedding_dim`` and one table
    per head with ``table_vocab_sizes[h]`` rows."""

    def __init__(self) -> None:
        self.embedding_dim: int = 64
        self.table_vocab_sizes: List[int] = [1024]


class EngramStore:
    """Embedding tables of one layer in the store (Mooncake's Engram): table
    ``h`` is a float32 ``[vocab, dim]`` object under ``engram:l{layer}:h{h}``;
    :meth:`lookup` reads rows for a ``[B, L, H]`` array of row ids into a
    ``[B, L, H, dim]`` float32 array, one ranged read per row."""

    def __init__(self, layer_id: int, config: EngramStoreConfig, store: Any = None) -> None:
        self._layer = int(layer_id)
        self._dim = int(config.embedding_dim)
        self._vocab = [int(v) for v in config.table_vocab_sizes]
        if self._dim <= 0 or not self._vocab or any(v <= 0 for v in self._vocab):
            raise InvalidArgument("embedding_dim and every table size must be positive")
        self._store = store

    def get_embedding_dim(self) -> int:
        """Floats per row."""
        return self._dim

    def get_num_heads(self) -> int:
        """Tables (one per head)."""
        return len(self._vocab)

    def get_table_vocab_sizes(self) -> List[int]:
        """Rows per table."""
        return list(self._vocab)

    def get_store_keys(self) -> List[str]:
        """The keys the tables live under."""
        return [f"engram:l{self._layer}:h{h}" for h in range(len(self._vocab))]

    def _need_store(self) -> Any:
        if self._store is None:
            raise InvalidArgument("this EngramStore has no store")
        return self._store

    def populate(self, embedding_buffers: List[Any]) -> None:
        """Stores the tables (one float32 array of ``[vocab, dim]`` per head)."""
        import numpy as np

        store = self._need_store()
        if len(embedding_buffers) != len(self._vocab):
            raise InvalidArgument(f"{len(self._vocab)} tables expected, got {len(embedding_buffers)}")
        for key, table, vocab in zip(self.get_store_keys(), embedding_buffers, self._vocab):
            a = np.ascontiguousarray(np.asarray(table, dtype=np.float32))
            if a.size != vocab * self._dim:
                raise InvalidArgument(f"{key}: expected {vocab}x{self._dim} floats, got {a.size}")
            rc = store.upsert_from(key, a.ctypes.data, a.nbytes)
            if rc != 0:
                raise RuntimeError(f"populate failed: {key}: {rc}")

    def lookup(self, row_ids: Any) -> Any:
        """Rows for ``row_ids`` (``[B, L, H]`` ints, ``H`` = heads): a float32 ``[B, L, H, dim]`` array."""
        import numpy as np

        store = self._need_store()
        ids = np.asarray(row_ids)
        if ids.ndim != 3 or ids.shape[2] != len(self._vocab):
            raise RuntimeError(f"row_ids array must have shape [B, L, H] with H = {len(self._vocab)}")
        out = np.zeros(ids.shape + (self._dim,), dtype=np.float32)
        row = self._dim * 4
        keys = self.get_store_keys()
        per_key: List[List[Tuple[int, int, int]]] = [[] for _ in keys]
        base = out.ctypes.data
        flat = ids.reshape(-1, len(keys))
        for i, r in enumerate(flat):
            for h, rid in enumerate(r):
                rid = int(rid)
                if rid < 0 or rid >= self._vocab[h]:
                    raise RuntimeError(f"row id {rid} out of range for table {h} ({self._vocab[h]} rows)")
                per_key[h].append((base + (i * len(keys) + h) * row, rid * row, row))
        client = store._native_client()
        res = client.read_ranges(keys, per_key)
        bad = [c for rs in res for c in rs if c < 0]
        if bad:
            raise RuntimeError(f"lookup failed: {bad[0]}")
        return out

    def remove_from_store(self, force: bool = False) -> int:
        """Removes the tables; returns how many were removed."""
        store = self._need_store()
        return sum(1 for rc in store.batch_remove(self.get_store_keys(), force) if rc == 0)
