"""One tensor-parallel rank of test_sglang_linker.py's TP=2 test: a process
in the ranks' gloo group (what SGLang's cache gets as ``tp_cache_group``),
with the linker benchmark's engines (bench/sglang_linker.py) built on it,
so that SGLang's own linker code reduces hits and load verdicts across the
ranks. A DeepSeek sparse-attention pool, the only plain layout SGLang's
linker takes, holds the same rows on every rank: rank 0 alone offloads
them, under keys without a rank, and every rank reads them. The ranks
order their steps through the group's TCP store.

Usage: linker_tp_peer.py RANK STORE_PORT MASTER PROTOCOL
Prints one "ok" line per step passed; any failed check exits non-zero.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from sglang.srt.mem_cache.utils import get_storage_hash_str

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import sglang_linker  # noqa: E402

import kvpool  # noqa: E402

Engine, PAGE, prompt, same_kv = sglang_linker.Engine, sglang_linker.PAGE, sglang_linker.prompt, sglang_linker.same_kv
rank, port, master, protocol = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
store = dist.TCPStore("127.0.0.1", port, world_size=2, is_master=rank == 0)
dist.init_process_group("gloo", store=store, world_size=2, rank=rank)
group = dist.group.WORLD
client = kvpool.Client(master)


def step(name: str) -> None:
    """Both ranks are past ``name``."""
    dist.barrier()
    print(f"ok {name}", flush=True)


def then_signal(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
    """``fn``, which sets ``key`` in the group's store once it returned."""
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        store.set(key, "1")
        return out
    return wrapped


def remove_pages(tokens: list, pages: slice) -> None:
    """Removes the pool's objects of ``pages`` of ``tokens``, named by
    SGLang's storage hashes of the pages (what the linker looks up)."""
    hashes = get_storage_hash_str(sglang_linker.key(tokens), None, page_size=PAGE)[pages]
    keys, _ = client.list_keys("", limit=10_000)
    gone = [k for k, _ in keys if any(h in k for h in hashes)]
    assert gone, f"objects of the pages {hashes}"
    assert all(client.batch_remove(gone, force=True))


def load(engine: Engine, rid: str, tokens: list) -> tuple:
    """Admits and runs a request on ``engine``: the tokens hit (the same on
    every rank), the requests whose KV did not land, and the slots loaded."""
    req, hit, dst = engine.admit(rid, tokens)
    failed = engine.forward([req]) if hit else []
    return hit, [r.rid for r in failed], dst


def prefilled(seed: int, pages: int) -> tuple:
    """The prefill engine computes a prompt of ``pages`` pages (the same rows
    on every rank, seeded alike) and offloads it; a fresh decode engine
    comes to load it. Returns the prompt, its slots and the decode engine."""
    torch.manual_seed(seed)
    tokens = prompt(seed, pages=pages)
    slots = prefill.compute(tokens)
    prefill.settle()
    decode = Engine(master, protocol, tp_group=group)
    engines.append(decode)
    return tokens, slots, decode


# SGLang builds its page-hash extension on first use, under a file lock
# that a second process may take for stale: rank 0 builds it alone.
if rank == 0:
    get_storage_hash_str(sglang_linker.key(prompt(0, pages=1)), None, page_size=PAGE)
dist.barrier()
prefill = Engine(master, protocol, tp_group=group)
engines = [prefill]

# Rank 0 alone offloads; every rank loads.
tokens, slots, decode = prefilled(1, 8)
assert prefill.linker.stats["offload"] == (1 if rank == 0 else 0), prefill.linker.stats
step("offloaded by rank 0 alone")
hit, failed, dst = load(decode, "all", tokens)
assert (hit, failed) == (8 * PAGE, []), (hit, failed)
assert same_kv(prefill, slots, decode, dst)
step("loaded on every rank")

# Rank 1 looks up after page 5 is gone (evicted, or its store lost), rank
# 0 before: every rank loads the five pages all of them found, never a
# prefix one rank lacks.
tokens, slots, decode = prefilled(2, 8)
if rank == 0:
    decode.linker.lookup = then_signal(decode.linker.lookup, "looked")
else:
    store.wait(["looked"])
    remove_pages(tokens, slice(5, 6))
hit, failed, dst = load(decode, "short", tokens)
assert (hit, failed) == (5 * PAGE, []), (hit, failed)
assert same_kv(prefill, slots[: 5 * PAGE], decode, dst)
step("a page gone for rank 1 cut the hit on every rank")

# Rank 0's load lands; rank 1 reads after the pages are gone and fails:
# the request is aborted on every rank, rank 0's included.
tokens, slots, decode = prefilled(3, 4)
req, hit, dst = decode.admit("gone", tokens)
assert hit == 4 * PAGE, hit
if rank == 0:
    decode.linker.load_layer_wise = then_signal(decode.linker.load_layer_wise, "loaded")
else:
    store.wait(["loaded"])
    remove_pages(tokens, slice(0, 4))
failed = decode.forward([req])
assert [r.rid for r in failed] == ["gone"], failed
step("a load failed on rank 1 aborted the request on every rank")

for engine in engines:
    engine.cache.linker.close()
client.close()
dist.barrier()
dist.destroy_process_group()
# Past here only teardown is left, in which C++ threads of torch's store
# (its server lives in rank 0, which may be gone) can abort the process
# ("terminate called without an active exception"): every check passed.
sys.stdout.flush()
os._exit(0)
