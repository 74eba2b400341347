"""SGLang 0.5.23's direct external linker (``UnifiedCacheLinker``: device pools
to the pool, no host tier) on kvpool's ``KvpoolLinker``, driven by SGLang's own
code: the server args name the linker as ``--unified-cache-external-linker-backend
dynamic`` does, SGLang's ``create_unified_radix_cache`` builds the radix cache
and loads the linker through its factory, and the tree's own calls
(``insert`` -> offload, ``match_prefix`` -> lookup, ``init_load_back`` -> load,
``ready_to_load_host_cache`` -> start, the pool's per-layer wait, then
``finish_external_linker_loads``) move real KV pages between two engines'
device pools (CPU tensors, a DeepSeek sparse-attention pool of 3 layers:
latent KV per token plus indexer rows per page) through a real pool.

Runs when SGLang is installed (scripts/test-python.sh installs it);
KVPOOL_TEST_SGLANG=1 makes a missing SGLang a failure, =0 skips."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import Cluster, free_port, load_bench_script, new_cluster, require_sglang

require_sglang()

import kvpool  # noqa: E402
from kvpool.sglang import KvpoolLinker  # noqa: E402

#: The engines (``Engine``) are the linker benchmark's (bench/sglang_linker.py).
linker_bench = load_bench_script("sglang_linker")
Engine, PAGE, prompt, same_kv = linker_bench.Engine, linker_bench.PAGE, linker_bench.prompt, linker_bench.same_kv
TP_PEER = Path(__file__).with_name("linker_tp_peer.py")


def offload_then_load(prefill: Engine, decode: Engine, tokens: list, rid: str) -> None:
    """``prefill`` computes ``tokens`` and offloads them; ``decode`` hits all
    of them in the pool and loads them byte for byte."""
    slots = prefill.compute(tokens)
    prefill.settle()
    req, hit, dst = decode.admit(rid, tokens)
    assert hit == len(tokens)
    assert decode.forward([req]) == []
    assert same_kv(prefill, slots, decode, dst)


def queued_hit(pool: Cluster, seed: int, pages: int, rid: str) -> tuple:
    """A prefill engine computes and offloads a prompt of ``pages`` pages; a
    decode engine matches all of it in the pool and queues its load.
    Returns both engines, the request, and the prompt's slots in each."""
    prefill, decode = Engine(pool.master), Engine(pool.master)
    tokens = prompt(seed, pages)
    slots = prefill.compute(tokens)
    prefill.settle()
    req, hit, dst = decode.admit(rid, tokens)
    assert hit == pages * PAGE
    return prefill, decode, req, slots, dst


@pytest.fixture
def pool() -> Iterator[Cluster]:
    """A pool of this test's own, which it may kill parts of."""
    c = new_cluster(store_size="128MiB")
    yield c
    c.stop()


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_pages_one_engine_offloads_load_into_another_byte_exact(pool: Cluster, protocol: str) -> None:
    prefill = Engine(pool.master, protocol)
    assert isinstance(prefill.linker, KvpoolLinker)
    tokens = prompt(1, pages=8)
    slots = prefill.compute(tokens)
    prefill.settle()
    assert prefill.linker.stats["offload"] == 1

    # A second engine (another replica, or this one after a restart) gets the
    # same prompt and a few tokens more: the 8 full pages are a pool hit.
    other = Engine(pool.master, protocol)
    req, hit, dst = other.admit("r1", tokens + [7, 8, 9])
    assert hit == 8 * PAGE and dst is not None and len(dst) == hit
    assert not same_kv(prefill, slots, other, dst)  # nothing there before the load
    assert other.forward([req]) == []
    assert same_kv(prefill, slots, other, dst)
    assert other.linker.stats == {"lookup": 1, "load": 1, "offload": 0}

    # A prompt that shares 5 pages and then diverges hits exactly those.
    third = Engine(pool.master, protocol)
    req, hit, dst = third.admit("r2", tokens[: 5 * PAGE] + prompt(2, pages=3))
    assert hit == 5 * PAGE
    assert third.forward([req]) == []
    assert same_kv(prefill, slots[: 5 * PAGE], third, dst)

    # Two requests in one batch load in one read, each into its own slots.
    fourth = Engine(pool.master, protocol)
    more = prompt(3, pages=4)
    more_slots = prefill.compute(more)
    prefill.settle()
    a, hit_a, dst_a = fourth.admit("a", tokens)
    b, hit_b, dst_b = fourth.admit("b", more)
    assert (hit_a, hit_b) == (8 * PAGE, 4 * PAGE)
    assert fourth.forward([a, b]) == []
    assert same_kv(prefill, slots, fourth, dst_a) and same_kv(prefill, more_slots, fourth, dst_b)
    for engine in (prefill, other, third, fourth):
        engine.cache.linker.close()


def test_pages_a_lookup_found_stay_until_their_load(pool: Cluster) -> None:
    prefill, decode, req, slots, dst = queued_hit(pool, 4, pages=4, rid="r")
    # The lookup took read leases, as Mooncake's does: a removal (an
    # operator's, or eviction) between the lookup and the load skips them.
    c = kvpool.Client(pool.master)
    try:
        assert c.remove_all() == 0
    finally:
        c.close()
    assert decode.forward([req]) == []
    assert same_kv(prefill, slots, decode, dst)
    prefill.cache.linker.close()
    decode.cache.linker.close()


def test_a_load_from_a_dead_store_aborts_its_requests_and_the_linker_goes_on(pool: Cluster) -> None:
    prefill, decode, req, _, _ = queued_hit(pool, 5, pages=4, rid="lost")
    store = pool.procs[-1]
    store.kill()  # the store holding the pages dies between lookup and load
    store.wait()
    failed = decode.forward([req])  # every layer wait returns; nothing raises
    assert failed == [req]
    assert req.skip_radix_cache_insert
    assert "External KV cache load failed" in str(req.discard_output_reason.message)

    # A new store: the same linkers offload and load again, once the
    # master places pages on it rather than on the dead one.
    pool.start_store("128MiB")
    deadline, attempt = time.monotonic() + 30, 0
    while prefill.linker.stats["offload"] < 2:
        assert time.monotonic() < deadline, pool.logs()
        attempt += 1
        prefill.compute(prompt(100 + attempt, pages=1))
        prefill.settle()
    offload_then_load(prefill, decode, prompt(6, pages=2), "next")
    prefill.cache.linker.close()
    decode.cache.linker.close()


def test_a_queued_load_is_cancelled_with_its_request(pool: Cluster) -> None:
    prefill, decode, _, _, _ = queued_hit(pool, 6, pages=3, rid="aborted")
    decode.cache.linker.release_request("aborted")  # the scheduler's abort
    assert decode.linker.pending_loads == {} and decode.cache.linker.inflight_load_rids == []
    assert decode.cache.ready_to_load_host_cache() == -1  # nothing left to start
    assert decode.linker.stats["load"] == 0
    prefill.cache.linker.close()
    decode.cache.linker.close()


@pytest.mark.parametrize("fault", ["killed", "paused"])
def test_a_silent_master_turns_lookups_into_misses_and_transfers_into_failures_at_once(
    pool: Cluster, fault: str
) -> None:
    prefill = Engine(pool.master)
    tokens = prompt(9, pages=2)
    prefill.compute(tokens)
    prefill.settle()
    decode = Engine(pool.master)

    if fault == "killed":
        pool.kill_master()
    else:
        pool.master_proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while prefill.linker.storage.reachable() or decode.linker.storage.reachable():
        assert time.monotonic() < deadline, f"the linkers did not notice the master {fault}"
        time.sleep(0.05)
    # Without that check each of these waits out the client's
    # retries (about 10 s per call) on the scheduler's thread.
    req, hit, _ = decode.admit("while-down", tokens)
    assert hit == 0  # a miss: the engine computes the prompt itself
    prefill.compute(prompt(10, pages=2))
    prefill.settle(timeout=5.0)  # the offload failed at once
    assert prefill.linker.stats["offload"] == 1  # only the one from before

    if fault == "killed":
        pool.start_master()
        pool.wait_segments(1)
    else:
        pool.master_proc.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 10
    while not (prefill.linker.storage.reachable() and decode.linker.storage.reachable()):
        assert time.monotonic() < deadline, "the linkers did not hear from the master again"
        time.sleep(0.05)
    offload_then_load(prefill, decode, prompt(11, pages=2), "after")
    prefill.cache.linker.close()
    decode.cache.linker.close()


def test_reset_and_close_wait_for_transfers_in_flight(pool: Cluster) -> None:
    engine = Engine(pool.master)
    engine.compute(prompt(8, pages=8))
    engine.cache.reset()  # SGLang's flush_cache: quiesces the linker first
    assert engine.linker.offload_queue.unfinished_tasks == 0
    assert engine.linker.num_completed_offloads() == 0 and engine.cache.linker.pending_offloads == []
    engine.cache.linker.close()
    assert not engine.linker.load_thread.is_alive() and not engine.linker.offload_thread.is_alive()


def test_two_tensor_parallel_ranks_share_pages_and_agree_on_hits_and_failures(pool: Cluster) -> None:
    # Two ranks, each a process with the ranks' gloo group as SGLang's
    # tp_cache_group (linker_tp_peer.py): pages offloaded by rank 0 alone and
    # loaded on both; a page gone before rank 1's lookup (after rank 0's)
    # cutting the hit on both; a load failed on rank 1 (rank 0's landed)
    # aborting the request on both.
    port = free_port()
    peers = [
        subprocess.Popen(
            [sys.executable, str(TP_PEER), str(rank), str(port), pool.master, "tcp"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for rank in range(2)
    ]
    outs = []
    for p in peers:
        try:
            outs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in peers:
                q.kill()
            raise
    both = "\n".join(f"--- rank {rank}:\n{out[-3000:]}" for rank, out in enumerate(outs))
    for rank, (p, out) in enumerate(zip(peers, outs)):
        assert p.returncode == 0, f"rank {rank} failed\n{both}"
        assert [line for line in out.splitlines() if line.startswith("ok ")] == [
            "ok offloaded by rank 0 alone",
            "ok loaded on every rank",
            "ok a page gone for rank 1 cut the hit on every rank",
            "ok a load failed on rank 1 aborted the request on every rank",
        ], both
