# A runaway "thumbnailer" spins on the only CPU.
site_page "Gallery" >"$INDEX"
cat >/usr/local/bin/thumbnailer <<'SH'
#!/bin/sh
# Thumbnail generator (stuck in a retry loop).
while :; do :; done
SH
chmod 755 /usr/local/bin/thumbnailer
systemd-run --quiet --unit=thumbnailer --description="thumbnail generator" /usr/local/bin/thumbnailer
sleep 2
systemctl is-active --quiet thumbnailer
