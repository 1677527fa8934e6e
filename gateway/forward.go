package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/internal/relay"
	"github.com/vmgate/vmgate/policy"
)

// guestDialWait bounds the handshake of a connection into the guest:
// one that the guest neither accepts nor refuses in this time is reset.
const guestDialWait = 10 * time.Second

// A published port accepts at most forwardRate connections a second
// after a burst of forwardBurst; the ones past it are refused (and
// counted through the flood gate), so that any local process, vmgate's
// user or not, cannot make the daemon relay and record at its own pace.
const (
	forwardRate  = 20
	forwardBurst = 64
)

// publication is one published port of a session: the caller's
// listening socket, the guest port, and the connections it carries, at
// most cap(slots) at once. It stops once (stop), with a reason.
type publication struct {
	rec     *recorder
	ss      *session
	id      policy.Identity
	reqID   string
	profile string
	host    policy.HostAddr
	port    uint16
	ln      net.Listener
	slots   chan struct{}
	accepts *rate.Limiter
	idle    time.Duration

	ctx    context.Context // ends with stop: dials in progress give up
	cancel context.CancelFunc

	mu sync.Mutex
	// conns are the host and guest sides being relayed, each with why it
	// was cut ("" while it was not).
	conns   map[net.Conn]string
	stopped bool
	why     string
	wg      sync.WaitGroup // one per accepted connection
	done    chan struct{}  // closed once stopped and every connection is done
}

func newPublication(x *sessions, ss *session, id policy.Identity, reqID string, v policy.Verdict, host policy.HostAddr, port uint16, ln net.Listener) *publication {
	p := &publication{rec: x.rec, ss: ss, id: id, reqID: reqID, profile: v.Profile, host: host, port: port, ln: ln,
		slots: make(chan struct{}, max(v.Limits.Publish.MaxConns, 1)), accepts: rate.NewLimiter(forwardRate, forwardBurst), idle: v.Limits.Publish.Idle, conns: map[net.Conn]string{}, done: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// describe names the forward in records: "127.0.0.1:8080 -> guest port 8000".
func (p *publication) describe() string { return fmt.Sprintf("%s -> guest port %d", p.host, p.port) }

// gateKey is the flood gate's key for the publication's refused
// connections.
func (p *publication) gateKey() string { return "publish:" + p.reqID }

// stop ends the publication: its listening socket is closed (no new
// connection is accepted once stop returns, whoever called it first),
// its connections are cut, and stop waits for them to be audited.
func (p *publication) stop(why string) {
	p.mu.Lock()
	first := !p.stopped
	var cut []net.Conn
	if first {
		p.stopped, p.why = true, why
		cut = p.markCutLocked(why)
	}
	p.mu.Unlock()
	if first {
		p.cancel()
		p.ln.Close()
		closeAll(cut)
		go func() {
			p.wg.Wait()
			close(p.done)
		}()
	}
	<-p.done
}

// cut ends the connections being relayed now, and keeps the port.
func (p *publication) cut(why string) {
	p.mu.Lock()
	cut := p.markCutLocked(why)
	p.mu.Unlock()
	closeAll(cut)
}

// markCutLocked marks every connection relayed now as cut for why and
// returns them, for the caller to close once p.mu is released: a close is
// never made under a lock. Precondition: p.mu held.
func (p *publication) markCutLocked(why string) []net.Conn {
	out := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		p.conns[c] = why
		out = append(out, c)
	}
	return out
}

func closeAll(cs []net.Conn) {
	for _, c := range cs {
		c.Close()
	}
}

// track registers a connection to close at stop or cut; false once
// stopped (the caller closes it). accepted counts it for stop's wait.
func (p *publication) track(c net.Conn, accepted bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return false
	}
	p.conns[c] = ""
	if accepted {
		p.wg.Add(1)
	}
	return true
}

func (p *publication) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// cutReason is why the relay of c was ended early, or "" when its sides
// ended it.
func (p *publication) cutReason(c net.Conn) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns[c]
}

// acceptLoop accepts connections until the listening socket is closed
// (stop) or fails; a lack of descriptors or memory is waited out.
func (p *publication) acceptLoop() {
	delay := 5 * time.Millisecond
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) && !errors.Is(err, syscall.ENOBUFS) && !errors.Is(err, syscall.ENOMEM) {
				go p.stop("its listening socket failed: " + err.Error())
				return
			}
			select {
			case <-time.After(delay):
			case <-p.ctx.Done():
				return
			}
			delay = min(2*delay, time.Second)
			continue
		}
		delay = 5 * time.Millisecond
		// The caller's listening socket may linger: its connections would
		// inherit it, and a close of one with unsent data would wait.
		lingerOff(c)
		if !p.track(c, true) {
			c.Close()
			return
		}
		if !p.accepts.Allow() {
			go p.serve(c, fmt.Sprintf("the published port accepts %d connections a second after a burst of %d", forwardRate, forwardBurst))
			continue
		}
		// A slot is taken here, in the order connections came: the
		// first publish_max_conns are carried, the next refused.
		select {
		case p.slots <- struct{}{}:
			go p.serve(c, "")
		default:
			go p.serve(c, fmt.Sprintf("the published port carries %d connections already (sessions.publish_max_conns)", cap(p.slots)))
		}
	}
}

// serve carries one host connection into the guest (it holds one of the
// port's slots, which it gives back), or refuses it at once: refused says
// why it was not given a slot (its rate, the port's most), or the session
// is paused, the guest refuses or does not answer. Each is audited.
func (p *publication) serve(c net.Conn, refused string) {
	defer p.wg.Done()
	defer p.untrack(c)
	defer c.Close()
	t0 := time.Now()
	peer := peerOf(c)
	if refused != "" {
		p.refuse(c, peer, "", refused)
		return
	}
	defer func() { <-p.slots }()
	if err := p.rec.Healthy(); err != nil {
		// Nothing is carried unaudited, as nothing runs unaudited.
		p.refuse(c, peer, "", "the audit log cannot be written: "+err.Error())
		return
	}
	v := p.ss.running()
	if v == nil {
		p.refuse(c, peer, "", "the session is paused: its next command resumes it, and its published ports with it")
		return
	}
	n := v.Network()
	if n == nil {
		p.refuse(c, peer, v.ID, "the session's VM has no network")
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, guestDialWait)
	g, err := n.DialGuest(ctx, p.port)
	cancel()
	if err != nil {
		p.refuse(c, peer, v.ID, err.Error())
		return
	}
	defer g.Close()
	if !p.track(g, false) {
		return
	}
	defer p.untrack(g)
	// An idle connection holds a slot of its port: it is cut after
	// sessions.publish_idle; and only traffic is use of the session.
	r := relay.With(c, g, relay.Options{Idle: p.idle, Active: p.ss.touch})
	in, out := r.AToB, r.BToA
	why := p.cutReason(g)
	switch {
	case why != "":
		why = "cut: " + why
	case r.Idle:
		why = fmt.Sprintf("cut: no byte moved either way for %v (sessions.publish_idle)", p.idle)
	}
	p.auditConn(peer, v.ID, true, why, in, out, time.Since(t0))
}

// refuse closes a host connection at once (a reset over TCP: the client
// is not left waiting) and audits why, through the network flood gate:
// a host client can make refusals at will.
func (p *publication) refuse(c net.Conn, peer, vmID, why string) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
	p.auditConn(peer, vmID, false, why, 0, 0, 0)
}

// auditConn writes the record of one forwarded connection: the
// publisher, its session and VM, the host address and the client's, the
// guest port, the bytes each way (in: host to guest) and its duration.
func (p *publication) auditConn(peer, vmID string, allowed bool, why string, in, out int64, d time.Duration) {
	rec := audit.Record{Kind: audit.KindNet, RequestID: p.reqID, Profile: p.profile, Session: p.ss.Name, VMID: vmID,
		Verdict: audit.VerdictDeny, Reason: why,
		Net: &audit.NetEvent{Proto: "forward", Addr: p.host.String(), Port: p.port, Peer: peer, BytesIn: in, BytesOut: out, DurationMS: d.Milliseconds()}}
	setCaller(&rec, p.id)
	rec.PID = 0 // the publishing process, not the host client
	var err error
	// Both are what any local process makes at will: past their rates,
	// they are counted in summary records.
	if allowed {
		rec.Verdict = audit.VerdictAllow
		_, err = p.rec.gated(p.rec.fwd, p.gateKey(), rec)
	} else {
		_, err = p.rec.gated(p.rec.net, p.gateKey(), rec)
	}
	p.rec.metrics.netConn(string(rec.Verdict))
	if err != nil {
		p.rec.log.Error("audit a forwarded connection", "err", err)
	}
}

// auditSession writes a session record of the publication (published,
// unpublished).
func (p *publication) auditSession(msg string) {
	rec := audit.Record{Kind: audit.KindSession, RequestID: p.reqID, Session: p.ss.Name, Profile: p.profile, Message: msg}
	setCaller(&rec, p.id)
	if err := p.rec.Write(rec); err != nil {
		p.rec.log.Error("audit a published port", "err", err)
	}
}

// peerOf names the host client of a forwarded connection: its TCP
// address, or the process and uid of a Unix socket's peer (SO_PEERCRED).
func peerOf(c net.Conn) string {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return c.RemoteAddr().String()
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ""
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err != nil || cred == nil {
		return ""
	}
	return fmt.Sprintf("pid %d uid %d", cred.Pid, cred.Uid)
}
