"""vLLM 0.33's in-tree Mooncake store connector (``MooncakeStoreConnector``,
``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/``) run
unchanged on ``kvpool.mooncake`` against a real pool, on CPU tensors.

The connector's own classes do every store call: ``setup_mooncake_store``
(``vllm/distributed/mooncake_store.py``) from a ``MOONCAKE_CONFIG_PATH``
file, ``register_buffer`` per KV cache region, the send thread's
``batch_is_exist`` + ``batch_put_from_multi_buffers``, the lookup server's
``batch_is_exist`` (reached through the scheduler's ZMQ ``LookupKeyClient``),
the receive threads' ``batch_get_into_multi_buffers`` and its
``get_block_ids_with_load_errors``, ``remove_all(force=True)`` on a cache
reset, ``batch_get_replica_desc`` for its tier log, and ``close``.
``mooncake.store`` is resolved to ``kvpool.mooncake`` through
``sys.modules``, which is all a user changes.

vLLM comes from an add-on directory (not the test venv's site-packages):
``KVPOOL_VLLM_SITE``, default ``~/.cache/kvpool/vllm-site``, made by
``pip install --target`` from ``tests/requirements-vllm.txt``. Without it the
module fails, unless ``KVPOOL_TEST_VLLM=0`` (then it is skipped).

Two things of vLLM's worker need CUDA and are replaced here, nothing else:
``wait_for_save`` records a ``torch.cuda.Event`` to fence the GPU work that
wrote the KV (a CPU tensor needs no fence: a stand-in event), and the
distributed groups are set up with gloo on one CPU rank. Requests are handed
to the worker as the scheduler's ``MooncakeStoreConnectorMetadata`` would
carry them (``ReqMeta`` / ``LoadSpec``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import pytest

from conftest import Cluster, free_port

VLLM_VERSION = "0.33.0"
SITE = os.environ.get("KVPOOL_VLLM_SITE") or str(Path.home() / ".cache" / "kvpool" / "vllm-site")


def _vllm_missing() -> Optional[str]:
    """Why vLLM cannot be imported from the add-on directory, or None."""
    meta = Path(SITE) / f"vllm-{VLLM_VERSION}.dist-info"
    if not (Path(SITE) / "vllm").is_dir():
        return f"vLLM not installed in {SITE}"
    if not meta.is_dir():
        return f"{SITE} holds a vLLM other than {VLLM_VERSION}"
    return None


_WHY = _vllm_missing()
try:
    import numpy as np
    import torch
except ImportError as e:  # torch comes with the SGLang set, which vLLM's add-on builds on
    np = torch = None  # type: ignore[assignment]
    _WHY = _WHY or f"vLLM's add-on needs torch and numpy in the test venv: {e}"
if _WHY is not None and os.environ.get("KVPOOL_TEST_VLLM") == "0":
    pytest.skip(f"{_WHY} (KVPOOL_TEST_VLLM=0)", allow_module_level=True)

BLOCK = 16  # tokens per block
BLOCKS = 32  # blocks in the paged KV cache of one engine
HEADS, HEAD_DIM = 2, 16
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
#: Bytes of one block of one layer: K and V, BLOCK tokens, HEADS x HEAD_DIM float32.
BLOCK_BYTES = 2 * BLOCK * HEADS * HEAD_DIM * 4
TRANSFER_FAIL, INVALID_PARAMS, NOT_SUPPORTED = -800, -600, -1012


class _CpuEvent:
    """``torch.cuda.Event`` for CPU KV: the bytes are written when the
    worker runs, so there is nothing to wait for."""

    def record(self, *a: Any) -> None:
        """Nothing to record on a CPU."""

    def synchronize(self) -> None:
        """Nothing to wait for on a CPU."""


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[types.SimpleNamespace]:
    """vLLM imported from the add-on directory, ``mooncake.store`` resolved to
    ``kvpool.mooncake``, one gloo CPU rank set up; undone at module end.
    Fails every test (not the collection of the others) without vLLM."""
    if _WHY is not None:
        pytest.fail(
            f"{_WHY}: pip install --no-deps --target {SITE} vllm=={VLLM_VERSION} "
            "-r crates/kvpool-python/tests/requirements-vllm.txt (or KVPOOL_TEST_VLLM=0 to skip)",
            pytrace=False,
        )
    import kvpool.mooncake as km

    with pytest.MonkeyPatch.context() as mp:
        # Appended, so the test venv's packages win; vLLM resolves its CPU
        # platform from VLLM_TARGET_DEVICE, and ModelConfig inspects the model
        # class in a subprocess that needs the add-on on PYTHONPATH.
        mp.setattr(sys, "path", sys.path + [SITE])
        mp.setenv("VLLM_TARGET_DEVICE", "cpu")
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), SITE) if p))
        mp.setenv("VLLM_RPC_BASE_PATH", str(tmp_path_factory.mktemp("vllm-rpc")))
        shim = types.ModuleType("mooncake")
        shim.__path__ = []  # a package, so `from mooncake.store import ...` resolves
        shim.store = km  # type: ignore[attr-defined]
        mp.setitem(sys.modules, "mooncake", shim)
        mp.setitem(sys.modules, "mooncake.store", km)
        mp.setattr(torch.cuda, "Event", _CpuEvent)

        import vllm as vllm_pkg
        from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig, set_current_vllm_config
        from vllm.distributed import (
            destroy_distributed_environment,
            destroy_model_parallel,
            ensure_model_parallel_initialized,
            init_distributed_environment,
        )
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import worker as worker_mod
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import MooncakeStoreConnector
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import (
            LoadSpec,
            MooncakeStoreConnectorMetadata,
            ReqMeta,
        )
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

        assert vllm_pkg.__version__ == VLLM_VERSION, vllm_pkg.__version__
        model_dir = str(tmp_path_factory.mktemp("vllm-model"))
        # A two-layer Llama with 2 KV heads of 16: no weights are loaded, the
        # connector only reads the model's name, layer and KV-head counts.
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                       "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": HEADS,
                       "num_hidden_layers": len(LAYERS), "vocab_size": 256, "max_position_embeddings": 1024,
                       "torch_dtype": "float32"}, f)
        model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=1024)
        base = VllmConfig(model_config=model_config, cache_config=CacheConfig(block_size=BLOCK),
                          kv_transfer_config=KVTransferConfig(kv_connector="MooncakeStoreConnector", kv_role="kv_both"))
        with set_current_vllm_config(base):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
            ensure_model_parallel_initialized(1, 1)
        ns = types.SimpleNamespace(
            km=km, VllmConfig=VllmConfig, CacheConfig=CacheConfig, KVTransferConfig=KVTransferConfig,
            model_config=model_config, set_current_vllm_config=set_current_vllm_config, Role=KVConnectorRole,
            Connector=MooncakeStoreConnector, worker_mod=worker_mod, LoadSpec=LoadSpec,
            Metadata=MooncakeStoreConnectorMetadata, ReqMeta=ReqMeta, spec=FullAttentionSpec(
                block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_DIM, dtype=torch.float32),
            KVCacheConfig=KVCacheConfig, KVCacheGroupSpec=KVCacheGroupSpec, KVCacheTensor=KVCacheTensor,
        )
        try:
            yield ns
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()


_job_ids = itertools.count(1)


class Engine:
    """One vLLM engine's worker-side connector (rank 0 of TP 1) on CPU KV
    caches, with the scheduler's lookup client, driven request by request."""

    def __init__(self, v: types.SimpleNamespace, master: str, prefix: str, role: str = "kv_both",
                 mode: str = "standalone-store", file_extra: Optional[Dict[str, Any]] = None,
                 extra: Optional[Dict[str, Any]] = None) -> None:
        self.v = v
        conf: Dict[str, Any] = {"metadata_server": "P2PHANDSHAKE", "master_server_address": master, "protocol": "tcp",
                                "device_name": "", "mode": mode, "local_buffer_size": "16MB",
                                "global_segment_size": 0 if mode == "standalone-store" else "32MB"}
        conf.update(file_extra or {})
        fd, self.config_path = tempfile.mkstemp(prefix="kvpool-vllm-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({k: v_ for k, v_ in conf.items() if v_ is not None}, f)
        # The connector reads the file named by MOONCAKE_CONFIG_PATH in its constructor.
        os.environ["MOONCAKE_CONFIG_PATH"] = self.config_path
        extra_config = {"cache_prefix": prefix, "lookup_rpc_port": random.randrange(1 << 30)}
        extra_config.update(extra or {})
        self.config = v.VllmConfig(
            model_config=v.model_config, cache_config=v.CacheConfig(block_size=BLOCK),
            kv_transfer_config=v.KVTransferConfig(kv_connector="MooncakeStoreConnector", kv_role=role,
                                                  kv_connector_extra_config=extra_config))
        self.config.cache_config.num_gpu_blocks = BLOCKS
        page = v.spec.page_size_bytes
        kv_cache_config = v.KVCacheConfig(
            num_blocks=BLOCKS,
            kv_cache_tensors=[v.KVCacheTensor(size=page * BLOCKS, layers=[name], layer_stride=page * BLOCKS,
                                              block_stride=page) for name in LAYERS],
            kv_cache_groups=[v.KVCacheGroupSpec(LAYERS, v.spec)])
        with v.set_current_vllm_config(self.config):
            self.connector = v.Connector(self.config, v.Role.WORKER, kv_cache_config)
            self.worker = self.connector.connector_worker
            # Layer-major paged caches: [block, K/V, token, head, dim].
            self.caches = {name: torch.zeros(BLOCKS, 2, BLOCK, HEADS, HEAD_DIM) for name in LAYERS}
            self.connector.register_kv_caches(self.caches)
            self.lookup_client = v.worker_mod.LookupKeyClient(self.config)

    # ------------------------------------------------------------ KV contents

    @staticmethod
    def kv(layer: int, seed: int) -> "torch.Tensor":
        """The KV of one block of layer ``layer`` that depends on ``seed``."""
        g = torch.Generator().manual_seed(seed * 100 + layer)
        return torch.rand(2, BLOCK, HEADS, HEAD_DIM, generator=g)

    def fill(self, block: int, seed: int) -> None:
        """Writes :meth:`kv` for ``seed`` into ``block`` of every layer."""
        for i, name in enumerate(LAYERS):
            self.caches[name][block].copy_(self.kv(i, seed))

    def holds(self, block: int, seed: int) -> bool:
        """Whether ``block`` holds exactly the KV :meth:`fill` writes for ``seed``."""
        return all(torch.equal(self.caches[name][block], self.kv(i, seed)) for i, name in enumerate(LAYERS))

    def poison(self, blocks: List[int]) -> None:
        """Fills ``blocks`` with NaN, so bytes a load did not write stand out."""
        for name in LAYERS:
            self.caches[name][blocks] = float("nan")

    def key(self, block_hash: bytes) -> str:
        """The store key the connector uses for a chunk hash (group 0)."""
        return self.worker.token_dbs[0].key_for(block_hash)

    # ------------------------------------------------------------ requests

    def save(self, req_id: str, block_ids: List[int], hashes: List[bytes]) -> None:
        """The scheduler asks this worker to store a prefilled request's
        full blocks; waits until the send thread is done with it."""
        meta = self.v.Metadata({req_id}, set())
        n = len(block_ids) * BLOCK
        meta.add_request(self.v.ReqMeta(req_id=req_id, token_len_chunk=n, block_ids=(list(block_ids),),
                                        block_hashes=list(hashes), can_save=True, store_job_id=next(_job_ids),
                                        prefill_end_tokens=n))
        self.connector.bind_connector_metadata(meta)
        self.connector.wait_for_save()
        self.connector.clear_connector_metadata()
        self.worker.kv_send_thread.request_queue.join()

    def lookup(self, num_tokens: int, hashes: List[bytes]) -> int:
        """Tokens of the prompt the store holds, as the scheduler asks it
        (over ZMQ, answered by the worker's ``batch_is_exist``)."""
        result = self.lookup_client.lookup(f"lookup-{random.random()}", num_tokens, list(hashes))
        return result.hit_length

    def load(self, req_id: str, block_ids: List[int], hashes: List[bytes]) -> Tuple[Set[int], Set[str]]:
        """Loads ``len(block_ids)`` blocks of a prompt into ``block_ids``;
        returns (block ids with load errors, requests finished receiving)."""
        meta = self.v.Metadata({req_id}, set())
        n = len(block_ids) * BLOCK
        spec = self.v.LoadSpec(vllm_cached_tokens=0, kvpool_cached_tokens=n, can_load=True)
        meta.add_request(self.v.ReqMeta(req_id=req_id, token_len_chunk=n, block_ids=(list(block_ids),),
                                        block_hashes=list(hashes), load_spec=spec))
        self.connector.bind_connector_metadata(meta)
        self.connector.start_load_kv(None)
        self.worker.recv_request_queue.join()
        results = self.connector.get_transfer_results(set())
        self.connector.clear_connector_metadata()
        assert not results.failed_recving  # per-request failures are for hybrid models only
        return self.connector.get_block_ids_with_load_errors(), results.finished_recving

    def stats(self) -> Dict[str, List[Dict[str, Any]]]:
        """The connector's operation records since the last call."""
        s = self.connector.get_kv_connector_stats()
        return {} if s is None else dict(s.data)

    def close(self) -> None:
        """Stops the lookup server (its own ``close`` closes the socket under
        the thread still reading it: a ZMQ assertion) and shuts down."""
        server = self.worker.lookup_server
        if server is not None:
            server.running = False
            self.lookup_client.socket.send_multipart([b"stop"])  # unblocks its recv; answered RESP_ERR
            self.lookup_client.socket.recv()
            server.thread.join(timeout=5)
            server.close()
        self.lookup_client.close()
        self.connector.shutdown()
        os.unlink(self.config_path)


def hashes_for(tag: str, n: int) -> List[bytes]:
    """``n`` block hashes of a prompt named ``tag`` (32 bytes, as vLLM's sha256)."""
    return [hashlib.sha256(f"{tag}/{i}".encode()).digest() for i in range(n)]


@pytest.fixture
def engines(vllm: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> Iterator[List[Engine]]:
    """Engines made by a test (``engines.append(Engine(...))``), closed after
    it; the ``MOONCAKE_CONFIG_PATH`` each sets is undone with it."""
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    made: List[Engine] = []
    yield made
    for e in made:
        e.close()


def plain_store(km: Any, master: str) -> Any:
    """A kvpool.mooncake store on ``master`` that lends nothing (another client)."""
    s = km.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master) == 0
    return s


def saved_blocks(vllm: Any, engines: List[Engine], master: str, prefix: str, **kw: Any) -> Tuple[Engine, List[bytes]]:
    """An engine (``kw`` for :class:`Engine`) that saved 4 blocks of a prompt
    into blocks 1-4 and finds them all; the engine and the prompt's hashes."""
    a = Engine(vllm, master, prefix, **kw)
    engines.append(a)
    hashes = hashes_for(prefix, 4)
    for i in range(4):
        a.fill(1 + i, i)
    a.save("w", [1, 2, 3, 4], hashes)
    assert a.lookup(4 * BLOCK + 1, hashes) == 4 * BLOCK
    return a, hashes


# ---------------------------------------------------------------- tests


def test_store_lookup_load_round_trip(vllm, engines, master, prefix):
    """A producer stores 4 blocks; a second engine finds them and loads them
    byte-exact into other blocks; storing again puts nothing (dedup)."""
    a = Engine(vllm, master, prefix)
    engines.append(a)
    b = Engine(vllm, master, prefix, role="kv_consumer")
    engines.append(b)
    assert type(a.worker.store) is vllm.km.MooncakeDistributedStore
    # register_buffer was called once per layer region, and accepted.
    assert sorted(n for _, n in a.worker.store._registered) == [BLOCKS * BLOCK_BYTES] * len(LAYERS)

    hashes = hashes_for(prefix, 4)
    src = [1, 2, 3, 4]  # block 0 is vLLM's null block: never stored
    for i, blk in enumerate(src):
        a.fill(blk, i)
    assert b.lookup(4 * BLOCK + 1, hashes) == 0
    a.save("r1", src, hashes)
    st = a.stats()
    assert [r["num_keys"] for r in st["save_put"]] == [4] and st["save_put"][0]["status"] == "ok"
    assert st["save_put"][0]["num_bytes"] == 4 * len(LAYERS) * BLOCK_BYTES
    keys = [a.key(h) for h in hashes]
    assert a.worker.store.batch_is_exist(keys) == [1, 1, 1, 1]
    assert a.worker.store.get_size(keys[0]) == len(LAYERS) * BLOCK_BYTES

    # The last token is always recomputed: 65 tokens hit 64, 64 hit 48.
    assert b.lookup(4 * BLOCK + 1, hashes) == 4 * BLOCK
    assert b.lookup(4 * BLOCK, hashes) == 3 * BLOCK
    dst = [20, 21, 22, 23]
    b.poison(dst)
    errors, finished = b.load("r2", dst, hashes)
    assert errors == set() and finished == {"r2"}
    assert all(b.holds(blk, i) for i, blk in enumerate(dst))
    assert b.stats()["load_get"][0]["num_failed_keys"] == 0

    a.save("r3", src, hashes)  # the same prefix again: found, not put
    st = a.stats()
    assert "save_put" not in st and st["save_exists"][0]["num_keys"] == 4


def test_missing_block_reported_per_block(vllm, engines, master, prefix):
    """A block that is not in the store shortens the lookup, and a load that
    asks for it anyway reports exactly that block; the others load."""
    a = Engine(vllm, master, prefix)
    engines.append(a)
    hashes = hashes_for(prefix, 4)
    for i in range(4):
        a.fill(1 + i, i)
    a.save("w", [1, 2, 3, 4], hashes)
    other = plain_store(vllm.km, master)
    try:
        assert other.remove(a.key(hashes[2]), True) == 0
    finally:
        other.close()
    assert a.lookup(4 * BLOCK + 1, hashes) == 2 * BLOCK
    dst = [10, 11, 12, 13]
    a.poison(dst)
    errors, finished = a.load("r", dst, hashes)
    assert errors == {12} and finished == {"r"}
    assert a.holds(10, 0) and a.holds(11, 1) and a.holds(13, 3)
    assert a.stats()["load_get"][0]["status"] == "partial_failure"


def test_evicted_after_lookup_reported(vllm, engines, master, prefix):
    """Blocks that go between the scheduler's lookup and the worker's load
    (evicted or removed by another client) are reported, not loaded as KV."""
    a = Engine(vllm, master, prefix)
    engines.append(a)
    b = Engine(vllm, master, prefix, role="kv_consumer")
    engines.append(b)
    hashes = hashes_for(prefix, 6)
    for i in range(6):
        a.fill(1 + i, i)
    a.save("w", list(range(1, 7)), hashes)
    assert b.lookup(6 * BLOCK + 1, hashes) == 6 * BLOCK
    other = plain_store(vllm.km, master)
    try:
        assert other.batch_remove([a.key(hashes[0]), a.key(hashes[4])], True) == [0, 0]
    finally:
        other.close()
    dst = list(range(10, 16))
    b.poison(dst)
    errors, finished = b.load("r", dst, hashes)
    assert errors == {10, 14} and finished == {"r"}
    assert all(b.holds(10 + i, i) for i in (1, 2, 3, 5))


def test_wrong_size_object_reported(vllm, engines, master, prefix):
    """An object under a block's key whose size is not the block's (shorter:
    a truncated or foreign value; longer: another layout) fails that block;
    kvpool never answers a short read with a count vLLM takes as success."""
    a = Engine(vllm, master, prefix)
    engines.append(a)
    hashes = hashes_for(prefix, 3)
    for i in range(3):
        a.fill(1 + i, i)
    a.save("w", [1, 2, 3], hashes)
    other = plain_store(vllm.km, master)
    try:
        short, long_ = a.key(hashes[0]), a.key(hashes[2])
        assert other.batch_remove([short, long_], True) == [0, 0]
        assert other.put(short, b"\x01" * BLOCK_BYTES) == 0  # one layer's worth of two
        assert other.put(long_, b"\x02" * (len(LAYERS) * BLOCK_BYTES + 64)) == 0
        # The call vLLM makes, as the raw answer: −800 short, −600 long.
        x = np.zeros(len(LAYERS) * BLOCK_BYTES, dtype=np.uint8)
        half = BLOCK_BYTES
        rc = a.worker.store.batch_get_into_multi_buffers(
            [short, long_], [[x.ctypes.data, x.ctypes.data + half]] * 2, [[half, half]] * 2)
        assert rc == [TRANSFER_FAIL, INVALID_PARAMS]
    finally:
        other.close()
    dst = [10, 11, 12]
    a.poison(dst)
    errors, _ = a.load("r", dst, hashes)
    assert errors == {10, 12}
    assert a.holds(11, 1)


def test_dead_store_reported(vllm, engines, own_cluster: Cluster, prefix):
    """The storage node holding the KV dies: the load fails every block at
    once with the client's default retries (10 s for a silent master), and
    reports each one."""
    a, hashes = saved_blocks(vllm, engines, own_cluster.master, prefix)
    store_proc = own_cluster.procs[-1]
    store_proc.kill()
    store_proc.wait()
    dst = [10, 11, 12, 13]
    a.poison(dst)
    t0 = time.monotonic()
    errors, finished = a.load("r", dst, hashes)
    assert time.monotonic() - t0 < 5
    assert errors == set(dst) and finished == {"r"}
    rec = a.stats()["load_get"][0]
    assert rec["num_failed_keys"] == 4


def test_silent_master_fails_fast_when_the_config_asks(vllm, engines, own_cluster: Cluster, prefix):
    """vLLM calls the store from its scheduler's lookup and its workers'
    threads; with ``fail_fast_after`` in the config file, a paused master
    costs a miss and a failed load at once instead of the client's retries
    (10 s per call), and lookups find the blocks again once it answers."""
    a, hashes = saved_blocks(vllm, engines, own_cluster.master, prefix, file_extra={"fail_fast_after": 1.5})
    own_cluster.master_proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(3)  # past fail_fast_after, heartbeats unanswered
        t0 = time.monotonic()
        assert a.lookup(4 * BLOCK + 1, hashes) == 0
        errors, finished = a.load("r", [10, 11, 12, 13], hashes)
        assert time.monotonic() - t0 < 5
        assert errors == {10, 11, 12, 13} and finished == {"r"}
    finally:
        own_cluster.master_proc.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 15
    while a.lookup(4 * BLOCK + 1, hashes) != 4 * BLOCK:
        assert time.monotonic() < deadline, "lookups did not find the blocks again"
        time.sleep(0.2)


def test_embedded_mode_and_file_defaults(vllm, engines, master, prefix, monkeypatch):
    """vLLM's default topology (each rank lends ``global_segment_size``) with
    a config file that names only the master: vLLM then passes protocol
    ``rdma`` and an empty metadata server, which kvpool accepts (over TCP).
    The lent segment is served at vLLM's requester hostname, here loopback
    (on another address kvpool wants a cluster secret: docs/vllm.md)."""
    monkeypatch.setenv("MOONCAKE_REQUESTER_LOCAL_HOSTNAME", "127.0.0.1")
    a = Engine(vllm, master, prefix, mode="embedded",
               file_extra={"protocol": None, "metadata_server": None, "device_name": None, "mode": None,
                           "tenant_id": "team-a"})
    engines.append(a)
    assert a.worker.store.health_check() == 0
    assert a.worker.store.get_hostname().startswith("127.0.0.1:")
    assert a.worker.store._settings["global_segment_size"] == 32 << 20
    hashes = hashes_for(prefix, 2)
    a.fill(5, 7)
    a.fill(6, 8)
    a.save("w", [5, 6], hashes)
    a.poison([9, 10])
    errors, _ = a.load("r", [9, 10], hashes)
    assert errors == set() and a.holds(9, 7) and a.holds(10, 8)


def test_tier_log_reads_replica_descriptors(vllm, engines, master, prefix):
    """With VLLM_MOONCAKE_STORE_TIER_LOG vLLM classifies each key's replicas
    through ``batch_get_replica_desc`` and ``is_memory_replica``."""
    a = Engine(vllm, master, prefix)
    engines.append(a)
    hashes = hashes_for(prefix, 2)
    a.fill(1, 1)
    a.fill(2, 2)
    a.save("w", [1, 2], hashes)
    keys = [a.key(h) for h in hashes]
    tiers = vllm.worker_mod._get_replica_tiers_by_key(a.worker.store, keys + [prefix + "missing"])
    assert tiers == {keys[0]: "memory", keys[1]: "memory", prefix + "missing": "unknown"}


def test_reset_cache_removes_everything(vllm, engines, own_cluster: Cluster, prefix):
    """The scheduler's prefix-cache reset (RESET over ZMQ) drains the send
    queue and runs ``remove_all(force=True)``: nothing is found afterwards."""
    a = Engine(vllm, own_cluster.master, prefix)
    engines.append(a)
    hashes = hashes_for(prefix, 3)
    a.save("w", [1, 2, 3], hashes)
    assert a.lookup(3 * BLOCK + 1, hashes) == 3 * BLOCK
    assert a.lookup_client.reset() is True
    assert a.worker.store.batch_is_exist([a.key(h) for h in hashes]) == [0, 0, 0]
    assert a.lookup(3 * BLOCK + 1, hashes) == 0


def test_group_semantics_store_and_load(vllm, engines, master, prefix):
    """``enable_group_semantics``: vLLM puts with ``ReplicateConfig.group_ids``
    set; groups are a placement hint (as in Mooncake), so the blocks are
    stored and another engine loads them byte-exact."""
    a = Engine(vllm, master, prefix, extra={"enable_group_semantics": "true"})
    engines.append(a)
    b = Engine(vllm, master, prefix, role="kv_consumer")
    engines.append(b)
    hashes = hashes_for(prefix, 2)
    src = [1, 2]
    for i, blk in enumerate(src):
        a.fill(blk, i)
    a.save("w", src, hashes)
    put = a.stats()["save_put"][0]
    assert put["status"] == "ok" and put["num_keys"] == 2
    assert a.worker.store_replicate_config.group_ids  # vLLM did set them
    assert b.lookup(2 * BLOCK + 1, hashes) == 2 * BLOCK
    dst = [20, 21]
    b.poison(dst)
    errors, finished = b.load("r", dst, hashes)
    assert errors == set() and finished == {"r"}
    assert all(b.holds(blk, i) for i, blk in enumerate(dst))


def test_docs_shim_resolves_mooncake_store(tmp_path):
    """The ``mooncake/store.py`` of docs/vllm.md, put on PYTHONPATH as it
    says, gives vLLM's import line kvpool's classes (ahead of a real
    Mooncake installed in the venv)."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "vllm.md").read_text()
    body = doc.split("mooncake/store.py <<'EOF'\n", 1)[1].split("\n   EOF\n", 1)[0]
    pkg = tmp_path / "mooncake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "store.py").write_text("\n".join(line[3:] for line in body.splitlines()) + "\n")
    code = ("from mooncake.store import MooncakeDistributedStore, ReplicateConfig\n"  # store/worker.py:1364
            "import kvpool.mooncake as k\n"
            "assert MooncakeDistributedStore is k.MooncakeDistributedStore and ReplicateConfig is k.ReplicateConfig\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
