# A cron job copies a stale configuration template (listening on 8088)
# over the site's configuration every minute.
site_page "Intranet" >"$INDEX"
mkdir -p /opt/webconfig
cat >/opt/webconfig/default.conf <<'CONF'
# Managed by /usr/local/sbin/sync-webconfig: changes to
# /etc/nginx/sites-available/default are overwritten.
server {
	listen 8088 default_server;
	root /var/www/html;
	index index.html index.nginx-debian.html;
	server_name _;
	location / {
		try_files $uri $uri/ =404;
	}
}
CONF
cat >/usr/local/sbin/sync-webconfig <<'SH'
#!/bin/sh
# Keeps the web server's configuration in line with /opt/webconfig.
if ! cmp -s /opt/webconfig/default.conf /etc/nginx/sites-available/default; then
	cp /opt/webconfig/default.conf /etc/nginx/sites-available/default
	systemctl reload nginx
fi
SH
chmod 755 /usr/local/sbin/sync-webconfig
printf '# Keep the web configuration in sync.\n* * * * * root /usr/local/sbin/sync-webconfig\n' >/etc/cron.d/webconfig-sync
printf '# Nightly backup of the web root.\n17 3 * * * root tar czf /var/backups/www.tgz /var/www\n' >/etc/cron.d/backup-www
/usr/local/sbin/sync-webconfig
sleep 1
[ "$(http_status http://127.0.0.1/)" = 000 ]
