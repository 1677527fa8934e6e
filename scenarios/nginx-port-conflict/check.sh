expect_page "home page served" http://127.0.0.1/ "Shop"
if curl -sI --max-time 5 http://127.0.0.1/ | grep -qi '^server: nginx'; then pass "served by nginx"; else fail "served by nginx" "the answer does not come from nginx"; fi
expect_active "nginx running" nginx
finish
