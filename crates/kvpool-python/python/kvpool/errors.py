"""Exceptions raised by :class:`kvpool.Client`, and the one table that maps
kvpool's error codes (Mooncake's numbers) to them.

Every exception is a :class:`KvpoolError` with a ``.code`` (the negative
Mooncake-compatible code) and ``.name`` (e.g. ``"OBJECT_NOT_FOUND"``). Where a
built-in exception means the same thing, the class also derives from it, so
``except LookupError`` or ``except TimeoutError`` work as expected.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Type

from . import _native

# Numbers by Mooncake name, from the native module (the one table of codes).
_C: Dict[str, int] = _native.CODES

__all__ = [
    "KvpoolError",
    "NotFound",
    "AlreadyExists",
    "NoSpace",
    "LeaseHeld",
    "LeaseExpired",
    "NotReady",
    "InvalidArgument",
    "NotSupported",
    "Timeout",
    "Unavailable",
    "Corrupted",
    "BatchError",
    "error_for",
]


class KvpoolError(Exception):
    """Base class of every kvpool failure; ``.code`` is Mooncake's negative code."""

    code: int = -1

    def __init__(self, message: str = "", code: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    @property
    def name(self) -> str:
        """Mooncake's name for ``.code``, e.g. ``"OBJECT_NOT_FOUND"``."""
        return _native.code_name(self.code)

    def __str__(self) -> str:
        return f"{self.message} [{self.name} {self.code}]" if self.message else f"{self.name} ({self.code})"

    def __reduce__(self) -> Any:
        return (type(self), (self.message, self.code))


class NotFound(KvpoolError, LookupError):
    """The key does not exist (never written, removed, or evicted)."""

    code = _C["OBJECT_NOT_FOUND"]


class AlreadyExists(KvpoolError):
    """The object already exists."""

    code = _C["OBJECT_ALREADY_EXISTS"]


class NoSpace(KvpoolError):
    """No room in the pool even after eviction (``NO_AVAILABLE_HANDLE``)."""

    code = _C["NO_AVAILABLE_HANDLE"]


class LeaseHeld(KvpoolError):
    """Remove refused: a reader holds a lease on the object; retry or use ``force``."""

    code = _C["OBJECT_HAS_LEASE"]


class LeaseExpired(KvpoolError):
    """A read outlived its lease; its bytes were discarded."""

    code = _C["LEASE_EXPIRED"]


class NotReady(KvpoolError):
    """The object is still being written."""

    code = _C["REPLICA_IS_NOT_READY"]


class InvalidArgument(KvpoolError, ValueError):
    """A bad key, size, address or option (including a destination buffer too small)."""

    code = _C["INVALID_PARAMS"]


class NotSupported(KvpoolError, NotImplementedError):
    """The operation or option is not supported by this kvpool build."""

    code = _C["NOT_SUPPORTED"]


class Timeout(KvpoolError, TimeoutError):
    """A call did not complete within its timeout."""

    code = _C["RPC_TIMEOUT"]


class Unavailable(KvpoolError, ConnectionError):
    """The master or a storage node could not be reached or cannot serve now."""

    code = _C["RPC_FAIL"]


class Corrupted(KvpoolError):
    """Bytes read failed their checksum or header check (never returned)."""

    code = _C["CHECKSUM_MISMATCH"]


class BatchError(KvpoolError):
    """Some keys of a batch call failed. ``.results`` holds one entry per key:
    the value (or ``None``) where the key succeeded, the exception where it failed."""

    def __init__(self, message: str = "", code: Optional[int] = None, results: Optional[List[Any]] = None) -> None:
        super().__init__(message, code)
        self.results: List[Any] = list(results or [])

    @property
    def errors(self) -> Dict[int, KvpoolError]:
        """Failed positions and their exceptions."""
        return {i: r for i, r in enumerate(self.results) if isinstance(r, KvpoolError)}

    def __reduce__(self) -> Any:
        return (type(self), (self.message, self.code, self.results))


# The one mapping from codes to exception classes: each class's own code,
# and the other codes that mean the same to a caller. Codes not listed
# raise KvpoolError itself.
_BY_CODE: Dict[int, Type[KvpoolError]] = {
    c.code: c
    for c in (NotFound, AlreadyExists, NoSpace, LeaseHeld, LeaseExpired, NotReady, InvalidArgument, NotSupported, Timeout, Unavailable, Corrupted)
}
_BY_CODE.update(
    (_C[name], cls)
    for cls, names in (
        (NotFound, ("TASK_NOT_FOUND",)),
        (NoSpace, ("QUOTA_EXCEEDED",)),
        (InvalidArgument, ("INVALID_KEY", "BUFFER_OVERFLOW")),
        (Unavailable, ("TRANSFER_FAIL", "UNAVAILABLE_IN_CURRENT_STATUS", "CLIENT_NOT_FOUND", "SEGMENT_NOT_FOUND", "INVALID_VERSION", "ETCD_OPERATION_ERROR")),
        (Corrupted, ("INVALID_WRITE", "INVALID_READ")),
    )
    for name in names
)


def error_for(code: int, message: str = "") -> KvpoolError:
    """The exception for a kvpool error code (used by the native module too)."""
    return _BY_CODE.get(code, KvpoolError)(message, code)
