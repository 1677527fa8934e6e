# The site's files are world-readable, but a parent directory lost its
# execute bit for others: nginx's worker (www-data) cannot traverse it.
mkdir -p /srv/docs/public /srv/docs/private
site_page "Docs" >/srv/docs/public/index.html
chmod 644 /srv/docs/public/index.html
echo "root password of the old router: hunter2" >/srv/docs/private/notes.txt
chmod 700 /srv/docs/private
chmod 600 /srv/docs/private/notes.txt
cat >/etc/nginx/sites-available/docs <<'CONF'
server {
	listen 8081;
	root /srv/docs/public;
	index index.html;
}
CONF
ln -sf /etc/nginx/sites-available/docs /etc/nginx/sites-enabled/docs
systemctl reload nginx
wait_for 10 http_up http://127.0.0.1:8081/
chmod 700 /srv/docs
[ "$(http_status http://127.0.0.1:8081/)" = 403 ]
