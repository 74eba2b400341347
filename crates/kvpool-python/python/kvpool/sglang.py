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
as with Mooncake.

``KvpoolLinker`` is SGLang's direct external linker (device pools to the
pool, no host tier) on kvpool, loaded with::

    --enable-unified-cache-external-linker
    --unified-cache-external-linker-backend dynamic
    --unified-cache-external-linker-config '{"linker": "KvpoolLinker",
        "linker_module_path": "kvpool.sglang", "linker_extra_config":
        {"master_server_address": "127.0.0.1:50051", "global_segment_size": "4gb"}}'

Requires SGLang (0.5.23 is the tested version).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (  # type: ignore[import-untyped]
    HiCacheStorageConfig,
    PoolTransfer,
)
from sglang.srt.mem_cache.hybrid_cache.linker_pool_assembler import (  # type: ignore[import-untyped]
    resolve_hybrid_device_pool_group,
)
from sglang.srt.mem_cache.pool_host.common import HostTensorAllocator  # type: ignore[import-untyped]
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_direct_linker import (  # type: ignore[import-untyped]
    MooncakeDirectLinker,
)
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import (  # type: ignore[import-untyped]
    MooncakeBaseStore,
    MooncakeHostTensorAllocator,
    MooncakeStore,
)

from ._reach import Reachability
from .config import ReplicateConfig
from .errors import Unavailable
from .mooncake import MooncakeDistributedStore, MooncakeHostMemAllocator

__all__ = ["KvpoolStore", "KvpoolHostTensorAllocator", "KvpoolLinker"]

logger = logging.getLogger(__name__)


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


#: What a read or write of an unreachable pool answers per key.
RPC_FAIL = Unavailable.code


class KvpoolStore(MooncakeStore):  # type: ignore[misc]
    """SGLang's Mooncake HiCache backend, storing into kvpool.

    With ``standalone_storage`` (and ``client_server_address`` naming a
    ``kvpool store`` data address) the engine attaches to that long-lived
    storage process through ``setup_dummy`` and lends no memory itself, so
    an engine restart keeps the cache the store holds.

    While the master does not answer (see :mod:`kvpool._reach`), lookups
    find nothing and reads and writes fail at once, instead of waiting out
    the client's retries on HiCache's prefetch and backup threads, or on
    the scheduler's thread for a linker's lookup."""

    def __init__(self, storage_config: Any = None, kwargs: Optional[Any] = None) -> None:
        # SGLang builds dynamic backends as cls(storage_config, kwargs); the
        # host pool arrives later through register_mem_pool_host(). When
        # constructed like the built-in backend, the second argument is the pool.
        self._reach = Reachability(logger)
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

    def reachable(self) -> bool:
        """Whether the master answered the client's heartbeats lately."""
        return self._reach.check(self.store._client)

    # Every lookup, read and write of SGLang's Mooncake backend (v1 and v2
    # calls, the linker's too) goes through these three.
    def _batch_exist(self, key_strs: List[str]) -> List[int]:
        if not self.reachable():
            return [0] * len(key_strs)
        return super()._batch_exist(key_strs)

    def _get_batch_zero_copy_impl(self, key_strs: List[str], *args: Any, **kwargs: Any) -> List[int]:
        if not self.reachable():
            return [RPC_FAIL] * len(key_strs)
        return super()._get_batch_zero_copy_impl(key_strs, *args, **kwargs)

    def _put_batch_zero_copy_impl(self, key_strs: List[str], *args: Any, **kwargs: Any) -> List[int]:
        if not self.reachable():
            return [RPC_FAIL] * len(key_strs)
        return super()._put_batch_zero_copy_impl(key_strs, *args, **kwargs)

    def _import_mooncake_group_semantics(self) -> Any:
        # Groups are a hint kvpool does not use: SGLang keeps its plain batch path.
        return ReplicateConfig, False


class KvpoolLinker(MooncakeDirectLinker):  # type: ignore[misc]
    """SGLang's ``UnifiedCacheLinker`` on kvpool: lookups, loads into the
    device pools and asynchronous offloads go through :class:`KvpoolStore`,
    with the objects Mooncake's linker writes (same keys, same layout).

    A load reads each page object once, scattered straight into its layer
    rows, and then releases every layer to the forward. Mooncake's linker
    instead asks for one layer's byte range per call; kvpool verifies each
    object's checksum whole, so a ranged read fetches the whole object, and
    per-layer calls would move every object once per layer.

    While the master does not answer, lookups find nothing and loads and
    offloads fail at once (see :class:`KvpoolStore`)."""

    def __init__(
        self,
        server_args: Any,
        params: Any,
        *,
        components: Any,
        extra_config: Optional[Dict[str, Any]] = None,
        forward_stream: Any = None,
    ) -> None:
        storage = KvpoolStore(_linker_storage_config(params, components, extra_config))
        super().__init__(
            server_args,
            params,
            components=components,
            extra_config=extra_config,
            storage=storage,
            forward_stream=forward_stream,
        )

    def load_layer_wise(self, counter_index: int, request_transfers: List[List[PoolTransfer]]) -> None:
        try:
            results = self.storage.batch_get_v2(_merge_by_pool(request_transfers))
            pages = [ok for per_pool in results.values() for ok in per_pool]
            if not all(pages):
                raise RuntimeError(f"kvpool load: {pages.count(False)} of {len(pages)} page objects did not land")
        except BaseException as error:  # noqa: BLE001 - reported through the counter, as the contract asks
            self.layer_done_counter.fail(counter_index, error)
            logger.exception("kvpool linker load failed")
            return
        for layer in range(self.num_layers):
            self.layer_done_counter.complete(counter_index, layer)



def _linker_storage_config(params: Any, components: Any, extra_config: Optional[Dict[str, Any]]) -> Any:
    """The storage identity Mooncake's linker gives its store (so both name
    the same objects): the attention TP rank and size, pipeline and context
    ranks, and whether the pages are the same on every rank (MLA)."""
    from sglang.srt.runtime_context import get_model, get_parallel  # type: ignore[import-untyped]

    group = resolve_hybrid_device_pool_group(
        kvcache=params.token_to_kv_pool_allocator.get_kvcache(),
        page_size=params.page_size,
        params=params,
        components=components,
    )
    tp_rank, tp_size = 0, get_parallel().tp_size
    tp_group = params.attn_tp_cache_group or params.tp_cache_group
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        tp_rank = torch.distributed.get_rank(group=tp_group)
        tp_size = torch.distributed.get_world_size(group=tp_group)
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=params.pp_rank,
        pp_size=params.pp_size,
        attn_cp_rank=params.attn_cp_rank,
        attn_cp_size=params.attn_cp_size,
        is_mla_model=group.rank_replicated,
        enable_storage_metrics=False,
        is_page_first_layout=False,
        model_name=get_model().model_path,
        extra_config=dict(extra_config or {}),
    )


def _merge_by_pool(request_transfers: List[List[PoolTransfer]]) -> List[PoolTransfer]:
    """One transfer per pool over every request of a load batch, so the batch
    is one read: the store's per-pool results would otherwise overwrite each
    other."""
    merged: Dict[Any, PoolTransfer] = {}
    for transfers in request_transfers:
        for t in transfers:
            had = merged.get(t.name)
            merged[t.name] = (
                t
                if had is None
                else dataclasses.replace(
                    had,
                    keys=list(had.keys) + list(t.keys),
                    host_indices=torch.cat([had.host_indices, t.host_indices]),
                )
            )
    return list(merged.values())
