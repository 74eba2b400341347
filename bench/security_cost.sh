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
# A second table gives the CPU per item moved (bench client, master and
# stores together, from /proc), and with perf installed a third the share
# of the auth pool's busy CPU spent signing and checking grants and
# handshakes (SHA-256, HMAC, capability code), sampled system-wide over one
# more bench per size: on a 2-core box the throughput rounds spread by
# 10-20%, far more than the cost being measured, so the profile is the
# figure the security budget (3%) is held to. PROFILE=0 skips it.
# Usage: bench/security_cost.sh [OUTDIR]   (builds the release binary first)
# Env: ROUNDS (default 5), DURATION (per bench phase, default 3s),
#      SIZES (default 4KiB,512KiB), SEGMENT (per store, default 1GiB),
#      BEFORE, BEFORE_AS (optional, see above), PROFILE (default 1).
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
declare -A POOL_PIDS=()
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
  POOL_PIDS[$name]=$!
  for i in 1 2; do
    "$bin" store --master "127.0.0.1:$port" --segment-size "$SEGMENT" --data-dir "$DATA/$name-s$i" \
      "${sflags[@]}" >"$OUT/$name-store$i.log" 2>&1 & PIDS+=($!)
    POOL_PIDS[$name]+=" $!"
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

: >"$OUT/raw.tsv"; : >"$OUT/cpu.tsv"
# The hypervisor's share of the CPU while the rounds run (steal time): on a
# shared VM it is what makes rounds spread.
# shellcheck source=bench/steal.sh
source "$ROOT/bench/steal.sh"
TICKS0="$(cpu_ticks)"
TICK="$(getconf CLK_TCK)"
# cpu_of PID... -> clock ticks (user + system) the processes have used so far
cpu_of() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
TIMEFORMAT='%U %S'
for r in $(seq 1 "$ROUNDS"); do
  for size in ${SIZES//,/ }; do
    for name in "${POOLS[@]}"; do
      # shellcheck disable=SC2086
      before=$(cpu_of ${POOL_PIDS[$name]})
      # shellcheck disable=SC2046
      { time "${BIN[$name]}" bench --master "127.0.0.1:${PORT[$name]}" $(cat "$DATA/$name.flags") --protocol tcp \
        --sizes "$size" --batch 32 --concurrency 4 --duration "$DURATION" --prefix "r$r" --keep 2>/dev/null |
        awk -v pool="$name" -v round="$r" '($1 == "put" || $1 == "get") && $2 ~ /B$/ { print pool "\t" round "\t" $1 "\t" $2 "\t" $5 "\t" $6 "\t" $8 }' >>"$OUT/raw.tsv"; } 2>"$DATA/time"
      # shellcheck disable=SC2086
      after=$(cpu_of ${POOL_PIDS[$name]})
      items=$(awk -v pool="$name" -v round="$r" -v size="$size" '$1 == pool && $2 == round && $4 == size { n += $5 } END { print n + 0 }' "$OUT/raw.tsv")
      awk -v pool="$name" -v round="$r" -v size="$size" -v ticks="$((after - before))" -v hz="$TICK" -v items="$items" \
        '{ printf "%s\t%s\t%s\t%.3f\t%d\n", pool, round, size, ticks / hz + $1 + $2, items }' "$DATA/time" >>"$OUT/cpu.tsv"
    done
  done
done

STEAL="$(steal_share "$TICKS0" "$(cpu_ticks)")"
python3 - "$OUT/raw.tsv" "$OUT/cpu.tsv" "$BEFORE_AS" "$STEAL" <<'EOF' | tee "$OUT/security.md"
import collections, statistics, sys
rows = collections.defaultdict(dict)
p99s = collections.defaultdict(list)
for line in open(sys.argv[1]):
    pool, rnd, op, size, items, gbs, p99 = line.split("\t")
    rows[(op, size, pool)][int(rnd)] = float(gbs)
    p99s[(op, size, pool)].append(float(p99))
cpu = collections.defaultdict(dict)
for line in open(sys.argv[2]):
    pool, rnd, size, secs, items = line.split("\t")
    cpu[(size, pool)][int(rnd)] = float(secs) / max(float(items), 1) * 1e6
pools = ("plain", "auth", "tls") + (("before",) if any(p == "before" for _, _, p in rows) else ())
before_as = sys.argv[3]
med = lambda d: statistics.median(d.values())

def paired(a, b):
    """Median, lowest and highest of the per-round ratios a/b (each round
    ran the pools back to back, so a drift of the machine cancels)."""
    r = sorted(a[k] / b[k] for k in a if b.get(k))
    return f"{statistics.median(r):.3f} [{r[0]:.2f}-{r[-1]:.2f}]"

extra = "before" in pools
print(f"Throughput: median GB/s over the rounds; each ratio is the median of the rounds' own ratios [lowest-highest]. The hypervisor took {sys.argv[4]}% of the CPU time while they ran (steal).")
print()
print("| op | size | plain GB/s | auth GB/s | auth / plain | auth+TLS GB/s | TLS / plain | p99 plain / auth / TLS (us) |"
      + (f" before ({before_as}) GB/s | {before_as} / before |" if extra else ""))
print("|---|---|---|---|---|---|---|---|" + ("---|---|" if extra else ""))
for op, size in sorted({(o, s) for o, s, _ in rows}, key=lambda k: (k[0] != "put", k[1])):
    by = {p: rows[(op, size, p)] for p in pools}
    p99 = {p: statistics.median(p99s[(op, size, p)]) for p in pools}
    row = (f"| {op} | {size} | {med(by['plain']):.3f} | {med(by['auth']):.3f} | {paired(by['auth'], by['plain'])} | "
           f"{med(by['tls']):.3f} | {paired(by['tls'], by['plain'])} | "
           f"{p99['plain']:.0f} / {p99['auth']:.0f} / {p99['tls']:.0f} |")
    if extra:
        row += f" {med(by['before']):.3f} | {paired(by[before_as], by['before'])} |"
    print(row)
print()
print("CPU per item moved: user + system time of the bench client, the master and both stores, over the puts and gets of a size, per item (us); ratios as above.")
print()
print("| size | plain us/item | auth us/item | auth / plain | auth+TLS us/item | TLS / plain |"
      + (f" before ({before_as}) us/item | {before_as} / before |" if extra else ""))
print("|---|---|---|---|---|---|" + ("---|---|" if extra else ""))
for size in sorted({s for s, _ in cpu}):
    by = {p: cpu[(size, p)] for p in pools}
    row = (f"| {size} | {med(by['plain']):.2f} | {med(by['auth']):.2f} | {paired(by['auth'], by['plain'])} | "
           f"{med(by['tls']):.2f} | {paired(by['tls'], by['plain'])} |")
    if extra:
        row += f" {med(by['before']):.2f} | {paired(by[before_as], by['before'])} |"
    print(row)
EOF

if [ "${PROFILE:-1}" != 0 ] && command -v perf >/dev/null; then
  echo
  echo "Share of the auth pool's busy CPU (all processes but idle) in grants and handshakes: SHA-256, HMAC, capability code, grants (de)serialised, keys checked (perf, 999 Hz):"
  echo
  echo "| size | busy samples | in grants and handshakes | share |"
  echo "|---|---|---|---|"
  for size in ${SIZES//,/ }; do
    # shellcheck disable=SC2046
    perf record -q -F 999 -a -o "$DATA/perf.data" -- "$K" bench --master "127.0.0.1:${PORT[auth]}" $(cat "$DATA/auth.flags") \
      --protocol tcp --sizes "$size" --batch 32 --concurrency 4 --duration "$DURATION" --prefix "prof" --keep >/dev/null 2>&1
    perf report -i "$DATA/perf.data" --stdio --no-children -g none --sort comm,sym -F sample,comm,sym 2>/dev/null |
      awk -v size="$size" '
        /^#/ || NF < 3 { next }
        $2 == "swapper" { next }
        { busy += $1 }
        /sha2::|hmac::|capability::|Capability|subtle::|auth::Credentials|key_in_region/ { auth += $1 }
        END { printf "| %s | %d | %d | %.2f%% |\n", size, busy, auth, busy ? 100 * auth / busy : 0 }' | tee -a "$OUT/security.md"
  done
fi
