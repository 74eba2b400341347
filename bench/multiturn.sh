#!/usr/bin/env bash
# The multi-turn HiCache table: bench/multiturn.py against a real kvpool pool,
# the real Mooncake (PyPI mooncake-transfer-engine-non-cuda) and no L3 tier
# (host memory only), in one run on this machine. Starts a kvpool master +
# store and a mooncake_master (with its HTTP metadata server) + a Mooncake
# process lending memory, all on loopback; runs the driver once per tier, each
# in its own process, on the same request sequence; tears everything down and
# prints the combined table (and writes OUTDIR/multiturn.md, OUTDIR/*.json).
#
# Usage: bench/multiturn.sh [OUTDIR] [bench/multiturn.py args, e.g. --users 96 --l2-pages 256]
# Env:   PYTHON (default ~/.cache/kvpool/venv/bin/python: SGLang 0.5.23, torch CPU,
#        the kvpool package and mooncake-transfer-engine-non-cuda==0.3.13.post1),
#        KVPOOL_BIN (default target/release/kvpool, else target/debug/kvpool),
#        L3_SIZE (memory each pool lends, bytes, default 1 GiB: holds the
#        default working set), TIERS (default "none kvpool mooncake").
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/kvpool-bench/multiturn}"; shift || true
mkdir -p "$OUT"
PYTHON="${PYTHON:-$HOME/.cache/kvpool/venv/bin/python}"
L3_SIZE="${L3_SIZE:-$((1 << 30))}"
TIERS="${TIERS:-none kvpool mooncake}"
if [ -z "${KVPOOL_BIN:-}" ]; then
  KVPOOL_BIN="$ROOT/target/release/kvpool"
  if [ ! -x "$KVPOOL_BIN" ]; then
    KVPOOL_BIN="$ROOT/target/debug/kvpool"
    echo "note: no release binary; using the debug build ($KVPOOL_BIN): kvpool latencies will be pessimistic" >&2
  fi
fi
[ -x "$KVPOOL_BIN" ] || { echo "no kvpool binary at $KVPOOL_BIN (cargo build --release -p kvpool)" >&2; exit 1; }
MC_MASTER="$(dirname "$PYTHON")/mooncake_master"
[ -x "$MC_MASTER" ] || { echo "no $MC_MASTER: pip install mooncake-transfer-engine-non-cuda==0.3.13.post1" >&2; exit 1; }

# Servers get none of the client's settings.
# `exec`: started with &, the server replaces the subshell, so $! is its pid.
server_env() { exec env -u KVPOOL_LOG -u KVPOOL_TIMEOUT MC_TCP_BIND_ADDRESS=127.0.0.1 "$@"; }
free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

MEM="$(mktemp -d /dev/shm/kvpool-multiturn.XXXXXX)"
PIDS=()
cleanup() {
  # Storage processes first, then the masters.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; sleep 0.3; done
  wait 2>/dev/null || true
  rm -rf "$MEM"
}
trap cleanup EXIT

KV_PORT="$(free_port)"
server_env "$KVPOOL_BIN" master --rpc-address 127.0.0.1 --rpc-port "$KV_PORT" \
  --metrics-address 127.0.0.1 --metrics-port "$(free_port)" >"$OUT/kvpool-master.log" 2>&1 & PIDS+=($!)
sleep 0.5
server_env "$KVPOOL_BIN" store --master "127.0.0.1:$KV_PORT" --segment-size "$L3_SIZE" \
  --data-dir "$MEM/store" --address 127.0.0.1 >"$OUT/kvpool-store.log" 2>&1 & PIDS+=($!)
for _ in $(seq 1 100); do
  "$KVPOOL_BIN" status --master "127.0.0.1:$KV_PORT" 2>/dev/null | grep -q "^segments: 1" && break
  sleep 0.2
done
"$KVPOOL_BIN" status --master "127.0.0.1:$KV_PORT" 2>/dev/null | grep -q "^segments: 1" \
  || { echo "kvpool did not start; see $OUT/kvpool-*.log" >&2; exit 1; }

MC_RPC="$(free_port)"; MC_META="$(free_port)"
server_env "$MC_MASTER" --rpc_port="$MC_RPC" --rpc_address=127.0.0.1 --enable_http_metadata_server=true \
  --http_metadata_server_host=127.0.0.1 --http_metadata_server_port="$MC_META" \
  --metrics_host=127.0.0.1 --metrics_port="$(free_port)" --logtostderr >"$OUT/mooncake-master.log" 2>&1 & PIDS+=($!)
sleep 2
server_env "$PYTHON" "$ROOT/bench/compare/store_proc.py" --module mooncake.store --segment "$L3_SIZE" \
  --lifetime 3600 --master "127.0.0.1:$MC_RPC" --metadata "http://127.0.0.1:$MC_META/metadata" \
  >"$OUT/mooncake-store.log" 2>&1 & PIDS+=($!)
for _ in $(seq 1 60); do grep -q "store setup rc=0" "$OUT/mooncake-store.log" 2>/dev/null && break; sleep 0.5; done
grep -q "store setup rc=0" "$OUT/mooncake-store.log" \
  || { echo "Mooncake did not start; see $OUT/mooncake-*.log" >&2; exit 1; }

ADDRS=(--kvpool-master "127.0.0.1:$KV_PORT" --mooncake-master "127.0.0.1:$MC_RPC"
       --mooncake-metadata "http://127.0.0.1:$MC_META/metadata")
FILES=()
for tier in $TIERS; do
  echo "== $tier" >&2
  "$PYTHON" "$ROOT/bench/multiturn.py" --l3 "$tier" "${ADDRS[@]}" --json "$OUT/$tier.json" "$@" \
    >"$OUT/$tier.log" 2>"$OUT/$tier.stderr.log" || { echo "$tier failed; see $OUT/$tier.*log" >&2; tail -20 "$OUT/$tier.stderr.log" >&2; exit 1; }
  FILES+=("$OUT/$tier.json")
done
{
  echo "kvpool binary: $KVPOOL_BIN; L3 pools lend $((L3_SIZE >> 20)) MiB each; $(nproc) CPUs; $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  "$PYTHON" "$ROOT/bench/multiturn.py" --table "${FILES[@]}"
} | tee "$OUT/multiturn.md"
