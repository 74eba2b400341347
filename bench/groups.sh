#!/usr/bin/env bash
# The scaling prototype (docs/scaling.md) measured against one master in the
# same run: a real etcd; NGROUPS metadata groups, each two masters elected
# under its own cluster id and one store; and beside them a one-group pool
# of the same processes. `kvpool bench-groups` fills each pool with KEYS
# SGLang-shaped keys (64-byte values), prints keys per group and single
# get/put latency, and the script prints each leader's RSS. Then the
# verified workload runs CHECK seconds on the grouped pool while group 1's
# (or the only group's) leader is killed (-9) at KILL_AT seconds and started again 3 s later, and
# the same on the one-master pool; the run fails if an acknowledged write
# is lost or an older version read.
# Usage: bench/groups.sh [KEYS (1000000)]
# Env:   NGROUPS (4), CHECK (40), KILL_AT (10), KEEP=1 keeps the logs
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
KEYS="${1:-1000000}"; NGROUPS="${NGROUPS:-4}"; CHECK="${CHECK:-40}"; KILL_AT="${KILL_AT:-10}"
cargo build --release -p kvpool --manifest-path "$ROOT/Cargo.toml" >/dev/null
K="$ROOT/target/release/kvpool"
DATA="$(mktemp -d /dev/shm/kvpool-groups.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; if [ -n "${KEEP:-}" ]; then echo "logs kept in $DATA"; else rm -rf "$DATA"; fi; }
trap cleanup EXIT
EP=127.0.0.1:52479
etcd --data-dir "$DATA/etcd" --listen-client-urls "http://$EP" --advertise-client-urls "http://$EP" \
  --listen-peer-urls http://127.0.0.1:52480 --quota-backend-bytes 4294967296 >"$DATA/etcd.log" 2>&1 & PIDS+=($!)
until curl -s "http://$EP/health" | grep -q true; do sleep 0.2; done
# Each store holds its share of the keys with room to spare (a region is
# 64 B of value, the key and the header, in 64-byte units: 256 B).
seg_mib() { echo $(( $1 * 512 / 1048576 + 128 ))MiB; }
declare -A MPID
master() {  # master CLUSTER N RPC METRICS
  "$K" master --rpc-port "$3" --metrics-port "$4" --enable-ha --etcd-endpoints "$EP" --cluster-id "$1" \
    --client-ttl 2s --ha-lease-ttl 2s >>"$DATA/$1-m$2.log" 2>&1 &
  MPID[$1-$2]=$!; PIDS+=($!)
}
group() {  # group CLUSTER INDEX KEYS
  local rpc=$((51100 + 2 * $2)) met=$((19400 + 2 * $2))
  master "$1" 0 "$rpc" "$met"
  master "$1" 1 "$((rpc + 1))" "$((met + 1))"
  "$K" store --master "etcd://$EP/$1" --segment-size "$(seg_mib "$3")" --data-dir "$DATA/$1-store" \
    >"$DATA/$1-store.log" 2>&1 & PIDS+=($!)
}
leader_pid() {  # leader_pid CLUSTER INDEX: the pid of the master leading the group
  local met=$((19400 + 2 * $2))
  for n in 0 1; do
    if curl -s "http://127.0.0.1:$((met + n))/metrics" | grep -q 'kvpool_master_role{role="leader"} 1'; then
      echo "${MPID[$1-$n]}"; return
    fi
  done
}
rss_mb() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
NAMES=()
for g in $(seq 0 $((NGROUPS - 1))); do group "grp-$g" "$g" $((KEYS / NGROUPS)); NAMES+=("grp-$g"); done
group single "$NGROUPS" "$KEYS"
for c in "${NAMES[@]}" single; do
  until "$K" status --master "etcd://$EP/$c" 2>/dev/null | grep -q "segments: 1"; do sleep 0.2; done
done
LIST=$(IFS=,; echo "${NAMES[*]}")
echo "== one master: $KEYS keys"
"$K" bench-groups --pool "etcd://$EP/one" --groups single --keys "$KEYS"
echo "leader RSS: $(rss_mb "$(leader_pid single "$NGROUPS")") MB"
echo "== $NGROUPS groups: $KEYS keys"
"$K" bench-groups --pool "etcd://$EP/grouped" --groups "$LIST" --keys "$KEYS"
for g in $(seq 0 $((NGROUPS - 1))); do echo "group $g leader RSS: $(rss_mb "$(leader_pid "grp-$g" "$g")") MB"; done
# check POOL CLUSTER INDEX: the verified workload on POOL for CHECK seconds,
# the leader of group CLUSTER (number INDEX) killed at KILL_AT and started
# again 3 s later.
check() {
  echo "== $1: verified workload for ${CHECK}s, $2's leader killed at ${KILL_AT}s"
  "$K" bench-groups --pool "etcd://$EP/$1" --keys 0 --samples 0 --check "${CHECK}s" \
    --concurrency 8 >"$DATA/check-$1.out" 2>"$DATA/check-$1.err" & local chk=$! n old; PIDS+=("$chk")
  sleep "$KILL_AT"
  old=$(leader_pid "$2" "$3")
  for n in 0 1; do [ "${MPID[$2-$n]}" = "$old" ] && break; done
  kill -9 "$old"; wait "$old" 2>/dev/null || true; echo "killed $2's leader (master $n)"
  sleep 3
  master "$2" "$n" $((51100 + 2 * $3 + n)) $((19400 + 2 * $3 + n))
  local rc=0; wait "$chk" || rc=$?
  cat "$DATA/check-$1.out"
  return "$rc"
}
rc=0
G=$(( NGROUPS > 1 ? 1 : 0 ))
check grouped "grp-$G" "$G" || rc=$?
check one single "$NGROUPS" || rc=$?
exit "$rc"
