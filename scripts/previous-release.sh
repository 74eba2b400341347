#!/usr/bin/env bash
# Builds the `kvpool` binary of the previous release once and prints its
# path; later runs print the cached one. Its `kvpool-chaos` is left beside
# it. The mixed-version chaos campaign (`kvpool-chaos run --scenario
# upgrade --previous PATH --previous-clients DIR/kvpool-chaos`,
# docs/chaos.md) runs masters, stores and clients of that release beside
# this build's, upgrading and downgrading masters and stores one at a time.
#
# The release is the tag in KVPOOL_PREVIOUS (default v0.1.0); a clone
# without tags falls back to the tag's commit, pinned below. The build
# takes a few minutes on 2 cores (its own target dir, no debug info) and
# leaves only the binaries, in ~/.cache/kvpool/previous/<commit>/
# (KVPOOL_CACHE_DIR instead of ~/.cache/kvpool). Exits 3 when the clone
# lacks that release's history.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TAG="${KVPOOL_PREVIOUS:-v0.1.0}"
# v0.1.0, the last release that speaks only protocol 5.
PINNED=a21409fa922517127dcd5fbc58faf76790b16e94
commit="$(git -C "$ROOT" rev-parse --verify -q "$TAG^{commit}" 2>/dev/null \
  || git -C "$ROOT" rev-parse --verify -q "$PINNED^{commit}" 2>/dev/null || true)"
if [ -z "$commit" ]; then
  echo "previous-release: neither $TAG nor commit $PINNED is in this clone (a shallow clone?): fetch the history (git fetch --unshallow --tags)" >&2
  exit 3
fi
CACHE="${KVPOOL_CACHE_DIR:-$HOME/.cache/kvpool}/previous/$commit"
BIN="$CACHE/kvpool"
CHAOS="$CACHE/kvpool-chaos"
if [ ! -x "$BIN" ] || [ ! -x "$CHAOS" ]; then
  echo "previous-release: building $TAG ($commit) into $CACHE" >&2
  rm -rf "$CACHE/src" "$CACHE/target"
  mkdir -p "$CACHE/src"
  git -C "$ROOT" archive "$commit" | tar -x -C "$CACHE/src"
  (cd "$CACHE/src" && CARGO_TARGET_DIR="$CACHE/target" CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_INCREMENTAL=0 cargo build --release --locked -p kvpool --bin kvpool -p kvpool-chaos --bin kvpool-chaos >&2)
  cp "$CACHE/target/release/kvpool-chaos" "$CHAOS.tmp" && mv "$CHAOS.tmp" "$CHAOS"
  cp "$CACHE/target/release/kvpool" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
  rm -rf "$CACHE/src" "$CACHE/target"
fi
echo "$BIN"
