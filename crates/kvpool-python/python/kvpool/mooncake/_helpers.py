"""What the calls of :class:`~kvpool.mooncake.MooncakeDistributedStore`
share: the check of a write's ReplicateConfig (soft pin, same-node
placement, group ids and the other per-key hints, preferred segments),
Mooncake's codes from native calls and errors, which client a copying call
uses, and the dedupe of batches that name a key twice; and how the class is
assembled from its mixins."""

from __future__ import annotations

import time
import types
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import _native
from ..config import ReplicateConfig, SoftPinAction
from ..errors import KvpoolError
from ._codes import INVALID_PARAMS, MAX_SOFT_PIN_MS, NOT_SUPPORTED, OK

#: How long the segments lent from this host are taken as known (seconds).
NODE_SEGMENTS_S = 5.0



class _Preferring:
    """A config with preferred segments filled in where it names none (an
    engine attached to a storage process puts into that process's segments)."""

    def __init__(self, base: Any, names: List[str]) -> None:
        self._base = base if base is not None else ReplicateConfig()
        self.preferred_segments = list(names)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


class _HelpersMixin:
    """Config checks, codes, dedupe (state: see ``MooncakeDistributedStore.__init__``)."""

    # ------------------------------------------------------------ helpers

    def _lends(self) -> bool:
        c = self._client
        return c is not None and (c.lent_bytes > 0 or bool(c.lent_segments()))

    def _config(self, config: Any, keys: Optional[int] = None, same_node: bool = False) -> Tuple[Optional[int], Any]:
        """Checks the ReplicateConfig of a write as Mooncake does: of one
        key (``keys`` None: ``put``, ``put_from``, ...) or a batch of
        ``keys`` keys. A soft-pin TTL needs ``soft_pin_action=ENABLE`` (or
        kvpool's ``with_soft_pin``) and at most a day;
        ``prefer_alloc_in_same_node`` needs lent memory, except on a
        ``same_node`` write (``batch_put_from_multi_buffers``: one replica,
        placed on a segment of this host); ``group_ids``,
        ``session_ids`` and ``residency_affinity_ids`` (placement hints not
        used here) name one entry per key, and so does
        ``per_key_preferred_hca_names`` in a batch (a one-key write does not
        check it, as Mooncake 0.3.14 does not); NVMe-oF and DFS replicas do
        not exist here. Returns (code or None, the config to use)."""
        if config is None:
            return None, (_Preferring(None, self._prefer) if self._prefer else None)
        n = 1 if keys is None else keys
        ttl = getattr(config, "soft_pin_ttl_ms", None)
        if ttl is not None:
            action = int(getattr(config, "soft_pin_action", SoftPinAction.PRESERVE) or 0)
            pinned = action == SoftPinAction.ENABLE or (
                action == SoftPinAction.PRESERVE and bool(getattr(config, "with_soft_pin", False))
            )
            if not pinned or int(ttl) > MAX_SOFT_PIN_MS:
                return INVALID_PARAMS, None
        near = bool(getattr(config, "prefer_alloc_in_same_node", False))
        if near and same_node:
            # Mooncake takes it on batch_put_from_multi_buffers, for one replica.
            if int(getattr(config, "replica_num", 1) or 1) != 1:
                return INVALID_PARAMS, None
        elif near and not self._lends():
            return INVALID_PARAMS, None
        groups = getattr(config, "group_ids", None)
        if groups and len(groups) != n:
            return INVALID_PARAMS, None
        # Mooncake 0.3.14's per-key hints: set (even to []) means one per key.
        per_key = ["session_ids", "residency_affinity_ids"]
        if keys is not None:
            per_key.append("per_key_preferred_hca_names")
        if any(getattr(config, f, None) is not None and len(getattr(config, f)) != n for f in per_key):
            return INVALID_PARAMS, None
        if int(getattr(config, "nof_replica_num", 0) or 0) > 0 or int(getattr(config, "dfs_replica_num", 0) or 0) > 0:
            return NOT_SUPPORTED, None
        named = list(getattr(config, "preferred_segments", []) or []) or getattr(config, "preferred_segment", "")
        if self._prefer and not named:
            return None, _Preferring(config, self._prefer)
        if near and same_node and not named and not self._lends():
            return None, _Preferring(config, self._same_node())
        return None, config

    def _same_node(self) -> List[str]:
        """Segments lent from this client's host (Mooncake's "same node"),
        looked up at most every :data:`NODE_SEGMENTS_S` seconds."""
        c = self._client
        at, names = self._node_segments
        now = time.monotonic()
        if c is None or now - at < NODE_SEGMENTS_S:
            return names
        host = self._hostname.rpartition(":")[0] or self._hostname
        try:
            segments = c.status()["segments"]
        except KvpoolError:
            return names
        names = [s["name"] for s in segments if str(s["endpoint"]).rpartition(":")[0] == host]
        self._node_segments = (now, names)
        return names

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


def _adopt(cls: type) -> None:
    """Names the methods ``cls`` takes from its mixins as its own
    (``__qualname__`` ``MooncakeDistributedStore.put``, ``__module__``
    ``kvpool.mooncake``), as when they were defined in one class body: Python's
    argument errors (``MooncakeDistributedStore.put() missing 2 required
    positional arguments``), reprs and pickling by name read as before."""
    for base in cls.__mro__[1:-1]:
        for name, attr in vars(base).items():
            fn = getattr(attr, "__func__", attr)
            if isinstance(fn, types.FunctionType):
                fn.__qualname__ = f"{cls.__qualname__}.{name}"
                fn.__module__ = cls.__module__
