package netproc

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/reexec"
	"github.com/vmgate/vmgate/isolate/seccomp"
	"github.com/vmgate/vmgate/vm/netstack"
)

// Role is the re-exec role of the netstack.
const Role = "netstack"

// jailChannelFD is the channel's fd when the daemon jails the netstack
// itself; a netstack started by systemd's socket activation
// (vmgate-netstack@.service) is given --channel-fd 0.
const jailChannelFD = 4

func init() { reexec.Register(Role, child) }

// child is the netstack: it serves one VM's network until the daemon
// closes the channel or QEMU's connection ends, whichever comes first.
//
// Its start-up (the channel, QEMU's listening socket, the network) is done
// before it reads a byte from the guest; it then loads its second seccomp
// filter, which forbids exec and new processes for the rest of its life.
func child(args []string) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	fs := flag.NewFlagSet(Role, flag.ContinueOnError)
	fd := fs.Int("channel-fd", jailChannelFD, "fd of the channel to vmgated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cf := os.NewFile(uintptr(*fd), "netstack-channel")
	c, err := net.FileConn(cf)
	cf.Close()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	ctl, ok := c.(*net.UnixConn)
	if !ok {
		return errors.New("channel: not a Unix socket")
	}
	buf := make([]byte, MaxMessage+1)
	first, ln, roots, err := readStart(ctl, buf)
	if err != nil {
		return err
	}
	defer ln.Close()
	ic := &interception{roots: roots, log: log}
	if roots != nil {
		defer roots.Close()
	}
	cfg := netstack.Config{Hosts: first.Hosts, Log: log}
	var gen atomic.Uint64
	send := func(m fromChild) {
		b, err := json.Marshal(m)
		if err == nil {
			_, err = ctl.Write(b)
		}
		if err != nil {
			log.Debug("send to the daemon", "err", err)
		}
	}
	audit := func(r netstack.Record) {
		w := recordToWire(r)
		send(fromChild{Gen: gen.Load(), Record: &w})
	}
	policy := func(m toChild) (netstack.Policy, error) {
		p := netstack.Policy{Audit: audit}
		if m.Policy != nil {
			e, err := m.Policy.egress()
			if err != nil {
				return p, err
			}
			p.Egress = e
			if err := ic.apply(&p, m.Policy); err != nil {
				return p, err
			}
		}
		gen.Store(m.Gen)
		return p, nil
	}
	if cfg.Policy, err = policy(first); err != nil {
		return err
	}
	n, err := netstack.New(cfg)
	if err != nil {
		return err
	}
	defer n.Close()

	// Start-up is over. From here on the guest's bytes are parsed: no
	// exec, no new process (isolate/seccomp, "netstack-serving").
	if err := seccomp.Install(seccomp.Options{Program: "netstack-serving"}, log); err != nil {
		return fmt.Errorf("second seccomp filter: %w", err)
	}

	qemu := make(chan error, 1)
	go func() { qemu <- serveQEMU(ln, n) }()
	daemon := make(chan error, 1)
	applied := func(g uint64) { send(fromChild{Gen: g, Applied: true}) }
	go func() { daemon <- followPolicies(ctl, buf, n, &dialer{n: n, log: log}, policy, applied) }()
	select {
	case err := <-daemon:
		if err == nil {
			log.Info("the daemon closed the channel: the network ends")
		}
		return err
	case err := <-qemu:
		// QEMU has gone (its VM ends, or it died), and it never comes
		// back to this socket: there is no guest left to serve.
		log.Info("QEMU's connection ended: the network ends", "err", err)
		send(fromChild{Gen: gen.Load(), End: endQEMU})
		return nil
	}
}

// serveQEMU serves the network to QEMU's one connection on ln until it
// ends.
func serveQEMU(ln net.Listener, n *netstack.Network) error {
	conn, err := ln.Accept()
	ln.Close()
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	return n.Serve(conn)
}

// followPolicies gives the network each policy the daemon sends, and
// tells it each one is in force, and serves its dials into the guest,
// until the daemon closes the channel (nil) or sends what does not parse.
func followPolicies(ctl *net.UnixConn, buf []byte, n *netstack.Network, d *dialer, policy func(toChild) (netstack.Policy, error), applied func(gen uint64)) error {
	for {
		m, pair, err := readToChild(ctl, buf)
		if errors.Is(err, errChannelClosed) {
			return nil
		}
		if errors.Is(err, errDialDropped) {
			// Its end of the pair never came; the daemon's end sees the
			// pair closed and refuses that one connection.
			d.log.Warn("a dial into the guest lost its descriptor (the netstack's descriptors are all in use?)", "port", m.Dial.Port)
			continue
		}
		if err != nil {
			return err
		}
		if m.Dial != nil {
			d.serve(m.Dial.Port, pair)
			continue
		}
		p, err := policy(m)
		if err != nil {
			return err
		}
		n.SetPolicy(p)
		applied(m.Gen)
	}
}

var (
	errChannelClosed = errors.New("channel closed")
	// errDialDropped is a dial whose fd the kernel did not deliver.
	errDialDropped = errors.New("channel: a dial's descriptor was dropped")
)

// maxRoots bounds the roots bundle a netstack reads (a host's is ~200 KiB).
const maxRoots = 8 << 20

// readStart reads the daemon's first message, which carries the listening
// socket QEMU connects to as its first fd and, as a second, the roots
// bundle of secrets' hosts (nil: none), kept open until a policy with
// secrets needs it: most VMs never read it.
func readStart(ctl *net.UnixConn, buf []byte) (toChild, net.Listener, *os.File, error) {
	oob := make([]byte, unix.CmsgSpace(2*4))
	k, oobn, _, _, err := ctl.ReadMsgUnix(buf, oob)
	if err != nil {
		return toChild{}, nil, nil, fmt.Errorf("channel: %w", err)
	}
	cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(cmsgs) != 1 {
		return toChild{}, nil, nil, fmt.Errorf("channel: the first message carries no listening socket")
	}
	fds, err := unix.ParseUnixRights(&cmsgs[0])
	if err != nil || len(fds) < 1 || len(fds) > 2 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return toChild{}, nil, nil, fmt.Errorf("channel: the first message carries no listening socket")
	}
	var roots *os.File
	if len(fds) == 2 {
		roots = os.NewFile(uintptr(fds[1]), "netstack-roots")
	}
	lf := os.NewFile(uintptr(fds[0]), "netstack-listener")
	ln, err := net.FileListener(lf)
	lf.Close()
	if err == nil {
		var m toChild
		if err = decodeStrict(buf[:k], &m); err == nil {
			return m, ln, roots, nil
		}
		ln.Close()
	} else {
		err = fmt.Errorf("listener: %w", err)
	}
	if roots != nil {
		roots.Close()
	}
	return toChild{}, nil, nil, err
}

// interception is what the netstack needs to intercept TLS to secrets'
// hosts: the roots those hosts are verified against (read and parsed at
// the first policy with secrets) and the session CA it serves with
// (parsed again only when it changes, so that its leaf certificates are
// kept).
type interception struct {
	roots *os.File
	log   *slog.Logger
	pool  *x509.CertPool
	ca    *netstack.SessionCA
}

// readRoots reads the roots bundle, at most maxRoots bytes; none (nil)
// when the daemon sent none.
func (ic *interception) readRoots() ([]byte, error) {
	if ic.roots == nil {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(ic.roots, maxRoots+1))
	if err == nil && len(b) > maxRoots {
		err = fmt.Errorf("over %d bytes", maxRoots)
	}
	if err != nil {
		return nil, fmt.Errorf("the roots bundle: %w", err)
	}
	return b, nil
}

// apply sets p's secrets, CA and roots from the policy w.
func (ic *interception) apply(p *netstack.Policy, w *wireEgress) error {
	secrets, err := w.secrets()
	if err != nil || len(secrets) == 0 {
		return err
	}
	p.Secrets = secrets
	if w.CA != nil {
		if ic.ca == nil || !bytes.Equal(ic.ca.CertPEM, w.CA.Cert) {
			ca, err := netstack.ParseSessionCA(w.CA.Cert, w.CA.Key)
			if err != nil {
				return fmt.Errorf("netstack message: %w", err)
			}
			ic.ca = ca
		}
		p.CA = ic.ca
	}
	if ic.pool == nil {
		// No roots: an empty pool, which verifies no host (never the
		// host's own store, which the jail does not hold anyway).
		// A bundle that cannot be read leaves it empty too: the secrets'
		// TLS fails (and is audited), the rest of the network works.
		b, err := ic.readRoots()
		if err != nil {
			ic.log.Error("secrets' hosts cannot be verified", "err", err)
		}
		ic.pool = x509.NewCertPool()
		ic.pool.AppendCertsFromPEM(b)
	}
	p.Roots = ic.pool
	return nil
}

// readToChild reads one message of the daemon after the first: a policy,
// which carries no fd, or a dial, which carries exactly one (returned).
func readToChild(ctl *net.UnixConn, buf []byte) (toChild, *os.File, error) {
	var m toChild
	oob := make([]byte, unix.CmsgSpace(4))
	k, oobn, flags, _, err := ctl.ReadMsgUnix(buf, oob)
	if k == 0 && oobn == 0 && (err == nil || errors.Is(err, io.EOF)) || errors.Is(err, net.ErrClosed) {
		return m, nil, errChannelClosed
	}
	if err != nil {
		return m, nil, fmt.Errorf("channel: %w", err)
	}
	var fds []int
	if oobn > 0 {
		if cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for i := range cmsgs {
				got, _ := unix.ParseUnixRights(&cmsgs[i])
				fds = append(fds, got...)
			}
		}
	}
	var pair *os.File
	if len(fds) == 1 {
		pair = os.NewFile(uintptr(fds[0]), "guest-dial")
	} else {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	err = decodeStrict(buf[:k], &m)
	switch {
	case err == nil && flags&unix.MSG_CTRUNC != 0 && m.Dial != nil && len(fds) == 0:
		// The kernel dropped the dial's fd: this process holds all the
		// descriptors it may (or the daemon sent more than one).
		err = errDialDropped
	case err == nil && flags&unix.MSG_CTRUNC != 0:
		err = errors.New("channel: a message with more than one fd")
	case err == nil && m.Dial != nil && (pair == nil || m.Policy != nil || m.Gen != 0 || m.Hosts != nil):
		err = errors.New("channel: a dial carries one fd and nothing else")
	case err == nil && m.Dial == nil && len(fds) > 0:
		err = errors.New("channel: a policy carries no fd")
	}
	if err != nil && pair != nil {
		pair.Close()
		pair = nil
	}
	return m, pair, err
}
