package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

// netLockPolicy lets the test's two names through on port 80.
const netLockPolicy = `version = 1

[[profile]]
name = "test"
match = { any = true }
user = "root"
max_vms = 4
max_vms_per_caller = 4
allow_shell = true
[profile.timeout]
default = "120s"
max = "5m"
[profile.sessions]
allowed = true
idle_timeout = "10m"
max_lifetime = "30m"
[profile.network]
mode = "allowlist"
allow = ["repo.test:80", "other.test:80"]
`

// aptRepo writes a flat apt repository (a trusted=yes source needs no
// Release file) of one package, vmgate-hello, made with dpkg-deb.
func aptRepo(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		testutil.SkipOrFail(t, "dpkg-deb not installed")
	}
	dir := t.TempDir()
	pkg, repo := filepath.Join(dir, "pkg"), filepath.Join(dir, "repo")
	for p, text := range map[string]string{
		"DEBIAN/control":       "Package: vmgate-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: vmgate tests <tests@vmgate.invalid>\nDescription: a package the test serves\n",
		"usr/bin/vmgate-hello": "#!/bin/sh\necho hello from a package\n",
	} {
		if err := os.MkdirAll(filepath.Join(pkg, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pkg, p), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	deb := filepath.Join(repo, "vmgate-hello_1.0_all.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v: %s", err, out)
	}
	b, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	packages := fmt.Sprintf("Package: vmgate-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: vmgate tests <tests@vmgate.invalid>\n"+
		"Filename: ./vmgate-hello_1.0_all.deb\nSize: %d\nSHA256: %s\nDescription: a package the test serves\n\n", len(b), hex.EncodeToString(sum[:]))
	if err := os.WriteFile(filepath.Join(repo, "Packages"), []byte(packages), 0o644); err != nil {
		t.Fatal(err)
	}
	return repo
}

// TestGateway_NetLock: a session installs a package with apt-get from a
// repository the test serves over HTTP, with its profile's network; then
// its network is locked, and a fetch from the same server is refused, in
// the same session, and stays refused when it is locked further while
// paused, in a fork, and after the daemon's restart. On the way, a command narrows its own network
// (--no-network, --net-allow) without changing the next one's, a rule
// outside the profile or the lock is refused (201) naming the rule, and
// a lock cannot be widened. The audit log and a receipt say which
// network each command had.
func TestGateway_NetLock(t *testing.T) {
	testutil.RequiresImage(t) // before the test internet: -short skips here
	inet := testutil.RequiresInternet(t)
	repo := aptRepo(t)
	ln := inet.Listen(t, 80)
	go func() { _ = http.Serve(ln, http.FileServer(http.Dir(repo))) }()
	state := t.TempDir()
	config := func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir, c.VM.StateDir = false, 0, testutil.TemplateDir(t), state
		c.AuditPath, c.MaxVMs, c.Grace = filepath.Join(state, "audit.jsonl"), 4, 30*time.Second
		c.NetHosts = map[string][]netip.Addr{"repo.test": {inet.Addr}, "other.test": {inet.Addr}}
	}
	d := gatewaytest.Start(t, netLockPolicy, config)
	run := func(d *gatewaytest.Daemon, want int, args ...string) string {
		t.Helper()
		so, se, code := vmExec(t, d.Socket, "", args...)
		if code != want {
			t.Fatalf("vm-exec %q: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, so, se)
		}
		return so + se
	}
	fetch := func(host string) []string {
		return []string{"wget", "-q", "-T", "10", "-O-", "http://" + host + "/Packages"}
	}
	const wgetNetFail = 4 // wget: a network failure (here: the name is not resolved)
	refused := func(out, rule, text string) {
		t.Helper()
		if !strings.Contains(out, "rule "+rule+": ") || !strings.Contains(out, text) {
			t.Errorf("the refusal names no rule %q and %q: %s", rule, text, out)
		}
	}

	apt := "-o Dir::Etc::sourcelist=/etc/apt/sources.list.d/test.list -o Dir::Etc::sourceparts=-"
	out := run(d, 0, "--session", "s", "-c", "echo 'deb [trusted=yes] http://repo.test/ ./' > /etc/apt/sources.list.d/test.list && "+
		"apt-get "+apt+" update && apt-get "+apt+" install -y vmgate-hello && vmgate-hello")
	if !strings.Contains(out, "hello from a package") {
		t.Fatalf("apt-get install: %s", out)
	}

	t.Run("a command narrows its own network", func(t *testing.T) {
		if out := run(d, 0, append([]string{"--session", "s", "--net-allow", "repo.test:80"}, fetch("repo.test")...)...); !strings.Contains(out, "Package: vmgate-hello") {
			t.Errorf("a fetch within --net-allow: %s", out)
		}
		run(d, wgetNetFail, append([]string{"--session", "s", "--net-allow", "other.test:80"}, fetch("repo.test")...)...)
		run(d, wgetNetFail, append([]string{"--session", "s", "--no-network"}, fetch("repo.test")...)...)
		refused(run(d, wire.ExitDenied, "--session", "s", "--net-allow", "evil.test:80", "true"),
			"network.allow", `network rule "evil.test:80" is not within the profile's network.allow (repo.test:80 other.test:80)`)
		refused(run(d, wire.ExitDenied, "--net-allow", "repo.test:443", "true"), "network.allow", `"repo.test:443" is not within`)
		// The next command has its profile's network again.
		run(d, 0, append([]string{"--session", "s"}, fetch("repo.test")...)...)
		// A fresh VM's, too.
		run(d, 0, append([]string{"--net-allow", "other.test:80"}, fetch("other.test")...)...)
		run(d, wgetNetFail, append([]string{"--no-network"}, fetch("other.test")...)...)
	})

	t.Run("the lock", func(t *testing.T) {
		if out := run(d, 0, "--session", "s", "--net-lock", "other.test:80"); !strings.Contains(out, "net-lock=[other.test:80]") {
			t.Errorf("lock: %s", out)
		}
		run(d, wgetNetFail, append([]string{"--session", "s"}, fetch("repo.test")...)...)
		run(d, 0, append([]string{"--session", "s"}, fetch("other.test")...)...)
		refused(run(d, wire.ExitDenied, "--session", "s", "--net-allow", "repo.test:80", "true"),
			"session network lock", `network rule "repo.test:80" is not within the session's network lock (other.test:80)`)
		refused(run(d, wire.ExitDenied, "--session", "s", "--net-lock", "repo.test:80"), "session network lock", `"repo.test:80"`)
	})

	t.Run("a paused session is locked, and resumes locked", func(t *testing.T) {
		run(d, 0, "--session", "s", "--pause")
		if out := run(d, 0, "--session", "s", "--net-lock"); !strings.Contains(out, "paused=") || !strings.Contains(out, "net-lock=[]") {
			t.Errorf("lock of a paused session: %s", out)
		}
		run(d, wgetNetFail, append([]string{"--session", "s"}, fetch("other.test")...)...)
		refused(run(d, wire.ExitDenied, "--session", "s", "--net-lock", "other.test:80"), "session network lock", "(nothing)")
		// What was installed with the network stays.
		if out := run(d, 0, "--session", "s", "vmgate-hello"); out != "hello from a package\n" {
			t.Errorf("the package after the lock: %q", out)
		}
	})

	t.Run("a receipt says so", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		res, err := d.Client.Exec(ctx, wire.ExecRequest{Session: "s", Argv: []string{"true"}, Receipt: true}, client.ExecIO{})
		if err != nil {
			t.Fatal(err)
		}
		_, b, err := receipt.Parse(res.Receipt)
		if err != nil || b.Network.Mode != "allowlist" || len(b.Network.Allow) != 0 || !slices.Equal(b.Network.Narrowed, []string{"session lock"}) {
			t.Errorf("the receipt's network: %+v %v", b.Network, err)
		}
	})

	t.Run("forks inherit it", func(t *testing.T) {
		run(d, 0, "--session", "s", "--fork", "s2")
		run(d, wgetNetFail, append([]string{"--session", "s2"}, fetch("other.test")...)...)
		refused(run(d, wire.ExitDenied, "--session", "s2", "--net-lock", "other.test:80"), "session network lock", "(nothing)")
	})

	// A restart pauses the sessions; the next daemon keeps their locks.
	d.StopAndCheck(t)
	d2 := gatewaytest.Start(t, netLockPolicy, config)
	var ss []wire.Session
	if err := json.Unmarshal([]byte(run(d2, 0, "--list-sessions", "--json")), &ss); err != nil || len(ss) != 2 {
		t.Fatalf("sessions after the restart: %+v %v", ss, err)
	}
	for _, s := range ss {
		if s.NetLock == nil || len(s.NetLock.Allow) != 0 {
			t.Errorf("session %s after the restart: lock %+v", s.Name, s.NetLock)
		}
	}
	run(d2, wgetNetFail, append([]string{"--session", "s"}, fetch("other.test")...)...)
	refused(run(d2, wire.ExitDenied, "--session", "s", "--net-lock", "repo.test:80"), "session network lock", "(nothing)")
	for _, n := range []string{"s", "s2"} {
		run(d2, 0, "--end-session", n)
	}
	d2.StopAndCheck(t)

	// The audit log: each command's network as it ran, and the refusals.
	var narrowed, locked, lockRecords int
	for _, r := range testutil.JSONLines[audit.Record](t, filepath.Join(state, "audit.jsonl")) {
		switch {
		case r.Kind == audit.KindExec && r.Network == nil:
			t.Errorf("an exec record without its network: %+v", r)
		case r.Kind == audit.KindExec && slices.Equal(r.Network.Narrowed, []string{"request"}):
			narrowed++
			if len(r.Network.Allow) > 1 {
				t.Errorf("a narrowed command had %q", r.Network.Allow)
			}
		case r.Kind == audit.KindExec && slices.Contains(r.Network.Narrowed, "session lock"):
			locked++
			if len(r.Network.Allow) > 1 || len(r.Network.Allow) == 1 && r.Network.Allow[0] != "other.test:80" {
				t.Errorf("a locked command had %q", r.Network.Allow)
			}
		case r.Kind == audit.KindSession && strings.HasPrefix(r.Message, "network locked"):
			lockRecords++
		}
	}
	if narrowed != 5 || locked != 7 || lockRecords != 2 {
		t.Errorf("exec records narrowed by the request %d, by the lock %d; lock records %d", narrowed, locked, lockRecords)
	}
}
