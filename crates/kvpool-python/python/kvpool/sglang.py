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

from typing import Any, Optional

from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore  # type: ignore[import-untyped]

from .config import ReplicateConfig
from .mooncake import MooncakeDistributedStore

__all__ = ["KvpoolStore"]


class KvpoolStore(MooncakeStore):  # type: ignore[misc]
    """SGLang's Mooncake HiCache backend, storing into kvpool."""

    def __init__(self, storage_config: Any = None, kwargs: Optional[Any] = None) -> None:
        # SGLang builds dynamic backends as cls(storage_config, kwargs); the
        # host pool arrives later through register_mem_pool_host(). When
        # constructed like the built-in backend, the second argument is the pool.
        mem_pool = kwargs.get("mem_pool_host") if isinstance(kwargs, dict) else kwargs
        super().__init__(storage_config, mem_pool)

    def _import_mooncake_store(self) -> type:
        return MooncakeDistributedStore

    def _import_mooncake_group_semantics(self) -> Any:
        # kvpool's ReplicateConfig has no group_ids: SGLang keeps its plain batch path.
        return ReplicateConfig, False
