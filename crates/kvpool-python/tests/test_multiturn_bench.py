"""bench/multiturn.py, run tiny against the session's real kvpool pool: its
accounting adds up, the L3 tier serves what a tiny host pool lost, and every
page it loads is byte-exact what was stored.

Runs when SGLang is installed (as tests/test_sglang.py);
KVPOOL_TEST_SGLANG=1 makes a missing SGLang a failure, =0 skips."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Dict, List

import pytest

from conftest import load_bench_script, require_sglang

torch = require_sglang()

import kvpool  # noqa: E402

PAGE = 16
#: A few conversations on one shared prefix, small pages, and a host pool
#: of 24 pages: about two conversations' worth with three in flight, so
#: later turns must come back from L3.
TINY = [
    "--users", "4", "--active", "3", "--turns", "3", "--prefixes", "1", "--prefix-tokens", "96",
    "--first-user-tokens", "40", "--user-tokens", "24", "--output-tokens", "20",
    "--page-size", str(PAGE), "--layers", "2", "--kv-heads", "1", "--head-dim", "16",
    "--l2-pages", "24", "--prefetch-threshold", str(PAGE), "--seed", "3",
]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench_script("multiturn")


@pytest.fixture(scope="module")
def results(bench: ModuleType, cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    out = tmp_path_factory.mktemp("multiturn") / "tiny.json"
    r = bench.main(["--l3", "none,kvpool", "--kvpool-master", cluster.master, "--json", str(out), *TINY])
    r["json_path"] = str(out)
    return r


def by_tier(results: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {r["l3"]: r for r in results["runs"]}


def test_rates_agree_with_counts(results: Dict[str, Any]) -> None:
    for run in results["runs"]:
        rows: List[Dict[str, Any]] = [*run["turns"].values(), run["overall"]]
        for o in rows:
            pt = o["prompt_tokens"]
            assert o["l2_hit_tokens"] == o["l2_hit_pages"] * PAGE
            assert o["l3_hit_tokens"] == o["l3_hit_pages"] * PAGE
            assert o["prefill_tokens_saved"] == o["l2_hit_tokens"] + o["l3_hit_tokens"]
            assert o["prefill_tokens_computed"] == pt - o["prefill_tokens_saved"]
            assert o["l2_hit_rate"] == pytest.approx(o["l2_hit_tokens"] / pt)
            assert o["l3_hit_rate"] == pytest.approx(o["l3_hit_tokens"] / pt)
            assert o["hit_rate"] == pytest.approx(o["l2_hit_rate"] + o["l3_hit_rate"])
            # Never more than the prompt's cacheable pages (all but the last token).
            assert o["l2_hit_pages"] + o["l3_hit_pages"] <= o["cacheable_pages"]
        # Per-turn rows add up to the overall row.
        for k in ("requests", "prompt_tokens", "l2_hit_pages", "l3_hit_pages", "computed_pages",
                  "l3_bytes_loaded", "l3_pages_written", "l3_bytes_written"):
            assert sum(t[k] for t in run["turns"].values()) == run["overall"][k], k
        assert run["overall"]["requests"] == 4 * 3
        assert list(run["turns"]) == ["1", "2", "3"]


def test_l3_serves_what_the_tiny_host_pool_lost(results: Dict[str, Any]) -> None:
    tiers = by_tier(results)
    none, kv = tiers["none"]["overall"], tiers["kvpool"]["overall"]
    assert tiers["none"]["l2_evictions"] > 0
    assert none["l3_hit_pages"] == 0 and none["l3_queries"] == 0 and none["l3_bytes_loaded"] == 0
    assert kv["l3_hit_pages"] > 0
    assert kv["hit_rate"] > none["hit_rate"]
    # What L2 holds does not depend on where a page came from, so the host
    # hits are the same with and without L3; L3 only turns recomputed pages
    # into loaded ones.
    for turn, t in tiers["kvpool"]["turns"].items():
        b = tiers["none"]["turns"][turn]
        assert t["l2_hit_pages"] == b["l2_hit_pages"]
        assert t["computed_pages"] + t["l3_hit_pages"] == b["computed_pages"]
    # Every load had a latency sample.
    assert kv["load_samples"] > 0 and kv["load_p50_ms"] is not None
    assert kv["load_p99_ms"] >= kv["load_p50_ms"]


def test_bytes_loaded_are_pages_times_page_bytes(results: Dict[str, Any]) -> None:
    run = by_tier(results)["kvpool"]
    # 2 (K, V) x pages of 16 tokens x 2 layers x 1 head x 16 x float16
    assert run["page_bytes"] == 2 * PAGE * 2 * 1 * 16 * 2
    for o in [*run["turns"].values(), run["overall"]]:
        # Measured from what the store's batch_get_into returned.
        assert o["l3_bytes_loaded"] == o["l3_hit_pages"] * run["page_bytes"] == o["l3_bytes_expected"]
        assert o["l3_bytes_written"] == o["l3_pages_written"] * run["page_bytes"]


def test_every_page_is_computed_once_and_stored(bench: ModuleType, results: Dict[str, Any]) -> None:
    run = by_tier(results)["kvpool"]
    hasher, _ = bench.page_hasher()
    w = bench.Workload(**results["workload"])
    distinct = set()
    for _u, _t, prompt, answer in bench.requests(w):
        distinct.update(hasher(prompt + answer, PAGE))
    # With L3 holding everything, no page is computed twice.
    assert run["overall"]["computed_pages"] == len(distinct)
    assert run["overall"]["l3_pages_written"] == len(distinct)


def test_loaded_pages_are_byte_exact(bench: ModuleType, results: Dict[str, Any], master: str) -> None:
    run = by_tier(results)["kvpool"]
    # The driver compared every loaded page with the pattern it stored.
    assert run["verified_pages"] == run["overall"]["l3_hit_pages"] > 0
    assert run["mismatched_pages"] == 0
    # And the stored objects, read back by a plain client under SGLang's key
    # names, are the pattern's K and V halves.
    hasher, _ = bench.page_hasher()
    w = bench.Workload(**results["workload"])
    _u, _t, prompt, answer = next(iter(bench.requests(w)))
    half = run["page_bytes"] // 2
    with kvpool.Client(master) as c:
        for h in hasher(prompt + answer, PAGE)[:3]:
            want = bench.page_pattern(h, run["page_bytes"]).numpy().tobytes()
            assert c.get(f"{run['key_prefix']}_{h}_0_k") == want[:half]
            assert c.get(f"{run['key_prefix']}_{h}_0_v") == want[half:]


def test_page_hash_is_sglangs(bench: ModuleType, results: Dict[str, Any]) -> None:
    from sglang.srt.mem_cache.utils import get_hash_str

    if results["runs"][0]["hash_impl"] != "sglang.get_storage_hash_str" and os.environ.get("KVPOOL_TEST_SGLANG") != "1":
        # SGLang JIT-builds its hash with ninja, a C++ compiler and OpenSSL's headers.
        pytest.skip("SGLang's native page hash does not build here")
    for run in results["runs"]:
        assert run["hash_impl"] == "sglang.get_storage_hash_str"
    hasher, _ = bench.page_hasher()
    tokens = list(range(100, 100 + 5 * PAGE + 3))
    full = tokens[: 5 * PAGE]  # SGLang hashes page-aligned keys
    assert hasher(tokens, PAGE) == get_hash_str(full, None, page_size=PAGE)
    assert hasher(tokens, PAGE) == bench._py_page_hashes(tokens, PAGE)
    # SGLang chains page hashes: a longer conversation keeps its prefix's keys.
    assert hasher(tokens + [7] * PAGE, PAGE)[:5] == hasher(tokens, PAGE)


def test_table_from_json(bench: ModuleType, results: Dict[str, Any], capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    bench.main(["--table", results["json_path"]])
    out = capsys.readouterr().out
    assert "| none | " in out and "| kvpool | " in out
    # A summary row per tier plus a row per tier and turn.
    assert sum(1 for line in out.splitlines() if line.startswith("| kvpool | ")) == 1 + 3
