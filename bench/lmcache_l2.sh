#!/usr/bin/env bash
# LMCache's own L2-adapter benchmark (`lmcache bench l2`) on kvpool's
# adapter (kvpool.lmcache.KvpoolL2Adapter, loaded as LMCache loads a
# plugin), over shared memory and over TCP, plus LMCache's adapter check
# as LMCache's issue 3018 ran it (`--obj-size 16777216 --num-keys 80`:
# float32 elements, 64 MiB objects), against a `kvpool up` started here
# (an 8 GiB segment in /dev/shm).
# Prints a markdown table of store/load throughput and round p50.
#
# Mooncake's LMCache adapter (`"type": "mooncake_store"`) runs only where
# LMCache was built with its C++ Mooncake extension
# (`lmcache.lmcache_mooncake`); LMCache's wheel does not ship it. The
# script runs that row when the extension imports (with the venv's
# `mooncake_master`) and says why not otherwise.
#
# Usage: bench/lmcache_l2.sh [OUT_DIR]
#   PYTHON  an interpreter with lmcache and kvpool installed
#           (default: the test venv, ~/.cache/kvpool/venv)
#   KVPOOL  the kvpool binary (default: target/release/kvpool)
#   ROUNDS  measurement rounds per row (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$HOME/.cache/kvpool/venv/bin/python}"
KVPOOL="${KVPOOL:-target/release/kvpool}"
ROUNDS="${ROUNDS:-5}"
OUT="${1:-/tmp/kvpool-lmcache-l2}"
LMCACHE="$(dirname "$PY")/lmcache"
[ -x "$LMCACHE" ] || { echo "lmcache_l2: no lmcache next to $PY (scripts/test-python.sh --setup-only installs it)" >&2; exit 1; }
[ -x "$KVPOOL" ] || { echo "lmcache_l2: $KVPOOL missing (cargo build --release -p kvpool)" >&2; exit 1; }
"$PY" -c 'import kvpool.lmcache' 2>/dev/null || { echo "lmcache_l2: kvpool is not installed for $PY" >&2; exit 1; }
export LMCACHE_DISABLE_BANNER=1

rm -rf "$OUT" && mkdir -p "$OUT"
port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RPC=$(port); METRICS=$(port)
DATA="${DATA_DIR:-/dev/shm/kvpool-lmcache-l2}"
rm -rf "$DATA"
"$KVPOOL" up --rpc-port "$RPC" --metrics-port "$METRICS" --segment-size 8GiB \
  --data-dir "$DATA" >"$OUT/up.log" 2>&1 &
UP=$!
trap 'kill $UP 2>/dev/null; wait $UP 2>/dev/null || true; rm -rf "$DATA"' EXIT
for _ in $(seq 600); do grep -q "kvpool is up" "$OUT/up.log" && break; sleep 0.1; done
grep -q "kvpool is up" "$OUT/up.log" || { cat "$OUT/up.log" >&2; exit 1; }

# One row: adapter JSON, label, object KiB, keys per submit.
row() {
  local json="$1" label="$2" kb="$3" keys="$4" name
  name="$(echo "$label-$kb" | tr ' /' '__')"
  "$LMCACHE" bench l2 --l2-adapter "$json" --num-keys "$keys" --in-flight 4 \
    --data-size-kb "$kb" --rounds "$ROUNDS" --format json >"$OUT/$name.out" 2>"$OUT/$name.err" || {
      echo "| $label | $kb KiB x $keys x 4 | failed: see $OUT/$name.err | | | |"; return; }
  "$PY" - "$OUT/$name.out" "$label" "$kb" "$keys" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
m = json.JSONDecoder().raw_decode(text[text.index('{\n  "title"'):])[0]["metrics"]
ops = {v["operation"]: v for k, v in m.items() if k.startswith("op_")}
s, l = ops["Store"], ops["Load"]
ok = s["total_success"] == s["total_keys"] and l["total_success"] == l["total_keys"]
print(f"| {sys.argv[2]} | {sys.argv[3]} KiB x {sys.argv[4]} x 4 in flight | "
      f"{s['throughput_avg_mbps'] / 1000:.2f} | {s['duration_p50_ms']:.1f} | "
      f"{l['throughput_avg_mbps'] / 1000:.2f} | {l['duration_p50_ms']:.1f} |"
      + ("" if ok else f" ({s['total_success']}/{s['total_keys']} stored, {l['total_success']}/{l['total_keys']} loaded)"))
EOF
}

kvpool_json() {
  printf '{"type":"plugin","module_path":"kvpool.lmcache","class_name":"KvpoolL2Adapter","adapter_params":{"master":"127.0.0.1:%s","key_prefix":"bench-%s/","protocol":"%s"}}' "$RPC" "$1" "$2"
}

# LMCache's adapter check as its issue 3018 ran it; first, so the rows
# below do not pay for the first touch of the segment's pages.
start=$(date +%s.%N)
"$PY" -m lmcache.v1.basic_check --mode test_l2_adapter --obj-size 16777216 --num-keys 80 \
  --l2-adapter "$(kvpool_json check shm)" >"$OUT/basic_check.out" 2>&1 \
  && verdict="passed" || verdict="FAILED (see $OUT/basic_check.out)"
echo "LMCache's adapter check (--obj-size 16777216 --num-keys 80) on kvpool: $verdict in $(echo "$(date +%s.%N) - $start" | bc) s"
echo

# A first run in a fresh process pays one-time costs (allocator, page
# faults of new buffers); one unreported row takes them.
row "$(kvpool_json warmup shm)" warmup 256 32 >/dev/null

echo "| adapter | objects | store GB/s | store round p50 ms | load GB/s | load round p50 ms |"
echo "|---|---|---|---|---|---|"
n=0
for proto in shm tcp; do
  for spec in "256 32" "16384 8"; do
    set -- $spec
    n=$((n + 1))
    row "$(kvpool_json "$n" "$proto")" "kvpool ($proto)" "$1" "$2"
  done
done

if "$PY" -c 'import lmcache.lmcache_mooncake' 2>/dev/null; then
  MC_PORT=$(port)
  "$(dirname "$PY")/mooncake_master" --rpc_port="$MC_PORT" >"$OUT/mooncake_master.log" 2>&1 &
  MC=$!
  trap 'kill $UP $MC 2>/dev/null; wait 2>/dev/null || true; rm -rf "$DATA"' EXIT
  sleep 2
  mc_json=$(printf '{"type":"mooncake_store","setup_config":{"master_server_address":"127.0.0.1:%s","metadata_server":"P2PHANDSHAKE","protocol":"tcp","local_hostname":"127.0.0.1","global_segment_size":"4294967296","local_buffer_size":"1073741824"}}' "$MC_PORT")
  for spec in "256 32" "16384 8"; do
    set -- $spec
    row "$mc_json" "Mooncake (tcp)" "$1" "$2"
  done
else
  echo
  echo "Mooncake's LMCache adapter: not run (this LMCache has no lmcache.lmcache_mooncake extension; LMCache's wheel does not ship it)."
fi
