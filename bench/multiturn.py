#!/usr/bin/env python3
"""Multi-turn chat workload through SGLang's real HiCache storage path, on CPU.

What it models: many users hold multi-turn conversations at once. Every
conversation starts from one of a few long shared system prompts; each turn's
prompt is the whole conversation so far (system prompt, earlier user messages
and answers) plus a new user message, and the turn's answer is appended for
the next turn. Requests of the active conversations interleave at random, so
between two turns of one user the other users' turns push its pages out of
host memory.

The cache is SGLang HiCache's L2 + L3 as its cache controller drives it:

* pages are ``page_size`` tokens, hashed with SGLang's own
  ``get_storage_hash_str`` (the chained SHA-256 page hash the controller
  computes for L3 keys);
* L2 is SGLang's real ``MHATokenToKVPoolHost`` (page_first layout) of
  ``--l2-pages`` pages, kept as an LRU of pages: a request's pages are touched
  deepest-first, so, as with the radix tree's leaf-first eviction, a
  conversation loses its tail before its shared prefix;
* a request first matches its longest prefix of pages in L2; what is left
  (at least ``--prefetch-threshold`` tokens, SGLang's default 256) is looked
  up in L3 with the backend's ``batch_exists`` in batches of 128 pages
  (``STORAGE_BATCH_SIZE``), and the hits are loaded into freshly allocated
  host pages with ``batch_get_v1``;
* every page of the prompt and answer not found is "computed": written into
  the host pool and backed up to L3 with ``batch_set_v1``;
* the L3 backend is built by SGLang's ``StorageBackendFactory`` exactly as
  the controller builds it: ``dynamic`` -> ``kvpool.sglang.KvpoolStore`` for
  kvpool, the built-in ``mooncake`` -> SGLang's ``MooncakeStore`` over the
  real ``mooncake.store`` for Mooncake; ``none`` is the host-memory-only
  baseline on the same request sequence.

As in SGLang, the last prompt token is never served from cache (its logits
are needed), so at most ``(prompt_len - 1) // page_size`` pages can hit.

Page contents are a pseudo-random pattern derived from the page hash, so
every page loaded from L3 is checked byte for byte (``--no-verify`` skips).
Bytes loaded are counted from what the store's ``batch_get_into`` returns,
independently of the page count.

Usage::

    bench/multiturn.py --l3 none,kvpool --kvpool-master 127.0.0.1:50051 --json out.json
    bench/multiturn.py --l3 mooncake --mooncake-master 127.0.0.1:50151 \\
        --mooncake-metadata http://127.0.0.1:8180/metadata --json mc.json
    bench/multiturn.py --table none.json kvpool.json mc.json   # combined table

``bench/multiturn.sh`` starts both pools and runs all three.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import sys
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

# SGLang's Mooncake backend would otherwise try to reuse a transfer engine of
# SGLang's own distributed state, which does not exist outside a server.
os.environ.setdefault("SGLANG_HICACHE_MOONCAKE_REUSE_TE", "0")
# Mooncake's TCP transport advertises a non-loopback address without this.
os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")

#: SGLang's cache controller moves L3 pages in batches of this many
#: (``sglang.srt.mem_cache.hicache_storage.STORAGE_BATCH_SIZE``); read from
#: SGLang when it imports.
STORAGE_BATCH_SIZE = 128

DTYPES = ("float16", "bfloat16", "float32")


# --------------------------------------------------------------------------
# Workload


@dataclass
class Workload:
    """Shape of the conversations (all lengths in tokens)."""

    users: int = 64
    active: int = 24
    turns: int = 5
    prefixes: int = 4
    prefix_tokens: int = 2048
    first_user_tokens: int = 512
    user_tokens: int = 256
    output_tokens: int = 128
    jitter: float = 0.2
    vocab: int = 32000
    seed: int = 0


class Conversation:
    """One user's conversation: its token history and the turns it has left."""

    def __init__(self, user: int, w: Workload, prefixes: List[List[int]]) -> None:
        self.user = user
        self.w = w
        # A private RNG per user, so its messages do not depend on the order
        # in which conversations interleave.
        self.rng = random.Random(w.seed * 1_000_003 + user)
        self.history: List[int] = list(prefixes[user % len(prefixes)])
        self.turn = 0

    def _length(self, mean: int) -> int:
        j = self.w.jitter
        return max(1, int(round(mean * self.rng.uniform(1 - j, 1 + j))))

    def _tokens(self, n: int) -> List[int]:
        return [self.rng.randrange(1, self.w.vocab) for _ in range(n)]

    def next_turn(self) -> Tuple[int, List[int], List[int]]:
        """The next turn: (turn number from 1, prompt tokens, answer tokens).
        The history grows by the user message and the answer."""
        self.turn += 1
        user = self._tokens(self._length(self.w.first_user_tokens if self.turn == 1 else self.w.user_tokens))
        prompt = self.history + user
        answer = self._tokens(self._length(self.w.output_tokens))
        self.history = prompt + answer
        return self.turn, prompt, answer

    @property
    def done(self) -> bool:
        return self.turn >= self.w.turns


def requests(w: Workload) -> Iterator[Tuple[int, int, List[int], List[int]]]:
    """The request sequence: (user, turn, prompt, answer). ``w.active``
    conversations run at once; each step serves the next turn of one of them,
    picked at random; a finished conversation makes room for a new user."""
    prng = random.Random(w.seed)
    prefixes = [[prng.randrange(1, w.vocab) for _ in range(w.prefix_tokens)] for _ in range(w.prefixes)]
    order = random.Random(w.seed + 1)
    waiting = list(range(w.users))
    active: List[Conversation] = []
    while waiting or active:
        while waiting and len(active) < w.active:
            active.append(Conversation(waiting.pop(0), w, prefixes))
        c = active[order.randrange(len(active))]
        turn, prompt, answer = c.next_turn()
        yield c.user, turn, prompt, answer
        if c.done:
            active.remove(c)


# --------------------------------------------------------------------------
# Page hashing


def _py_page_hashes(tokens: Sequence[int], page_size: int) -> List[str]:
    """SGLang's page hash in Python (hash_binding.cpp): page i's hash is
    SHA-256(previous page's digest || the page's tokens as little-endian
    u32), for full pages only. Used only where SGLang's native hash
    extension cannot be built."""
    out: List[str] = []
    prior = b""
    for start in range(0, len(tokens) - page_size + 1, page_size):
        h = hashlib.sha256(prior)
        h.update(b"".join(t.to_bytes(4, "little") for t in tokens[start : start + page_size]))
        prior = h.digest()
        out.append(h.hexdigest())
    return out


def page_hasher() -> Tuple[Callable[[List[int], int], List[str]], str]:
    """SGLang's own page-hash function (what the cache controller calls to
    name L3 pages) and its name. Falls back to the Python equivalent only
    if SGLang's native hash extension cannot be built here."""
    # SGLang builds its hash extension on first use with torch's JIT
    # builder, which runs `ninja` from PATH: an unactivated venv has it
    # beside the interpreter.
    bindir = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(bindir, "ninja")) and bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    try:
        from sglang.srt.mem_cache.utils import get_storage_hash_str  # type: ignore[import-untyped]

        def sglang_hash(tokens: List[int], page_size: int) -> List[str]:
            # SGLang hashes page-aligned keys (a trailing partial page would
            # get a hash of its own, and is never cached).
            full = len(tokens) - len(tokens) % page_size
            return list(get_storage_hash_str(tokens[:full], None, page_size=page_size))

        probe = list(range(1, 2 * 4 + 3))
        if sglang_hash(probe, 4) != _py_page_hashes(probe, 4):
            print("warning: SGLang's page hash differs from the Python model of it", file=sys.stderr)
        return sglang_hash, "sglang.get_storage_hash_str"
    except Exception as e:  # noqa: BLE001 - any failure: fall back, and say so
        print(f"warning: SGLang's native page hash unavailable ({e}); using the Python equivalent", file=sys.stderr)
        return _py_page_hashes, "python-sha256-chain"


# --------------------------------------------------------------------------
# The host pool (L2) and the storage backend (L3)


@dataclass
class Model:
    """KV geometry of the modelled model (one MHA rank)."""

    layers: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    dtype: str = "float16"
    page_size: int = 64
    model_name: str = "bench/multiturn-model"


def host_pool(m: Model, pages: int) -> Any:
    """SGLang's ``MHATokenToKVPoolHost`` of exactly ``pages`` pages
    (page_first layout, the layout the zero-copy v1 path wants). The device
    pool it mirrors is one page: there is no GPU tier here."""
    import torch
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo  # type: ignore[import-untyped]
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # type: ignore[import-untyped]

    dtype = getattr(torch, m.dtype)
    dev = m.page_size
    k = tuple(torch.zeros(dev, m.kv_heads, m.head_dim, dtype=dtype) for _ in range(m.layers))
    v = tuple(torch.zeros(dev, m.kv_heads, m.head_dim, dtype=dtype) for _ in range(m.layers))
    info = MHABufferInfo(
        buffers=KVBuffers(
            k=k, v=v,
            k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
            v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
            layout=KVBufferLayout.NHD,
        ),
        page_size=m.page_size, head_num=m.kv_heads, head_dim=m.head_dim, v_head_dim=m.head_dim,
        dtype=dtype, device=torch.device("cpu"),
    )
    return MHATokenToKVPoolHost(
        info, 1.0, 0, m.page_size, "page_first", pin_memory=False, device="cpu",
        device_capacity_tokens=dev, start_layer=0, end_layer=m.layers,
        host_token_capacity=pages * m.page_size,
    )


class CountingStore:
    """Wraps a backend's ``MooncakeDistributedStore`` (kvpool's or
    Mooncake's) and adds up the bytes its zero-copy calls report, so bytes
    loaded are measured, not derived from page counts."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.bytes_read = 0
        self.bytes_written = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _read(self, call: str, *args: Any) -> Any:
        r = getattr(self._inner, call)(*args)
        self.bytes_read += sum(x for x in r if x > 0)
        return r

    def _write(self, call: str, keys: Any, ptrs: Any, sizes: Any, *a: Any) -> Any:
        r = getattr(self._inner, call)(keys, ptrs, sizes, *a)
        # A size is one int, or one per buffer (the multi-buffer forms).
        nbytes = (sum(s) if isinstance(s, (list, tuple)) else int(s) for s, x in zip(sizes, r) if x == 0)
        self.bytes_written += sum(nbytes)
        return r

    def batch_get_into(self, *a: Any) -> Any:
        return self._read("batch_get_into", *a)

    def batch_get_into_multi_buffers(self, *a: Any) -> Any:
        return self._read("batch_get_into_multi_buffers", *a)

    def batch_put_from(self, *a: Any) -> Any:
        return self._write("batch_put_from", *a)

    def batch_put_from_multi_buffers(self, *a: Any) -> Any:
        return self._write("batch_put_from_multi_buffers", *a)


def storage_backend(l3: str, m: Model, pool: Any, args: argparse.Namespace, tag: str) -> Tuple[Any, CountingStore]:
    """The L3 backend, built by SGLang's ``StorageBackendFactory`` as its
    cache controller builds it, with the host pool registered, and the
    counter wrapped around its store."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # type: ignore[import-untyped]
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # type: ignore[import-untyped]

    common = {
        "global_segment_size": 0,  # a pure client: the pool's store process lends the memory
        "protocol": args.protocol if l3 == "kvpool" else "tcp",
        "local_hostname": "127.0.0.1",
        # A tag per run keeps reruns against one pool from hitting old pages.
        "extra_backend_tag": tag,
        "check_server": False,
    }
    if l3 == "kvpool":
        name = "dynamic"
        extra = {"backend_name": "kvpool", "module_path": "kvpool.sglang", "class_name": "KvpoolStore",
                 "interface_v1": 1, "master_server_address": args.kvpool_master, **common}
    elif l3 == "mooncake":
        name = "mooncake"
        extra = {"interface_v1": 1, "master_server_address": args.mooncake_master,
                 "metadata_server": args.mooncake_metadata, "device_name": "", **common}
    else:
        raise ValueError(f"unknown L3 {l3!r}")
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=m.model_name, extra_config=extra,
    )
    backend = StorageBackendFactory.create_backend(name, config, pool)
    backend.register_mem_pool_host(pool)
    inner = getattr(backend, "_backend", backend)  # past SGLang's optional fault injector
    inner.store = CountingStore(inner.store)
    return backend, inner.store


def page_pattern(h: str, nbytes: int) -> Any:
    """The bytes of the page named ``h``: pseudo-random, seeded by its hash,
    so any page read back can be checked without keeping a copy."""
    import numpy as np
    import torch

    # numpy's PCG64 makes bytes three times faster than torch.randint.
    data = bytearray(np.random.default_rng(int(h[:16], 16)).bytes(nbytes))
    return torch.frombuffer(data, dtype=torch.uint8)


class L2:
    """The host pool as an LRU of pages (hash -> first slot)."""

    def __init__(self, pool: Any, page_size: int) -> None:
        self.pool = pool
        self.page = page_size
        self.lru: "OrderedDict[str, int]" = OrderedDict()
        self.capacity = pool.available_size() // page_size
        self.evicted = 0

    def prefix(self, hashes: Sequence[str]) -> int:
        """Pages of ``hashes`` present from the start."""
        n = 0
        for h in hashes:
            if h not in self.lru:
                break
            n += 1
        return n

    def touch(self, hashes: Sequence[str]) -> None:
        """Marks a request's pages used, its first page most recently: the
        tail of a conversation ages before its prefix (leaf-first, as the
        radix tree evicts)."""
        for h in reversed(hashes):
            if h in self.lru:
                self.lru.move_to_end(h)

    def alloc(self, pages: int, pinned: set) -> Any:
        """Slots for ``pages`` pages, evicting least recently used pages
        that are not ``pinned`` (the request's own hits)."""
        import torch

        need = pages * self.page
        it = iter(list(self.lru.keys()))
        while self.pool.available_size() < need:
            victim = next(it, None)
            if victim is None:
                raise RuntimeError(
                    f"L2 of {self.capacity} pages cannot hold one request of {pages}+{len(pinned)} pages: raise --l2-pages")
            if victim in pinned:
                continue
            start = self.lru.pop(victim)
            self.pool.free(torch.arange(start, start + self.page, dtype=torch.int64))
            self.evicted += 1
        idx = self.pool.alloc(need)
        assert idx is not None
        return idx

    def insert(self, h: str, start: int) -> None:
        self.lru[h] = start


# --------------------------------------------------------------------------
# Accounting


@dataclass
class Tally:
    """Counts for one turn number (or all turns)."""

    requests: int = 0
    prompt_tokens: int = 0
    cacheable_pages: int = 0
    l2_hit_pages: int = 0
    l3_hit_pages: int = 0
    computed_pages: int = 0
    l3_queries: int = 0
    l3_bytes_loaded: int = 0
    l3_pages_written: int = 0
    l3_bytes_written: int = 0
    load_ms: List[float] = field(default_factory=list)
    query_ms: List[float] = field(default_factory=list)
    write_ms: List[float] = field(default_factory=list)

    def add(self, o: "Tally") -> None:
        for k, v in asdict(o).items():
            if isinstance(v, list):
                getattr(self, k).extend(v)
            else:
                setattr(self, k, getattr(self, k) + v)

    def summary(self, page_size: int, page_bytes: int) -> Dict[str, Any]:
        """Counts plus the rates derived from them (hit rates are shares of
        prompt tokens, as SGLang reports its cache hit rate)."""
        d = {k: v for k, v in asdict(self).items() if not isinstance(v, list)}
        pt = max(1, self.prompt_tokens)
        l2_tok, l3_tok = self.l2_hit_pages * page_size, self.l3_hit_pages * page_size
        d.update(
            l2_hit_tokens=l2_tok,
            l3_hit_tokens=l3_tok,
            prefill_tokens_saved=l2_tok + l3_tok,
            prefill_tokens_computed=self.prompt_tokens - l2_tok - l3_tok,
            l2_hit_rate=l2_tok / pt,
            l3_hit_rate=l3_tok / pt,
            hit_rate=(l2_tok + l3_tok) / pt,
            l3_bytes_expected=self.l3_hit_pages * page_bytes,
            load_samples=len(self.load_ms),
            load_p50_ms=percentile(self.load_ms, 50),
            load_p99_ms=percentile(self.load_ms, 99),
            # Bytes loaded over the time spent loading (queries included).
            load_mib_per_s=(self.l3_bytes_loaded / 2**20) / (sum(self.load_ms) / 1e3) if self.load_ms else None,
            query_p50_ms=percentile(self.query_ms, 50),
            write_p50_ms=percentile(self.write_ms, 50),
            write_p99_ms=percentile(self.write_ms, 99),
        )
        return d


def percentile(xs: Sequence[float], q: float) -> Optional[float]:
    """The q-th percentile (nearest rank, linear between), None if empty."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# --------------------------------------------------------------------------
# One run


def run(l3: str, w: Workload, m: Model, args: argparse.Namespace) -> Dict[str, Any]:
    """Plays the whole request sequence with one L3 (or none); the result
    dict that goes into the JSON."""
    import torch

    hasher, hash_impl = page_hasher()
    batch = STORAGE_BATCH_SIZE
    try:
        from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE as sglang_batch  # type: ignore[import-untyped]

        batch = int(sglang_batch)
    except Exception:  # noqa: BLE001 - keep the documented default
        pass
    page = m.page_size
    pool = host_pool(m, args.l2_pages)
    l2 = L2(pool, page)
    page_bytes = pool.get_size_per_token() * page
    tag = f"mt-{l3}-{uuid.uuid4().hex[:8]}"
    backend, counter = storage_backend(l3, m, pool, args, tag) if l3 != "none" else (None, None)
    dtype = getattr(torch, m.dtype)

    per_turn: Dict[int, Tally] = {}
    verified = mismatched = 0
    started = time.perf_counter()
    for _user, turn, prompt, answer in requests(w):
        t = per_turn.setdefault(turn, Tally())
        t.requests += 1
        t.prompt_tokens += len(prompt)
        hashes = hasher(prompt + answer, page)
        # The last prompt token is always computed (its logits are needed).
        cacheable = (len(prompt) - 1) // page
        t.cacheable_pages += cacheable
        k2 = l2.prefix(hashes[:cacheable])
        pinned = set(hashes[:k2])
        l2.touch(hashes[:k2])

        # L3: query what L2 lacks, as the controller's _storage_hit_query does.
        rest = hashes[k2:cacheable]
        k3 = 0
        q_ms = 0.0
        if counter is not None and len(rest) * page >= args.prefetch_threshold:
            t0 = time.perf_counter()
            for s in range(0, len(rest), batch):
                chunk = rest[s : s + batch]
                n = backend.batch_exists(chunk)
                k3 += n
                if n < len(chunk):
                    break
            q_ms = (time.perf_counter() - t0) * 1e3
            t.l3_queries += 1
            t.query_ms.append(q_ms)

        new = len(hashes) - k2
        idx = l2.alloc(new, pinned)
        starts = [int(idx[i * page]) for i in range(new)]

        # Load the L3 hits batch by batch; a failed page ends the prefix
        # (CacheController._page_get_zero_copy).
        loaded = 0
        if k3:
            before = counter.bytes_read
            t0 = time.perf_counter()
            for s in range(0, k3, batch):
                n = min(batch, k3 - s)
                ok = backend.batch_get_v1(hashes[k2 + s : k2 + s + n], idx[s * page : (s + n) * page])
                good = next((i for i, r in enumerate(ok) if not r), len(ok))
                loaded += good
                if good < n:
                    break
            t.load_ms.append(q_ms + (time.perf_counter() - t0) * 1e3)
            t.l3_bytes_loaded += counter.bytes_read - before
            if args.verify:
                for i in range(loaded):
                    got = pool.get_data_page(starts[i], flat=True).view(torch.uint8)
                    verified += 1
                    if not torch.equal(got, page_pattern(hashes[k2 + i], page_bytes)):
                        mismatched += 1
        t.l2_hit_pages += k2
        t.l3_hit_pages += loaded

        # Compute the rest (prompt and answer), then back it up to L3.
        computed = list(range(loaded, new))
        t.computed_pages += len(computed)
        for i in computed:
            pool.set_from_flat_data_page(starts[i], page_pattern(hashes[k2 + i], page_bytes).view(dtype))
        for i in range(new):
            l2.insert(hashes[k2 + i], starts[i])
        l2.touch(hashes)
        if counter is not None and computed:
            before = counter.bytes_written
            t0 = time.perf_counter()
            # Computed pages are one contiguous run after the loaded ones.
            for s in range(loaded, new, batch):
                e = min(new, s + batch)
                backend.batch_set_v1(hashes[k2 + s : k2 + e], idx[s * page : e * page])
            t.write_ms.append((time.perf_counter() - t0) * 1e3)
            t.l3_pages_written += len(computed)
            t.l3_bytes_written += counter.bytes_written - before
    wall = time.perf_counter() - started

    overall = Tally()
    for tl in per_turn.values():
        overall.add(tl)
    if counter is not None:
        try:
            counter.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass
    return {
        "l3": l3,
        # What SGLang's backend puts before "_{page hash}_0_k" / "_0_v".
        "key_prefix": f"{tag}_{m.model_name.replace('/', '-')}" if backend is not None else None,
        "hash_impl": hash_impl,
        "storage_batch_pages": batch,
        "page_bytes": page_bytes,
        "l2_pages": l2.capacity,
        "l2_evictions": l2.evicted,
        "wall_s": wall,
        "verified_pages": verified,
        "mismatched_pages": mismatched,
        "turns": {str(k): v.summary(page, page_bytes) for k, v in sorted(per_turn.items())},
        "overall": overall.summary(page, page_bytes),
    }


# --------------------------------------------------------------------------
# Reporting


def _ms(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:.2f}"


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def table(results: Dict[str, Any]) -> str:
    """Markdown: a summary row per L3, then per-turn rows."""
    runs = results["runs"]
    lines = [
        "| L3 | hit rate | L2 hit | L3 hit | prefill tokens saved | loaded from L3 | L3 load p50 / p99 (ms) | L3 load rate | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        o = r["overall"]
        lines.append(
            f"| {r['l3']} | {_pct(o['hit_rate'])} | {_pct(o['l2_hit_rate'])} | {_pct(o['l3_hit_rate'])} | "
            f"{o['prefill_tokens_saved']:,} / {o['prompt_tokens']:,} | {o['l3_bytes_loaded'] / 2**20:,.1f} MiB | "
            f"{_ms(o['load_p50_ms'])} / {_ms(o['load_p99_ms'])} | "
            f"{'–' if o['load_mib_per_s'] is None else format(o['load_mib_per_s'], ',.0f') + ' MiB/s'} | {r['wall_s']:.1f} |"
        )
    lines += [
        "",
        "| L3 | turn | requests | prompt tokens | L2 hit | L3 hit | hit rate | prefill tokens saved | loaded from L3 | L3 load p50 / p99 (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        for turn, o in r["turns"].items():
            lines.append(
                f"| {r['l3']} | {turn} | {o['requests']} | {o['prompt_tokens']:,} | {_pct(o['l2_hit_rate'])} | "
                f"{_pct(o['l3_hit_rate'])} | {_pct(o['hit_rate'])} | {o['prefill_tokens_saved']:,} | "
                f"{o['l3_bytes_loaded'] / 2**20:,.1f} MiB | {_ms(o['load_p50_ms'])} / {_ms(o['load_p99_ms'])} |"
            )
    return "\n".join(lines)


def describe(results: Dict[str, Any]) -> str:
    """One paragraph of what was run, for under the table."""
    w, m = results["workload"], results["model"]
    r0 = results["runs"][0]
    return (
        f"{w['users']} conversations x {w['turns']} turns, {w['active']} active at once; "
        f"{w['prefixes']} shared system prompts of {w['prefix_tokens']} tokens; user messages "
        f"{w['first_user_tokens']} (first) / {w['user_tokens']} tokens, answers {w['output_tokens']} tokens "
        f"(±{int(100 * w['jitter'])}%); pages of {m['page_size']} tokens = {r0['page_bytes'] // 1024} KiB "
        f"({m['layers']} layers x {m['kv_heads']} KV heads x {m['head_dim']} x {m['dtype']}, K+V); "
        f"L2 host pool {r0['l2_pages']} pages ({r0['l2_pages'] * r0['page_bytes'] / 2**20:.0f} MiB); "
        f"page hash {r0['hash_impl']}; seed {w['seed']}."
    )


def merge(paths: Sequence[str]) -> Dict[str, Any]:
    """Combines the JSON of several runs of the same workload."""
    out: Optional[Dict[str, Any]] = None
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        if out is None:
            out = d
        else:
            if d["workload"] != out["workload"] or d["model"] != out["model"]:
                raise SystemExit(f"{p}: a different workload or model than {paths[0]}")
            out["runs"].extend(d["runs"])
    assert out is not None
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    w, m = Workload(), Model()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--l3", default="none,kvpool", help="comma list of L3 tiers to run: none, kvpool, mooncake")
    p.add_argument("--kvpool-master", default="127.0.0.1:50051")
    p.add_argument("--protocol", default="tcp", help="kvpool transport: tcp, auto (shared memory on this host), shm")
    p.add_argument("--mooncake-master", default="127.0.0.1:50151")
    p.add_argument("--mooncake-metadata", default="http://127.0.0.1:8180/metadata")
    g = p.add_argument_group("workload")
    g.add_argument("--users", type=int, default=w.users, help="conversations in all")
    g.add_argument("--active", type=int, default=w.active, help="conversations in progress at once")
    g.add_argument("--turns", type=int, default=w.turns, help="turns per conversation")
    g.add_argument("--prefixes", type=int, default=w.prefixes, help="distinct shared system prompts")
    g.add_argument("--prefix-tokens", type=int, default=w.prefix_tokens, help="system prompt length")
    g.add_argument("--first-user-tokens", type=int, default=w.first_user_tokens, help="first user message length")
    g.add_argument("--user-tokens", type=int, default=w.user_tokens, help="later user message length")
    g.add_argument("--output-tokens", type=int, default=w.output_tokens, help="answer length")
    g.add_argument("--jitter", type=float, default=w.jitter, help="message lengths vary uniformly by this fraction")
    g.add_argument("--seed", type=int, default=w.seed)
    g = p.add_argument_group("model and cache")
    g.add_argument("--layers", type=int, default=m.layers)
    g.add_argument("--kv-heads", type=int, default=m.kv_heads)
    g.add_argument("--head-dim", type=int, default=m.head_dim)
    g.add_argument("--dtype", default=m.dtype, choices=DTYPES)
    g.add_argument("--page-size", type=int, default=m.page_size, help="tokens per page")
    g.add_argument("--l2-pages", type=int, default=128, help="host pool (L2) size in pages")
    g.add_argument("--prefetch-threshold", type=int, default=256,
                   help="fewest tokens left after L2 worth an L3 query (SGLang's default)")
    g.add_argument("--no-verify", dest="verify", action="store_false", help="skip the byte check of loaded pages")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--table", nargs="+", metavar="JSON", help="print the combined table of these result files and exit")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.table:
        results = merge(args.table)
        print(table(results))
        print()
        print(describe(results))
        return results
    w = Workload(users=args.users, active=args.active, turns=args.turns, prefixes=args.prefixes,
                 prefix_tokens=args.prefix_tokens, first_user_tokens=args.first_user_tokens,
                 user_tokens=args.user_tokens, output_tokens=args.output_tokens, jitter=args.jitter, seed=args.seed)
    m = Model(layers=args.layers, kv_heads=args.kv_heads, head_dim=args.head_dim, dtype=args.dtype,
              page_size=args.page_size)
    results: Dict[str, Any] = {
        "workload": asdict(w),
        "model": asdict(m),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "runs": [],
    }
    for l3 in [s.strip() for s in args.l3.split(",") if s.strip()]:
        print(f"== {l3}", file=sys.stderr, flush=True)
        results["runs"].append(run(l3, w, m, args))
        if args.json:
            # Written after every run, so a later failure keeps the earlier ones.
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    print(table(results))
    print()
    print(describe(results))
    return results


if __name__ == "__main__":
    main()
