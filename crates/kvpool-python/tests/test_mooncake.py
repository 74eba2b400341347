"""kvpool.mooncake.MooncakeDistributedStore: every method, with Mooncake's
return conventions (checked against Mooncake 0.3.13's behaviour)."""

from __future__ import annotations

import gc
import json
import time

import numpy as np
import pytest

from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig, SoftPinAction

OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
INVALID_PARAMS = -600
NOT_SUPPORTED = -1012


def setup7(s: MooncakeDistributedStore, master: str, segment: int = 0, local_buffer: int = 16 << 20, protocol: str = "tcp") -> int:
    return s.setup("127.0.0.1", "P2PHANDSHAKE", segment, local_buffer, protocol, "", master)


# ---------------------------------------------------------------- setup


def test_setup_positional_and_dict(master):
    s = MooncakeDistributedStore()
    assert s.health_check() == 1
    assert setup7(s, master) == 0
    assert s.health_check() == 0
    # No port given: Mooncake's naming, host:port with a port of its own.
    host, _, port = s.get_hostname().rpartition(":")
    assert host == "127.0.0.1" and 12300 <= int(port) <= 14300
    assert s.close() == 0
    assert s.health_check() == 1

    d = MooncakeDistributedStore()
    rc = d.setup(
        {
            "local_hostname": "127.0.0.1",
            "metadata_server": "http://127.0.0.1:8080/metadata",
            "global_segment_size": "16MB",
            "local_buffer_size": "4mb",
            "protocol": "tcp",
            "master_server_addr": master,
        }
    )
    assert rc == 0
    assert d.put("dict-setup", b"x") == 0
    assert d.get("dict-setup") == b"x"
    d.remove("dict-setup", True)
    assert d.close() == 0


def test_setup_keyword_and_extra_args(master):
    s = MooncakeDistributedStore()
    rc = s.setup(
        local_hostname="127.0.0.1",
        metadata_server="P2PHANDSHAKE",
        global_segment_size=0,
        local_buffer_size=1 << 20,
        protocol="tcp",
        rdma_devices="",
        master_server_addr=master,
        engine=None,
        tenant_id="default",
    )
    assert rc == 0
    s.close()
    # SGLang passes the transfer engine as an 8th positional argument.
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", master, None) == 0
    s.close()


def test_setup_argument_errors(master):
    s = MooncakeDistributedStore()
    with pytest.raises(TypeError):
        s.setup("127.0.0.1", "P2PHANDSHAKE", 0)
    with pytest.raises(TypeError):
        s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master, bogus=1)
    assert setup7(s, master, protocol="carrier-pigeon") == INVALID_PARAMS
    assert s.setup("127.0.0.1", "", 0, 0, "tcp", "", "http://127.0.0.1:2379") == NOT_SUPPORTED
    assert s.setup("127.0.0.1", "", 0, 0, "tcp", "", "127.0.0.1:notaport") == INVALID_PARAMS
    assert s.setup({"master_server_addr": master, "global_segment_size": "4XB"}) == INVALID_PARAMS
    assert s.setup({"master_server_addr": master, "enable_ssd_offload": True}) == NOT_SUPPORTED
    assert setup7(s, master, protocol="nvlink") == NOT_SUPPORTED
    assert s.health_check() == 1


@pytest.mark.parametrize("scheme", ["", "etcd://"])
def test_setup_unreachable_master(scheme):
    from conftest import free_port

    s = MooncakeDistributedStore()
    t = time.time()
    rc = s.setup({"master_server_addr": f"{scheme}127.0.0.1:{free_port()}", "global_segment_size": 0, "timeout": 1, "retries": 1})
    assert rc < 0
    assert time.time() - t < 30
    assert s.health_check() == 1


def test_every_protocol_reads_what_every_protocol_wrote(master):
    """The store runs on this host, so shm and auto map its segment file;
    bytes cross between transports unchanged, including zero-copy calls."""
    import numpy as np

    stores = {}
    for proto in ("shm", "auto", "TCP"):
        s = MooncakeDistributedStore()
        assert setup7(s, master, protocol=proto) == 0
        stores[proto] = s
    rng = np.random.default_rng(7)
    for writer, w in stores.items():
        src = rng.integers(0, 256, size=300_000, dtype=np.uint8)
        key = f"proto-{writer}"
        assert w.put_from(key, src.ctypes.data, src.nbytes) == 0
        for reader, r in stores.items():
            dst = np.zeros_like(src)
            assert r.get_into(key, dst.ctypes.data, dst.nbytes) == src.nbytes, (writer, reader)
            assert np.array_equal(dst, src), (writer, reader)
            assert r.get(key) == src.tobytes()
        w.remove(key, True)
    for s in stores.values():
        s.close()


def test_repeat_reads_see_another_clients_updates(master, prefix):
    """Repeat reads come from the client's location cache; another client's
    upsert (to a different size) or remove is seen on the very next read,
    through get, get_batch and get_into, on both transports."""
    import numpy as np

    for proto in ("tcp", "shm"):
        w, r = MooncakeDistributedStore(), MooncakeDistributedStore()
        assert setup7(w, master, protocol=proto) == 0
        assert setup7(r, master, protocol=proto) == 0
        keys = [f"{prefix}{proto}-{i}" for i in range(8)]
        for k in keys:
            assert w.put(k, b"first:" + k.encode()) == 0
        for _ in range(3):  # the later rounds are cache hits
            assert r.get_batch(keys) == [b"first:" + k.encode() for k in keys]
        for n, k in enumerate(keys):
            assert w.upsert(k, b"second, and longer:" + k.encode() * (n + 1)) == 0
        want = [b"second, and longer:" + k.encode() * (n + 1) for n, k in enumerate(keys)]
        assert r.get_batch(keys) == want
        assert r.get(keys[0]) == want[0]
        buf = np.zeros(4096, dtype=np.uint8)
        assert r.get_into(keys[1], buf.ctypes.data, buf.nbytes) == len(want[1])
        assert buf[: len(want[1])].tobytes() == want[1]
        assert w.remove(keys[2], True) == 0
        assert r.get_batch(keys[2:4]) == [b"", want[3]]
        w.close()
        r.close()
    # The cache can be turned off; reads then ask the master every time.
    off = MooncakeDistributedStore()
    assert off.setup({"master_server_addr": master, "location_cache": 0, "protocol": "tcp"}) == 0
    assert off.put(prefix + "off", b"v") == 0
    assert [off.get(prefix + "off") for _ in range(3)] == [b"v"] * 3
    off.close()


def test_env_vars_and_config_file(master, monkeypatch, tmp_path):
    monkeypatch.setenv("MOONCAKE_MASTER", "127.0.0.1:1")  # wrong, overridden below
    monkeypatch.setenv("KVPOOL_MASTER", master)
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "0")
    monkeypatch.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "0")
    s = MooncakeDistributedStore()
    assert s.setup({}) == 0
    assert s.put("env", b"x") == INVALID_PARAMS  # local buffer 0 from the env
    s.close()

    monkeypatch.delenv("KVPOOL_MASTER")
    monkeypatch.delenv("MOONCAKE_MASTER")
    monkeypatch.delenv("MOONCAKE_LOCAL_BUFFER_SIZE")
    cfg = tmp_path / "mooncake.json"
    cfg.write_text(json.dumps({"master_server_address": master, "local_buffer_size": "1MB", "protocol": "tcp"}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(cfg))
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1"}) == 0
    assert s.put("cfgfile", b"x") == 0
    assert s.get("cfgfile") == b"x"
    s.remove("cfgfile", True)
    s.close()

    monkeypatch.setenv("KVPOOL_CONFIG_PATH", str(tmp_path / "missing.json"))
    assert MooncakeDistributedStore().setup({}) == INVALID_PARAMS


def test_init_all(master, monkeypatch):
    monkeypatch.setenv("MOONCAKE_MASTER", master)
    s = MooncakeDistributedStore()
    assert s.init_all("tcp", "", 0) == 0
    assert s.put("init-all", b"1") == 0
    s.remove("init-all", True)
    s.close()


def test_calls_before_setup_do_not_crash():
    """Mooncake answers −600 to the calls before setup it survives (most
    crash it); kvpool answers −600 to all of them."""
    s = MooncakeDistributedStore()
    assert s.put("k", b"v") == INVALID_PARAMS
    assert s.get("k") == b""
    assert s.get_batch(["a", "b"]) == [b""]
    assert s.get_buffer("k") is None
    assert s.is_exist("k") == INVALID_PARAMS
    assert s.batch_is_exist(["a", "b"]) == [INVALID_PARAMS] * 2
    assert s.get_size("k") == INVALID_PARAMS
    assert s.remove("k") == INVALID_PARAMS
    assert s.remove_all() == INVALID_PARAMS
    assert s.get_into("k", 0, 0) == INVALID_PARAMS
    assert s.batch_get_into(["a"], [0], [0]) == [INVALID_PARAMS]
    assert s.batch_put_from(["a"], [0], [1]) == [INVALID_PARAMS]
    assert s.register_buffer(4096, 10) == INVALID_PARAMS
    assert s.get_replica_desc("k") == []
    assert s.create_copy_task("k", ["a"]) == ((0, 0), INVALID_PARAMS)
    assert s.batch_put_session_start(["k"], [4]) == [INVALID_PARAMS]
    assert s.put_tensor("k", None) == INVALID_PARAMS
    assert s.alloc_from_mem_pool(10) == 0
    assert s.get_hostname() == ""
    assert s.health_check() == 1
    assert s.close() == 0


# ---------------------------------------------------------------- copying API


def test_put_get_duplicate_upsert(store, prefix):
    k = prefix + "a"
    assert store.put(k, b"hello") == 0
    assert store.put(k, b"other") == 0  # write-once: kept, still success
    assert store.get(k) == b"hello"
    assert store.upsert(k, b"newer") == 0
    assert store.get(k) == b"newer"
    assert store.get(prefix + "missing") == b""
    assert store.put(prefix + "bytearray", bytearray(b"ba")) == 0
    assert store.put(prefix + "mv", memoryview(b"xmvx")[1:3]) == 0
    assert store.get(prefix + "mv") == b"mv"
    assert store.put(prefix + "np", np.arange(4, dtype=np.uint16)) == 0
    assert store.get(prefix + "np") == np.arange(4, dtype=np.uint16).tobytes()


def test_put_rejects_empty(store, prefix):
    assert store.put(prefix + "empty", b"") == INVALID_PARAMS
    assert store.put("", b"x") == INVALID_PARAMS
    # A zero-size put_from stores nothing and succeeds, as in Mooncake.
    assert store.put_from(prefix + "e", 4096, 0) == 0
    assert store.is_exist(prefix + "e") == 0


def test_put_parts_and_upsert_parts(store, prefix):
    k = prefix + "parts"
    assert store.put_parts(k, b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert store.get(k) == b"abcdef"
    assert store.upsert_parts(k, b"12", b"34") == 0
    assert store.get(k) == b"1234"
    assert store.put_parts(prefix + "cfg", b"x", config=ReplicateConfig()) == 0


def test_batches(store, prefix):
    keys = [prefix + f"b{i}" for i in range(5)]
    vals = [bytes([i]) * (i + 1) for i in range(5)]
    assert store.put_batch(keys, vals) == 0
    assert store.put_batch(keys[:2], [b"zz", b"zz"]) == 0  # existing keys kept
    assert store.get_batch(keys + [prefix + "nope"]) == vals + [b""]
    assert store.upsert_batch(keys[:2], [b"u0", b"u1"]) == 0
    assert store.get_batch(keys[:2]) == [b"u0", b"u1"]
    assert store.put_batch(keys, vals[:2]) == INVALID_PARAMS
    assert store.batch_is_exist(keys + [prefix + "nope"]) == [1] * 5 + [0]


def test_exist_and_size(store, prefix):
    k = prefix + "sz"
    assert store.put(k, b"12345") == 0
    assert store.is_exist(k) == 1
    assert store.is_exist(prefix + "missing") == 0
    assert store.get_size(k) == 5
    assert store.get_size(prefix + "missing") == OBJECT_NOT_FOUND


def test_remove_codes_and_lease(store, prefix):
    k = prefix + "leased"
    assert store.put(k, b"v") == 0
    assert store.get(k) == b"v"  # takes a read lease
    assert store.remove(k) == OBJECT_HAS_LEASE
    assert store.batch_remove([k, prefix + "missing"]) == [OBJECT_HAS_LEASE, OBJECT_NOT_FOUND]
    assert store.remove(k, True) == 0
    assert store.remove(k) == OBJECT_NOT_FOUND
    assert store.is_exist(k) == 0
    fresh = prefix + "fresh"
    assert store.put(fresh, b"v") == 0
    assert store.batch_remove([fresh]) == [0]


def test_remove_by_regex_and_all(store, prefix):
    for i in range(3):
        assert store.put(f"{prefix}rx{i}", b"v") == 0
    assert store.put(prefix + "other", b"v") == 0
    assert store.remove_by_regex("^" + prefix.replace("/", "/") + "rx", True) == 3
    assert store.is_exist(prefix + "other") == 1
    assert store.remove_all(True) >= 1
    assert store.is_exist(prefix + "other") == 0
    assert store.remove_by_regex("(unclosed", True) < 0


def test_get_buffer(store, prefix):
    k = prefix + "buf"
    assert store.put(k, b"hello") == 0
    h = store.get_buffer(k)
    assert h is not None and h.size() == 5 and len(h) == 5
    assert bytes(memoryview(h)) == b"hello"
    assert h.ptr() != 0
    arr = np.frombuffer(h, dtype=np.uint8)
    assert arr.tobytes() == b"hello"
    assert store.get_buffer(prefix + "missing") is None
    hs = store.batch_get_buffer([k, prefix + "missing"])
    assert bytes(hs[0]) == b"hello" and hs[1] is None


def test_local_buffer_zero_refuses_copying_calls(master, prefix):
    s = MooncakeDistributedStore()
    assert setup7(s, master, local_buffer=0) == 0
    buf = np.arange(8, dtype=np.uint8)
    p = buf.ctypes.data
    assert s.put(prefix + "x", b"v") == INVALID_PARAMS
    assert s.put_parts(prefix + "x", b"v") == INVALID_PARAMS
    assert s.put_batch([prefix + "x"], [b"v"]) == INVALID_PARAMS
    assert s.upsert(prefix + "x", b"v") == INVALID_PARAMS
    # Zero-copy calls work.
    assert s.put_from(prefix + "zc", p, 8) == 0
    assert s.get(prefix + "zc") == b""
    assert s.get_batch([prefix + "zc"]) == [b""]
    assert s.get_buffer(prefix + "zc") is None
    out = np.zeros(8, dtype=np.uint8)
    assert s.get_into(prefix + "zc", out.ctypes.data, 8) == 8
    assert (out == buf).all()
    s.remove(prefix + "zc", True)
    s.close()


# ---------------------------------------------------------------- zero-copy API


def test_register_and_unregister(store):
    buf = np.zeros(64, dtype=np.uint8)
    p = buf.ctypes.data
    assert store.register_buffer(p, 64) == 0
    assert store.register_buffer(0, 64) == INVALID_PARAMS
    assert store.register_buffer((1 << 64) - 4096, 8192) == INVALID_PARAMS  # wraps around
    assert store.unregister_buffer(p) == 0
    assert store.unregister_buffer(p) == INVALID_PARAMS


def test_registrations_end_with_unregister_close_or_the_store(master, prefix):
    """Registered memory is used without a page probe while registered
    (the owner keeps it mapped); unregistering, closing the store or
    dropping it ends that, so memory freed afterwards is probed again."""
    from kvpool import _native

    bufs = [np.zeros(8192, dtype=np.uint8) for _ in range(3)]
    ptrs = [b.ctypes.data for b in bufs]

    def noted(p: int) -> bool:
        # Forgetting a note that exists answers True: note it again.
        if _native.note_unregistered(p, 8192):
            _native.note_registered(p, 8192)
            return True
        return False

    s = MooncakeDistributedStore()
    assert setup7(s, master) == 0
    for p in ptrs:
        assert s.register_buffer(p, 8192) == 0
    assert all(noted(p) for p in ptrs)
    assert s.put_from(prefix + "r", ptrs[0] + 100, 4000) == 0
    assert s.unregister_buffer(ptrs[0]) == 0
    assert not noted(ptrs[0]) and noted(ptrs[1])
    s.close()
    assert not any(noted(p) for p in ptrs)

    s = MooncakeDistributedStore()
    assert setup7(s, master) == 0
    assert s.register_buffer(ptrs[2], 8192) == 0
    assert noted(ptrs[2])
    del s  # dropped without close()
    gc.collect()
    assert not noted(ptrs[2])


def test_put_from_get_into(store, prefix):
    src = np.random.default_rng(1).integers(0, 255, 4096, dtype=np.uint8)
    dst = np.zeros(8192, dtype=np.uint8)
    assert store.register_buffer(dst.ctypes.data, dst.nbytes) == 0
    k = prefix + "zc"
    assert store.put_from(k, src.ctypes.data, src.nbytes) == 0
    assert store.get_into(k, dst.ctypes.data, 100) == INVALID_PARAMS  # too small
    assert store.get_into(k, dst.ctypes.data, dst.nbytes) == 4096
    assert (dst[:4096] == src).all()
    assert store.get_into(prefix + "missing", dst.ctypes.data, dst.nbytes) == OBJECT_NOT_FOUND
    assert store.get_into(k, 0, 4096) == INVALID_PARAMS  # null address
    # numpy integers are addresses too (not 8-byte buffers).
    dst[:] = 0
    assert store.get_into(k, np.uint64(dst.ctypes.data), np.int64(dst.nbytes)) == 4096
    assert (dst[:4096] == src).all()
    assert store.upsert_from(k, src.ctypes.data, 10) == 0
    assert store.get_size(k) == 10


def test_batch_put_from_get_into(store, prefix):
    n, size = 8, 1000
    src = np.random.default_rng(2).integers(0, 255, n * size, dtype=np.uint8)
    dst = np.zeros(n * size, dtype=np.uint8)
    keys = [f"{prefix}k{i}" for i in range(n)]
    ptrs = [src.ctypes.data + i * size for i in range(n)]
    assert store.batch_put_from(keys, ptrs, [size] * n) == [0] * n
    assert store.batch_put_from(keys[:1], ptrs[:1], [size, size]) == [INVALID_PARAMS]
    dptrs = [dst.ctypes.data + i * size for i in range(n)]
    assert store.batch_get_into(keys, dptrs, [size] * n) == [size] * n
    assert (dst == src).all()
    rc = store.batch_get_into([keys[0], prefix + "missing", keys[1]], dptrs[:3], [size, size, 10])
    assert rc == [size, OBJECT_NOT_FOUND, INVALID_PARAMS]
    # Destinations sharing bytes are both filled, in batch order.
    dst[:] = 0
    rc = store.batch_get_into([keys[0], keys[1]], [dptrs[0], dptrs[0] + 10], [size, size])
    assert rc == [size, size]
    assert (dst[:10] == src[:10]).all() and (dst[10 : 10 + size] == src[size : 2 * size]).all()
    assert store.batch_upsert_from(keys[:2], ptrs[2:4], [size, size]) == [0, 0]
    assert store.batch_get_into(keys[:1], dptrs[:1], [size]) == [size]
    assert (dst[:size] == src[2 * size : 3 * size]).all()


def test_multi_buffers(store, prefix):
    a = np.arange(16, dtype=np.uint8)
    b = np.arange(100, 132, dtype=np.uint8)
    k = prefix + "multi"
    assert store.batch_put_from_multi_buffers([k], [[a.ctypes.data, b.ctypes.data]], [[16, 32]]) == [0]
    assert store.get_size(k) == 48
    x = np.zeros(20, dtype=np.uint8)
    y = np.zeros(28, dtype=np.uint8)
    z = np.zeros(4, dtype=np.uint8)
    rc = store.batch_get_into_multi_buffers([k, prefix + "missing"], [[x.ctypes.data, y.ctypes.data], [z.ctypes.data]], [[20, 28], [4]])
    assert rc == [48, OBJECT_NOT_FOUND]
    assert np.concatenate([x, y]).tobytes() == a.tobytes() + b.tobytes()
    assert store.batch_get_into_multi_buffers([k], [[x.ctypes.data, y.ctypes.data]], [[20, 20]]) == [INVALID_PARAMS]
    assert store.batch_put_from_multi_buffers([k], [[a.ctypes.data]], [[16, 16]])[0] == INVALID_PARAMS
    assert store.batch_put_from_multi_buffers([k, k], [[a.ctypes.data]], [[16]]) == [INVALID_PARAMS] * 2


def test_get_into_ranges(store, prefix):
    a = np.arange(10, dtype=np.uint8)
    assert store.put_from(prefix + "r1", a.ctypes.data, 10) == 0
    assert store.put_from(prefix + "r2", a.ctypes.data + 5, 5) == 0
    out = np.zeros(16, dtype=np.uint8)
    assert store.register_buffer(out.ctypes.data, 16) == 0
    res = store.get_into_ranges(
        [out.ctypes.data],
        [[prefix + "r1", prefix + "r2", prefix + "missing"]],
        [[[0, 4], [8], [12]]],
        [[[2, 7], [1], [0]]],
        [[[3, 2], [4], [1]]],
    )
    assert res == [[[3, 2], [4], [OBJECT_NOT_FOUND]]]
    assert list(out[:3]) == [2, 3, 4] and list(out[4:6]) == [7, 8] and list(out[8:12]) == [6, 7, 8, 9]
    bad = store.get_into_ranges([out.ctypes.data], [[prefix + "r2"]], [[[0]]], [[[4]]], [[[5]]])
    assert bad == [[[INVALID_PARAMS]]]  # range past the end of the object


# ---------------------------------------------------------------- health, lending, config


def test_health_check_master_unreachable(own_cluster):
    s = MooncakeDistributedStore()
    assert s.setup({"master_server_addr": own_cluster.master, "global_segment_size": 0, "timeout": 1, "retries": 1}) == 0
    assert s.health_check() == 0
    own_cluster.kill_master()
    assert s.health_check() == 2
    assert s.put("after-master-died", b"x") < 0
    assert s.close() == 0
    assert s.health_check() == 1


def test_global_segment_lends_memory(cluster, master, prefix):
    before = cluster.segments()
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "", master) == 0
    assert cluster.segments() == before + 1
    # replica_num=2 needs two segments: the storage node and the lent one.
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    assert s.put(prefix + "twice", b"x" * 1000, cfg) == 0
    other = MooncakeDistributedStore()
    assert setup7(other, master) == 0
    assert other.get(prefix + "twice") == b"x" * 1000
    cfg = ReplicateConfig(prefer_alloc_in_same_node=True)
    assert s.put(prefix + "local", b"y" * 100, cfg) == 0
    assert other.get(prefix + "local") == b"y" * 100
    other.close()
    s.remove_all(True)
    assert s.close() == 0
    assert cluster.segments() == before


def test_replicate_config_fields_and_type_rules():
    c = ReplicateConfig()
    assert (c.replica_num, c.with_soft_pin, c.soft_pin_ttl_ms, c.with_hard_pin) == (1, False, None, False)
    assert (c.preferred_segments, c.preferred_segment, c.prefer_alloc_in_same_node) == ([], "", False)
    assert c.soft_pin_action == SoftPinAction.PRESERVE
    c.soft_pin_ttl_ms = 5
    c.soft_pin_ttl_ms = None
    c.soft_pin_ttl_ms = 0
    for bad in (-1, 1.5, "10", 2**64):
        with pytest.raises(TypeError):
            c.soft_pin_ttl_ms = bad
    with pytest.raises(TypeError):
        c.replica_num = -1
    with pytest.raises(TypeError):
        c.preferred_segment = 5
    with pytest.raises(TypeError):
        c.preferred_segments = "abc"
    with pytest.raises(AttributeError):
        c.bogus = 1
    c.soft_pin_action = SoftPinAction.ENABLE
    assert c.soft_pin_action is SoftPinAction.ENABLE
    with pytest.raises(TypeError):
        c.soft_pin_action = 7
    assert [(m.name, int(m)) for m in SoftPinAction] == [("PRESERVE", 0), ("ENABLE", 1), ("DISABLE", 2)]
    assert ReplicateConfig(replica_num=2, with_hard_pin=True) == ReplicateConfig(2, False, None, True)
    assert "replica_num=2" in repr(ReplicateConfig(replica_num=2))


def test_puts_with_configs(store, prefix):
    pinned = ReplicateConfig(with_soft_pin=True, soft_pin_ttl_ms=60_000)
    assert store.put(prefix + "soft", b"v", pinned) == 0
    hard = ReplicateConfig()
    hard.with_hard_pin = True
    hard.preferred_segments = ["no-such-segment"]
    assert store.put(prefix + "hard", b"v", hard) == 0
    enabled = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE)
    assert store.put(prefix + "enabled", b"v", enabled) == 0
    zero = ReplicateConfig()
    zero.replica_num = 0
    assert store.put(prefix + "zero", b"v", zero) == INVALID_PARAMS
    with pytest.raises(TypeError):
        store.put(prefix + "bad", b"v", config="not-a-config")


def test_setup_twice_replaces_connection(master, prefix):
    s = MooncakeDistributedStore()
    assert setup7(s, master) == 0
    assert s.put(prefix + "one", b"1") == 0
    assert setup7(s, master) == 0
    assert s.get(prefix + "one") == b"1"
    s.remove(prefix + "one", True)
    s.close()


def test_full_pool_reports_no_space_per_key(own_cluster):
    """vLLM treats −200 as "store full": it must come per key, and only for
    keys that were really not stored (the 64 MiB pool is filled with
    hard-pinned objects, which eviction may not take)."""
    s = MooncakeDistributedStore()
    assert s.setup({"master_server_addr": own_cluster.master, "global_segment_size": 0}) == 0
    size, batch = 1 << 20, 16
    buf = np.ones(size, dtype=np.uint8)
    pinned = ReplicateConfig(with_hard_pin=True)
    stored, refused = [], []
    for b in range(10):
        keys = [f"full{b}/{i}" for i in range(batch)]
        rcs = s.batch_put_from_multi_buffers(keys, [[buf.ctypes.data]] * batch, [[size]] * batch, pinned)
        assert set(rcs) <= {0, -200}, rcs
        stored += [k for k, rc in zip(keys, rcs) if rc == 0]
        refused += [k for k, rc in zip(keys, rcs) if rc == -200]
        if refused:
            break
    assert stored and refused
    assert s.batch_is_exist(stored) == [1] * len(stored)
    assert s.batch_is_exist(refused) == [0] * len(refused)
    assert s.put_from("one-more", buf.ctypes.data, size, pinned) == -200
    assert s.remove_all(True) == len(stored)
    assert s.put_from("after-clear", buf.ctypes.data, size) == 0
    s.close()


# ---------------------------------------------------------------- disk tier


def test_objects_beyond_memory_are_served_from_the_disk_tier(disk_cluster, prefix):
    """The store's memory holds half a MiB; 8 MiB go in and all come back,
    most of them read from its disk tier, with no code change."""
    import kvpool

    s = MooncakeDistributedStore()
    assert setup7(s, disk_cluster.master, protocol="auto") == 0
    try:
        keys = [f"{prefix}disk-{i}" for i in range(128)]
        values = [np.random.default_rng(i).bytes(64 << 10) for i in range(128)]
        with kvpool.Client(disk_cluster.master) as c:
            for at in range(0, 128, 4):
                assert s.put_batch(keys[at:at + 4], values[at:at + 4]) == 0
                # A writer the disk keeps up with: memory is not made to evict.
                deadline = time.time() + 20
                while time.time() < deadline:
                    mem = [x for x in c.status()["segments"] if x["tier"] == "memory"][0]
                    if mem["used"] <= 0.6 * mem["size"]:
                        break
                    time.sleep(0.02)
            st = c.status()
            assert st["evictions"] == 0
            assert st["demotions"] >= 100
            assert {x["tier"] for x in st["segments"]} == {"memory", "disk"}
        assert s.get_batch(keys) == values
        for k, v in zip(keys[:8], values[:8]):
            assert s.get(k) == v
            assert s.get_size(k) == len(v)
            assert s.is_exist(k) == 1
        assert s.remove(keys[0], force=True) == 0
        assert s.is_exist(keys[0]) == 0
    finally:
        s.close()
