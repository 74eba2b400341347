#!/usr/bin/env bash
# What a fault costs readers and writers: kvpool and the real Mooncake 0.3.13
# (PyPI mooncake-transfer-engine-non-cuda==0.3.13.post1, TCP) on loopback,
# in the same run, one after the other, with the same load and faults.
#
# Usage: bench/faults_latency.sh OUTDIR [--systems kvpool,mooncake] [--clients 3]
#          [--get-rate 100] [--put-rate 20] [--size 65536] [--keys-per-set 100]
#          [--phases kill,stop,leader,netns] [--steady 10] [--fault 15] [--stop-secs 10]
#          [--recover 5] [--warmup 5] [--segment 256MiB] [--get-workers 4] [--put-workers 2]
# Env:   KVPOOL_BENCH_SKIP_BUILD=1   skip `cargo build --release -p kvpool` and
#                                    the Python package install (reruns)
#        KVPOOL_BENCH_VENV           venv with kvpool's Python package
#                                    (default /tmp/kvpool-bench/kvpool-venv)
#        MOONCAKE_VENV               venv with Mooncake (default
#                                    /tmp/kvpool-bench/mooncake-venv; made as
#                                    bench/compare/run_mooncake.sh makes it)
#        FAULTS_BASE_PORT            first of the ports used (62600; up to
#                                    +120), FAULTS_ETCD_PORT (62590, peer +1)
#
# For each system (bench/faults/run.py does the work, with that system's Python):
#  cluster 1: one master and two storage nodes, "victim" and "survivor",
#    each its own process (kvpool: `kvpool store --segment-size 256MiB
#    --data-dir <tmp> --name ...`; Mooncake: bench/compare/store_proc.py,
#    as bench/compare/run_mooncake.sh runs it, HTTP metadata server).
#  cluster 2 (phase leader): two masters in HA through a real etcd that this
#    script starts on 127.0.0.1 with a temp data dir (kvpool: --enable-ha
#    --etcd-endpoints, clients and stores use etcd://127.0.0.1:PORT/<cluster>;
#    Mooncake: --enable_ha --etcd_endpoints, clients etcd://127.0.0.1:PORT,
#    P2PHANDSHAKE metadata since the HTTP metadata server lives in a master).
#  Before each fault, fresh key sets are put through the Mooncake-compatible
#    API: A 1 replica on the victim, B 2 replicas (both stores), C 1 replica on
#    the survivor (ReplicateConfig.preferred_segment(s)); each key is then
#    filed by where batch_get_replica_desc says its replicas are.
#  Load: --clients processes (bench/faults/load.py), each 100 gets/s over
#    A, B, C + 20 puts/s of new keys, open-loop on a fixed schedule (a stall
#    shows as latency), get_into with every byte checked, every op recorded.
#  Faults, each after --steady s of steady load, followed by --recover s:
#    kill    kill -9 the victim store; --fault s later start it again
#            (kvpool: same data dir; Mooncake: a new, empty segment)
#    stop    SIGSTOP the victim store for --stop-secs s, then SIGCONT
#    leader  kill -9 the master leader (from its etcd key); --fault s later
#            start it again, as a standby
#    netns   cluster 3: the master listens on a veth address and the victim
#            store runs in its own network namespace (ip netns, a veth pair
#            10.213.N.1 <-> .2, no netem; kvpool needs --insecure off loopback);
#            the namespace's end of the link goes down for --fault s (packets
#            to the victim are dropped silently), then up again
#  Client knobs stay at their defaults (kvpool's timeouts and retries are
#  what a Mooncake user gets by switching the import).
#
# Output: OUTDIR/per_second.csv (t, phase, per op class: count, p50, p99, max,
# errors, misses), OUTDIR/summary.md (also printed) and summary.json, and per
# system OUTDIR/<system>/{phases.json, ops-*.csv, *.log}. Exit status 2 if any
# get returned wrong bytes.
#
# Cleanup: on exit the trap kills only the processes this script started
# (etcd, the orchestrators, and every PID they list in OUTDIR/<system>/pids)
# and deletes only the network namespaces they list in OUTDIR/<system>/netns.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:?usage: bench/faults_latency.sh OUTDIR [--systems kvpool,mooncake] [--clients 3] ...}"; shift
SYSTEMS="kvpool,mooncake"
PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --systems) SYSTEMS="$2"; shift 2 ;;
    --systems=*) SYSTEMS="${1#*=}"; shift ;;
    --clients|--get-rate|--put-rate|--size|--keys-per-set|--phases|--steady|--fault|--stop-secs|--recover|--warmup|--segment|--get-workers|--put-workers|--drain)
      PASS+=("$1" "$2"); shift 2 ;;
    --*=*) PASS+=("$1"); shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "faults_latency: unknown argument $1" >&2; exit 1 ;;
  esac
done
VENV="${KVPOOL_BENCH_VENV:-/tmp/kvpool-bench/kvpool-venv}"
MC_VENV="${MOONCAKE_VENV:-/tmp/kvpool-bench/mooncake-venv}"
# Fixed ports above Linux's default ephemeral range (32768-60999), so that no
# outgoing connection or port-0 listener of anyone else can hold them.
BASE_PORT="${FAULTS_BASE_PORT:-62600}"
ETCD_PORT="${FAULTS_ETCD_PORT:-62590}"
KVPOOL_BIN="$ROOT/target/release/kvpool"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
t_start=$SECONDS
log() { echo "== faults [$((SECONDS - t_start))s] $*"; }

# ------------------------------------------------------------------ cleanup
STARTED=()          # PIDs this script started directly
TMP="$(mktemp -d /dev/shm/kvpool-faults.XXXXXX)"
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${STARTED[@]}"; do
    kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null || true
  done
  sleep 1
  # Whatever the orchestrators started and left behind: only PIDs they
  # recorded, and only while the process still runs the program recorded.
  for f in "$OUT"/*/pids; do
    [ -f "$f" ] || continue
    while read -r pid _name exe; do
      [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || continue
      tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$exe" || continue
      kill -CONT "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    done <"$f"
  done
  for pid in "${STARTED[@]}"; do
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  done
  for f in "$OUT"/*/netns; do
    [ -f "$f" ] || continue
    while read -r ns hostif; do
      ip netns list 2>/dev/null | grep -q "^$ns\b" && { ip netns del "$ns" 2>/dev/null || true; }
      ip link show "$hostif" >/dev/null 2>&1 && { ip link del "$hostif" 2>/dev/null || true; }
    done <"$f"
  done
  wait 2>/dev/null || true
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ build / install
want() { case ",$SYSTEMS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
if want kvpool; then
  if [ "${KVPOOL_BENCH_SKIP_BUILD:-0}" != 1 ]; then
    log "building the release kvpool binary and the Python package"
    cargo build --release -p kvpool --manifest-path "$ROOT/Cargo.toml"
    KVPOOL_VENV="$VENV" KVPOOL_TEST_SGLANG=0 KVPOOL_TEST_MOONCAKE=0 KVPOOL_TEST_LMCACHE=0 KVPOOL_TEST_VLLM=0 \
      "$ROOT/scripts/test-python.sh" --setup-only
    PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
      --no-build-isolation --force-reinstall --no-deps "$ROOT/crates/kvpool-python"
  fi
  [ -x "$KVPOOL_BIN" ] || { echo "faults_latency: $KVPOOL_BIN missing (unset KVPOOL_BENCH_SKIP_BUILD)" >&2; exit 1; }
  "$VENV/bin/python" -c 'import kvpool.mooncake, numpy' || { echo "faults_latency: kvpool not importable in $VENV" >&2; exit 1; }
fi
if want mooncake; then
  if [ ! -x "$MC_VENV/bin/mooncake_master" ]; then
    [ "${KVPOOL_BENCH_SKIP_BUILD:-0}" = 1 ] && log "note: $MC_VENV has no Mooncake; installing it anyway"
    dpkg -s libibverbs1 >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq libibverbs1; }
    python3 -m venv "$MC_VENV"
    "$MC_VENV/bin/pip" install -q mooncake-transfer-engine-non-cuda==0.3.13.post1 numpy
  fi
fi

# ------------------------------------------------------------------ etcd
ETCD_ADDR=""
PHASES="kill,stop,leader,netns"
for ((i = 0; i < ${#PASS[@]}; i++)); do
  [ "${PASS[$i]}" = --phases ] && PHASES="${PASS[$((i + 1))]}"
  case "${PASS[$i]}" in --phases=*) PHASES="${PASS[$i]#*=}" ;; esac
done
if [[ ",$PHASES," == *",leader,"* ]]; then
  command -v etcd >/dev/null || { apt-get update -qq && apt-get install -y -qq etcd-server; }
  etcd --name faults --data-dir "$TMP/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "faults=http://127.0.0.1:$((ETCD_PORT + 1))" >"$OUT/etcd.log" 2>&1 &
  STARTED+=($!)
  for _ in $(seq 1 50); do
    curl -sf "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1 && break
    sleep 0.2
  done
  curl -sf "http://127.0.0.1:$ETCD_PORT/health" >/dev/null || { echo "etcd did not start" >&2; tail "$OUT/etcd.log"; exit 1; }
  ETCD_ADDR="127.0.0.1:$ETCD_PORT"
  log "etcd on $ETCD_ADDR (data in $TMP/etcd)"
fi

# ------------------------------------------------------------------ runs
run_system() {
  local sys="$1" py="$2" port="$3"
  rm -rf "${OUT:?}/$sys"; mkdir -p "$OUT/$sys" "$TMP/$sys"
  log "running $sys"
  "$py" "$ROOT/bench/faults/run.py" --system "$sys" --out "$OUT" --tmp "$TMP/$sys" \
    --kvpool-bin "$KVPOOL_BIN" --etcd "$ETCD_ADDR" --base-port "$port" "${PASS[@]}" \
    > >(tee "$OUT/$sys/run.log") 2>&1 &
  local pid=$!
  STARTED+=("$pid")
  wait "$pid" || log "$sys orchestrator exited with $?"
}
IFS=, read -r -a SYS_LIST <<<"$SYSTEMS"
for sys in "${SYS_LIST[@]}"; do
  case "$sys" in
    kvpool) run_system kvpool "$VENV/bin/python" "$BASE_PORT" ;;
    mooncake) run_system mooncake "$MC_VENV/bin/python" "$BASE_PORT" ;;
    *) echo "faults_latency: unknown system $sys" >&2; exit 1 ;;
  esac
done
log "summary"
set +e
python3 "$ROOT/bench/faults/summarize.py" "$OUT"
src=$?
log "done in $((SECONDS - t_start))s; results in $OUT"
exit "$src"
