# The page's mode was set to 000: nginx's worker (www-data) cannot read it.
site_page "News" >"$INDEX"
chmod 000 "$INDEX"
systemctl reload nginx
[ "$(http_status http://127.0.0.1/)" = 403 ]
