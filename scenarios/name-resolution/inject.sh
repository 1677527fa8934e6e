# api.internal is in /etc/hosts, but name resolution no longer reads
# /etc/hosts (nsswitch.conf "hosts: dns"), and there is no DNS server.
install_app api 8080
systemctl start api
grep -q 'api.internal' /etc/hosts || printf '127.0.0.1\tapi.internal\n' >>/etc/hosts
cat >/etc/nginx/sites-available/default <<'CONF'
server {
	listen 80 default_server;
	server_name _;
	location / {
		proxy_pass http://api.internal:8080;
	}
}
CONF
systemctl restart nginx
wait_for 20 curl -sf http://127.0.0.1/health
sed -i 's/^hosts:.*/hosts:          dns/' /etc/nsswitch.conf
systemctl restart nginx 2>/dev/null && exit 1
! systemctl is-active --quiet nginx
