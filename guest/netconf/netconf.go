// Package netconf is the guest network's addressing: the contract between
// the host's per-VM netstack (package vm/netstack), which serves it by
// DHCP and answers DNS at the resolver, and a guest that configures it
// statically (an imported root whose init is the agent, package
// guest/boot; its resolv.conf, package cmd/vmgated/imagebuild).
package netconf

import "net/netip"

// The guest's address and prefix, its gateway and its resolver.
var (
	Guest    = netip.MustParsePrefix("10.0.2.15/24")
	Gateway  = netip.MustParseAddr("10.0.2.2")
	Resolver = netip.MustParseAddr("10.0.2.3")
)
