#!/usr/bin/env bash
# Runs `vm-exec uname -a` in a fresh VM. Used by `make demo`.
#
# Where systemd is PID 1 and we are root, the demo installs vmgate as a
# service (contrib/install.sh: user vmgate, units, socket activation) and
# runs the command through /run/vmgate/vmgate.sock; the daemon keeps
# running afterwards. Elsewhere (containers, build machines, non-root) it
# starts vmgated on the embedded default policy, runs the command through
# it, and stops the daemon again; or, when a vmgated installed by
# contrib/install.sh already answers on /run/vmgate/vmgate.sock, uses that.
set -euo pipefail
BIN=${BIN:-bin}
STATE_DIR=${STATE_DIR:?STATE_DIR not set}
IMAGE_DIR=${IMAGE_DIR:-$STATE_DIR/image}
system_sock=/run/vmgate/vmgate.sock

if [ -d /run/systemd/system ] && [ "$(id -u)" = 0 ]; then
    echo "+ contrib/install.sh    (systemd is PID 1: vmgated as a service)"
    BIN="$BIN" ./contrib/install.sh
    echo "+ vm-exec uname -a    (fresh VM restored from the template made by install.sh)"
    exec /usr/local/bin/vm-exec --socket "$system_sock" uname -a
fi
if [ -S "$system_sock" ] && "$BIN/vm-exec" --socket "$system_sock" --list-sessions >/dev/null 2>&1; then
    echo "+ vm-exec uname -a    (through the vmgated already running on $system_sock)"
    exec "$BIN/vm-exec" --socket "$system_sock" uname -a
fi

# Once contrib/install.sh has run, the service user owns the state
# directory's VMs and templates (0700): the temporary daemon keeps its own.
state="$STATE_DIR"
if [ -e "$STATE_DIR/vms" ] && [ "$(stat -c %u "$STATE_DIR/vms")" != "$(id -u)" ]; then
    state="$STATE_DIR/demo"
fi
sock="$STATE_DIR/demo.sock"
log="$STATE_DIR/demo-vmgated.log"
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)   # the demo may run as root; the service does not
mkdir -p "$state"
# The default shape's VM template, once (~20 s under TCG; a check when it
# exists): the daemon then restores the first command's VM from it.
echo "+ vmgated image warm    (the VM template the daemon restores from)"
"$BIN/vmgated" image warm --builtin-policy --state-dir "$state" --image "$IMAGE_DIR" --log-level warn
"$BIN/vmgated" serve --builtin-policy --socket "$sock" --state-dir "$state" \
    --image "$IMAGE_DIR" --audit-log "$STATE_DIR/demo-audit.jsonl" "${extra[@]}" 2>"$log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    [ -S "$sock" ] && break
    kill -0 $pid 2>/dev/null || { echo "vmgated did not start:"; cat "$log"; exit 1; }
    sleep 0.2
done
echo "+ vm-exec uname -a    (fresh VM restored from the template)"
VMGATE_SOCKET="$sock" "$BIN/vm-exec" uname -a
