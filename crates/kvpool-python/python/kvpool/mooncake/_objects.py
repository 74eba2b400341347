"""Whole objects through the local buffer: the copying puts and gets
(``put``, ``put_parts``, ``put_batch``, ``get``, ``get_batch``,
``get_buffer``, their upsert and batch forms), existence and size queries,
and removal."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from .. import _native
from ..config import ReplicateConfig
from ..errors import KvpoolError
from ..mooncake_types import ExistOptions
from ._codes import INVALID_PARAMS, OBJECT_NOT_FOUND, OK

BufferHandle = _native.Buffer
"""What ``get_buffer`` returns: buffer protocol, ``ptr()``, ``size()``."""


def _exist_options(options: Any) -> None:
    """Checks ``options`` of an existence call: None or an ExistOptions
    (kvpool's or Mooncake's), else TypeError as Mooncake's binding raises."""
    if options is not None and not hasattr(options, "prefetch_to_memory"):
        raise TypeError(f"options must be an ExistOptions, got {type(options).__name__}")


def _nbytes(value: Any) -> int:
    """Length in bytes of a buffer-protocol value."""
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    return memoryview(value).nbytes


class _ObjectsMixin:
    """Copying puts and gets, queries, removal (state: see ``MooncakeDistributedStore.__init__``)."""

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
            return c.get_buffer(key)._signed()
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
            return [None if isinstance(v, int) else v._signed() for v in c.batch_get_buffer(list(keys))]
        except KvpoolError:
            return [None] * len(keys)

    # ------------------------------------------------------------ queries and removal

    def is_exist(self, key: str, options: Optional[ExistOptions] = None) -> int:
        """1 if ``key`` exists, 0 if not, negative on error. Takes a read
        lease, as Mooncake does: a ``remove`` right after is refused (−706).
        ``options`` (Mooncake 0.3.14's :class:`ExistOptions`) is accepted and
        has no effect: kvpool has no client SSD tier to prefetch from."""
        _exist_options(options)
        if not key:
            return 0 if self._client is not None else INVALID_PARAMS
        return self._int(lambda c: 1 if c.exists(key, True) else 0)

    def batch_is_exist(self, keys: List[str], options: Optional[ExistOptions] = None) -> List[int]:
        """Per key: 1, 0, or a negative code (leases and ``options`` as for :meth:`is_exist`)."""
        _exist_options(options)
        return self._exists(keys, True)

    def _exists(self, keys: Sequence[str], lease: bool) -> List[int]:
        """Per key 1, 0 or a negative code, an empty key being 0 (a miss, as
        Mooncake answers); ``lease`` takes read leases on the keys found."""
        if self._client is not None and any(not k for k in keys):
            ask = [k for k in keys if k]
            got = dict(zip(ask, self._ints(len(ask), lambda c: c.batch_exists(ask, lease)))) if ask else {}
            return [got.get(k, 0) if k else 0 for k in keys]
        return self._ints(len(keys), lambda c: c.batch_exists(list(keys), lease))

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
            self._get_sessions.pop(key, None)
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
