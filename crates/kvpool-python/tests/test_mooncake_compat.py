"""The same calls on the real Mooncake 0.3.13 and on kvpool.mooncake, answers
compared: edge codes, leases, soft pins, batches, ranged reads, tensors,
tensor parallelism, sessions, replicas and tasks, segments. Each scenario
runs on fresh stores of each system; key prefixes and segment names are
replaced by placeholders before comparing.

Where kvpool differs on purpose (Mooncake stores the wrong bytes, or
crashes) the test in test_mooncake_surface.py checks kvpool's documented
behaviour instead."""

from __future__ import annotations

import ctypes
import time
from typing import Any, Callable, Dict, List

import numpy as np
import pytest

from conftest import scribbling
from mooncake_ref import LEASE_MS, System, both, systems  # noqa: F401  (fixture)

torch = pytest.importorskip("torch")

SCENARIOS: Dict[str, Callable[[System], Any]] = {}


def scenario(fn: Callable[[System], Any]) -> Callable[[System], Any]:
    SCENARIOS[fn.__name__] = fn
    return fn


def buf(n: int, fill: int = 0) -> np.ndarray:
    return np.full(n, fill, dtype=np.uint8)


def ptr(a: np.ndarray, off: int = 0) -> int:
    return a.ctypes.data + off


def cfg(S: System, **kw: Any) -> Any:
    c = S.module.ReplicateConfig()
    for k, v in kw.items():
        setattr(c, k, v)
    return c


# ---------------------------------------------------------------- setup and codes


@scenario
def hostname_gets_a_port(S: System) -> Any:
    s = S.store(host="127.0.0.1")
    host, _, port = s.get_hostname().rpartition(":")
    return host, 12300 <= int(port) <= 14300


@scenario
def edge_codes(S: System) -> Any:
    s = S.store()
    a = np.arange(64, dtype=np.uint8)
    out = []
    out.append(("zero-size put_from", s.put_from(S.key("z"), ptr(a), 0), s.is_exist(S.key("z"))))
    out.append(("empty parts", s.put_parts(S.key("p"), b"", b"ab", b""), s.get(S.key("p"))))
    out.append(("all parts empty", s.put_parts(S.key("p0"), b"", b""), s.is_exist(S.key("p0"))))
    out.append(("empty key", s.put("", b"x"), s.put_from("", ptr(a), 4), s.upsert("", b"x")))
    out.append(("empty value", s.put(S.key("e"), b""), s.upsert(S.key("e"), b"")))
    out.append(("empty batch value", s.put_batch([S.key("b")], [b""])))
    out.append(("register", s.register_buffer(ptr(a), 64), s.register_buffer(ptr(a), 64), s.register_buffer(ptr(a, 8), 8)))
    out.append(("unregister", s.unregister_buffer(ptr(a)), s.unregister_buffer(ptr(a))))
    out.append(("replica_num beyond segments", s.put(S.key("r5"), b"abc", cfg(S, replica_num=5)), s.get(S.key("r5"))))
    out.append(("init_all on a live store", s.init_all("tcp", "", 0)))
    same = cfg(S, prefer_alloc_in_same_node=True)
    out.append(("same node, lending nothing", s.put(S.key("n"), b"x", same), s.put_from(S.key("n"), ptr(a), 4, same),
                s.batch_put_from([S.key("n")], [ptr(a)], [4], same)))
    out.append(("get_batch([])", s.get_batch([]), s.batch_get_buffer([])))
    out.append(("empty key reads", s.get(""), s.is_exist(""), s.get_size(""), s.remove(""), s.get_into("", ptr(a), 8)))
    return out


@scenario
def calls_before_setup(S: System) -> Any:
    # Only the calls Mooncake answers before setup (the others crash it).
    s = S.module.MooncakeDistributedStore()
    a = np.zeros(8, dtype=np.uint8)
    return s.put_from("k", ptr(a), 4), s.get("k"), s.get_batch(["a", "b"]), s.put_tensor("k", torch.ones(2))


@scenario
def rdma_without_devices_runs_over_tcp(S: System) -> Any:
    s = S.store(protocol="rdma")
    return s.put(S.key("r"), b"over tcp"), s.get(S.key("r"))


@scenario
def another_tenant_is_accepted(S: System) -> Any:
    s = S.store(tenant_id="other")
    return s.put(S.key("t"), b"x"), s.get(S.key("t"))


# ---------------------------------------------------------------- leases


@scenario
def existence_checks_take_read_leases(S: System) -> Any:
    s = S.store()
    out = []
    for name, check in (
        ("is_exist", lambda k: s.is_exist(k)),
        ("batch_is_exist", lambda k: s.batch_is_exist([k])),
        ("get_size", lambda k: s.get_size(k)),
    ):
        k = S.key(name)
        s.put(k, b"v")
        out.append((name, check(k), s.remove(k), s.batch_remove([k]), s.remove_by_regex("^" + k + "$")))
    k = S.key("fresh")
    s.put(k, b"v")
    out.append(("no check", s.remove(k)))
    k = S.key("forced")
    s.put(k, b"v")
    s.is_exist(k)
    out.append(("force", s.remove(k, True), s.is_exist(k)))
    return out


# ---------------------------------------------------------------- soft pins


@scenario
def soft_pin_rules_on_every_write(S: System) -> Any:
    s = S.store()
    a = np.arange(16, dtype=np.uint8)
    P = S.module.SoftPinAction
    configs = {
        "ttl+preserve": cfg(S, soft_pin_ttl_ms=1000),
        "ttl+disable": cfg(S, soft_pin_ttl_ms=1000, soft_pin_action=P.DISABLE),
        "ttl>day+enable": cfg(S, soft_pin_ttl_ms=86_400_001, soft_pin_action=P.ENABLE),
        "ttl=day+enable": cfg(S, soft_pin_ttl_ms=86_400_000, soft_pin_action=P.ENABLE),
        "enable": cfg(S, soft_pin_action=P.ENABLE),
    }
    out = []
    for name, c in configs.items():
        k = S.key(name)
        out.append((
            name,
            s.put(k + "a", b"x", c),
            s.upsert(k + "b", b"x", c),
            s.put_parts(k + "c", b"x", config=c),
            s.put_batch([k + "d"], [b"x"], c),
            s.put_from(k + "e", ptr(a), 16, c),
            s.upsert_from(k + "f", ptr(a), 16, c),
            s.batch_put_from([k + "g"], [ptr(a)], [16], c),
            s.batch_upsert_from([k + "h"], [ptr(a)], [16], c),
            s.batch_put_from_multi_buffers([k + "i"], [[ptr(a)]], [[16]], c),
        ))
    return out


# ---------------------------------------------------------------- batches


@scenario
def batches_overlap_duplicates_and_sizes(S: System) -> Any:
    s = S.store()
    src = np.arange(64, dtype=np.uint8)
    k1, k2 = S.key("32"), S.key("16")
    s.put_from(k1, ptr(src), 32)
    s.put_from(k2, ptr(src, 32), 16)
    out = []
    dst = buf(64)
    out.append(("overlapping destinations", s.batch_get_into([k1, k2], [ptr(dst), ptr(dst, 8)], [32, 16]), dst[:24].tolist()))
    dst = buf(64)
    out.append(("aliased destinations", s.batch_get_into([k2, k2], [ptr(dst), ptr(dst)], [16, 16]), dst[:16].tolist()))
    x, y = buf(16, 7), buf(16, 9)
    for name, call in (
        ("batch_put_from", lambda k: s.batch_put_from([k, k], [ptr(x), ptr(y)], [16, 16])),
        ("batch_upsert_from", lambda k: s.batch_upsert_from([k, k], [ptr(x), ptr(y)], [16, 16])),
        ("put_batch", lambda k: s.put_batch([k, k], [b"aa", b"bb"])),
        ("upsert_batch", lambda k: s.upsert_batch([k, k], [b"aa", b"bb"])),
        ("multi_buffers", lambda k: s.batch_put_from_multi_buffers([k, k], [[ptr(x)], [ptr(y)]], [[16], [16]])),
    ):
        k = S.key("dup-" + name)
        out.append((name, call(k), s.get(k)[:2]))
    k = S.key("sizes")
    out.append(("zero size and empty key in a batch", s.batch_put_from([k + "0", "", k], [ptr(x)] * 3, [0, 16, 16]),
                s.is_exist(k + "0"), s.is_exist(k)))
    out.append(("put_batch with an empty key", s.put_batch(["", k + "pb"], [b"a", b"b"]), s.is_exist(k + "pb")))
    out.append(("missing in batches", s.batch_get_into([S.key("nope")], [ptr(dst)], [16]), s.get_batch([S.key("nope"), k2])))
    return out


@scenario
def group_ids_are_a_placement_hint(S: System) -> Any:
    """SGLang's and vLLM's `enable_group_semantics` set `group_ids` on
    their puts: Mooncake stores the objects as without them."""
    s = S.store()
    x = buf(16, 5)
    g = cfg(S, group_ids=["layer-0"])
    k = S.key("grp")
    out = [("put", s.put(k + "p", b"value", g), s.get(k + "p"))]
    for n in (1, 2, 3):
        gn = cfg(S, group_ids=[f"g{i}" for i in range(n)])
        out.append((f"batch_put_from, {n} groups", s.batch_put_from([k + f"b{n}1", k + f"b{n}2"], [ptr(x), ptr(x)], [16, 16], gn),
                    s.get(k + f"b{n}1")[:4], s.is_exist(k + f"b{n}2")))
        out.append((f"put, {n} groups", s.put(k + f"p{n}", b"v", gn)))
        out.append((f"put_batch, {n} groups", s.put_batch([k + f"pb{n}1", k + f"pb{n}2"], [b"a", b"b"], gn)))
    out.append(("multi_buffers", s.batch_put_from_multi_buffers([k + "m"], [[ptr(x), ptr(x)]], [[8, 8]], g),
                s.get(k + "m")[:4]))
    out.append(("upsert", s.upsert(k + "p", b"other", g), s.get(k + "p")))
    return out


@scenario
def unmapped_source_pointer(S: System) -> Any:
    """A source address of unmapped memory (the first page, never mapped):
    that key fails with a code, the others are stored, nothing crashes."""
    s = S.store()
    x = buf(16, 3)
    bad = 0x1000
    k = S.key("unmapped")
    out = [("put_from", s.put_from(k + "1", bad, 16), s.is_exist(k + "1"))]
    out.append(("batch_put_from", s.batch_put_from([k + "2", k + "3"], [ptr(x), bad], [16, 16]),
                s.get(k + "2")[:4], s.is_exist(k + "3")))
    return out


@scenario
def long_keys(S: System) -> Any:
    """Engines' keys carry model names, ranks and hashes: keys of many KiB
    are stored, read, found, sized and removed like short ones."""
    s = S.store()
    a = np.arange(64, dtype=np.uint8)
    out = []
    for n in (4097, 16 << 10, 40_000):
        k = S.key("long-") + "k" * n
        out.append((n, s.put(k, b"value"), s.get(k), s.is_exist(k), s.get_size(k), s.put_from(k + "2", ptr(a), 64),
                    s.batch_is_exist([k, k + "2"]), s.get_into(k + "2", ptr(buf(64)), 64), s.remove(k + "2", True)))
    return out


@scenario
def source_changed_while_put(S: System) -> Any:
    """The caller writes into its source buffer while the put of it is in
    flight: the put is acknowledged and reads back whole (some mix of the
    bytes before and after), never a present object that fails every read."""
    s = S.store()
    n = 12 << 20  # a get's bytes must fit Mooncake's 16 MiB local buffer
    a = buf(n, 1)
    k = S.key("scribbled")
    with scribbling(a):
        rcs = [s.put_from(k + str(i), ptr(a), n) for i in range(3)]
        many = s.batch_put_from([k + "b0", k + "b1"], [ptr(a), ptr(a)], [n // 2, n // 2])
    out = []
    for name in [k + str(i) for i in range(3)] + [k + "b0", k + "b1"]:
        v = s.get(name)
        pages = set(np.frombuffer(v, dtype=np.uint8)[::4096].tolist())
        out.append((s.is_exist(name), len(v), pages <= {1, 2, 3}, set(np.frombuffer(v, dtype=np.uint8)[1::4096].tolist())))
    return rcs, many, out


# ---------------------------------------------------------------- ranged reads


@scenario
def get_into_ranges_cases(S: System) -> Any:
    s = S.store()
    src = np.arange(256, dtype=np.uint8)
    k1, k2 = S.key("r1"), S.key("r2")
    s.put_from(k1, ptr(src), 32)
    s.put_from(k2, ptr(src, 100), 16)
    dst, dst2, loose = buf(256), buf(64), buf(64)
    s.register_buffer(ptr(dst), 128)
    s.register_buffer(ptr(dst2), 64)
    D, D2 = ptr(dst), ptr(dst2)
    out = []

    def case(name: str, *args: Any) -> None:
        dst[:] = 0
        dst2[:] = 0
        r = s.get_into_ranges(*args)
        out.append((name, r, dst[:20].tolist(), dst[120:132].tolist(), dst2[56:64].tolist()))

    case("plain", [D], [[k1, k2]], [[[0, 8], [16]]], [[[0, 4], [2]]], [[[4, 4], [3]]])
    case("a key's lists disagree", [D], [[k1, k2]], [[[0, 8], [16]]], [[[0], [2]]], [[[4, 4], [3]]])
    case("past the object's end", [D], [[k1, k2]], [[[0], [16]]], [[[30], [2]]], [[[4], [3]]])
    case("past the registered end", [D], [[k1, k2]], [[[126], [16]]], [[[0], [2]]], [[[4], [3]]])
    case("one range past the end", [D], [[k1, k2]], [[[0, 300], [16]]], [[[0, 0], [2]]], [[[4, 4], [3]]])
    case("missing key", [D], [[k1, S.key("nope")]], [[[0], [16]]], [[[0], [2]]], [[[4], [3]]])
    case("missing key, 3 ranges", [D], [[S.key("nope")]], [[[0, 4, 8]]], [[[0, 0, 0]]], [[[4, 4, 4]]])
    case("two buffers", [D, D2], [[k1], [k2]], [[[0]], [[60]]], [[[0]], [[0]]], [[[4]], [[4]]])
    case("unregistered buffer", [ptr(loose)], [[k1]], [[[0]]], [[[0]]], [[[4]]])
    case("inside a registered buffer", [D + 64], [[k1]], [[[0]]], [[[0]]], [[[4]]])
    case("buffers and keys disagree", [D, D2], [[k1]], [[[0]]], [[[0]]], [[[4]]])
    case("keys and offsets disagree", [D], [[k1, k2]], [[[0]]], [[[0], [0]]], [[[4], [4]]])
    case("zero-size range", [D], [[k1]], [[[0]]], [[[0]]], [[[0]]])
    case("a key twice", [D], [[k1, k1]], [[[0], [8]]], [[[0], [4]]], [[[4], [4]]])
    case("to the object's end", [D], [[k1]], [[[124]]], [[[28]]], [[[4]]])
    case("nothing", [D], [[]], [[]], [[]], [[]])
    case("no buffers", [], [], [], [], [])
    assert loose.sum() == 0
    return out


# ---------------------------------------------------------------- tensors


DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
          "int64", "uint64", "bool", "float8_e4m3fn", "float8_e5m2"]


def sample(dtype: str, shape: tuple) -> Any:
    t = torch.arange(int(np.prod(shape)) or 0, dtype=torch.float32).reshape(shape)
    return (t % 7).to(getattr(torch, dtype))


@scenario
def tensors_round_trip_with_mooncakes_layout(S: System) -> Any:
    s = S.store()
    out = []
    shapes = [(3, 4), (2, 3, 4, 5, 6), (), (0,), (1,) * 8]
    for dt in DTYPES:
        for shape in shapes if dt == "float32" else [(2, 3)]:
            t = sample(dt, shape)
            k = S.key(f"{dt}-{len(shape)}")
            rc = s.put_tensor(k, t)
            raw = s.get(k)
            back = s.get_tensor(k)
            same = back is not None and back.dtype == t.dtype and tuple(back.shape) == tuple(t.shape) and torch.equal(
                back.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
            # Mooncake reads a 0-d tensor back wrong (test_mooncake_surface.py checks kvpool's).
            out.append((dt, shape, rc, raw.hex(), same if shape != () else None))
    nc = torch.arange(24, dtype=torch.int64).reshape(2, 3, 4)[:, :, ::2]
    k = S.key("non-contiguous")
    out.append(("non-contiguous", s.put_tensor(k, nc), s.get(k).hex(), torch.equal(s.get_tensor(k), nc)))
    out.append(("9 dims", s.put_tensor(S.key("9d"), torch.zeros((1,) * 9))))
    out.append(("complex", s.put_tensor(S.key("cx"), torch.zeros(2, dtype=torch.complex64))))
    out.append(("numpy", s.put_tensor(S.key("np"), np.zeros(3)), "list", s.put_tensor(S.key("l"), [1, 2])))
    out.append(("missing", s.get_tensor(S.key("nope")), "raw bytes", s.put(S.key("raw"), b"abcdef"), s.get_tensor(S.key("raw"))))
    k = S.key("wo")
    out.append(("write-once", s.put_tensor(k, torch.ones(2)), s.upsert_tensor(k, torch.zeros(3)), s.put_tensor(k, torch.ones(5)),
                s.get_tensor(k).tolist(), s.pub_tensor(k, torch.ones(1)), s.upsert_pub_tensor(k, torch.full((2,), 4.0)),
                s.get_tensor(k).tolist()))
    ks = [S.key("b1"), S.key("b2"), S.key("b3")]
    out.append(("batch", s.batch_put_tensor(ks[:2], [torch.ones(2), torch.zeros(3, dtype=torch.int8)]),
                [None if x is None else x.tolist() for x in s.batch_get_tensor(ks)],
                s.batch_put_tensor(ks, [torch.ones(1)]), s.batch_upsert_tensor(ks[:1], [torch.ones(4)]),
                s.batch_pub_tensor(ks[2:], [torch.ones(1)], cfg(S)), s.batch_upsert_pub_tensor(ks[2:], [torch.zeros(1)])))
    return out


@scenario
def tensor_buffers(S: System) -> Any:
    s = S.store()
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    k = S.key("t")
    s.put_tensor(k, t)
    b = torch.zeros(1024, dtype=torch.uint8)
    s.register_buffer(b.data_ptr(), 1024)
    out = []
    g = s.get_tensor_into(k, b.data_ptr(), 1024)
    out.append(("into", g.tolist(), g.data_ptr() - b.data_ptr(), bytes(b[:352].numpy()).hex()))
    out.append(("too small", s.get_tensor_into(k, b.data_ptr(), 100), "exact", s.get_tensor_into(k, b.data_ptr(), 352).tolist()))
    k2 = S.key("from")
    out.append(("from", s.put_tensor_from(k2, b.data_ptr(), 352), s.get_tensor(k2).tolist(),
                s.put_tensor_from(S.key("short"), b.data_ptr(), 351), s.put_tensor_from(S.key("long"), b.data_ptr(), 356),
                s.put_tensor_from(S.key("garbage"), b.data_ptr() + 8, 100), s.upsert_tensor_from(k2, b.data_ptr(), 352)))
    ks = [S.key("m1"), S.key("m2")]
    out.append(("batch from", s.batch_put_tensor_from(ks, [b.data_ptr(), b.data_ptr() + 1], [352, 10]),
                s.batch_upsert_tensor_from(ks[:1], [b.data_ptr()], [352])))
    out.append(("batch into", [None if x is None else x.tolist() for x in
                               s.batch_get_tensor_into([k, ks[0], S.key("nope")], [b.data_ptr(), b.data_ptr() + 400, b.data_ptr() + 800], [400, 400, 200])]))
    return out


@scenario
def tensor_parallel_shards(S: System) -> Any:
    s = S.store()
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    out = []
    k = S.key("tp")
    out.append(("tp 2 along 1", s.put_tensor_with_tp(k, t, tp_rank=0, tp_size=2, split_dim=1),
                s.get_size(k), s.get(k + "_tp_0").hex(), s.get(k + "_tp_1").hex(),
                s.get_tensor_with_tp(k, tp_rank=1, tp_size=2, split_dim=1).tolist(),
                s.get_tensor_with_tp(k, tp_rank=1, tp_size=4).tolist()))
    out.append(("uneven", s.put_tensor_with_tp(S.key("uneven"), t, tp_size=3, split_dim=1),
                s.put_tensor_with_tp(S.key("u2"), torch.arange(10.0), tp_size=3)))
    k = S.key("tp1")
    out.append(("tp 1", s.put_tensor_with_tp(k, t, tp_size=1), s.get(k).hex(), s.get_tensor_with_tp(k).tolist(),
                s.get_tensor_with_tp(k, 1, 2)))
    k = S.key("pub")
    out.append(("pub", s.pub_tensor_with_tp(k, t, cfg(S), 0, 2, 0), s.get(k + "_tp_1").hex(),
                s.batch_put_tensor_with_tp([S.key("b1"), S.key("b2")], [t, t], tp_size=2),
                [x.tolist() for x in s.batch_get_tensor_with_tp([S.key("b1"), S.key("b2")], 1, 2)]))
    b = torch.zeros(2048, dtype=torch.uint8)
    g = s.get_tensor_with_tp_into(k, b.data_ptr(), 2048, tp_rank=1, tp_size=2)
    out.append(("into", g.tolist(), [x.tolist() for x in s.batch_get_tensor_with_tp_into([k], [b.data_ptr() + 1024], [1024], 0, 2)]))
    src = torch.zeros(1024, dtype=torch.uint8)
    s.get_tensor_into(S.key("tp1"), src.data_ptr(), 1024)
    k = S.key("from")
    out.append(("from", s.put_tensor_with_tp_from(k, src.data_ptr(), 400, 0, 2, 0), s.get(k + "_tp_1").hex(),
                s.batch_put_tensor_with_tp_from([S.key("f2")], [src.data_ptr()], [400], 0, 2, 1), s.get(S.key("f2") + "_tp_0").hex()))
    return out


def axis(S: System, rank: int, size: int, split_dim: int = 0, kind: str = "tp") -> Any:
    """A ``ParallelAxis`` of ``S``."""
    a = S.module.ParallelAxis()
    a.kind, a.rank, a.size, a.split_dim = kind, rank, size, split_dim
    return a


def layout(S: System, *axes: Any) -> Any:
    """A ``TensorParallelism`` of ``S`` over ``axes``."""
    p = S.module.TensorParallelism()
    p.axes = list(axes)
    return p


def read_target(S: System, mode: str, p: Any = None) -> Any:
    """A ``ReadTarget`` of ``S``: ``mode``, and a layout if given."""
    r = S.module.ReadTarget()
    r.mode = mode
    if p is not None:
        r.parallelism = p
    return r


def as_list(t: Any) -> Any:
    """A tensor as nested lists (None stays None), to compare."""
    return None if t is None else t.tolist()


@scenario
def tensor_parallelism_requests(S: System) -> Any:
    s = S.store()
    t0 = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    out = []
    out.append(("kinds", [s.put_tensor_with_parallelism(S.key(kind), t0, layout(S, axis(S, 1, 2, kind=kind))) for kind in ("tp", "TP", "pp", "ep", "bogus")]))
    k = S.key("p")
    out.append(("shards", s.put_tensor_with_parallelism(k, t0, layout(S, axis(S, 0, 2))),
                s.put_tensor_with_parallelism(k, t0 + 100, layout(S, axis(S, 1, 2))), s.get(k + "_tp_1").hex(), s.get_size(k)))
    out.append(("reads", as_list(s.get_tensor_with_parallelism(k)), as_list(s.get_tensor_with_parallelism(k, read_target(S, "full"))),
                as_list(s.get_tensor_with_parallelism(k, read_target(S, "full", layout(S, axis(S, 0, 2))))),
                as_list(s.get_tensor_with_parallelism(k, read_target(S, "shard", layout(S, axis(S, 1, 4))))),
                as_list(s.get_tensor_with_parallelism(k, read_target(S, "shard", layout(S, axis(S, 0, 1))))),
                as_list(s.get_tensor_with_tp(k, 1, 2))))
    plain = S.key("plain")
    s.put_tensor(plain, t0)
    out.append(("plain", as_list(s.get_tensor_with_parallelism(plain)), as_list(s.get_tensor_with_parallelism(plain, read_target(S, "full"))),
                as_list(s.get_tensor_with_parallelism(plain, read_target(S, "shard", layout(S, axis(S, 1, 2)))))))
    out.append(("no layout", s.put_tensor_with_parallelism(S.key("none"), t0), "empty axes",
                s.put_tensor_with_parallelism(S.key("none2"), t0, layout(S))))
    ks = [S.key("bp1"), S.key("bp2")]
    out.append(("batch", s.batch_put_tensor_with_parallelism(ks, [t0, t0], [layout(S, axis(S, 0, 2)), layout(S, axis(S, 1, 2))]),
                [as_list(x) for x in s.batch_get_tensor_with_parallelism([ks[0], S.key("plain")])]))
    return out


@scenario
def writer_partitions_put_back_together(S: System) -> Any:
    """Several writers each store their partition of one tensor
    (`writer_partition`), or their TP shard (`parallelism`), or it is stored
    whole; readers ask for it whole or for one shard of several layouts,
    also while some shards are missing."""
    s = S.store()
    def reads(k: str, split: int = 0) -> Any:
        asks = [read_target(S, "full"), read_target(S, "full", layout(S, axis(S, 0, 2, split))), read_target(S, "full", layout(S, axis(S, 0, 1, split))),
                read_target(S, "shard", layout(S, axis(S, 1, 2, split))), read_target(S, "shard", layout(S, axis(S, 3, 4, split))),
                read_target(S, "shard", layout(S, axis(S, 0, 1, split))), read_target(S, "as_stored"), None]
        return [as_list(s.get_tensor_with_parallelism(k, a)) for a in asks]

    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    out = []
    for split in (0, 1):
        k = S.key(f"wp{split}")
        out.append((f"writers along {split}", [s.put_tensor_with_parallelism(k, t, writer_partition=axis(S, r, 2, split)) for r in (0, 1)],
                    reads(k, split)))
        k = S.key(f"tp{split}")
        out.append((f"TP shards along {split}", [s.put_tensor_with_parallelism(k, t, layout(S, axis(S, r, 2, split))) for r in (0, 1)],
                    reads(k, split)))
    k = S.key("half")
    out.append(("one of two writers", s.put_tensor_with_parallelism(k, t, writer_partition=axis(S, 1, 2)), reads(k)))
    k = S.key("tphalf")
    out.append(("one of two TP shards", s.put_tensor_with_parallelism(k, t, layout(S, axis(S, 1, 2))), reads(k)))
    k = S.key("whole")
    out.append(("stored whole", s.put_tensor(k, t), reads(k)))

    class Partition:
        rank, size, split_dim = 0, 2, 0

    out.append(("partition kinds", [s.put_tensor_with_parallelism(S.key(f"k{i}"), t, writer_partition=w) for i, w in enumerate(
        [Partition(), {"rank": 0, "size": 2, "split_dim": 0}, axis(S, 0, 2, 0, "pp"), axis(S, 3, 2), axis(S, 0, 5, 1)])],
        s.put_tensor_with_parallelism(S.key("both"), t, layout(S, axis(S, 0, 2)), writer_partition=axis(S, 0, 2))))
    return out


# ---------------------------------------------------------------- sessions


@scenario
def put_and_get_sessions(S: System) -> Any:
    s = S.store()
    src = np.arange(256, dtype=np.uint8)
    dst = buf(256)
    s.register_buffer(ptr(src), 256)
    s.register_buffer(ptr(dst), 256)
    out = []
    k = S.key("s")
    out.append(("start", s.batch_put_session_start([k, k + "b"], [16, 8]), s.is_exist(k)))
    out.append(("ranges", s.batch_put_from_multi_buffer_ranges([k, k + "b"], [[ptr(src), ptr(src, 50)], [ptr(src, 200)]],
                                                             [[8, 8], [8]], [[0, 8], [0]])))
    out.append(("end", s.batch_put_session_end([k, k + "b"]), s.get(k).hex(), s.get(k + "b").hex()))
    k = S.key("rv")
    out.append(("revoke", s.batch_put_session_start([k], [16]), s.batch_put_session_revoke([k]), s.is_exist(k),
                s.batch_put_session_end([k])))
    out.append(("ranges without a session", s.batch_put_from_multi_buffer_ranges([S.key("x")], [[ptr(src)]], [[8]], [[0]])))
    k = S.key("part")
    # Bytes never written are undefined in Mooncake (kvpool: zero).
    out.append(("partial", s.batch_put_session_start([k], [16]), s.batch_put_from_multi_buffer_ranges([k], [[ptr(src)]], [[8]], [[0]]),
                s.batch_put_session_end([k]), s.get(k)[:8].hex(), s.get_size(k)))
    k = S.key("over")
    out.append(("overrun", s.batch_put_session_start([k], [16]), s.batch_put_from_multi_buffer_ranges([k], [[ptr(src)]], [[8]], [[12]])))
    k = S.key("exists")
    s.put(k, b"existing")
    out.append(("existing", s.batch_put_session_start([k], [16]), "bad", s.batch_put_session_start([S.key("z"), ""], [0, 4])))
    k = S.key("g")
    s.put_from(k, ptr(src), 64)
    out.append(("get start", s.batch_get_session_start([k, S.key("nope")])))
    out.append(("get ranges", s.batch_get_into_multi_buffer_ranges([k], [[ptr(dst), ptr(dst, 100)]], [[4, 4]], [[10, 60]]),
                dst[:4].tolist(), dst[100:104].tolist()))
    out.append(("shape mismatch", s.batch_get_into_multi_buffer_ranges([k, S.key("nope")], [[ptr(dst)]], [[4]], [[10]])))
    out.append(("past the end", s.batch_get_into_multi_buffer_ranges([k], [[ptr(dst)]], [[8]], [[60]])))
    out.append(("end", s.batch_get_session_end([k]), s.batch_get_session_end([k])))
    k2 = S.key("g2")
    s.put_from(k2, ptr(src), 64)
    out.append(("no session", s.batch_get_into_multi_buffer_ranges([k2], [[ptr(dst)]], [[4]], [[10]])))
    return out


@scenario
def put_from_with_metadata_layout(S: System) -> Any:
    s = S.store()
    src = np.arange(256, dtype=np.uint8)
    k = S.key("m")
    return s.put_from_with_metadata(k, ptr(src, 100), ptr(src), 10, 4), s.get_size(k), s.get(k).hex()


# ---------------------------------------------------------------- replicas, tasks, segments


def descs(ds: List[Any]) -> Any:
    return [
        (str(d.status), d.is_memory_replica(), d.is_disk_replica(), d.get_memory_descriptor().buffer_descriptor.transport_endpoint,
         d.get_memory_descriptor().buffer_descriptor.size)
        for d in ds
    ]


def wait_task(s: Any, tid: Any) -> Any:
    for _ in range(100):
        q, rc = s.query_task(tid)
        if q is not None and str(q.status) in ("TaskStatus.SUCCESS", "TaskStatus.FAILED"):
            return q
        time.sleep(0.1)
    return s.query_task(tid)[0]


@scenario
def replicas_and_tasks(S: System) -> Any:
    s = S.store()
    lender = S.the_lender()
    other = lender.get_hostname()
    k = S.key("obj")
    s.put(k, b"x" * 100, cfg(S, preferred_segment=S.storage))
    out = [("desc", descs(s.get_replica_desc(k)), s.get_replica_desc(S.key("nope")),
            {kk: descs(v) for kk, v in s.batch_get_replica_desc([k, S.key("nope")]).items()})]
    tid, rc = s.create_copy_task(k, [other])
    q = wait_task(s, tid)
    out.append(("copy", rc, type(tid).__name__, len(tid), str(q.type), str(q.status), q.message, descs(s.get_replica_desc(k))))
    tid, rc = s.create_copy_task(k, [other])
    out.append(("copy again", rc, str(wait_task(s, tid).status), descs(s.get_replica_desc(k))))
    tid, rc = s.create_move_task(k, other, S.storage)
    q = wait_task(s, tid)
    out.append(("move onto a holder", rc, str(q.type), str(q.status)))
    out.append(("refusals", s.create_copy_task(S.key("nope"), [other]), s.create_copy_task(k, ["no-such-segment"]),
                s.create_copy_task(k, []), s.create_move_task(k, other, other), s.query_task((1, 2))))
    k2 = S.key("mv")
    s.put(k2, b"y" * 64, cfg(S, preferred_segment=S.storage))
    tid, rc = s.create_move_task(k2, S.storage, other)
    q = wait_task(s, tid)
    out.append(("move", rc, str(q.status), descs(s.get_replica_desc(k2)), s.get(k2) == b"y" * 64))
    k3 = S.key("nowhere")
    s.put(k3, b"z" * 64, cfg(S, preferred_segment=S.storage))
    tid, rc = s.create_move_task(k3, other, S.storage)
    out.append(("move from a segment without a replica", tid, rc, descs(s.get_replica_desc(k3))))
    return out


@scenario
def same_node_multi_buffer_puts(S: System) -> Any:
    """`prefer_alloc_in_same_node` on `batch_put_from_multi_buffers`, from a
    client that lends nothing: taken (one replica), placed on this host."""
    s = S.store()
    a = buf(64, 7)
    k = S.key("near")
    near = cfg(S, prefer_alloc_in_same_node=True)
    out = [("one replica", s.batch_put_from_multi_buffers([k + "1", k + "2"], [[ptr(a), ptr(a, 8)], [ptr(a)]], [[8, 8], [16]], near),
            [s.get(k + n) for n in "12"], [descs(s.get_replica_desc(k + n)) for n in "12"])]
    out.append(("two replicas", s.batch_put_from_multi_buffers([k + "3"], [[ptr(a)]], [[16]], cfg(S, prefer_alloc_in_same_node=True, replica_num=2)),
                s.is_exist(k + "3")))
    return out


@scenario
def replica_clear_after_leases(S: System) -> Any:
    s = S.store()
    lender = S.the_lender()
    other = lender.get_hostname()
    two = cfg(S, replica_num=2)
    k1, k2, k3 = S.key("a"), S.key("b"), S.key("c")
    s.put(k1, b"a" * 10, two)
    s.put(k2, b"b" * 10, two)
    s.put(k3, b"c" * 10, cfg(S, preferred_segment=S.storage))
    out = [("under lease", s.batch_replica_clear([k1], other))]
    time.sleep(LEASE_MS / 1000 + 0.5)
    out.append(("one segment", s.batch_replica_clear([k1, k3, S.key("nope")], other), s.is_exist(k1), descs(s.get_replica_desc(k1))))
    time.sleep(LEASE_MS / 1000 + 0.5)
    out.append(("every replica", s.batch_replica_clear([k2], ""), s.is_exist(k2)))
    time.sleep(LEASE_MS / 1000 + 0.5)
    out.append(("last replica", s.batch_replica_clear([k1], S.storage), s.is_exist(k1)))
    return out


@scenario
def segment_mounts(S: System, tmp: str = "/dev/shm") -> Any:
    import os
    import tempfile

    s = S.store()
    r = s.allocate_and_mount_segment(16 << 20)
    out = [("allocate", sorted(r), r["ret"], len(r["segment_ids"]), r["allocated_size"])]
    fd, path = tempfile.mkstemp(dir=tmp if os.path.isdir(tmp) else None)
    os.close(fd)
    try:
        os.truncate(path, 32 << 20)
        m = s.mount_segment(path, 16 << 20)
        out.append(("mount", sorted(m), m["ret"], len(m["segment_ids"])))
        out.append(("unmount", s.unmount_segment(["nope"]), s.unmount_and_free_segment(["nope"]),
                    s.unmount_segment(m["segment_ids"])))
    finally:
        os.unlink(path)
    return out


def raises(call: Callable[[], Any]) -> Any:
    """``call()``'s answer, or the name of the exception it raises."""
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - the exception's type is the answer
        return type(e).__name__


@scenario
def segment_sizes_and_empty_calls(S: System, tmp: str = "/dev/shm") -> Any:
    """Sizes Mooncake rounds or takes as "nothing", and the unmount calls
    with nothing to unmount; where later puts land shows what was mounted."""
    import os
    import tempfile

    s = S.store()
    me = s.get_hostname()
    here = cfg(S, preferred_segment=me)

    def landed(k: str) -> Any:
        return [(d.get_memory_descriptor().buffer_descriptor.transport_endpoint == me,
                 d.get_memory_descriptor().buffer_descriptor.size) for d in s.get_replica_desc(k)]

    d = tempfile.mkdtemp(dir=tmp if os.path.isdir(tmp) else None)
    path = os.path.join(d, "seg")
    with open(path, "wb") as f:
        f.truncate(32 << 20)
    out = []
    try:
        out.append(("mount size 0", s.mount_segment(path, 0), s.mount_segment(path, 0, 4096),
                    s.mount_segment(path, 0, 100), s.mount_segment(d, 0), s.mount_segment(os.path.join(d, "none"), 0),
                    os.path.getsize(path)))
        k = S.key("after-mount-0")
        out.append(("nothing mounted", s.put(k, b"x" * 1000, here), landed(k)))
        r = s.allocate_and_mount_segment(1000)
        out.append(("allocate 1000", r["ret"], len(r["segment_ids"]), r["allocated_size"]))
        k = S.key("15MiB")
        out.append(("on the rounded-up segment", s.put(k, b"y" * (15 << 20), here), landed(k), s.get(k) == b"y" * (15 << 20)))
        r = s.allocate_and_mount_segment((16 << 20) + 1)
        out.append(("allocate 16 MiB + 1", r["ret"], len(r["segment_ids"]), r["allocated_size"]))
        out.append(("allocate 0", s.allocate_and_mount_segment(0)))
        out.append(("nothing to unmount", s.unmount_segment([]), s.unmount_and_free_segment([]), s.unmount_and_free_segment([], 1),
                    s.unmount_local_disk_segment(), s.unmount_local_disk_segment(1)))
        out.append(("still there", s.get(k) == b"y" * (15 << 20), landed(k)))
        out.append(("negative", raises(lambda: s.allocate_and_mount_segment(-1)), raises(lambda: s.mount_segment(path, -1)),
                    raises(lambda: s.unmount_segment([], -1)), raises(lambda: s.unmount_local_disk_segment(-1)),
                    raises(lambda: s.unmount_segment("x"))))
    finally:
        os.unlink(path)
        os.rmdir(d)
    return out


@scenario
def save_tensor_failures(S: System, tmp: str = "/dev/shm") -> Any:
    import os
    import tempfile

    s = S.store()
    d = tempfile.mkdtemp(dir=tmp if os.path.isdir(tmp) else None)
    k = S.key("t")
    s.put_tensor(k, torch.arange(6, dtype=torch.float32))
    s.put(S.key("raw"), b"not a tensor")
    out = []
    try:
        f = os.path.join(d, "ok.safetensors")
        out.append(("saved", s.save_tensor_to_safetensor(k, f), os.path.getsize(f) > 24))
        out.append(("missing key", s.save_tensor_to_safetensor(S.key("nope"), os.path.join(d, "m"))))
        out.append(("empty key", s.save_tensor_to_safetensor("", os.path.join(d, "e"))))
        out.append(("not a tensor", s.save_tensor_to_safetensor(S.key("raw"), os.path.join(d, "r"))))
        out.append(("no such directory", s.save_tensor_to_safetensor(k, os.path.join(d, "no", "such"))))
        out.append(("a directory", s.save_tensor_to_safetensor(k, d)))
        out.append(("file name not a str", raises(lambda: s.save_tensor_to_safetensor(k, 5)),
                    raises(lambda: s.save_tensor_to_safetensor(S.key("nope"), 5))))
        out.append(("nothing written for failures", sorted(os.listdir(d))))
    finally:
        for n in os.listdir(d):
            os.unlink(os.path.join(d, n))
        os.rmdir(d)
    return out


@scenario
def buffer_handles_as_memory(S: System) -> Any:
    """What a BufferHandle's memoryview shows: signed bytes, shape, the
    bytes themselves, and what numpy and torch make of it."""
    s = S.store()
    k = S.key("b")
    s.put(k, b"\x01\xff\x80abc")
    out = []
    for h in (s.get_buffer(k), s.batch_get_buffer([k])[0]):
        mv = memoryview(h)
        out.append((mv.format, mv.tolist(), np.asarray(h).dtype.str, mv.itemsize, mv.shape, mv.strides, mv.ndim, mv.nbytes, mv.readonly, mv.c_contiguous, bytes(mv),
                    np.frombuffer(h, dtype=np.uint8).tolist(), torch.frombuffer(h, dtype=torch.uint8).tolist(),
                    len(h), h.size(), h.ptr() != 0, mv.cast("B").tolist()))
    return out


@scenario
def argument_types(S: System) -> Any:
    """Values of the wrong type: Mooncake's binding refuses them with
    TypeError (or converts them); none is read as something else."""
    s = S.store()
    m = S.module
    out = []

    def field(attr: str, v: Any) -> Any:
        c = m.ReplicateConfig()
        setattr(c, attr, v)
        return str(getattr(c, attr))

    for attr, values in (
        ("with_hard_pin", ["no", "false", "", [], 1, 0, None, 1.0, np.bool_(True), True]),
        ("prefer_alloc_in_same_node", ["no", "true", 1, None, False]),
        ("soft_pin_action", [1, 0, 7, "ENABLE", None, m.SoftPinAction.ENABLE]),
        ("data_type", [1, "KVCACHE", m.ObjectDataType.KVCACHE]),
    ):
        out.append((attr, [raises(lambda v=v: field(attr, v)) for v in values]))

    def mode(v: Any) -> Any:
        r = m.ReadTarget()
        r.mode = v
        return r.mode

    out.append(("ReadTarget.mode", [raises(lambda v=v: mode(v)) for v in
                                    ("full", "shard", "as_stored", "FULL", "As_Stored", "bogus", "", " full", "as-stored", 1, None)]))
    out.append(("ReadTarget(mode=...)", [raises(lambda v=v: m.ReadTarget(mode=v)) for v in ("bogus", "", 1, None)]))
    out.append(("query_task", [raises(lambda v=v: s.query_task(v)) for v in
                               ("x", "ab", 5, None, (1,), (1, 2, 3), (-1, 2), (2**64, 2), (1.0, 2))]
                + [raises(lambda v=v: s.query_task(v)[1]) for v in ((1, 2), [1, 2], (True, 2), (np.uint64(1), 2))]))
    a = np.zeros(64, dtype=np.uint8)
    p = ptr(a)
    out.append(("register_buffer", [raises(lambda x=x, n=n: s.register_buffer(x, n)) for x, n in (
        (p, -1), (-1, 8), ("x", 8), (p, 8.0), (float(p), 8), (2**64, 8), (0, 8), (p, 0), (p, "8"))]))
    out.append(("register_buffer, numpy ints and bools", s.register_buffer(np.uint64(p), np.int64(8)),
                s.register_buffer(p + 8, True), s.unregister_buffer(np.uint64(p)), s.unregister_buffer(p + 8)))
    out.append(("unregister_buffer", [raises(lambda x=x: s.unregister_buffer(x)) for x in (-1, 1.0, "x", None, 2**64, 4096)]))
    return out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_answers_as_mooncake(systems, name):  # noqa: F811 - the fixture
    r = both(systems, SCENARIOS[name])
    kv, mc = r["kvpool"], r["mooncake"]
    if isinstance(kv, list) and isinstance(mc, list) and len(kv) == len(mc):
        diff = [f"  #{i}\n    kvpool:   {a!r}\n    mooncake: {b!r}" for i, (a, b) in enumerate(zip(kv, mc)) if a != b]
        assert not diff, "answers differ:\n" + "\n".join(diff)
    assert kv == mc
