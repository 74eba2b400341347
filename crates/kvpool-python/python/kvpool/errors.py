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

    code = -704


class AlreadyExists(KvpoolError):
    """The object already exists."""

    code = -705


class NoSpace(KvpoolError):
    """No room in the pool even after eviction (``NO_AVAILABLE_HANDLE``)."""

    code = -200


class LeaseHeld(KvpoolError):
    """Remove refused: a reader holds a lease on the object; retry or use ``force``."""

    code = -706


class LeaseExpired(KvpoolError):
    """A read outlived its lease; its bytes were discarded."""

    code = -707


class NotReady(KvpoolError):
    """The object is still being written."""

    code = -703


class InvalidArgument(KvpoolError, ValueError):
    """A bad key, size, address or option (including a destination buffer too small)."""

    code = -600


class NotSupported(KvpoolError, NotImplementedError):
    """The operation or option is not supported by this kvpool build."""

    code = -1012


class Timeout(KvpoolError, TimeoutError):
    """A call did not complete within its timeout."""

    code = -901


class Unavailable(KvpoolError, ConnectionError):
    """The master or a storage node could not be reached or cannot serve now."""

    code = -900


class Corrupted(KvpoolError):
    """Bytes read failed their checksum or header check (never returned)."""

    code = -801


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


# The one mapping from codes to exception classes. Codes not listed raise
# KvpoolError itself.
_BY_CODE: Dict[int, Type[KvpoolError]] = {
    -704: NotFound,
    -1400: NotFound,
    -705: AlreadyExists,
    -200: NoSpace,
    -706: LeaseHeld,
    -707: LeaseExpired,
    -703: NotReady,
    -600: InvalidArgument,
    -400: InvalidArgument,
    -10: InvalidArgument,
    -1012: NotSupported,
    -901: Timeout,
    -900: Unavailable,
    -800: Unavailable,
    -1010: Unavailable,
    -103: Unavailable,
    -101: Unavailable,
    -300: Unavailable,
    -1000: Unavailable,
    -801: Corrupted,
    -700: Corrupted,
    -701: Corrupted,
}


def error_for(code: int, message: str = "") -> KvpoolError:
    """The exception for a kvpool error code (used by the native module too)."""
    return _BY_CODE.get(code, KvpoolError)(message, code)
