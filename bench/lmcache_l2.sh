#!/usr/bin/env bash
# LMCache's own L2-adapter benchmark (`lmcache bench l2`) and adapter check,
# on kvpool and on Mooncake, one after the other on this machine.
#
# kvpool: its adapter (kvpool.lmcache.KvpoolL2Adapter, loaded as LMCache
# loads a plugin) over shared memory and over TCP, against a `kvpool up`
# started here (an 8 GiB segment in /dev/shm).
# Mooncake (the wheel in the same venv, 0.3.13): `mooncake_master`, a
# storage process lending an 8 GiB segment (bench/compare/store_proc.py),
# and LMCache's Mooncake adapter, `NativeConnectorL2Adapter`, over
# Mooncake's Python binding in place of LMCache's C++ Mooncake extension
# (bench/lmcache_mooncake_binding.py says why and what differs), over TCP:
# every byte crosses a socket to another process, as kvpool's TCP rows do.
#
# Each system's part starts the same way: the page cache dropped (when
# run as root), then LMCache's adapter check as LMCache's issue 3018 ran
# it (`--obj-size 16777216 --num-keys 80`: float32 elements, 64 MiB
# objects), which also takes the first touch of 5 GiB of the segment,
# then one unreported row for a fresh process's one-time costs.
# Prints a markdown table of store/load throughput and round p50, the
# checks' verdicts, and the ratios of kvpool's rows to Mooncake's.
#
# Usage: bench/lmcache_l2.sh [OUT_DIR]
#   PYTHON  an interpreter with lmcache, kvpool and mooncake installed
#           (default: the test venv, ~/.cache/kvpool/venv)
#   KVPOOL  the kvpool binary (default: target/release/kvpool)
#   ROUNDS  measurement rounds per row (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$HOME/.cache/kvpool/venv/bin/python}"
KVPOOL="${KVPOOL:-target/release/kvpool}"
ROUNDS="${ROUNDS:-5}"
OUT="${1:-/tmp/kvpool-lmcache-l2}"
BIN="$(dirname "$PY")"
[ -x "$BIN/lmcache" ] || { echo "lmcache_l2: no lmcache next to $PY (scripts/test-python.sh --setup-only installs it)" >&2; exit 1; }
[ -x "$KVPOOL" ] || { echo "lmcache_l2: $KVPOOL missing (cargo build --release -p kvpool)" >&2; exit 1; }
"$PY" -c 'import kvpool.lmcache' 2>/dev/null || { echo "lmcache_l2: kvpool is not installed for $PY" >&2; exit 1; }
export LMCACHE_DISABLE_BANNER=1
export PYTHONPATH="$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"

rm -rf "$OUT" && mkdir -p "$OUT"
port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
DATA="${DATA_DIR:-/dev/shm/kvpool-lmcache-l2}"
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null || true; rm -rf "$DATA"' EXIT

# The page cache dropped, so neither system pays for reclaiming what ran
# before it (Mooncake's puts into fresh segment pages ran at 0.3 GB/s
# with 4 GiB of cache to reclaim, 1.0-1.2 without).
fresh_memory() {
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; fi
}

# One row: adapter JSON, label, object KiB, keys per submit.
row() {
  local json="$1" label="$2" kb="$3" keys="$4" name
  name="$(echo "$label-$kb" | tr ' /' '__')"
  "$BIN/lmcache" bench l2 --l2-adapter "$json" --num-keys "$keys" --in-flight 4 \
    --data-size-kb "$kb" --rounds "$ROUNDS" --format json >"$OUT/$name.out" 2>"$OUT/$name.err" || {
      echo "| $label | $kb KiB x $keys x 4 | failed: see $OUT/$name.err | | | |"; return; }
  "$PY" - "$OUT/$name.out" "$label" "$kb" "$keys" "$OUT/rows.tsv" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
m = json.JSONDecoder().raw_decode(text[text.index('{\n  "title"'):])[0]["metrics"]
ops = {v["operation"]: v for k, v in m.items() if k.startswith("op_")}
s, l = ops["Store"], ops["Load"]
ok = s["total_success"] == s["total_keys"] and l["total_success"] == l["total_keys"]
with open(sys.argv[5], "a") as f:
    f.write(f"{sys.argv[2]}\t{sys.argv[3]}\t{s['throughput_avg_mbps'] / 1000}\t{l['throughput_avg_mbps'] / 1000}\n")
print(f"| {sys.argv[2]} | {sys.argv[3]} KiB x {sys.argv[4]} x 4 in flight | "
      f"{s['throughput_avg_mbps'] / 1000:.2f} | {s['duration_p50_ms']:.1f} | "
      f"{l['throughput_avg_mbps'] / 1000:.2f} | {l['duration_p50_ms']:.1f} |"
      + ("" if ok else f" ({s['total_success']}/{s['total_keys']} stored, {l['total_success']}/{l['total_keys']} loaded)"))
EOF
}

# LMCache's adapter check on an adapter JSON; its verdict goes below the
# table.
check() {
  local json="$1" system="$2" start verdict
  start=$(date +%s.%N)
  "$PY" -m lmcache.v1.basic_check --mode test_l2_adapter --obj-size 16777216 --num-keys 80 \
    --l2-adapter "$json" >"$OUT/basic_check-$system.out" 2>&1 \
    && verdict="passed" || verdict="FAILED (see $OUT/basic_check-$system.out)"
  echo "- LMCache's adapter check (--obj-size 16777216 --num-keys 80) on $system: $verdict in $(echo "$(date +%s.%N) - $start" | bc) s" >>"$OUT/checks.txt"
}

# ---------------------------------------------------------------- kvpool
fresh_memory
RPC=$(port); METRICS=$(port)
rm -rf "$DATA"
"$KVPOOL" up --rpc-port "$RPC" --metrics-port "$METRICS" --segment-size 8GiB \
  --data-dir "$DATA" >"$OUT/up.log" 2>&1 &
UP=$!
for _ in $(seq 600); do grep -q "kvpool is up" "$OUT/up.log" && break; sleep 0.1; done
grep -q "kvpool is up" "$OUT/up.log" || { cat "$OUT/up.log" >&2; exit 1; }
kvpool_json() {
  printf '{"type":"plugin","module_path":"kvpool.lmcache","class_name":"KvpoolL2Adapter","adapter_params":{"master":"127.0.0.1:%s","key_prefix":"bench-%s/","protocol":"%s"}}' "$RPC" "$1" "$2"
}
check "$(kvpool_json check shm)" kvpool
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
kill $UP; wait $UP 2>/dev/null || true; rm -rf "$DATA"

# ---------------------------------------------------------------- Mooncake
if "$PY" -c 'import mooncake.store' 2>/dev/null; then
  fresh_memory
  MC_PORT=$(port); META=$(port)
  # Without this Mooncake's transfer engine advertises a non-loopback address.
  export MC_TCP_BIND_ADDRESS=127.0.0.1
  "$BIN/mooncake_master" --rpc_port="$MC_PORT" --rpc_address=127.0.0.1 \
    --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
    --http_metadata_server_port="$META" --eviction_high_watermark_ratio=0.95 >"$OUT/mooncake_master.log" 2>&1 &
  sleep 2
  "$PY" bench/compare/store_proc.py --module mooncake.store --segment $((8 << 30)) --lifetime 3600 \
    --master "127.0.0.1:$MC_PORT" --metadata "http://127.0.0.1:$META/metadata" >"$OUT/mooncake_store.log" 2>&1 &
  for _ in $(seq 60); do grep -q "store setup rc=0" "$OUT/mooncake_store.log" && break; sleep 0.5; done
  grep -q "store setup rc=0" "$OUT/mooncake_store.log" || { echo "Mooncake's storage process did not start:"; tail -5 "$OUT/mooncake_store.log"; exit 1; }
  setup=$(printf '{"master_server_address":"127.0.0.1:%s","metadata_server":"http://127.0.0.1:%s/metadata","protocol":"tcp","local_hostname":"127.0.0.1","global_segment_size":"0","local_buffer_size":"1073741824"}' "$MC_PORT" "$META")
  # Keys of their own per row, as kvpool's rows have (LMCache's keys are
  # the same in every run, and a put of a key already there is a no-op).
  mooncake_json() {
    printf '{"type":"plugin","module_path":"lmcache_mooncake_binding","class_name":"MooncakeBindingL2Adapter","adapter_params":{"setup_config":%s,"num_workers":4,"key_prefix":"bench-%s/"}}' "$setup" "$1"
  }
  check "$(mooncake_json check)" Mooncake
  row "$(mooncake_json warmup)" warmup 256 32 >/dev/null
  for spec in "256 32" "16384 8"; do
    set -- $spec
    n=$((n + 1))
    row "$(mooncake_json "$n")" "Mooncake (tcp)" "$1" "$2"
  done
else
  echo "- Mooncake: not run (no mooncake wheel for $PY)" >>"$OUT/checks.txt"
fi

echo
cat "$OUT/checks.txt"
echo
echo "kvpool / Mooncake (tcp), store and load GB/s:"
"$PY" - "$OUT/rows.tsv" <<'EOF'
import sys
rows = {}
for line in open(sys.argv[1]):
    label, kb, store, load = line.rstrip("\n").split("\t")
    rows[(label, kb)] = (float(store), float(load))
for kb in sorted({kb for _, kb in rows}, key=int):
    mc = rows.get(("Mooncake (tcp)", kb))
    if not mc:
        continue
    for label in ("kvpool (tcp)", "kvpool (shm)"):
        if (label, kb) in rows:
            s, l = rows[(label, kb)]
            print(f"- {kb} KiB, {label}: store {s / mc[0]:.2f}x, load {l / mc[1]:.2f}x")
EOF
