package isolate

import (
	"strings"
	"testing"
)

func validSpec() Spec {
	return Spec{Argv: []string{"/usr/bin/qemu-system-x86_64", "-nodefaults"}, ReadOnly: []string{"/usr/bin/qemu-system-x86_64", "/var/lib/vmgate/image"},
		ReadWrite: []string{"/var/lib/vmgate/vms/abc"}, Devices: []string{"/dev/null"}, UID: 1000, GID: 1000}
}

func TestSpecValidate(t *testing.T) {
	s := validSpec()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		mod  func(*Spec)
		want string
	}{
		"no program":             {func(s *Spec) { s.Argv = nil }, "no program"},
		"relative":               {func(s *Spec) { s.Argv[0] = "qemu" }, "absolute"},
		"uid 0":                  {func(s *Spec) { s.UID = 0 }, "uid or gid 0"},
		"gid 0":                  {func(s *Spec) { s.GID = 0 }, "uid or gid 0"},
		"whole host":             {func(s *Spec) { s.ReadOnly = append(s.ReadOnly, "/") }, "whole host"},
		"unclean":                {func(s *Spec) { s.ReadWrite = []string{"/var/lib/../etc"} }, "not clean"},
		"proc":                   {func(s *Spec) { s.ReadOnly = append(s.ReadOnly, "/proc/1") }, "/proc"},
		"sys":                    {func(s *Spec) { s.ReadOnly = append(s.ReadOnly, "/sys/kernel") }, "/sys"},
		"device outside":         {func(s *Spec) { s.Devices = []string{"/etc/passwd"} }, "not under /dev"},
		"program hidden":         {func(s *Spec) { s.ReadOnly = []string{"/var/lib/vmgate/image"} }, "not among the read-only"},
		"bad seccomp":            {func(s *Spec) { s.Seccomp = "maybe" }, "seccomp"},
		"reserved fd":            {func(s *Spec) { s.KeepFDs = []int{3} }, "reserved"},
		"program kind":           {func(s *Spec) { s.Program = "shell" }, "program kind"},
		"qemu with host network": {func(s *Spec) { s.HostNetwork = true }, "only the netstack"},
		"env without =":          {func(s *Spec) { s.Env = []string{"VMGATE_REEXEC"} }, "KEY=VALUE"},
		"env with NUL":           {func(s *Spec) { s.Env = []string{"A=b\x00c"} }, "KEY=VALUE"},
	} {
		s := validSpec()
		s.Argv = append([]string(nil), s.Argv...)
		c.mod(&s)
		err := s.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", name, err, c.want)
		}
	}
}

func TestParseStatus(t *testing.T) {
	var r Report
	parseStatus("Name:\tqemu\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t2\n", &r)
	if r.CapEff != "0000000000000000" || !r.NoNewPrivs || r.SeccompMode != 2 || r.SeccompFilter != 2 {
		t.Fatalf("%+v", r)
	}
}

func TestParseCgroups(t *testing.T) {
	got := parseCgroups("9:name=systemd:/\n8:pids:/vmgate-1/vm-a\n4:memory:/x/vmgate-1/vm-a\n0::/\n")
	want := []string{"pids:/vmgate-1/vm-a", "memory:/x/vmgate-1/vm-a"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("got %q", got)
	}
	if got := parseCgroups("0::/system.slice/vmgated.service/vmgate-2/vm-b\n"); len(got) != 1 || got[0] != ":/system.slice/vmgated.service/vmgate-2/vm-b" {
		t.Fatalf("v2: got %q", got)
	}
}
