package e2bfront

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

// The sandbox side: what E2B's in-sandbox agent (envd) serves, answered
// by the daemon's session API. A call names its sandbox in the
// E2b-Sandbox-Id header and proves it may use it with the sandbox's access
// token (X-Access-Token), or, for /files, a URL signed with it.

// envdCall is an authenticated call on a sandbox.
type envdCall struct {
	rec sandboxRecord
	api *client.Client
	// user is the guest user the call runs as: "" for the profile's (E2B's
	// "user"), else the name the client gave.
	user string
}

func (f *Front) envdRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /health", f.health)
	mux.HandleFunc("GET /files", f.files(opRead, f.readFile))
	mux.HandleFunc("POST /files", f.files(opWrite, f.writeFiles))
	for name, h := range map[string]func(http.ResponseWriter, *http.Request, *envdCall){
		"/process.Process/Start":          f.startProcess,
		"/process.Process/Connect":        f.connectProcess,
		"/process.Process/List":           f.listProcesses,
		"/process.Process/SendInput":      f.sendInput,
		"/process.Process/CloseStdin":     f.closeStdin,
		"/process.Process/SendSignal":     f.sendSignal,
		"/process.Process/Update":         f.update,
		"/process.Process/StreamInput":    f.unimplemented("StreamInput (use SendInput)"),
		"/filesystem.Filesystem/Stat":     f.stat,
		"/filesystem.Filesystem/ListDir":  f.listDir,
		"/filesystem.Filesystem/MakeDir":  f.makeDir,
		"/filesystem.Filesystem/Move":     f.move,
		"/filesystem.Filesystem/Remove":   f.remove,
		"/filesystem.Filesystem/WatchDir": f.unimplemented("WatchDir"),
	} {
		mux.HandleFunc("POST "+name, f.rpc(h))
	}
}

// sandboxOf authenticates a sandbox call by id and token (or signature,
// when sig is set and valid). It returns a message to refuse with.
func (f *Front) sandboxOf(r *http.Request, sig func(rec sandboxRecord) bool) (*envdCall, string) {
	sid := r.Header.Get("E2b-Sandbox-Id")
	if sid == "" {
		return nil, "no sandbox id (E2b-Sandbox-Id): set E2B_SANDBOX_URL to this door"
	}
	rec, ok := f.boxes.byToken(sid, r.Header.Get("X-Access-Token"))
	if !ok && sig != nil {
		if cand, found := f.boxes.peek(sid); found && sig(cand) {
			rec, ok = cand, true
		}
	}
	if !ok {
		return nil, "sandbox unknown, or its access token wrong"
	}
	k := f.keys.Load().byFingerprint(rec.Key)
	if k == nil {
		return nil, "the sandbox's API key is no longer in the door's keys file"
	}
	return &envdCall{rec: rec, api: f.apiFor(caller(k, r.RemoteAddr))}, ""
}

// rpc authenticates a Connect call and checks its content type.
func (f *Front) rpc(h func(http.ResponseWriter, *http.Request, *envdCall)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		stream, ok := contentKind(r)
		fail := func(err error) {
			if stream {
				startStream(w).end(err)
				return
			}
			writeUnary(w, nil, err)
		}
		if !ok {
			w.WriteHeader(http.StatusUnsupportedMediaType)
			return
		}
		c, msg := f.sandboxOf(r, nil)
		if c == nil {
			fail(rpcErr(codeUnauthenticated, "%s", msg))
			return
		}
		user, err := basicUser(r.Header.Get("Authorization"))
		if err != nil {
			fail(rpcErr(codeUnauthenticated, "%v", err))
			return
		}
		c.user = mapUser(user)
		r.Body = http.MaxBytesReader(w, r.Body, f.cfg.MaxBody)
		h(w, r, c)
	}
}

func (f *Front) unimplemented(what string) func(http.ResponseWriter, *http.Request, *envdCall) {
	return func(w http.ResponseWriter, r *http.Request, _ *envdCall) {
		err := rpcErr(codeUnimplemented, "%s is not served by vmgate's E2B door", what)
		if stream, _ := contentKind(r); stream {
			startStream(w).end(err)
			return
		}
		writeUnary(w, nil, err)
	}
}

// basicUser reads the user of "Basic base64(user:)"; "" when absent.
func basicUser(h string) (string, error) {
	if h == "" {
		return "", nil
	}
	enc, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return "", errors.New("authorization: want Basic with the user name")
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", errors.New("authorization: not base64")
	}
	user, _, _ := strings.Cut(string(raw), ":")
	return user, nil
}

// mapUser maps E2B's user names onto the profile's: "user", E2B's default,
// is the profile's own user; any other name (root) is asked for as it is,
// and the policy's users decide.
func mapUser(u string) string {
	if u == "user" {
		return ""
	}
	return u
}

// health answers 204 for a sandbox that is there, 502 otherwise (the
// SDKs read 502 as "the sandbox is gone").
func (f *Front) health(w http.ResponseWriter, r *http.Request) {
	c, _ := f.sandboxOf(r, nil)
	if c == nil {
		filesError(w, http.StatusBadGateway, "sandbox not running")
		return
	}
	if s := f.session(r.Context(), c.api, c.rec.ID); s == nil || s.State != wire.SessionRunning {
		filesError(w, http.StatusBadGateway, "sandbox not running (paused or ended)")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// apiToRPC maps the daemon's refusal onto a Connect error.
func apiToRPC(what string, err error) *rpcError {
	var ae *client.APIError
	if !errors.As(err, &ae) {
		if errors.Is(err, context.Canceled) {
			return rpcErr(codeCanceled, "%s: %v", what, err)
		}
		return rpcErr(codeUnavailable, "%s: %v", what, err)
	}
	msg := what + ": " + ae.Body.Message()
	switch ae.Body.FileError {
	case wire.FileNotFound:
		return &rpcError{Code: codeNotFound, Message: msg}
	case wire.FileExists:
		return &rpcError{Code: codeAlreadyExists, Message: msg}
	case wire.FileDenied:
		return &rpcError{Code: codePermissionDenied, Message: msg}
	case wire.FileNotDir, wire.FileIsDir:
		return &rpcError{Code: codeInvalidArgument, Message: msg}
	case wire.FileTooBig:
		return &rpcError{Code: codeResourceExhausted, Message: msg}
	}
	code := codeInternal
	switch ae.Body.Code {
	case wire.CodeDenied:
		code = codePermissionDenied
	case wire.CodeBadRequest:
		code = codeInvalidArgument
	case wire.CodeNotFound:
		code = codeNotFound
	case wire.CodeBusy:
		code = codeResourceExhausted
	case wire.CodeShutdown, wire.CodeAudit:
		code = codeUnavailable
	}
	return &rpcError{Code: code, Message: msg}
}

// Signed URLs (sandbox.uploadUrl, downloadUrl): "v1_" and the unpadded
// base64 of SHA-256("PATH:OP:USER:TOKEN[:EXPIRY]").
const (
	opRead  = "read"
	opWrite = "write"
)

func signature(path, op, user, token string, exp int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signedOK checks a /files request's signature against rec's token.
func signedOK(r *http.Request, op string, rec sandboxRecord, now time.Time) bool {
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return false
	}
	var exp int64
	if s := q.Get("signature_expiration"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || now.Unix() > n {
			return false
		}
		exp = n
	}
	want := signature(q.Get("path"), op, q.Get("username"), rec.Token, exp)
	return len(sig) == len(want) && constantEq(sig, want)
}

// SecretMarker, as a variable's value in a sandbox's envVars or a
// process's envs, asks for the policy's secret of the variable's name
// instead (docs/secrets.md): the command sees its placeholder there.
const SecretMarker = "vmgate:secret"

// procEnv is a command's environment: the call's variables over the
// sandbox's, as KEY=VALUE, and the secrets those marked SecretMarker ask
// for, sorted.
func procEnv(sandbox, call map[string]string) (env, secrets []string) {
	seen := map[string]bool{}
	for _, m := range []map[string]string{call, sandbox} {
		for k, v := range m {
			if seen[k] {
				continue
			}
			seen[k] = true
			if v == SecretMarker {
				secrets = append(secrets, k)
			} else {
				env = append(env, k+"="+v)
			}
		}
	}
	slices.Sort(secrets)
	return env, secrets
}

// timeoutMS is a stream's Connect-Timeout-Ms (0: none).
func timeoutMS(r *http.Request) (int64, error) {
	s := r.Header.Get("Connect-Timeout-Ms")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || len(s) > 10 {
		return 0, rpcErr(codeInvalidArgument, "Connect-Timeout-Ms %q: want at most 10 digits", truncate(s, 20))
	}
	return n, nil
}
