common_guards
# The security header set in the site's configuration stays (and is sent
# whenever the site answers).
if grep -Eq '^\s*add_header X-Frame-Options SAMEORIGIN;' /etc/nginx/sites-available/default; then pass "security header kept"; else fail "security header kept" "add_header X-Frame-Options was removed"; fi
if http_up http://127.0.0.1/ && ! curl -sI --max-time 5 http://127.0.0.1/ | grep -qi '^x-frame-options: *sameorigin'; then
	fail "security header sent" "the site answers without X-Frame-Options"
fi
finish
