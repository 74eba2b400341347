"""The rest of Mooncake's surface in kvpool.mooncake, checked against what it
must do here (test_mooncake_compat.py compares answers with the real
Mooncake): every public name, the standalone-storage mode, replica copies
and moves that really move bytes, lent segments, host memory and buffer
pools, the Engram store, tensors where Mooncake is wrong, safetensors, the
names that cannot mean anything here, and Mooncake's client env vars."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import kvpool
import kvpool.mooncake as km
import kvpool.mooncake_types
from conftest import free_port, scribbling, setup7
from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig

REPO = Path(__file__).resolve().parents[3]
INVALID_PARAMS, NOT_SUPPORTED = -600, -1012


# ---------------------------------------------------------------- names


def test_every_public_name_of_mooncake_is_here():
    """Mooncake 0.3.13's names and 0.3.14's (which dropped the
    *_with_parallelism calls and their types, and added probes, snapshot
    ranged reads and ExistOptions): kvpool offers both."""
    script = REPO / "scripts" / "mooncake-surface.py"
    r = subprocess.run([sys.executable, str(script), "--recorded"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for version, names, methods in (("0.3.13", 49, 97), ("0.3.14", 47, 90)):
        assert f"[{version}] module names: {names}/{names}" in r.stdout, r.stdout
        assert f"[{version}] MooncakeDistributedStore methods: {methods}/{methods}" in r.stdout, r.stdout
        assert f"[{version}] methods callable with Mooncake's parameter names: {methods}/{methods}" in r.stdout
    for version in ("0.3.13", "0.3.14"):
        r = subprocess.run([sys.executable, str(script), "--recorded", "--version", version],
                           capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.count("reference:") == 1, r.stdout + r.stderr
    # Against the installed Mooncake too, when it imports here.
    env = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_enums_print_and_compare_like_mooncakes():
    assert km.TaskStatus.SUCCESS == 3 and km.TaskStatus.FAILED == 2
    assert str(km.TaskStatus.SUCCESS) == "TaskStatus.SUCCESS"
    assert km.SUCCESS is km.TaskStatus.SUCCESS and km.FAILED is km.TaskStatus.FAILED
    assert km.PROCESSING is km.TaskStatus.PROCESSING and km.COMPLETE is km.ReplicaStatus.COMPLETE
    assert [m.name for m in km.ObjectDataType][:3] == ["UNKNOWN", "KVCACHE", "TENSOR"]
    assert km.GENERAL == 9 and km.REPLICA_MOVE == 1
    assert str(km.SoftPinAction.ENABLE) == "SoftPinAction.ENABLE"
    c = ReplicateConfig()
    assert (c.data_type, c.nof_replica_num, c.dfs_replica_num, c.preferred_nof_segments, c.group_ids) == (
        km.UNKNOWN, 0, 0, [], None)
    assert km.BufferHandle is kvpool.Buffer


# ---------------------------------------------------------------- standalone storage

DUMMY_CHILD = """
import sys
from kvpool.mooncake import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup_dummy(1 << 20, 16 << 20, sys.argv[1]) == 0
key, value = sys.argv[2], sys.argv[3].encode()
if sys.argv[4] == "put":
    assert s.put(key, value) == 0
else:
    assert s.get(key) == value, s.get(key)
print("ok", s.get_hostname())
"""


def test_setup_dummy_attaches_to_a_storage_process(cluster, prefix):
    endpoint = cluster.store_endpoint()
    s = MooncakeDistributedStore()
    assert s.alloc_from_mem_pool(64) == 0
    assert s.setup_dummy(1 << 20, 16 << 20, endpoint) == 0
    assert s._settings["protocol"] == "auto" and s._settings["global_segment_size"] == 0
    # The pool behind alloc_from_mem_pool: aligned, bounded.
    a = s.alloc_from_mem_pool(100)
    b = s.alloc_from_mem_pool(100)
    assert a and b and a % 64 == 0 and b - a == 128
    assert s.alloc_from_mem_pool(1 << 20) == 0
    # Objects go to the storage process's segment.
    k = prefix + "standalone"
    v = np.random.default_rng(3).integers(0, 255, 5000, dtype=np.uint8)
    assert s.put_from(k, v.ctypes.data, v.nbytes) == 0
    names = [d.get_memory_descriptor().buffer_descriptor.transport_endpoint for d in s.get_replica_desc(k)]
    assert names == [endpoint]
    out = np.zeros_like(v)
    assert s.get_into(k, out.ctypes.data, out.nbytes) == v.nbytes and (out == v).all()
    s.close()
    # Nothing answers there, or it is not a storage process.
    assert MooncakeDistributedStore().setup_dummy(1, 1, f"127.0.0.1:{free_port()}") < 0
    assert MooncakeDistributedStore().setup_dummy(1, 1, "") == INVALID_PARAMS


def test_an_engine_restart_keeps_the_storage_process_cache(cluster, prefix):
    """Two engine processes one after the other, attached to the same
    storage process: the second reads what the first wrote."""
    endpoint = cluster.store_endpoint()
    key, value = prefix + "survives", "written by the first engine"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPOOL_", "MOONCAKE_"))}
    for step in ("put", "get"):
        r = subprocess.run([sys.executable, "-c", DUMMY_CHILD, endpoint, key, value, step],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr


def test_host_memory_for_sglangs_host_pool():
    a = km.MooncakeHostMemAllocator()
    p = a.alloc(1 << 20)
    assert p and p % 4096 == 0
    import ctypes

    view = (ctypes.c_ubyte * (1 << 20)).from_address(p)
    assert sum(view[:4096]) == 0
    view[0] = 7
    assert a.free(p) == 0 and a.free(p) == -1 and a.free(12345) == -1
    assert a.alloc(0) == 0 and a.alloc(1 << 62) == 0
    assert km.get_alloc_func_addr() and km.get_free_func_addr() and km.get_alloc_func_addr() != km.get_free_func_addr()
    # The C functions behind the addresses allocate and free the same memory.
    alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(km.get_alloc_func_addr())
    free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(km.get_free_func_addr())
    q = alloc(4096, 0, None)
    assert q
    free(q, 4096, 0, None)
    assert a.free(q) == -1, "freed by the C function already"


# ---------------------------------------------------------------- replicas, tasks, segments


def wait_task(s, tid):
    for _ in range(100):
        q, rc = s.query_task(tid)
        assert rc == 0
        if q.status in (km.SUCCESS, km.FAILED):
            return q
        time.sleep(0.05)
    raise AssertionError(f"task {tid} did not finish: {q}")


def replica_names(s, key):
    return [d.get_memory_descriptor().buffer_descriptor.transport_endpoint for d in s.get_replica_desc(key)]


def test_copies_and_moves_really_move_the_bytes(short_lease, prefix):
    master = short_lease.master
    storage = short_lease.store_endpoint()
    s, lender = MooncakeDistributedStore(), MooncakeDistributedStore()
    assert setup7(s, master) == 0
    assert setup7(lender, master, 32 << 20) == 0
    other = lender.get_hostname()
    v = np.random.default_rng(5).integers(0, 255, 100_000, dtype=np.uint8)
    k = prefix + "copied"
    assert s.put_from(k, v.ctypes.data, v.nbytes, ReplicateConfig(preferred_segment=storage)) == 0
    assert replica_names(s, k) == [storage]
    tid, rc = s.create_copy_task(k, [other])
    assert rc == 0
    q = wait_task(s, tid)
    assert (q.type, q.status, q.message) == (km.REPLICA_COPY, km.SUCCESS, "Task completed successfully")
    assert q.created_at_ms_epoch <= q.last_updated_at_ms_epoch
    # Another client sees the task too: tasks live at the master.
    q2, rc = lender.query_task(tid)
    assert rc == 0 and q2.status == km.SUCCESS and q2.assigned_client == q.assigned_client
    assert replica_names(s, k) == [storage, other]
    # Dropping the original leaves the copy, which reads back byte-exact.
    time.sleep(1.2)
    assert s.batch_replica_clear([k], storage) == [k]
    assert replica_names(s, k) == [other]
    out = np.zeros_like(v)
    assert s.get_into(k, out.ctypes.data, out.nbytes) == v.nbytes and (out == v).all()
    # A move back: the bytes arrive, the source replica goes.
    tid, rc = s.create_move_task(k, other, storage)
    assert rc == 0 and wait_task(s, tid).status == km.SUCCESS
    assert replica_names(s, k) == [storage]
    out[:] = 0
    assert s.get_into(k, out.ctypes.data, out.nbytes) == v.nbytes and (out == v).all()
    # A move from a segment holding no replica is refused at once, as in Mooncake.
    assert s.create_move_task(k, other, storage) == ((0, 0), INVALID_PARAMS)
    time.sleep(1.2)
    assert s.batch_replica_clear([k, prefix + "nope"], "") == [k]
    assert s.is_exist(k) == 0
    for x in (s, lender):
        x.close()


def test_lent_segments_come_and_go(cluster, prefix, tmp_path):
    s = MooncakeDistributedStore()
    assert setup7(s, cluster.master) == 0
    before = cluster.segments()
    r = s.allocate_and_mount_segment(16 << 20)
    assert r["ret"] == 0 and r["allocated_size"] == 16 << 20
    (seg,) = r["segment_ids"]
    hi, _, lo = seg.partition("-")
    assert hi.isdigit() and lo.isdigit()
    assert cluster.segments() == before + 1
    k = prefix + "on-lent"
    assert s.put(k, b"lent memory", ReplicateConfig(preferred_segment=s.get_hostname())) == 0
    assert replica_names(s, k) == [s.get_hostname()]
    # A file's pages as a segment.
    f = tmp_path / "seg"
    m = s.mount_segment(str(f), 8 << 20, 0)
    assert m["ret"] == 0 and f.stat().st_size == 8 << 20
    assert cluster.segments() == before + 2
    assert s.mount_segment(str(f), 8 << 20, 100)["ret"] == INVALID_PARAMS  # unaligned offset
    assert s.mount_segment(str(tmp_path / "no" / "such"), 8 << 20)["ret"] == INVALID_PARAMS
    assert s.unmount_segment(["1-2"]) == -1
    assert s.unmount_segment(m["segment_ids"]) == 0
    assert s.unmount_and_free_segment(r["segment_ids"]) == 0
    assert cluster.segments() == before
    assert s.get(k) == b""  # its only replica went with the segment
    assert s.allocate_and_mount_segment(0)["ret"] == -1  # Mooncake's answer
    s.close()


# ---------------------------------------------------------------- pools and Engram


def test_buffer_pools(store):
    pool = km.BufferPool(store, max_bytes=2 << 20, min_size_class=1 << 16, block_on_exhaustion=False)
    a = pool.acquire(1000)
    assert a.size == 1000 and a.ptr and len(a.buffer) == 1000 and not a.buffer.readonly
    a.buffer[:3] = b"abc"
    p = a.ptr
    a.release()
    b = pool.acquire(60_000)
    assert b.ptr == p, "same size class: the buffer is reused"
    c = pool.acquire(600_000)
    with pytest.raises(kvpool.NoSpace):
        pool.acquire(600_000)
    c.release()
    d = pool.acquire(600_000, block=True, timeout=0.1)
    d.release()
    b.release()
    pool.close()
    reg = km.RegisteredBufferPool(store)
    lease = reg.acquire(4096)
    assert store.register_buffer(lease.ptr, 16) == INVALID_PARAMS, "already registered by the pool"
    assert store.put(b"x".decode() + uuid.uuid4().hex, b"v") == 0
    lease.release()
    reg.close()


def test_engram_store(store, prefix):
    cfg = km.EngramStoreConfig()
    cfg.embedding_dim, cfg.table_vocab_sizes = 4, [10, 20]
    e = km.EngramStore(7, cfg, store)
    assert (e.get_embedding_dim(), e.get_num_heads(), e.get_table_vocab_sizes()) == (4, 2, [10, 20])
    assert e.get_store_keys() == ["engram:l7:h0", "engram:l7:h1"]
    t0 = np.arange(40, dtype=np.float32).reshape(10, 4)
    t1 = np.arange(80, dtype=np.float32).reshape(20, 4) + 1000
    e.populate([t0, t1])
    ids = np.array([[[1, 2], [3, 4], [9, 19]]], dtype=np.int64)
    got = e.lookup(ids)
    assert got.shape == (1, 3, 2, 4) and got.dtype == np.float32
    want = np.stack([np.stack([t0[r[0]], t1[r[1]]]) for r in ids[0]])[None]
    assert np.array_equal(got, want)
    with pytest.raises(RuntimeError):
        e.lookup(np.array([[1, 2]]))
    with pytest.raises(RuntimeError):
        e.lookup(np.array([[[1, 25]]]))
    assert e.remove_from_store(True) == 2
    with pytest.raises(kvpool.InvalidArgument):
        km.EngramStore(0, cfg).populate([t0, t1])


# ---------------------------------------------------------------- tensors


def test_numpy_values_are_stored_whole_where_mooncake_is_wrong(store, prefix):
    """Mooncake stores 12 of the 48 bytes of a 3x4 float32 array (its item
    count) and the wrong bytes of a non-contiguous one; kvpool stores all
    the bytes, and refuses memory it cannot take as one region."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert store.put(prefix + "np", a) == 0
    assert store.get_size(prefix + "np") == 48
    assert store.get(prefix + "np") == a.tobytes()
    nc = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    with pytest.raises((BufferError, ValueError)):
        store.put(prefix + "nc", nc)
    assert store.is_exist(prefix + "nc") == 0
    assert store.put(prefix + "nc", np.ascontiguousarray(nc)) == 0
    assert store.get(prefix + "nc") == np.ascontiguousarray(nc).tobytes()


def test_a_source_changed_mid_put_reads_back_over_shared_memory(master, prefix):
    """test_mooncake_compat's `source_changed_while_put` runs over TCP (the
    store seals what it receives); here the copy into mapped segment
    memory, which the client seals itself."""
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "shm", "", master) == 0
    n = 24 << 20
    a = np.full(n, 1, dtype=np.uint8)
    with scribbling(a):
        rcs = [s.put_from(f"{prefix}{i}", a.ctypes.data, n) for i in range(4)]
    try:
        assert rcs == [0] * 4
        for i in range(4):
            v = s.get(f"{prefix}{i}")
            assert len(v) == n and set(np.frombuffer(v, dtype=np.uint8)[::4096].tolist()) <= {1, 2, 3}
    finally:
        s.remove_all(True)
        s.close()


def test_get_sessions_read_each_object_once_within_their_bound(store, prefix, monkeypatch):
    """Ranged reads in a get session (SGLang's Mooncake linker reads one
    layer of every object per call) read each object from the pool once and
    copy later ranges from the kept value; past the sessions' bound they read
    the pool per call. A force removal after the first call shows which."""
    from kvpool.mooncake import _sessions

    values = {f"{prefix}sess{i}": np.random.default_rng(i).integers(0, 256, 4096, dtype=np.uint8) for i in range(3)}
    for k, v in values.items():
        assert store.put_from(k, v.ctypes.data, v.nbytes) == 0
    dst = np.zeros((3, 4096), dtype=np.uint8)

    def layer(n: int) -> list:
        """Bytes [1024 n, 1024 n + 1024) of every object, as one call."""
        keys = list(values)
        ptrs = [[dst[i].ctypes.data + 1024 * n] for i in range(3)]
        return store.batch_get_into_multi_buffer_ranges(keys, ptrs, [[1024]] * 3, [[1024 * n]] * 3)

    assert store.batch_get_session_start(list(values)) == [0, 0, 0]
    assert layer(0) == [1024] * 3
    assert store.batch_remove(list(values), True) == [0, 0, 0]
    assert [layer(n) for n in (1, 2, 3)] == [[1024] * 3] * 3  # from the kept values
    assert all((dst[i] == v).all() for i, v in enumerate(values.values()))
    assert store.batch_get_into_multi_buffer_ranges([next(iter(values))], [[dst.ctypes.data]], [[8]], [[4090]]) == [
        INVALID_PARAMS]  # past the end
    assert store.batch_get_session_end(list(values)) == 0
    assert layer(0) == [INVALID_PARAMS] * 3  # the session is over

    # With no room to keep values (none, or less than an object), every call
    # reads the pool.
    for room in (0, 1):
        monkeypatch.setattr(_sessions, "SESSION_KEEP_BYTES", room)
        dst[:] = 0
        for k, v in values.items():
            assert store.put_from(k, v.ctypes.data, v.nbytes) == 0
        assert store.batch_get_session_start(list(values)) == [0, 0, 0]
        assert layer(0) == [1024] * 3
        assert all((dst[i, :1024] == v[:1024]).all() for i, v in enumerate(values.values()))
        assert store.batch_remove(list(values), True) == [0, 0, 0]
        assert layer(1) == [-704] * 3
        assert store.batch_get_session_end(list(values)) == 0


def test_tensor_dtypes_shapes_and_scalars_round_trip(store, prefix):
    torch = pytest.importorskip("torch")
    for dt in ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
               "int64", "uint64", "bool", "float8_e4m3fn", "float8_e5m2"):
        for n, shape in enumerate(((), (0,), (5,), (2, 3, 4), (1, 2, 1, 2, 1, 2, 1, 2))):
            t = (torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape) % 5).to(getattr(torch, dt))
            k = f"{prefix}{dt}-{n}"
            assert store.put_tensor(k, t) == 0
            back = store.get_tensor(k)
            assert back.dtype == t.dtype and back.shape == t.shape, (dt, shape)
            assert torch.equal(back.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), (dt, shape)
    # Zero copy into a caller's buffer.
    t = torch.randn(3, 5)
    assert store.put_tensor(prefix + "z", t) == 0
    b = torch.zeros(4096, dtype=torch.uint8)
    g = store.get_tensor_into(prefix + "z", b.data_ptr(), 4096)
    assert torch.equal(g, t) and g.data_ptr() == b.data_ptr() + 304
    assert store.put_tensor(prefix + "cuda", torch.ones(1)) == 0
    if not torch.cuda.is_available():
        with pytest.raises(kvpool.NotSupported):
            store.get_tensor_into_cuda(prefix + "cuda", torch.zeros(1))
        with pytest.raises(kvpool.NotSupported):
            store.batch_get_tensor_into_cuda([prefix + "cuda"], [torch.zeros(1)])


def test_tensor_parallel_round_trips(store, prefix):
    torch = pytest.importorskip("torch")
    t = torch.randn(8, 6, dtype=torch.float64)
    for split in (0, 1):
        k = f"{prefix}tp{split}"
        assert store.put_tensor_with_tp(k, t, tp_size=2, split_dim=split) == 0
        shards = [store.get_tensor_with_tp(k, r, 2, split) for r in range(2)]
        assert torch.equal(torch.cat(shards, dim=split), t)
        full = km.ReadTarget("full", km.TensorParallelism([km.ParallelAxis("tp", 0, 2, split)]))
        assert torch.equal(store.get_tensor_with_parallelism(k, full), t)
        n = 4 if split == 0 else 3
        shard = km.ReadTarget("shard", km.TensorParallelism([km.ParallelAxis("tp", n - 1, n, split)]))
        assert torch.equal(store.get_tensor_with_parallelism(k, shard), t.chunk(n, dim=split)[n - 1])
    # Writers that each own the whole tensor store their own partitions;
    # the whole is there once every partition is.
    k = prefix + "wp"
    whole = km.ReadTarget("full")
    assert store.put_tensor_with_parallelism(k, t, writer_partition=km.ParallelAxis("tp", 1, 2, 0)) == 0
    shard = km.ReadTarget("shard", km.TensorParallelism([km.ParallelAxis("tp", 1, 2, 0)]))
    assert torch.equal(store.get_tensor_with_parallelism(k, shard), t[4:])
    assert store.get_tensor_with_parallelism(k, whole) is None
    assert store.put_tensor_with_parallelism(k, t, writer_partition=km.ParallelAxis("tp", 0, 2, 0)) == 0
    assert torch.equal(store.get_tensor_with_parallelism(k, whole), t)
    assert store.put_tensor_with_parallelism(k, t, writer_partition={"rank": 1, "size": 2, "split_dim": 0}) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism(
        k, t, km.TensorParallelism([km.ParallelAxis("tp", 0, 2)]), writer_partition=km.ParallelAxis("tp", 1, 2, 0)
    ) == INVALID_PARAMS


def test_safetensors_files(store, prefix, tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    k = prefix + "st"
    assert store.put_tensor(k, t) == 0
    path = tmp_path / "t.safetensors"
    assert store.save_tensor_to_safetensor(k, str(path)) == 0
    assert store.save_tensor_to_safetensor(prefix + "nope", str(path) + "2") == -1100  # Mooncake's FILE_NOT_FOUND
    got = store.load_tensor_from_safetensor(prefix + "loaded", str(path))
    assert got is not None and torch.equal(got, t), "not named so: the file's first tensor"
    assert torch.equal(store.get_tensor(prefix + "loaded"), t)
    assert store.load_tensor_from_safetensor(k, str(tmp_path / "missing")) is None
    try:
        from safetensors.torch import load_file
    except ImportError:
        return
    assert torch.equal(load_file(str(path))[k], t)


# ---------------------------------------------------------------- not supported here


def test_names_without_a_meaning_here_say_so(store):
    nof = km.MooncakeDistributedNoFRegister()
    with pytest.raises(kvpool.NotSupported):
        nof.real_register("ep", 1, "nqn", 1, 0, 0, "tcp")
    with pytest.raises(kvpool.NotSupported):
        nof.real_unregister_by_endpoint("ep", 1, "nqn", 0, "tcp")
    with pytest.raises(kvpool.NotSupported):
        km.bind_to_numa_node(4096)
    assert store.unmount_local_disk_segment() == 0  # none mounted: Mooncake's answer
    assert store.get_offload_rpc_read_count() == 0
    assert store.put("nof", b"v", ReplicateConfig(nof_replica_num=1)) == NOT_SUPPORTED
    assert store.put("dfs", b"v", ReplicateConfig(dfs_replica_num=1)) == NOT_SUPPORTED
    # Groups are a placement hint in Mooncake: stored as without them.
    assert store.put("grp", b"v", ReplicateConfig(group_ids=["g"])) == 0
    assert store.get("grp") == b"v"
    d = km.ReplicaDescriptor(km.MemoryDescriptor())
    with pytest.raises(kvpool.NotSupported):
        d.get_disk_descriptor()


def test_numa_binding_where_the_node_exists():
    if not os.path.isdir("/sys/devices/system/node/node0"):
        pytest.skip("no NUMA node 0 reported here")
    before = os.sched_getaffinity(0)
    try:
        km.bind_to_numa_node(0)
        with open("/sys/devices/system/node/node0/cpulist") as f:
            want = set(kvpool.mooncake_types._parse_cpulist(f.read()))
        assert os.sched_getaffinity(0) == want
    finally:
        os.sched_setaffinity(0, before)


# ---------------------------------------------------------------- env vars


def test_mooncakes_client_env_vars(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("KVPOOL_", "MOONCAKE_", "MC_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("MOONCAKE_MASTER", "etcd://10.0.0.1:2379")
    monkeypatch.setenv("MC_STORE_CLUSTER_ID", "prod")
    monkeypatch.setenv("MC_RPC_TIMEOUT_MS", "2500")
    monkeypatch.setenv("MC_RETRY_CNT", "4")
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.3")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "rdma")
    s = kvpool._native.resolve_settings({})
    assert s["master_server_addr"] == "etcd://10.0.0.1:2379/prod"
    assert (s["timeout"], s["retries"], s["segment_address"], s["protocol"]) == (2.5, 4, "127.0.0.3", "tcp")
    monkeypatch.setenv("KVPOOL_CLUSTER_ID", "mine")
    assert kvpool._native.resolve_settings({})["master_server_addr"] == "etcd://10.0.0.1:2379/mine"
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    assert kvpool._native.resolve_settings({"protocol": "shm"})["protocol"] == "tcp"


def test_client_port_range(master, monkeypatch):
    monkeypatch.setenv("MC_STORE_CLIENT_MIN_PORT", "15100")
    monkeypatch.setenv("MC_STORE_CLIENT_MAX_PORT", "15110")
    s = MooncakeDistributedStore()
    assert setup7(s, master, 8 << 20) == 0
    port = int(s.get_hostname().rpartition(":")[2])
    assert 15100 <= port <= 15110
    # The lent segment is served on that very port.
    seg = s._client.lent_segments()[0]
    assert seg["name"] == s.get_hostname() and seg["endpoint"].endswith(f":{port}")
    s.close()
