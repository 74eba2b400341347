"""Object keys as inference engines name them, for the scale benchmark.

`key_fn(shape)` returns `key(i)`, the i-th key of a fill: requests of
PAGES pages each, every page hashed with its predecessor as the engine
chains them, and named as the engine names its pool objects:

- `plain`: `k{i:012d}` (13 bytes), the benchmark's historical key.
- `sglang`: SGLang 0.5.23's HiCache Mooncake backend, MHA, TP rank 0:
  `{config_prefix}_{page hash}_{tp}_k` and `..._v` (mooncake_store.py: the
  prefix is the model name with `/` as `-`, `_get_mha_buffer_meta` the
  suffixes). The page hash is `get_hash_str`'s: SHA-256 over the prior
  page's digest and the page's token ids as little-endian u32
  (`cpp_utils/hash_binding.cpp`, `hash_page`), done here with hashlib
  because that C++ extension is built on first use and needs a compiler
  toolchain the benchmark machines need not have. 64-token pages.
- `vllm`: vLLM 0.33's Mooncake store connector: `PoolKey(...).to_string()`
  over `hash_block_tokens(sha256_cbor, ...)` of 16-token blocks, both
  imported from vLLM (needs it importable: `PYTHONPATH` with its site).
- `lmcache`: LMCache's `TokenHasher` (sha256_cbor, 256-token chunks) and
  `ObjectKey`, named by kvpool's own L2 adapter (`KvpoolL2Adapter._name`,
  key prefix `lmcache/`), all imported.

Only `plain` and `sglang` need nothing beyond the standard library, so
they also drive Mooncake's Python client from its own environment.
"""
import functools
import hashlib
from array import array
from types import SimpleNamespace

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PAGES = 4
SHAPES = ("plain", "sglang", "vllm", "lmcache")


def tokens(request, page, n):
    """Token ids (of a 128,256-token vocabulary) of page `page` of request
    `request`: the top bits of a 64-bit odd multiple of the token's
    position, so no two pages of a fill are alike."""
    start = (request * PAGES + page) * n
    return [(((start + t) * 0x9E3779B97F4A7C15 & (1 << 64) - 1) >> 40) % 128256 for t in range(n)]


def chained(step):
    """`hash(request, page)`: page `page` of `request` hashed by
    `step(request, prior hash, page)` after the pages before it. Recent pages
    are cached, so a fill in key order hashes each page once."""

    @functools.lru_cache(maxsize=4096)
    def page_hash(request, page):
        return step(request, page_hash(request, page - 1) if page else None, page)

    return page_hash


def key_fn(shape):
    if shape == "plain":
        return lambda i: f"k{i:012d}"
    if shape == "sglang":
        prefix = "-".join(MODEL.split("/"))

        @chained
        def page_hash(request, prior, page):
            data = array("I", tokens(request, page, 64)).tobytes()
            return hashlib.sha256((bytes.fromhex(prior) if prior else b"") + data).hexdigest()

        def sglang_key(i):
            return f"{prefix}_{page_hash(*divmod(i // 2, PAGES))}_0_{'kv'[i % 2]}"

        return sglang_key
    if shape == "vllm":
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import KeyMetadata, PoolKey
        from vllm.utils.hashing import sha256_cbor
        from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash

        init_none_hash(sha256_cbor)
        meta = KeyMetadata(MODEL, tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0)

        @chained
        def block_hash(request, prior, page):
            return hash_block_tokens(sha256_cbor, prior, tokens(request, page, 16), None)

        def vllm_key(i):
            return PoolKey(meta, block_hash(*divmod(i, PAGES)).hex()).to_string()

        return vllm_key
    if shape == "lmcache":
        from lmcache.v1.distributed.api import ObjectKey
        from lmcache.v1.multiprocess.token_hasher import TokenHasher

        from kvpool.lmcache import KvpoolL2Adapter

        hasher = TokenHasher(chunk_size=256, hash_algorithm="sha256_cbor")
        adapter = SimpleNamespace(_config=SimpleNamespace(key_prefix="lmcache/"))

        @chained
        def chunk_hash(request, prior, page):
            return hasher.hash_tokens(tokens(request, page, 256), prior)

        def lmcache_key(i):
            h = hasher.hash_to_bytes(chunk_hash(*divmod(i, PAGES)))
            key = ObjectKey(chunk_hash=h, model_name=MODEL, kv_rank=0)
            return KvpoolL2Adapter._name(adapter, key)

        return lmcache_key
    raise ValueError(f"unknown key shape {shape!r}; one of {SHAPES}")


if __name__ == "__main__":
    import sys

    import time

    for shape in sys.argv[1:] or SHAPES:
        k = key_fn(shape)
        t = time.perf_counter()
        n = 20000
        keys = [k(i) for i in range(n)]
        lens = [len(x) for x in keys]
        assert len(set(keys)) == n, f"{shape}: {n - len(set(keys))} repeated keys"
        us = (time.perf_counter() - t) / n * 1e6
        print(shape, max(lens), f"{us:.1f} us/key", k(0), k(PAGES * 2 + 1), sep="\t")
