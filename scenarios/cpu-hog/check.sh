# The CPU is mostly idle over 3 seconds (the VM has one).
read -r _ u1 n1 s1 i1 w1 q1 sq1 st1 _ </proc/stat
sleep 3
read -r _ u2 n2 s2 i2 w2 q2 sq2 st2 _ </proc/stat
busy=$(((u2 + n2 + s2 + q2 + sq2 + st2) - (u1 + n1 + s1 + q1 + sq1 + st1)))
idle=$(((i2 + w2) - (i1 + w1)))
if [ $((idle * 100 / (idle + busy + 1))) -ge 50 ]; then pass "CPU mostly idle"; else fail "CPU mostly idle" "idle $((idle * 100 / (idle + busy + 1))) %"; fi
expect_page "home page served" http://127.0.0.1/ "Gallery"
finish
