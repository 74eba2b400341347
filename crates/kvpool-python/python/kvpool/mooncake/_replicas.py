"""Replicas and tasks: replica descriptors, clearing replicas, and the
background copy and move tasks with their queries."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..config import _index
from ..errors import KvpoolError
from ..mooncake_types import (
    Descriptor,
    MemoryDescriptor,
    QueryTaskResponse,
    ReplicaDescriptor,
    ReplicaStatus,
    task_id_int,
    task_id_tuple,
)
from ._codes import INVALID_PARAMS, OK


class _ReplicasMixin:
    """Replica descriptors and tasks (state: see ``MooncakeDistributedStore.__init__``)."""

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
        """``(QueryTaskResponse, 0)``, or ``(None, code)`` (−1400 unknown task).
        ``task_id`` is the ``(high, low)`` pair the create calls return (any
        2-item sequence of unsigned 64-bit ints); anything else raises
        TypeError, as Mooncake's binding does."""
        try:
            hi, lo = task_id
        except (TypeError, ValueError):
            raise TypeError(f"query_task() task_id must be a (high, low) pair, got {task_id!r}") from None
        hi, lo = _index("query_task() task_id", hi), _index("query_task() task_id", lo)
        c = self._client
        if c is None:
            return None, INVALID_PARAMS
        try:
            return QueryTaskResponse(c.query_task(task_id_int((hi, lo)))), OK
        except KvpoolError as e:
            return None, e.code
