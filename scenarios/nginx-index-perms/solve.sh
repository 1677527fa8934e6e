set -e
chmod 644 /var/www/html/index.nginx-debian.html
