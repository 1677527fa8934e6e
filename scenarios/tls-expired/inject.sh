# The site's certificate (issued by the internal CA) expired on
# 2025-01-01. The CA and its key are in /root/ca; the test CA and keys
# below exist only for this scenario.
mkdir -p /root/ca /etc/nginx/tls /var/www/secure
chmod 700 /root/ca
cat >/root/ca/ca.crt <<'PEM'
-----BEGIN CERTIFICATE-----
MIIBbTCCAROgAwIBAgIBATAKBggqhkjOPQQDAjAeMRwwGgYDVQQDExNFeGFtcGxl
IEludGVybmFsIENBMB4XDTIwMDEwMTAwMDAwMFoXDTQ1MDEwMTAwMDAwMFowHjEc
MBoGA1UEAxMTRXhhbXBsZSBJbnRlcm5hbCBDQTBZMBMGByqGSM49AgEGCCqGSM49
AwEHA0IABHzDBoS2auJGzdTrwUSxEoy0Q5GF9oXE2F5OmbV1s3umeh8cg2BN8u6o
1a/CAZrz4kj+TfkTyNqZGBGDOBjBdqGjQjBAMA4GA1UdDwEB/wQEAwIBBjAPBgNV
HRMBAf8EBTADAQH/MB0GA1UdDgQWBBSfh6XtDTVPENThzb2351bYtse79jAKBggq
hkjOPQQDAgNIADBFAiA+vmf+xo8Yh4Jo3z5nnkufOTNGlgbdrApy61vlB04jQgIh
APRy3Yub0n6pN9CUHfTx7iJc/NgiGXKtPQ/M3YKpK5a9
-----END CERTIFICATE-----
PEM
cat >/root/ca/ca.key <<'PEM'
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgb+ItBUtqmVOKgVXI
F7Yh6Av7dR9Y74trHbUZtLZQAXWhRANCAAR8wwaEtmriRs3U68FEsRKMtEORhfaF
xNheTpm1dbN7pnofHINgTfLuqNWvwgGa8+JI/k35E8jamRgRgzgYwXah
-----END PRIVATE KEY-----
PEM
cat >/etc/nginx/tls/secure.local.crt <<'PEM'
-----BEGIN CERTIFICATE-----
MIIBhzCCASygAwIBAgICEJIwCgYIKoZIzj0EAwIwHjEcMBoGA1UEAxMTRXhhbXBs
ZSBJbnRlcm5hbCBDQTAeFw0yNDAxMDEwMDAwMDBaFw0yNTAxMDEwMDAwMDBaMBcx
FTATBgNVBAMTDHNlY3VyZS5sb2NhbDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IA
BFGuje3LEbOdYeUTQHPob90weyU2HZC4br4YevYYscoMdue6fiGa555c03TPe/ww
5p4CXd8vXPVlQ6iSEyOnsJ2jYTBfMA4GA1UdDwEB/wQEAwIHgDATBgNVHSUEDDAK
BggrBgEFBQcDATAfBgNVHSMEGDAWgBSfh6XtDTVPENThzb2351bYtse79jAXBgNV
HREEEDAOggxzZWN1cmUubG9jYWwwCgYIKoZIzj0EAwIDSQAwRgIhANTn1+C5cs7s
/gESnLjwbnZI/17Wa3VkW3eF2GhKk69CAiEA3t470UYb1/qzH8gVEK5jGI0gMe39
Ygy69cJjeoxipmc=
-----END CERTIFICATE-----
PEM
cat >/etc/nginx/tls/secure.local.key <<'PEM'
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg9Hl1yfZsKqa1VX+j
qvMHK/UFBO5/ieuZb2Bs7iy1fFWhRANCAARRro3tyxGznWHlE0Bz6G/dMHslNh2Q
uG6+GHr2GLHKDHbnun4hmueeXNN0z3v8MOaeAl3fL1z1ZUOokhMjp7Cd
-----END PRIVATE KEY-----
PEM
chmod 600 /root/ca/ca.key /etc/nginx/tls/secure.local.key
printf 'Internal CA. Sign site certificates with:\n  openssl x509 -req -CA ca.crt -CAkey ca.key ...\n' >/root/ca/README
cp /root/ca/ca.crt /usr/local/share/ca-certificates/internal-ca.crt
# What update-ca-certificates would do for curl and OpenSSL clients
# (running it rehashes every CA: minutes under TCG).
grep -q "$(sed -n 2p /root/ca/ca.crt)" /etc/ssl/certs/ca-certificates.crt || cat /root/ca/ca.crt >>/etc/ssl/certs/ca-certificates.crt
grep -q 'secure.local' /etc/hosts || printf '127.0.0.1\tsecure.local\n' >>/etc/hosts
site_page "Secure" >/var/www/secure/index.html
cat >/etc/nginx/sites-available/secure <<'CONF'
server {
	listen 443 ssl;
	server_name secure.local;
	ssl_certificate /etc/nginx/tls/secure.local.crt;
	ssl_certificate_key /etc/nginx/tls/secure.local.key;
	root /var/www/secure;
	index index.html;
}
CONF
ln -sf /etc/nginx/sites-available/secure /etc/nginx/sites-enabled/secure
systemctl reload nginx
sleep 1
curl -s -o /dev/null --max-time 5 https://secure.local/ && exit 1
curl -sk -o /dev/null --max-time 5 https://secure.local/
