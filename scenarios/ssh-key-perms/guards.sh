common_guards
if sshd -T 2>/dev/null | grep -qx 'strictmodes yes'; then pass "StrictModes still on"; else fail "StrictModes still on" "sshd no longer checks modes"; fi
if id deploy >/dev/null 2>&1; then pass "deploy user kept"; else fail "deploy user kept" "the user is gone"; fi
finish
