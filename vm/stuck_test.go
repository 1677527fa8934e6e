package vm

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const registersSample = `CPU#0
RAX=000000001d133690 RBX=0000000004f59560 RCX=000000000000004c RDX=00000000f36e4e00
RIP=ffffffff81e0a1ae RFL=00000246 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=1
ES =0000 0000000000000000 00000000 00000000
`

const lapicSample = `dumping local APIC state for CPU 0 

LVT0	 0x00010700 active-hi edge  masked                      ExtINT (vec 0)
LVTT	 0x000000ec active-hi edge                 one-shot     Fixed  (vec 236)
Timer	 DCR=0x0 (divide by 2) initial_count = 0 current_count = 0
SPIV	 0x000001ff APIC enabled, focus=off, spurious vec 255
ISR	 (none)
IRR	 (none)

APR 0x00 TPR 0x00 DFR 0x0f LDR 0x00 PPR 0x00
`

func TestParseRegisters(t *testing.T) {
	for _, c := range []struct {
		name, in string
		rip      string
		halted   bool
	}{
		{"halted", registersSample, "ffffffff81e0a1ae", true},
		{"running", strings.Replace(registersSample, "HLT=1", "HLT=0", 1), "ffffffff81e0a1ae", false},
		{"second vCPU ignored", registersSample + "CPU#1\nRIP=0000000000000001 HLT=0\n", "ffffffff81e0a1ae", true},
		{"empty", "", "", false},
	} {
		rip, halted := parseRegisters(c.in)
		if rip != c.rip || halted != c.halted {
			t.Errorf("%s: %q %v, want %q %v", c.name, rip, halted, c.rip, c.halted)
		}
	}
}

func TestParseLAPICTimer(t *testing.T) {
	want := "LVTT 0x000000ec active-hi edge one-shot Fixed (vec 236) | Timer DCR=0x0 (divide by 2) initial_count = 0 current_count = 0 | ISR (none) | IRR (none)"
	if got := parseLAPICTimer(lapicSample); got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if got := parseLAPICTimer(""); got != "" {
		t.Errorf("empty: %q", got)
	}
}

func TestParseProcCPU(t *testing.T) {
	// Fields 14/15 (utime 250, stime 50) and 22 (starttime 1000 ticks).
	stat := "4242 (qemu (x) sys) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 5 0 1000 1000000 100 18446744073709551615"
	for _, c := range []struct {
		name, stat, up string
		cpu, age       time.Duration
		err            bool
	}{
		{"name with blanks and parentheses", stat, "40.00 70.00\n", 3 * time.Second, 30 * time.Second, false},
		{"age never negative", stat, "5.00 1.00", 3 * time.Second, 0, false},
		{"no name", "4242 qemu S 1", "1 1", 0, 0, true},
		{"short", "4242 (q) S 1 2 3", "1 1", 0, 0, true},
		{"not a number", strings.Replace(stat, " 250 ", " x ", 1), "1 1", 0, 0, true},
		{"empty uptime", stat, "", 0, 0, true},
	} {
		cpu, age, err := parseProcCPU(c.stat, c.up, 100)
		if (err != nil) != c.err || cpu != c.cpu || age != c.age {
			t.Errorf("%s: %v %v %v, want %v %v error %v", c.name, cpu, age, err, c.cpu, c.age, c.err)
		}
	}
}

func TestGuestStateString(t *testing.T) {
	g := guestState{Status: "running", RIP: "ffffffff81e0a1ae", Halted: true, Timer: "LVTT x", CPU: 2500 * time.Millisecond, Uptime: 180 * time.Second, Errs: []string{"qmp: gone"}}
	want := "run state running; vCPU 0 at RIP ffffffff81e0a1ae, halted; APIC LVTT x; QEMU used 2.5 s of CPU in 180.0 s; qmp: gone"
	if got := g.String(); got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if got := (guestState{}).String(); got != "" {
		t.Errorf("empty: %q", got)
	}
}

func TestAgentPortState(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"booting", `[{"frontend-open":true,"filename":"file","label":"console"},{"frontend-open":false,"filename":"unix:/s/agent.sock,server=on","label":"agent"}]`, "agent port closed by the guest, host connected"},
		{"waiting for a host", `[{"frontend-open":true,"filename":"disconnected:unix:/s/agent.sock,server=on","label":"agent"}]`, "agent port open in the guest, no host connected"},
		{"no agent", `[{"frontend-open":true,"filename":"file","label":"console"}]`, "agent port: no chardev agent"},
	} {
		if got := agentPortState(json.RawMessage(c.in)); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := agentPortState(json.RawMessage(`{}`)); !strings.HasPrefix(got, "agent port: json: ") {
		t.Errorf("not a list: %q", got)
	}
}
