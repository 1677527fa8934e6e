set -e
pkill -f /usr/local/bin/thumbnailer
sleep 1
