# The proxy points at port 8081; the api service listens on 8080.
install_app api 8080
systemctl start api
cat >/etc/nginx/sites-available/default <<'CONF'
server {
	listen 80 default_server;
	server_name _;
	location / {
		proxy_pass http://127.0.0.1:8081;
		proxy_set_header Host $host;
	}
}
CONF
systemctl reload nginx
wait_for 20 curl -sf http://127.0.0.1:8080/health
[ "$(http_status http://127.0.0.1/)" = 502 ]
