package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/vm"
)

func TestMetricsText(t *testing.T) {
	m := newMetrics()
	m.request("web", "allow")
	m.request("web", "allow")
	m.request(`we"ird`, "deny")
	m.exec("pool", 80*time.Millisecond)
	m.exec("pool", 3*time.Second)
	m.exec("", time.Millisecond)
	m.refusedBusy()
	m.netConn("deny")
	var b bytes.Buffer
	m.write(&b, gauges{liveVMs: 3, maxVMs: 8, waiting: 1, sessions: 2, pools: []poolGauge{{labels: `image="default"`, ready: 2, size: 2, ahead: 1}},
		restoreFailures: 1, auditHealthy: true})
	out := b.String()
	for _, want := range []string{
		"# TYPE vmgate_requests_total counter\n",
		`vmgate_requests_total{profile="web",verdict="allow"} 2`,
		`vmgate_requests_total{profile="we\"ird",verdict="deny"} 1`,
		`vmgate_exec_duration_seconds_bucket{start="pool",le="0.1"} 1`,
		`vmgate_exec_duration_seconds_bucket{start="pool",le="5"} 2`,
		`vmgate_exec_duration_seconds_bucket{start="pool",le="+Inf"} 2`,
		`vmgate_exec_duration_seconds_count{start="session"} 1`,
		"vmgate_busy_refusals_total 1\n",
		`vmgate_net_connections_total{verdict="deny"} 1`,
		"vmgate_vms_live 3\n", "vmgate_queue_waiting 1\n", "vmgate_sessions 2\n",
		`vmgate_pool_ready{image="default"} 2`, `vmgate_pool_ahead{image="default"} 1`, "vmgate_restore_failures_total 1\n", "vmgate_audit_healthy 1\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// Every line is a comment or NAME{labels} VALUE.
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(line, "# ") && len(strings.Fields(line)) != 2 && !strings.Contains(line, `"we\"ird"`) {
			t.Errorf("malformed line %q", line)
		}
	}
}

func TestListenMetricsLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "192.0.2.1:9470", "nonsense"} {
		if ln, err := listenMetrics(addr); err == nil {
			ln.Close()
			t.Errorf("%s accepted", addr)
		}
	}
	ln, err := listenMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}

// TestClientMessage: what a guest wrote to its console never reaches a
// client, with or without a QEMU log, however the error was wrapped; the
// daemon's log and audit get it (vm.Details).
func TestClientMessage(t *testing.T) {
	const note = " (QEMU's and the guest console's last lines are in vmgated's log)"
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"both", &vm.Error{Phase: "vm died during exec", Kind: vm.ErrVMDied, Err: errors.New("qemu exited (signal: killed)"), QEMULog: "noise | more", Console: "EVIL guest text"},
			"vm died during exec: qemu exited (signal: killed)" + note},
		{"console only", &vm.Error{Phase: "restore", Err: errors.New("unexpected state"), Console: "EVIL guest text"}, "restore: unexpected state" + note},
		{"wrapped", fmt.Errorf("start vm: %w", &vm.Error{Phase: "boot", Err: errors.New("timeout"), Console: "EVIL guest text"}), "start vm: boot: timeout" + note},
		{"plain", errors.New("plain"), "plain"},
	} {
		got := clientMessage(c.err)
		if got != c.want || strings.Contains(got, "EVIL") {
			t.Errorf("%s: clientMessage %q, want %q", c.name, got, c.want)
		}
		if d := vm.Details(c.err); c.name != "plain" && !strings.Contains(d, "EVIL guest text") {
			t.Errorf("%s: details lack the console: %q", c.name, d)
		}
	}
}
