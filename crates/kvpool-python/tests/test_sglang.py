"""kvpool.sglang.KvpoolStore through SGLang 0.5.23's own backend factory,
with real (CPU) host memory pools: pages written by one instance are found
and read back byte-exact by another, on the zero-copy v1 path and the v0
path, for MHA and MLA layouts.

Runs when SGLang is installed (scripts/test-python.sh installs it);
KVPOOL_TEST_SGLANG=1 makes a missing SGLang a failure, =0 skips."""

from __future__ import annotations

import hashlib
import os
import signal
import time
import uuid

import pytest

from conftest import new_cluster, require_sglang

torch = require_sglang()

from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo, MLABufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

import kvpool  # noqa: E402

LAYERS, HEADS, HEAD_DIM, PAGE, TOKENS = 3, 2, 16, 4, 64
MODEL = "org/test-model"
KEY_PREFIX = "org-test-model"  # SGLang's config prefix: model name with "/" -> "-"


def standalone_config(store: str, *, mla: bool = False) -> HiCacheStorageConfig:
    """SGLang's standalone-storage mode: the engine attaches to the storage
    process at `store` (its data address) instead of lending memory."""
    c = storage_config("unused", mla=mla)
    extra = dict(c.extra_config)
    extra.pop("master_server_address")
    extra.update({"standalone_storage": True, "client_server_address": store})
    c.extra_config = extra
    return c


def storage_config(master: str, *, mla: bool, tp_rank: int = 0, tp_size: int = 1) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name=MODEL,
        extra_config={
            "backend_name": "kvpool",
            "module_path": "kvpool.sglang",
            "class_name": "KvpoolStore",
            "interface_v1": 1,
            "master_server_address": master,
            "global_segment_size": 0,
            "protocol": "tcp",
        },
    )


def mha_pool(layout: str = "page_first") -> MHATokenToKVPoolHost:
    k = tuple(torch.zeros(TOKENS, HEADS, HEAD_DIM) for _ in range(LAYERS))
    v = tuple(torch.zeros(TOKENS, HEADS, HEAD_DIM) for _ in range(LAYERS))
    info = MHABufferInfo(
        buffers=KVBuffers(
            k=k,
            v=v,
            k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
            v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
            layout=KVBufferLayout.NHD,
        ),
        page_size=PAGE,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    return MHATokenToKVPoolHost(
        info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS,
    )


def mla_pool(layout: str = "page_first") -> MLATokenToKVPoolHost:
    width = 24
    bufs = tuple(torch.zeros(TOKENS, 1, width) for _ in range(LAYERS))
    info = MLABufferInfo(
        buffers=bufs,
        data_ptrs=torch.tensor([t.data_ptr() for t in bufs], dtype=torch.uint64),
        layer_indices=tuple(range(LAYERS)),
        device_layer_num=LAYERS,
        page_size=PAGE,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        kv_cache_dim=width,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    return MLATokenToKVPoolHost(
        info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS, target_layer_num=LAYERS,
    )


def backend(config: HiCacheStorageConfig, pool) -> HiCacheStorage:
    """Built exactly as SGLang's cache controller builds it."""
    b = StorageBackendFactory.create_backend("dynamic", config, pool)
    b.register_mem_pool_host(pool)
    return b


def pair(master: str, src_pool, dst_pool, *, mla: bool) -> tuple:
    """A writer on ``src_pool`` and a reader on ``dst_pool``: two instances,
    as two servers sharing the pool."""
    return (backend(storage_config(master, mla=mla), src_pool),
            backend(storage_config(master, mla=mla), dst_pool))


def filled_mha_pair(master: str, seed: int) -> tuple:
    """Two MHA host pools, the first filled with seeded random KV, and a
    writer on it and a reader on the second (see :func:`pair`)."""
    src_pool, dst_pool = mha_pool(), mha_pool()
    torch.manual_seed(seed)
    src_pool.kv_buffer.copy_(torch.randn_like(src_pool.kv_buffer))
    return (src_pool, dst_pool, *pair(master, src_pool, dst_pool, mla=False))


def pages_round_trip(master: str, seed: int) -> None:
    """Three pages written by one instance are read back byte-exact by another."""
    src_pool, dst_pool, writer, reader = filled_mha_pair(master, seed)
    keys = page_keys(3)
    src_idx, dst_idx = pages(1, 3), pages(8, 3)
    assert writer.batch_set_v1(keys, src_idx) == [True] * 3
    assert reader.batch_get_v1(keys, dst_idx) == [True] * 3
    assert torch.equal(token_slice(dst_pool, dst_idx), token_slice(src_pool, src_idx))


def page_keys(n: int) -> list:
    salt = uuid.uuid4().hex
    return [hashlib.sha256(f"{salt}-{i}".encode()).hexdigest() for i in range(n)]


def pages(first_page: int, n: int) -> "torch.Tensor":
    return torch.arange(first_page * PAGE, (first_page + n) * PAGE, dtype=torch.int64)


def token_slice(pool, idx: "torch.Tensor") -> "torch.Tensor":
    """The host pool's data for these token slots (page_first layouts)."""
    if isinstance(pool, MLATokenToKVPoolHost):
        return pool.kv_buffer[idx].clone() if pool.layout != "layer_first" else pool.kv_buffer[:, idx].clone()
    return pool.kv_buffer[:, idx].clone()


@pytest.fixture
def kv(master):
    with kvpool.Client(master) as c:
        yield c


def test_backend_class_loads_through_the_factory(master):
    from kvpool.sglang import KvpoolStore

    pool = mha_pool()
    b = backend(storage_config(master, mla=False), pool)
    assert isinstance(b, HiCacheStorage)
    assert isinstance(getattr(b, "_backend", b), KvpoolStore)


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_v1_pages_round_trip_between_instances(master, kv, mla):
    make = mla_pool if mla else mha_pool
    src_pool, dst_pool = make(), make()
    torch.manual_seed(7)
    src_pool.kv_buffer.copy_(torch.randn_like(src_pool.kv_buffer))
    writer, reader = pair(master, src_pool, dst_pool, mla=mla)

    n = 5
    keys = page_keys(n)
    src_idx, dst_idx = pages(1, n), pages(8, n)
    assert reader.batch_exists(keys) == 0
    assert writer.batch_set_v1(keys, src_idx) == [True] * n
    assert writer.batch_set_v1(keys, src_idx) == [True] * n  # already stored: skipped
    assert reader.batch_exists(keys) == n

    # SGLang's key layout, seen through the plain client.
    suffixes = ["__k"] if mla else ["_0_k", "_0_v"]
    for key in keys:
        for sfx in suffixes:
            assert kv.exists(f"{KEY_PREFIX}_{key}{sfx}")

    assert reader.batch_get_v1(keys, dst_idx) == [True] * n
    assert torch.equal(token_slice(dst_pool, dst_idx), token_slice(src_pool, src_idx))

    # A missing page ends the prefix that exists.
    kv.remove(f"{KEY_PREFIX}_{keys[2]}{suffixes[-1]}", force=True)
    assert reader.batch_exists(keys) == 2
    got = reader.batch_get_v1(keys, dst_idx)
    assert got[:2] == [True, True] and got[2] is False


def test_mla_layer_first_uses_multi_buffer_calls(master, monkeypatch):
    from kvpool.mooncake import MooncakeDistributedStore

    calls = []
    for name in ("batch_put_from_multi_buffers", "batch_get_into_multi_buffers"):
        orig = getattr(MooncakeDistributedStore, name)

        def spy(self, *a, _orig=orig, _name=name, **kw):
            calls.append(_name)
            return _orig(self, *a, **kw)

        monkeypatch.setattr(MooncakeDistributedStore, name, spy)
    src_pool, dst_pool = mla_pool("layer_first"), mla_pool("layer_first")
    src_pool.kv_buffer.copy_(torch.randn_like(src_pool.kv_buffer))
    writer, reader = pair(master, src_pool, dst_pool, mla=True)
    keys = page_keys(3)
    src_idx, dst_idx = pages(2, 3), pages(10, 3)
    assert writer.batch_set_v1(keys, src_idx) == [True] * 3
    assert reader.batch_exists(keys) == 3
    assert reader.batch_get_v1(keys, dst_idx) == [True] * 3
    assert torch.equal(dst_pool.kv_buffer[:, dst_idx], src_pool.kv_buffer[:, src_idx])
    assert set(calls) == {"batch_put_from_multi_buffers", "batch_get_into_multi_buffers"}


def test_tensor_parallel_ranks_keep_separate_objects(master, kv):
    keys = page_keys(2)
    idx = pages(1, 2)
    data = {}
    for rank in (0, 1):
        pool = mha_pool()
        pool.kv_buffer.copy_(torch.full_like(pool.kv_buffer, float(rank + 1)))
        b = backend(storage_config(master, mla=False, tp_rank=rank, tp_size=2), pool)
        assert b.batch_set_v1(keys, idx) == [True, True]
        data[rank] = token_slice(pool, idx)
    for rank in (0, 1):
        assert kv.exists(f"{KEY_PREFIX}_{keys[0]}_{rank}_k")
        pool = mha_pool()
        b = backend(storage_config(master, mla=False, tp_rank=rank, tp_size=2), pool)
        assert b.batch_get_v1(keys, idx) == [True, True]
        assert torch.equal(token_slice(pool, idx), data[rank])


def test_v0_zero_copy_set_get(master):
    pool = mha_pool()
    b = backend(storage_config(master, mla=False), pool)
    src = torch.arange(256, dtype=torch.float32)
    dst = torch.zeros(256, dtype=torch.float32)
    key = page_keys(1)[0]
    assert b.set(key, target_location=src.data_ptr(), target_sizes=src.numel() * 4)
    assert b.exists(key)
    assert b.get(key, target_location=dst.data_ptr(), target_sizes=dst.numel() * 4)
    assert torch.equal(src, dst)
    keys = page_keys(2)
    assert b.batch_set(keys, target_locations=[src.data_ptr()] * 2, target_sizes=[1024, 1024])
    both = torch.zeros(512, dtype=torch.float32)
    # v0 batch_get counts whole MHA pages (k and v objects): two objects = one page.
    assert b.batch_get(keys, target_locations=[both.data_ptr(), both.data_ptr() + 1024], target_sizes=[1024, 1024]) == 1
    assert torch.equal(both[:256], src) and torch.equal(both[256:], src)


def test_a_secured_pool_needs_only_the_environment(secured_cluster, monkeypatch):
    """SGLang's own factory against a pool that requires a key: the key file
    in the environment is the whole change."""
    monkeypatch.setenv("KVPOOL_SECRET_FILE", secured_cluster.keys["client"])
    pages_round_trip(secured_cluster.master, 11)


def test_a_tls_pool_needs_only_the_environment(tls_cluster, monkeypatch):
    """SGLang's own factory against a pool with a key and TLS on every
    plane: the key file and the CA in the environment are the whole change."""
    monkeypatch.setenv("KVPOOL_SECRET_FILE", tls_cluster.keys["client"])
    monkeypatch.setenv("KVPOOL_TLS_CA", os.path.join(tls_cluster.tls_dir, "ca.pem"))
    pages_round_trip(tls_cluster.master, 12)


def test_standalone_storage_mode(cluster, kv):
    """SGLang's Mooncake backend with standalone_storage: each engine (a
    backend instance) attaches to the long-lived storage process through
    setup_dummy; pages one engine wrote are read by the next, which is what
    an engine restart looks like; the pages live on that store's segment."""
    from kvpool.sglang import KvpoolHostTensorAllocator, KvpoolStore
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeHostTensorAllocator

    endpoint = cluster.store_endpoint()
    src_pool, dst_pool = mha_pool(), mha_pool()
    torch.manual_seed(21)
    src_pool.kv_buffer.copy_(torch.randn_like(src_pool.kv_buffer))
    writer = backend(standalone_config(endpoint), src_pool)
    inner = getattr(writer, "_backend", writer)
    assert isinstance(inner, KvpoolStore)
    assert inner.store._prefer == [endpoint], "puts go to the storage process"
    assert inner.store._settings["global_segment_size"] == 0, "the engine lends nothing"
    keys = page_keys(4)
    src_idx, dst_idx = pages(1, 4), pages(9, 4)
    assert writer.batch_set_v1(keys, src_idx) == [True] * 4
    inner.close()
    # A new engine, as after a restart, finds the pages.
    reader = backend(standalone_config(endpoint), dst_pool)
    assert reader.batch_exists(keys) == 4
    assert reader.batch_get_v1(keys, dst_idx) == [True] * 4
    assert torch.equal(token_slice(dst_pool, dst_idx), token_slice(src_pool, src_idx))
    store = getattr(reader, "_backend", reader).store
    first = f"{KEY_PREFIX}_{keys[0]}_0_k"
    names = [d.get_memory_descriptor().buffer_descriptor.transport_endpoint for d in store.get_replica_desc(first)]
    assert names == [endpoint]
    # The host-pool allocator SGLang's standalone check asks for.
    alloc = KvpoolHostTensorAllocator()
    assert isinstance(alloc, MooncakeHostTensorAllocator)
    t = alloc.allocate((4, 8), torch.bfloat16)
    assert t.shape == (4, 8) and t.dtype == torch.bfloat16 and int(t.float().abs().sum()) == 0


def test_pages_on_the_disk_tier_round_trip(disk_cluster):
    """SGLang's own factory against a store whose memory holds a small
    fraction of what is written: the rest is read back from its disk tier."""
    src_pool, dst_pool, writer, reader = filled_mha_pair(disk_cluster.master, 13)
    rounds = 64
    keys = page_keys(rounds * 4)
    src_idx = pages(0, 4)
    with kvpool.Client(disk_cluster.master) as c:
        for r in range(rounds):
            assert writer.batch_set_v1(keys[r * 4:(r + 1) * 4], src_idx) == [True] * 4
            deadline = time.time() + 20
            while time.time() < deadline:
                mem = [x for x in c.status()["segments"] if x["tier"] == "memory"][0]
                if mem["used"] <= 0.6 * mem["size"]:
                    break
                time.sleep(0.02)
        assert c.status()["demotions"] > 0
    for r in range(rounds):
        dst_idx = pages(8, 4)
        assert reader.batch_get_v1(keys[r * 4:(r + 1) * 4], dst_idx) == [True] * 4
        assert torch.equal(token_slice(dst_pool, dst_idx), token_slice(src_pool, src_idx))


def test_a_silent_master_costs_hicache_a_miss_not_a_wait():
    """While the master does not answer, HiCache's lookups miss and its reads
    and writes fail at once; once it answers again, the pages are there.
    Without the check each call waits out the client's retries (about 10 s)
    on HiCache's prefetch and backup threads."""
    pool = new_cluster(store_size="64MiB")
    try:
        src_pool, dst_pool, writer, reader = filled_mha_pair(pool.master, 17)
        keys = page_keys(4)
        src_idx, dst_idx = pages(1, 4), pages(8, 4)
        assert writer.batch_set_v1(keys, src_idx) == [True] * 4

        pool.master_proc.send_signal(signal.SIGSTOP)
        stores = [getattr(b, "_backend", b) for b in (writer, reader)]
        deadline = time.monotonic() + 10
        while any(s.reachable() for s in stores):
            assert time.monotonic() < deadline, "the backends did not notice the paused master"
            time.sleep(0.05)
        started = time.monotonic()
        assert reader.batch_exists(keys) == 0
        assert reader.batch_get_v1(keys, dst_idx) == [False] * 4
        assert writer.batch_set_v1(page_keys(2), pages(1, 2)) == [False] * 2
        # Three calls, each of which would wait about 10 s without the check.
        assert time.monotonic() - started < 5

        pool.master_proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while not all(s.reachable() for s in stores):
            assert time.monotonic() < deadline, "the backends did not hear from the master again"
            time.sleep(0.05)
        assert reader.batch_exists(keys) == 4
        assert reader.batch_get_v1(keys, dst_idx) == [True] * 4
        assert torch.equal(token_slice(dst_pool, dst_idx), token_slice(src_pool, src_idx))
    finally:
        pool.master_proc.send_signal(signal.SIGCONT)
        pool.stop()
