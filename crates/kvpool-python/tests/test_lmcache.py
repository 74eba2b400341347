"""kvpool.lmcache.KvpoolL2Adapter with LMCache 0.5.6: LMCache's own adapter
check (``lmcache.v1.basic_check --mode test_l2_adapter``) against a real
pool, and the contract it does not check: bitmaps for partial hits, locks
that keep found keys from eviction until unlocked, usage reporting, and a
dead pool answering misses and failures instead of wrong data.

Runs when LMCache is installed (scripts/test-python.sh installs
tests/requirements-lmcache.txt); KVPOOL_TEST_LMCACHE=0 skips."""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, List

import pytest

if os.environ.get("KVPOOL_TEST_LMCACHE") == "0":
    pytest.skip("KVPOOL_TEST_LMCACHE=0", allow_module_level=True)
torch = pytest.importorskip("torch")
pytest.importorskip("lmcache.v1.distributed.l2_adapters")

from conftest import Cluster, free_port, kvpool_bin  # noqa: E402
from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj  # noqa: E402
from lmcache.v1.mp_observability.event import EventType  # noqa: E402

import kvpool  # noqa: E402
from kvpool import _native  # noqa: E402
from kvpool.lmcache import KvpoolL2Adapter, KvpoolL2AdapterConfig  # noqa: E402

MODEL = "org/test-model"
OBJ = 64 << 10  # float32 elements per object: 256 KiB
OBJ_BYTES = OBJ * 4
LEASE = 2.0  # the test pools' --default-kv-lease-ttl, seconds: locks survive a 1.75 s stall of the renewer


def spec(master: str, **params: Any) -> str:
    """The ``--l2-adapter`` JSON that loads kvpool's adapter as an LMCache plugin."""
    return json.dumps({"type": "plugin", "module_path": "kvpool.lmcache", "class_name": "KvpoolL2Adapter",
                       "adapter_params": {"master": master, **params}})


def make_adapter(master: str, **params: Any) -> KvpoolL2Adapter:
    """An adapter built the way LMCache builds one: its spec parser and factory."""
    cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[spec(master, **params)]))
    a = create_l2_adapter(cfg.adapters[0])
    assert isinstance(a, KvpoolL2Adapter)
    return a


def keys(tag: str, n: int, salt: str = "") -> List[ObjectKey]:
    return [ObjectKey(chunk_hash=f"{tag}-{i}".encode(), model_name=MODEL, kv_rank=0, cache_salt=salt) for i in range(n)]


def obj(fill: float, n: int = OBJ) -> TensorMemoryObj:
    """An LMCache memory object over a fresh CPU tensor filled with ``fill``."""
    t = torch.full((n,), fill, dtype=torch.float32)
    meta = MemoryObjMetadata(shape=torch.Size([n]), dtype=torch.float32, address=t.data_ptr(),
                             phy_size=n * 4, fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(t, meta, parent_allocator=None)


def wait_for(efd: int, result: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Waits on an adapter eventfd until ``result()`` is not None, as LMCache's controllers do."""
    deadline = time.monotonic() + timeout
    p = select.poll()
    p.register(efd, select.POLLIN)
    while time.monotonic() < deadline:
        if p.poll(100):
            try:
                os.eventfd_read(efd)
            except BlockingIOError:
                pass
        r = result()
        if r is not None:
            return r
    raise TimeoutError("adapter task did not complete")


def store(a: KvpoolL2Adapter, ks: List[ObjectKey], objs: List[TensorMemoryObj]) -> Any:
    tid = a.submit_store_task(ks, objs)
    done: dict = {}

    def popped() -> Any:
        done.update(a.pop_completed_store_tasks())
        return done.get(tid)

    return wait_for(a.get_store_event_fd(), popped)


def lookup(a: KvpoolL2Adapter, ks: List[ObjectKey]) -> List[bool]:
    tid = a.submit_lookup_and_lock_task(ks, {})
    b = wait_for(a.get_lookup_and_lock_event_fd(), lambda: a.query_lookup_and_lock_result(tid))
    return [b.test(i) for i in range(len(ks))]


def load(a: KvpoolL2Adapter, ks: List[ObjectKey], objs: List[TensorMemoryObj]) -> List[bool]:
    tid = a.submit_load_task(ks, objs)
    b = wait_for(a.get_load_event_fd(), lambda: a.query_load_result(tid))
    return [b.test(i) for i in range(len(ks))]


def small_cluster() -> Cluster:
    """A master with a short read lease and one 8 MiB store: 32 objects fill it."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    c = Cluster(bin=kvpool_bin(), master=f"127.0.0.1:{free_port()}", metrics_port=free_port(),
                workdir=tempfile.mkdtemp(prefix="kvpool-pytest-", dir=base))
    try:
        c.start_master("--default-kv-lease-ttl", f"{int(LEASE * 1000)}ms")
        c.start_store("8MiB")
        c.wait_segments(1)
    except Exception:
        c.stop()
        raise
    return c


@pytest.fixture
def ours(master: str, prefix: str) -> Iterator[str]:
    """A key prefix for the session cluster, whose keys are removed after the test."""
    yield prefix
    with kvpool.Client(master) as c:
        c.remove_by_regex("^" + re.escape(prefix), force=True)


@pytest.fixture
def pool() -> Iterator[Cluster]:
    c = small_cluster()
    yield c
    c.stop()


def test_lmcache_basic_check_passes(master: str, ours: str) -> None:
    """LMCache's own L2-adapter check, run as LMCache documents it, loading
    kvpool's adapter through the plugin type."""
    n = 16
    r = subprocess.run(
        [sys.executable, "-m", "lmcache.v1.basic_check", "--mode", "test_l2_adapter", "--num-keys", str(n),
         "--obj-size", str(OBJ), "--l2-adapter", spec(master, key_prefix=ours)],
        capture_output=True, text=True, timeout=300,
    )
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "Testing L2 adapter #0 (KvpoolL2Adapter)" in out, out + r.stderr
    for line in (f"Validation: {n}/{n} correctly absent", "Batch store OK", f"Validation: {n}/{n} found",
                 f"Validation (loaded): {n}/{n}", f"Validation (content): {n}/{n}"):
        assert line in out, out + r.stderr
    assert "FAIL" not in out and "Test Failed" not in out, out


@pytest.mark.parametrize("protocol", ["shm", "tcp"])
def test_lmcache_bench_l2_stores_and_loads_every_key(master: str, ours: str, protocol: str) -> None:
    """LMCache's adapter benchmark (``lmcache bench l2``), as bench/lmcache_l2.sh
    runs it but short: 4 store tasks in flight, every key stored and loaded."""
    lmcache = os.path.join(os.path.dirname(sys.executable), "lmcache")
    r = subprocess.run(
        [lmcache, "bench", "l2", "--l2-adapter", spec(master, key_prefix=f"{ours}bench/", protocol=protocol),
         "--num-keys", "16", "--in-flight", "4", "--data-size-kb", "256", "--rounds", "2", "--format", "json"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, LMCACHE_DISABLE_BANNER="1"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.JSONDecoder().raw_decode(r.stdout[r.stdout.index('{\n  "title"'):])[0]["metrics"]
    ops = {v["operation"]: v for k, v in report.items() if k.startswith("op_")}
    for op in ("Store", "Load"):
        assert ops[op]["total_keys"] == 16 * 4 * 2 and ops[op]["total_success"] == ops[op]["total_keys"], ops[op]
        assert ops[op]["throughput_avg_mbps"] > 0


def test_partial_hits_give_per_key_bitmaps(master: str, ours: str) -> None:
    a = make_adapter(master, key_prefix=ours)
    try:
        ks = keys("partial", 6)
        stored = [obj(float(i + 1)) for i in range(6)]
        res = store(a, ks[0::2], stored[0::2])
        assert res.is_successful() and res.bytes_transferred() == 3 * OBJ_BYTES
        assert lookup(a, ks) == [True, False] * 3
        dst = [obj(0.0) for _ in range(6)]
        assert load(a, ks, dst) == [True, False] * 3
        for i in range(6):
            want = stored[i].tensor if i % 2 == 0 else torch.zeros(OBJ)
            assert torch.equal(dst[i].tensor, want), i  # misses are left untouched
        a.submit_unlock(ks)
        # A buffer of another size than the stored object is a miss, never a partial fill.
        small, big = obj(0.0, OBJ // 2), obj(0.0, OBJ * 2)
        assert load(a, [ks[0], ks[0]], [small, big]) == [False, False]
        assert not small.tensor.any()
    finally:
        a.close()


def test_the_l1_arena_is_registered_for_the_adapters_life(master: str, ours: str) -> None:
    """Objects in LMCache's L1 arena move without a page probe while the
    adapter lives (the arena is registered with it, as with Mooncake's
    adapter), and round-trip; closing the adapter ends the registration."""
    from lmcache.v1.distributed.internal_api import L1MemoryDesc

    arena = torch.zeros(4 * OBJ, dtype=torch.float32)
    desc = L1MemoryDesc(ptr=arena.data_ptr(), size=arena.numel() * 4, align_bytes=4096)

    def noted() -> bool:
        if _native.note_unregistered(desc.ptr, desc.size):
            _native.note_registered(desc.ptr, desc.size)
            return True
        return False

    def slot(i: int) -> TensorMemoryObj:
        t = arena[i * OBJ:(i + 1) * OBJ]
        meta = MemoryObjMetadata(shape=torch.Size([OBJ]), dtype=torch.float32, address=t.data_ptr(),
                                 phy_size=OBJ_BYTES, fmt=MemoryFormat.KV_2LTD, ref_count=1)
        return TensorMemoryObj(t, meta, parent_allocator=None)

    cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[spec(master, key_prefix=ours)]))
    a = create_l2_adapter(cfg.adapters[0], l1_memory_desc=desc)
    try:
        assert noted()
        arena[:2 * OBJ] = torch.arange(2 * OBJ, dtype=torch.float32)
        ks = keys("l1", 2)
        assert store(a, ks, [slot(0), slot(1)]).is_successful()
        assert lookup(a, ks) == [True, True]
        assert load(a, ks, [slot(2), slot(3)]) == [True, True]
        a.submit_unlock(ks)
        assert torch.equal(arena[2 * OBJ:], arena[:2 * OBJ])
    finally:
        a.close()
    assert not noted()


def test_store_tasks_in_flight_together_all_complete(master: str, ours: str) -> None:
    """Several store tasks in flight, harvested the way ``lmcache bench l2``
    harvests them (wait on the eventfd, pop what completed, repeat): a task
    that finished after an earlier pop used to land in the dict that pop had
    returned, and was never reported (the bench timed out on every round
    with two or more in flight)."""
    from lmcache.cli.commands.bench.l2_adapter_bench.runner import _wait_store_finished

    a = make_adapter(master, key_prefix=ours)
    try:
        for r in range(8):
            ids = [a.submit_store_task(keys(f"inflight-{r}-{t}", 4), [obj(1.0, 1024) for _ in range(4)])
                   for t in range(4)]
            done = _wait_store_finished(a, ids, timeout=10.0)
            assert sorted(done) == sorted(ids), f"round {r}: {len(done)} of {len(ids)} reported"
            assert all(res.is_successful() for res in done.values())
    finally:
        a.close()


def test_locked_keys_survive_eviction_until_unlocked(pool: Cluster, prefix: str) -> None:
    a = make_adapter(pool.master, key_prefix=prefix, lock_renew_s=LEASE / 8)
    filler = kvpool.Client(pool.master)
    try:
        ks = keys("evict", 8)
        objs = [obj(float(i + 1)) for i in range(8)]
        assert store(a, ks, objs).is_successful()
        locked, unlocked = ks[:4], ks[4:]
        assert lookup(a, locked) == [True] * 4
        time.sleep(3 * LEASE)  # the lookup's own lease is long gone: only renewal holds them

        def fill(tag: str) -> None:
            """Writes three times the pool's capacity under other keys."""
            block = bytes(OBJ_BYTES)
            for i in range(3 * (8 << 20) // OBJ_BYTES):
                filler.put(f"{prefix}fill/{tag}/{i}", block)

        fill("a")
        assert filler.status()["evictions"] > 0
        dst = [obj(0.0) for _ in range(4)]
        assert load(a, locked, dst) == [True] * 4
        assert all(torch.equal(d.tensor, o.tensor) for d, o in zip(dst, objs[:4]))
        assert lookup(a, unlocked) == [False] * 4  # unlocked and oldest: evicted

        a.submit_unlock(locked)
        assert a.report_status()["locked_keys"] == 0
        time.sleep(3 * LEASE)  # their last lease runs out
        fill("b")
        assert lookup(a, locked) == [False] * 4
    finally:
        filler.close()
        a.close()


def test_locks_count_lookups(master: str, ours: str) -> None:
    """Two lookups of a key need two unlocks before it stops being held."""
    a = make_adapter(master, key_prefix=ours)
    try:
        ks = keys("count", 2)
        assert store(a, ks, [obj(1.0), obj(2.0)]).is_successful()
        assert lookup(a, ks) == [True, True]
        assert lookup(a, ks[:1]) == [True]
        a.submit_unlock(ks)
        assert a.report_status()["locked_keys"] == 1
        a.submit_unlock(ks + keys("never-locked", 1))
        assert a.report_status()["locked_keys"] == 0
    finally:
        a.close()


def test_usage_and_status_come_from_the_pool(master: str, ours: str) -> None:
    a = make_adapter(master, key_prefix=ours)
    try:
        assert store(a, keys("usage", 2, salt="alice"), [obj(1.0), obj(2.0)]).is_successful()
        u = a.get_usage()
        with kvpool.Client(master) as c:
            st = c.status()
        assert u.total_capacity_bytes == st["capacity"] > 0
        assert u.total_bytes_used >= 2 * OBJ_BYTES
        assert u.bytes_by_cache_salt["alice"] == 2 * OBJ_BYTES
        # The pool evicts by itself, so LMCache must not evict from it by usage.
        assert not a.supports_global_eviction
        s = a.report_status()
        assert s["is_healthy"] and s["pool_keys"] >= 2 and s["master"] == master
        fds = {a.get_store_event_fd(), a.get_lookup_and_lock_event_fd(), a.get_load_event_fd()}
        assert len(fds) == 3
        a.delete(keys("usage", 2, salt="alice"))
        assert "alice" not in a.get_usage().bytes_by_cache_salt
        assert lookup(a, keys("usage", 2, salt="alice")) == [False, False]
    finally:
        a.close()


class Listener:
    """Records what an L2AdapterListener hears."""

    def __init__(self) -> None:
        self.stored: List[Any] = []
        self.accessed: List[Any] = []
        self.deleted: List[Any] = []

    def on_l2_keys_stored(self, keys: List[ObjectKey], sizes: List[int]) -> None:
        self.stored.append((list(keys), list(sizes)))

    def on_l2_keys_accessed(self, keys: List[ObjectKey]) -> None:
        self.accessed.append(list(keys))

    def on_l2_keys_deleted(self, keys: List[ObjectKey]) -> None:
        self.deleted.append(list(keys))


class Bus:
    """Stands in for LMCache's process-wide event bus: records what is published."""

    def __init__(self) -> None:
        self.events: List[Any] = []

    def publish(self, event: Any) -> None:
        self.events.append(event)


def test_listeners_and_events_hear_stores_loads_and_deletes(master: str, ours: str) -> None:
    a = make_adapter(master, key_prefix=ours)
    try:
        with pytest.raises(ValueError):
            a.set_backend_identity("")
        a.set_backend_identity("kvpool", shared=True)
        heard, bus = Listener(), Bus()
        a.register_listener(heard)
        a._event_bus = bus
        ks = keys("listen", 3)
        assert store(a, ks, [obj(1.0), obj(2.0), obj(3.0)]).is_successful()
        assert heard.stored == [(ks, [OBJ_BYTES] * 3)]
        assert load(a, ks[2:], [obj(0.0)]) == [True]
        assert heard.accessed == [ks[2:]]
        # A missing key is not reported deleted; the others with the sizes the pool held.
        a.delete(ks[:2] + keys("listen-missing", 1))
        assert heard.deleted == [ks[:2]]
        assert a.get_usage().bytes_by_cache_salt[""] == OBJ_BYTES
        kinds = [e.event_type for e in bus.events]
        assert kinds == [EventType.L2_KEYS_STORED, EventType.L2_KEYS_ACCESSED, EventType.L2_KEYS_DELETED]
        assert all(e.metadata["backend"] == "kvpool" and e.metadata["shared"] for e in bus.events)
        assert bus.events[0].metadata["sizes"] == [OBJ_BYTES] * 3
        # The pool manages its own capacity: no LMCache-side global eviction.
        assert not a.supports_global_eviction
        assert a.get_usage().usage_fraction > 0  # the pool's numbers, not the base's -1 sentinel
    finally:
        a.close()


def test_list_l2_keys_pages_by_model(master: str, ours: str) -> None:
    a = make_adapter(master, key_prefix=ours)
    try:
        mine = [ObjectKey(chunk_hash=f"list-{i}".encode(), model_name=MODEL, kv_rank=3, object_group_id=i % 2,
                          cache_salt="bob" if i % 3 == 0 else "") for i in range(12)]
        other = [ObjectKey(chunk_hash=f"other-{i}".encode(), model_name="org/other", kv_rank=0) for i in range(4)]
        n = 16  # float32 elements per object
        assert store(a, mine + other, [obj(float(i), n) for i in range(16)]).is_successful()
        with kvpool.Client(master) as c:
            c.put(ours + "not-an-lmcache-key", b"x")

        def walk(**kw: Any) -> Any:
            seen: List[Any] = []
            token, pages = None, 0
            while True:
                page = a.list_l2_keys(cursor=token, **kw)
                assert len(page.entries) <= kw.get("page_size", 500)
                seen += page.entries
                pages += 1
                token = page.next_page_token
                if token is None:
                    return seen, pages
                assert isinstance(token, str) and pages < 10_000

        seen, pages = walk(model_name=MODEL, page_size=5)
        assert pages >= 3
        assert len(seen) == 12 and {e.key.to_object_key() for e in seen} == set(mine)
        assert all(e.size_bytes == n * 4 for e in seen)
        seen, _ = walk()
        assert len(seen) == 16 and {e.key.to_object_key() for e in seen} == set(mine + other)
        assert walk(model_name="org/none", page_size=1)[0] == []
        for bad in (0, -1):
            with pytest.raises(ValueError):
                a.list_l2_keys(page_size=bad)
        for bad_cursor in ("bogus", "kvpool1:zz", "kvpool1:00"):
            with pytest.raises(ValueError):
                a.list_l2_keys(cursor=bad_cursor)
    finally:
        a.close()


def test_dead_pool_answers_misses_and_failures(pool: Cluster, prefix: str) -> None:
    a = make_adapter(pool.master, key_prefix=prefix, timeout=1, retries=0)
    try:
        ks = keys("dead", 3)
        assert store(a, ks, [obj(1.0), obj(2.0), obj(3.0)]).is_successful()
        for p in pool.procs:
            p.kill()
            p.wait()
        assert lookup(a, ks) == [False] * 3
        dst = [obj(0.0) for _ in range(3)]
        assert load(a, ks, dst) == [False] * 3
        assert not any(d.tensor.any() for d in dst)  # nothing half-written
        assert not store(a, keys("dead-new", 1), [obj(4.0)]).is_successful()
        s = a.report_status()
        assert not s["is_healthy"]
        assert s["last_error"], s
    finally:
        a.close()
    with pytest.raises(kvpool.KvpoolError):
        make_adapter(pool.master, timeout=1, retries=0)


def test_a_paused_master_costs_misses_at_once_and_hits_after(pool: Cluster, prefix: str) -> None:
    """With the client's default retries (about 10 s a call), tasks against a
    master that does not answer fail at once once it has been silent for
    3 s, and the keys are found and loaded again once it answers."""
    a = make_adapter(pool.master, key_prefix=prefix)
    try:
        ks = keys("paused", 3)
        stored = [obj(1.0), obj(2.0), obj(3.0)]
        assert store(a, ks, stored).is_successful()
        a.submit_unlock(ks)
        pool.master_proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while a._reach.check(a._native):
            assert time.monotonic() < deadline, "the adapter did not notice the paused master"
            time.sleep(0.05)
        started = time.monotonic()
        assert lookup(a, ks) == [False] * 3
        dst = [obj(0.0) for _ in range(3)]
        assert load(a, ks, dst) == [False] * 3
        assert not store(a, keys("paused-new", 1), [obj(4.0)]).is_successful()
        # Three tasks, each of which would wait out the retries without the check.
        assert time.monotonic() - started < 5
        assert a.report_status()["last_error"]

        pool.master_proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while not a._reach.check(a._native):
            assert time.monotonic() < deadline, "the adapter did not hear from the master again"
            time.sleep(0.05)
        assert lookup(a, ks) == [True] * 3
        assert load(a, ks, dst) == [True] * 3
        assert all(torch.equal(d.tensor, s.tensor) for d, s in zip(dst, stored))
        a.submit_unlock(ks)
    finally:
        pool.master_proc.send_signal(signal.SIGCONT)
        a.close()


def test_config_rejects_unknown_params() -> None:
    with pytest.raises(ValueError, match="bogus"):
        KvpoolL2AdapterConfig.from_dict({"master": "127.0.0.1:1", "bogus": 1})
    with pytest.raises(ValueError):
        KvpoolL2AdapterConfig.from_dict({"lock_renew_s": 0})
