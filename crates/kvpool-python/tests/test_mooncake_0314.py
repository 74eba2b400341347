"""Mooncake 0.3.14's new store calls in kvpool.mooncake, against a real
kvpool cluster: lease-free probes (``probe_key``, ``batch_probe_key``),
``ExistOptions``, snapshot ranged reads (``prepare_get_into_ranges_snapshot``,
``get_into_ranges_from_snapshot``, ``RangedReadSnapshot``),
``begin_weight_snapshot``, the new ``ReplicateConfig`` fields and setup
arguments.

The expected answers were observed on the real Mooncake 0.3.14 (the
mooncake-transfer-engine-cuda13 wheel's binaries over TCP on loopback),
except where a test says kvpool differs on purpose (docs/python.md,
"Differences from Mooncake"): no crash before setup, and snapshot reads of
what a key holds now, never of a replaced or removed object's old bytes."""

from __future__ import annotations

import ctypes
import logging
import sys
import time
import types

import pytest

from conftest import setup7
from kvpool.mooncake import ExistOptions, MooncakeDistributedStore, RangedReadSnapshot, ReplicateConfig

INVALID_PARAMS, OBJECT_NOT_FOUND, OBJECT_HAS_LEASE, NOT_SUPPORTED = -600, -704, -706, -1012
A, B = b"A" * 64, b"B" * 64


@pytest.fixture
def reader(master):
    """A second client of the session cluster (holds snapshots; `store` writes)."""
    s = MooncakeDistributedStore()
    assert setup7(s, master) == 0
    yield s
    s.close()


class Buffer:
    """A registered 4 KiB destination, filled with '.' before each read."""

    def __init__(self, store: MooncakeDistributedStore, size: int = 4096) -> None:
        self.raw = ctypes.create_string_buffer(size)
        self.ptr = ctypes.addressof(self.raw)
        assert store.register_buffer(self.ptr, size) == 0

    def read(self, store, snap, keys, dst, src, sizes):
        """One buffer's ``get_into_ranges_from_snapshot``: its answer for that buffer."""
        ctypes.memset(self.ptr, ord("."), len(self.raw))
        return store.get_into_ranges_from_snapshot(snap, [self.ptr], [keys], [dst], [src], [sizes])[0]

    def bytes(self, start: int, n: int) -> bytes:
        return self.raw.raw[start:start + n]


# ---------------------------------------------------------------- probes


def test_probe_key_takes_no_lease_where_is_exist_does(store, prefix):
    k = prefix + "k"
    assert store.put(k, A) == 0
    assert store.probe_key(k) == 1
    assert store.probe_key(prefix + "missing") == 0
    assert store.probe_key("") == 0  # Mooncake 0.3.14's answer
    assert store.remove(k) == 0  # no lease held
    assert store.probe_key(k) == 0
    # For comparison: is_exist leases (Mooncake 0.3.14 still does).
    assert store.put(k, A) == 0
    assert store.is_exist(k) == 1
    assert store.remove(k) == OBJECT_HAS_LEASE
    with pytest.raises(TypeError):
        store.probe_key(5)


def test_batch_probe_key_none_policy(store, prefix):
    a, b, c = (prefix + x for x in "abc")
    assert store.put(a, A) == 0 and store.put(b, B) == 0
    assert store.batch_probe_key([a, prefix + "missing", b]) == [1, 0, 1]
    assert store.batch_probe_key(["", a]) == [0, 1]
    # "none" ignores candidate_size, even one that does not divide the keys.
    assert store.batch_probe_key([a, b, c], "none", 2) == [1, 1, 0]
    assert store.batch_probe_key([a, b], "none", 0) == [1, 1]
    assert store.batch_probe_key([]) == []
    assert [store.remove(k) for k in (a, b)] == [0, 0]  # no leases


def test_batch_probe_key_last_hit_only_leases_one_group(store, prefix):
    p4, p5, p6, q1, q2 = (prefix + x for x in ("p4", "p5", "p6", "q1", "q2"))
    for k in (p4, p5, p6, q1, q2):
        assert store.put(k, A) == 0
    # Groups [p4, p5] (all 1) and [p6, missing]: only the first is leased.
    assert store.batch_probe_key([p4, p5, p6, prefix + "missing"], "LastHitOnly", 2) == [1, 1, 1, 0]
    assert [store.remove(k) for k in (p4, p5, p6)] == [OBJECT_HAS_LEASE, OBJECT_HAS_LEASE, 0]
    # Groups of one: the last hit is q2.
    assert store.batch_probe_key([q1, q2], "LastHitOnly") == [1, 1]
    assert [store.remove(k) for k in (q1, q2)] == [0, OBJECT_HAS_LEASE]


def test_batch_probe_key_errors(store, prefix):
    a, b, c = (prefix + x for x in "abc")
    assert store.put(a, A) == 0 and store.put(b, A) == 0 and store.put(c, A) == 0
    assert store.batch_probe_key([a, b], "LastHitOnly", 0) == [INVALID_PARAMS] * 2
    assert store.batch_probe_key([a, b, c], "LastHitOnly", 2) == [INVALID_PARAMS] * 3
    assert store.batch_probe_key([a, b], "LastHitOnly", 3) == [INVALID_PARAMS] * 2
    assert store.batch_probe_key([], "LastHitOnly", 0) == []
    assert [store.remove(k) for k in (a, b, c)] == [0, 0, 0]  # nothing was leased
    for policy in ("lasthitonly", "None", "bogus", ""):
        with pytest.raises(ValueError, match=f"Unknown batch_probe_key policy: {policy}$"):
            store.batch_probe_key([a], policy)
    for policy, size in ((None, 1), (1, 1), ("none", -1), ("none", 1.5)):
        with pytest.raises(TypeError):
            store.batch_probe_key([a], policy, size)


def test_probes_before_setup_and_after_close(master):
    """Mooncake 0.3.14 answers −600 per key from batch_probe_key here and
    crashes (SIGSEGV) in probe_key; kvpool answers −600 from both."""
    s = MooncakeDistributedStore()
    assert s.probe_key("k") == INVALID_PARAMS
    assert s.batch_probe_key(["a", "b"]) == [INVALID_PARAMS] * 2
    assert s.batch_probe_key(["a", "b"], "LastHitOnly", 2) == [INVALID_PARAMS] * 2
    with pytest.raises(ValueError):
        s.batch_probe_key(["a"], "bogus")  # the policy is checked first, as Mooncake
    assert setup7(s, master) == 0
    assert s.close() == 0
    assert s.probe_key("k") == INVALID_PARAMS
    assert s.batch_probe_key(["a", "b", "c"]) == [INVALID_PARAMS] * 3


# ---------------------------------------------------------------- ExistOptions


def test_exist_options():
    o = ExistOptions()
    assert o.prefetch_to_memory is False
    assert str(o) == "ExistOptions: { prefetch_to_memory: 0 }"
    o.prefetch_to_memory = True
    assert str(o) == "ExistOptions: { prefetch_to_memory: 1 }"
    o.prefetch_to_memory = None  # pybind11's bool takes None as False
    assert o.prefetch_to_memory is False
    o.prefetch_to_memory = 1
    assert o.prefetch_to_memory is True
    with pytest.raises(TypeError):
        o.prefetch_to_memory = "yes"
    with pytest.raises(AttributeError):
        o.other = 1  # type: ignore[attr-defined]
    import kvpool.mooncake as km
    import kvpool.mooncake_types as kt

    assert km.ExistOptions is kt.ExistOptions and "ExistOptions" in km.__all__


def test_is_exist_takes_options_and_either_first_parameter_name(store, prefix):
    k = prefix + "k"
    assert store.put(k, A) == 0
    prefetch = ExistOptions()
    prefetch.prefetch_to_memory = True  # accepted, no effect: kvpool has no client SSD tier
    assert store.is_exist(k) == 1  # 0.3.13: positional
    assert store.is_exist(key=k) == 1  # 0.3.14: named
    assert store.is_exist(k, ExistOptions()) == 1
    assert store.is_exist(k, options=prefetch) == 1
    assert store.is_exist(prefix + "missing", prefetch) == 0
    assert store.batch_is_exist([k, prefix + "missing", ""], prefetch) == [1, 0, 0]
    assert store.batch_is_exist(keys=[k], options=ExistOptions()) == [1]
    assert store.remove(k) == OBJECT_HAS_LEASE  # is_exist still leases, options or not
    with pytest.raises(TypeError):
        store.is_exist(k, "prefetch")
    with pytest.raises(TypeError):
        store.batch_is_exist([k], 1)


# ---------------------------------------------------------------- snapshot ranged reads


def test_ranged_read_snapshot_cannot_be_constructed():
    with pytest.raises(TypeError, match="No constructor defined!"):
        RangedReadSnapshot()


def test_snapshot_reads_ranges_and_holds_leases(store, reader, prefix):
    a, b, c, missing = (prefix + x for x in ("a", "b", "c", "missing"))
    assert store.put(a, bytes(range(64))) == 0 and store.put(b, bytes(range(100, 164))) == 0
    buf = Buffer(reader)
    snap = reader.prepare_get_into_ranges_snapshot([a, b, missing, a])  # repeated keys are fine
    assert isinstance(snap, RangedReadSnapshot)
    # Prepare leases as is_exist does: only a forced remove goes through.
    assert store.remove(b) == OBJECT_HAS_LEASE
    got = buf.read(reader, snap, [a, b], [[0, 10], [100]], [[0, 5], [1]], [[4, 3], [8]])
    assert got == [[4, 3], [8]]
    assert buf.bytes(0, 4) == bytes(range(4)) and buf.bytes(10, 3) == bytes(range(5, 8))
    assert buf.bytes(100, 8) == bytes(range(101, 109))
    # A key not in the snapshot is −600 per range and is not read, even if it exists.
    assert store.put(c, A) == 0
    assert buf.read(reader, snap, [c], [[0, 8]], [[0, 0]], [[4, 4]]) == [[INVALID_PARAMS, INVALID_PARAMS]]
    assert buf.bytes(0, 12) == b"." * 12
    assert store.remove(c) == 0  # the snapshot read took no lease on it
    # Missing: −704 per range. Past the object: −600 for that range only.
    assert buf.read(reader, snap, [missing], [[0, 8]], [[0, 0]], [[4, 4]]) == [[OBJECT_NOT_FOUND] * 2]
    assert buf.read(reader, snap, [a], [[0, 8]], [[60, 0]], [[10, 4]]) == [[INVALID_PARAMS, 4]]
    assert buf.bytes(0, 4) == b"...." and buf.bytes(8, 4) == bytes(range(4))
    assert buf.read(reader, snap, [a], [[0]], [[0]], [[0]]) == [[0]]
    # Lists of one key that disagree: −600 per dst offset.
    assert buf.read(reader, snap, [a], [[0, 1]], [[0]], [[4]]) == [[INVALID_PARAMS] * 2]
    # Empty lists and the empty key (kept as missing, as Mooncake: −704).
    assert reader.get_into_ranges_from_snapshot(snap, [], [], [], [], []) == []
    assert buf.read(reader, snap, [], [], [], []) == []
    assert buf.read(reader, snap, [a], [[]], [[]], [[]]) == [[]]
    empty = reader.prepare_get_into_ranges_snapshot(["", a])
    assert buf.read(reader, empty, ["", a], [[0], [8]], [[0], [0]], [[4], [4]]) == [[OBJECT_NOT_FOUND], [4]]
    assert isinstance(reader.prepare_get_into_ranges_snapshot([]), RangedReadSnapshot)


def test_snapshot_shape_errors_answer_as_get_into_ranges(store, reader, prefix):
    a, b = prefix + "a", prefix + "b"
    assert store.put(a, A) == 0 and store.put(b, B) == 0
    buf = Buffer(reader)
    snap = reader.prepare_get_into_ranges_snapshot([a, b])
    args = ([buf.ptr], [[a], [b]], [[[0]], [[0]]], [[[0]], [[0]]], [[[2]], [[2]]])
    want = reader.get_into_ranges(*args)
    assert want == [[[INVALID_PARAMS]]]  # Mooncake 0.3.14's answer to both
    assert reader.get_into_ranges_from_snapshot(snap, *args) == want
    # A destination past the registered buffer, or not registered: −600.
    assert buf.read(reader, snap, [a], [[4090]], [[0]], [[10]]) == [[INVALID_PARAMS]]
    other = ctypes.create_string_buffer(64)
    got = reader.get_into_ranges_from_snapshot(snap, [ctypes.addressof(other)], [[a]], [[[0]]], [[[0]]], [[[4]]])
    assert got == [[[INVALID_PARAMS]]] and other.raw[:4] == b"\0" * 4


def test_snapshot_reads_what_the_key_holds_now(store, reader, prefix):
    """kvpool differs from Mooncake 0.3.14 on purpose here: Mooncake reads
    an upserted object's old bytes, and a force-removed object's (freed)
    bytes, until the snapshot's lease midpoint; kvpool reads the current
    object, and never a removed one's bytes."""
    a, late = prefix + "a", prefix + "late"
    assert store.put(a, A) == 0
    buf = Buffer(reader)
    snap = reader.prepare_get_into_ranges_snapshot([a, late])
    # Put after prepare: read (Mooncake too, as its snapshot holds a missing key).
    assert store.put(late, b"L" * 16) == 0
    assert buf.read(reader, snap, [late], [[0]], [[0]], [[4]]) == [[4]] and buf.bytes(0, 4) == b"LLLL"
    # Upserted after prepare: the new bytes (Mooncake: still "AAAA").
    assert store.upsert(a, B) == 0
    assert buf.read(reader, snap, [a], [[0]], [[0]], [[4]]) == [[4]] and buf.bytes(0, 4) == b"BBBB"
    # Force-removed: −704, nothing written (Mooncake: the old bytes).
    assert store.remove(a, True) == 0
    assert buf.read(reader, snap, [a], [[0]], [[0]], [[4]]) == [[OBJECT_NOT_FOUND]]
    assert buf.bytes(0, 4) == b"...."
    # Put again, bigger: a range past the old size is read (Mooncake: −600).
    assert store.put(a, b"C" * 128) == 0
    assert buf.read(reader, snap, [a], [[0]], [[0]], [[100]]) == [[100]] and buf.bytes(0, 100) == b"C" * 100


def test_snapshot_of_another_store_or_none(store, reader, prefix):
    a = prefix + "a"
    assert store.put(a, A) == 0
    buf = Buffer(reader)
    theirs = store.prepare_get_into_ranges_snapshot([a])
    for snap in (theirs, None, "snapshot"):
        with pytest.raises(ValueError, match="^Ranged-read snapshot belongs to another Store$"):
            reader.get_into_ranges_from_snapshot(snap, [buf.ptr], [[a]], [[[0]]], [[[0]]], [[[4]]])
    with pytest.raises(TypeError):
        reader.prepare_get_into_ranges_snapshot(None)
    with pytest.raises(TypeError):
        reader.prepare_get_into_ranges_snapshot(a)


def test_snapshot_before_setup_and_after_close(master, prefix):
    s = MooncakeDistributedStore()
    for call in (lambda: s.prepare_get_into_ranges_snapshot([prefix]),
                 lambda: s.get_into_ranges_from_snapshot(None, [], [], [], [], [])):
        with pytest.raises(RuntimeError, match="^Client is not initialized$"):
            call()
    assert setup7(s, master) == 0
    buf = Buffer(s)
    snap = s.prepare_get_into_ranges_snapshot([prefix + "a"])
    assert s.close() == 0
    with pytest.raises(RuntimeError, match="^Client is not initialized$"):
        s.get_into_ranges_from_snapshot(snap, [buf.ptr], [[prefix + "a"]], [[[0]]], [[[0]]], [[[4]]])
    with pytest.raises(RuntimeError, match="^Client is not initialized$"):
        s.prepare_get_into_ranges_snapshot([prefix + "a"])


def test_snapshot_leases_are_renewed_while_it_is_read(short_lease, prefix):
    """With a 1 s lease: unread, a snapshot's leases lapse (no background
    timer, as Mooncake); read, it renews them all at least at the lease's
    midpoint, including keys the reads do not name."""
    owner, rd = MooncakeDistributedStore(), MooncakeDistributedStore()
    assert setup7(owner, short_lease.master) == 0 and setup7(rd, short_lease.master) == 0
    try:
        buf = Buffer(rd)
        idle, read, kept = prefix + "idle", prefix + "read", prefix + "kept"
        for k in (idle, read, kept):
            assert owner.put(k, A) == 0
        rd.prepare_get_into_ranges_snapshot([idle])
        assert owner.remove(idle) == OBJECT_HAS_LEASE
        time.sleep(1.3)
        assert owner.remove(idle) == 0  # unused: the lease ran out
        snap = rd.prepare_get_into_ranges_snapshot([read, kept])
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5:  # 2.5 leases long, reading `read` only
            assert buf.read(rd, snap, [read], [[0]], [[0]], [[4]]) == [[4]]
            time.sleep(0.1)
        assert owner.remove(kept) == OBJECT_HAS_LEASE
        time.sleep(1.3)
        assert owner.remove(kept) == 0  # no longer read: it lapses
    finally:
        owner.remove_all(True)
        owner.close()
        rd.close()


# ---------------------------------------------------------------- weight snapshots


def test_begin_weight_snapshot_hands_over_to_mooncakes_weight_store(store, monkeypatch):
    calls = []
    fake = types.ModuleType("mooncake.reshard.weight.store")
    fake.begin_weight_snapshot = lambda *a: calls.append(a) or "writer"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mooncake.reshard.weight.store", fake)
    snapshot, adapter = object(), object()
    assert store.begin_weight_snapshot(snapshot, adapter) == "writer"
    assert calls == [(store, snapshot, adapter)]


def test_begin_weight_snapshot_without_mooncakes_package(store, monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake.reshard.weight.store", None)  # "not installed"
    with pytest.raises(ImportError, match=r"mooncake\.reshard\.weight\.store") as e:
        store.begin_weight_snapshot(object(), object())
    assert "kvpool has no weight store" in str(e.value)


def test_begin_weight_snapshot_with_the_real_weight_store(store):
    """Where Mooncake ≥ 0.3.14's Python package is installed: its weight
    store is called with this store (None as adapter fails in it, with
    Mooncake 0.3.14's AttributeError, before touching the store)."""
    pytest.importorskip("mooncake.reshard.weight.store")
    with pytest.raises(AttributeError, match="export_source"):
        store.begin_weight_snapshot(None, None)


# ---------------------------------------------------------------- ReplicateConfig


def test_replicate_config_new_fields_are_type_checked():
    c = ReplicateConfig()
    fields = ("session_ids", "residency_affinity_ids", "preferred_hca_names")
    assert [getattr(c, f) for f in fields] == [None, None, None] and c.per_key_preferred_hca_names is None
    for f in fields:
        setattr(c, f, ("a", b"b"))  # any iterable; bytes decoded, as pybind11 does
        assert getattr(c, f) == ["a", "b"]
        setattr(c, f, [])
        assert getattr(c, f) == []
        for bad in ("ab", [1], 5, [None]):
            with pytest.raises(TypeError):
                setattr(c, f, bad)
        setattr(c, f, None)
        assert getattr(c, f) is None
    c.per_key_preferred_hca_names = [("mlx5_0",), []]
    assert c.per_key_preferred_hca_names == [["mlx5_0"], []]
    for bad in ("x", ["ab"], [[1]], [None]):
        with pytest.raises(TypeError):
            c.per_key_preferred_hca_names = bad
    # Part of equality, and constructor keywords like the other fields.
    full = dict(session_ids=["s"], residency_affinity_ids=["r"], preferred_hca_names=["h"],
                per_key_preferred_hca_names=[["h"]])
    assert ReplicateConfig(**full) == ReplicateConfig(**full)
    for f in full:
        assert ReplicateConfig(**full) != ReplicateConfig(**{**full, f: None})


def test_replicate_config_per_key_hints_name_one_entry_per_key(store, prefix):
    """As Mooncake 0.3.14: batch writes check session_ids,
    residency_affinity_ids and per_key_preferred_hca_names against the
    keys (−600 for every key); a one-key put checks the first two only."""
    buf = Buffer(store)
    keys = [prefix + "b1", prefix + "b2"]

    def cfg(**kw):
        return ReplicateConfig(**kw)

    for f, one in (("session_ids", ["s"]), ("residency_affinity_ids", ["r"]), ("per_key_preferred_hca_names", [["h"]])):
        assert store.batch_put_from(keys, [buf.ptr] * 2, [4, 4], cfg(**{f: one})) == [INVALID_PARAMS] * 2
        assert store.batch_put_from(keys, [buf.ptr] * 2, [4, 4], cfg(**{f: []})) == [INVALID_PARAMS] * 2
        assert store.put_batch(keys, [A, B], cfg(**{f: one})) == INVALID_PARAMS
    assert store.batch_is_exist(keys) == [0, 0]
    hints = cfg(session_ids=["s1", "s2"], residency_affinity_ids=["r1", "r2"],
                per_key_preferred_hca_names=[["mlx5_0"], []], preferred_hca_names=["a", "b", "c"])
    assert store.batch_put_from(keys, [buf.ptr] * 2, [4, 4], hints) == [0, 0]
    # One key: two session or affinity ids are −600, two per-key HCA lists are fine.
    assert store.put(prefix + "s", A, cfg(session_ids=["s1", "s2"])) == INVALID_PARAMS
    assert store.put(prefix + "s", A, cfg(session_ids=[])) == INVALID_PARAMS
    assert store.put_from(prefix + "s", buf.ptr, 4, cfg(residency_affinity_ids=["r1", "r2"])) == INVALID_PARAMS
    assert store.put(prefix + "h", A, cfg(per_key_preferred_hca_names=[["x"], ["y"]])) == 0
    assert store.put(prefix + "o", A, cfg(session_ids=["s"], residency_affinity_ids=["r"], preferred_hca_names=[])) == 0
    assert store.get(prefix + "o") == A and store.get(prefix + "s") == b""


# ---------------------------------------------------------------- setup


def test_setup_takes_0314_arguments(master, caplog):
    s = MooncakeDistributedStore()
    # Mooncake 0.3.14's 14 positional arguments; False is the default.
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master, None, False, "", "default",
                   False, 9300, False) == 0
    assert s.close() == 0
    d = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": 0,
         "local_buffer_size": 16 << 20, "protocol": "tcp", "master_server_addr": master}
    extra = {"enable_embedded_master": False, "enable_ssd_prefetch": True, "ssd_prefetch_cooldown_sec": 5,
             "ssd_prefetch_dedup_ttl_sec": 30, "enable_egm_store_pool": False, "egm_numa_nodes": "auto"}
    assert s.setup({**d, **extra}) == 0
    assert s.close() == 0
    # An embedded master is not started: −1012, and the log says what to run.
    with caplog.at_level(logging.ERROR, logger="kvpool.mooncake"):
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master,
                       enable_embedded_master=True) == NOT_SUPPORTED
    assert "kvpool master" in caplog.text
    assert s.setup({**d, "enable_embedded_master": True}) == NOT_SUPPORTED
    assert s.setup({**d, "enable_embedded_master": "true"}) == NOT_SUPPORTED
    assert s.health_check() == 1  # nothing was set up
    with pytest.raises(TypeError):
        s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master, None, False, "", "default",
                False, 9300, False, "extra")
    with pytest.raises(TypeError):
        s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master, enable_embedded_master="no")
