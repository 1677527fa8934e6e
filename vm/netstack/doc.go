// Package netstack is the host-side guest network of one VM. Its pieces that
// decide and parse: the operator's egress allowlist (package
// policy/netrule, which it enforces), the classification of destination
// addresses (Classify), the reading of the
// name a connection claims (TLS SNI, HTTP Host) and the framing of QEMU's
// stream netdev. They are pure and fuzzed; the network stack that uses them
// is built on top.
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
package netstack
