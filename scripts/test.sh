#!/usr/bin/env bash
# The whole test suite: format check, lints, unit and integration tests
# (integration tests start the real kvpool binaries on 127.0.0.1), and the
# Python package, built as the manylinux wheel users install and tested
# installed (scripts/test-wheel.sh, which runs scripts/test-python.sh).
# Installs nothing it does not need; safe to run on a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (https://rustup.rs) first" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

# Each `== stage` line starts a stage; at exit, failed or not, a table of how
# long each one took (the whole wheel and Python run is one stage).
stage_name=""; stage_start=$SECONDS; stage_rows=()
stage() {
  stage_done ""
  echo "== $*"
  stage_name="$*"; stage_start=$SECONDS
}
stage_done() {
  [ -n "$stage_name" ] || return 0
  stage_rows+=("$(printf '%6ss  %s%s' $((SECONDS - stage_start)) "$stage_name" "$1")")
  stage_name=""
}
timing_summary() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then stage_done "  (FAILED, exit $rc)"; else stage_done ""; fi
  if [ ${#stage_rows[@]} -gt 0 ]; then
    echo "== timing per stage"
    printf '%s\n' "${stage_rows[@]}"
    printf '%6ss  total\n' "$SECONDS"
  fi
  exit "$rc"
}
trap timing_summary EXIT

# The HA tests start a real etcd (Debian's etcd-server); the chaos campaign
# builds its hosts with iproute2 (ip, tc); the status page test opens the
# page in headless Chromium; the alert tests run promtool and a real
# Prometheus (Debian's prometheus); SGLang's radix cache hashes pages with
# a C++ extension it compiles on first use (g++, OpenSSL's headers).
need=()
command -v g++ >/dev/null || need+=(g++)
[ -f /usr/include/openssl/sha.h ] || need+=(libssl-dev)
command -v etcd >/dev/null || need+=(etcd-server)
{ command -v promtool >/dev/null && command -v prometheus >/dev/null; } || need+=(prometheus)
{ command -v ip >/dev/null && command -v tc >/dev/null; } || need+=(iproute2)
command -v chromium >/dev/null || [ -n "${KVPOOL_CHROMIUM:-}" ] || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  stage "installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  # The package starts Prometheus on :9090 (and its node exporter on :9100)
  # under systemd or sysvinit; the tests start their own on free ports, so
  # the daemons the install just started are stopped (and under systemd
  # left disabled).
  if [[ " ${need[*]} " == *" prometheus "* ]]; then
    for svc in prometheus prometheus-node-exporter; do
      if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
      elif [ -x "/etc/init.d/$svc" ]; then
        $SUDO "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
      fi
    done
  fi
fi

# A clean run gains nothing from incremental state, and it costs gigabytes.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
# The short chaos campaign's rolling upgrades switch masters and stores
# between this build and the previous release (built once, then cached).
# A clone without the release's history (shallow) runs them within this
# build, and says so here and in the timing table; any other failure stops.
stage "previous release"
prev_rc=0
KVPOOL_PREVIOUS_BIN="$(scripts/previous-release.sh)" || prev_rc=$?
case "$prev_rc" in
  0) export KVPOOL_PREVIOUS_BIN ;;
  3)
    unset KVPOOL_PREVIOUS_BIN
    echo "test.sh: WARNING: no previous release in this clone; the chaos upgrade campaign runs this build alone" >&2
    stage_done "  (NOT RUN: no release history in this clone; upgrades within this build only)"
    ;;
  *) exit "$prev_rc" ;;
esac
stage "cargo test"
cargo test --workspace
# The binding is behind the `python` feature, which the workspace-wide lint
# run does not enable (needs only an interpreter, no linking).
stage "cargo clippy -p kvpool-python --features python"
PYO3_PYTHON="$(command -v python3.11 || command -v python3)" \
  cargo clippy -p kvpool-python --features python --all-targets -- -D warnings
# The Python package as users install it: the manylinux wheel (bundling the
# kvpool and rbg commands), installed with no Rust on PATH, and the Python
# tests (SGLang's storage layer, LMCache's adapter check, the real Mooncake
# side by side) against it.
stage "wheel and python tests"
./scripts/test-wheel.sh
