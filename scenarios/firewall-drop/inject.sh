# A firewall rule drops port 80 (before the server's intended rules,
# which block telnet and keep redis private).
site_page "Store" >"$INDEX"
iptables -A INPUT -p tcp --dport 23 -j DROP
iptables -A INPUT -p tcp --dport 6379 -j REJECT
iptables -I INPUT 1 -p tcp --dport 80 -j DROP
[ "$(http_status http://127.0.0.1/ --max-time 2)" = 000 ]
