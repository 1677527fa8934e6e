package policy

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/vmgate/vmgate/internal/names"
)

// PublishLimits are a profile's rules for publishing a session's ports on
// the host (vm-exec --publish): whether it may at all (sessions.publish),
// on addresses other than loopback (sessions.publish_any_address, a
// relaxation), how many connections one published port carries at once
// (sessions.publish_max_conns), and how long one may carry no byte either
// way before it is cut (sessions.publish_idle).
type PublishLimits struct {
	Allowed    bool
	AnyAddress bool
	MaxConns   int
	Idle       time.Duration
}

// PublishRequest is a request to publish a session's port, untrusted but
// for Host, which the daemon reads from the kernel (the listening socket's
// own address), not from the client.
type PublishRequest struct {
	Session   string
	GuestPort int
	Host      HostAddr
	// Image is the session's image (the daemon's word); "": the
	// profile's. It must still be one of the profile's images.
	Image string
}

// HostAddr is the host side of a published port: a TCP address, or a Unix
// socket's path (Addr then invalid).
type HostAddr struct {
	Addr netip.AddrPort
	Unix string
}

// String is the address as the audit log and messages show it.
func (h HostAddr) String() string {
	if h.Unix != "" {
		return h.Unix
	}
	return h.Addr.String()
}

// loopback reports whether h is reachable from this host only: a Unix
// socket, or a loopback address (IPv4-mapped ones included).
func (h HostAddr) loopback() bool {
	return h.Unix != "" || h.Addr.Addr().Unmap().IsLoopback()
}

// DecidePublish decides whether id may publish a port of its session on
// the host address req.Host: its profile must allow sessions and
// sessions.publish, the session's image (req.Image) must still be one of
// its images, and an address other than loopback or a Unix socket needs
// sessions.publish_any_address. The verdict's Limits.Publish bound
// the published port. Pure; argv rules do not apply. Whether the session
// exists, and has a NIC, is the daemon's to check.
func (p *Policy) DecidePublish(id Identity, req PublishRequest) Verdict {
	if p == nil {
		return Verdict{Reason: "no policy loaded"}
	}
	prof, reason := p.profileFor(id)
	if prof == nil {
		return Verdict{Reason: reason}
	}
	deny := func(rule, reason string) Verdict { return Verdict{Profile: prof.name, Rule: rule, Reason: reason} }
	pub := prof.limits.Publish
	switch h := req.Host; {
	case !names.Session(req.Session):
		return deny("", fmt.Sprintf("session name %s: must be %s", quote(req.Session), names.SessionRule))
	case req.GuestPort < 1 || req.GuestPort > 65535:
		return deny("", fmt.Sprintf("guest port %d: must be 1 to 65535", req.GuestPort))
	case h.Unix == "" && !h.Addr.IsValid():
		return deny("", "no host address to publish on")
	case !prof.limits.AllowSessions:
		return deny("sessions.allowed", "sessions are not allowed")
	}
	if _, rule, reason := prof.chooseImage(req.Image); reason != "" {
		return deny(rule, reason)
	}
	switch h := req.Host; {
	case !pub.Allowed:
		return deny("sessions.publish", "publishing a session's ports on the host is not allowed (sessions.publish = false)")
	case !h.loopback() && !pub.AnyAddress:
		return deny("sessions.publish_any_address", fmt.Sprintf("host address %s is not loopback: only loopback addresses and Unix sockets may be published (sessions.publish_any_address = false)", quote(h.String())))
	}
	v := prof.allowed(Request{Image: req.Image}, "sessions.publish", "publishing is allowed", prof.limits.Timeout)
	if !req.Host.loopback() {
		v.Rule, v.Reason = "sessions.publish_any_address", "publishing on any address is allowed (a relaxation)"
	}
	return v
}

// checkPublish reports publishing settings that cannot work: sessions
// that are not allowed, or VMs without a NIC, through which a published
// port is reached.
func (c *compiler) checkPublish(label string, p *profile) {
	pub := p.limits.Publish
	switch {
	case pub.Allowed && !p.limits.AllowSessions:
		c.errorf("%s: sessions.publish = true needs sessions.allowed = true: only a session's ports are published", label)
	case pub.Allowed && p.net == nil:
		c.errorf("%s: sessions.publish = true needs network.mode = %q: a published port is reached through the VM's NIC, which a profile without a network does not give its VMs", label, networkAllowlist)
	case pub.AnyAddress && !pub.Allowed:
		c.errorf("%s: sessions.publish_any_address = true without sessions.publish = true allows nothing: set both, or remove it", label)
	}
}
