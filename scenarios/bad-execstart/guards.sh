common_guards
u=$(systemctl show -p User --value inventory)
if [ "$u" = inventory ]; then pass "unit runs as user inventory"; else fail "unit runs as user inventory" "User=${u:-root}"; fi
pid=$(systemctl show -p MainPID --value inventory)
if [ "${pid:-0}" != 0 ]; then
	user=$(ps -o user= -p "$pid" 2>/dev/null | tr -d ' ')
	if [ "$user" = inventory ]; then pass "process runs as inventory"; else fail "process runs as inventory" "main process runs as '${user:-none}'"; fi
fi
if systemctl show -p ExecStart --value inventory | grep -q '/opt/inventory/server.py'; then pass "still runs server.py"; else fail "still runs server.py" "ExecStart changed"; fi
finish
