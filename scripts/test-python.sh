#!/usr/bin/env bash
# Python tests: builds the `kvpool` package the way users install it
# (`pip install ./crates/kvpool-python`), builds the `kvpool` binary, and runs
# pytest against real `kvpool master` + `kvpool store` processes on loopback.
#
# The virtualenv lives in ${KVPOOL_VENV:-$HOME/.cache/kvpool/venv} and is reused
# while a stamp of the requirement lists and the interpreter matches, so the
# SGLang set (torch, transformers, ...) is downloaded once per machine.
#
# Env: PYTHON (interpreter for the venv, default python3.11 or python3),
#      KVPOOL_VENV (venv path), KVPOOL_TEST_SGLANG=0 (skip the SGLang set and
#      its tests), KVPOOL_TEST_MOONCAKE=0 (skip installing the real Mooncake
#      wheel and the tests that compare against it), KVPOOL_TEST_LMCACHE=0
#      (skip installing LMCache and its adapter tests), KVPOOL_TEST_VLLM=0
#      (skip installing vLLM and its store-connector tests), KVPOOL_VLLM_SITE
#      (where vLLM is installed, default ~/.cache/kvpool/vllm-site),
#      PYTEST_ARGS (extra
#      pytest arguments), KVPOOL_WHEEL (a built wheel, e.g. from
#      scripts/build-wheel.sh: install it instead of building from source,
#      and start the pool from the `kvpool` binary it bundles).
# Args: --setup-only (create/refresh the venv and stop).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
CRATE="$REPO/crates/kvpool-python"
REQ="$CRATE/tests/requirements.txt"
REQ_SGLANG="$CRATE/tests/requirements-sglang.txt"
REQ_MOONCAKE="$CRATE/tests/requirements-mooncake.txt"
WITH_MOONCAKE="${KVPOOL_TEST_MOONCAKE:-1}"
REQ_LMCACHE="$CRATE/tests/requirements-lmcache.txt"
LMCACHE_PKG="lmcache==0.5.6"
WITH_LMCACHE="${KVPOOL_TEST_LMCACHE:-1}"
REQ_VLLM="$CRATE/tests/requirements-vllm.txt"
VLLM_PKG="vllm==0.33.0"
WITH_VLLM="${KVPOOL_TEST_VLLM:-1}"
VLLM_SITE="${KVPOOL_VLLM_SITE:-$HOME/.cache/kvpool/vllm-site}"
SGLANG_PKG="sglang==0.5.23"
WITH_SGLANG="${KVPOOL_TEST_SGLANG:-1}"
VENV="${KVPOOL_VENV:-$HOME/.cache/kvpool/venv}"
if [ -z "${PYTHON:-}" ]; then
  PYTHON="$(command -v python3.11 || command -v python3 || true)"
fi
[ -n "$PYTHON" ] || { echo "test-python: no python3 found" >&2; exit 1; }
[ -n "${KVPOOL_WHEEL:-}" ] || command -v cargo >/dev/null || { echo "test-python: cargo not found" >&2; exit 1; }

t_start=$SECONDS
log() { echo "== test-python [$((SECONDS - t_start))s] $*"; }

# ---------------------------------------------------------------- venv
# shellcheck source=lib/venv.sh
. "$REPO/scripts/lib/venv.sh"

stamp_of() {
  {
    "$PYTHON" -c 'import sys; print(sys.version)'
    cat "$REQ"
    if [ "$WITH_SGLANG" = 1 ]; then cat "$REQ_SGLANG"; echo "$SGLANG_PKG"; fi
  } | sha256sum | cut -d' ' -f1
}
STAMP="$(stamp_of)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.kvpool-stamp" 2>/dev/null)" = "$STAMP" ]; then
  log "reusing venv $VENV"
else
  log "creating venv $VENV (first run on this machine downloads the test set)"
  if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A "$VENV" 2>/dev/null)" ]; then
    echo "test-python: $VENV exists and is not a virtualenv; refusing to replace it" >&2
    exit 1
  fi
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  make_venv "$PYTHON" "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
  if [ "$WITH_SGLANG" = 1 ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ_SGLANG"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$SGLANG_PKG"
  fi
  echo "$STAMP" >"$VENV/.kvpool-stamp"
  log "venv ready"
fi
VPY="$VENV/bin/python"
# The real Mooncake, for the tests that compare against it: an add-on to the
# venv with its own stamp, so adding it never rebuilds the venv (the SGLang
# set is 6 GB). Its wheel loads libibverbs even for TCP.
MC_STAMP="$( (cat "$REQ_MOONCAKE"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [ "$WITH_MOONCAKE" = 1 ] && [ "$(cat "$VENV/.kvpool-stamp-mooncake" 2>/dev/null)" != "$MC_STAMP" ]; then
  if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 '; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      log "installing libibverbs1 (the Mooncake wheel loads it)"
      { apt-get update -qq && apt-get install -y -qq libibverbs1; } >/dev/null 2>&1 || log "libibverbs1 not installed; Mooncake comparisons will be skipped"
    fi
  fi
  log "installing the Mooncake wheel for comparison tests"
  if "$VPY" -m pip install -q --disable-pip-version-check -r "$REQ_MOONCAKE"; then
    echo "$MC_STAMP" >"$VENV/.kvpool-stamp-mooncake"
  else
    log "Mooncake wheel not installed; comparison tests will be skipped"
  fi
fi
# LMCache, for the L2-adapter tests: an add-on like Mooncake. Its wheel pulls
# CUDA packages, so lmcache itself goes in with --no-deps after the pinned
# list of what its CPU paths import.
LMC_STAMP="$( (cat "$REQ_LMCACHE"; echo "$LMCACHE_PKG"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [ "$WITH_LMCACHE" = 1 ] && [ "$(cat "$VENV/.kvpool-stamp-lmcache" 2>/dev/null)" != "$LMC_STAMP" ]; then
  log "installing LMCache for the L2-adapter tests"
  if "$VPY" -m pip install -q --disable-pip-version-check -r "$REQ_LMCACHE" \
    && "$VPY" -m pip install -q --disable-pip-version-check --no-deps "$LMCACHE_PKG"; then
    echo "$LMC_STAMP" >"$VENV/.kvpool-stamp-lmcache"
  else
    log "LMCache not installed; its tests will be skipped"
  fi
fi
# vLLM, for tests/test_vllm.py: its wheel pins torch 2.14.0 and a CUDA stack,
# so it and what its connector path adds go into a directory of their own
# (--target, --no-deps) that the test appends to sys.path; torch and the rest
# come from the SGLang set, so without that set there is no vLLM test.
VLLM_STAMP="$( (cat "$REQ_VLLM"; echo "$VLLM_PKG"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
[ "$WITH_SGLANG" = 1 ] || WITH_VLLM=0
if [ "$WITH_VLLM" = 1 ] && [ "$(cat "$VLLM_SITE/.kvpool-stamp" 2>/dev/null)" != "$VLLM_STAMP" ]; then
  log "installing vLLM into $VLLM_SITE for the store-connector tests"
  rm -rf "$VLLM_SITE"
  if "$VPY" -m pip install -q --disable-pip-version-check --no-deps --target "$VLLM_SITE" "$VLLM_PKG" -r "$REQ_VLLM"; then
    echo "$VLLM_STAMP" >"$VLLM_SITE/.kvpool-stamp"
  else
    log "vLLM not installed; tests/test_vllm.py will fail (KVPOOL_TEST_VLLM=0 skips it)"
  fi
fi
[ "${1:-}" = "--setup-only" ] && exit 0
# The maturin build backend runs `maturin` from PATH.
export PATH="$VENV/bin:$PATH"

# ---------------------------------------------------------------- build
if [ -n "${KVPOOL_WHEEL:-}" ]; then
  log "pip install $KVPOOL_WHEEL"
  "$VPY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$KVPOOL_WHEEL"
  KVPOOL_BIN="$("$VPY" -c 'from kvpool import _cli; print(_cli.bundled("kvpool"))')"
else
  log "cargo build -p kvpool"
  cargo build -p kvpool
  KVPOOL_BIN="${CARGO_TARGET_DIR:-$REPO/target}/debug/kvpool"

  # The binding is behind the `python` feature, which the workspace-wide lint
  # run does not enable: lint it here (needs only the interpreter, no linking).
  log "cargo clippy -p kvpool-python --features python"
  PYO3_PYTHON="$VPY" cargo clippy -p kvpool-python --features python --all-targets -- -D warnings

  log "pip install ./crates/kvpool-python"
  # --no-build-isolation: use the venv's maturin instead of fetching one per
  # run; the Rust build itself is incremental under target/.
  "$VPY" -m pip install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps "$CRATE"
fi
[ -x "$KVPOOL_BIN" ] || { echo "test-python: $KVPOOL_BIN missing" >&2; exit 1; }
export KVPOOL_BIN

# ---------------------------------------------------------------- tests
log "pytest"
export SGLANG_HICACHE_MOONCAKE_REUSE_TE=0
export KVPOOL_TEST_SGLANG="$WITH_SGLANG"
export KVPOOL_TEST_MOONCAKE="$WITH_MOONCAKE"
export KVPOOL_TEST_LMCACHE="$WITH_LMCACHE"
export KVPOOL_TEST_VLLM="$WITH_VLLM"
export KVPOOL_VLLM_SITE="$VLLM_SITE"
# SGLang builds its page-hash extension with the venv's ninja on first use.
export PATH="$VENV/bin:$PATH"
# Run from the tests directory so `import kvpool` resolves to the installed
# package, not to the source tree.
set +e
(cd "$CRATE/tests" && "$VPY" -m pytest -p no:cacheprovider -q ${PYTEST_ARGS:-} .)
rc=$?
set -e
log "done (pytest exit $rc)"
if [ "$rc" = 5 ]; then
  echo "test-python: pytest ran no tests" >&2
  exit 1
fi
exit "$rc"
