#!/usr/bin/env bash
# Scale run: the same fill of N small objects (put_batch of 64-byte values
# under engine-shaped keys, see engine_keys.py, through the
# MooncakeDistributedStore API) into kvpool and
# into Mooncake 0.3.13, one after the other in the same run, each as master +
# storage node + filler processes on loopback. Prints, per checkpoint, the
# master's RSS per key, the fill rate and single get/put latency; for kvpool
# also the longest request handling time seen in /metrics during the fill,
# and how long a store holding all N objects takes to be fully readable
# again after kill -9 and restart.
#
# Usage: bench/scale.sh OUTDIR
# Env:   KEYS (default 1000000), CHECKPOINTS (default 10000,100000,KEYS),
#        KVPOOL (kvpool binary; default target/release/kvpool),
#        PYTHON (interpreter where `import kvpool` works; default the test venv),
#        MOONCAKE_VENV (default /tmp/kvpool-bench/mooncake-venv; created if
#        missing), SKIP_MOONCAKE=1 to run kvpool alone, MC_STORES (Mooncake
#        storage processes; default one per million keys), KEY_SHAPE (plain,
#        the default: 13-byte keys; sglang; vllm and lmcache, which import
#        those engines and run kvpool alone; vLLM is looked for in
#        KVPOOL_VLLM_SITE, default ~/.cache/kvpool/vllm-site).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
OUT="${1:?usage: scale.sh OUTDIR}"
KEYS="${KEYS:-1000000}"
CHECKPOINTS="${CHECKPOINTS:-10000,100000,$KEYS}"
KVPOOL="${KVPOOL:-$REPO/target/release/kvpool}"
PYTHON="${PYTHON:-$HOME/.cache/kvpool/venv/bin/python}"
MOONCAKE_VENV="${MOONCAKE_VENV:-/tmp/kvpool-bench/mooncake-venv}"
KEY_SHAPE="${KEY_SHAPE:-plain}"
case "$KEY_SHAPE" in
  vllm|lmcache)
    SKIP_MOONCAKE=1
    export PYTHONPATH="${KVPOOL_VLLM_SITE:-$HOME/.cache/kvpool/vllm-site}${PYTHONPATH:+:$PYTHONPATH}" ;;
esac
# Room for every object with its header, twice over.
SEGMENT=$(( KEYS * 512 + (256 << 20) ))
mkdir -p "$OUT"
PIDS=()
DATA=""
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -n "$DATA" ] && rm -rf "$DATA"
}
trap cleanup EXIT

# ------------------------------------------------------------------ kvpool
RPC=50351; METRICS=9303
DATA="$(mktemp -d /dev/shm/kvpool-scale.XXXXXX)"
"$KVPOOL" master --rpc-port $RPC --metrics-port $METRICS >"$OUT/kvpool-master.log" 2>&1 &
MASTER=$!; PIDS+=("$MASTER")
"$KVPOOL" store --master 127.0.0.1:$RPC --segment-size "$SEGMENT" --data-dir "$DATA" \
  >"$OUT/kvpool-store.log" 2>&1 &
STORE=$!; PIDS+=("$STORE")
for _ in $(seq 1 120); do
  "$KVPOOL" status --master 127.0.0.1:$RPC 2>/dev/null | grep -q "segments: 1" && break
  sleep 0.5
done
# The longest request handling time per scrape, all through the fill.
( while kill -0 "$MASTER" 2>/dev/null; do
    curl -s "127.0.0.1:$METRICS/metrics" | awk '/^kvpool_request_handling_longest_seconds /{print $2}'
    sleep 1
  done ) >"$OUT/kvpool-longest.txt" 2>/dev/null &
POLLER=$!; PIDS+=("$POLLER")
"$PYTHON" "$HERE/scale_fill.py" --module kvpool.mooncake --system kvpool --master 127.0.0.1:$RPC \
  --master-pid "$MASTER" --keys "$KEYS" --checkpoints "$CHECKPOINTS" --key-shape "$KEY_SHAPE" | tee "$OUT/kvpool.jsonl"
sleep 1.5; kill "$POLLER" 2>/dev/null
want=$("$KVPOOL" status --master 127.0.0.1:$RPC | awk '/^keys:/{print $2}')
# Every key of the fill is a distinct object (a key function repeating
# itself would fill nothing and measure an empty master).
[ "${want:-0}" -ge "$KEYS" ] || { echo "the master holds ${want:-no} objects after filling $KEYS" >&2; exit 1; }
# kill -9 the store and time until the master serves all its objects again.
kill -9 "$STORE"; wait "$STORE" 2>/dev/null
t0=$(date +%s.%N)
"$KVPOOL" store --master 127.0.0.1:$RPC --segment-size "$SEGMENT" --data-dir "$DATA" \
  >"$OUT/kvpool-store-restart.log" 2>&1 &
STORE=$!; PIDS+=("$STORE")
until grep -q "segment mounted with its objects" "$OUT/kvpool-store-restart.log" 2>/dev/null; do
  sleep 0.05
done
# Every object readable: the key count is back and a sample reads byte-exact.
until [ "$("$KVPOOL" status --master 127.0.0.1:$RPC | awk '/^keys:/{print $2}')" = "$want" ]; do
  sleep 0.05
done
t1=$(date +%s.%N)
"$PYTHON" - "127.0.0.1:$RPC" "$KEYS" "$KEY_SHAPE" "$HERE" <<'EOF' || exit 1
import random, sys
sys.path.insert(0, sys.argv[4])
from engine_keys import key_fn
from kvpool.mooncake import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", sys.argv[1]) == 0
n, key = int(sys.argv[2]), key_fn(sys.argv[3])
keys = [key(random.randrange(n)) for _ in range(2000)]
missing = [k for k, v in zip(keys, s.get_batch(keys)) if len(v) != 64]
sys.exit(f"{len(missing)} of 2000 sampled keys unreadable after the restart" if missing else 0)
EOF
longest=$(sort -g "$OUT/kvpool-longest.txt" | tail -1)
python3 - "$t0" "$t1" "$want" "${longest:-0}" <<'EOF' | tee "$OUT/kvpool-restart.json"
import json, sys
t0, t1, keys, longest = sys.argv[1:]
print(json.dumps({"system": "kvpool", "restart_readable_s": round(float(t1) - float(t0), 2),
                  "keys": int(keys), "longest_request_ms": round(float(longest) * 1e3, 1)}))
EOF
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
wait 2>/dev/null
PIDS=()
rm -rf "$DATA"; DATA=""

# ------------------------------------------------------------------ Mooncake
if [ "${SKIP_MOONCAKE:-0}" != 1 ]; then
  if [ ! -x "$MOONCAKE_VENV/bin/mooncake_master" ]; then
    dpkg -s libibverbs1 >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq libibverbs1; }
    python3 -m venv "$MOONCAKE_VENV" && "$MOONCAKE_VENV/bin/pip" install -q mooncake-transfer-engine-non-cuda==0.3.13.post1 numpy
  fi
  export MC_TCP_BIND_ADDRESS=127.0.0.1
  MRPC=50451; META=8480; MMETRICS=9403
  "$MOONCAKE_VENV/bin/mooncake_master" --rpc_port $MRPC --rpc_address=127.0.0.1 \
    --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
    --http_metadata_server_port $META --metrics_host=127.0.0.1 --metrics_port $MMETRICS \
    --logtostderr >"$OUT/mooncake-master.log" 2>&1 &
  MASTER=$!; PIDS+=("$MASTER")
  sleep 2
  # Mooncake's master refuses puts past about 1.7M objects per segment,
  # however empty the segment: one storage process per million objects.
  MC_STORES="${MC_STORES:-$(( (KEYS + 999999) / 1000000 ))}"
  for i in $(seq 1 "$MC_STORES"); do
    "$MOONCAKE_VENV/bin/python" "$REPO/bench/compare/store_proc.py" --module mooncake.store \
      --hostname "127.0.0.1:$((17100 + i))" --segment $(( SEGMENT / MC_STORES + (256 << 20) )) \
      --lifetime 7200 --master 127.0.0.1:$MRPC \
      --metadata "http://127.0.0.1:$META/metadata" >"$OUT/mooncake-store-$i.log" 2>&1 &
    PIDS+=("$!")
  done
  for i in $(seq 1 "$MC_STORES"); do
    for _ in $(seq 1 60); do grep -q "store setup rc=0" "$OUT/mooncake-store-$i.log" 2>/dev/null && break; sleep 1; done
  done
  "$MOONCAKE_VENV/bin/python" "$HERE/scale_fill.py" --module mooncake.store --system mooncake \
    --master 127.0.0.1:$MRPC --metadata "http://127.0.0.1:$META/metadata" \
    --master-pid "$MASTER" --keys "$KEYS" --checkpoints "$CHECKPOINTS" --key-shape "$KEY_SHAPE" | tee "$OUT/mooncake.jsonl"
fi
