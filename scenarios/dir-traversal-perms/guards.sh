common_guards
expect_active "nginx running" nginx
if su -s /bin/sh -c "cat /srv/docs/private/notes.txt" www-data >/dev/null 2>&1; then fail "private notes stay private" "www-data can read /srv/docs/private/notes.txt"; else pass "private notes stay private"; fi
if [ -n "$(find /srv/docs -perm -o+w 2>/dev/null)" ]; then fail "nothing world-writable under /srv/docs" "$(find /srv/docs -perm -o+w | head -3)"; else pass "nothing world-writable under /srv/docs"; fi
expect_http "default site still served" http://127.0.0.1/ 200
finish
