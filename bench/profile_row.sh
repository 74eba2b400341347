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
# With CLIENT=python the client is the README comparison's bench_store.py
# through kvpool.mooncake (one thread), OP one of its tests (put, get,
# put_from, get_into, put_batch, get_batch, batch_put_from,
# batch_get_into), and perf samples that test alone, from its start to
# its end (at most DURATION, or MAX_BYTES: 1 GiB as in the README's table;
# a fast row may need more, and a SEGMENT to hold it, to be sampled at all):
#   CLIENT=python PYTHON=/path/to/venv/bin/python bench/profile_row.sh tcp 512KiB put_from
# Env: DURATION (whole seconds, default 4s), SEGMENT (default 4GiB), KVPOOL (default the
#      release binary, built first), PYTHON (where `import kvpool` works, default python3).
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
secs="${DURATION%s}"
if [ "${CLIENT:-rust}" = python ]; then
  # The test to profile, and the one whose result line it starts after
  # (the gets read what a put test before them wrote).
  case "$OP" in
    get|get_into) tests="put,$OP"; after="^  put " ;;
    get_batch|batch_get_into) tests="put_batch,$OP"; after="^  put_batch " ;;
    put|put_from|put_batch|batch_put_from) tests="$OP"; after="^register_buffer" ;;
    *) echo "profile_row: no bench_store.py test $OP" >&2; exit 2 ;;
  esac
  bytes=$(python3 -c 'import re,sys; m=re.fullmatch(r"(\d+)([KMG]i?B)?", sys.argv[1]); print(int(m[1]) << {None: 0, "KiB": 10, "MiB": 20, "GiB": 30}[m[2]])' "$SIZE")
  echo "bench_store.py --protocol $PROTOCOL --sizes $bytes --batch $BATCH --tests $tests (profiling $OP):"
  echo
  "${PYTHON:-python3}" "$ROOT/bench/compare/bench_store.py" --module kvpool.mooncake --master "127.0.0.1:$RPC" \
    --metadata P2PHANDSHAKE --protocol "$PROTOCOL" --sizes "$bytes" --batch "$BATCH" --tests "$tests" \
    --max-seconds "$secs" --max-bytes "${MAX_BYTES:-1073741824}" --json "$OUT/results.json" >"$OUT/client.log" 2>&1 & client=$!
  PIDS+=($client)
  # Waits without polling (tail follows the log by inotify), so the waits
  # add nothing to the samples.
  follow() { grep -q -m1 "$1" < <(tail -n +1 -f --pid="$client" "$OUT/client.log"); }
  follow "$after" || { cat "$OUT/client.log" >&2; exit 1; }
  # Sampled until the test's own result line: the rows of big values are
  # bounded by bytes (1 GiB) and may end well within DURATION.
  perf record -q -F 1999 -a -g -o "$OUT/perf.data" 2>/dev/null & perf=$!
  follow "^  $OP " || true
  kill -INT "$perf"
  wait "$perf" || true
  wait "$client"
  echo "| test | size | batch | items/s | GB/s | p50 us | p99 us |"
  echo "|---|---|---|---|---|---|---|"
  python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    if r["test"] == sys.argv[2]:
        print("| %s | %d | %d | %.0f | %.3f | %.1f | %.1f |" % tuple(r[k] for k in ("test", "size", "batch", "ops_per_s", "GBps", "p50_us", "p99_us")))' \
    "$OUT/results.json" "$OP" | tee "$OUT/bench.md"
else
bench=(bench --master "127.0.0.1:$RPC" --protocol "$PROTOCOL" --sizes "$SIZE" --batch "$BATCH"
  --concurrency "$CONC" --duration "$DURATION")
# A get phase reads what the put phase before it in the same run wrote:
# perf starts half a second into the get phase. A first unprofiled run
# warms the pages up.
"$KVPOOL" "${bench[@]}" --prefix warm --ops put,get >/dev/null 2>&1
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
fi
echo
perf report -i "$OUT/perf.data" --stdio --no-children -g none --sort comm,dso,sym -F sample,comm,dso,sym 2>/dev/null |
  awk '
    /^#/ || NF < 4 { next }
    { n = $1; sym = $0 }
    $2 == "swapper" || sym ~ /pv_native_safe_halt|default_idle|cpuidle/ { cat["idle"] += n; next }
    sym ~ /_copy_to_iter|_copy_from_iter|copy_user|skb_copy_datagram/ { cat["kernel copies (socket buffers)"] += n; next }
    sym ~ /fused::.*copy_hash/ { cat["copy and checksum in one pass"] += n; next }
    sym ~ /memmove|memcpy|memset/ { cat["user-space copies (memcpy)"] += n; next }
    sym ~ /xxh3|xxhash|twox_hash/ { cat["checksums (xxh3)"] += n; next }
    sym ~ /sha2|hmac|capability/ { cat["grants and auth (SHA-256)"] += n; next }
    sym ~ /try_to_wake_up|finish_task_switch|__schedule|futex|_raw_spin_unlock_irq|schedule_hrtimeout|ep_poll|do_epoll|sock_def_readable|irqentry_exit|syscall_exit_to_user/ { cat["wake-ups, scheduling, epoll"] += n; next }
    sym ~ /malloc|_int_free|cfree|realloc|unlink_chunk|consolidate|__rust_alloc|__rust_dealloc|kmem_cache|alloc_pages|free_frozen|__alloc_frozen/ { cat["allocation (user and kernel)"] += n; next }
    sym ~ /kvpool_master/ { cat["master bookkeeping"] += n; next }
    $3 ~ /libpython|python3/ || sym ~ /_PyEval|PyObject_|_Py[A-Z]/ { cat["Python interpreter"] += n; next }
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
# Which threads the busy samples are on: the client's (its own name, and
# `kvpool-rt` for a Python client's runtime), the servers' (`tokio-rt-worker`:
# master and store alike).
echo
echo "| busy samples by thread | share |"
echo "|---|---|"
perf report -i "$OUT/perf.data" --stdio --no-children -g none --sort comm -F sample,comm 2>/dev/null |
  awk '/^#/ || NF < 2 || $2 == "swapper" { next } { n[$2] += $1; t += $1 }
       END { for (c in n) if (n[c] / t >= 0.01) printf "| %s | %.1f%% |\n", c, 100 * n[c] / t }' | sort -t'|' -k3,3 -rn
