"""Drop-in for ``mooncake.store``: :class:`MooncakeDistributedStore` with every
method of Mooncake 0.3.13's class and of 0.3.14's (lease-free probes,
snapshot ranged reads, weight snapshots), and every public name of either
module (enums, descriptors, existence options, tensor-parallel requests,
host memory, buffer pools, the Engram store; see :mod:`kvpool.mooncake_types`).

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

# The facade is a package by concern; MooncakeDistributedStore below is
# assembled from one mixin per part of Mooncake's API:
#   _codes            return codes, the soft-pin limit, the logger
#   _setup            setup/init_all/setup_dummy, the client port, close, health
#   _helpers          config checks, codes from native calls, dedupe; assembly
#   _objects          copying puts and gets, queries, removal
#   _probes           lease-free existence probes (0.3.14)
#   _buffers          registered-buffer bookkeeping, the setup_dummy memory pool
#   _zero_copy        puts and gets by address, ranged reads
#   _snapshots        ranged reads from a snapshot, weight snapshots (0.3.14)
#   _sessions         put and get sessions
#   _replicas         replica descriptors, copy and move tasks
#   _segments         mounting and unmounting segments
#   _tensors          tensors in Mooncake's layout, safetensors
#   _tensor_parallel  tensor-parallel shards and layouts
# Every name the one-file module had (its imports included) stays importable
# from here, so dir(kvpool.mooncake) and `from kvpool.mooncake import X` are
# as before.

import ctypes
import logging
import os
import random
import socket
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import _native, _tensor
from ..client import _connect, _track_lender
from ..config import ReplicateConfig, SoftPinAction
from ..errors import KvpoolError
from ..mooncake_types import (
    BufferLease,
    BufferLeaseView,
    BufferPool,
    Descriptor,
    DiskDescriptor,
    EngramStore,
    EngramStoreConfig,
    ExistOptions,
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

from . import (
    _buffers,
    _helpers,
    _objects,
    _probes,
    _replicas,
    _segments,
    _sessions,
    _setup,
    _snapshots,
    _tensor_parallel,
    _tensors,
    _zero_copy,
)
from ._codes import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MAX_SOFT_PIN_MS,
    NO_AVAILABLE_HANDLE,
    NOT_SUPPORTED,
    OBJECT_ALREADY_EXISTS,
    OBJECT_NOT_FOUND,
    OK,
    TRANSFER_FAIL,
    logger,
)
from ._helpers import _Preferring
from ._objects import BufferHandle, _nbytes
from ._sessions import _PutSession
from ._snapshots import RangedReadSnapshot
from ._setup import CLIENT_PORTS, _SETUP_EXTRA, _SETUP_NAMES, _free_ports, _has_port, _port_range

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
    "DiskDescriptor", "EngramStore", "EngramStoreConfig", "ExistOptions", "FAILED", "GENERAL", "GRADIENT",
    "INITIALIZED", "KVCACHE", "METADATA", "MemoryDescriptor", "MooncakeDistributedNoFRegister",
    "MooncakeDistributedStore", "MooncakeHostMemAllocator", "OPTIMIZER_STATE", "ObjectDataType", "PENDING",
    "PROCESSING", "ParallelAxis", "QueryTaskResponse", "REMOVED", "REPLICA_COPY", "REPLICA_MOVE",
    "RangedReadSnapshot", "ReadTarget", "RegisteredBufferLease", "RegisteredBufferLeaseView",
    "RegisteredBufferPool", "ReplicaDescriptor", "ReplicaStatus", "ReplicateConfig", "SAMPLE", "SUCCESS",
    "SoftPinAction", "TENSOR", "TaskStatus", "TaskType", "TensorParallelism", "UNDEFINED", "UNKNOWN", "WEIGHT",
    "bind_to_numa_node", "get_alloc_func_addr", "get_free_func_addr",
]


class MooncakeDistributedStore(
    _setup._SetupMixin,
    _helpers._HelpersMixin,
    _objects._ObjectsMixin,
    _probes._ProbesMixin,
    _buffers._BuffersMixin,
    _zero_copy._ZeroCopyMixin,
    _snapshots._SnapshotsMixin,
    _sessions._SessionsMixin,
    _replicas._ReplicasMixin,
    _segments._SegmentsMixin,
    _tensors._TensorsMixin,
    _tensor_parallel._TensorParallelMixin,
):
    """Mooncake's store client API, served by kvpool. Call :meth:`setup`
    (or :meth:`setup_dummy`) first; every call before it answers −600."""

    def __init__(self) -> None:
        self._client: Optional[_native.Client] = None
        self._settings: Dict[str, Any] = {}
        self._hostname = ""
        self._registered: List[Tuple[int, int]] = []
        # A store dropped without close() forgets its registrations too.
        weakref.finalize(self, _buffers._forget, self._registered)
        self._lock = threading.Lock()
        self._put_sessions: Dict[str, _PutSession] = {}
        #: Keys in get sessions, with their values once kept (``_sessions``).
        self._get_sessions: Dict[str, Any] = {}
        self._prefer: List[str] = []
        self._node_segments: Tuple[float, List[str]] = (float("-inf"), [])
        self._pool: Tuple[int, int, int] = (0, 0, 0)  # address, size, used


_helpers._adopt(MooncakeDistributedStore)
