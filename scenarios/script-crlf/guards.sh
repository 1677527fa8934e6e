common_guards
if systemctl show -p ExecStart --value reportgen | grep -q '/opt/reportgen/start.sh'; then pass "still started by start.sh"; else fail "still started by start.sh" "ExecStart changed"; fi
want=$(printf '#!/bin/bash\n# Start the report generator.\ncd /opt/reportgen || exit 1\nexec /usr/bin/python3 /opt/reportgen/server.py 8090\n')
if [ "$(tr -d '\r' </opt/reportgen/start.sh)" = "$want" ]; then pass "start script's commands unchanged"; else fail "start script's commands unchanged" "start.sh was rewritten"; fi
u=$(systemctl show -p User --value reportgen)
if [ "$u" = reportgen ]; then pass "unit runs as user reportgen"; else fail "unit runs as user reportgen" "User=${u:-root}"; fi
pid=$(systemctl show -p MainPID --value reportgen)
if [ "${pid:-0}" != 0 ]; then
	user=$(ps -o user= -p "$pid" 2>/dev/null | tr -d ' ')
	if [ "$user" = reportgen ]; then pass "process runs as reportgen"; else fail "process runs as reportgen" "main process runs as '${user:-none}'"; fi
fi
finish
