package gateway

// Receipts: a request that asks for one (wire.ExecRequest.Receipt) gets a
// signed receipt of what happened to it (package receipt): in its result,
// or in the refusal or failure that ended it once its decision was
// recorded. The exec core calls signReceipt after the request's last
// audit record; receiptBody is the pure part.

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm/netstack"
)

// loadReceiptKey loads the signing key cfg names, or STATE/receipt.key,
// which it creates at the daemon's first start. Any other trouble with
// the key (missing after a first start, unreadable, open to others, not a
// key) stops the daemon: it never runs without receipts.
func loadReceiptKey(cfg Config, log *slog.Logger) (ed25519.PrivateKey, error) {
	path, create := cfg.ReceiptKey, false
	if path == "" {
		path, create = filepath.Join(cfg.VM.StateDir, receipt.DefaultKeyFile), true
	}
	key, created, err := receipt.LoadOrCreateKey(path, create)
	if err != nil {
		return nil, fmt.Errorf("refusing to start without the receipt signing key: %w", err)
	}
	fp := receipt.Fingerprint(key.Public().(ed25519.PublicKey))
	if created {
		log.Info("receipt signing key created (first start): back it up; its public half verifies receipts", "key", path, "public", receipt.PublicPath(path), "fingerprint", fp)
	} else {
		log.Info("receipt signing key", "key", path, "fingerprint", fp)
	}
	return key, nil
}

// receiptFacts is what a receipt says beyond the request and its
// outcome: the policy that decided, the image's digests (its base's and
// its manifest's, if it has one), where the request's record is in the
// audit chain and the chain's head.
type receiptFacts struct {
	policySource, policyDigest string
	imageDigest, imageManifest string
	record                     *audit.Entry // nil: no record of its own
	auditNote                  string
	headSeq                    uint64
	head                       string
	now                        time.Time
}

// receiptBody builds the body of st's receipt (pure).
func receiptBody(st *execState, o execOutcome, f receiptFacts) receipt.Body {
	v := st.verdict
	b := receipt.Body{RequestID: st.reqID, Verdict: receipt.VerdictDeny, Rule: v.Rule, Reason: v.Reason, Profile: v.Profile,
		Policy: receipt.Policy{Source: f.policySource, SHA256: f.policyDigest},
		Argv:   receipt.ArgvOf(st.argv), Shell: st.req.Shell, Session: st.req.Session,
		EnvNames: envNames(st.req.Env), Dir: st.req.Dir, TTY: st.req.TTY != nil,
		Start: st.start.UTC(), End: f.now.UTC(),
		Stdin: emptyOr(o.stdin), Stdout: emptyOr(o.stdout), Stderr: emptyOr(o.stderr),
		Network: st.net.summary(v.Network), AuditNote: f.auditNote}
	if v.Allowed {
		b.Verdict, b.Reason = receipt.VerdictAllow, ""
		b.Image = &receipt.Image{Name: v.Image, SHA256: f.imageDigest, ManifestDigest: f.imageManifest}
		b.GuestUser = v.User
	}
	b.Network.Narrowed = v.NetNarrowed
	setReceiptCaller(&b.Caller, st.id)
	if t := o.target; t != nil {
		b.VMID = t.vm.ID
	}
	if res := o.res; res != nil {
		code := res.ExitCode
		b.ExitCode, b.Signal, b.TimedOut = &code, res.Signal, res.TimedOut
		b.OutputTruncated = res.StdoutTruncated || res.StderrTruncated
	}
	if o.err != nil {
		b.Error = clientMessage(o.err)
	}
	for _, t := range o.transfers {
		b.Transfers = append(b.Transfers, receipt.Transfer{Direction: t.Direction, Guest: t.Guest, Files: t.Files, Bytes: t.Bytes,
			SHA256: t.SHA256, FileSHA256: t.FileSHA256, Error: t.Error})
	}
	if e := f.record; e != nil {
		b.Audit = &receipt.AuditRef{Seq: e.Seq, Hash: e.Hash, HeadSeq: max(f.headSeq, e.Seq), Head: f.head}
		if f.headSeq < e.Seq {
			b.Audit.Head = e.Hash
		}
	}
	return b
}

// setReceiptCaller fills in c from id, as setCaller does an audit record.
func setReceiptCaller(c *receipt.Caller, id policy.Identity) {
	if k := id.SSH; k != nil {
		if k.Door == policy.DoorE2B {
			c.E2BKey = k.Fingerprint
		} else {
			c.SSHKey = k.Fingerprint
		}
		return
	}
	uid, gid := id.UID, id.GID
	c.UID, c.GID, c.PID, c.User = &uid, &gid, id.PID, id.User
}

// emptyOr is s, or the empty stream's when s was never set.
func emptyOr(s receipt.Stream) receipt.Stream {
	if s.SHA256 == "" {
		return receipt.StreamOf(nil)
	}
	return s
}

// signReceipt returns st's signed receipt, or nil when it did not ask for
// one (or it could not be made: logged). Call it after the request's
// last audit record (st.recorded).
func (s *Server) signReceipt(st *execState, o execOutcome) json.RawMessage {
	if !st.req.Receipt {
		return nil
	}
	f := receiptFacts{policySource: st.policy.Source(), policyDigest: st.policy.Digest(), record: st.recorded, auditNote: st.auditNote, now: time.Now()}
	if st.verdict.Allowed {
		f.imageDigest = s.host.ImageDigestOf(st.verdict.Image)
		f.imageManifest = manifestDigest(st.imageSrc)
	}
	f.headSeq, f.head = s.rec.Head()
	b := receiptBody(st, o, f)
	doc, err := receipt.Sign(s.receiptKey, &b)
	if err != nil {
		s.log.Error("receipt not signed", "req", st.reqID, "err", err)
		return nil
	}
	return doc
}

// netSummary collects what a request's guest did on the network, from
// its network audit hook, for its receipt.
type netSummary struct {
	mu           sync.Mutex
	conns, refus int
	dns          int
	dests        []receipt.Destination
	omitted      int
}

// add counts one network event.
func (n *netSummary) add(r netstack.Record) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case r.Proto == "dns":
		n.dns++
	case r.Allowed:
		n.conns++
	default:
		n.refus++
	}
	d := receipt.Destination{Proto: r.Proto, Name: r.Name, Port: r.Port, Allowed: r.Allowed}
	if r.Addr.IsValid() {
		d.Addr = r.Addr.String()
	}
	if !r.Allowed {
		d.Reason = r.Reason
	}
	for i := range n.dests {
		x := &n.dests[i]
		if x.Proto == d.Proto && x.Name == d.Name && x.Addr == d.Addr && x.Port == d.Port && x.Allowed == d.Allowed {
			x.Count++
			return
		}
	}
	if len(n.dests) >= receipt.MaxDestinations {
		n.omitted++
		return
	}
	d.Count = 1
	n.dests = append(n.dests, d)
}

// summary is the receipt's network section under egress policy p (nil:
// no NIC).
func (n *netSummary) summary(p *policy.NetworkPolicy) receipt.Network {
	out := receipt.Network{Mode: "none"}
	if p != nil {
		out.Mode, out.Allow = "allowlist", p.Allowlist()
	}
	if n == nil {
		return out
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	out.Connections, out.Refused, out.DNS = n.conns, n.refus, n.dns
	out.Destinations = append([]receipt.Destination(nil), n.dests...)
	out.Omitted = n.omitted
	return out
}
