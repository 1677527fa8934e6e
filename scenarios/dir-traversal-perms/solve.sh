set -e
chmod 755 /srv/docs
