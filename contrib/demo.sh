#!/usr/bin/env bash
# Starts vmgated on the embedded default policy, runs `vm-exec uname -a` in
# a fresh VM through it, and stops the daemon again. Used by `make demo`.
set -euo pipefail
BIN=${BIN:-bin}
STATE_DIR=${STATE_DIR:?STATE_DIR not set}
IMAGE_DIR=${IMAGE_DIR:-$STATE_DIR/image}
sock="$STATE_DIR/demo.sock"
log="$STATE_DIR/demo-vmgated.log"
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)   # the demo may run as root; the service does not
mkdir -p "$STATE_DIR"
"$BIN/vmgated" serve --builtin-policy --socket "$sock" --state-dir "$STATE_DIR" \
    --image "$IMAGE_DIR" --audit-log "$STATE_DIR/demo-audit.jsonl" "${extra[@]}" 2>"$log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    [ -S "$sock" ] && break
    kill -0 $pid 2>/dev/null || { echo "vmgated did not start:"; cat "$log"; exit 1; }
    sleep 0.2
done
echo "+ vm-exec uname -a    (fresh VM; ~30 s under TCG)"
VMGATE_SOCKET="$sock" "$BIN/vm-exec" uname -a
