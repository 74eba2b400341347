"""kvpool: a distributed KV-cache pool for LLM inference.

- :class:`kvpool.Client` — the Pythonic API (exceptions, ``bytes``, buffers).
- :mod:`kvpool.mooncake` — ``MooncakeDistributedStore``, a drop-in for
  ``mooncake.store`` (same methods and integer return codes).
- :mod:`kvpool.sglang` — ``KvpoolStore``, an SGLang HiCache storage backend.
"""

from __future__ import annotations

from . import _native
from ._native import address_of
from .client import Buffer, Client
from .config import ReplicateConfig, SoftPinAction
from .errors import (
    AlreadyExists,
    BatchError,
    Corrupted,
    InvalidArgument,
    KvpoolError,
    LeaseExpired,
    LeaseHeld,
    NoSpace,
    NotFound,
    NotReady,
    NotSupported,
    Timeout,
    Unavailable,
)

__version__: str = _native.__version__

__all__ = [
    "Client",
    "Buffer",
    "ReplicateConfig",
    "SoftPinAction",
    "address_of",
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
    "__version__",
]
