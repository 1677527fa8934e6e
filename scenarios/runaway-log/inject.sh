# The service was left at debug log level and writes megabytes a second
# to its 32 MiB log partition; with the log full, its health check fails.
mkdir -p /var/log/ingest
mountpoint -q /var/log/ingest || mount -t tmpfs -o size=32m,mode=0755 ingestlog /var/log/ingest
id ingest >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin ingest
chown ingest: /var/log/ingest
printf '# ingest settings\nLISTEN_PORT=8080\nLOG_LEVEL=debug\n' >/etc/ingest.conf
mkdir -p /opt/ingest
cat >/opt/ingest/server.py <<'PY'
#!/usr/bin/python3
# ingest: takes in events; logs to /var/log/ingest/ingest.log.
import http.server, os, threading, time

conf = {}
for line in open("/etc/ingest.conf"):
    line = line.strip()
    if line and not line.startswith("#") and "=" in line:
        k, v = line.split("=", 1)
        conf[k.strip()] = v.strip()
debug = conf.get("LOG_LEVEL", "info").lower() == "debug"
LOG = "/var/log/ingest/ingest.log"
healthy = True

def log(level, msg):
    global healthy
    try:
        with open(LOG, "a") as f:
            f.write("%s %s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), level, msg))
        healthy = True
    except OSError:
        healthy = False

def worker():
    n = 0
    while True:
        n += 1
        if debug:
            log("DEBUG", "event batch %d: " % n + "x" * 65536)
            time.sleep(0.01)
        else:
            time.sleep(1)
        if n % 5 == 0 or not debug:
            log("INFO", "heartbeat %d" % n)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        log("INFO", "GET " + self.path)
        code, body = (200, b"ok\n") if healthy else (500, b"cannot write log\n")
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

threading.Thread(target=worker, daemon=True).start()
http.server.ThreadingHTTPServer(("127.0.0.1", int(conf.get("LISTEN_PORT", "8080"))), Handler).serve_forever()
PY
install_unit ingest "event ingest" "/usr/bin/python3 /opt/ingest/server.py"
# What the last hours at debug level left behind (written at once here,
# rather than waiting for the service to write it).
yes "$(date +%FT%T) DEBUG event batch: $(head -c 3000 /dev/zero | tr '\0' x)" | head -c 31M >/var/log/ingest/ingest.log
chown ingest: /var/log/ingest/ingest.log
systemctl start ingest
log_full() { [ "$(df --output=avail -k /var/log/ingest | tail -1 | tr -d ' ')" -lt 100 ]; }
wait_for 120 log_full
sleep 2
[ "$(http_status http://127.0.0.1:8080/health)" = 500 ]
