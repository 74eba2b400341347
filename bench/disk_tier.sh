#!/usr/bin/env bash
# The disk tier, measured in one run on this machine's disk:
#  1. fio: O_DIRECT random reads of 512 KiB and 4 KiB at queue depth 4
#     (4 threads doing pread, as the store does), on a file in DISK_DIR;
#  2. disk-tier reads: a store with a small memory segment and a big disk
#     tier (4 requests in flight to the device, `--disk-queue-depth 4`),
#     filled at a pace the disk absorbs, then read at random by `kvpool
#     bench` (16 workers keep the store's queue full), promotion off so
#     only reads reach the disk; ratio to fio;
#  3. puts with and without a disk tier behind the same memory, at a pace
#     the disk keeps up with (`--rate`): what demotion costs a put;
#  4. `kvpool bench-reuse` on a working set of 3x memory, Zipf and
#     multi-turn, memory alone vs memory + disk: hit rate and read latency
#     by tier.
# Usage: bench/disk_tier.sh [OUTDIR]   (builds the release binary first)
# Env: DISK_DIR (a directory on the disk to measure, default under /var/tmp),
#      DURATION (per measurement, default 10s).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/kvpool-bench/disk}"; mkdir -p "$OUT"
DURATION="${DURATION:-10s}"
secs="${DURATION%s}"
DISK_DIR="${DISK_DIR:-/var/tmp/kvpool-disk-bench}"
command -v fio >/dev/null || apt-get install -y -qq fio >/dev/null
cargo build --release -p kvpool --manifest-path "$ROOT/Cargo.toml" >/dev/null
K="$ROOT/target/release/kvpool"
MEM="$(mktemp -d /dev/shm/kvpool-disk-bench.XXXXXX)"
mkdir -p "$DISK_DIR"
PIDS=()
STORE_FLAGS=()
# Stops the pool and gives its memory and disk back (the disk files are big).
stop_pool() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
  rm -rf "${MEM:?}"/* "$DISK_DIR"/pool-*
}
cleanup() { stop_pool; rm -rf "$MEM" "$DISK_DIR"/pool-* "$DISK_DIR/fio.dat"; }
trap cleanup EXIT

# A free port pair (RPC, metrics) on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# pool NAME MEMORY DISK [master flags...]: a master and one store; its RPC
# port is left in $PORT.
pool() {
  local name=$1 mem=$2 disk=$3; shift 3
  local port; port="$(free_port)"; PORT=$port
  "$K" master --rpc-port "$port" --metrics-port "$(free_port)" "$@" >"$OUT/$name-master.log" 2>&1 & PIDS+=($!)
  local dflags=()
  [ "$disk" != 0 ] && dflags=(--disk-dir "$DISK_DIR/pool-$name" --disk-size "$disk" "${STORE_FLAGS[@]}")
  "$K" store --master "127.0.0.1:$port" --segment-size "$mem" --data-dir "$MEM/$name" "${dflags[@]}" \
    >"$OUT/$name-store.log" 2>&1 & PIDS+=($!)
  local want=1; [ "$disk" != 0 ] && want=2
  for _ in $(seq 1 100); do
    "$K" status --master "127.0.0.1:$port" 2>/dev/null | grep -q "segments: $want" && return
    sleep 0.2
  done
  echo "pool $name did not start; see $OUT/$name-*.log" >&2; exit 1
}
# settle PORT: waits until the memory tier is under its demotion watermark.
settle() {
  for _ in $(seq 1 300); do
    local pct
    pct="$("$K" status --master "127.0.0.1:$1" | awk '/^memory tier:/ { gsub(/[(%),]/, "", $8); print $8 }')"
    awk -v p="${pct:-100}" 'BEGIN { exit !(p < 92) }' && return
    sleep 0.2
  done
}
bench() { "$K" bench --protocol tcp "$@" 2>/dev/null; }
# disk_io PORT: "READS BYTES" the store's disk tier has served so far.
disk_io() {
  "$K" status --master "127.0.0.1:$1" | awk '/^DISK I\/O/ { io = 1; next } io && /\/disk / {
    m = ($4 == "GiB") ? 2^30 : ($4 == "MiB") ? 2^20 : ($4 == "KiB") ? 2^10 : 1
    printf "%d %.0f\n", $2, $3 * m }'
}
# disk_reads PORT BEFORE SECONDS: the disk tier's read rate since BEFORE.
disk_reads() {
  local now; now="$(disk_io "$1")"
  awk -v a="$2" -v b="$now" -v s="$3" -v fmb="$FIO_512" -v fiops="$FIO_4K" 'BEGIN {
    split(a, x, " "); split(b, y, " "); n = (y[1] - x[1]) / s; mb = (y[2] - x[2]) / s / 1e6
    printf "disk-tier reads: %.0f/s, %.1f MB/s (%.0f%% of fio 512k bandwidth, %.0f%% of fio 4k IOPS)\n",
      n, mb, 100 * mb / fmb, 100 * n / fiops }'
}

{
echo "# disk tier, $(date -u +%Y-%m-%dT%H:%MZ), disk dir $DISK_DIR ($(df -h "$DISK_DIR" | awk 'NR==2 {print $1}'))"
echo
echo "## 1. fio, O_DIRECT random reads, 4 threads (queue depth 4)"
for bs in 512k 4k; do
  fio --name=randread-$bs --filename="$DISK_DIR/fio.dat" --size=2G --rw=randread --bs=$bs --direct=1 \
    --ioengine=psync --numjobs=4 --group_reporting --runtime="$secs" --time_based --output-format=terse \
    >"$OUT/fio-$bs.terse"
  awk -F';' -v bs=$bs '{ printf "fio %s: %.0f IOPS, %.1f MB/s\n", bs, $8, $7 * 1024 / 1e6 }' "$OUT/fio-$bs.terse"
done
FIO_512="$(awk -F';' '{ print $7 * 1024 / 1e6 }' "$OUT/fio-512k.terse")"
FIO_4K="$(awk -F';' '{ print $8 }' "$OUT/fio-4k.terse")"
rm -f "$DISK_DIR/fio.dat"

echo
echo "## 2. disk-tier reads (memory 256 MiB, disk 6 GiB; 512 KiB: 8192 objects, 4 GiB)"
# The ratio counts only what the store read from its disk tier (its I/O
# counters), not the reads memory served.
# The store keeps 4 reads in flight to the device, as fio's 4 threads do;
# 16 workers keep it busy.
STORE_FLAGS=(--disk-queue-depth 4)
pool reads 256MiB 6GiB --promote-on-read false
STORE_FLAGS=()
# Filled at 300 puts/s (157 MB/s), which demotion to this disk keeps up with.
bench --concurrency 4 --master 127.0.0.1:$PORT --ops put --sizes 512KiB --keys 8192 --keep --batch 1 --rate 300 --duration 28s --prefix big | tail -n 3
settle $PORT
"$K" status --master 127.0.0.1:$PORT | grep -E "tier:|demotions|^evictions"
before="$(disk_io $PORT)"
bench --master 127.0.0.1:$PORT --ops get --sizes 512KiB --keys 8192 --batch 8 --concurrency 16 --duration "$DURATION" --prefix big | tail -n 3
disk_reads $PORT "$before" "$secs"
echo "### 4 KiB: 131072 objects, 512 MiB"
# --rate counts batches: 150 x 32 = 4,800 puts/s.
bench --concurrency 4 --master 127.0.0.1:$PORT --ops put --sizes 4KiB --keys 131072 --keep --batch 32 --rate 150 --duration 28s --prefix small | tail -n 3
settle $PORT
"$K" status --master 127.0.0.1:$PORT | grep -E "tier:|demotions|^evictions"
before="$(disk_io $PORT)"
bench --master 127.0.0.1:$PORT --ops get --sizes 4KiB --keys 131072 --batch 32 --concurrency 16 --duration "$DURATION" --prefix small | tail -n 3
disk_reads $PORT "$before" "$secs"
"$K" status --master 127.0.0.1:$PORT | sed -n '/DISK I\/O/,$p'
stop_pool

echo
echo "## 3. puts of 512 KiB at 400/s for 20 s (4 GB into 1 GiB of memory): memory alone, then memory + disk, 3 times each"
# Alternated, and the medians compared: on a 2-core box one 20 s run's p50
# moves by more than the two sides differ.
rm -f "$OUT/put-memory.txt" "$OUT/put-disk.txt"
for run in 1 2 3; do
  pool memput 1GiB 0
  bench --concurrency 4 --master 127.0.0.1:$PORT --ops put --sizes 512KiB --batch 1 --rate 400 --duration 20s --keep | tail -n 1 | tee -a "$OUT/put-memory.txt"
  "$K" status --master 127.0.0.1:$PORT | grep -E "^evictions"
  stop_pool
  pool diskput 1GiB 12GiB
  bench --concurrency 4 --master 127.0.0.1:$PORT --ops put --sizes 512KiB --batch 1 --rate 400 --duration 20s --keep | tail -n 1 | tee -a "$OUT/put-disk.txt"
  "$K" status --master 127.0.0.1:$PORT | grep -E "^evictions|demotions" | tr '\n' ' '; echo
  stop_pool
done
# median FILE COLUMN: the middle of three runs' values in COLUMN.
median() { awk -v c="$2" '{ print $c }' "$1" | sort -n | sed -n 2p; }
for col in 7 8; do
  m="$(median "$OUT/put-memory.txt" $col)"; d="$(median "$OUT/put-disk.txt" $col)"
  awk -v n=$((col - 6)) -v m="$m" -v d="$d" 'BEGIN { printf "put %s median: memory alone %s us, with a disk tier %s us, ratio %.2f\n",
    (n == 1 ? "p50" : "p99"), m, d, d / m }'
done

echo
echo "## 4. reuse, working set 768 MiB = 3x memory (256 MiB), 64 KiB pages"
for pattern in zipf turns; do
  pool memonly 256MiB 0
  echo "### $pattern, memory only"
  "$K" bench-reuse --master 127.0.0.1:$PORT --pattern "$pattern" --working-set 768MiB --duration "$DURATION"
  stop_pool
  pool tiered 256MiB 2GiB
  echo "### $pattern, memory + disk"
  "$K" bench-reuse --master 127.0.0.1:$PORT --pattern "$pattern" --working-set 768MiB --duration "$DURATION"
  "$K" status --master 127.0.0.1:$PORT | grep -E "tier:|demotions|promotions|^evictions"
  stop_pool
done
} 2>&1 | tee "$OUT/disk_tier.md"
