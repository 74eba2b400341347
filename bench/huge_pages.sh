#!/usr/bin/env bash
# Shared-memory puts with the store's segment on 4 KiB pages (/dev/shm), on
# hugetlbfs and on a tmpfs mounted huge=always, in turn, REPEAT times: each
# round starts a fresh master, store and Python client (bench_store.py
# through kvpool.mooncake, as in the README's comparison), so every client
# builds its page tables for the segment as it writes. Prints medians
# [lowest-highest] per file system. Needs root (mounts, vm.nr_hugepages,
# both put back at the end).
# Usage: bench/huge_pages.sh OUTDIR [extra bench_store.py args]
# Env: REPEAT (default 3), KVPOOL, PYTHON (as run_kvpool.sh),
#      STORE_SEGMENT (default 4 GiB), TESTS (default put,put_from),
#      SIZES (default 524288,4194304).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:?usage: huge_pages.sh OUTDIR [bench args]}"; shift
REPEAT="${REPEAT:-3}"
export STORE_SEGMENT="${STORE_SEGMENT:-$((4 << 30))}"
mkdir -p "$OUT"
[ "$(id -u)" = 0 ] || { echo "huge_pages.sh needs root (mount, vm.nr_hugepages)" >&2; exit 1; }

MNT="$(mktemp -d /tmp/kvpool-huge.XXXXXX)"
mkdir -p "$MNT/hugetlbfs" "$MNT/thp"
pages_before="$(cat /proc/sys/vm/nr_hugepages)"
cleanup() {
  umount "$MNT/hugetlbfs" "$MNT/thp" 2>/dev/null
  echo "$pages_before" >/proc/sys/vm/nr_hugepages
  rm -rf "$MNT"
}
trap cleanup EXIT
want=$(( STORE_SEGMENT / (2 << 20) + 8 ))
echo $(( pages_before + want )) >/proc/sys/vm/nr_hugepages
free="$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)"
[ "$free" -ge "$want" ] || { echo "only $free huge pages free, $want wanted" >&2; exit 1; }
mount -t hugetlbfs -o pagesize=2M none "$MNT/hugetlbfs"
mount -t tmpfs -o "huge=always,size=$(( STORE_SEGMENT + (256 << 20) ))" tmpfs "$MNT/thp"

declare -A ROOT=([small]=/dev/shm [hugetlbfs]="$MNT/hugetlbfs" [thp]="$MNT/thp")
order=(small hugetlbfs thp)
for r in $(seq 1 "$REPEAT"); do
  for fs in "${order[@]}"; do
    dir="$OUT/r$r/$fs"
    DATA_ROOT="${ROOT[$fs]}" "$HERE/compare/run_kvpool.sh" "$dir" --protocol shm \
      --tests "${TESTS:-put,put_from}" --sizes "${SIZES:-524288,4194304}" "$@" >/dev/null ||
      echo "$fs run failed (repetition $r)" >&2
  done
  order=("${order[2]}" "${order[0]}" "${order[1]}")
done

python3 - "$OUT" <<'PY' | tee "$OUT/huge_pages.md"
import glob, json, os, re, statistics, sys
out = sys.argv[1]
rows, huge = {}, {}
for f in sorted(glob.glob(f"{out}/r*/*/results.json")):
    fs = os.path.basename(os.path.dirname(f))
    for r in json.load(open(f))["results"]:
        rows.setdefault((r["test"], r["size"], fs), []).append(r)
    log = open(os.path.join(os.path.dirname(f), "store.log")).read()
    m = re.search(r"huge_page_bytes=(\d+)", log)
    huge.setdefault(fs, []).append(int(m.group(1)) if m else -1)
span = lambda xs, f: f"{f(statistics.median(xs))} [{f(min(xs))}-{f(max(xs))}]"
print("| test | size | segment on | GB/s | p50 us | p99 us |")
print("|---|---|---|---|---|---|")
for (test, size, fs), rs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
    g = lambda k: [r[k] for r in rs]
    print(f"| {test} | {size // 1024} KiB | {fs} | {span(g('GBps'), lambda v: f'{v:.2f}')} "
          f"| {span(g('p50_us'), lambda v: f'{v:.0f}')} | {span(g('p99_us'), lambda v: f'{v:.0f}')} |")
print()
for fs, hs in sorted(huge.items()):
    print(f"{fs}: huge_page_bytes at store start {sorted(set(hs))}")
PY
