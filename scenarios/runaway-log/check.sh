expect_text "health check answers ok" http://127.0.0.1:8080/health ok
a=$(stat -c %s /var/log/ingest/ingest.log 2>/dev/null || echo 0)
sleep 5
b=$(stat -c %s /var/log/ingest/ingest.log 2>/dev/null || echo 0)
if [ $((b - a)) -lt 102400 ]; then pass "log grows slowly"; else fail "log grows slowly" "the log grew $((b - a)) bytes in 5 s"; fi
avail=$(df --output=avail -k /var/log/ingest | tail -1 | tr -d ' ')
if [ "${avail:-0}" -ge 16384 ]; then pass "log partition has room"; else fail "log partition has room" "${avail} KiB free"; fi
finish
