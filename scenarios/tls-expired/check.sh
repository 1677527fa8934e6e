# The site must pass verification against the internal CA (this copy,
# not the one on the server), for at least 30 more days.
ca=$(mktemp)
cat >"$ca" <<'PEM'
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
expect_page "site verifies against the internal CA" https://secure.local/ "Secure" --cacert "$ca"
if echo | openssl s_client -connect 127.0.0.1:443 -servername secure.local 2>/dev/null | openssl x509 -noout -checkend 2592000 >/dev/null 2>&1; then
	pass "certificate valid for 30 more days"
else
	fail "certificate valid for 30 more days" "the served certificate expires within 30 days"
fi
rm -f "$ca"
finish
