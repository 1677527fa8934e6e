# A forgotten "status page" process holds port 80, so nginx cannot bind it.
site_page "Shop" >"$INDEX"
cat >/usr/local/bin/statusd <<'PY'
#!/usr/bin/python3
# Legacy status page, superseded by nginx.
import http.server, os
os.chdir("/usr/share/doc")
http.server.ThreadingHTTPServer(("0.0.0.0", 80), http.server.SimpleHTTPRequestHandler).serve_forever()
PY
chmod 755 /usr/local/bin/statusd
systemctl stop nginx
systemd-run --quiet --unit=statusd --description="status page" /usr/local/bin/statusd
wait_for 20 http_up http://127.0.0.1/
systemctl restart nginx 2>/dev/null && { echo "nginx started although port 80 is taken"; exit 1; }
! systemctl is-active --quiet nginx
