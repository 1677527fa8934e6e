# A stray export job keeps a deleted 15 MiB file open on the 16 MiB
# uploads file system: df says full, du says empty.
mkdir -p /srv/uploads
mountpoint -q /srv/uploads || mount -t tmpfs -o size=16m,mode=0755 uploads /srv/uploads
for n in 1001 1002 1003; do head -c 20000 /dev/urandom >/srv/uploads/customer-$n.dat; done
id uploads >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin uploads
chown -R uploads: /srv/uploads
mkdir -p /opt/uploads
cat >/opt/uploads/server.py <<'PY'
#!/usr/bin/python3
# uploads: stores customer files under /srv/uploads.
import http.server, os

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code, body = 200, b"ok\n"
        if self.path == "/health":
            probe = "/srv/uploads/.health-probe"
            try:
                with open(probe, "wb") as f:
                    f.write(b"\0" * (2 << 20))
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                code, body = 507, ("cannot store files: %s\n" % e.strerror).encode()
            finally:
                try:
                    os.unlink(probe)
                except OSError:
                    pass
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", 8080), Handler).serve_forever()
PY
install_unit uploads "customer uploads" "/usr/bin/python3 /opt/uploads/server.py"
systemctl start uploads
wait_for 20 curl -sf http://127.0.0.1:8080/health
cat >/usr/local/bin/export-job <<'SH'
#!/bin/sh
# Nightly export: writes a temporary archive, then waits for the
# transfer that never comes.
exec 3>/srv/uploads/.export.tmp
head -c 15000000 /dev/zero >&3
rm -f /srv/uploads/.export.tmp
exec sleep infinity
SH
chmod 755 /usr/local/bin/export-job
systemd-run --quiet --unit=export-job --description="nightly export" /usr/local/bin/export-job
wait_for 20 test ! -e /srv/uploads/.export.tmp
sleep 1
[ "$(http_status http://127.0.0.1:8080/health)" = 507 ]
