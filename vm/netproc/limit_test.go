package netproc

import (
	"log/slog"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm/netstack"
)

// TestAllowLimit_PolicyResent: the daemon sends a VM's policy again with
// each command of a session; that must not renew the bound on the
// allowed connections the netstack reports, or a compromised netstack
// gets a new burst per command.
func TestAllowLimit_PolicyResent(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "netstack-side")
	defer theirs.Close()
	mine := os.NewFile(uintptr(fds[0]), "daemon-side")
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Burst: 2*5/5 + 1 = 3 allowed connections at once.
	e := netrule.Egress{ConnectRate: 5, MaxConns: 1}
	p := &Proc{ctl: c.(*net.UnixConn), log: slog.New(slog.DiscardHandler), audits: map[uint64]func(netstack.Record){},
		limit: newAllowLimit(e)}
	p.SetPolicy(netstack.Policy{Egress: e})
	allowed := netstack.Record{Proto: "tcp", Allowed: true}
	for i := range 3 {
		if err := p.attribute(p.gen, allowed); err != nil {
			t.Fatalf("allowed connection %d of the burst: %v", i+1, err)
		}
	}
	for i := range 3 {
		p.SetPolicy(netstack.Policy{Egress: e}) // a session's next command
		if err := p.attribute(p.gen, allowed); err == nil {
			t.Fatalf("policy sent again %d times: one more allowed connection accepted beyond the burst", i+1)
		}
	}
}
