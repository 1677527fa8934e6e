common_guards
expect_active "ingest running" ingest
# The service keeps its log: the file exists and, where there is room
# to write, it is being written.
if [ ! -f /var/log/ingest/ingest.log ]; then
	fail "ingest still logs" "/var/log/ingest/ingest.log is gone"
elif [ "$(df --output=avail -k /var/log/ingest | tail -1 | tr -d ' ')" -gt 1024 ] &&
	[ $(($(date +%s) - $(stat -c %Y /var/log/ingest/ingest.log))) -ge 30 ]; then
	fail "ingest still logs" "/var/log/ingest/ingest.log not written for 30 s"
else
	pass "ingest still logs"
fi
if grep -q '^LOG_LEVEL=' /etc/ingest.conf; then pass "log level still configured"; else fail "log level still configured" "LOG_LEVEL removed from /etc/ingest.conf"; fi
size=$(df --output=size -k /var/log/ingest | tail -1 | tr -d ' ')
if [ "$size" = 32768 ]; then pass "log file system unchanged"; else fail "log file system unchanged" "size is now ${size} KiB"; fi
finish
