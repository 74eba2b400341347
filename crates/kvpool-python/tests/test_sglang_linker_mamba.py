"""SGLang 0.5.23's direct external linker on a hybrid Mamba model, on
kvpool's ``KvpoolLinker``: the pools SGLang builds for an MLA + Mamba
hybrid (``HybridReqToTokenPool`` with its ``MambaPool``, ``HybridLinearKVPool``
over an MLA pool, a paged allocator; CPU tensors), the radix cache
``create_unified_radix_cache`` makes with the linker the server args name, and
the tree's own calls. A prefill's insert offloads its full-attention pages
and the Mamba state at the prompt's end (one object keyed by the last
page's hash, SGLang's ``trailing_pages`` policy); a second engine's match
finds both, its load puts the pages into its slots and the state into the
Mamba slot the load gives the request, byte for byte.

Runs when SGLang is installed (scripts/test-python.sh installs it);
KVPOOL_TEST_SGLANG=1 makes a missing SGLang a failure, =0 skips."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Iterator, List

import pytest

from conftest import Cluster, load_bench_script, new_cluster, require_sglang

require_sglang()

import torch  # noqa: E402
from sglang.kernels.ops.attention.fla.chunk_delta_h import CHUNK_SIZE as FLA_CHUNK_SIZE  # noqa: E402
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.managers.schedule_batch import ReqKvInfo  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: E402
from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, publish  # noqa: E402

from kvpool.sglang import KvpoolLinker  # noqa: E402

linker_bench = load_bench_script("sglang_linker")
key = linker_bench.key

PAGE = 4
LAYERS = 8
#: Full-attention (MLA) layers; the others are Mamba layers.
FULL = (3, 7)


def prompt(seed: int, pages: int) -> List[int]:
    """Token ids of a prompt of ``pages`` full pages, distinct per ``seed``."""
    return [seed * 100_000 + i for i in range(pages * PAGE)]


class MambaEngine:
    """One SGLang worker's cache side for an MLA + Mamba hybrid model, as
    SGLang builds it (the shapes of its unit tests' Mamba2 fixture)."""

    def __init__(self, master: str, protocol: str, tokens: int = 256) -> None:
        server_args = linker_bench.linker_server_args(master, protocol, PAGE)
        # The dummy model config cannot give the Mamba chunk size.
        server_args._mamba_cache_chunk_size = max(FLA_CHUNK_SIZE, PAGE)
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
        mamba_layers = [i for i in range(LAYERS) if i not in FULL]
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
            shape = Mamba2StateShape.create(
                tp_world_size=1, intermediate_size=256, n_groups=1, num_heads=2,
                head_dim=16, state_size=16, conv_kernel=4,
            )
            cache_params = Mamba2CacheParams(shape=shape, layers=mamba_layers)
        self.req_pool = HybridReqToTokenPool(
            size=10, mamba_size=60, mamba_spec_state_size=10, max_context_len=512, device="cpu",
            enable_memory_saver=False, cache_params=cache_params, mamba_layer_ids=mamba_layers,
            # SGLang needs it for Mamba pages over one token.
            enable_mamba_extra_buffer=True, speculative_num_draft_tokens=3,
        )
        self.kv = HybridLinearKVPool(
            size=tokens, dtype=torch.bfloat16, page_size=PAGE, head_num=1, head_dim=48,
            full_attention_layer_ids=list(FULL), device="cpu", enable_memory_saver=False,
            mamba_pool=self.req_pool.mamba_pool, use_mla=True, kv_lora_rank=32, qk_rope_head_dim=16,
        )
        self.alloc = PagedTokenToKVPoolAllocator(tokens, PAGE, torch.bfloat16, "cpu", self.kv, need_sort=False)
        params = CacheInitParams(
            disable=False, req_to_token_pool=self.req_pool, token_to_kv_pool_allocator=self.alloc,
            page_size=PAGE, enable_mamba_extra_buffer=True,
        )
        self.cache = linker_bench.linker_cache(server_args, params, is_hybrid_ssm=True)
        self.linker: KvpoolLinker = self.cache.linker.cache_linker

    def state(self, slot: torch.Tensor) -> List[torch.Tensor]:
        """A copy of the Mamba state in ``slot`` (one slot), every layer's, as bytes."""
        cache = self.req_pool.mamba_pool.mamba_cache
        return [t.view(torch.uint8)[:, slot.reshape(-1)] for t in (cache.temporal, *cache.conv)]

    def compute(self, tokens: List[int]) -> tuple:
        """A prefill: slots for ``tokens`` and a Mamba state slot, filled at
        random, inserted into the tree (which offloads both). Returns the
        slots and the state slot."""
        slots = self.alloc.alloc(len(tokens))
        for buf in self.kv.full_kv_pool.kv_buffer:
            rows = buf.view(torch.uint8)
            rows[slots] = torch.randint(0, 256, rows[slots].shape, dtype=torch.uint8)
        state = self.req_pool.mamba_allocator.alloc(1)
        cache = self.req_pool.mamba_pool.mamba_cache
        for t in (cache.temporal, *cache.conv):
            rows = t.view(torch.uint8)
            rows[:, state] = torch.randint(0, 256, rows[:, state].shape, dtype=torch.uint8)
        self.cache.insert(InsertParams(key=key(tokens), value=slots, mamba_value=state))
        return slots, state

    def settle(self, timeout: float = 20.0) -> None:
        linker_bench.Engine.settle(self, timeout)

    def admit(self, rid: str, tokens: List[int]) -> tuple:
        """Matches ``tokens`` and queues the load of the pool's hit: the
        request, the tokens hit, and the slots they load into."""
        req = SimpleNamespace(rid=rid, last_node=None, session=None, swa_branching_seqlen=None, kv=ReqKvInfo())
        match = self.cache.match_prefix(MatchPrefixParams(key=key(tokens), req=req))
        req.last_node = match.last_device_node
        if match.host_hit_length == 0:
            return req, 0, None
        assert match.mamba_host_hit_length == 1  # one state, at the hit's end
        loaded, _ = self.cache.init_load_back(InitLoadBackParams(
            best_match_node=match.last_host_node, host_hit_length=match.host_hit_length, req=req, mem_quota=None,
        ))
        return req, loaded, self.cache.linker.private_load_indices.get(rid)

    def forward(self, reqs: list) -> list:
        """A batch's forward: starts the queued loads, waits for each
        full-attention layer, and returns the requests whose loads failed."""
        index = self.cache.ready_to_load_host_cache()
        self.linker.layer_done_counter.set_consumer(index)
        for layer in FULL:
            self.kv.get_key_buffer(layer)
        return self.cache.finish_external_linker_loads(reqs)


def same_pages(a: MambaEngine, a_slots: torch.Tensor, b: MambaEngine, b_slots: torch.Tensor) -> bool:
    """Whether the full-attention rows of ``a_slots`` in ``a`` are those of
    ``b_slots`` in ``b``, in every full-attention layer."""
    return all(
        torch.equal(x.view(torch.uint8)[a_slots], y.view(torch.uint8)[b_slots])
        for x, y in zip(a.kv.full_kv_pool.kv_buffer, b.kv.full_kv_pool.kv_buffer)
    )


def same_state(a: MambaEngine, a_slot: torch.Tensor, b: MambaEngine, b_slot: torch.Tensor) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state(a_slot), b.state(b_slot)))


@pytest.fixture(scope="module")
def pool() -> Iterator[Cluster]:
    c = new_cluster(store_size="128MiB")
    yield c
    c.stop()


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_mamba_pages_and_state_move_between_engines_byte_exact(pool: Cluster, protocol: str) -> None:
    prefill = MambaEngine(pool.master, protocol)
    assert set(prefill.linker.pools) == {PoolName.KV, PoolName.MAMBA}
    seed = 40 if protocol == "tcp" else 41
    tokens = prompt(seed, pages=8)
    slots, state = prefill.compute(tokens)
    prefill.settle()
    assert prefill.linker.stats["offload"] == 1

    decode = MambaEngine(pool.master, protocol)
    req, hit, dst = decode.admit("r1", tokens)
    assert hit == len(tokens) and dst is not None and len(dst) == hit
    assert req.kv.mamba_pool_idx is not None  # the load's own state slot
    assert not same_state(prefill, state, decode, req.kv.mamba_pool_idx)  # nothing there before
    assert decode.forward([req]) == []
    assert same_pages(prefill, slots, decode, dst)
    assert same_state(prefill, state, decode, req.kv.mamba_pool_idx)

    # A prompt going on past the 8 pages hits them (the state is at their
    # end); one sharing only the first 5 does not: their KV is in the pool,
    # but a hybrid model cannot resume without the state where its prefix
    # ends, and there is none at the 5th page.
    third = MambaEngine(pool.master, protocol)
    req, hit, dst = third.admit("r2", tokens + prompt(seed + 100, pages=2))
    assert hit == len(tokens)
    assert third.forward([req]) == []
    assert same_pages(prefill, slots, third, dst)
    assert same_state(prefill, state, third, req.kv.mamba_pool_idx)
    _, hit, _ = third.admit("r3", tokens[: 5 * PAGE] + prompt(seed + 200, pages=3))
    assert hit == 0
    for engine in (prefill, decode, third):
        engine.cache.linker.close()
