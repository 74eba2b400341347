"""kvpool.Client: the Pythonic API, zero-copy on buffer-protocol objects and
raw pointers, and the exception hierarchy."""

from __future__ import annotations

import mmap
import pickle

import numpy as np
import pytest

import kvpool
from kvpool import errors


def test_put_get_exists_remove(client, prefix):
    k = prefix + "a"
    client.put(k, b"hello")
    client.put(k, b"ignored")  # write-once
    assert client.get(k) == b"hello"
    assert client.exists(k) and k in client
    assert client.get_size(k) == 5
    client.upsert(k, b"replaced")
    assert client.get(k) == b"replaced"
    client.remove(k, force=True)
    assert not client.exists(k)


def test_exceptions(client, prefix):
    with pytest.raises(kvpool.NotFound) as ei:
        client.get(prefix + "missing")
    e = ei.value
    assert isinstance(e, kvpool.KvpoolError) and isinstance(e, LookupError)
    assert e.code == -704 and e.name == "OBJECT_NOT_FOUND"
    assert "OBJECT_NOT_FOUND" in str(e)
    with pytest.raises(kvpool.NotFound):
        client.get_size(prefix + "missing")
    with pytest.raises(kvpool.NotFound):
        client.remove(prefix + "missing")
    k = prefix + "leased"
    client.put(k, b"v")
    client.get(k)
    with pytest.raises(kvpool.LeaseHeld) as ei:
        client.remove(k)
    assert ei.value.code == -706
    client.remove(k, force=True)
    client.put(k, b"0123456789")
    with pytest.raises(kvpool.InvalidArgument) as ei:
        client.get_into(k, bytearray(4))
    assert isinstance(ei.value, ValueError) and ei.value.code == -600
    with pytest.raises(kvpool.InvalidArgument):
        client.put("", b"x")


def test_error_table():
    cases = {
        -704: kvpool.NotFound,
        -200: kvpool.NoSpace,
        -706: kvpool.LeaseHeld,
        -707: kvpool.LeaseExpired,
        -600: kvpool.InvalidArgument,
        -400: kvpool.InvalidArgument,
        -1012: kvpool.NotSupported,
        -901: kvpool.Timeout,
        -900: kvpool.Unavailable,
        -801: kvpool.Corrupted,
        -1: kvpool.KvpoolError,
        -12345: kvpool.KvpoolError,
    }
    for code, cls in cases.items():
        e = errors.error_for(code, "msg")
        assert type(e) is cls and e.code == code
    assert isinstance(errors.error_for(-901), TimeoutError)
    assert isinstance(errors.error_for(-900), ConnectionError)
    assert isinstance(errors.error_for(-1012), NotImplementedError)
    e = pickle.loads(pickle.dumps(errors.error_for(-706, "busy")))
    assert type(e) is kvpool.LeaseHeld and e.code == -706 and e.message == "busy"
    b = pickle.loads(pickle.dumps(kvpool.BatchError("x", -704, [None, 1])))
    assert b.results == [None, 1]


def test_numpy_zero_copy(client, prefix):
    src = np.random.default_rng(3).standard_normal((64, 32)).astype(np.float32)
    client.put(prefix + "np", src)
    dst = np.empty_like(src)
    assert client.get_into(prefix + "np", dst) == src.nbytes
    assert np.array_equal(dst, src)
    buf = client.get_buffer(prefix + "np")
    view = np.frombuffer(buf, dtype=np.float32).reshape(64, 32)
    assert np.array_equal(view, src)
    # The Buffer is writable and owned by Python.
    view[0, 0] = 42.0
    assert np.frombuffer(buf, dtype=np.float32)[0] == 42.0
    # Raw pointer + size.
    out = np.zeros(src.nbytes, dtype=np.uint8)
    assert client.get_into(prefix + "np", out.ctypes.data, out.nbytes) == src.nbytes
    assert out.tobytes() == src.tobytes()
    client.put_from(prefix + "ptr", src.ctypes.data, size=128)
    assert client.get(prefix + "ptr") == src.tobytes()[:128]


def test_other_buffer_types(client, prefix):
    client.put(prefix + "ba", bytearray(b"abc"))
    client.put(prefix + "mv", memoryview(b"0123456789")[2:5])
    m = mmap.mmap(-1, 4096)
    m.write(b"mmap-data")
    client.put(prefix + "mm", m, size=9)
    assert client.get(prefix + "mm") == b"mmap-data"
    dst = mmap.mmap(-1, 4096)
    assert client.get_into(prefix + "mv", dst) == 3
    assert dst[:3] == b"234"
    dst.close()
    m.close()
    with pytest.raises(BufferError):
        client.get_into(prefix + "ba", b"immutable")  # read-only destination
    nc = np.arange(20, dtype=np.uint8)[::2]
    with pytest.raises((BufferError, ValueError)):
        client.put(prefix + "nc", nc)  # not contiguous (numpy raises ValueError)
    with pytest.raises(TypeError):
        client.put(prefix + "obj", object())
    with pytest.raises(TypeError):
        client.put(prefix + "ptr", 4096)  # address without size
    with pytest.raises(kvpool.InvalidArgument):
        client.put(prefix + "big", b"abc", size=10)  # size beyond the buffer


def test_tensor_like_objects(client, prefix):
    class FakeTensor:
        """The subset of torch.Tensor kvpool uses."""

        def __init__(self, arr):
            self.arr = arr

        def data_ptr(self):
            return self.arr.ctypes.data

        def numel(self):
            return self.arr.size

        def element_size(self):
            return self.arr.itemsize

        def is_contiguous(self):
            return self.arr.flags["C_CONTIGUOUS"]

    t = FakeTensor(np.arange(8, dtype=np.int64))
    client.put(prefix + "t", t)
    out = FakeTensor(np.zeros(8, dtype=np.int64))
    assert client.get_into(prefix + "t", out) == 64
    assert (out.arr == np.arange(8)).all()
    with pytest.raises(kvpool.InvalidArgument):
        client.put(prefix + "nc", FakeTensor(np.arange(8)[::2]))


def test_torch_tensors(client, prefix):
    torch = pytest.importorskip("torch")
    t = torch.arange(1000, dtype=torch.float16)
    client.put(prefix + "torch", t)
    out = torch.empty_like(t)
    assert client.get_into(prefix + "torch", out) == t.numel() * t.element_size()
    assert torch.equal(out, t)
    buf = client.get_buffer(prefix + "torch")
    assert torch.equal(torch.frombuffer(buf, dtype=torch.float16), t)


def test_parts_and_batches(client, prefix):
    client.put_parts(prefix + "p", b"ab", bytearray(b"cd"), np.frombuffer(b"ef", dtype=np.uint8))
    assert client.get(prefix + "p") == b"abcdef"
    keys = [f"{prefix}b{i}" for i in range(4)]
    client.batch_put(keys, [b"0", [b"1", b"1"], bytearray(b"2"), np.frombuffer(b"3", dtype=np.uint8)])
    assert client.batch_get(keys + [prefix + "nope"]) == [b"0", b"11", b"2", b"3", None]
    bufs = client.batch_get_buffer([keys[1], prefix + "nope"])
    assert bytes(bufs[0]) == b"11" and bufs[1] is None
    dsts = [bytearray(4) for _ in range(3)]
    assert client.batch_get_into([keys[0], keys[1], prefix + "nope"], dsts) == [1, 2, None]
    assert bytes(dsts[1][:2]) == b"11"
    a, b = bytearray(1), bytearray(1)
    assert client.batch_get_into([keys[1]], [[a, b]]) == [2]
    assert client.batch_exists(keys + [prefix + "nope"]) == [True] * 4 + [False]
    client.batch_upsert(keys[:1], [b"new"])
    assert client.get(keys[0]) == b"new"
    assert client.batch_remove(keys + [prefix + "nope"], force=True) == [True] * 4 + [False]
    assert client.remove_by_regex("^" + prefix, force=True) >= 1


def test_batch_error_keeps_partial_results(client, prefix):
    keys = [prefix + "ok", prefix + "bad"]
    with pytest.raises(kvpool.BatchError) as ei:
        client.batch_put(keys, [b"fine", b"toolong"], sizes=[None, 99])
    e = ei.value
    assert e.results[0] is None and isinstance(e.results[1], kvpool.InvalidArgument)
    assert list(e.errors) == [1]
    assert client.get(prefix + "ok") == b"fine"  # the good key was stored
    client.get(prefix + "ok")
    with pytest.raises(kvpool.BatchError) as ei:
        client.batch_remove([prefix + "ok"])
    assert isinstance(ei.value.results[0], kvpool.LeaseHeld)


def test_status_ping_close_and_context_manager(master, prefix):
    with kvpool.Client(master) as c:
        assert c.ping()
        st = c.status()
        assert st["capacity"] > 0 and len(st["segments"]) >= 1
        assert c.master == master and c.lent_bytes == 0
        assert "pure client" in repr(c)
    assert c.closed
    with pytest.raises(kvpool.Unavailable):
        c.get(prefix + "x")
    c.close()  # idempotent


def test_metrics_count_keys_bytes_and_errors(master, prefix):
    with kvpool.Client(master) as c:
        c.put(prefix + "m", b"x" * 1000)
        assert c.get(prefix + "m") == b"x" * 1000
        with pytest.raises(kvpool.NotFound):
            c.get(prefix + "absent")
        m = c.get_metrics()
        assert m['kvpool_client_keys_total{op="get",result="ok"}'] == 1
        assert m['kvpool_client_errors_total{op="get",code="OBJECT_NOT_FOUND"}'] == 1
        assert m['kvpool_client_value_bytes_total{op="put"}'] == 1000
        moved = sum(v for k, v in m.items() if k.startswith('kvpool_client_transfer_bytes_total{direction="read"'))
        assert moved >= 1000
        assert "# TYPE kvpool_client_call_seconds histogram" in c.metrics_text()


def test_lending_client(cluster, master, prefix):
    before = cluster.segments()
    with kvpool.Client(master, segment_size="16MiB", hostname="127.0.0.1") as c:
        assert c.lent_bytes == 16 << 20
        assert cluster.segments() == before + 1
        c.put(prefix + "x", b"y", config=kvpool.ReplicateConfig(replica_num=2))
        assert c.get(prefix + "x") == b"y"
        c.remove(prefix + "x", force=True)
    assert cluster.segments() == before


def test_connect_errors():
    from conftest import free_port

    with pytest.raises(kvpool.Unavailable):
        kvpool.Client(f"127.0.0.1:{free_port()}", timeout=1, retries=0)
    with pytest.raises(kvpool.KvpoolError):
        kvpool.Client(f"etcd://127.0.0.1:{free_port()}", timeout=1, retries=0)
    with pytest.raises(kvpool.NotSupported):
        kvpool.Client("http://127.0.0.1:2379")
    with pytest.raises(kvpool.NotSupported):
        kvpool.Client(protocol="rdma")
    with pytest.raises(kvpool.InvalidArgument):
        kvpool.Client("127.0.0.1:99999")


def test_address_of():
    a = np.arange(10, dtype=np.uint8)
    ptr, size = kvpool.address_of(a)
    assert ptr == a.ctypes.data and size == 10
    with pytest.raises(BufferError):
        kvpool.address_of(b"ro", writable=True)


def test_codes_come_from_the_native_table():
    from kvpool import _native
    from kvpool.mooncake import _codes

    codes = _native.CODES
    # Each name is the one the native side gives its number; Mooncake's
    # FILE_NOT_FOUND is the drop-in's alias of -1100 (UNAUTHORIZED).
    for name, number in codes.items():
        assert _native.code_name(number) == name
    assert codes["OBJECT_NOT_FOUND"] == -704 and _codes.FILE_NOT_FOUND == -1100
    assert errors.NotFound.code == codes["OBJECT_NOT_FOUND"]
    assert errors.error_for(codes["RPC_TIMEOUT"]).__class__ is errors.Timeout
    assert _codes.TRANSFER_FAIL == codes["TRANSFER_FAIL"] == -800
