#!/usr/bin/env python3
"""Readers (and a writer) through a restart: what an engine sees while a
store is killed and comes back (bench/restart_time.sh) or a master leader
hands over (bench/handover.sh).

Reads random keys of a filled keyspace (``<prefix>-<size>-<i>``, as
``kvpool bench --keys`` writes them) in batches of --batch for --seconds
and counts, per --bucket of time, keys read with the right length, keys
missing and calls that failed. With --write-size, a second thread puts new
keys of that size all along and counts puts acknowledged, failed, and the
slowest. At the end it prints the timeline around the outage and a line
each: the first and last bucket with a failure, and the longest run of
buckets with no key read (no put acknowledged).
"""

import argparse
import random
import sys
import threading
import time

import kvpool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--master", required=True)
    ap.add_argument("--prefix", required=True, help="keys are <prefix>-<size>-<i>")
    ap.add_argument("--size", type=int, required=True, help="value bytes of every key")
    ap.add_argument("--keys", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bucket", type=float, default=0.1, help="seconds per timeline bucket")
    ap.add_argument("--write-size", type=int, default=0, help="value bytes of the writer's puts (0: no writer)")
    a = ap.parse_args()
    client = kvpool.Client(master=a.master)
    t0 = time.monotonic()
    writes = {}  # bucket index -> [acknowledged, failed, slowest put in s]
    writer = None
    if a.write_size:
        writer = threading.Thread(target=write, args=(client, a, t0, writes), daemon=True)
        writer.start()
    buckets = {}  # bucket index -> [read, missing, failed calls]
    errors = {}  # error text -> (count, first bucket)
    while (now := time.monotonic()) - t0 < a.seconds:
        b = buckets.setdefault(int((now - t0) / a.bucket), [0, 0, 0])
        keys = [f"{a.prefix}-{a.size}-{random.randrange(a.keys)}" for _ in range(a.batch)]
        try:
            values = client.batch_get(keys)
        except kvpool.KvpoolError as e:
            b[2] += 1
            n, first = errors.get(str(e), (0, int((now - t0) / a.bucket)))
            errors[str(e)] = (n + 1, first)
            time.sleep(0.01)
            continue
        for v in values:
            if v is not None and len(v) == a.size:
                b[0] += 1
            else:
                b[1] += 1
    bad = sorted(i for i, (_, missing, failed) in buckets.items() if missing or failed)
    longest = longest_dry(buckets)
    for i in range(max(0, (bad[0] if bad else 0) - 5), min(max(buckets), (bad[-1] if bad else 0) + 5) + 1):
        read, missing, failed = buckets.get(i, [0, 0, 0])
        print(f"{i * a.bucket:7.1f} s  read {read:6d}  missing {missing:6d}  failed calls {failed:4d}")
    total = [sum(b[j] for b in buckets.values()) for j in range(3)]
    if bad:
        print(f"keys missing or calls failing from {bad[0] * a.bucket:.1f} s to {(bad[-1] + 1) * a.bucket:.1f} s; "
              f"longest stretch with no key read: {longest * a.bucket:.1f} s; "
              f"read {total[0]}, missing {total[1]}, failed calls {total[2]}")
    else:
        print(f"no key missing and no call failed; longest stretch with no key read: {longest * a.bucket:.1f} s; "
              f"read {total[0]}")
    for text, (n, first) in sorted(errors.items(), key=lambda e: e[1][1]):
        print(f"  {n} calls from {first * a.bucket:.1f} s failed with: {text}")
    if writer is not None:
        writer.join()
        report_writes(writes, a.bucket)
    sys.stdout.flush()


def longest_dry(buckets: dict) -> int:
    """The longest run of consecutive buckets whose first count (keys read,
    puts acknowledged) is 0, buckets with nothing at all included."""
    dry = longest = 0
    for i in range(max(buckets) + 1):
        dry = dry + 1 if buckets.get(i, [0])[0] == 0 else 0
        longest = max(longest, dry)
    return longest


def write(client: "kvpool.Client", a: argparse.Namespace, t0: float, writes: dict) -> None:
    """Puts new keys one after another until --seconds are over."""
    value = b"w" * a.write_size
    n = 0
    while (start := time.monotonic()) - t0 < a.seconds:
        b = writes.setdefault(int((start - t0) / a.bucket), [0, 0, 0.0])
        n += 1
        try:
            client.put(f"{a.prefix}-written-{n}", value)
            b[0] += 1
        except kvpool.KvpoolError:
            b[1] += 1
            time.sleep(0.01)
        b[2] = max(b[2], time.monotonic() - start)


def report_writes(writes: dict, bucket: float) -> None:
    """The writer's line: failures, the longest stretch with no put
    acknowledged, and the slowest put."""
    longest = longest_dry(writes)
    failed = sorted(i for i, w in writes.items() if w[1])
    slowest = max(w[2] for w in writes.values())
    acked = sum(w[0] for w in writes.values())
    where = f"from {failed[0] * bucket:.1f} s to {(failed[-1] + 1) * bucket:.1f} s" if failed else "never"
    print(f"writes: {acked} acknowledged, {sum(w[1] for w in writes.values())} failed ({where}); "
          f"longest stretch with no put acknowledged: {longest * bucket:.1f} s; slowest put {slowest:.2f} s")


if __name__ == "__main__":
    main()
