expect_text "proxy answers with the api" http://127.0.0.1/ "api ok"
expect_active "nginx running" nginx
if getent hosts api.internal | grep -q '^127\.0\.0\.1 '; then pass "api.internal resolves"; else fail "api.internal resolves" "getent hosts api.internal: $(getent hosts api.internal)"; fi
if getent hosts localhost >/dev/null; then pass "localhost resolves"; else fail "localhost resolves" "getent hosts localhost fails"; fi
finish
