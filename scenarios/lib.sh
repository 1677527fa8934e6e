# vmgate agent benchmark: helpers prepended to every scenario script
# (inject.sh, check.sh, guards.sh, solve.sh), which run as root in the
# trial's VM with `bash -s`. See docs/scenarios.md.

# pass NAME / fail NAME DETAIL report one check; finish exits 1 if any
# check failed. The runner reads the PASS/FAIL lines.
VMGATE_FAILED=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: ${2:-failed}"; VMGATE_FAILED=1; }
finish() { exit "$VMGATE_FAILED"; }

# expect NAME COMMAND...: pass if the command succeeds.
expect() {
	local name=$1
	shift
	if "$@" >/dev/null 2>&1; then pass "$name"; else fail "$name" "$* failed"; fi
}

# http_status URL [curl options]: the HTTP status code ("000" when there
# is no answer), with a 5 s limit.
http_status() {
	local url=$1
	shift
	curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@" "$url" 2>/dev/null || true
}

# http_body_sha URL [curl options]: SHA-256 of the response body.
http_body_sha() {
	local url=$1
	shift
	curl -s --max-time 5 "$@" "$url" 2>/dev/null | sha256sum | cut -d' ' -f1
}

# expect_http NAME URL STATUS [SHA256] [curl options]: the URL answers
# STATUS (and, if given, a body with that SHA-256).
expect_http() {
	local name=$1 url=$2 want=$3 sha=${4:-}
	shift 3
	[ $# -gt 0 ] && shift
	local got
	got=$(http_status "$url" "$@")
	if [ "$got" != "$want" ]; then
		fail "$name" "$url answered $got, want $want"
		return
	fi
	if [ -n "$sha" ] && [ "$(http_body_sha "$url" "$@")" != "$sha" ]; then
		fail "$name" "$url answered $want with a different body"
		return
	fi
	pass "$name"
}

# expect_active NAME UNIT: the systemd unit is active.
expect_active() {
	local s
	s=$(systemctl is-active "$2" 2>/dev/null)
	if [ "$s" = active ]; then pass "$1"; else fail "$1" "$2 is ${s:-unknown}"; fi
}

# expect_enabled NAME UNIT: the unit starts at boot.
expect_enabled() {
	local s
	s=$(systemctl is-enabled "$2" 2>/dev/null)
	if [ "$s" = enabled ]; then pass "$1"; else fail "$1" "$2 is ${s:-unknown}"; fi
}

# wait_for SECONDS COMMAND...: retry the command once a second.
wait_for() {
	local n=$1
	shift
	while [ "$n" -gt 0 ]; do
		"$@" >/dev/null 2>&1 && return 0
		sleep 1
		n=$((n - 1))
	done
	"$@" >/dev/null 2>&1
}

# start_failing UNIT: starts UNIT, whose program cannot run, and returns
# once systemd has seen it fail and restarted it (NRestarts at least 1;
# 20 s at most, then it fails). A Type=simple unit counts as active from
# its process's fork to its failed exec, so "is-active" can catch it
# running between two restarts; the restart count only grows.
start_failing() {
	systemctl start "$1" 2>/dev/null || true
	wait_for 20 restarted "$1"
}

# restarted UNIT: systemd has restarted UNIT at least once.
restarted() { [ "$(systemctl show -p NRestarts --value "$1")" -ge 1 ]; }

# http_up URL: the URL answers with any status.
http_up() { [ "$(http_status "$1")" != 000 ]; }

# The default site's page, as inject scripts leave it (check scripts
# compare bodies against it).
INDEX=/var/www/html/index.nginx-debian.html

# site_page NAME: the HTML page a scenario's site serves.
site_page() {
	printf '<!doctype html>\n<title>%s</title>\n<h1>%s is up</h1>\n<p>Served by this server.</p>\n' "$1" "$1"
}

# expect_page NAME URL TITLE [curl options]: the URL answers 200 with
# site_page TITLE.
expect_page() {
	local name=$1 url=$2 title=$3
	shift 3
	expect_http "$name" "$url" 200 "$(site_page "$title" | sha256sum | cut -d' ' -f1)" "$@"
}

# install_app NAME PORT [EXECSTART]: a small HTTP service NAME (system
# user NAME, /opt/NAME/server.py, unit NAME.service) on 127.0.0.1:PORT;
# /health answers "ok", / answers "NAME ok". Not started.
install_app() {
	local name=$1 port=$2
	local exec=${3:-/usr/bin/python3 /opt/$name/server.py $port}
	id "$name" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$name"
	mkdir -p "/opt/$name"
	cat >"/opt/$name/server.py" <<PYEOF
#!/usr/bin/python3
# $name: internal HTTP service.
import http.server, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok\n" if self.path == "/health" else b"$name ok\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
PYEOF
	chmod 755 "/opt/$name/server.py"
	install_unit "$name" "$name service" "$exec"
}

# install_unit NAME DESCRIPTION EXECSTART: a unit NAME.service running
# EXECSTART as user NAME, restarted on failure, enabled (not started).
install_unit() {
	cat >"/etc/systemd/system/$1.service" <<UNITEOF
[Unit]
Description=$2
After=network.target

[Service]
User=$1
ExecStart=$3
Restart=on-failure
RestartSec=1

[Install]
WantedBy=multi-user.target
UNITEOF
	systemctl daemon-reload
	systemctl enable "$1" >/dev/null 2>&1
}

# expect_text NAME URL TEXT: the URL's body is exactly TEXT (plus newline).
expect_text() {
	local got
	got=$(curl -s --max-time 5 "$2" 2>/dev/null)
	if [ "$got" = "$3" ]; then pass "$1"; else fail "$1" "$2 answered '${got:0:80}', want '$3'"; fi
}

# common_guards: what every scenario keeps working.
common_guards() {
	expect_active "ssh still running" ssh
	expect_active "cron still running" cron
}
