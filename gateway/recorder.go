package gateway

// What the daemon records of every request: its decision, its outcome,
// its guest's network events and its sessions' lives, in the audit log
// (package audit), with the metrics beside. Records that nothing ran for
// (denials, refused network events) pass a flood gate per source
// (floodgate.go): a hostile caller or guest makes them at will.

import (
	"log/slog"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm/netstack"
)

// recorder writes the daemon's audit records. Safe for concurrent use.
type recorder struct {
	*audit.Log
	// deny and net bound the denied requests of a caller and the refused
	// network events of a VM (or a published port); fwd the connections
	// a published port carries.
	deny, net, fwd *floodGate
	metrics        *metrics
	log            *slog.Logger
}

// A published port's forwarded connections are recorded one by one up to
// fwdRecordBurst at once and fwdRecordRate a second; the rest are counted
// in summary records.
const (
	fwdRecordRate  = 1
	fwdRecordBurst = 20
)

// floodQuiet is how long a source must be quiet before the summary of its
// held records is written without waiting for its next record.
const floodQuiet = 2 * time.Second

func newRecorder(l *audit.Log, f AuditFlood, m *metrics, log *slog.Logger) *recorder {
	return &recorder{Log: l, metrics: m, log: log,
		deny: newFloodGate("denied requests", f.DenyRate, f.DenyBurst),
		net:  newFloodGate("refused network events", f.NetRate, f.NetBurst),
		fwd:  newFloodGate("forwarded connections", fwdRecordRate, fwdRecordBurst)}
}

// sweeper writes the summaries of quiet sources once a second until
// stop is called, which writes every summary still pending.
func (r *recorder) sweeper() (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				r.sweep(time.Now().Add(-floodQuiet))
			case <-quit:
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-done
		r.sweep(time.Now().Add(time.Hour))
	}
}

// sweep writes the summaries of the sources quiet since before idle.
func (r *recorder) sweep(idle time.Time) {
	for _, g := range []*floodGate{r.deny, r.net, r.fwd} {
		for _, rec := range g.sweep(idle) {
			if err := r.Write(rec); err != nil {
				r.log.Error("audit summary record", "err", err)
			}
		}
	}
}

// gated writes rec through gate g under key: held back when the source is
// over its rate, preceded by the summary of what was held. It returns
// where rec went, nil when it was held back.
func (r *recorder) gated(g *floodGate, key string, rec audit.Record) (*audit.Entry, error) {
	write, summary := g.admit(key, rec, time.Now())
	if summary != nil {
		if err := r.Write(*summary); err != nil {
			return nil, err
		}
	}
	if !write {
		return nil, nil
	}
	e, err := r.Append(rec)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// flushNet writes the summaries of key's held network records now (its
// VM or its published port is gone).
func (r *recorder) flushNet(key string) {
	for _, g := range []*floodGate{r.net, r.fwd} {
		if rec := g.flush(key); rec != nil {
			if err := r.Write(*rec); err != nil {
				r.log.Error("audit summary record", "err", err)
			}
		}
	}
}

// decision records q's verdict: rec carries what q's kind of request
// asked for (its argv, its session, what it does), and decision fills in
// the rest: who asked, which profile and rule decided, and with which
// network. A denial passes the caller's flood gate; where q's decision
// went (or why it went nowhere) is kept for q's receipt.
func (r *recorder) decision(q *request, rec audit.Record) error {
	v := q.verdict
	rec.Kind, rec.RequestID = audit.KindDecision, q.reqID
	rec.Profile, rec.Rule, rec.Reason = v.Profile, v.Rule, v.Reason
	rec.Verdict = audit.VerdictDeny
	if v.Allowed {
		rec.Verdict = audit.VerdictAllow
	}
	setCaller(&rec, q.id)
	rec.Network = auditNetwork(v)
	r.metrics.request(v.Profile, string(rec.Verdict))
	if v.Allowed {
		e, err := r.Append(rec)
		if err == nil {
			q.recorded = &e
		}
		return err
	}
	e, err := r.gated(r.deny, q.id.Key(), rec)
	if e == nil && err == nil {
		q.auditNote = "the denial was held back by the audit flood gate and counted in a summary record"
	}
	q.recorded = e
	return err
}

// netHook returns the audit hook of a VM's network while q owns it: one
// KindNet record per DNS query and connection, tied to q and the VM.
func (r *recorder) netHook(q *request, vmID string) func(netstack.Record) {
	return func(nr netstack.Record) {
		q.net.add(nr)
		rec := audit.Record{Kind: audit.KindNet, RequestID: q.reqID, Profile: q.verdict.Profile,
			VMID: vmID, Verdict: audit.VerdictDeny, Rule: nr.Rule, Reason: nr.Reason,
			Net: &audit.NetEvent{Proto: nr.Proto, Name: nr.Name, Port: nr.Port, BytesOut: nr.BytesOut, BytesIn: nr.BytesIn, DurationMS: nr.Duration.Milliseconds(),
				Intercepted: nr.Intercepted, Secret: nr.Secret, SecretPlace: nr.SecretPlace}}
		setCaller(&rec, q.id)
		// A connection cut for a secret's placeholder where it may not
		// go is a refusal, though the allowlist let it start.
		if nr.Allowed && nr.Secret == "" {
			rec.Verdict = audit.VerdictAllow
		}
		r.metrics.netConn(string(rec.Verdict))
		if nr.Addr.IsValid() {
			rec.Net.Addr = nr.Addr.String()
		}
		// Only allowed connections are recorded one by one: refused
		// events and DNS answers (allowed or not) are what a guest can
		// make at will, so they pass the per-VM flood gate.
		var err error
		if nr.Allowed && nr.Proto == "tcp" || nr.Secret != "" {
			err = r.Write(rec)
		} else {
			_, err = r.gated(r.net, vmID, rec)
		}
		if err != nil {
			r.log.Error("audit network event", "err", err)
		}
	}
}

// auditNetwork is the network of verdict v for its audit records; nil
// when its VM has no NIC (or it was refused). It lists what the receipt
// lists (netSummary.summary): both are v's egress as Egress.Allowlist
// spells it.
func auditNetwork(v policy.Verdict) *audit.NetVerdict {
	if v.Network == nil {
		return nil
	}
	return &audit.NetVerdict{Allow: v.Network.Allowlist(), Narrowed: v.NetNarrowed}
}

// setCaller fills in rec's caller fields from id: the SO_PEERCRED identity
// of a local caller, or the key of an SSH one.
func setCaller(rec *audit.Record, id policy.Identity) {
	if k := id.SSH; k != nil {
		rec.SSH = &audit.SSHClient{Door: k.Door, Fingerprint: k.Fingerprint, Comment: k.Comment, User: k.User, Remote: k.RemoteAddr}
		return
	}
	uid, gid := id.UID, id.GID
	rec.UID, rec.GID, rec.PID, rec.User = &uid, &gid, id.PID, id.User
}
