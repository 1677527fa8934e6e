package gateway

// A command in a session: the exec core asks the sessions for the VM of
// the caller's session the command names (vmFor), and gives it back when
// the command is over (release).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netstack"
)

// vmFor is the VM of the caller's session named in st: a running
// session's, or a paused one's resumed, or a new session's. A session
// busy with the same caller's previous command (whose client may just
// have gone: a pipeline's head) is waited for, as long as a VM slot is
// (queueWait); a session that was lost is said so, once.
func (x *sessions) vmFor(ctx context.Context, st *execState) (*vmTarget, error) {
	// Sessions belong to their caller: a uid, or an SSH key.
	key := sessionKey{st.id.Key(), st.req.Session}
	for {
		ss := x.get(key)
		if ss == nil {
			if why := x.lost.take(key); why != "" {
				return nil, lostError(key.name, why)
			}
			return x.create(ctx, st, key)
		}
		if err := ss.share(ctx, x.queueWait, max(st.verdict.Limits.MaxCommands, 1)); err != nil {
			if errors.Is(err, errSessionEnded) {
				continue // ended meanwhile: this command starts a new one
			}
			return nil, err
		}
		// The reaper runs once a second and skips busy sessions: the
		// lifetime is enforced here, on every use, as well. An expired
		// session is ended as the reaper would, and this command starts
		// a new one.
		if !time.Now().Before(ss.expiry()) {
			x.destroy(ss, "expired")
			continue
		}
		if rerr := checkNetLock(ss, &st.request); rerr != nil {
			ss.unshare(true)
			return nil, rerr
		}
		if rerr := checkImage(ss, st); rerr != nil {
			ss.unshare(true)
			return nil, rerr
		}
		if ss.state() == statePaused {
			if err := x.resumeFor(ctx, ss, &st.request); err != nil {
				if errors.Is(err, errSessionEnded) {
					continue
				}
				return nil, err
			}
		}
		limitToLifetime(st, ss)
		t := &vmTarget{vm: ss.running(), session: ss}
		t.jail = jailOf(t.vm)
		if err := x.armSession(ctx, ss, st.verdict.Secrets); err != nil {
			x.release(t, true)
			return nil, &RequestError{Kind: ErrVMFailed, RequestID: st.reqID, Msg: fmt.Sprintf("session %q: %v", ss.Name, err)}
		}
		if err := x.network(st, t); err != nil {
			x.release(t, true)
			return nil, err
		}
		return t, nil
	}
}

// imageOf is the image of the session of key and where it came from when
// the session began (sessionRecord.ImageSource); "" and nil when there is
// no such session.
func (x *sessions) imageOf(key sessionKey) (image string, src *vm.ImageSource) {
	if ss := x.get(key); ss != nil {
		return ss.image(), ss.ImageSource
	}
	return "", nil
}

// checkImage refuses st if it was decided in another image than its
// session's: it names another (a session keeps the image it began with),
// or the session it was decided for ended and another of its name began
// meanwhile in another.
func checkImage(ss *session, st *execState) *RequestError {
	if img := ss.image(); st.verdict.Image != img {
		return &RequestError{Kind: ErrBadRequest, RequestID: st.reqID, Profile: st.verdict.Profile,
			Msg: fmt.Sprintf("session %q runs in image %q, not %q: a session keeps the image it began with; end it, or start another session, to run in another image", ss.Name, img, st.verdict.Image)}
	}
	return nil
}

// create makes the caller's new session key, with a fresh VM.
func (x *sessions) create(ctx context.Context, st *execState, key sessionKey) (*vmTarget, error) {
	v := st.verdict
	t, err := x.core.boot(ctx, st)
	if err != nil {
		return nil, err
	}
	ss := newSession(newSessionRecord(key, st.id, v, x.core.shape(v), time.Now()))
	ss.ImageSource = st.imageSrc
	ss.vm, ss.slot = t.vm, t.slot
	ss.Secrets, t.secrets = t.secrets, nil // boot armed them
	ss.net = sessionNet{last: (*policy.NetLimit)(st.req.Net), audit: x.rec.netHook(&st.request, t.vm.ID)}
	if err := x.register(ss, &st.request, "created", audit.Record{}); err != nil {
		_ = t.vm.Close()
		t.slot()
		var rerr *RequestError
		if errors.As(err, &rerr) {
			return nil, err
		}
		return nil, &RequestError{Kind: ErrVMFailed, Msg: "start session: " + err.Error()}
	}
	ss.toShared() // its first command runs now; others may join it
	limitToLifetime(st, ss)
	t.session, t.slot = ss, nil
	return t, nil
}

// release ends a command's use of its session's VM: kept for the next
// one, unless it is not fit for use (ok false: it failed, or the
// command's stream broke): the session then ends.
func (x *sessions) release(t *vmTarget, ok bool) {
	if !ok {
		x.destroy(t.session, "vm failed")
	}
	t.session.unshare(true)
}

// resumeFor resumes the paused session ss for q's command, which has a
// share of it: the share is given up while q waits to own the session
// alone (the commands that run in a session that is being resumed are
// none), and is q's again once it runs, resumed by q or by another
// request meanwhile.
func (x *sessions) resumeFor(ctx context.Context, ss *session, q *request) error {
	ss.unshare(false)
	if err := ss.take(ctx, x.queueWait); err != nil {
		return err
	}
	if ss.state() == statePaused {
		if err := x.resume(ctx, ss, q); err != nil {
			ss.give(false)
			return err
		}
	}
	ss.toShared()
	return nil
}

// limitToLifetime ends a session's command, at the latest, when the
// session's lifetime ends: chained commands cannot outlive max_lifetime.
func limitToLifetime(st *execState, ss *session) {
	left := time.Until(ss.Created.Add(ss.Max))
	if t := &st.verdict.Limits.Timeout; *t == 0 || left < *t {
		*t = max(left, time.Second)
	}
}

// network gives a reused session VM's network st's verdict (the policy
// may have been reloaded since the session began) and audit, so that its
// connections are recorded as st's. A session without a NIC cannot get
// one: the caller must end it first.
func (x *sessions) network(st *execState, t *vmTarget) error {
	n := st.verdict.Network
	if t.vm.Network() == nil && n != nil && len(n.Rules) > 0 {
		return &RequestError{Kind: ErrBadRequest, RequestID: st.reqID, Msg: fmt.Sprintf("session %q has no network (it began before the profile had one): end the session to start it again with one", st.req.Session)}
	}
	hook := x.rec.netHook(&st.request, t.vm.ID)
	t.session.mu.Lock()
	t.session.net = sessionNet{last: (*policy.NetLimit)(st.req.Net), audit: hook}
	k := t.session.Secrets
	t.session.mu.Unlock()
	x.setNetwork(t.vm, n, hook, k, st.verdict.Secrets)
	return nil
}

// setNetwork gives v's network (if it has a NIC) egress e, nil for none,
// with its events audited by hook, and the secrets of k that grants
// grant; it returns once the VM's netstack has it in force. A kit whose
// CA does not parse (a damaged session file) gives the network no
// secret: their placeholders go out as they are, useless.
func (x *sessions) setNetwork(v *vm.VM, e *netrule.Egress, hook func(netstack.Record), k *secretKit, grants []policy.Secret) {
	vn := v.Network()
	if vn == nil {
		return
	}
	pol, err := netPolicy(e, hook, k, grants)
	if err != nil {
		x.log.Error("a VM's network without its secrets", "vm", v.ID, "err", err)
	}
	vn.SetPolicy(pol)
}

// renetwork re-decides every running session's network under pol (a
// reload), as its profile, its lock and its last command's limit make it
// now (policy.SessionNetwork), and returns once each VM's netstack has it
// in force. Its events stay the last request's.
func (x *sessions) renetwork(pol *policy.Policy) {
	for _, ss := range x.all() {
		ss.mu.Lock()
		v, sn, lock := ss.vm, ss.net, ss.NetLock
		if ss.State != stateRunning {
			v = nil
		}
		ss.mu.Unlock()
		if v == nil || v.Network() == nil {
			continue
		}
		e, _ := pol.SessionNetwork(ss.Caller, lock, sn.last)
		k := ss.kit()
		x.setNetwork(v, e, sn.audit, k, pol.SessionSecrets(ss.Caller, k.names()))
		allow := []string{}
		if e != nil {
			allow = e.Allowlist()
		}
		x.audit(ss, nil, audit.Record{VMID: v.ID, Message: "network re-decided by the reloaded policy: allow [" + strings.Join(allow, " ") + "]"})
	}
}
