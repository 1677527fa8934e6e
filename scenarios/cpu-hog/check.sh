# No process keeps the CPU busy: over 3 seconds none uses more than a quarter
# of it (the VM has one CPU; fields 14 and 15 of /proc/PID/stat are its
# user and system time in clock ticks).
ticks() { awk '{ n = split($0, f, ") "); split(f[n], g, " "); print $1, g[12] + g[13], substr(f[1], index(f[1], "(") + 1) }' /proc/[0-9]*/stat 2>/dev/null | sort; }
a=$(ticks)
sleep 3
b=$(ticks)
hz=$(getconf CLK_TCK)
top=$(join <(echo "$a") <(echo "$b") | awk '{ d = $4 - $2; if (d > max) { max = d; name = $3 } } END { print max + 0, name }')
used=${top%% *}
if [ "$used" -le $((hz * 3 / 4)) ]; then pass "no process hogs the CPU"; else fail "no process hogs the CPU" "'${top#* }' used $((used * 100 / (hz * 3))) % of the CPU"; fi
expect_page "home page served" http://127.0.0.1/ "Gallery"
finish
