package netproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/reexec"
	"github.com/vmgate/vmgate/isolate"
	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm/netstack"
)

// Config is what the daemon gives one VM's netstack.
type Config struct {
	// Jail is the netstack's jail: vmgated's binary and libraries and the
	// resolver's files read-only, ids and rlimits (package vm builds it).
	// Start sets the program, environment and network of it.
	Jail isolate.Spec
	// Hosts pins guest DNS names to addresses, before the host's resolver.
	Hosts map[string][]netip.Addr
	// Policy is the network's first policy.
	Policy netstack.Policy
	// Socket, when set, is where systemd starts a netstack per
	// connection (contrib/systemd/vmgate-netstack.socket): the
	// netstack then runs outside this service and its jail is systemd's;
	// Jail is not used.
	Socket string
	// Roots is a PEM bundle of the certificate authorities the netstack
	// verifies the hosts of secrets against (intercepted TLS); "": none
	// (such TLS then fails). It is opened here and its descriptor sent,
	// so that a jailed netstack, which sees no host file, can read it.
	Roots string
	Log   *slog.Logger
}

// keptGens is how many policies back a record may be attributed: records
// of connections that end after a policy change still reach the audit of
// the policy they were sent under.
const keptGens = 8

// applyTimeout bounds the wait for a netstack to say a new policy is in
// force. It reads the policy and replies at once; one that has not after
// this long is not behaving as the netstack (or is starved beyond use).
const applyTimeout = 10 * time.Second

// Proc is a running netstack, as the daemon sees it.
type Proc struct {
	ctl  *net.UnixConn
	jail *isolate.Jail
	log  *slog.Logger

	mu     sync.Mutex
	gen    uint64
	audits map[uint64]func(netstack.Record)
	limit  *allowLimit
	// applied is the newest policy the netstack said is in force;
	// appliedCh is closed and replaced whenever it grows.
	applied   uint64
	appliedCh chan struct{}
	// applyWait bounds SetPolicy's wait for the netstack, and each write
	// to its channel (applyTimeout).
	applyWait time.Duration

	// writeMu orders the writes to ctl, each under its own deadline
	// (write).
	writeMu sync.Mutex

	done        chan struct{} // closed when the netstack has exited
	recordsDone chan struct{} // closed when readRecords returns
	closing     atomic.Bool
	qemuGone    atomic.Bool // the netstack said it ends because QEMU's connection did
	once        sync.Once
}

// Start runs a netstack for the VM whose QEMU connects to ln: a jailed
// child of this process, or, with cfg.Socket, an instance that systemd
// starts for the connection to that socket.
func Start(cfg Config, ln *os.File) (*Proc, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	p := &Proc{log: cfg.Log, audits: map[uint64]func(netstack.Record){}, done: make(chan struct{}), recordsDone: make(chan struct{}),
		appliedCh: make(chan struct{}), applyWait: applyTimeout}
	var err error
	if cfg.Socket != "" {
		err = p.connect(cfg.Socket)
	} else {
		err = p.spawn(cfg.Jail)
	}
	if err != nil {
		return nil, err
	}
	// Records are read from the start: a netstack reached through the
	// socket ends (done) only when this reading does, so Close of a
	// failed start must find it running.
	go p.readRecords()
	first := toChild{Hosts: cfg.Hosts}
	fds := []*os.File{ln}
	if cfg.Roots != "" {
		roots, err := os.Open(cfg.Roots)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("netstack: the roots of secrets' hosts: %w", err)
		}
		defer roots.Close()
		fds = append(fds, roots)
	}
	if err := p.send(&first, cfg.Policy, fds...); err != nil {
		p.Close()
		return nil, err
	}
	// The netstack builds its network with the first policy, before it
	// serves QEMU: it is in force from the guest's first frame.
	p.markApplied(first.Gen)
	return p, nil
}

// connect asks systemd for a netstack (vmgate-netstack.socket, Accept=yes):
// the connection is the channel, and the instance ends with it.
func (p *Proc) connect(socket string) error {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("netstack: %w", err)
	}
	p.ctl = c
	go func() {
		// The instance is not this process's child: its end is the
		// channel's, which readRecords sees.
		<-p.recordsDone
		p.logEnd(nil)
		close(p.done)
	}()
	return nil
}

// spawn starts the netstack as a jailed child of this process.
func (p *Proc) spawn(spec isolate.Spec) error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("netstack: channel: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "netstack-channel"), os.NewFile(uintptr(fds[1]), "netstack-channel")
	defer theirs.Close()
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return fmt.Errorf("netstack: channel: %w", err)
	}
	spec.Program, spec.HostNetwork = "netstack", true
	spec.Env = []string{reexec.ChildEnv + "=" + Role}
	j, err := isolate.Command(spec, theirs)
	if err == nil {
		var stderr io.ReadCloser
		if stderr, err = j.Cmd.StderrPipe(); err == nil {
			if err = j.Start(nil); err == nil {
				p.ctl, p.jail = c.(*net.UnixConn), j
				go p.waitChild(stderr)
				return nil
			}
		}
	}
	c.Close()
	return fmt.Errorf("netstack: %w", err)
}

func (p *Proc) waitChild(stderr io.Reader) {
	p.relayLog(stderr)
	err := p.jail.Cmd.Wait()
	// Its last message is read before its end is judged: the channel
	// ends with the process (nothing else holds its side).
	<-p.recordsDone
	p.logEnd(err)
	close(p.done)
}

// logEnd logs the netstack's end (err: its exit status, when it is this
// process's child): a failure unless the daemon closed it or it said it
// ends with QEMU's connection.
func (p *Proc) logEnd(err error) {
	switch {
	case p.closing.Load():
	case p.qemuGone.Load() && err == nil:
		p.log.Debug("netstack ended with QEMU's connection")
	default:
		p.log.Error("netstack ended: the VM has no network any more", "err", err)
	}
}

// SetPolicy gives the network a new policy (see netstack.Network.SetPolicy);
// its records go to p.Audit from now on. It returns once the netstack
// says the policy is in force, so that a command started afterwards is
// held to it; a netstack that does not say so within applyTimeout is
// killed (its VM keeps running without a network), as is one that cannot
// be sent the policy. A netstack that has ended has no network to apply
// it to.
func (p *Proc) SetPolicy(pol netstack.Policy) {
	m := &toChild{}
	err := p.send(m, pol)
	if err == nil {
		err = p.waitApplied(m.Gen)
	}
	if err != nil {
		p.log.Error("netstack: set policy: killed (the VM keeps running without a network)", "err", err)
		p.kill()
	}
}

// waitApplied waits until the netstack says policy gen is in force, or
// has ended.
func (p *Proc) waitApplied(gen uint64) error {
	t := time.NewTimer(p.applyWait)
	defer t.Stop()
	for {
		p.mu.Lock()
		ok, ch := p.applied >= gen, p.appliedCh
		p.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-p.recordsDone: // it has ended: no network is left
			return nil
		case <-t.C:
			return fmt.Errorf("policy %d not in force after %v", gen, p.applyWait)
		}
	}
}

// markApplied records that policy gen is in force; a netstack that says
// so of a policy it was not sent misbehaves.
func (p *Proc) markApplied(gen uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if gen > p.gen {
		return fmt.Errorf("said policy %d is in force, which it was not sent", gen)
	}
	if gen > p.applied {
		p.applied = gen
		close(p.appliedCh)
		p.appliedCh = make(chan struct{})
	}
	return nil
}

// send sends a policy, and with fds files along with it.
func (p *Proc) send(m *toChild, pol netstack.Policy, fds ...*os.File) error {
	p.mu.Lock()
	p.gen++
	m.Gen = p.gen
	if len(pol.Rules) > 0 || pol.AllowedRanges != nil || pol.MaxConns != 0 || pol.MaxBytes != 0 || pol.ConnectRate != 0 || len(pol.Secrets) > 0 {
		m.Policy = egressToWire(pol)
	}
	audit := pol.Audit
	if audit == nil {
		audit = func(netstack.Record) {}
	}
	p.audits[p.gen] = audit
	delete(p.audits, p.gen-keptGens)
	if p.limit == nil {
		p.limit = newAllowLimit(pol.Egress)
	} else {
		p.limit.retune(pol.Egress)
	}
	p.mu.Unlock()
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("netstack: %w", err)
	}
	var oob []byte
	if len(fds) > 0 {
		ints := make([]int, len(fds))
		for i, f := range fds {
			ints[i] = int(f.Fd())
		}
		oob = unix.UnixRights(ints...)
	}
	if err := p.write(b, oob); err != nil {
		return fmt.Errorf("netstack: send policy: %w", err)
	}
	return nil
}

// write sends one message on the channel, with oob (an fd) along. A
// netstack reads its channel at once; one that leaves it full for
// applyWait (applyTimeout) would otherwise block the daemon's caller (a command's
// SetPolicy, a published port's dial) for ever: it is killed, and the
// write fails.
func (p *Proc) write(b, oob []byte) error {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	_ = p.ctl.SetWriteDeadline(time.Now().Add(p.applyWait))
	_, _, err := p.ctl.WriteMsgUnix(b, oob, nil)
	_ = p.ctl.SetWriteDeadline(time.Time{})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		p.log.Error("netstack does not read its channel: killed (the VM keeps running without a network)", "waited", p.applyWait)
		p.kill()
	}
	return err
}

// readRecords audits what the netstack reports until it ends. A message
// that does not parse, or more allowed connections than its policy lets
// it make, ends the netstack: it is no longer behaving as the netstack.
func (p *Proc) readRecords() {
	defer close(p.recordsDone)
	buf := make([]byte, MaxMessage+1)
	for {
		k, err := p.ctl.Read(buf)
		if err != nil || k == 0 {
			return
		}
		m, err := parseMessage(buf[:k])
		if err == nil && m.end != "" {
			// Its last message: the channel's end or its exit follows.
			// A netstack that says so and stays merely keeps its VM's
			// network, which it could anyway.
			p.qemuGone.Store(true)
			continue
		}
		switch {
		case err == nil && m.applied:
			err = p.markApplied(m.gen)
		case err == nil:
			err = p.attribute(m.gen, m.record)
		}
		if err != nil {
			p.log.Error("netstack misbehaves: killed (the VM keeps running without a network)", "err", err)
			p.kill()
			return
		}
	}
}

func (p *Proc) attribute(gen uint64, rec netstack.Record) error {
	p.mu.Lock()
	audit, ok := p.audits[gen]
	lim := p.limit
	p.mu.Unlock()
	if !ok {
		return fmt.Errorf("record of policy %d, which it was not given or is long gone", gen)
	}
	if rec.Allowed && rec.Proto == "tcp" && !lim.take(time.Now()) {
		return fmt.Errorf("more allowed connections than its policy's connect rate permits (%d a minute, twice the policy's)", lim.b.PerMinute())
	}
	audit(rec)
	return nil
}

// relayLog logs the netstack's stderr (its own log, JSON lines, and the
// jail's diagnostics): bounded lines, and at most maxLogLines of them.
func (p *Proc) relayLog(r io.Reader) {
	const maxLogLines = 1000
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 4096)
	n := 0
	for sc.Scan() {
		if n++; n <= maxLogLines {
			line := sc.Text()
			level := slog.LevelDebug // its start-up, the jail's filter warnings
			// Its own warnings and errors, the jail's failures, and the
			// error it exits with.
			if strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, `"level":"WARN"`) ||
				strings.HasPrefix(line, "vmgate-jail:") || strings.HasPrefix(line, "vmgated ") {
				level = slog.LevelWarn
			}
			p.log.Log(context.Background(), level, "netstack", "line", line)
		} else if n == maxLogLines+1 {
			p.log.Warn("netstack: further log lines dropped")
		}
	}
	_, _ = io.Copy(io.Discard, r) // a line too long ends the scanner; drain
}

// Pid is the netstack's process id when it is this process's child, or 0.
func (p *Proc) Pid() int {
	if p.jail == nil {
		return 0
	}
	return p.jail.Cmd.Process.Pid
}

// Done is closed when the netstack has ended: the jailed child has
// exited, or the systemd instance has closed its channel. A netstack
// ends by itself when QEMU's connection to it ends.
func (p *Proc) Done() <-chan struct{} { return p.done }

// kill ends a netstack that misbehaves or does not stop: a child is
// killed; a systemd instance loses its channel, and systemd stops it
// (vmgate-netstack@.service: the instance exits when the channel ends,
// and RuntimeMaxSec= bounds one that does not).
func (p *Proc) kill() {
	if p.jail == nil {
		p.ctl.Close()
		return
	}
	if pr := p.jail.Cmd.Process; pr != nil {
		_ = pr.Kill()
	}
}

// Close ends the netstack: the channel's end asks it to stop; it is
// killed if it has not within a second. Close waits for it.
func (p *Proc) Close() {
	p.once.Do(func() {
		p.closing.Store(true)
		p.ctl.Close()
		select {
		case <-p.done:
		case <-time.After(time.Second):
			p.kill()
			<-p.done
		}
	})
}

// allowLimit bounds the allowed connections the daemon believes a
// netstack made: twice its policy's connect rate, with a burst of a
// fifth of that plus its connection limit. One bound lives as long as the
// netstack: a new policy retunes it and keeps what was used of it
// (netstack.Bucket), so a policy sent again renews nothing.
type allowLimit struct{ b *netstack.Bucket }

func newAllowLimit(e netrule.Egress) *allowLimit {
	rate, burst := allowRate(e)
	return &allowLimit{netstack.NewBucket(rate, burst, time.Now())}
}

// allowRate is the bound's rate per minute and burst for a policy.
func allowRate(e netrule.Egress) (int, float64) {
	rate, conns := e.ConnectRate, e.MaxConns
	if rate == 0 {
		rate = netstack.DefaultConnectRate
	}
	if conns == 0 {
		conns = netstack.DefaultMaxConns
	}
	return 2 * rate, float64(2*rate)/5 + float64(conns)
}

func (l *allowLimit) retune(e netrule.Egress) {
	rate, burst := allowRate(e)
	l.b.Retune(rate, burst, time.Now())
}

func (l *allowLimit) take(now time.Time) bool { return l.b.Take(now) }
