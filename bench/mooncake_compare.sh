#!/usr/bin/env bash
# The README's "kvpool against Mooncake" table, from a fresh clone: builds the
# release `kvpool` binary and the Python package (release), then runs
# compare/compare.sh: the real Mooncake 0.3.13 over TCP, kvpool over TCP and
# kvpool over shared memory, back to back, through the same bench_store.py.
# Usage: bench/mooncake_compare.sh OUTDIR [bench_store.py args, e.g.
#        --sizes 4096,65536,524288 --tests put,get,get_into,put_from --max-seconds 4]
# Env: KVPOOL_BENCH_VENV (venv for kvpool's Python package, default
#      /tmp/kvpool-bench/kvpool-venv); compare/run_mooncake.sh makes its own.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:?usage: bench/mooncake_compare.sh OUTDIR [bench args]}"; shift
VENV="${KVPOOL_BENCH_VENV:-/tmp/kvpool-bench/kvpool-venv}"
cargo build --release -p kvpool --manifest-path "$ROOT/Cargo.toml"
# The test script knows how to make a venv on Debian (with or without
# python3-venv); the bench needs only its base set (maturin, numpy).
KVPOOL_VENV="$VENV" KVPOOL_TEST_SGLANG=0 KVPOOL_TEST_MOONCAKE=0 "$ROOT/scripts/test-python.sh" --setup-only
PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --force-reinstall --no-deps "$ROOT/crates/kvpool-python"
mkdir -p "$OUT"
KVPOOL="$ROOT/target/release/kvpool" PYTHON="$VENV/bin/python" "$ROOT/bench/compare/compare.sh" "$OUT" "$@"
