// Package netstack is the host's per-VM network stack: the Ethernet
// segment a guest's NIC is on (gVisor's TCP/IP stack behind QEMU's stream
// netdev), its gateway, DHCP and DNS server, and the dialer that makes the
// connections the operator's allowlist allows. The pieces that decide and
// parse live apart, pure and fuzzed: the allowlist's grammar and matching
// (package policy/netrule), the reading of what a guest's bytes claim (the
// TLS SNI, the HTTP Host, the heads forwarded rebuilt, QEMU's frames:
// package internal/netwire); the classification of destination addresses
// (Classify) is this package's.
//
// Threat model: the guest is hostile (a root shell in it is the normal
// case). Everything it sends — frames, DNS queries, TLS ClientHellos, HTTP
// requests — is untrusted input: parsers never panic, bound their work,
// and answer "no" when unsure. Egress is denied unless a rule allows the
// destination name and port; names resolving to loopback, private, CGNAT,
// link-local, multicast or otherwise special addresses are refused unless
// the operator explicitly allows the range; a connection must claim (SNI,
// Host) the name the guest resolved, so that an allowlisted name cannot
// front for another host on the same address.
//
// The name check must read what the server will read. On a port allowed
// by name, every HTTP/1 request is parsed strictly (RFC 9112, RFC 3986)
// and refused when it could be read two ways: a CR, LF or control byte
// anywhere but a CRLF line end (lenient servers such as Go's net/http and
// nginx end a line at a bare LF, and would see a request hidden in a
// header), userinfo in an authority ("http://allowed:80@evil/"), a
// request target naming another site than Host, a second Host, a folded
// or malformed header line, a signed length or chunk size. What is
// forwarded is the head rebuilt from what was parsed, not the guest's
// bytes, and a request with a body is the connection's last (its head
// asks the server to close), so that a server that skips a body does not
// read it as a request. A TLS ClientHello with encrypted_client_hello
// (ECH) or the legacy encrypted_server_name (ESNI) is refused there: its
// server_name is only the public front, and the server decrypts the name
// it reaches.
package netstack
