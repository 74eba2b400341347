#!/usr/bin/env bash
# A master leader handing over on purpose (SIGTERM, as an upgrade does it),
# under readers and a writer: two masters elected through a real etcd, one
# store filled with KEYS objects of SIZE, then bench/restart_readers.py
# reads the keyspace and puts new keys while the leader is sent SIGTERM at
# 5 s and started again (as the upgraded standby). Prints what the readers
# and the writer saw: how long no key was read, no put acknowledged, and the
# slowest put.
# Usage: bench/handover.sh [KEYS (20000)] [SIZE (4KiB)]
# Env:   PY (a python with the kvpool package; default the test venv's)
#        RESTART_AFTER (seconds before the old leader starts again, as the
#        upgraded standby; default 0, when it usually wins the election
#        again; with 2 the standby takes over, as when a pod restarts)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
KEYS="${1:-20000}"; SIZE="${2:-4KiB}"
PY="${PY:-$HOME/.cache/kvpool/venv/bin/python}"
cargo build --release -p kvpool --manifest-path "$ROOT/Cargo.toml" >/dev/null
K="$ROOT/target/release/kvpool"
DATA="$(mktemp -d /dev/shm/kvpool-handover.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; if [ -n "${KEEP:-}" ]; then echo "logs kept in $DATA"; else rm -rf "$DATA"; fi; }
trap cleanup EXIT
etcd --data-dir "$DATA/etcd" --listen-client-urls http://127.0.0.1:52379 \
  --advertise-client-urls http://127.0.0.1:52379 --listen-peer-urls http://127.0.0.1:52380 >"$DATA/etcd.log" 2>&1 & PIDS+=($!)
POOL=etcd://127.0.0.1:52379/handover
master() {  # master N: rpc port 5037N, metrics 937N
  "$K" master --rpc-port "5037$1" --metrics-port "937$1" --enable-ha --etcd-endpoints 127.0.0.1:52379 \
    --cluster-id handover >>"$DATA/master-$1.log" 2>&1 &
  echo $!
}
M0=$(master 0); PIDS+=("$M0")
M1=$(master 1); PIDS+=("$M1")
"$K" store --master "$POOL" --segment-size 2GiB --data-dir "$DATA/s" >"$DATA/store.log" 2>&1 & PIDS+=($!)
until "$K" status --master "$POOL" 2>/dev/null | grep -q "segments: 1"; do sleep 0.2; done
"$K" bench --master "$POOL" --ops put --keys "$KEYS" --keep --sizes "$SIZE" --duration 600s --concurrency 4 --prefix fill 2>/dev/null &
BENCH=$!
until [ "$("$K" status --master "$POOL" | awk '/^keys/ {print $2}')" -ge "$KEYS" ]; do sleep 0.5; done
kill "$BENCH" 2>/dev/null || true; wait "$BENCH" 2>/dev/null || true
size_b=$(python3 -c "import re;s='$SIZE';u={'':1,'k':1<<10,'m':1<<20};m=re.match(r'(\d+)\s*([kKmM]?)',s);print(int(m[1])*u[m[2].lower()])")
leader=0
curl -s http://127.0.0.1:9371/metrics | grep -q 'kvpool_master_role{role="leader"} 1' && leader=1
LPID=$M0; [ "$leader" = 1 ] && LPID=$M1
echo "$KEYS objects of $SIZE; master-$leader leads; readers and a writer run 30 s, SIGTERM to the leader at 5 s"
"$PY" "$ROOT/bench/restart_readers.py" --master "$POOL" --prefix fill --size "$size_b" --keys "$KEYS" \
  --seconds 30 --write-size "$size_b" >"$DATA/readers.out" 2>&1 & READERS=$!
sleep 5
kill -TERM "$LPID"; wait "$LPID" 2>/dev/null || true
sleep "${RESTART_AFTER:-0}"
NEW=$(master "$leader"); PIDS+=("$NEW")
wait "$READERS" || true
cat "$DATA/readers.out"
echo "elections:"
grep -h "elected master leader" "$DATA"/master-*.log | sed -E 's/^[0-9-]+T([0-9:.]{12}).*advertise=([^ ]+).*/  \1 \2 elected/' | sort
