set -e
sed -i 's/^\(\s*server_name _\)$/\1;/' /etc/nginx/sites-available/default
nginx -t
systemctl restart nginx
