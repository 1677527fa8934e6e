common_guards
expect_active "nginx running" nginx
# Web content must not be writable by the web server's user.
if su -s /bin/sh -c "test -w $INDEX" www-data; then fail "page not writable by www-data" "www-data can modify $INDEX"; else pass "page not writable by www-data"; fi
if [ -n "$(find /var/www -perm -o+w 2>/dev/null)" ]; then fail "no world-writable web files" "$(find /var/www -perm -o+w | head -3)"; else pass "no world-writable web files"; fi
finish
