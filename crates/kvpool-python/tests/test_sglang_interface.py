"""Each method of SGLang 0.5.23's HiCache storage-backend interface on kvpool, against
a real pool: SGLang's own Mooncake backend tests run unchanged on kvpool; the
v2 family for hybrid models (KV + Mamba / SWA / draft / indexer pools, per-pool
hit policies, partial hits) round-trips byte-exact through a host pool group
registered the way SGLang's hybrid cache controller registers it; the MHA and
MLA host layouts SGLang's Mooncake backend accepts move zero-copy; the external L3
layout description names the objects that are really stored; the unified key
scheme's keys and page blocks work on kvpool's zero-copy calls.

Runs when SGLang is installed (scripts/test-python.sh installs it);
KVPOOL_TEST_SGLANG=1 makes a missing SGLang a failure, =0 skips."""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple

import pytest

from conftest import require_sglang

torch = require_sglang()

from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout,
    KVBuffers,
    MambaStateBufferInfo,
    MHABufferInfo,
)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
    SidecarPoolSpec,
    count_pool_hits,
)
from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

import kvpool  # noqa: E402
from kvpool import mooncake as kvpool_mooncake  # noqa: E402
from kvpool.sglang import KvpoolStore  # noqa: E402
from test_sglang import KEY_PREFIX, backend, mla_pool, page_keys, pages, pair, storage_config  # noqa: E402

LAYERS, HEADS, HEAD_DIM, PAGE, TOKENS = 3, 2, 16, 4, 64

#: The four configurations SGLang's test_mooncake_store.py runs in its __main__.
SGLANG_BATCH_CONFIGS = [(False, 0, 1), (True, 0, 1), (False, 1, 4), (True, 3, 8)]


# ---------------------------------------------------------------- helpers


def mha_host(layout: str = "page_first", heads: int = HEADS, v_head_dim: int = HEAD_DIM,
             head_group_num: int = 1) -> MHATokenToKVPoolHost:
    """A real SGLang MHA host pool (CPU) of ``heads`` kv heads (page_unified:
    cut into ``head_group_num`` head groups)."""
    from sglang.srt.mem_cache.pool_host.mha import get_mha_host_pool_cls

    k = tuple(torch.zeros(TOKENS, heads, HEAD_DIM) for _ in range(LAYERS))
    v = tuple(torch.zeros(TOKENS, heads, v_head_dim) for _ in range(LAYERS))
    info = MHABufferInfo(
        buffers=KVBuffers(
            k=k,
            v=v,
            k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
            v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
            layout=KVBufferLayout.NHD,
        ),
        page_size=PAGE,
        head_num=heads,
        head_dim=HEAD_DIM,
        v_head_dim=v_head_dim,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    cls = get_mha_host_pool_cls(info)
    return cls(
        info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS, head_group_num=head_group_num,
    )


def mamba_host() -> MambaPoolHost:
    """A real SGLang Mamba state host pool (CPU): a temporal state and two
    conv states per layer, one slot per page."""
    slots = 8
    info = MambaStateBufferInfo(
        temporal=torch.zeros(2, slots, 3, 4),
        conv=(torch.zeros(2, slots, 5, 2), torch.zeros(2, slots, 6)),
    )
    return MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, device="cpu", layout="page_first")


def fill_random(pool: Any, seed: int) -> None:
    """Random bytes in every host buffer of ``pool``."""
    g = torch.Generator().manual_seed(seed)
    # page_unified blocks hold K and V together: kv_buffer is the whole pool.
    whole = not hasattr(pool, "get_hybrid_pool_buffer") or getattr(pool, "layout", "") == "page_unified"
    bufs = [pool.kv_buffer] if whole else pool.get_hybrid_pool_buffer()
    for b in bufs:
        b.copy_(torch.randn(b.shape, generator=g).to(b.dtype))


def mha_page(pool: MHATokenToKVPoolHost, first_token: int) -> "torch.Tensor":
    """One page of an MHA host pool, whatever its layout (K and V)."""
    return pool.get_data_page(first_token, flat=True).clone()


def mamba_slot(pool: MambaPoolHost, slot: int) -> "torch.Tensor":
    """All state of one Mamba slot."""
    return pool.get_data_page(slot, flat=True).clone()


def attach(config: HiCacheStorageConfig, kv_pool: Any, side: Dict[PoolName, Any]) -> Any:
    """Attaches kvpool the way SGLang's HybridCacheController does: the
    factory and ``register_mem_pool_host`` get the group's anchor (KV) pool,
    ``register_mem_host_pool_v2`` every entry of the group, then
    ``on_host_pools_registered`` once."""
    entries = [PoolEntry(name=PoolName.KV, host_pool=kv_pool, device_pool=None,
                         layer_mapper=lambda i: i, is_primary_index_anchor=True)]
    entries += [PoolEntry(name=n, host_pool=p, device_pool=None, layer_mapper=lambda i: i) for n, p in side.items()]
    group = HostPoolGroup(entries)
    anchor = group.anchor_entry.host_pool
    b = StorageBackendFactory.create_backend("dynamic", config, anchor)
    b.register_mem_pool_host(anchor)
    for e in group.entries:
        b.register_mem_host_pool_v2(e.host_pool, e.name)
    b.on_host_pools_registered()
    return b


def inner(b: Any) -> KvpoolStore:
    """The KvpoolStore behind SGLang's (optional) failure-injector wrapper."""
    s = getattr(b, "_backend", b)
    assert isinstance(s, KvpoolStore)
    return s


class Calls:
    """Records the kvpool.mooncake calls SGLang's backend makes: name, keys,
    buffer pointers, sizes."""

    def __init__(self) -> None:
        self.log: List[Tuple[str, List[str], List[Any], List[Any]]] = []

    def keys(self, *names: str) -> List[str]:
        """Every key passed to the named calls."""
        return [k for n, ks, _, _ in self.log if n in names for k in ks]

    def ranges(self, *names: str) -> List[Tuple[int, int]]:
        """Every (pointer, size) buffer passed to the named calls."""
        out = []
        for n, _, ptrs, sizes in self.log:
            if n not in names:
                continue
            for p, s in zip(ptrs, sizes):
                ps = p if isinstance(p, (list, tuple)) else [p]
                ss = s if isinstance(s, (list, tuple)) else [s]
                out += [(int(a), int(b)) for a, b in zip(ps, ss)]
        return out


ZERO_COPY = ("batch_put_from", "batch_get_into", "batch_put_from_multi_buffers", "batch_get_into_multi_buffers")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Spies on kvpool.mooncake.MooncakeDistributedStore's zero-copy and
    existence calls."""
    rec = Calls()
    for name in ZERO_COPY + ("batch_is_exist",):
        orig = getattr(kvpool_mooncake.MooncakeDistributedStore, name)

        def spy(self: Any, keys: List[str], *a: Any, _orig: Callable = orig, _name: str = name, **kw: Any) -> Any:
            ptrs = list(a[0]) if a else []
            sizes = list(a[1]) if len(a) > 1 else []
            rec.log.append((_name, list(keys), ptrs, sizes))
            return _orig(self, keys, *a, **kw)

        monkeypatch.setattr(kvpool_mooncake.MooncakeDistributedStore, name, spy)
    return rec


def within(ranges: Sequence[Tuple[int, int]], tensors: Sequence["torch.Tensor"]) -> bool:
    """Whether every (pointer, size) lies inside one of ``tensors``: the
    backend handed kvpool the host pool's own memory, no staging copy."""
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors]
    return bool(ranges) and all(any(a <= p and p + n <= b for a, b in spans) for p, n in ranges)


@pytest.fixture
def kv(master: str) -> Iterator[kvpool.Client]:
    """A plain kvpool client on the session pool, to look at stored objects."""
    with kvpool.Client(master) as c:
        yield c


# ------------------------------------------- SGLang's own backend tests


@pytest.fixture
def sglang_mooncake_env(monkeypatch: pytest.MonkeyPatch, master: str) -> None:
    """The environment SGLang's test_mooncake_store.py expects: its
    MooncakeStore(config) reads the Mooncake settings from MOONCAKE_* env
    vars (config has no extra_config). Here they name the kvpool master."""
    for name in ("SGLANG_HICACHE_MOONCAKE_CONFIG_PATH", "MOONCAKE_CLIENT", "MOONCAKE_STANDALONE_STORAGE",
                 "MOONCAKE_CHECK_SERVER", "MOONCAKE_TENANT_ID", "MOONCAKE_ENABLE_SSD_OFFLOAD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MOONCAKE_MASTER", master)
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "0")
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")


@pytest.fixture(params=["KvpoolStore", "mooncake.store"])
def sglang_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, sglang_mooncake_env: None,
                 calls: Calls) -> Any:
    """SGLang's own test module (sglang/srt/mem_cache/storage/mooncake_store/
    test_mooncake_store.py), unchanged, pointed at kvpool in one of two ways:

    - ``KvpoolStore``: its ``MooncakeStore`` name resolves to KvpoolStore
      (SGLang's class with kvpool's store class, what the dynamic backend loads);
    - ``mooncake.store``: SGLang's own ``MooncakeStore`` runs as is, with the
      ``mooncake.store`` module resolved to ``kvpool.mooncake`` (what
      ``--hicache-storage-backend mooncake`` would use with kvpool installed
      as the mooncake module)."""
    from sglang.srt.mem_cache.storage.mooncake_store import test_mooncake_store as mod

    if request.param == "KvpoolStore":
        monkeypatch.setattr(mod, "MooncakeStore", KvpoolStore)
    else:
        monkeypatch.setitem(sys.modules, "mooncake.store", kvpool_mooncake)
    return mod


def test_sglang_single_operation_runs_on_kvpool(sglang_tests: Any, calls: Calls, kv: kvpool.Client) -> None:
    """SGLang's test_single_operation (set / exists / get of one page, compared
    with torch.allclose) passes, and its object is in the kvpool pool."""
    sglang_tests.test_single_operation()
    written = calls.keys("batch_put_from")
    assert len(written) == 1, calls.log
    assert kv.exists(written[0]), "the page went to kvpool"


@pytest.mark.parametrize("mla,tp_rank,tp_size", SGLANG_BATCH_CONFIGS,
                         ids=[f"{'mla' if m else 'mha'}-tp{r}of{s}" for m, r, s in SGLANG_BATCH_CONFIGS])
def test_sglang_batch_operation_runs_on_kvpool(sglang_tests: Any, calls: Calls, kv: kvpool.Client,
                                               mla: bool, tp_rank: int, tp_size: int) -> None:
    """SGLang's test_batch_operation (13 pages through batch_set_v1 /
    batch_exists / batch_get_v1, compared page by page) passes for each of
    the configurations its __main__ runs; the objects are kvpool's, named
    with SGLang's rank suffixes."""
    config = sglang_tests.make_hicache_storage_config(is_mla_model=mla, tp_rank=tp_rank, tp_size=tp_size)
    sglang_tests.test_batch_operation(config)
    written = calls.keys("batch_put_from")
    assert len(written) == 13 * (1 if mla else 2)
    suffixes = ("__k",) if mla else (f"_{tp_rank}_k", f"_{tp_rank}_v")
    assert all(k.endswith(suffixes) for k in written), written[:4]
    assert all(kv.exists(k) for k in written)
    assert len(calls.keys("batch_get_into")) == len(written)


# --------------------------------------------- v2 family: hybrid models


def test_mamba_hybrid_round_trip_with_trailing_hits(master: str, kv: kvpool.Client, calls: Calls) -> None:
    """A hybrid (attention + Mamba) model: KV pages on the v1 path, the Mamba
    state of the last page of each stored prefix through batch_set_v2; a
    second engine finds the restorable prefixes through batch_exists_v2 with
    a TRAILING_PAGES Mamba transfer and loads KV and state byte-exact."""
    kv_src, mamba_src = mha_host(), mamba_host()
    fill_random(kv_src, 1)
    fill_random(mamba_src, 2)
    writer = attach(storage_config(master, mla=False), kv_src, {PoolName.MAMBA: mamba_src})
    kv_dst, mamba_dst = mha_host(), mamba_host()
    reader = attach(storage_config(master, mla=False), kv_dst, {PoolName.MAMBA: mamba_dst})

    n = 5
    keys = page_keys(n)
    assert writer.batch_set_v1(keys, pages(1, n)) == [True] * n
    # Two offloaded nodes end after page 3 and after page 5: a state each
    # (host slots 3 and 6), as two backups (the second with SGLang's extra info).
    written = writer.batch_set_v2(
        [PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([3]), keys=[keys[2]])])
    assert written == {PoolName.MAMBA: [True]}
    written = writer.batch_set_v2(
        [PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([6]), keys=[keys[4]])],
        HiCacheStorageExtraInfo(prefix_keys=keys[:4], extra_info={"session_id": "s1"}),
    )
    assert written == {PoolName.MAMBA: [True]}

    # Mooncake's Mamba object names: temporal, then one per conv state.
    for sfx in ("_0_temporal", "_0_conv_0", "_0_conv_1"):
        assert kv.exists(f"{KEY_PREFIX}_{keys[2]}{sfx}")
    assert not kv.exists(f"{KEY_PREFIX}_{keys[3]}_0_temporal")

    probe = [PoolTransfer(name=PoolName.MAMBA, keys=[keys[-1]], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    hit = reader.batch_exists_v2(keys, probe, HiCacheStorageExtraInfo())
    assert isinstance(hit, PoolTransferResult)
    assert hit.kv_hit_pages == 5
    assert hit.extra_pool_hit_pages == {PoolName.KV: 5, PoolName.MAMBA: 5}
    assert hit.restorable_prefix_pages == [3, 5]

    # Losing one conv object of the last state leaves the earlier stop point.
    kv.remove(f"{KEY_PREFIX}_{keys[4]}_0_conv_1", force=True)
    hit = reader.batch_exists_v2(keys, probe)
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (3, [3])
    assert hit.extra_pool_hit_pages[PoolName.MAMBA] == 3

    # Load the hit: KV pages on v1, the state of page 3 through batch_get_v2.
    dst = pages(10, 3)
    assert reader.batch_get_v1(keys[:3], dst) == [True] * 3
    got = reader.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([1]), keys=[keys[2]])])
    assert got == {PoolName.MAMBA: [True]}
    for i in range(3):
        assert torch.equal(mha_page(kv_dst, (10 + i) * PAGE), mha_page(kv_src, (1 + i) * PAGE))
    assert torch.equal(mamba_slot(mamba_dst, 1), mamba_slot(mamba_src, 3))
    # The damaged state reads as a failure, not as data.
    got = reader.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([2]), keys=[keys[4]])])
    assert got == {PoolName.MAMBA: [False]}
    assert count_pool_hits(got) == {PoolName.MAMBA: 0}

    # Zero-copy: every buffer kvpool got lies in the host pools' own tensors.
    host = [kv_src.kv_buffer, kv_dst.kv_buffer, *mamba_src.get_hybrid_pool_buffer(),
            *mamba_dst.get_hybrid_pool_buffer()]
    assert within(calls.ranges(*ZERO_COPY), host)


def test_swa_and_all_pages_pools_fold_into_one_hit(master: str, kv: kvpool.Client) -> None:
    """Two side pools in one query: an SWA pool (TRAILING_PAGES, a window of
    two pages) and a draft pool (ALL_PAGES). Each pool reports its own
    boundary, the usable prefix is what every pool can serve, and per-pool
    get/set results come back per page."""
    kv_src, swa_src, draft_src = mha_host(), mha_host(), mha_host()
    for i, p in enumerate((kv_src, swa_src, draft_src)):
        fill_random(p, 10 + i)
    side_src = {PoolName.SWA: swa_src, PoolName.DRAFT: draft_src}
    writer = attach(storage_config(master, mla=False), kv_src, side_src)
    kv_dst, swa_dst, draft_dst = mha_host(), mha_host(), mha_host()
    reader = attach(storage_config(master, mla=False), kv_dst, {PoolName.SWA: swa_dst, PoolName.DRAFT: draft_dst})

    n = 6
    keys = page_keys(n)
    src = pages(1, n)
    assert writer.batch_set_v1(keys, src) == [True] * n
    res = writer.batch_set_v2([
        PoolTransfer(name=PoolName.DRAFT, host_indices=src, keys=keys),
        # The SWA window of the node ending at page 6: its last two pages.
        PoolTransfer(name=PoolName.SWA, host_indices=pages(5, 2), keys=keys[4:]),
    ])
    assert res == {PoolName.DRAFT: [True] * n, PoolName.SWA: [True, True]}
    # Again: everything exists, nothing is rewritten, all succeed.
    assert writer.batch_set_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=src, keys=keys)]) == {
        PoolName.DRAFT: [True] * n}
    for sfx in ("_0_draft_k", "_0_draft_v"):
        assert kv.exists(f"{KEY_PREFIX}_{keys[0]}{sfx}")
    for sfx in ("_0_swa_k", "_0_swa_v"):
        assert kv.exists(f"{KEY_PREFIX}_{keys[5]}{sfx}")

    def probe() -> List[PoolTransfer]:
        return [
            PoolTransfer(name=PoolName.SWA, keys=keys[-2:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
            PoolTransfer(name=PoolName.DRAFT, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES),
        ]

    hit = reader.batch_exists_v2(keys, probe())
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (6, [6])
    assert hit.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.SWA: 6, PoolName.DRAFT: 6}

    # A draft page missing in the middle cuts the draft pool at page 3, and
    # the SWA window ending there was never stored: no usable prefix.
    kv.remove(f"{KEY_PREFIX}_{keys[3]}_0_draft_v", force=True)
    hit = reader.batch_exists_v2(keys, probe())
    assert hit.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.SWA: 6, PoolName.DRAFT: 3}
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (0, [])

    # Loads: per pool, per page; the missing draft page fails alone.
    dst = pages(12, n)
    assert reader.batch_get_v1(keys, dst) == [True] * n
    got = reader.batch_get_v2([
        PoolTransfer(name=PoolName.DRAFT, host_indices=dst, keys=keys),
        PoolTransfer(name=PoolName.SWA, host_indices=pages(20, 2), keys=keys[4:]),
    ])
    assert got == {PoolName.DRAFT: [True, True, True, False, True, True], PoolName.SWA: [True, True]}
    assert count_pool_hits(got) == {PoolName.DRAFT: 3, PoolName.SWA: 2}
    for i in range(n):
        assert torch.equal(mha_page(kv_dst, (12 + i) * PAGE), mha_page(kv_src, (1 + i) * PAGE))
        if i != 3:
            assert torch.equal(mha_page(draft_dst, (12 + i) * PAGE), mha_page(draft_src, (1 + i) * PAGE))
    for i in range(2):
        assert torch.equal(mha_page(swa_dst, (20 + i) * PAGE), mha_page(swa_src, (5 + i) * PAGE))


def test_mla_sidecars_and_the_l3_layout(master: str, kv: kvpool.Client) -> None:
    """An MLA model with an indexer-style page-packed pool (ALL_PAGES) and an
    SWA pool (TRAILING_PAGES): describe_l3_object_layout is enabled and its
    suffixes are exactly the objects kvpool holds for a page."""
    kv_src, idx_src, swa_src = mla_pool(), mla_pool(), mla_pool()
    for i, p in enumerate((kv_src, idx_src, swa_src)):
        fill_random(p, 20 + i)
    side = {PoolName.INDEXER: idx_src, PoolName.SWA: swa_src}
    writer = attach(storage_config(master, mla=True), kv_src, side)
    n = 4
    keys = page_keys(n)
    src = pages(2, n)
    assert writer.batch_set_v1(keys, src) == [True] * n
    assert writer.batch_set_v2([
        PoolTransfer(name=PoolName.INDEXER, host_indices=src, keys=keys),
        PoolTransfer(name=PoolName.SWA, host_indices=pages(5, 1), keys=keys[-1:]),
    ]) == {PoolName.INDEXER: [True] * n, PoolName.SWA: [True]}

    layout = inner(writer).describe_l3_object_layout(
        sidecar_pool_specs=[SidecarPoolSpec(PoolName.INDEXER, PoolName.KV)],
        swa_trailing_pages=1,
        page_size=PAGE,
    )
    assert layout["enabled"] is True, layout
    obj = layout["hicache_object_layout"]
    assert obj["key_prefix"] == KEY_PREFIX and obj["is_mla_backend"] is True
    pools = {p["pool"]: p for p in obj["pools"]}
    assert set(pools) == {"kv", "indexer", "swa"}
    assert pools["kv"]["hit_policy"] == "all_pages" and pools["indexer"]["hit_policy"] == "all_pages"
    assert pools["swa"]["hit_policy"] == "trailing_pages" and pools["swa"]["trailing_pages"] == 1
    # An external reader following the layout finds every object.
    for p in ("kv", "indexer"):
        for key in keys:
            for sfx in pools[p]["suffixes"]:
                assert kv.exists(f"{obj['key_prefix']}_{key}{sfx}"), (p, sfx)
    for sfx in pools["swa"]["suffixes"]:
        assert kv.exists(f"{obj['key_prefix']}_{keys[-1]}{sfx}")

    kv_dst, idx_dst, swa_dst = mla_pool(), mla_pool(), mla_pool()
    reader = attach(storage_config(master, mla=True), kv_dst, {PoolName.INDEXER: idx_dst, PoolName.SWA: swa_dst})
    hit = reader.batch_exists_v2(keys, [
        PoolTransfer(name=PoolName.INDEXER, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES),
        PoolTransfer(name=PoolName.SWA, keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
    ])
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (4, [4])
    dst = pages(9, n)
    assert reader.batch_get_v1(keys, dst) == [True] * n
    assert reader.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=dst, keys=keys),
                                PoolTransfer(name=PoolName.SWA, host_indices=pages(1, 1), keys=keys[-1:])]) == {
        PoolName.INDEXER: [True] * n, PoolName.SWA: [True]}
    assert torch.equal(kv_dst.kv_buffer[dst], kv_src.kv_buffer[src])
    assert torch.equal(idx_dst.kv_buffer[dst], idx_src.kv_buffer[src])
    assert torch.equal(swa_dst.kv_buffer[pages(1, 1)], swa_src.kv_buffer[pages(5, 1)])


def test_l3_layout_is_disabled_where_mooncake_disables_it(master: str) -> None:
    """As with Mooncake: MHA keys embed the TP rank (no external lookup), and
    a Mamba pool is rank-sharded even under an MLA model."""
    mha = attach(storage_config(master, mla=False), mha_host(), {})
    layout = inner(mha).describe_l3_object_layout(sidecar_pool_specs=(), swa_trailing_pages=None, page_size=PAGE)
    assert layout["enabled"] is False and "MLA" in layout["reason"]
    mla = attach(storage_config(master, mla=True), mla_pool(), {PoolName.MAMBA: mamba_host()})
    layout = inner(mla).describe_l3_object_layout(sidecar_pool_specs=(), swa_trailing_pages=None, page_size=PAGE)
    assert layout["enabled"] is False and "Auxiliary" in layout["reason"]
    assert [p["pool"] for p in layout["hicache_object_layout"]["pools"]] == ["kv", "mamba"]


# ------------------------------------------------- layouts, zero-copy


MHA_LAYOUTS = ["page_first", "page_first_direct", "page_head"]


@pytest.mark.parametrize("layout", MHA_LAYOUTS)
def test_mha_layouts_move_zero_copy(master: str, calls: Calls, layout: str) -> None:
    """Each MHA host layout SGLang's Mooncake backend accepts: pages round-trip
    byte-exact, and kvpool reads and writes the host pool's own memory."""
    src_pool, dst_pool = mha_host(layout), mha_host(layout)
    fill_random(src_pool, 30)
    writer, reader = pair(master, src_pool, dst_pool, mla=False)
    n = 4
    keys = page_keys(n)
    assert writer.batch_set_v1(keys, pages(1, n)) == [True] * n
    assert reader.batch_exists(keys) == n
    assert reader.batch_get_v1(keys, pages(7, n)) == [True] * n
    for i in range(n):
        assert torch.equal(mha_page(dst_pool, (7 + i) * PAGE), mha_page(src_pool, (1 + i) * PAGE))
    assert within(calls.ranges(*ZERO_COPY), [src_pool.kv_buffer, dst_pool.kv_buffer])


def test_asymmetric_mha_page_first_direct(master: str, calls: Calls) -> None:
    """K and V of different widths (SGLang's asymmetric MHA host pool, K and
    V in separate buffers) round-trip zero-copy."""
    src_pool, dst_pool = mha_host("page_first_direct", v_head_dim=8), mha_host("page_first_direct", v_head_dim=8)
    assert type(src_pool).__name__ == "AsymmetricMHATokenToKVPoolHost"
    fill_random(src_pool, 31)
    writer, reader = pair(master, src_pool, dst_pool, mla=False)
    keys = page_keys(3)
    assert writer.batch_set_v1(keys, pages(2, 3)) == [True] * 3
    assert reader.batch_get_v1(keys, pages(9, 3)) == [True] * 3
    assert torch.equal(dst_pool.k_buffer[9:12], src_pool.k_buffer[2:5])
    assert torch.equal(dst_pool.v_buffer[9:12], src_pool.v_buffer[2:5])
    bufs = [src_pool.k_buffer, src_pool.v_buffer, dst_pool.k_buffer, dst_pool.v_buffer]
    assert within(calls.ranges(*ZERO_COPY), bufs)


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "layer_first"])
def test_mla_layouts_move_zero_copy(master: str, calls: Calls, layout: str) -> None:
    """Each MLA host layout: byte-exact pages, the host pool's own memory
    (layer_first: one object gathered from a buffer per layer)."""
    src_pool, dst_pool = mla_pool(layout), mla_pool(layout)
    fill_random(src_pool, 32)
    writer, reader = pair(master, src_pool, dst_pool, mla=True)
    n = 3
    keys = page_keys(n)
    src, dst = pages(1, n), pages(6, n)
    assert writer.batch_set_v1(keys, src) == [True] * n
    assert reader.batch_get_v1(keys, dst) == [True] * n
    if layout == "layer_first":
        assert torch.equal(dst_pool.kv_buffer[:, dst], src_pool.kv_buffer[:, src])
        assert calls.keys("batch_put_from_multi_buffers")
    else:
        for i in range(n):
            a = dst_pool.get_data_page((6 + i) * PAGE, flat=True)
            b = src_pool.get_data_page((1 + i) * PAGE, flat=True)
            assert torch.equal(a, b)
    assert within(calls.ranges(*ZERO_COPY), [src_pool.kv_buffer, dst_pool.kv_buffer])


def test_mha_layer_first_is_refused_as_with_mooncake(master: str) -> None:
    """SGLang's Mooncake backend refuses layer_first for MHA (a page would be
    2 × layers objects); kvpool keeps that answer rather than inventing keys."""
    b = backend(storage_config(master, mla=False), mha_host("layer_first"))
    with pytest.raises(RuntimeError, match="layer_first"):
        b.batch_set_v1(page_keys(1), pages(1, 1))


def test_page_head_splits_heads_across_tensor_parallel_sizes(master: str, kv: kvpool.Client) -> None:
    """page_head with tp_lcm_size: a TP2 rank writes each page as objects per
    head group of the TP4 grid; TP4 ranks (half the heads each) read their
    share byte-exact, and the TP2 rank reads the whole page back."""
    src = mha_host("page_head", heads=2)
    fill_random(src, 40)
    cfg = storage_config(master, mla=False, tp_rank=0, tp_size=2)
    cfg.tp_lcm_size, cfg.should_split_heads = 4, True
    writer = backend(cfg, src)
    n = 2
    keys = page_keys(n)
    assert writer.batch_set_v1(keys, pages(1, n)) == [True] * n
    for r in (0, 1):
        for part in ("k", "v"):
            assert kv.exists(f"{KEY_PREFIX}_{keys[0]}_{r}_{part}")
    assert writer.batch_exists(keys) == n
    # TP4 ranks 0 and 1 hold one head each: head r of the TP2 rank 0.
    for r in (0, 1):
        dst = mha_host("page_head", heads=1)
        reader = backend(storage_config(master, mla=False, tp_rank=r, tp_size=4), dst)
        assert reader.batch_get_v1(keys, pages(5, n)) == [True] * n
        # page_head buffers are (2, page, head, token, layer, dim).
        assert torch.equal(dst.kv_buffer[:, 5:5 + n], src.kv_buffer[:, 1:1 + n, r:r + 1])
    back = mha_host("page_head", heads=2)
    reader = backend(cfg, back)
    assert reader.batch_get_v1(keys, pages(3, n)) == [True] * n
    assert torch.equal(back.kv_buffer[:, 3:3 + n], src.kv_buffer[:, 1:1 + n])


# ------------------------------------------- the rest of the interface


def test_metrics_prefix_tags_and_clear(own_cluster: Any) -> None:
    """get_stats reports what moved since the last call (and resets);
    extra_backend_tag + model name prefix every key; clear() empties the pool."""
    cfg = storage_config(own_cluster.master, mla=False)
    cfg.enable_storage_metrics = True
    cfg.extra_config = {**cfg.extra_config, "extra_backend_tag": "blue"}
    pool = mha_host()
    fill_random(pool, 50)
    b = backend(cfg, pool)
    keys = page_keys(3)
    assert b.batch_set_v1(keys, pages(1, 3)) == [True] * 3
    assert b.batch_get_v1(keys, pages(8, 3)) == [True] * 3
    stats = b.get_stats()
    # SGLang counts prefetched pages but backed-up objects (K and V: 2 a page).
    assert list(stats.prefetch_pgs) == [3] and list(stats.backup_pgs) == [6]
    assert len(stats.backup_bandwidth) == 1 and stats.backup_bandwidth[0] > 0
    assert list(b.get_stats().backup_pgs) == []
    # Pages only written (a read leases its objects for a moment, and
    # remove_all keeps leased objects, as Mooncake's does).
    written = page_keys(2)
    assert b.batch_set_v1(written, pages(1, 2)) == [True] * 2
    with kvpool.Client(own_cluster.master) as c:
        assert c.exists(f"blue_{KEY_PREFIX}_{written[0]}_0_k")
        b.clear()
        assert not c.exists(f"blue_{KEY_PREFIX}_{written[0]}_0_k")
    assert b.batch_exists(written) == 0
    assert b.batch_get_v1(written, pages(8, 2)) == [False] * 2


def test_sidecar_registered_after_attach(master: str) -> None:
    """Dynamic sidecars arrive through register_mem_host_pool_v2 alone, after
    on_host_pools_registered; they work from then on."""
    kv_pool = mha_host()
    b = attach(storage_config(master, mla=False), kv_pool, {})
    with pytest.raises(ValueError, match="Unregistered"):
        b.batch_set_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=pages(1, 1), keys=page_keys(1))])
    draft = mha_host()
    fill_random(draft, 60)
    b.register_mem_host_pool_v2(draft, PoolName.DRAFT)
    keys = page_keys(2)
    assert b.batch_set_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=pages(1, 2), keys=keys)]) == {
        PoolName.DRAFT: [True, True]}
    hit = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.DRAFT, keys=keys)])
    # No KV pages were written: the KV prefix, hence the hit, is empty.
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (0, [])


# ------------------------------------------------- unified key scheme


def unified_objects(pool: MHATokenToKVPoolHost, plan: Any, page_hash: str, page: int) -> Tuple[List[str], List[int], List[int]]:
    """Keys, pointers and sizes of one page under SGLang's unified key scheme:
    ``{page_hash}_{suffix}`` per (layer chunk, head group) of the plan, each
    one run of the page_unified block (PageUnifiedLayout.chunk_span)."""
    layout = pool.page_unified_layout
    base = pool.kv_buffer.data_ptr() + page * layout.bytes_per_page
    keys, ptrs, sizes = [], [], []
    i = 0
    for layers in plan.layer_ranges:
        for group in range(len(plan.head_ranges)):
            off, n = layout.chunk_span(layers, group)
            keys.append(f"{page_hash}_{plan.suffixes[i]}")
            ptrs.append(base + off)
            sizes.append(n)
            i += 1
    return keys, ptrs, sizes


def test_unified_key_scheme_objects_are_shared_across_tp_sizes(store: Any, calls: Calls) -> None:
    """SGLang's unified key scheme (hicache_key_scheme.plan_unified_kv) over
    page_unified host pools, on kvpool's zero-copy calls: a TP1 engine writes
    each page as (layer chunk × head group) objects straight from its page
    blocks; a TP2 rank derives the same digest, names only its head group's
    objects, and reads them byte-exact into its own pool."""
    from sglang.srt.mem_cache.hicache_key_scheme import plan_unified_kv

    common = dict(model_id="org/test-model", dtype="float32", page_size=PAGE, rank_replicated=False,
                  attn_cp_size=1, start_layer=0, end_layer=LAYERS, is_final_stage=True,
                  head_group=1, layer_partition=2)
    w_plan = plan_unified_kv(local_kv_heads=2, attn_tp_rank=0, attn_tp_size=1, **common)
    r_plan = plan_unified_kv(local_kv_heads=1, attn_tp_rank=1, attn_tp_size=2, **common)
    digest = w_plan.suffixes[0].split("_")[0]
    assert digest.startswith("ukv1-") and r_plan.suffixes[0].startswith(digest)
    assert [s.split("_", 1)[1] for s in w_plan.suffixes] == ["L0-2_H0", "L0-2_H1", "L2-3_H0", "L2-3_H1"]
    assert [s.split("_", 1)[1] for s in r_plan.suffixes] == ["L0-2_H1", "L2-3_H1"]

    src = mha_host("page_unified", heads=2, head_group_num=2)
    dst = mha_host("page_unified", heads=1)
    fill_random(src, 70)
    hashes = page_keys(3)
    for i, h in enumerate(hashes):
        keys, ptrs, sizes = unified_objects(src, w_plan, h, 1 + i)
        assert store.batch_put_from(keys, ptrs, sizes) == [0] * len(keys)
    for i, h in enumerate(hashes):
        keys, ptrs, sizes = unified_objects(dst, r_plan, h, 5 + i)
        assert store.batch_is_exist(keys) == [1] * len(keys)
        assert store.batch_get_into(keys, ptrs, sizes) == sizes
    # page_unified blocks are (page, head group, layer, K/V, token, head, dim).
    assert torch.equal(dst.kv_buffer[5:8, 0], src.kv_buffer[1:4, 1])
    assert within(calls.ranges(*ZERO_COPY), [src.kv_buffer, dst.kv_buffer])
