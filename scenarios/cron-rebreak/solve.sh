set -e
sed -i 's/listen 8088 default_server;/listen 80 default_server;/' /opt/webconfig/default.conf
/usr/local/sbin/sync-webconfig
