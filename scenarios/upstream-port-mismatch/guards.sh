common_guards
expect_active "api running" api
expect_active "nginx running" nginx
if grep -q proxy_pass /etc/nginx/sites-available/default; then pass "still a reverse proxy"; else fail "still a reverse proxy" "the site no longer proxies"; fi
finish
