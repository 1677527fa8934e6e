set -e
sed -i 's/^LOG_LEVEL=.*/LOG_LEVEL=info/' /etc/ingest.conf
systemctl stop ingest
: >/var/log/ingest/ingest.log
systemctl start ingest
for i in $(seq 20); do curl -sf http://127.0.0.1:8080/health && break; sleep 1; done
