#!/usr/bin/env bash
# Installs vmgate system-wide and starts it (docs/operator.md, "Install").
#
#   contrib/install.sh [--no-start]        (as root; `make install` runs it)
#
# - binaries: /usr/local/bin/vmgated, /usr/local/bin/vm-exec, and the guest
#   agent /usr/local/lib/vmgate/vmgate-agent (where `vmgated image build`
#   looks for it);
# - user vmgate and group vmgate-users (systemd-sysusers, else useradd);
# - systemd units, sysusers.d, tmpfiles.d, the AppArmor profile where the
#   kernel restricts unprivileged user namespaces;
# - the policy /etc/vmgate/vmgate.toml, only if there is none (an existing
#   policy is never touched);
# - the guest image in /var/lib/vmgate/image (root:vmgate, read-only for the
#   daemon), built only when missing or out of date;
# - then, where systemd is PID 1: enables and starts vmgated.socket and
#   vmgated.service (restarting the service when a binary, unit or the image
#   changed). Elsewhere (containers, build machines) it says so and starts
#   vmgated in the background as user vmgate, with the same flags plus its own
#   socket; stop it with: kill $(cat /run/vmgate/vmgated.pid)
#
# Running it again changes nothing and says "up to date". BIN (default bin)
# is where `make build` put the binaries.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
start=1
for a in "$@"; do
    case $a in
    --no-start) start=0 ;;
    *) echo "usage: $0 [--no-start]" >&2; exit 2 ;;
    esac
done

PREFIX=/usr/local
STATE=/var/lib/vmgate
IMAGE=$STATE/image
LOGDIR=/var/log/vmgate
RUNDIR=/run/vmgate
SOCK=$RUNDIR/vmgate.sock
PIDFILE=$RUNDIR/vmgated.pid
CONFIG=/etc/vmgate/vmgate.toml

changed=0        # anything at all
restart=0        # something the running daemon must be restarted for
units_changed=0

note() { printf '%-12s %s\n' "$1" "$2"; }
die() { echo "install: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (sudo make install)"
for f in vmgated vm-exec vmgate-agent; do
    [ -x "$BIN/$f" ] || die "$BIN/$f missing: run make build first"
done

# put SRC DST MODE [OWNER [GROUP]]: installs SRC as DST unless DST already
# has the same content, mode and owner.
put() {
    local src=$1 dst=$2 mode=$3 owner=${4:-root} group=${5:-root}
    local want
    want="$(printf '%o' "$((8#$mode))") $owner $group"
    if [ -f "$dst" ] && cmp -s "$src" "$dst" && [ "$(stat -c '%a %U %G' "$dst")" = "$want" ]; then
        note "up to date" "$dst"
        return 1
    fi
    install -D -m "$mode" -o "$owner" -g "$group" "$src" "$dst"
    note "installed" "$dst"
    changed=1
    return 0
}

echo "== binaries"
put "$BIN/vmgated" $PREFIX/bin/vmgated 0755 && restart=1
put "$BIN/vm-exec" $PREFIX/bin/vm-exec 0755 || true
put "$BIN/vmgate-agent" $PREFIX/lib/vmgate/vmgate-agent 0755 || true
put docs/operator.md $PREFIX/share/doc/vmgate/operator.md 0644 || true

echo "== user vmgate, group vmgate-users"
put contrib/sysusers.d/vmgate.conf /etc/sysusers.d/vmgate.conf 0644 || true
users_state() { getent passwd vmgate || true; getent group vmgate-users || true; id -nG vmgate 2>/dev/null || true; }
before=$(users_state)
if command -v systemd-sysusers >/dev/null; then
    systemd-sysusers /etc/sysusers.d/vmgate.conf
else
    # The same as the sysusers.d file, with the shadow tools.
    getent group vmgate >/dev/null || groupadd --system vmgate
    getent group vmgate-users >/dev/null || groupadd --system vmgate-users
    getent group kvm >/dev/null || groupadd --system kvm
    getent passwd vmgate >/dev/null ||
        useradd --system --gid vmgate --home-dir / --no-create-home --shell /usr/sbin/nologin \
            --comment "vmgate exec gateway" vmgate
    for g in kvm vmgate-users; do
        id -nG vmgate | tr ' ' '\n' | grep -qx "$g" || usermod -aG "$g" vmgate
    done
fi
if [ "$(users_state)" = "$before" ]; then
    note "up to date" "user vmgate ($(id vmgate))"
else
    note "created" "user vmgate ($(id vmgate))"
    changed=1
    restart=1
fi

echo "== directories"
put contrib/tmpfiles.d/vmgate.conf /etc/tmpfiles.d/vmgate.conf 0644 || true
put contrib/logrotate.d/vmgate /etc/logrotate.d/vmgate 0644 || true
dirs_state() { stat -c '%n %a %U %G' /etc/vmgate $STATE $LOGDIR $RUNDIR 2>/dev/null || true; }
before=$(dirs_state)
if command -v systemd-tmpfiles >/dev/null; then
    systemd-tmpfiles --create /etc/tmpfiles.d/vmgate.conf
else
    install -d -m 0755 -o vmgate -g vmgate $STATE
    install -d -m 0750 -o vmgate -g vmgate $LOGDIR
    install -d -m 0755 -o vmgate -g vmgate $RUNDIR
    install -d -m 0750 -o root -g vmgate /etc/vmgate
fi
# Files a daemon run as root left behind (make demo, vmgated serve
# --allow-root) would lock vmgated out of its own state: hand them over.
# The image and the image build's lock stay root's.
for f in $STATE/vmgated.lock $STATE/vms $STATE/templates; do
    if [ -e "$f" ] && [ -n "$(find "$f" \( ! -user vmgate -o ! -group vmgate \) -print -quit)" ]; then
        chown -R vmgate:vmgate "$f"
        note "chowned" "$f (to vmgate, it was left by a daemon run as root)"
    fi
done
after=$(dirs_state)
if [ "$after" = "$before" ]; then
    note "up to date" "/etc/vmgate $STATE $LOGDIR $RUNDIR"
else
    note "created" "/etc/vmgate $STATE $LOGDIR $RUNDIR"
    changed=1
fi

echo "== policy"
if [ -e $CONFIG ]; then
    note "kept" "$CONFIG (the operator's policy is never overwritten)"
else
    put policy/default.toml $CONFIG 0640 root vmgate || true
    echo "             the embedded default policy: any caller that can open the socket runs"
    echo "             any command; edit it (contrib/policy/example.toml), then systemctl reload vmgated"
fi

echo "== systemd units"
for u in vmgated.service vmgated.socket vmgate-netstack.socket vmgate-netstack@.service; do
    put contrib/systemd/$u /etc/systemd/system/$u 0644 && units_changed=1 && restart=1
done

echo "== AppArmor"
if [ -e /proc/sys/kernel/apparmor_restrict_unprivileged_userns ]; then
    # Ubuntu 23.10+: user namespaces need a profile with "userns".
    if put contrib/apparmor/vmgated /etc/apparmor.d/vmgated 0644 ||
        ! grep -qs '^vmgated ' /sys/kernel/security/apparmor/profiles; then
        apparmor_parser -r /etc/apparmor.d/vmgated
        note "loaded" "AppArmor profile vmgated"
        changed=1
        restart=1
    fi
else
    note "not needed" "this kernel does not restrict user namespaces with AppArmor"
fi

echo "== guest image"
# Built as root (mmdebstrap's root mode); a no-op when up to date.
manifest_before=$(cat $IMAGE/manifest.json 2>/dev/null || true)
$PREFIX/bin/vmgated image build --out $IMAGE
if [ "$(cat $IMAGE/manifest.json)" != "$manifest_before" ]; then
    changed=1
    restart=1
fi
# Writable by root only (vmgated never changes the image, and a compromised
# daemon cannot either); readable by all like the Debian packages it is made
# of (it holds no secret).
perms() { find $IMAGE -printf '%p %u %g %m\n' | sort; }
before=$(perms)
chown -R root:vmgate $IMAGE
find $IMAGE -type d -exec chmod 0755 {} +
find $IMAGE -type f -exec chmod 0644 {} +
if [ "$(perms)" = "$before" ]; then
    note "up to date" "$IMAGE (root:vmgate, 0644)"
else
    note "fixed" "$IMAGE (root:vmgate, 0644)"
    changed=1
fi

echo "== VM templates"
# A booted, saved VM of each shape the policy uses, made once here (a boot
# of ~20 s under TCG per shape; a check when up to date), so that the
# daemon's first commands restore from it instead of booting cold. Made as
# user vmgate: the daemon reads it, and never trusts one it could not have
# made itself.
if ! setpriv --reuid=vmgate --regid=vmgate --init-groups --inh-caps=-all --bounding-set=-all --no-new-privs -- \
    $PREFIX/bin/vmgated image warm --config $CONFIG --state-dir $STATE --image $IMAGE --log-level warn |
    while read -r line; do note "template" "$line"; done; then
    note "WARNING" "no VM template made (above); the daemon builds it in the background, and boots cold until then"
fi

echo "== service"
# wait_socket [PID]: waits until vmgated answers on the socket (and, given a
# pid, while that process lives).
wait_socket() {
    for _ in $(seq 1 300); do
        if [ -n "${1:-}" ] && ! kill -0 "$1" 2>/dev/null; then
            return 1
        fi
        [ -S $SOCK ] && $PREFIX/bin/vm-exec --socket $SOCK --list-sessions >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}
if [ "$start" = 0 ]; then
    note "not started" "(--no-start)"
elif [ -d /run/systemd/system ]; then
    # systemd is PID 1 (sd_booted(3)).
    if [ "$units_changed" = 1 ]; then
        systemctl daemon-reload
    fi
    for u in vmgated.socket vmgate-netstack.socket vmgated.service; do
        if ! systemctl is-enabled -q $u; then
            systemctl enable -q $u
            note "enabled" "$u"
            changed=1
        fi
    done
    for u in vmgated.socket vmgate-netstack.socket; do
        if ! systemctl is-active -q $u; then
            systemctl start $u
            note "started" $u
            changed=1
        fi
    done
    if systemctl is-active -q vmgated.service; then
        if [ "$restart" = 1 ]; then
            systemctl restart vmgated.service
            note "restarted" "vmgated.service (new binary, unit, user or image)"
        else
            note "up to date" "vmgated.service running"
        fi
    else
        systemctl start vmgated.service
        note "started" vmgated.service
        changed=1
    fi
    wait_socket || die "vmgated does not answer on $SOCK: journalctl -u vmgated"
    echo "vmgated runs under systemd; socket $SOCK (group vmgate-users); logs: journalctl -u vmgated"
else
    echo "systemd is not PID 1 here (PID 1 is $(cat /proc/1/comm)): the units are installed but"
    echo "not used. vmgated runs in the background as user vmgate instead; it does not start"
    echo "again at boot. Logs: $LOGDIR/vmgated.log; stop: kill \$(cat $PIDFILE)"
    # The daemon: user vmgate running "$PREFIX/bin/vmgated serve", or the
    # file a new install replaced ("… (deleted)": then it must restart).
    pid="" running=0
    for p in /proc/[0-9]*; do
        exe=$(readlink "$p/exe" 2>/dev/null) || continue
        [ "${exe% (deleted)}" = $PREFIX/bin/vmgated ] && [ "$(stat -c %U "$p")" = vmgate ] || continue
        [ "$(tr '\0' '\n' <"$p/cmdline" 2>/dev/null | sed -n 2p)" = serve ] || continue
        pid=${p#/proc/} running=1
        [ "$exe" = $PREFIX/bin/vmgated ] || restart=1
        break
    done
    if [ "$running" = 0 ] && [ -S $SOCK ] && $PREFIX/bin/vm-exec --socket $SOCK --list-sessions >/dev/null 2>&1; then
        die "another vmgated, not started by this script, answers on $SOCK: stop it first"
    fi
    if [ "$running" = 1 ] && [ "$restart" = 1 ]; then
        kill -TERM "$pid"
        for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        running=0
        note "stopped" "vmgated (pid $pid): it is restarted with the new files"
    fi
    if [ "$running" = 1 ]; then
        echo "$pid" >$PIDFILE
        note "up to date" "vmgated running (pid $pid)"
    else
        # What the unit gives the service, as far as a shell can: user
        # vmgate with its groups, no capabilities, no_new_privs, umask 077.
        (
            umask 077
            exec setsid setpriv --reuid=vmgate --regid=vmgate --init-groups \
                --inh-caps=-all --bounding-set=-all --no-new-privs -- \
                $PREFIX/bin/vmgated serve --config $CONFIG --socket $SOCK --socket-group vmgate-users \
                --state-dir $STATE --image $IMAGE --audit-log $LOGDIR/audit.jsonl \
                </dev/null >>$LOGDIR/vmgated.log 2>&1
        ) &
        pid=$!
        echo "$pid" >$PIDFILE
        if ! wait_socket "$pid"; then
            tail -n 20 $LOGDIR/vmgated.log >&2
            die "vmgated (pid $pid) exited or does not answer on $SOCK"
        fi
        note "started" "vmgated (pid $pid), socket $SOCK"
        changed=1
    fi
fi

if [ "$changed" = 0 ]; then
    echo "vmgate install: everything up to date, nothing changed"
else
    echo "vmgate install: done"
fi
