set -e
systemctl stop thumbnailer 2>/dev/null || pkill -f /usr/local/bin/thumbnailer
for i in $(seq 20); do pgrep -f /usr/local/bin/thumbnailer >/dev/null || break; sleep 1; done
! pgrep -f /usr/local/bin/thumbnailer
