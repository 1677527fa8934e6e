#!/usr/bin/env bash
# The exec-path benchmark of this tree beside a pinned baseline build, on
# this host, in turns: baseline, this tree, baseline, this tree, …
# (ROUNDS of each), then `vmgated bench compare` of the two sides' medians.
# A figure more than THRESHOLD percent worse than the baseline is marked
# WORSE, and the script exits 1 (docs/benchmarks.md, "Against a pinned
# baseline").
#
#   contrib/bench-baseline.sh [BENCH EXEC FLAGS…]      e.g. --runs 10 --cold-runs 1
#
# BASELINE  the baseline commit (default: the pinned one below)
# ROUNDS    runs of each side (default 2)
# THRESHOLD percent (default 15)
# STATE_DIR where the baseline's build and image are kept
#           (default /var/lib/vmgate as root; STATE_DIR/baseline/COMMIT)
# OUT       where the reports go (default: a new temporary directory)
#
# The baseline is built once from `git archive` of its commit, with its own
# image (an image's inputs change between builds); this tree is built with
# `make build` and runs on STATE_DIR/image (`make image`). Every run makes
# its own template (OUT/templates-SIDE-ROUND): the timing of a restored
# clone's first steps depends on the moment its template was saved, and
# one template reused by every run of a side measured 135-165 ms for
# restore_ahead's agent step where another of the same build measured
# 89-100 (docs/benchmarks.md, 2026-12-06).
set -euo pipefail

# The pinned baseline: move it forward when a change of figures is meant
# (a new lever, a new default), with the reason in docs/benchmarks.md.
PINNED=8f11fc82f66b0b1a0a1a0a465b2ef29896ee6995

repo=$(cd "$(dirname "$0")/.." && pwd)
BASELINE=$(git -C "$repo" rev-parse "${BASELINE:-$PINNED}^{commit}")
ROUNDS=${ROUNDS:-2}
THRESHOLD=${THRESHOLD:-15}
if [ "$(id -u)" = 0 ]; then STATE_DIR=${STATE_DIR:-/var/lib/vmgate}; else STATE_DIR=${STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/vmgate}; fi
OUT=${OUT:-$(mktemp -d)}
export PATH="/usr/local/go/bin:$PATH"

base=$STATE_DIR/baseline/$BASELINE
if [ ! -x "$base/bin/vmgated" ] || [ ! -f "$base/image/manifest.json" ]; then
	echo "building the baseline $BASELINE in $base" >&2
	rm -rf "$base/src"
	mkdir -p "$base/src"
	git -C "$repo" archive "$BASELINE" | tar -x -C "$base/src"
	make -C "$base/src" build BIN="$base/bin"
	"$base/bin/vmgated" image build --out "$base/image"
fi
make -C "$repo" image STATE_DIR="$STATE_DIR" >&2

mkdir -p "$OUT"
side() { # side NAME BIN IMAGE ROUND [FLAGS…]
	local name=$1 bin=$2 image=$3 round=$4
	local templates=$OUT/templates-$name-$round
	shift 4
	echo "round $round: $name" >&2
	"$bin" bench exec --json --state-dir "$STATE_DIR" --image "$image" --template-dir "$templates" "$@" >"$OUT/$name-$round.json"
	rm -rf "$templates"
}
for round in $(seq 1 "$ROUNDS"); do
	side base "$base/bin/vmgated" "$base/image" "$round" "$@"
	side new "$repo/bin/vmgated" "$STATE_DIR/image" "$round" "$@"
done
echo "reports in $OUT (baseline $BASELINE)" >&2
bases=$(ls "$OUT"/base-*.json | paste -sd, -)
exec "$repo/bin/vmgated" bench compare --fail --threshold "$THRESHOLD" --base "$bases" "$OUT"/new-*.json
