#!/usr/bin/env bash
# Where the time of one benchmark row goes: a master and a store as
# separate processes, `kvpool bench` (the Rust client) running one operation
# at one size, and `perf record` over the whole machine meanwhile. Prints
# the row's throughput and a table of the CPU samples by category (kernel
# copies, user-space copies, checksums, the rest of the network stack,
# wake-ups and scheduling, allocation, the master's bookkeeping, idle), so
# a change can be judged by what it removes. docs/performance.md quotes it.
# Usage: bench/profile_row.sh PROTOCOL SIZE OP [BATCH] [CONCURRENCY] [OUTDIR]
#   e.g. bench/profile_row.sh tcp 512KiB put 32 1
# Env: DURATION (whole seconds, default 4s), SEGMENT (default 4GiB), KVPOOL (default the
#      release binary, built first).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PROTOCOL="${1:?usage: profile_row.sh PROTOCOL SIZE OP [BATCH] [CONCURRENCY] [OUTDIR]}"
SIZE="${2:?size}"; OP="${3:?op: put or get}"
BATCH="${4:-32}"; CONC="${5:-1}"; OUT="${6:-/tmp/kvpool-profile/$PROTOCOL-$SIZE-$OP-$BATCH}"
DURATION="${DURATION:-4s}"; SEGMENT="${SEGMENT:-4GiB}"
command -v perf >/dev/null || { echo "profile_row: perf is not installed" >&2; exit 1; }
if [ -z "${KVPOOL:-}" ]; then
  cargo build --release -p kvpool --manifest-path "$ROOT/Cargo.toml" >/dev/null
  KVPOOL="$ROOT/target/release/kvpool"
fi
mkdir -p "$OUT"
DATA="$(mktemp -d /dev/shm/kvpool-profile.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RPC=$(port)
"$KVPOOL" master --rpc-port "$RPC" --metrics-port 0 >"$OUT/master.log" 2>&1 & PIDS+=($!)
"$KVPOOL" store --master "127.0.0.1:$RPC" --segment-size "$SEGMENT" --data-dir "$DATA" >"$OUT/store.log" 2>&1 & PIDS+=($!)
for _ in $(seq 60); do "$KVPOOL" status --master "127.0.0.1:$RPC" 2>/dev/null | grep -q "segments: 1" && break; sleep 0.5; done
bench=(bench --master "127.0.0.1:$RPC" --protocol "$PROTOCOL" --sizes "$SIZE" --batch "$BATCH"
  --concurrency "$CONC" --duration "$DURATION")
# A get phase reads what the put phase before it in the same run wrote:
# perf starts half a second into the get phase. A first unprofiled run
# warms the pages up.
"$KVPOOL" "${bench[@]}" --prefix warm --ops put,get >/dev/null 2>&1
secs="${DURATION%s}"
if [ "$OP" = get ]; then
  profiled=(--prefix p --ops put,get); delay=(-D $((secs * 1000 + 500)))
else
  profiled=(--prefix p --ops put); delay=()
fi
echo "kvpool bench --protocol $PROTOCOL --sizes $SIZE --batch $BATCH --concurrency $CONC ${profiled[*]}:"
echo
echo "| op | size | batch | workers | items/s | GB/s | p50 us | p99 us |"
echo "|---|---|---|---|---|---|---|---|"
perf record -q -F 1999 -a -g "${delay[@]}" -o "$OUT/perf.data" -- "$KVPOOL" "${bench[@]}" "${profiled[@]}" 2>/dev/null |
  awk -v op="$OP" '$1 == op && $3 ~ /^[0-9]+$/ { printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8 }' | tee "$OUT/bench.md"
echo
perf report -i "$OUT/perf.data" --stdio --no-children -g none --sort comm,dso,sym -F sample,comm,dso,sym 2>/dev/null |
  awk '
    /^#/ || NF < 4 { next }
    { n = $1; sym = $0 }
    $2 == "swapper" || sym ~ /pv_native_safe_halt|default_idle|cpuidle/ { cat["idle"] += n; next }
    sym ~ /_copy_to_iter|_copy_from_iter|copy_user|skb_copy_datagram/ { cat["kernel copies (socket buffers)"] += n; next }
    sym ~ /memmove|memcpy|memset/ { cat["user-space copies (memcpy)"] += n; next }
    sym ~ /xxh3|xxhash|twox_hash/ { cat["checksums (xxh3)"] += n; next }
    sym ~ /sha2|hmac|capability/ { cat["grants and auth (SHA-256)"] += n; next }
    sym ~ /try_to_wake_up|finish_task_switch|__schedule|futex|_raw_spin_unlock_irq|schedule_hrtimeout|ep_poll|do_epoll|sock_def_readable|irqentry_exit|syscall_exit_to_user/ { cat["wake-ups, scheduling, epoll"] += n; next }
    sym ~ /malloc|_int_free|cfree|realloc|unlink_chunk|consolidate|__rust_alloc|__rust_dealloc|kmem_cache|alloc_pages|free_frozen|__alloc_frozen/ { cat["allocation (user and kernel)"] += n; next }
    sym ~ /kvpool_master/ { cat["master bookkeeping"] += n; next }
    $3 ~ /kernel/ { cat["rest of the kernel (TCP/IP, syscalls)"] += n; next }
    { cat["rest of user space (framing, tokio, client)"] += n }
    END { for (c in cat) printf "%s\t%d\n", c, cat[c] }' >"$OUT/cats.tsv"
all=$(awk -F'\t' '{ n += $2 } END { print n }' "$OUT/cats.tsv")
idle=$(awk -F'\t' '$1 == "idle" { print $2 }' "$OUT/cats.tsv")
echo "| where the busy CPU went ($OP, every process) | share |"
echo "|---|---|"
grep -v "^idle" "$OUT/cats.tsv" | sort -t$'\t' -k2,2nr |
  awk -F'\t' -v busy=$((all - ${idle:-0})) '{ printf "| %s | %.1f%% |\n", $1, 100 * $2 / busy }'
awk -v i="${idle:-0}" -v a="$all" 'BEGIN { printf "\nIdle: %.1f%% of all samples.\n", 100 * i / a }'
