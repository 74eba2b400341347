#!/usr/bin/env bash
# Builds the wheel users install without a Rust toolchain: the `kvpool`
# Python package with its extension module, and the `kvpool` and `rbg`
# binaries bundled as the package's `kvpool` and `rbg` commands. Everything
# is linked against glibc 2.17 with zig as the linker (manylinux2014), so
# the wheel runs on any x86_64 Linux with glibc 2.17 or newer.
#
# Output: target/wheels/manylinux/kvpool-<version>-cp3XX-cp3XX-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
# Env: PYTHON (the interpreter to build for; default python3.11 or python3;
#      one wheel per CPython version), KVPOOL_BUILD_VENV (the build tools'
#      venv: maturin, ziglang, cargo-zigbuild; default ~/.cache/kvpool/build-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
CRATE="$REPO/crates/kvpool-python"
TARGET=x86_64-unknown-linux-gnu
GLIBC=2.17
OUT="$REPO/target/wheels/manylinux"
VENV="${KVPOOL_BUILD_VENV:-$HOME/.cache/kvpool/build-venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
command -v cargo >/dev/null || { echo "build-wheel: cargo not found (the build needs Rust; the wheel does not)" >&2; exit 1; }

if [ ! -x "$VENV/bin/cargo-zigbuild" ]; then
  echo "== build tools into $VENV (maturin, ziglang, cargo-zigbuild)"
  # shellcheck source=lib/venv.sh
  . "$REPO/scripts/lib/venv.sh"
  make_venv "$PYTHON" "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.9.4,<2" ziglang cargo-zigbuild
fi
export PATH="$VENV/bin:$PATH"

echo "== kvpool and rbg for $TARGET, glibc $GLIBC"
cargo zigbuild --release --target "$TARGET.$GLIBC" -p kvpool -p rbg
BIN="$CRATE/python/kvpool/bin"
rm -rf "$BIN"
mkdir -p "$BIN"
# Never left behind: a later source install must not bundle stale binaries.
trap 'rm -rf "$BIN"' EXIT
install -m 755 "$REPO/target/$TARGET/release/kvpool" "$REPO/target/$TARGET/release/rbg" "$BIN/"
# The release profile keeps line tables for the repo's own profiling; a
# user's install needs none (it triples the wheel).
command -v strip >/dev/null && strip "$BIN/kvpool" "$BIN/rbg"

echo "== the wheel (maturin, zig linker, manylinux2014)"
rm -rf "$OUT"
maturin build --release --strip --zig --compatibility manylinux2014 --target "$TARGET" \
  --interpreter "$PYTHON" --manifest-path "$CRATE/Cargo.toml" --out "$OUT"
ls "$OUT"/*.whl
