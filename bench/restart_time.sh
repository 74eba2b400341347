#!/usr/bin/env bash
# Restart recovery time of a full segment: fills one store's segment with
# objects of SIZE through `kvpool bench --keys`, kill -9s the store, restarts
# it on the same data dir and reports how long until its inventory is
# reconciled (store log: scan and mount times), then checks the hit rate.
# Readers (bench/restart_readers.py, the Python package) read the keyspace
# throughout and print what an engine saw: when keys went missing or calls
# failed, and the longest stretch with no key read.
# Usage: bench/restart_time.sh [SEGMENT (4GiB)] [SIZE (4KiB)]
# Env:   PY (a python with the kvpool package; default the test venv's)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SEGMENT="${1:-4GiB}"; SIZE="${2:-4KiB}"
cargo build --release -p kvpool --manifest-path "$ROOT/Cargo.toml" >/dev/null
K="$ROOT/target/release/kvpool"
DATA="$(mktemp -d /dev/shm/kvpool-restart.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT
M=127.0.0.1:50361
"$K" master --rpc-port 50361 --metrics-port 9361 --eviction-high-watermark-ratio 0.99 >"$DATA/master.log" 2>&1 & PIDS+=($!)
"$K" store --master $M --segment-size "$SEGMENT" --data-dir "$DATA/s" >"$DATA/store1.log" 2>&1 & STORE=$!
until "$K" status --master $M 2>/dev/null | grep -q "segments: 1"; do sleep 0.2; done
bytes=$("$K" status --master $M | awk '/^capacity/ {print $2, $3}')
# Enough keys to fill ~90% of the segment.
size_b=$(python3 -c "import re;s='$SIZE';u={'':1,'k':1<<10,'m':1<<20};m=re.match(r'(\d+)\s*([kKmM]?)',s);print(int(m[1])*u[m[2].lower()])")
seg_b=$(python3 -c "import re;s='$SEGMENT';u={'m':1<<20,'g':1<<30};m=re.match(r'(\d+)\s*([mMgG])',s);print(int(m[1])*u[m[2].lower()])")
KEYS=$(( seg_b * 9 / 10 / (size_b + 128) ))
echo "segment $SEGMENT ($bytes), filling with $KEYS objects of $SIZE"
"$K" bench --master $M --ops put --keys "$KEYS" --keep --sizes "$SIZE" --duration 600s --concurrency 4 --prefix fill 2>/dev/null &
BENCH=$!
until [ "$("$K" status --master $M | awk '/^keys/ {print $2}')" -ge "$KEYS" ]; do sleep 1; done
kill "$BENCH" 2>/dev/null || true; wait "$BENCH" 2>/dev/null || true
"$K" status --master $M | grep -E "^(keys|used)"
PY="${PY:-$HOME/.cache/kvpool/venv/bin/python}"
"$PY" "$ROOT/bench/restart_readers.py" --master $M --prefix fill --size "$size_b" --keys "$KEYS" \
  --seconds 40 >"$DATA/readers.out" 2>&1 & READERS=$!
sleep 5
kill -9 "$STORE"; wait "$STORE" 2>/dev/null || true
t0=$(date +%s.%N)
"$K" store --master $M --segment-size "$SEGMENT" --data-dir "$DATA/s" >"$DATA/store2.log" 2>&1 & PIDS+=($!)
until grep -q "segment mounted with its objects" "$DATA/store2.log"; do sleep 0.05; done
t1=$(date +%s.%N)
echo "killed at $(date -u -d @"$t0" +%H:%M:%S.%N | cut -c1-12); the restarted store's log:"
grep -E "store serving|segment mounted with its objects|segment mounted$" "$DATA/store2.log" | sed -E 's/^[0-9-]+T([0-9:.]{12})[0-9]*Z +INFO /\1 /'
python3 -c "print(f'restart to inventory reconciled: {$t1 - $t0:.2f} s (process start, scan, mount, master reconcile)')"
wait "$READERS" || true
echo "readers (kill -9 at 5.0 s; restart at once):"
cat "$DATA/readers.out"
"$K" bench --master $M --ops get --keys "$KEYS" --keep --sizes "$SIZE" --duration 3s --prefix fill 2>/dev/null | grep "hit rate"
