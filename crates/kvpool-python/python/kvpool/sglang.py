"""``KvpoolStore``: an SGLang HiCache storage backend on kvpool.

Load it with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvpool",
        "module_path": "kvpool.sglang", "class_name": "KvpoolStore",
        "interface_v1": 1, "master_server_address": "127.0.0.1:50051",
        "global_segment_size": "4gb"}'

It is SGLang's own ``MooncakeStore`` with the store class swapped for
:class:`kvpool.mooncake.MooncakeDistributedStore`, so key naming (per-page
hashes, ``_{tp}_k``/``_{tp}_v`` suffixes, MLA ``__k``), the zero-copy
``batch_get_v1``/``batch_set_v1`` paths and hybrid-model pools behave exactly
as with Mooncake. Requires SGLang (0.5.23 is the tested version).
"""

from __future__ import annotations

from typing import Any, List, Optional

from sglang.srt.mem_cache.pool_host.common import HostTensorAllocator  # type: ignore[import-untyped]
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import (  # type: ignore[import-untyped]
    MooncakeBaseStore,
    MooncakeHostTensorAllocator,
    MooncakeStore,
)

from .config import ReplicateConfig
from .mooncake import MooncakeDistributedStore, MooncakeHostMemAllocator

__all__ = ["KvpoolStore", "KvpoolHostTensorAllocator"]


class KvpoolHostTensorAllocator(MooncakeHostTensorAllocator):  # type: ignore[misc]
    """SGLang's Mooncake host-tensor allocator over kvpool's host memory
    (:class:`kvpool.mooncake.MooncakeHostMemAllocator`), so the ``mooncake``
    package is not needed. Host pools made with it are what SGLang's
    standalone-storage mode checks for."""

    def __init__(self) -> None:
        HostTensorAllocator.__init__(self)
        self.allocator = MooncakeHostMemAllocator()
        self.ptr = None


class _StandalonePool:
    """What SGLang's standalone-storage check looks at in a host pool. In
    kvpool's standalone mode the engine copies between its own host pool and
    the storage process's segment (mapped here, or over TCP), so the pool may
    live in any memory: the pool's buffers are only counted, for the size
    ``setup_dummy`` is given."""

    def __init__(self, pool: Any) -> None:
        self.allocator = KvpoolHostTensorAllocator()
        self.kv_buffer = getattr(pool, "kv_buffer", None)
        self.entries = getattr(pool, "entries", None)
        hybrid = getattr(pool, "get_hybrid_pool_buffer", None)
        self._hybrid: List[Any] = list(hybrid()) if callable(hybrid) else []

    def get_hybrid_pool_buffer(self) -> List[Any]:
        return self._hybrid


class KvpoolStore(MooncakeStore):  # type: ignore[misc]
    """SGLang's Mooncake HiCache backend, storing into kvpool.

    With ``standalone_storage`` (and ``client_server_address`` naming a
    ``kvpool store`` data address) the engine attaches to that long-lived
    storage process through ``setup_dummy`` and lends no memory itself, so
    an engine restart keeps the cache the store holds."""

    def __init__(self, storage_config: Any = None, kwargs: Optional[Any] = None) -> None:
        # SGLang builds dynamic backends as cls(storage_config, kwargs); the
        # host pool arrives later through register_mem_pool_host(). When
        # constructed like the built-in backend, the second argument is the pool.
        mem_pool = kwargs.get("mem_pool_host") if isinstance(kwargs, dict) else kwargs
        if self._standalone(storage_config) and not isinstance(
            getattr(mem_pool, "allocator", None), MooncakeHostTensorAllocator
        ):
            # SGLang's dynamic backends get no pool here, and a pool made
            # by another allocator works with kvpool all the same.
            mem_pool = _StandalonePool(mem_pool)
        super().__init__(storage_config, mem_pool)

    def _standalone(self, storage_config: Any) -> bool:
        try:
            return bool(MooncakeBaseStore._load_config(self, storage_config).standalone_storage)
        except Exception:  # noqa: BLE001 - SGLang reports a bad config itself
            return False

    def _import_mooncake_store(self) -> type:
        return MooncakeDistributedStore

    def _import_mooncake_group_semantics(self) -> Any:
        # Groups are a hint kvpool does not use: SGLang keeps its plain batch path.
        return ReplicateConfig, False
