# A missing semicolon in the site's configuration; nginx was restarted
# with it and is down.
site_page "Blog" >"$INDEX"
cat >/etc/nginx/sites-available/default <<'CONF'
server {
	listen 80 default_server;
	listen [::]:80 default_server;

	root /var/www/html;
	index index.html index.htm index.nginx-debian.html;

	add_header X-Frame-Options SAMEORIGIN;

	server_name _

	location / {
		try_files $uri $uri/ =404;
	}
}
CONF
systemctl restart nginx 2>/dev/null && exit 1
! systemctl is-active --quiet nginx
