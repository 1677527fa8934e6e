expect_text "health check answers ok" http://127.0.0.1:8080/health ok
avail=$(df --output=avail -k /srv/uploads | tail -1 | tr -d ' ')
if [ "${avail:-0}" -ge 8192 ]; then pass "space available"; else fail "space available" "only ${avail} KiB free in /srv/uploads"; fi
finish
