package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

// statusPolicy: root's profile is an admin, everyone else's is not.
const statusPolicy = `version = 1

[[profile]]
name = "admins"
match = { uids = [0] }
admin = true
user = "root"
allow_shell = true
sessions = { allowed = true }

[[profile]]
name = "others"
match = { any = true }
allow_shell = true
sessions = { allowed = true }
`

// TestGateway_Status runs a command as nobody and holds a session as root,
// and checks what vmgated status and vm-exec ps show each: root (admin)
// sees both, nobody only its own command.
func TestGateway_Status(t *testing.T) {
	testutil.RequiresRoot(t)
	bin := os.Getenv("VMGATE_TEST_BIN")
	if bin == "" {
		t.Skip("VMGATE_TEST_BIN not set")
	}
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := probe.Addr().String()
	probe.Close()
	d := gatewaytest.Start(t, statusPolicy, func(c *gateway.Config) { c.MetricsListen = metricsAddr })
	d.MustExec(t, wire.ExecRequest{Session: "roots", Argv: []string{"true"}}, nil)

	_ = os.Chmod(filepath.Dir(d.Socket), 0o755)
	_ = os.Chmod(filepath.Dir(filepath.Dir(d.Socket)), 0o755)
	vmExec := testutil.ForOthers(t, filepath.Join(bin, "vm-exec"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := exec.CommandContext(ctx, vmExec, "--socket", d.Socket, "sh", "-c", "echo started; exec sleep 600")
	long.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := long.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Wait() }()
	defer cancel()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("nobody's command: %q %v", line, err)
	}

	status := func(cred *syscall.Credential, args ...string) wire.Status {
		t.Helper()
		cmd := exec.Command(vmExec, append([]string{"ps", "--json"}, args...)...)
		if cred == nil {
			cmd = exec.Command(filepath.Join(bin, "vmgated"), "status", "--json")
		}
		cmd.Env = append(os.Environ(), "VMGATE_SOCKET="+d.Socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v", cmd.Args, err)
		}
		var st wire.Status
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		return st
	}
	root := status(nil)
	if !root.All || len(root.VMs) != 1 || root.VMs[0].Caller != "uid 65534 (nobody)" || root.VMs[0].Profile != "others" ||
		strings.Join(root.VMs[0].Argv, " ") != "sh -c echo started; exec sleep 600" || root.VMs[0].VMStart == "" {
		t.Errorf("root's status: all=%v vms %+v", root.All, root.VMs)
	}
	if len(root.Sessions) != 1 || root.Sessions[0].Name != "roots" || root.Sessions[0].Owner != "uid 0 (root)" || root.LiveVMs != 2 {
		t.Errorf("root's status: %d live, sessions %+v", root.LiveVMs, root.Sessions)
	}
	nobody := status(&syscall.Credential{Uid: 65534, Gid: 65534})
	if nobody.All || len(nobody.VMs) != 1 || nobody.VMs[0].Caller != "uid 65534 (nobody)" || len(nobody.Sessions) != 0 {
		t.Errorf("nobody's status: all=%v vms %+v sessions %+v", nobody.All, nobody.VMs, nobody.Sessions)
	}
	// Each learns what its own profile grants.
	if g := root.Caller; g == nil || g.Profile != "admins" || !g.Shell || !g.Sessions || g.Network {
		t.Errorf("root's grant: %+v", g)
	}
	if g := nobody.Caller; g == nil || g.Profile != "others" || g.Network {
		t.Errorf("nobody's grant: %+v", g)
	}
	// Metrics, on the socket and on the loopback listener.
	viaSocket, err := d.Client.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	viaTCP, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{viaSocket, string(viaTCP)} {
		for _, want := range []string{`vmgate_requests_total{profile="admins",verdict="allow"} 1`, `vmgate_requests_total{profile="others",verdict="allow"} 1`,
			`vmgate_exec_duration_seconds_count{start="boot"} 1`, "vmgate_vms_live 2\n", "vmgate_sessions 1\n", "vmgate_audit_healthy 1\n"} {
			if !strings.Contains(m, want) {
				t.Errorf("metrics lack %q:\n%s", want, m)
			}
		}
	}
	// The table form names the same.
	table, err := exec.Command(filepath.Join(bin, "vmgated"), "status", "--socket", d.Socket).Output()
	if err != nil || !strings.Contains(string(table), "uid 65534 (nobody)") || !strings.Contains(string(table), "roots") {
		t.Errorf("vmgated status: %v\n%s", err, table)
	}
}
