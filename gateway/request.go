package gateway

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// newRequestID returns a fresh request id for the audit log and the caller.
func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// request is what a caller's request of any kind (a command, an
// operation on a session, a publication) has: its id, its caller, the
// policy that decided it and the verdict, and what its records and
// receipt need.
type request struct {
	reqID   string
	id      policy.Identity
	start   time.Time
	policy  *policy.Policy
	verdict policy.Verdict
	// netLock is the session's network lock the decision saw: the
	// request runs only if the session has the same when it gets it.
	netLock *policy.NetLimit
	// For its receipt (receipts.go): where its last audit record went
	// (nil: none of its own, auditNote says why), and what its guest did
	// on the network.
	recorded  *audit.Entry
	auditNote string
	net       netSummary
}

// execState is a command's request, and what its records need.
type execState struct {
	request
	argv []string
	req  *wire.ExecRequest
	// interactive marks a login shell on a terminal (SSH without a
	// command); argv is then the shell.
	interactive bool
	// refused is a front door's own refusal of the request (an SSH login
	// it cannot serve): the core audits it as a denial, without a policy
	// decision.
	refused error
	// detach starts the command as a background process of its session.
	detach bool
	// image is the image of the session the command runs in, when that
	// session exists as it is decided: the command is decided in it
	// unless the request names one (which must then be the same, or the
	// command is refused when it gets the session: sessions.vmFor).
	image string
	// env and dir are the command's environment and working directory
	// once it is allowed: the verdict's environment and the request's
	// directory, under the defaults of the image it runs in (its Env and
	// WorkingDir: vm.ImageSource.CommandEnv, CommandDir).
	env []string
	dir string
	// imageUser is the configured user of the image the command is
	// decided in (vm.ImageSource.CommandUser): the policy makes it the
	// command's default user when it is one of the profile's users.
	imageUser string
	// imageSrc is where that image came from and its configuration, as
	// the image is now, or as it was when the command's session began
	// (sessionRecord.ImageSource); nil: a built image. Its manifest
	// digest is what a pin in the profile's images must match.
	imageSrc *vm.ImageSource
	// heldSecrets are the secrets of the session the command runs in,
	// as the decision saw them.
	heldSecrets []string
}

// newExecState starts the record of a command from id. The argv decided
// on is req.Argv, or ["sh", "-c", STRING] for a shell string. An
// interactive request without argv gets its image's login shell when it
// is decided (Server.decide).
func newExecState(id policy.Identity, req *wire.ExecRequest, interactive bool) *execState {
	st := &execState{request: request{reqID: newRequestID(), id: id, start: time.Now()}, req: req, argv: req.Argv, interactive: interactive}
	if req.Shell && len(req.Argv) == 1 {
		st.argv = []string{"sh", "-c", req.Argv[0]}
	}
	return st
}

// decisionRecord is what a command's decision record says of it.
func (st *execState) decisionRecord() audit.Record {
	rec := audit.Record{Argv: st.argv, Shell: st.req.Shell, Session: st.req.Session,
		EnvNames: envNames(st.req.Env), Dir: st.req.Dir, TTY: st.req.TTY != nil, Transfers: auditTransfers(st.req, nil), GuestUser: st.req.User,
		Image: cmp.Or(st.req.Image, st.image)}
	if st.verdict.Allowed {
		// What the policy decided: the user and the image it runs as and
		// in. A denial keeps what was asked for.
		rec.GuestUser, rec.Image = st.verdict.User, st.verdict.Image
		rec.Secrets = secretNames(st.verdict.Secrets)
	} else {
		rec.Secrets = st.req.Secrets
	}
	switch {
	case st.interactive:
		rec.Message = "interactive shell"
	case st.detach:
		rec.Message = "background process"
	}
	return rec
}

// policyRequest is the command as the policy decides it.
func (st *execState) policyRequest() policy.Request {
	return policy.Request{Argv: st.argv, Shell: st.req.Shell, Session: st.req.Session, Interactive: st.interactive,
		Timeout: time.Duration(st.req.TimeoutMS) * time.Millisecond, Env: st.req.Env,
		Puts: uploads(st.req.Put), Gets: len(st.req.Get), Net: (*policy.NetLimit)(st.req.Net), NetLock: st.netLock, User: st.req.User, Detach: st.detach,
		Image: cmp.Or(st.req.Image, st.image), ImageUser: st.imageUser, ImageManifestDigest: manifestDigest(st.imageSrc), Secrets: st.req.Secrets, HeldSecrets: st.heldSecrets}
}

// sessionRequest is an operation on a session itself (pause, fork, a
// network lock): decided by the policy and audited as a command is, and
// run as the session's owner.
type sessionRequest struct {
	request
	// name is the session's; what is the operation, as its decision
	// record names it ("pause", "fork a b", "net-lock …"); process the
	// background process it is on, if any.
	name, what string
	process    int64
	// image is the session's image: the policy decides the operation
	// in it.
	image string
}

// newSessionRequest starts the record of an operation of id's, named
// what, on session ss.
func newSessionRequest(id policy.Identity, ss *session, what string) *sessionRequest {
	return &sessionRequest{request: request{reqID: newRequestID(), id: id, start: time.Now()}, name: ss.Name, what: what, image: ss.image()}
}

// decisionRecord is what a session operation's decision record says.
func (q *sessionRequest) decisionRecord() audit.Record {
	return audit.Record{Session: q.name, Message: q.what, Process: q.process}
}

// envNames returns the names of KEY=VALUE entries: the audit records
// which variables a request set, never their values.
func envNames(env []string) []string {
	var out []string
	for _, e := range env {
		name, _, _ := strings.Cut(e, "=")
		out = append(out, name)
	}
	return out
}

// uploads is what a request's puts declare, for the policy.
func uploads(puts []wire.PutSpec) []policy.Upload {
	var out []policy.Upload
	for _, p := range puts {
		out = append(out, policy.Upload{Files: p.Files, Bytes: p.Bytes})
	}
	return out
}
