# Log in with the deploy key (kept here, never on the server).
key=$(mktemp)
cat >"$key" <<'KEY'
-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACAOYeiv7ot3U0a51FLR2rqUNa6CcdnEu51KV9bS+3g5mQAAAJB+jb3lfo29
5QAAAAtzc2gtZWQyNTUxOQAAACAOYeiv7ot3U0a51FLR2rqUNa6CcdnEu51KV9bS+3g5mQ
AAAEAgw8IBfkP57c4QDl72+BwKypUpuyEIpN9p93WjDc1W7Q5h6K/ui3dTRrnUUtHaupQ1
roJx2cS7nUpX1tL7eDmZAAAACWRlcGxveUBjaQECAwQ=
-----END OPENSSH PRIVATE KEY-----
KEY
chmod 600 "$key"
out=$(ssh -i "$key" -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
	-o ConnectTimeout=10 deploy@127.0.0.1 whoami 2>&1)
if [ "$out" = deploy ]; then pass "deploy logs in with its key"; else fail "deploy logs in with its key" "$(echo "$out" | tail -1)"; fi
rm -f "$key"
finish
