common_guards
expect_active "nginx running" nginx
expect "telnet still blocked" iptables -C INPUT -p tcp --dport 23 -j DROP
expect "redis still private" iptables -C INPUT -p tcp --dport 6379 -j REJECT
p=$(iptables -S INPUT | head -1)
if [ "$p" = "-P INPUT ACCEPT" ]; then pass "INPUT policy unchanged"; else fail "INPUT policy unchanged" "$p"; fi
finish
