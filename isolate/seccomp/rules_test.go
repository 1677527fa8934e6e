package seccomp

import (
	"bufio"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// allOptions lists every Options combination the jail can ask for.
func allOptions() []Options {
	var out []Options
	for _, accel := range []string{"tcg", "kvm"} {
		for _, net := range []bool{false, true} {
			for _, in := range []bool{false, true} {
				for _, def := range []string{"errno", "kill"} {
					out = append(out, Options{Accel: accel, Network: net, Incoming: in, DefaultAction: def})
				}
			}
		}
	}
	return out
}

func optName(o Options) string {
	s := o.Accel
	if o.Network {
		s += "-net"
	}
	if o.Incoming {
		s += "-incoming"
	}
	return s + "-" + o.DefaultAction
}

func mustRules(t *testing.T, o Options) RuleSet {
	t.Helper()
	rs, err := Rules(o)
	if err != nil {
		t.Fatalf("Rules(%+v): %v", o, err)
	}
	return rs
}

func TestRules_InvalidOptions(t *testing.T) {
	for _, o := range []Options{{}, {Accel: "auto"}, {Accel: "tcg", DefaultAction: "log"}} {
		if _, err := Rules(o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("Rules(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}
	rs := mustRules(t, Options{Accel: "tcg"})
	if rs.Default != actEPERM {
		t.Errorf("empty DefaultAction gives %v, want errno(EPERM)", rs.Default)
	}
}

func TestRules_Table(t *testing.T) {
	for _, o := range allOptions() {
		t.Run(optName(o), func(t *testing.T) {
			rs := mustRules(t, o)
			if rs.BadArch != actKill {
				t.Errorf("bad-arch action %v, want kill-process", rs.BadArch)
			}
			wantDef := actEPERM
			if o.DefaultAction == "kill" {
				wantDef = actKill
			}
			if rs.Default != wantDef {
				t.Errorf("default %v, want %v", rs.Default, wantDef)
			}
			// Dangerous syscalls: never allowed, in any combination.
			for _, name := range []string{
				"execveat", "ptrace", "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
				"bpf", "keyctl", "add_key", "request_key", "userfaultfd", "perf_event_open",
				"kexec_load", "init_module", "finit_module", "delete_module", "open_by_handle_at",
				"name_to_handle_at", "process_vm_readv", "process_vm_writev", "swapon", "swapoff",
				"reboot", "acct", "quotactl", "lookup_dcookie", "iopl", "ioperm", "mknod", "mknodat",
				"personality", "fork", "vfork", "clone3", "io_uring_setup", "io_uring_enter", "io_uring_register",
			} {
				if rs.Allowed(name) {
					t.Errorf("%s allowed", name)
				}
			}
			// execve is allowed: the jail's final exec (QEMU's -sandbox
			// spawn=deny forbids later ones).
			if !rs.Allowed("execve") {
				t.Error("execve not allowed: the jail could not exec QEMU")
			}
			checkOnly := func(name string, arg uint, want uint64) {
				t.Helper()
				rules := rs.Lookup(name)
				if len(rules) != 1 || len(rules[0].Conds) != 1 || rules[0].Conds[0].Arg != arg ||
					rules[0].Conds[0].Op != Equal || rules[0].Conds[0].Value != want {
					t.Errorf("%s rules = %+v, want exactly arg%d == %#x", name, rules, arg, want)
				}
			}
			checkOnly("socket", 0, afUNIX)
			checkOnly("socketpair", 0, afUNIX)
			for _, r := range rs.Lookup("clone") {
				if len(r.Conds) != 1 || r.Conds[0].Op != MaskedEqual || r.Conds[0].Mask&cloneNewUser == 0 || r.Conds[0].Value != 0 {
					t.Errorf("clone rule %+v does not exclude CLONE_NEWUSER", r)
				}
			}
			for _, r := range rs.Lookup("prctl") {
				if len(r.Conds) == 0 {
					t.Error("prctl unrestricted")
				}
			}
			for name, want := range map[string]Action{
				"clone3": actENOSYS, "io_uring_setup": actEPERM, "io_uring_enter": actEPERM, "io_uring_register": actEPERM,
			} {
				rules := rs.Lookup(name)
				if len(rules) != 1 || rules[0].Action != want || len(rules[0].Conds) != 0 {
					t.Errorf("%s rules = %+v, want one unconditional %v", name, rules, want)
				}
			}
			if got := rs.Allowed("ioctl"); got != (o.Accel == "kvm") {
				t.Errorf("ioctl allowed = %v for accel %s", got, o.Accel)
			}
			for _, r := range rs.Lookup("ioctl") {
				if len(r.Conds) == 0 {
					t.Error("ioctl unrestricted")
				}
			}
			if got := rs.Allowed("connect"); got != o.Network {
				t.Errorf("connect allowed = %v with Network=%v", got, o.Network)
			}
			if got := rs.Allowed("readv"); got != o.Incoming {
				t.Errorf("readv allowed = %v with Incoming=%v", got, o.Incoming)
			}
			// Every rule says where it comes from; the set has warnings.
			for _, r := range rs.Rules {
				if r.Why == "" {
					t.Errorf("rule %s has no provenance", r.Syscall)
				}
			}
			if len(rs.Warnings) == 0 {
				t.Error("no SECCOMP WARNING for the known relaxations")
			}
		})
	}
}

// TestRules_CoversTrace checks that every syscall in the strace of QEMU's
// lifecycle (DERIVATION.md) is allowed for the options the trace covers,
// except those the filter denies on purpose.
func TestRules_CoversTrace(t *testing.T) {
	rs := mustRules(t, Options{Accel: "tcg", Network: true, Incoming: true})
	deliberate := map[string]bool{"clone3": true, "io_uring_setup": true}
	f, err := os.Open(filepath.Join("testdata", "traced-syscalls.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" {
			continue
		}
		n++
		if !rs.Allowed(name) && !deliberate[name] {
			t.Errorf("traced syscall %s is not allowed", name)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 50 {
		t.Fatalf("trace list has only %d syscalls", n)
	}
}

func TestRules_Pure(t *testing.T) {
	o := Options{Accel: "kvm", Network: true}
	a, b := mustRules(t, o).String(), mustRules(t, o).String()
	if a != b {
		t.Error("Rules is not deterministic")
	}
}

func TestRules_Golden(t *testing.T) {
	for _, o := range []Options{
		{Accel: "tcg", DefaultAction: "errno"},
		{Accel: "tcg", Network: true, Incoming: true, DefaultAction: "kill"},
		{Accel: "kvm", Network: true, Incoming: true, DefaultAction: "errno"},
	} {
		t.Run(optName(o), func(t *testing.T) {
			got := mustRules(t, o).String()
			path := filepath.Join("testdata", optName(o)+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run Golden -update)", err)
			}
			if got != string(want) {
				t.Errorf("rule set for %+v changed; review and run `go test ./isolate/seccomp -run Golden -update`:\n%s", o, got)
			}
		})
	}
}
