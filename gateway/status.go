package gateway

import (
	"crypto/ed25519"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/version"
	"github.com/vmgate/vmgate/policy"
)

// liveExecs are the commands running now, by request id, for status.
type liveExecs struct {
	mu sync.Mutex
	m  map[string]liveExec
}

// liveExec is a running command, for status.
type liveExec struct {
	owner string // policy.Identity.Key
	info  wire.LiveExec
}

func newLiveExecs() *liveExecs { return &liveExecs{m: map[string]liveExec{}} }

// add records e as running until the returned func is called.
func (l *liveExecs) add(id string, e liveExec) (remove func()) {
	l.mu.Lock()
	l.m[id] = e
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		delete(l.m, id)
		l.mu.Unlock()
	}
}

// of lists the commands of owner ("": everyone's), oldest first.
func (l *liveExecs) of(owner string) []wire.LiveExec {
	out := []wire.LiveExec{}
	l.mu.Lock()
	for _, e := range l.m {
		if owner == "" || e.owner == owner {
			out = append(out, e.info)
		}
	}
	l.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out
}

// describeCaller names a caller in status: "uid 1000 (alice)" or
// "ssh SHA256:…".
func describeCaller(id policy.Identity) string {
	if id.SSH != nil {
		if id.SSH.Door == policy.DoorE2B {
			return "e2b " + id.SSH.Fingerprint
		}
		return "ssh " + id.SSH.Fingerprint
	}
	d := "uid " + strconv.FormatUint(uint64(id.UID), 10)
	if id.User != "" {
		d += " (" + id.User + ")"
	}
	return d
}

// track records st's command as running in target until the returned
// func is called. Its argv is redacted as the audit log redacts it
// (--audit-redact): the status shows admins everyone's commands, and a
// secret kept out of the audit log must not be read there instead.
func (s *Server) track(st *execState, target *vmTarget) func() {
	e := liveExec{owner: st.id.Key(), info: wire.LiveExec{RequestID: st.reqID, VMID: target.vm.ID, Profile: st.verdict.Profile,
		Caller: describeCaller(st.id), Argv: s.rec.RedactArgv(st.argv), Session: st.req.Session, VMStart: target.start, Started: time.Now().UTC()}}
	if st.req.TransferOnly() {
		e.info.Argv = []string{"(file transfer)"}
	}
	return s.live.add(st.reqID, e)
}

// status is what GET /v1/status tells id: the daemon's counters, and the
// running commands and sessions of id, or of everyone for an admin.
func (s *Server) status(id policy.Identity) wire.Status {
	used, waiting := s.slots.stats()
	st := wire.Status{Version: version.Get().Version, LiveVMs: used, MaxVMs: s.cfg.MaxVMs, Waiting: waiting, Audit: "ok",
		Policy: s.pol.Load().Source(), RestoreHandshakeFailures: s.host.HandshakeFailures(), Pools: []wire.Pool{},
		All: s.pol.Load().IsAdmin(id)}
	if err := s.rec.Healthy(); err != nil {
		st.Audit = err.Error()
	}
	st.AuditSeq, st.AuditHead = s.rec.Head()
	pub := s.receiptKey.Public().(ed25519.PublicKey)
	st.ReceiptKey, st.ReceiptPublicKey = receipt.Fingerprint(pub), string(receipt.MarshalPublicKey(pub))
	if e := s.reloadErr.Load(); e != nil {
		st.PolicyError = (*e).Error()
	}
	if g, ok := s.pol.Load().GrantOf(id); ok {
		st.Caller = &wire.Grant{Profile: g.Profile, Image: g.Image, Images: g.Images, Shell: g.Shell, Sessions: g.Sessions, Network: g.Network, Allow: g.Allow}
	}
	for _, ss := range s.host.Stats() {
		p := ss.Pool
		st.Pools = append(st.Pools, wire.Pool{Image: ss.Image, MemoryMiB: ss.MemoryMiB, CPUs: ss.CPUs, DiskMiB: ss.DiskMiB, Seccomp: ss.Seccomp, Network: ss.Network,
			Ready: p.Ready, Size: p.Size, Hits: p.Hits, Misses: p.Misses, Restored: p.Restored, Failures: p.Failures, Shrunk: p.Shrunk,
			Ahead: p.Ahead, AheadSize: p.AheadSize, AheadUsed: p.AheadUsed, AheadFailed: p.AheadFailed,
			RestoreHandshakeFailures: ss.HandshakeFailures})
	}
	owner := id.Key()
	if st.All {
		owner = ""
	}
	st.VMs, st.Sessions = s.live.of(owner), s.sessions.list(owner, true)
	return st
}

// mayRotateAudit reports whether id may move the audit log aside: root
// and the daemon's own user (daemonUID) as local callers, and the local
// callers of a profile with audit_rotate = true. admin = true does not
// grant it (issue 30, finding 5).
func mayRotateAudit(p *policy.Policy, id policy.Identity, daemonUID int) bool {
	return id.Local() && (id.UID == 0 || int(id.UID) == daemonUID) || p.MayRotateAudit(id)
}

// handleAuditRotate moves the audit log to PATH.TIMESTAMP (never onto an
// existing file) and continues the chain in a new file (vmgated audit
// rotate).
func (s *Server) handleAuditRotate(w http.ResponseWriter, r *http.Request) {
	id, err := identityFrom(r.Context())
	if err != nil {
		refuse(w, wire.KindUnidentified, err.Error())
		return
	}
	if !mayRotateAudit(s.pol.Load(), id, os.Getuid()) {
		refuse(w, wire.KindDenied, "only root, vmgated's user and profiles with audit_rotate = true may rotate the audit log")
		return
	}
	to, err := s.rec.Rotate()
	if err != nil {
		refuse(w, wire.KindInternal, err.Error())
		return
	}
	seq, head := s.rec.Head()
	s.log.Info("audit log rotated", "to", to, "seq", seq, "head", head, "by", describeCaller(id))
	writeJSON(w, wire.Rotation{RotatedTo: to, Seq: seq, Head: head})
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	id, err := identityFrom(r.Context())
	if err != nil {
		refuse(w, wire.KindUnidentified, err.Error())
		return
	}
	writeJSON(w, s.status(id))
}
