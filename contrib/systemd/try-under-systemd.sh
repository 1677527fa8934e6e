#!/usr/bin/env bash
# Runs the installed vmgated.socket + vmgated.service (and
# vmgate-netstack.socket + vmgate-netstack@.service) under a real systemd
# (PID 1 of a private pid, mount, uts and ipc namespace) on a machine whose
# own PID 1 is not systemd (containers, the build machines), and checks
# that a member of vmgate-users gets a command run through socket
# activation, the jail and QEMU with every directive of the unit in force.
#
#   contrib/systemd/try-under-systemd.sh [COMMAND...]    (root; default: uname -a)
#
# VMGATE_TRY_POLICY=FILE runs the service on that policy instead of
# /etc/vmgate/vmgate.toml: with a network profile the command's VM gets its
# network from a vmgate-netstack@.service instance (e.g.
# VMGATE_TRY_POLICY=net.toml contrib/systemd/try-under-systemd.sh ip -4 -o addr).
#
# Needs: `make install` done (binaries, user vmgate, image, policy), no
# vmgated using /var/lib/vmgate, and an unprivileged user in vmgate-users
# (VMGATE_TRY_USER, default: the first member of vmgate-users other than
# vmgate). Nothing outside a scratch directory is written: inside the
# namespace /run is a fresh tmpfs, the unit directories, /var/lib/vmgate,
# /var/log/vmgate and /etc/vmgate are bind mounts of scratch copies (the
# image is hard-linked), and only the units this test needs exist, so
# systemd starts nothing else (no tmpfiles, no journald).
#
# What it does not show: a real boot (sysusers and tmpfiles at boot, the
# journal), cgroup delegation on a pure cgroup v2 host when this host is
# hybrid, KVM when /dev/kvm is missing.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
cd "$(dirname "$0")/../.."
cmd=("$@")
[ ${#cmd[@]} -gt 0 ] || cmd=(uname -a)
user=${VMGATE_TRY_USER:-$(getent group vmgate-users | cut -d: -f4 | tr , '\n' | grep -vx vmgate | head -1)}
[ -n "$user" ] || { echo "no user in vmgate-users: usermod -aG vmgate-users NAME, or set VMGATE_TRY_USER" >&2; exit 1; }

S=$(mktemp -d /var/tmp/vmgate-try.XXXXXX)
pid1=""
cleanup() {
    if [ -n "$pid1" ] && kill -0 "$pid1" 2>/dev/null; then
        kill -KILL "$pid1"   # PID 1 of the namespace: takes everything in it along
    fi
    wait 2>/dev/null || true
    rm -rf "$S"
}
trap cleanup EXIT

mkdir -p "$S"/{units,etc-units/vmgated.service.d,state,log,etc-vmgate}
for t in sysinit basic sockets multi-user network network-pre network-online shutdown local-fs \
    local-fs-pre timers paths slices swap final exit poweroff halt reboot umount emergency rescue; do
    cp /usr/lib/systemd/system/$t.target "$S/units/"
done
printf '[Unit]\nDescription=vmgate unit try-out\nWants=vmgated.socket\n' >"$S/units/vmgate-try.target"
cp contrib/systemd/vmgated.service contrib/systemd/vmgated.socket \
    contrib/systemd/vmgate-netstack.socket contrib/systemd/vmgate-netstack@.service "$S/etc-units/"
# The only addition to the shipped units: no journald in here.
printf '[Service]\nStandardOutput=append:%s/vmgated.log\nStandardError=append:%s/vmgated.log\n' "$S" "$S" \
    >"$S/etc-units/vmgated.service.d/log.conf"
chown vmgate:vmgate "$S/state" "$S/log"
chmod 0755 "$S/state"
chmod 0750 "$S/log"
mkdir "$S/state/image"
cp -al /var/lib/vmgate/image/. "$S/state/image/"
chown root:vmgate "$S/state/image"
cp "${VMGATE_TRY_POLICY:-/etc/vmgate/vmgate.toml}" "$S/etc-vmgate/vmgate.toml"
chown -R root:vmgate "$S/etc-vmgate"
chmod 0750 "$S/etc-vmgate"

cat >"$S/pid1.sh" <<EOF
#!/bin/bash
set -e
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /run
# What tmpfiles.d would make at boot: the netstacks' empty root.
mkdir -m 0555 /run/vmgate-netstack-root
mount --bind $S/units /usr/lib/systemd/system
mount --bind $S/etc-units /etc/systemd/system
mount --bind $S/state /var/lib/vmgate
mount --bind $S/log /var/log/vmgate
mount --bind $S/etc-vmgate /etc/vmgate
exec env -i container=vmgate-try PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    /usr/lib/systemd/systemd --system --unit=vmgate-try.target
EOF
chmod +x "$S/pid1.sh"
unshare --pid --fork --mount --uts --ipc --mount-proc "$S/pid1.sh" >"$S/pid1.log" 2>&1 </dev/null &
for _ in $(seq 1 100); do
    pid1=$(pgrep -P $! -x systemd || true)
    [ -n "$pid1" ] && break
    sleep 0.1
done
[ -n "$pid1" ] || { cat "$S/pid1.log"; echo "systemd did not start" >&2; exit 1; }
inns() { nsenter -t "$pid1" -m -p -u -i -- "$@"; }
for _ in $(seq 1 100); do
    [ "$(inns systemctl is-active vmgated.socket 2>/dev/null)" = active ] && break
    sleep 0.1
done
echo "+ systemd $(inns systemctl --version | head -1 | cut -d' ' -f2) is PID 1 of the namespace; vmgated.socket: $(inns systemctl is-active vmgated.socket)"
echo "+ socket: $(inns stat -c '%U:%G %a' /run/vmgate/vmgate.sock)"
echo "+ as $user: vm-exec ${cmd[*]}"
rc=0
inns setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups \
    /usr/local/bin/vm-exec --timeout 5m -- "${cmd[@]}" || rc=$?
echo "+ vm-exec exit code $rc; vmgated.service: $(inns systemctl is-active vmgated.service)"
echo "+ socket after the service started: $(inns stat -c '%U:%G %a' /run/vmgate/vmgate.sock)"
echo "+ guest networks started by vmgate-netstack.socket: $(inns systemctl show -p NAccepted --value vmgate-netstack.socket)"
echo "+ jail of the last VM: $(sed -n 's/.*"jail":"\(.*\)"}$/\1/p' "$S/vmgated.log" | tail -1 | sed 's/\\"/"/g')"
inns systemctl stop vmgated.service
left=0
for p in $(pgrep -x qemu-system-x86 || true) $(pgrep qemu-system || true); do
    grep -qs vmgated.service "/proc/$p/cgroup" && left=$((left + 1))
done
echo "+ vmgated.service stopped (KillMode=control-group); QEMU processes left in its cgroup: $left"
if [ "$rc" != 0 ]; then
    tail -n 20 "$S/vmgated.log" >&2
fi
exit "$rc"
