set -e
cd /root/ca
openssl req -new -key /etc/nginx/tls/secure.local.key -subj /CN=secure.local -out /tmp/secure.csr
printf 'subjectAltName=DNS:secure.local\nextendedKeyUsage=serverAuth\n' >/tmp/secure.ext
openssl x509 -req -in /tmp/secure.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile /tmp/secure.ext -out /etc/nginx/tls/secure.local.crt
systemctl reload nginx
sleep 1
