#!/usr/bin/env bash
# kvpool's transfer engine against the real Mooncake 0.3.13 engine (TCP), in
# one run: write and read, 4 KiB to 4 MiB blocks, batch 1 and 32, the two
# systems alternating; prints a markdown table (bench/engine_compare.py says
# how to read it) and writes it to $OUT/table.md, raw runs to $OUT/results.json
# and the engines' logs to $OUT/peers.log.
#
# Usage: bench/engine_compare.sh
# Env:   MODE=loopback|samehost|netns|all  (default all. loopback: both systems on TCP;
#                                   samehost: kvpool's same-host copies against Mooncake's
#                                   TCP; netns: the receiver in a network namespace behind
#                                   a veth pair, needs root)
#        ROUNDS=5                  rounds per row (ROUNDS=1 for a quick check)
#        ROW_SECONDS=1             timed loop per row per system per round
#        SIZES=4KiB,64KiB,512KiB,4MiB
#        OUT=/tmp/engine_compare
#        KVPOOL_VENV=~/.cache/kvpool/venv  (has kvpool and mooncake-transfer-engine-non-cuda)
# MODE=all ROUNDS=5 takes about 16 minutes on a 2-core machine, ROUNDS=1 about 3.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${KVPOOL_VENV:-$HOME/.cache/kvpool/venv}/bin/python"
OUT="${OUT:-/tmp/engine_compare}"
MODE="${MODE:-all}"
NS="kvbench-$$"
VETH="kvb$$"  # this end stays here, "${VETH}n" goes into the namespace (15-char limit)
HOST_IP=10.99.0.1
PEER_IP=10.99.0.2

case "$MODE" in
  loopback | samehost | netns) modes=("$MODE") ;;
  all) modes=(loopback samehost netns) ;;
  *) echo "MODE must be loopback, samehost, netns or all, not '$MODE'" >&2; exit 2 ;;
esac

pid=""
netns_up=""
cleanup() {
  # The driver ends its own peers on SIGTERM; the namespace goes only after.
  if [[ -n "$pid" ]]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if [[ -n "$netns_up" ]]; then ip netns del "$NS" 2>/dev/null || true; ip link del "$VETH" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

netns_setup() {
  [[ "$(id -u)" == 0 ]] || { echo "netns mode needs root" >&2; return 1; }
  ip netns add "$NS" &&
    ip link add "$VETH" type veth peer name "${VETH}n" netns "$NS" &&
    ip addr add "$HOST_IP/24" dev "$VETH" && ip link set "$VETH" up &&
    ip -n "$NS" addr add "$PEER_IP/24" dev "${VETH}n" && ip -n "$NS" link set "${VETH}n" up &&
    ip -n "$NS" link set lo up
}

notes=()
if [[ " ${modes[*]} " == *" netns "* ]]; then
  netns_up=1
  if ! netns_setup; then
    msg="netns mode skipped: no network namespace and veth pair could be set up (errors above)."
    echo "$msg" >&2
    notes+=(--note "$msg")
    modes=("${modes[@]/netns}")
  fi
fi
modes_arg="$(IFS=,; echo "${modes[*]}")"
[[ -n "${modes_arg//,/}" ]] || exit 0

"$PY" "$ROOT/bench/engine_compare.py" --modes "$modes_arg" --netns "$NS" --host-ip "$HOST_IP" \
  --peer-ip "$PEER_IP" --rounds "${ROUNDS:-5}" --seconds "${ROW_SECONDS:-1}" \
  --sizes "${SIZES:-4KiB,64KiB,512KiB,4MiB}" --out "$OUT" "${notes[@]}" >/dev/null &
pid=$!
wait "$pid"
pid=""
cat "$OUT/table.md"
echo "table: $OUT/table.md, raw runs: $OUT/results.json, engine logs: $OUT/peers.log"
