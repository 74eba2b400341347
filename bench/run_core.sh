#!/usr/bin/env bash
# Core benchmark of issue 2, one run: the machine's raw limits (memcpy,
# loopback TCP stream, ping-pong; bench/compare/run_raw_limits.sh), then
# `kvpool bench` against 1 master + 2 storage nodes as separate processes,
# over TCP and over shared memory.
# Usage: bench/run_core.sh [OUTDIR]   (builds the release binary first)
# Env: DURATION (per phase, default 5s), SEGMENT (per store, default 2GiB),
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/kvpool-bench/core}"; mkdir -p "$OUT"
DURATION="${DURATION:-5s}"; SEGMENT="${SEGMENT:-2GiB}"
cargo build --release -p kvpool --manifest-path "$ROOT/Cargo.toml" >/dev/null
K="$ROOT/target/release/kvpool"

VENV="${VENV:-/tmp/kvpool-bench/mooncake-venv}"
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV" && "$VENV/bin/pip" install -q numpy; fi
command -v iperf3 >/dev/null || { apt-get install -y -qq iperf3 >/dev/null 2>&1 || true; }
VENV="$VENV" "$ROOT/bench/compare/run_raw_limits.sh" "$OUT/raw" >/dev/null 2>&1 || echo "raw limits failed" >&2

DATA="$(mktemp -d /dev/shm/kvpool-core.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT
"$K" master --rpc-port 50351 --metrics-port 9351 >"$OUT/master.log" 2>&1 & PIDS+=($!)
for i in 1 2; do
  "$K" store --master 127.0.0.1:50351 --segment-size "$SEGMENT" --data-dir "$DATA/s$i" >"$OUT/store$i.log" 2>&1 & PIDS+=($!)
done
for _ in $(seq 1 60); do "$K" status --master 127.0.0.1:50351 2>/dev/null | grep -q "segments: 2" && break; sleep 0.5; done
{
  echo "## raw limits"; cat "$OUT/raw/raw_limits.log" 2>/dev/null || true
  for P in tcp shm; do
    echo; echo "## kvpool bench, batch 32, protocol $P"
    "$K" bench --master 127.0.0.1:50351 --protocol $P --sizes 4KiB,64KiB,512KiB,4MiB --batch 32 --concurrency 4 --duration "$DURATION" 2>/dev/null | tail -n +2
    echo; echo "## kvpool bench, single-key calls, 1 worker, protocol $P"
    "$K" bench --master 127.0.0.1:50351 --protocol $P --sizes 4KiB --batch 1 --concurrency 1 --duration "$DURATION" 2>/dev/null | tail -n +2
  done
} | tee "$OUT/core.md"
