#!/usr/bin/env bash
# The wheel as a user gets it. Builds it (scripts/build-wheel.sh) unless one
# is given, then, with no Rust toolchain on PATH:
#  1. a clean virtualenv: `pip install` of the wheel alone (binary only),
#     the `kvpool` and `rbg` commands it brings, and a put/get through the
#     Python package against a pool the wheel's own `kvpool up` serves;
#  2. the whole Python test suite against the same wheel installed in the
#     test venv (scripts/test-python.sh with KVPOOL_WHEEL).
# Usage: scripts/test-wheel.sh [WHEEL]
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
WHEEL="${1:-}"
if [ -z "$WHEEL" ]; then
  scripts/build-wheel.sh
  WHEEL="$(ls "$REPO"/target/wheels/manylinux/*.whl | head -1)"
fi
WHEEL="$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
# No Rust from here on: drop cargo's and rustup's directories from PATH.
PATH="$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '/\.cargo' -e '/\.rustup' -e 'rustup' | paste -sd: -)"
export PATH
if command -v cargo >/dev/null || command -v rustc >/dev/null; then
  echo "test-wheel: a Rust toolchain is still on PATH ($(command -v cargo rustc))" >&2
  exit 1
fi

WORK="$(mktemp -d /tmp/kvpool-wheel.XXXXXX)"
POOL=""
cleanup() { [ -n "$POOL" ] && kill "$POOL" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
echo "== 1. a clean venv: pip install $(basename "$WHEEL")"
# shellcheck source=lib/venv.sh
. "$REPO/scripts/lib/venv.sh"
make_venv "$PYTHON" "$WORK/venv"
V="$WORK/venv/bin"
# --only-binary: nothing may be compiled; the wheel needs no dependency.
"$V/python" -m pip install -q --disable-pip-version-check --only-binary :all: "$WHEEL"
"$V/kvpool" --version
"$V/rbg" --help >/dev/null
"$V/kvpool" up --rpc-port 53811 --metrics-port 53812 --segment-size 64MiB \
  --data-dir "$WORK/data" >"$WORK/up.log" 2>&1 &
POOL=$!
for _ in $(seq 1 60); do "$V/kvpool" status --master 127.0.0.1:53811 2>/dev/null | grep -q "segments: 1" && break; sleep 0.5; done
"$V/kvpool" status --master 127.0.0.1:53811 | grep "segments: 1"
"$V/python" - <<'PY'
import kvpool
from kvpool.mooncake import MooncakeDistributedStore
c = kvpool.Client("127.0.0.1:53811")
c.put("wheel/k", b"from the wheel" * 100)
assert c.get("wheel/k") == b"from the wheel" * 100
s = MooncakeDistributedStore()
assert s.setup("localhost", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "", "127.0.0.1:53811") == 0
assert s.get("wheel/k") == b"from the wheel" * 100
print("wheel: put/get through kvpool.Client and MooncakeDistributedStore ok, kvpool", kvpool.__version__)
PY
kill "$POOL"; wait "$POOL" 2>/dev/null || true; POOL=""

echo "== 2. the Python test suite against the installed wheel"
KVPOOL_WHEEL="$WHEEL" scripts/test-python.sh
