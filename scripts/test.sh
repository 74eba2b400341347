#!/usr/bin/env bash
# The whole test suite: format check, lints, unit and integration tests
# (integration tests start the real kvpool binaries on 127.0.0.1).
# Installs nothing it does not need; safe to run on a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (https://rustup.rs) first" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
