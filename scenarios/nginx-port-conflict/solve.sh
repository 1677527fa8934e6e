set -e
fuser -k -n tcp 80 || true
sleep 1
systemctl restart nginx
