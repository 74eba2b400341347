#!/usr/bin/env bash
# What authentication, capabilities and TLS cost on the TCP path, in one
# run: three pools side by side (each a master + 2 storage nodes as
# separate processes), measured in alternating rounds so that drift in the
# machine's speed hits all three alike:
#   plain  no secret: no handshake proof, no grants
#   auth   a cluster secret: HMAC handshake, and every data-plane read and
#          write carries a master-signed grant that the store verifies
#   tls    the secret and TLS on every connection (client, master, stores)
# `kvpool bench` (Rust client, batch 32, 4 workers, protocol tcp) runs puts
# then gets per size; the table gives each pool's median over the rounds
# and its ratio to plain. Objects are kept (--keep) in every pool, so all
# three are full and evicting alike after the first round (a client key
# may not RemoveAll, so cleaning up would favour the plain pool).
# With BEFORE=<kvpool binary of an earlier build> a fourth pool, "before",
# runs that binary with no secret: plain / before is what the change between
# the two builds costs (the write fence, say), on this machine in this run.
# BEFORE_AS=auth runs it with the secret instead, for auth / before (what a
# change to grants or their checks costs).
# Usage: bench/security_cost.sh [OUTDIR]   (builds the release binary first)
# Env: ROUNDS (default 5), DURATION (per bench phase, default 3s),
#      SIZES (default 4KiB,512KiB), SEGMENT (per store, default 1GiB),
#      BEFORE, BEFORE_AS (optional, see above).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/kvpool-bench/security}"; mkdir -p "$OUT"
ROUNDS="${ROUNDS:-5}"; DURATION="${DURATION:-3s}"
SIZES="${SIZES:-4KiB,512KiB}"; SEGMENT="${SEGMENT:-1GiB}"
BEFORE_AS="${BEFORE_AS:-plain}"
cargo build --release -p kvpool --manifest-path "$ROOT/Cargo.toml" >/dev/null
K="$ROOT/target/release/kvpool"

DATA="$(mktemp -d /dev/shm/kvpool-security.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT

"$K" secret new --out "$DATA/admin.key" >/dev/null
"$K" secret derive --role store --secret-file "$DATA/admin.key" >"$DATA/store.key"
"$K" secret derive --role client --secret-file "$DATA/admin.key" >"$DATA/client.key"
chmod 600 "$DATA"/*.key
"$K" tls new --out "$DATA/tls" --cert master --cert store >/dev/null

POOLS=(plain auth tls)
declare -A BIN=([plain]="$K" [auth]="$K" [tls]="$K")
if [ -n "${BEFORE:-}" ]; then POOLS=(before "${POOLS[@]}"); BIN[before]="$BEFORE"; fi

# pool NAME PORT -> starts it; the client flags go to $DATA/NAME.flags
pool() {
  local name=$1 port=$2 mflags=() sflags=() cflags=() bin=${BIN[$1]} as=$1
  [ "$name" = before ] && as=$BEFORE_AS
  case $as in
    auth|tls)
      mflags+=(--secret-file "$DATA/admin.key"); sflags+=(--secret-file "$DATA/store.key")
      cflags+=(--secret-file "$DATA/client.key") ;;
  esac
  if [ "$name" = tls ]; then
    mflags+=(--tls-ca "$DATA/tls/ca.pem" --tls-cert "$DATA/tls/master.pem" --tls-key "$DATA/tls/master.key")
    sflags+=(--tls-ca "$DATA/tls/ca.pem" --tls-cert "$DATA/tls/store.pem" --tls-key "$DATA/tls/store.key")
    cflags+=(--tls-ca "$DATA/tls/ca.pem")
  fi
  "$bin" master --rpc-port "$port" --metrics-port $((port + 1)) "${mflags[@]}" >"$OUT/$name-master.log" 2>&1 & PIDS+=($!)
  for i in 1 2; do
    "$bin" store --master "127.0.0.1:$port" --segment-size "$SEGMENT" --data-dir "$DATA/$name-s$i" \
      "${sflags[@]}" >"$OUT/$name-store$i.log" 2>&1 & PIDS+=($!)
  done
  echo "${cflags[@]}" >"$DATA/$name.flags"
  for _ in $(seq 1 60); do
    # shellcheck disable=SC2046
    "$bin" status --master "127.0.0.1:$port" $(cat "$DATA/$name.flags") 2>/dev/null | grep -q "segments: 2" && return
    sleep 0.5
  done
  echo "pool $name did not start; see $OUT/$name-*.log" >&2; exit 1
}
declare -A PORT=([before]=50441 [plain]=50451 [auth]=50461 [tls]=50471)
for name in "${POOLS[@]}"; do pool "$name" "${PORT[$name]}"; done

: >"$OUT/raw.tsv"
for r in $(seq 1 "$ROUNDS"); do
  for name in "${POOLS[@]}"; do
    # shellcheck disable=SC2046
    "${BIN[$name]}" bench --master "127.0.0.1:${PORT[$name]}" $(cat "$DATA/$name.flags") --protocol tcp \
      --sizes "$SIZES" --batch 32 --concurrency 4 --duration "$DURATION" --prefix "r$r" --keep 2>/dev/null |
      awk -v pool="$name" -v round="$r" '($1 == "put" || $1 == "get") && $2 ~ /B$/ { print pool "\t" round "\t" $1 "\t" $2 "\t" $5 "\t" $6 "\t" $8 }' >>"$OUT/raw.tsv"
  done
done

python3 - "$OUT/raw.tsv" "$BEFORE_AS" <<'EOF' | tee "$OUT/security.md"
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    pool, _, op, size, items, gbs, p99 = line.split("\t")
    rows[(op, size, pool)].append((float(items), float(gbs), float(p99)))
before = any(p == "before" for _, _, p in rows)
before_as = sys.argv[2]
head = "| op | size | plain GB/s | auth GB/s | auth / plain | auth+TLS GB/s | TLS / plain | p99 plain / auth / TLS (us) |"
line = "|---|---|---|---|---|---|---|---|"
if before:
    head += f" before ({before_as}) GB/s | {before_as} / before | p99 before (us) |"
    line += "---|---|---|"
print(head)
print(line)
for op, size in sorted({(o, s) for o, s, _ in rows}, key=lambda k: (k[0] != "put", k[1])):
    med = {p: (statistics.median(x[1] for x in rows[(op, size, p)]), statistics.median(x[2] for x in rows[(op, size, p)]))
           for p in ("plain", "auth", "tls") + (("before",) if before else ())}
    base = med["plain"][0]
    row = (f"| {op} | {size} | {base:.3f} | {med['auth'][0]:.3f} | {med['auth'][0] / base:.3f} | "
           f"{med['tls'][0]:.3f} | {med['tls'][0] / base:.3f} | "
           f"{med['plain'][1]:.0f} / {med['auth'][1]:.0f} / {med['tls'][1]:.0f} |")
    if before:
        row += (f" {med['before'][0]:.3f} | {med[before_as][0] / med['before'][0]:.3f} | "
                f"{med['before'][1]:.0f} |")
    print(row)
EOF
