"""kvpool: a distributed KV-cache pool for LLM inference.

- :class:`kvpool.Client` — the Pythonic API (exceptions, ``bytes``, buffers).
- :mod:`kvpool.mooncake` — ``MooncakeDistributedStore``, a drop-in for
  ``mooncake.store`` (same methods and integer return codes).
- :mod:`kvpool.sglang` — ``KvpoolStore``, an SGLang HiCache storage backend.
- :mod:`kvpool.lmcache` — ``KvpoolL2Adapter``, an LMCache L2 adapter.
"""

from __future__ import annotations

from . import _native
from ._native import address_of
from .client import Buffer, Client
from .config import ReplicateConfig, SoftPinAction
from . import errors as _errors
from .errors import *  # noqa: F401,F403 - every name in errors.__all__

__version__: str = _native.__version__

__all__ = [
    "Client",
    "Buffer",
    "ReplicateConfig",
    "SoftPinAction",
    "address_of",
    "__version__",
]
__all__ += _errors.__all__
