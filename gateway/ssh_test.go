package gateway

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/sshfront"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/image"
)

// sshUnitPolicy gives key profiles that never reach a VM in these tests.
const sshUnitPolicy = `version = 1
[[profile]]
name = "agent"
match = { ssh = true }
allow_shell = true
env = ["GREETING"]
sessions = { allowed = true }
[[profile]]
name = "narrow"
match = { ssh = true }
allow_shell = false
[[profile]]
name = "local"
match = { uids = [12345] }
`

// newKey returns a fresh ed25519 signer and its authorized-keys line.
func newKey(t testing.TB) (ssh.Signer, string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey())))
}

// unitFront is an SSH front door on a Server without an image: requests
// are decided and audited, and those allowed fail to get a VM.
type unitFront struct {
	f      *sshfront.Front
	s      *Server
	keys   string // the authorized-keys file
	addr   string
	hostPK ssh.PublicKey
	audit  string
	logs   *testutil.SyncBuffer
}

func newUnitFront(t *testing.T, keys string, mutate func(*sshfront.Config)) *unitFront {
	t.Helper()
	dir := t.TempDir()
	pol, err := policy.Parse("unit.toml", []byte(sshUnitPolicy))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	al, err := audit.Open(audit.Options{Path: filepath.Join(dir, "audit.jsonl"), Logger: log, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close() })
	img := unbootableImage(t)
	host, err := vm.NewHost(vm.HostConfig{Runtime: vm.Runtime{StateDir: dir, Log: log}, ImageDir: img, Cgroups: "off", NoTemplate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	s := &Server{cfg: Config{VM: vm.HostConfig{Runtime: vm.Runtime{StateDir: dir, Log: log}, ImageDir: img}, MaxVMs: 1, Log: log}, host: host,
		log: log, slots: newSlots(1, 0, time.Second), live: newLiveExecs(), metrics: newMetrics(), flight: newInflight()}
	s.rec = newRecorder(al, DefaultAuditFlood, s.metrics, log)
	s.sessions = newSessions(s, host, s.slots, s.rec, log, dir, time.Second, time.Second)
	s.pol.Store(pol)
	t.Cleanup(s.flight.kill)
	kf := filepath.Join(dir, "keys")
	if err := os.WriteFile(kf, []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := sshfront.Config{Listeners: []net.Listener{ln}, AuthorizedKeys: kf}
	if mutate != nil {
		mutate(&cfg)
	}
	f, err := sshfront.New(sshCore{doorCore{s}}, cfg, dir, log)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	s.ssh = f
	f.Serve()
	t.Cleanup(func() {
		f.CloseListeners()
		f.CloseConns()
	})
	pub, err := os.ReadFile(filepath.Join(dir, sshfront.DefaultHostKey+".pub"))
	if err != nil {
		t.Fatal(err)
	}
	hostPK, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return &unitFront{f: f, s: s, keys: kf, addr: ln.Addr().String(), hostPK: hostPK, audit: filepath.Join(dir, "audit.jsonl"), logs: logs}
}

// unbootableImage is an image directory whose manifest verifies but whose
// disk is no qcow2: every VM start fails.
func unbootableImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	m := &image.Manifest{Inputs: image.Inputs{BuilderVersion: image.BuilderVersion}, Artifacts: map[string]image.Artifact{}}
	for _, n := range []string{image.BaseFile, image.KernelFile, image.InitrdFile} {
		b := []byte("not an image: " + n)
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		m.Artifacts[n] = image.Artifact{Size: int64(len(b)), SHA256: hex.EncodeToString(sum[:])}
	}
	if err := image.WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (u *unitFront) dial(t *testing.T, auth ...ssh.AuthMethod) (*ssh.Client, error) {
	t.Helper()
	return ssh.Dial("tcp", u.addr, &ssh.ClientConfig{User: "agent", Auth: auth, HostKeyCallback: ssh.FixedHostKey(u.hostPK), Timeout: 10 * time.Second})
}

// runSSH runs cmd (or a shell when cmd is nil) on a new session and
// returns stdout, stderr and the exit status (-1 without one).
func runSSH(t *testing.T, c *ssh.Client, cmd *string, setup func(*ssh.Session)) (string, string, int) {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var so, se bytes.Buffer
	sess.Stdout, sess.Stderr = &so, &se
	if setup != nil {
		setup(sess)
	}
	if cmd != nil {
		err = sess.Run(*cmd)
	} else {
		if err = sess.Shell(); err == nil {
			err = sess.Wait()
		}
	}
	var ee *ssh.ExitError
	switch {
	case err == nil:
		return so.String(), se.String(), 0
	case errors.As(err, &ee):
		return so.String(), se.String(), ee.ExitStatus()
	}
	t.Fatalf("session: %v", err)
	return "", "", -1
}

func strp(s string) *string { return &s }

// TestSSHFront_Unit covers the front door's authentication and refusals
// with package ssh's client: nothing here reaches a VM.
func TestSSHFront_Unit(t *testing.T) {
	agent, agentLine := newKey(t)
	narrow, narrowLine := newKey(t)
	stranger, _ := newKey(t)
	u := newUnitFront(t, `profile="agent" `+agentLine+" agent@unit\n"+`profile="narrow",no-pty `+narrowLine+" narrow@unit\n", func(c *sshfront.Config) {
		c.MaxSessions = 2
	})

	t.Run("unknown key refused", func(t *testing.T) {
		if _, err := u.dial(t, ssh.PublicKeys(stranger)); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
			t.Fatalf("dial with an unlisted key: %v", err)
		}
	})
	t.Run("passwords and keyboard-interactive are not offered", func(t *testing.T) {
		_, err := u.dial(t, ssh.Password("x"), ssh.KeyboardInteractive(func(string, string, []string, []bool) ([]string, error) { return nil, nil }))
		if err == nil || !strings.Contains(err.Error(), "attempted methods [none]") || !strings.Contains(err.Error(), "no supported methods remain") {
			t.Fatalf("dial with a password: %v", err)
		}
	})
	t.Run("wrong host key refused by a pinning client", func(t *testing.T) {
		other, _ := newKey(t)
		_, err := ssh.Dial("tcp", u.addr, &ssh.ClientConfig{User: "agent", Auth: []ssh.AuthMethod{ssh.PublicKeys(agent)},
			HostKeyCallback: ssh.FixedHostKey(other.PublicKey()), Timeout: 10 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "host key mismatch") {
			t.Fatalf("dial pinning another key: %v", err)
		}
	})

	c, err := u.dial(t, ssh.PublicKeys(agent))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cn, err := u.dial(t, ssh.PublicKeys(narrow))
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()

	t.Run("denied by policy", func(t *testing.T) {
		so, se, code := runSSH(t, cn, strp("uname -a"), nil)
		if code != wire.ExitDenied || so != "" || !strings.Contains(se, "vmgate: denied by policy profile narrow: shell strings") || !strings.HasSuffix(se, "\n") {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})
	t.Run("a NUL in the command refused", func(t *testing.T) {
		so, se, code := runSSH(t, c, strp("echo a\x00b"), nil)
		if code != wire.ExitDenied || so != "" || !strings.Contains(se, "vmgate: the command contains a NUL byte") {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})
	t.Run("interactive shell denied without sessions", func(t *testing.T) {
		_, se, code := runSSH(t, cn, nil, nil)
		if code != wire.ExitDenied || !strings.Contains(se, "shell strings") && !strings.Contains(se, "interactive shells are not allowed") {
			t.Fatalf("code %d stderr %q", code, se)
		}
	})
	t.Run("no-pty key gets no terminal", func(t *testing.T) {
		sess, err := cn.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		if err := sess.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err == nil {
			t.Fatal("pty granted to a no-pty key")
		}
	})
	t.Run("env replies follow the profile's allowlist", func(t *testing.T) {
		sess, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		if err := sess.Setenv("GREETING", "hi"); err != nil {
			t.Errorf("allowed variable refused: %v", err)
		}
		if err := sess.Setenv("LD_PRELOAD", "/x.so"); err == nil {
			t.Error("variable outside the allowlist accepted")
		}
		if err := sess.Setenv("GREETING", "again"); err == nil {
			t.Error("variable accepted twice")
		}
	})
	t.Run("allowed command without a VM fails with 205", func(t *testing.T) {
		_, se, code := runSSH(t, c, strp("true"), nil)
		if code != wire.ExitVMFailed || !strings.Contains(se, "vmgate: start vm:") {
			t.Fatalf("code %d stderr %q", code, se)
		}
	})
	t.Run("only session channels", func(t *testing.T) {
		_, _, err := c.OpenChannel("direct-tcpip", nil)
		var oce *ssh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != ssh.UnknownChannelType {
			t.Fatalf("direct-tcpip: %v", err)
		}
		if _, err := c.Listen("tcp", "127.0.0.1:0"); err == nil {
			t.Fatal("remote forwarding accepted")
		}
	})
	t.Run("sessions per connection are bounded", func(t *testing.T) {
		// A connection of its own: a session that the client closed
		// itself (as in the env subtest) frees its slot once the front
		// door has ended it, which the client cannot see. One whose
		// command ended has freed it before its exit status came.
		cb, err := u.dial(t, ssh.PublicKeys(agent))
		if err != nil {
			t.Fatal(err)
		}
		defer cb.Close()
		if _, _, code := runSSH(t, cb, strp("true"), nil); code != wire.ExitVMFailed {
			t.Fatalf("code %d, want %d", code, wire.ExitVMFailed)
		}
		s1, err := cb.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer s1.Close()
		s2, err := cb.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		_, err = cb.NewSession()
		var oce *ssh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != ssh.ResourceShortage || !strings.Contains(oce.Message, "at most 2") {
			t.Fatalf("third session: %v", err)
		}
	})

	// The audit log names the keys, not a uid.
	recs := testutil.JSONLines[audit.Record](t, u.audit)
	var sawDeny, sawExec bool
	for _, r := range recs {
		if r.UID != nil || r.GID != nil {
			t.Errorf("SSH request audited with a uid: %+v", r)
		}
		if r.SSH == nil {
			continue
		}
		if r.SSH.Fingerprint == ssh.FingerprintSHA256(narrow.PublicKey()) && r.Kind == audit.KindDecision && r.Verdict == audit.VerdictDeny {
			sawDeny = sawDeny || r.SSH.Comment == "narrow@unit" && r.SSH.User == "agent" && strings.HasPrefix(r.SSH.Remote, "127.0.0.1:") &&
				r.Profile == "narrow" && len(r.Argv) == 3 && r.Argv[2] == "uname -a" && r.Shell
		}
		if r.SSH.Fingerprint == ssh.FingerprintSHA256(agent.PublicKey()) && r.Kind == audit.KindExec {
			sawExec = sawExec || strings.Contains(r.Error, "start vm")
		}
	}
	if !sawDeny || !sawExec {
		t.Fatalf("audit log lacks the SSH records (deny %v, exec %v):\n%s", sawDeny, sawExec, testutil.ReadFile(t, u.audit))
	}
}

// TestSSHFront_IdleAndReload checks that an idle connection is closed and
// that SIGHUP's reload revokes a removed key.
func TestSSHFront_IdleAndReload(t *testing.T) {
	agent, agentLine := newKey(t)
	u := newUnitFront(t, `profile="agent" `+agentLine+"\n", func(c *sshfront.Config) { c.IdleTimeout = 300 * time.Millisecond })
	c, err := u.dial(t, ssh.PublicKeys(agent))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("idle connection not closed")
	}

	// A file that does not parse keeps the old keys; a removed key is
	// refused after the reload.
	if err := os.WriteFile(u.keys, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u.f.Reload(u.s.pol.Load())
	if !strings.Contains(u.logs.String(), "keeping the old keys") {
		t.Fatalf("bad file on reload: %s", u.logs.String())
	}
	c, err = u.dial(t, ssh.PublicKeys(agent))
	if err != nil {
		t.Fatalf("the old keys are gone after a bad reload: %v", err)
	}
	c.Close()
	if err := os.WriteFile(u.keys, []byte("# nobody\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u.f.Reload(u.s.pol.Load())
	if _, err := u.dial(t, ssh.PublicKeys(agent)); err == nil {
		t.Fatal("removed key still accepted after reload")
	}
}

// TestSSHFront_Refuses checks what stops the front door from starting.
func TestSSHFront_Refuses(t *testing.T) {
	_, line := newKey(t)
	dir := t.TempDir()
	pol, err := policy.Parse("unit.toml", []byte(sshUnitPolicy))
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: Config{VM: vm.HostConfig{Runtime: vm.Runtime{StateDir: dir}}, SocketMode: 0o660}}
	s.pol.Store(pol)
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", `profile="agent" `+line+"\n")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for name, tt := range map[string]struct {
		cfg  sshfront.Config
		want string
	}{
		"non-loopback":        {sshfront.Config{Listen: []string{"0.0.0.0:0"}, AuthorizedKeys: good}, "not a loopback address"},
		"host name":           {sshfront.Config{Listen: []string{"localhost:0"}, AuthorizedKeys: good}, "not an IP address"},
		"no keys file":        {sshfront.Config{Listen: []string{"127.0.0.1:0"}}, "no authorized-keys file"},
		"missing keys file":   {sshfront.Config{Listen: []string{"127.0.0.1:0"}, AuthorizedKeys: filepath.Join(dir, "nope")}, "no such file"},
		"no address":          {sshfront.Config{AuthorizedKeys: good}, "no address"},
		"profile without ssh": {sshfront.Config{Listen: []string{"127.0.0.1:0"}, AuthorizedKeys: write("local", `profile="local" `+line+"\n")}, `:1: key SHA256:`},
		"unknown profile":     {sshfront.Config{Listen: []string{"127.0.0.1:0"}, AuthorizedKeys: write("nosuch", "\n"+`profile="nosuch" `+line+"\n")}, `nosuch:2: key SHA256:`},
	} {
		f, err := sshfront.New(sshCore{doorCore{s}}, tt.cfg, dir, log)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			if f != nil {
				f.CloseListeners()
			}
			t.Errorf("%s: %v, want an error ~%q", name, err, tt.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, sshfront.DefaultHostKey)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused start left a host key: %v", err)
	}
	// A unix socket and, as a logged relaxation, every interface.
	var logs testutil.SyncBuffer
	sock := filepath.Join(dir, "ssh.sock")
	s.log = slog.New(slog.NewTextHandler(&logs, nil))
	f, err := sshfront.New(sshCore{doorCore{s}}, sshfront.Config{Listen: []string{"unix:" + sock, "0.0.0.0:0"}, AuthorizedKeys: good, AllowRemote: true},
		dir, s.log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "RELAXATION: the SSH front door listens on non-loopback addresses") {
		t.Errorf("no relaxation logged: %s", logs.String())
	}
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o660 {
		t.Errorf("ssh socket: %v %v", st, err)
	}
	f.CloseListeners()
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ssh socket left behind: %v", err)
	}
}

// TestSSHFront_DenialsThroughTheFloodGate: the SSH front door's denials,
// those of the policy and the logins it cannot serve alike, are audited by
// the exec core through the deny flood gate: past the burst, one key's
// denials are counted in a summary record, not written one by one.
func TestSSHFront_DenialsThroughTheFloodGate(t *testing.T) {
	narrow, narrowLine := newKey(t)
	u := newUnitFront(t, `profile="narrow" `+narrowLine+" narrow@unit\n", nil)
	u.s.rec.deny = newFloodGate("denied requests", 0.001, 3)
	fp := ssh.FingerprintSHA256(narrow.PublicKey())
	c, err := u.dial(t, ssh.PublicKeys(narrow))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 6 {
		if _, se, code := runSSH(t, c, strp("uname -a"), nil); code != wire.ExitDenied {
			t.Fatalf("a shell string of the narrow key: %d %q", code, se)
		}
	}
	// A login the front door refuses (a session name that is none).
	bad, err := ssh.Dial("tcp", u.addr, &ssh.ClientConfig{User: "session-../x", Auth: []ssh.AuthMethod{ssh.PublicKeys(narrow)},
		HostKeyCallback: ssh.FixedHostKey(u.hostPK), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	for range 4 {
		if _, se, code := runSSH(t, bad, strp("true"), nil); code != wire.ExitDenied || !strings.Contains(se, "a session name is") {
			t.Fatalf("a bad session login: %d %q", code, se)
		}
	}
	u.s.rec.sweep(time.Now().Add(time.Hour))
	var denials, summaries int
	for _, r := range testutil.JSONLines[audit.Record](t, u.audit) {
		if r.SSH == nil || r.SSH.Fingerprint != fp || r.Verdict != audit.VerdictDeny {
			continue
		}
		switch {
		case r.Message == "" && r.Reason != "":
			denials++
		case strings.HasPrefix(r.Message, "7 more denied requests not recorded one by one"):
			summaries++
		default:
			t.Errorf("unexpected record %+v", r)
		}
	}
	if denials != 3 || summaries != 1 {
		t.Fatalf("%d denials written one by one and %d summaries, want the burst (3) and one summary of the 7 others\n%s",
			denials, summaries, testutil.ReadFile(t, u.audit))
	}
}
