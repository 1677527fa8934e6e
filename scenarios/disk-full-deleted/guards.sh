common_guards
expect_active "upload service running" uploads
size=$(df --output=size -k /srv/uploads | tail -1 | tr -d ' ')
if [ "$size" = 16384 ]; then pass "uploads file system unchanged"; else fail "uploads file system unchanged" "size is now ${size} KiB"; fi
finish
