package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/procstat"
)

// stuckLookTimeout bounds the look at a VM whose agent did not answer.
// QEMU serves one client at a time on a monitor: while another holds it
// (a saving's own, kept until the save ends), the look waits this long
// and reports the monitor as unanswered.
const stuckLookTimeout = 2 * time.Second

// guestState is what the host can see of a guest whose agent did not
// answer: QEMU's run state, where its first vCPU is and whether it halted,
// its local APIC's timer, whether the guest has opened the agent's port
// (the agent runs) and the host is connected to it, and the CPU time QEMU
// has used. It tells a guest that waits for an interrupt that never comes
// (halted, timer idle) from one that works slowly or spins (QEMU's CPU
// time near its age), and a guest whose agent never started from one
// whose agent waits for a host, which the serial console of a quiet boot
// does not.
type guestState struct {
	Status      string        // query-status: "running", "paused", …
	AgentPort   string        // the agent port's two ends (query-chardev)
	RIP         string        // the first vCPU's instruction pointer
	Halted      bool          // the first vCPU is halted (HLT)
	Timer       string        // the local APIC's timer lines (info lapic)
	CPU, Uptime time.Duration // QEMU's CPU time (user+system), its age
	Errs        []string      // what could not be read
}

func (g guestState) String() string {
	var parts []string
	if g.Status != "" {
		parts = append(parts, "run state "+g.Status)
	}
	if g.RIP != "" {
		vcpu := "vCPU 0 at RIP " + g.RIP
		if g.Halted {
			vcpu += ", halted"
		}
		parts = append(parts, vcpu)
	}
	if g.AgentPort != "" {
		parts = append(parts, g.AgentPort)
	}
	if g.Timer != "" {
		parts = append(parts, "APIC "+g.Timer)
	}
	if g.Uptime > 0 {
		parts = append(parts, fmt.Sprintf("QEMU used %.1f s of CPU in %.1f s", g.CPU.Seconds(), g.Uptime.Seconds()))
	}
	parts = append(parts, g.Errs...)
	return strings.Join(parts, "; ")
}

// lookAtGuest reads v's guestState, within stuckLookTimeout of its own:
// ctx has usually ended (it is the boot's, which timed out).
func (v *VM) lookAtGuest(ctx context.Context) guestState {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stuckLookTimeout)
	defer cancel()
	var g guestState
	if cpu, up, err := processCPU(v.Pid()); err != nil {
		g.Errs = append(g.Errs, err.Error())
	} else {
		g.CPU, g.Uptime = cpu, up
	}
	q, err := dialQMP(ctx, filepath.Join(v.Dir, QMPSocket), v.exited)
	if err != nil {
		g.Errs = append(g.Errs, err.Error())
		return g
	}
	defer q.Close()
	if g.Status, err = q.status(ctx); err != nil {
		g.Errs = append(g.Errs, err.Error())
	}
	if raw, err := q.run(ctx, "query-chardev", nil); err != nil {
		g.Errs = append(g.Errs, err.Error())
	} else {
		g.AgentPort = agentPortState(raw)
	}
	if regs, err := q.hmp(ctx, "info registers"); err != nil {
		g.Errs = append(g.Errs, err.Error())
	} else {
		g.RIP, g.Halted = parseRegisters(regs)
	}
	if lapic, err := q.hmp(ctx, "info lapic"); err != nil {
		g.Errs = append(g.Errs, err.Error())
	} else {
		g.Timer = parseLAPICTimer(lapic)
	}
	return g
}

// hmp runs a human monitor command and returns its text.
func (q *qmp) hmp(ctx context.Context, line string) (string, error) {
	raw, err := q.run(ctx, "human-monitor-command", map[string]string{"command-line": line})
	if err != nil {
		return "", err
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("qmp human-monitor-command %s: %w", line, err)
	}
	return s, nil
}

// agentPortState describes the agent's chardev in query-chardev's
// answer: whether the guest has its port open (QEMU's "frontend-open")
// and whether a host is connected to its socket (QEMU names a socket
// that waits for one "disconnected:…").
func agentPortState(raw json.RawMessage) string {
	var devs []struct {
		Label        string `json:"label"`
		Filename     string `json:"filename"`
		FrontendOpen bool   `json:"frontend-open"`
	}
	if err := json.Unmarshal(raw, &devs); err != nil {
		return "agent port: " + err.Error()
	}
	for _, d := range devs {
		if d.Label != agentChardev {
			continue
		}
		guest, host := "closed by the guest", "host connected"
		if d.FrontendOpen {
			guest = "open in the guest"
		}
		if strings.HasPrefix(d.Filename, "disconnected:") {
			host = "no host connected"
		}
		return "agent port " + guest + ", " + host
	}
	return "agent port: no chardev " + agentChardev
}

// parseRegisters finds the first vCPU's RIP and HLT flag in the text of
// QEMU's "info registers" ("RIP=ffffffff81e0a1ae RFL=00000246 [---Z-P-]
// CPL=0 II=0 A20=1 SMM=0 HLT=1").
func parseRegisters(s string) (rip string, halted bool) {
	for _, f := range strings.Fields(s) {
		switch {
		case strings.HasPrefix(f, "RIP=") && rip == "":
			rip = strings.TrimPrefix(f, "RIP=")
		case strings.HasPrefix(f, "HLT="):
			return rip, f == "HLT=1"
		}
	}
	return rip, false
}

// parseLAPICTimer keeps, from QEMU's "info lapic", the lines that say
// whether an interrupt can come: the timer's vector and mode (LVTT), its
// counts (Timer) and the pending and in-service vectors (IRR, ISR),
// joined by " | " with their runs of blanks squeezed.
func parseLAPICTimer(s string) string {
	var keep []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "LVTT", "Timer", "IRR", "ISR":
			keep = append(keep, strings.Join(f, " "))
		}
	}
	return strings.Join(keep, " | ")
}

// processCPU returns the CPU time (user and system, all threads) that
// process pid has used, and how long it has run.
func processCPU(pid int) (cpu, uptime time.Duration, err error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("qemu's cpu time: %w", err)
	}
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, 0, fmt.Errorf("qemu's cpu time: %w", err)
	}
	return parseProcCPU(string(stat), string(up), clockTicks)
}

// clockTicks is USER_HZ, the unit of /proc's times: 100 on every Linux
// architecture vmgate runs on.
const clockTicks = 100

// parseProcCPU reads utime+stime and the start time from a
// /proc/PID/stat line and the process's age from /proc/uptime's text.
func parseProcCPU(stat, uptime string, hz int) (cpu, age time.Duration, err error) {
	f, ok := procstat.Fields(stat)
	if !ok {
		return 0, 0, fmt.Errorf("qemu's cpu time: no command name in %q", stat)
	}
	// f[0] is field 3 (state): utime is field 14, stime 15, starttime 22.
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("qemu's cpu time: %d fields after the command name, want 20", len(f))
	}
	var n [3]uint64
	for k, field := range []string{f[11], f[12], f[19]} {
		if n[k], err = strconv.ParseUint(field, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("qemu's cpu time: %w", err)
		}
	}
	upF := strings.Fields(uptime)
	if len(upF) == 0 {
		return 0, 0, fmt.Errorf("qemu's cpu time: empty /proc/uptime")
	}
	up, err := strconv.ParseFloat(upF[0], 64)
	if err != nil {
		return 0, 0, fmt.Errorf("qemu's cpu time: %w", err)
	}
	tick := time.Second / time.Duration(hz)
	cpu = time.Duration(n[0]+n[1]) * tick
	age = time.Duration(up*float64(time.Second)) - time.Duration(n[2])*tick
	return cpu, max(age, 0), nil
}
