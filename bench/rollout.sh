#!/usr/bin/env bash
# A coordinated in-place rollout under load, as the seeds' upgrade does it:
# `rbg up` runs a prefill/decode/store group (a kvpool master, 3 stores,
# and bench/rollout_load.py as the prefill and decode engines, through the
# calls SGLang's HiCache makes), then `rbg apply` changes the stores' image
# from the previous release to this build. The stores restart one at a
# time, in place (same address, same segment); the engines keep running.
# Prints, per second through the rollout, the decode and prefill engines'
# hit rate, failed calls and p99 against their steady state, then one
# summary line.
#
# Usage: bench/rollout.sh
# Env:   FROM  the stores' first kvpool binary (default: the previous
#              release, built by scripts/previous-release.sh; FROM=this
#              rolls this build to itself)
#        PAGES working-set pages (default 2000; each a K and a V of 64 KiB)
#        REPLICAS copies of each page (default 2)
#        PY    a python with the kvpool package (default the test venv's)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$HOME/.cache/kvpool/venv/bin/python}"
PAGES="${PAGES:-2000}"
REPLICAS="${REPLICAS:-2}"
cargo build --release -q -p kvpool -p rbg --manifest-path "$ROOT/Cargo.toml"
NEW="$ROOT/target/release"
if [ "${FROM:-}" = this ]; then OLD="$NEW"
elif [ -n "${FROM:-}" ]; then OLD="$(dirname "$FROM")"
else OLD="$(dirname "$("$ROOT/scripts/previous-release.sh")")"; fi
RBG="$NEW/rbg"
W="$(mktemp -d /dev/shm/kvpool-rollout.XXXXXX)"
export RBG_STATE_DIR="$W/state"
UP=
cleanup() {
  [ -n "$UP" ] && kill -TERM "$UP" 2>/dev/null && wait "$UP" 2>/dev/null
  if [ -n "${KEEP:-}" ]; then echo "kept in $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT
cat >"$W/images.yaml" <<EOF
kvpool:old: $OLD
kvpool:new: $NEW
EOF
group() {  # group IMAGE: the group with the stores on IMAGE
  cat <<EOF
apiVersion: workloads.x-k8s.io/v1alpha2
kind: RoleBasedGroup
metadata: {name: rollout}
spec:
  roleTemplates:
  - name: engine
    template:
      spec:
        containers:
        - name: engine
          image: python
          command: [$PY, -u, $ROOT/bench/rollout_load.py]
          args: [--role, \$(ROLE_NAME), --master, "s-rollout-master:50051", --local, \$(POD_IP),
                 --pages, "$PAGES", --replicas, "$REPLICAS", --out, $W/\$(ROLE_NAME).jsonl]
          env:
          - name: POD_IP
            valueFrom: {fieldRef: {fieldPath: status.podIP}}
  roles:
  - name: master
    replicas: 1
    standalonePattern:
      template:
        spec:
          containers:
          - name: master
            image: kvpool:old
            command: [kvpool, master]
            args: [--rpc-address=\$(POD_IP), --rpc-port=50051, --metrics-address=\$(POD_IP), --metrics-port=9003]
            env:
            - name: POD_IP
              valueFrom: {fieldRef: {fieldPath: status.podIP}}
            ports: [{name: rpc, containerPort: 50051}]
            readinessProbe: {tcpSocket: {port: rpc}, periodSeconds: 1}
  - name: store
    replicas: 3
    dependencies: [master]
    rolloutStrategy:
      type: RollingUpdate
      rollingUpdate: {type: InPlaceIfPossible, maxUnavailable: 1}
    standalonePattern:
      template:
        spec:
          containers:
          - name: store
            image: $1
            command: [kvpool, store]
            args: [--master=s-rollout-master:50051, --address=\$(POD_IP), --port=7000,
                   --segment-size=1GiB, --data-dir=/data]
            env:
            - name: POD_IP
              valueFrom: {fieldRef: {fieldPath: status.podIP}}
            ports: [{name: data, containerPort: 7000}]
            readinessProbe: {tcpSocket: {port: data}, periodSeconds: 1}
            volumeMounts: [{name: data, mountPath: /data}]
          volumes: [{name: data, emptyDir: {medium: Memory}}]
  - name: prefill
    replicas: 1
    dependencies: [store]
    standalonePattern: {templateRef: {name: engine}}
  - name: decode
    replicas: 1
    dependencies: [store]
    standalonePattern: {templateRef: {name: engine}}
---
apiVersion: workloads.x-k8s.io/v1alpha2
kind: CoordinatedPolicy
metadata: {name: rollout}
spec:
  policies:
  - name: pd-and-cache
    roles: [prefill, decode, store]
    strategy:
      rollingUpdate: {maxSkew: "34%"}
EOF
}
group kvpool:old >"$W/old.yaml"
group kvpool:new >"$W/new.yaml"
"$RBG" up -f "$W/old.yaml" --images "$W/images.yaml" >"$W/up.log" 2>&1 & UP=$!
echo "stores on $OLD/kvpool, then $NEW/kvpool; $PAGES pages (K and V, 64 KiB each, $REPLICAS replicas)"
until [ -s "$W/decode.jsonl" ]; do sleep 1; kill -0 "$UP" || { cat "$W/up.log"; exit 1; }; done
sleep 15
t_apply=$(date +%s.%N)
"$RBG" apply -f "$W/new.yaml" --images "$W/images.yaml" --wait >"$W/apply.log" 2>&1
t_done=$(date +%s.%N)
sleep 10
"$PY" - "$W" "$t_apply" "$t_done" <<'EOF'
import json, sys
w, t_apply, t_done = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rows = {}
for role in ("prefill", "decode"):
    for line in open(f"{w}/{role}.jsonl"):
        r = json.loads(line)
        rows.setdefault(round(r["t"]), {})[role] = r
ts = sorted(rows)
def reads(r):
    return r["get_hits"] + r["get_misses"] + r["get_errors"]
def rate(r):
    return r["get_hits"] / reads(r) if reads(r) else None
steady = {}
for role in ("prefill", "decode"):
    before = [rows[t][role] for t in ts if t < t_apply - 1 and role in rows[t]][2:]
    hits, n = sum(r["get_hits"] for r in before), sum(reads(r) for r in before)
    p99s = sorted(r["get_p99_ms"] for r in before if r["get_p99_ms"] is not None)
    steady[role] = (hits / n, p99s[len(p99s) // 2])
    print(f"{role}: steady hit rate {hits / n:.4f}, p99 of a 32-page read {steady[role][1]:.2f} ms (median second)")
print(f"rollout: {t_done - t_apply:.1f} s (rbg apply --wait)")
print(" second | decode hit  p99 ms  errors | prefill hit  p99 ms  errors  puts ok/failed")
worst = {"prefill": [1.0, 0.0, 0], "decode": [1.0, 0.0, 0]}
puts_failed = 0
for t in (t for t in ts if t_apply - 3 <= t <= t_done + 5):
    cells = []
    for role in ("decode", "prefill"):
        r = rows[t].get(role)
        if r is None:
            cells.append("   -        -       -  ")
            continue
        h, p = rate(r), r["get_p99_ms"]
        hr = h / steady[role][0] if h is not None else 0.0
        pr = p / steady[role][1] if p is not None else 0.0
        wr = worst[role]
        wr[0], wr[1], wr[2] = min(wr[0], hr), max(wr[1], pr), wr[2] + r["get_errors"]
        cells.append(f"{h if h is not None else 0:.4f} {p or 0:7.2f} {r['get_errors']:6d}")
    p = rows[t].get("prefill", {})
    puts_failed += p.get("put_errors", 0)
    print(f" {t - round(t_apply):+6d} | {cells[0]} | {cells[1]}  {p.get('put_hits', 0)}/{p.get('put_errors', 0)}")
for role, (h, p, e) in worst.items():
    print(f"{role}: lowest hit rate {h:.4f} of steady, highest p99 {p:.2f}x steady, {e} failed reads")
print(f"prefill puts failed during the rollout: {puts_failed}")
EOF
grep -h "upgrad\|in place" "$W/up.log" | tail -6 || true
