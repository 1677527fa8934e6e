set -e
sed -i 's#^ExecStart=/usr/bin/python #ExecStart=/usr/bin/python3 #' /etc/systemd/system/inventory.service
systemctl daemon-reload
systemctl reset-failed inventory || true
systemctl restart inventory
for i in $(seq 20); do curl -sf http://127.0.0.1:8080/health && break; sleep 1; done
