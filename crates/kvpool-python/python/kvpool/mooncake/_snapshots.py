"""Mooncake 0.3.14's reusable ranged reads (``prepare_get_into_ranges_snapshot``,
``get_into_ranges_from_snapshot`` and the opaque :class:`RangedReadSnapshot`)
and ``begin_weight_snapshot``, the shim into Mooncake's pure-Python weight
store.

Mooncake's snapshot caches each key's replica descriptors and reads from
them until the read-lease midpoint, so it can return an upserted object's
old bytes, or a force-removed object's freed ones. kvpool's snapshot keeps
the keys and their read leases only; every read locates the objects again
(the client's location cache makes that one round trip, or none), so it
always reads what the key holds now."""

from __future__ import annotations

import importlib
import time
import weakref
from typing import Any, FrozenSet, List, Tuple

from ..errors import KvpoolError
from ._codes import INVALID_PARAMS, OBJECT_NOT_FOUND, logger

#: How often a snapshot in use renews its keys' read leases (seconds). The
#: Python client does not learn the master's lease length; this is the
#: midpoint of a 1 s lease, so leases of 1 s or more (the master's default
#: is 5 s, as Mooncake's) never lapse while the snapshot is read.
RENEW_S = 0.5

#: Mooncake's module ``begin_weight_snapshot`` hands over to.
WEIGHT_STORE_MODULE = "mooncake.reshard.weight.store"


class RangedReadSnapshot:
    """Reusable set of keys for repeated ranged reads (Mooncake 0.3.14), made
    by ``prepare_get_into_ranges_snapshot`` only; opaque."""

    __slots__ = ("_store", "_keys", "_leased_at", "__weakref__")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # As a pybind11 class without a bound constructor.
        raise TypeError(f"{type(self).__module__}.{type(self).__qualname__}: No constructor defined!")

    @classmethod
    def _new(cls, store: Any, keys: FrozenSet[str], leased_at: float) -> "RangedReadSnapshot":
        s = object.__new__(cls)
        s._store = weakref.ref(store)  # the snapshot does not keep its store alive
        s._keys = keys
        s._leased_at = leased_at
        return s

    def __repr__(self) -> str:
        return f"<RangedReadSnapshot: {len(self._keys)} keys>"


RangedReadSnapshot.__module__ = "kvpool.mooncake"


def _key_list(keys: Any) -> List[str]:
    """``keys`` as a list of str, else TypeError (Mooncake's ``list[str]``)."""
    if isinstance(keys, (str, bytes)) or keys is None:
        raise TypeError(f"keys must be a list of str, got {type(keys).__name__}")
    out = list(keys)
    if not all(isinstance(k, str) for k in out):
        raise TypeError("keys must be a list of str")
    return out


class _SnapshotsMixin:
    """Snapshot ranged reads and weight snapshots (state: see ``MooncakeDistributedStore.__init__``)."""

    def prepare_get_into_ranges_snapshot(self, keys: List[str]) -> RangedReadSnapshot:
        """A snapshot of ``keys`` for :meth:`get_into_ranges_from_snapshot`:
        takes each key's read lease, as ``is_exist`` does (so a ``remove``
        right after is −706); missing, repeated and empty keys are accepted
        (every read locates its keys again). RuntimeError before setup or after close."""
        asked = _key_list(keys)
        if self._client is None:
            raise RuntimeError("Client is not initialized")
        uniq = list(dict.fromkeys(asked))
        t0 = time.monotonic()
        found = self._exists(uniq, True)
        failed = [(k, rc) for k, rc in zip(uniq, found) if rc < 0 and k]
        if failed:
            # Reads locate their objects again, so a snapshot whose leases
            # could not all be taken still reads right; it retries them.
            logger.warning("prepare_get_into_ranges_snapshot: %d keys not leased (first: %r: %d)",
                           len(failed), *failed[0])
            t0 = 0.0
        return RangedReadSnapshot._new(self, frozenset(uniq), t0)

    def get_into_ranges_from_snapshot(
        self,
        snapshot: RangedReadSnapshot,
        buffer_ptrs: List[int],
        all_keys: List[List[str]],
        all_dst_offsets: List[List[List[int]]],
        all_src_offsets: List[List[List[int]]],
        all_sizes: List[List[List[int]]],
    ) -> List[List[List[int]]]:
        """:meth:`get_into_ranges` over the keys of ``snapshot`` (arguments
        and answers as there): a key not in the snapshot is −600 for each of
        its ranges and is not read; a missing one −704. Reads what each key
        holds now. Renews all the snapshot's read leases once the last
        renewal is :data:`RENEW_S` old, so a snapshot in use keeps its
        objects (Mooncake: at the lease's midpoint). A
        snapshot of another store (or None) raises ValueError; before setup
        or after close, RuntimeError."""
        c = self._client
        if c is None:
            raise RuntimeError("Client is not initialized")
        if not isinstance(snapshot, RangedReadSnapshot) or snapshot._store() is not self:
            raise ValueError("Ranged-read snapshot belongs to another Store")
        self._renew(snapshot)
        nb = len(buffer_ptrs)
        if not (len(all_keys) == nb == len(all_dst_offsets) == len(all_src_offsets) == len(all_sizes)):
            return self.get_into_ranges(buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes)
        # Keys outside the snapshot (−600) and the empty key (never stored:
        # −704, as Mooncake) go in with no ranges, so nothing is read for
        # them, and get their code per range afterwards; keys whose lists
        # disagree go in as they are, for get_into_ranges' own answer.
        fill: List[Tuple[int, int, int, int]] = []  # (buffer, key, ranges, code)
        keys_in = [list(ks) for ks in all_keys]
        dsts, srcs, lens = ([list(x) for x in lists] for lists in (all_dst_offsets, all_src_offsets, all_sizes))
        for i in range(nb):
            if not (len(keys_in[i]) == len(dsts[i]) == len(srcs[i]) == len(lens[i])):
                continue
            for j, key in enumerate(keys_in[i]):
                if (key and key in snapshot._keys) or not (len(dsts[i][j]) == len(srcs[i][j]) == len(lens[i][j])):
                    continue
                fill.append((i, j, len(dsts[i][j]), OBJECT_NOT_FOUND if key in snapshot._keys else INVALID_PARAMS))
                dsts[i][j], srcs[i][j], lens[i][j] = [], [], []
        out = self.get_into_ranges(buffer_ptrs, keys_in, dsts, srcs, lens)
        for i, j, n, code in fill:
            out[i][j] = [code] * n
        return out

    def _renew(self, snapshot: RangedReadSnapshot) -> None:
        """Takes the snapshot's read leases again once the last take is
        :data:`RENEW_S` old (Mooncake renews at the lease's midpoint)."""
        now = time.monotonic()
        if now - snapshot._leased_at < RENEW_S:
            return
        keys = [k for k in snapshot._keys if k]
        if not keys:
            return
        c = self._client
        try:
            c.batch_exists(keys, True)
        except KvpoolError as e:
            # The read that follows takes its own leases; retry next read.
            logger.debug("ranged-read snapshot: leases not renewed: %s", e)
            return
        snapshot._leased_at = now

    def begin_weight_snapshot(self, snapshot: Any, adapter: Any) -> Any:
        """Opens a model-weight snapshot writer on this store, as Mooncake
        0.3.14 does: ``mooncake.reshard.weight.store.begin_weight_snapshot(
        self, snapshot, adapter)`` from Mooncake's Python package. Raises
        ImportError when that module is not installed: kvpool has no weight
        store of its own."""
        try:
            weights = importlib.import_module(WEIGHT_STORE_MODULE)
        except ModuleNotFoundError as e:
            if not e.name or not (WEIGHT_STORE_MODULE + ".").startswith(e.name + "."):
                raise  # the module is there; something it imports is not
            raise ImportError(
                f"begin_weight_snapshot needs Mooncake's weight store ({WEIGHT_STORE_MODULE}, part of "
                f"Mooncake's Python package from 0.3.14 on): {e.name!r} is not installed, and kvpool has no "
                "weight store of its own",
                name=WEIGHT_STORE_MODULE,
            ) from e
        return weights.begin_weight_snapshot(self, snapshot, adapter)
