set -e
sed -i 's/\r$//' /opt/reportgen/start.sh
chmod 755 /opt/reportgen/start.sh
systemctl reset-failed reportgen || true
systemctl restart reportgen
for i in $(seq 20); do curl -sf http://127.0.0.1:8090/health && break; sleep 1; done
