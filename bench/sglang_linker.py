"""SGLang's direct external linker on kvpool: how long a batch's load takes.

Two engines' KV sides are built as SGLang builds them (a DeepSeek
sparse-attention device pool on CPU, its paged allocator, and the radix
cache `create_unified_radix_cache` makes with `--unified-cache-external-linker-backend
dynamic` naming `kvpool.sglang.KvpoolLinker`). One computes prompts and the
tree offloads them; the other matches them and loads the pool's pages into
its device slots. Each load is timed from the batch's start to its last
layer landing, and checked byte for byte.

Two load paths over the same objects: kvpool's (`KvpoolLinker`: each page
object read once, scattered into its layer rows) and Mooncake's
(`MooncakeDirectLinker.load_layer_wise`: one ranged read of every object per
layer, which on kvpool moves each object once per layer).

Usage (a pool running, e.g. `kvpool up --segment-size 4GiB`):
  python bench/sglang_linker.py --master 127.0.0.1:50051 [--layers 61] [--pages 8]
Needs SGLang 0.5.23's CPU set (crates/kvpool-python/tests/requirements-sglang.txt)
and the `kvpool` package. `tests/test_sglang_linker.py` drives the same engines.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import types
from array import array
from types import SimpleNamespace
from typing import Any, List, Optional, Tuple

import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_unified_radix_cache
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_direct_linker import MooncakeDirectLinker
from sglang.srt.runtime_context import SpawnRanks, publish
from sglang.srt.server_args import ServerArgs

from kvpool.sglang import KvpoolLinker

PAGE = 64


def linker_server_args(master: str, protocol: str, page_size: int) -> ServerArgs:
    """A CPU worker's server args naming ``KvpoolLinker`` as SGLang's
    ``dynamic`` external linker, on the pool at ``master``."""
    return ServerArgs(
        model_path="dummy",
        device="cpu",
        page_size=page_size,
        enable_unified_cache_external_linker=True,
        unified_cache_external_linker_backend="dynamic",
        unified_cache_external_linker_config={
            "linker": "KvpoolLinker",
            "linker_module_path": "kvpool.sglang",
            "linker_extra_config": {
                "master_server_address": master,
                "global_segment_size": 0,
                "protocol": protocol,
            },
        },
    )


def linker_cache(server_args: ServerArgs, params: CacheInitParams, *, is_dsa: bool = False,
                 is_hybrid_ssm: bool = False) -> Any:
    """The radix cache SGLang's scheduler builds from ``params`` with the
    linker ``server_args`` name (one rank, no host tier)."""
    worker = SimpleNamespace(
        model_runner=SimpleNamespace(forward_stream=None),
        register_hicache_layer_transfer_counter=lambda counter: None,
    )
    return create_unified_radix_cache(TreeCacheBuildContext(
        server_args=server_args, params=params, is_hybrid_swa=False, is_hybrid_ssm=is_hybrid_ssm,
        enable_hierarchical_cache=False, disable_radix_cache=False, tp_worker=worker,
        model_config=None, tp_size=1, tp_rank=0, tp_group=None, is_dsa=is_dsa,
    ))


class Engine:
    """One SGLang worker's KV side: a DSA device pool on CPU, its paged
    allocator, and the radix cache SGLang builds for it with the linker the
    server args name."""

    def __init__(self, master: str, protocol: str = "tcp", *, layers: int = 3, tokens: int = 2048,
                 kv_dim: Tuple[int, int] = (32, 16), tp_group: Any = None) -> None:
        """``layers`` of latent KV rows ``kv_dim`` = (latent, rope) wide
        (DeepSeek V3.2: 61 layers of (512, 64)), ``tokens`` slots;
        ``tp_group``: the process group of the engine's tensor-parallel
        ranks (``None``: one rank)."""
        server_args = linker_server_args(master, protocol, PAGE)
        # What the scheduler process does first; the factory reads the linker
        # config from it.
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
        self.layers = layers
        self.kv = DSATokenToKVPool(
            size=tokens, page_size=PAGE, kv_lora_rank=kv_dim[0], dtype=torch.bfloat16, qk_rope_head_dim=kv_dim[1],
            layer_num=layers, device="cpu", index_head_dim=128, enable_memory_saver=False, kv_cache_dim=sum(kv_dim),
        )
        self.alloc = PagedTokenToKVPoolAllocator(tokens, PAGE, torch.bfloat16, "cpu", self.kv, need_sort=False)
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=ReqToTokenPool(8, tokens, "cpu", False),
            token_to_kv_pool_allocator=self.alloc,
            page_size=PAGE,
            tp_cache_group=tp_group,
        )
        self.cache = linker_cache(server_args, params, is_dsa=True)
        self.linker: KvpoolLinker = self.cache.linker.cache_linker

    def compute(self, tokens: List[int]) -> torch.Tensor:
        """A prefill: slots for ``tokens`` filled with random KV, inserted into
        the tree, which offloads them (write-through). Returns the slots."""
        slots = self.alloc.alloc(len(tokens))
        for buf in self.kv.kv_buffer:
            rows = buf.view(torch.uint8)[slots]
            buf.view(torch.uint8)[slots] = torch.randint(0, 256, rows.shape, dtype=torch.uint8)
        for buf in self.kv.index_k_with_scale_buffer:
            rows = buf[slots[::PAGE] // PAGE]
            buf[slots[::PAGE] // PAGE] = torch.randint(0, 256, rows.shape, dtype=torch.uint8)
        self.cache.insert(InsertParams(key=key(tokens), value=slots))
        return slots

    def settle(self, timeout: float = 20.0) -> None:
        """Runs the scheduler's per-step event check until no offload is in flight."""
        deadline = time.monotonic() + timeout
        while self.cache.linker.pending_offloads:
            assert time.monotonic() < deadline, "offloads still in flight"
            self.cache.check_hicache_events()
            time.sleep(0.01)

    def admit(self, rid: str, tokens: List[int]) -> Tuple[Any, int, Optional[torch.Tensor]]:
        """What scheduling a request does: match the prefix (the linker's
        lookup) and queue the load of the pool's hit. Returns the request,
        the tokens hit in the pool and the request's private slots they load
        into."""
        req = SimpleNamespace(rid=rid, last_node=None, session=None, swa_branching_seqlen=None, kv=None)
        match = self.cache.match_prefix(MatchPrefixParams(key=key(tokens), req=req))
        req.last_node = match.last_device_node
        if match.host_hit_length == 0:
            return req, 0, None
        loaded, _ = self.cache.init_load_back(InitLoadBackParams(
            best_match_node=match.last_host_node, host_hit_length=match.host_hit_length, req=req, mem_quota=None,
        ))
        return req, loaded, self.cache.linker.private_load_indices.get(rid)

    def forward(self, reqs: List[Any]) -> List[Any]:
        """A batch's forward: starts the queued loads, reads every layer
        through the pool (which waits for the layer to land), and returns the
        requests whose KV did not land."""
        index = self.cache.ready_to_load_host_cache()
        self.linker.layer_done_counter.set_consumer(index)
        for layer in range(self.layers):
            self.kv.get_key_buffer(layer)
        return self.cache.finish_external_linker_loads(reqs)


def key(tokens: List[int]) -> RadixKey:
    """SGLang's tree key for ``tokens`` (its Rust tree core takes int64 arrays)."""
    return RadixKey(array("q", tokens))


def prompt(seed: int, pages: int, extra: int = 0) -> List[int]:
    """Token ids of a prompt: distinct per ``seed``, ``pages`` full pages and ``extra`` tokens more."""
    return [seed * 100_000 + i for i in range(pages * PAGE + extra)]


def same_kv(src: Engine, src_slots: torch.Tensor, dst: Engine, dst_slots: torch.Tensor) -> bool:
    """Whether ``dst_slots`` of ``dst`` hold the latent KV and indexer rows of
    ``src_slots`` of ``src``, byte for byte, in every layer."""
    for a, b in zip(src.kv.kv_buffer, dst.kv.kv_buffer):
        if not torch.equal(a.view(torch.uint8)[src_slots], b.view(torch.uint8)[dst_slots]):
            return False
    for a, b in zip(src.kv.index_k_with_scale_buffer, dst.kv.index_k_with_scale_buffer):
        if not torch.equal(a[src_slots[::PAGE] // PAGE], b[dst_slots[::PAGE] // PAGE]):
            return False
    return True



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", required=True, help="the pool's master RPC address")
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--pages", type=int, default=8, help="pages (64 tokens) per load")
    ap.add_argument("--rounds", type=int, default=5, help="loads per path; the first is a warm-up")
    ap.add_argument("--protocol", action="append", help="tcp, shm (default: both)")
    args = ap.parse_args()
    tokens = (args.pages * 2 * args.rounds + 2) * PAGE
    shape = dict(layers=args.layers, tokens=tokens, kv_dim=(512, 64))
    mb = args.pages * PAGE * sum(shape["kv_dim"]) * 2 * args.layers / 1e6
    # Fresh prompts in every run, so no object read is an earlier run's.
    seeds = itertools.count(int(time.time()) % 10**6 * 1000)
    print("| transport | load path | MB per load | load ms (median) | GB/s |")
    print("|---|---|---|---|---|")
    for proto in args.protocol or ["tcp", "shm"]:
        src = Engine(args.master, proto, **shape)
        for way, load in (("kvpool", None), ("per-layer ranges", MooncakeDirectLinker.load_layer_wise)):
            dst = Engine(args.master, proto, **shape)
            if load is not None:
                dst.linker.load_layer_wise = types.MethodType(load, dst.linker)
            took = []
            for r in range(args.rounds):
                toks = prompt(next(seeds), args.pages)
                slots = src.compute(toks)
                src.settle()
                req, hit, dst_slots = dst.admit(f"r{r}", toks)
                assert hit == len(toks), (hit, len(toks))
                t0 = time.perf_counter()
                assert dst.forward([req]) == []
                took.append(time.perf_counter() - t0)
                assert same_kv(src, slots, dst, dst_slots)
            dst.cache.linker.close()
            ms = statistics.median(took[1:]) * 1e3
            print(f"| {proto} | {way} | {mb:.1f} | {ms:.1f} | {mb / ms:.2f} |")
        src.cache.linker.close()


if __name__ == "__main__":
    main()
