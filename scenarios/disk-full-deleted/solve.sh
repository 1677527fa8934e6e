set -e
pids=$(lsof -t +L1 /srv/uploads 2>/dev/null | sort -u)
[ -n "$pids" ] && kill $pids
sleep 1
