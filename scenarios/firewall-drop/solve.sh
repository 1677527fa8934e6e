set -e
iptables -D INPUT -p tcp --dport 80 -j DROP
