package vm

import (
	"bytes"
	"encoding/binary"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

func baseSpec() LaunchSpec {
	return LaunchSpec{
		Dir: "/var/lib/vmgate/vms/0123456789ab", Kernel: "/img/vmlinuz", Initrd: "/img/initrd.img",
		MemoryMiB: 512, CPUs: 1, Accel: AccelTCG, TSCkHz: 2600000, ConsoleFD: 4,
	}
}

func TestCmdlineGolden(t *testing.T) {
	kvm := baseSpec()
	kvm.Accel, kvm.CPUs, kvm.MemoryMiB, kvm.QEMU = AccelKVM, 2, 1024, "/usr/bin/qemu-system-x86_64"
	probe := baseSpec()
	probe.Probe, probe.TSCkHz, probe.ConsoleFD = true, 0, 0
	template := baseSpec()
	template.RAMPath, template.RAMShared, template.NoRandMaps = filepath.Join(template.Dir, "ram"), true, true
	clone := baseSpec()
	clone.RAMPath, clone.Incoming, clone.ConsoleFD = "/proc/self/fd/4", true, 6
	netSpec := baseSpec()
	netSpec.Network = true
	for name, s := range map[string]LaunchSpec{"tcg": baseSpec(), "kvm": kvm, "probe": probe, "template": template, "clone": clone, "net": netSpec} {
		t.Run(name, func(t *testing.T) {
			argv, err := s.Cmdline()
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(argv, "\n") + "\n"
			path := filepath.Join("testdata", "cmdline_"+name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update once)", err)
			}
			if got != string(want) {
				t.Fatalf("cmdline differs from %s:\n got:\n%s\nwant:\n%s", path, got, want)
			}
		})
	}
}

func TestCmdlineInvariants(t *testing.T) {
	argv, err := baseSpec().Cmdline()
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(argv, " ")
	for _, want := range []string{"-nodefaults", "-no-user-config", "-nographic", "accel=tcg", "-sandbox " + SandboxArg, "tsc_early_khz=2600000", "name=vmgate.agent", "-no-reboot"} {
		if !strings.Contains(joined, want) {
			t.Errorf("cmdline lacks %q", want)
		}
	}
	for _, bad := range []string{"-netdev", "-nic", "-net ", "exec:"} {
		if strings.Contains(joined, bad) {
			t.Errorf("cmdline has %q but no network was asked for", bad)
		}
	}
}

// TestCmdlinePathsInKeyValueOptions: a state directory may contain '='
// (Go's t.TempDir does for subtests named "x=y"); QEMU's legacy
// "unix:PATH,server=on" and "file:PATH" forms misparse such a path, so
// every path must be the value of a key=value option.
func TestCmdlinePathsInKeyValueOptions(t *testing.T) {
	for _, s := range []LaunchSpec{baseSpec(), func() LaunchSpec {
		s := baseSpec()
		s.Dir, s.Network, s.Probe = "/var/lib/vmgate/vms/a=b", true, false
		return s
	}()} {
		argv, err := s.Cmdline()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range argv {
			if strings.HasPrefix(a, "unix:") || strings.HasPrefix(a, "file:") {
				t.Errorf("legacy path syntax %q", a)
			}
		}
	}
}

func TestCmdlineRejects(t *testing.T) {
	cases := map[string]func(*LaunchSpec){
		"auto accel":      func(s *LaunchSpec) { s.Accel = AccelAuto },
		"empty accel":     func(s *LaunchSpec) { s.Accel = "" },
		"relative dir":    func(s *LaunchSpec) { s.Dir = "vms/x" },
		"relative kernel": func(s *LaunchSpec) { s.Kernel = "vmlinuz" },
		"comma in path":   func(s *LaunchSpec) { s.Dir = "/a,b" },
		"tiny memory":     func(s *LaunchSpec) { s.MemoryMiB = 1 },
		"zero cpus":       func(s *LaunchSpec) { s.CPUs = 0 },
		"long socket":     func(s *LaunchSpec) { s.Dir = "/" + strings.Repeat("d", 100) },
		"relative ram":    func(s *LaunchSpec) { s.RAMPath = "ram" },
		"comma in ram":    func(s *LaunchSpec) { s.RAMPath = "/a,share=on" },
		"probe with ram":  func(s *LaunchSpec) { s.Probe, s.RAMPath = true, "/ram" },
		"probe incoming":  func(s *LaunchSpec) { s.Probe, s.Incoming = true, true },
		"probe network":   func(s *LaunchSpec) { s.Probe, s.Network = true, true },
	}
	for name, mod := range cases {
		s := baseSpec()
		mod(&s)
		if _, err := s.Cmdline(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	s := baseSpec()
	s.Dir = "/" + strings.Repeat("d", 100)
	_, err := s.Cmdline()
	if err == nil || !strings.Contains(err.Error(), "limit is 107") {
		t.Errorf("long socket error should name the limit: %v", err)
	}
}

func TestParseAccel(t *testing.T) {
	for in, want := range map[string]Accel{"": AccelAuto, "auto": AccelAuto, "KVM": AccelKVM, " tcg ": AccelTCG} {
		got, err := ParseAccel(in)
		if err != nil || got != want {
			t.Errorf("ParseAccel(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseAccel("hvf"); err == nil {
		t.Error("hvf accepted")
	}
}

func TestParseCPUInfoKHz(t *testing.T) {
	ci := "processor\t: 0\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2096.039\n\nprocessor\t: 1\ncpu MHz\t\t: 1800.000\n"
	if got := ParseCPUInfoKHz(ci); got != 2096039 {
		t.Fatalf("got %d", got)
	}
	if got := ParseCPUInfoKHz("processor: 0\n"); got != 0 {
		t.Fatalf("no MHz line: got %d", got)
	}
	if got := ParseCPUInfoKHz("cpu MHz : junk\n"); got != 0 {
		t.Fatalf("junk: got %d", got)
	}
}

func TestCapWriter(t *testing.T) {
	var sb strings.Builder
	c := &capWriter{w: &sb, limit: 5}
	for _, s := range []string{"ab", "cdef", "ghij"} {
		if n, err := c.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v: must always accept everything", s, n, err)
		}
	}
	if sb.String() != "abcde" || !c.truncated || c.n != 10 {
		t.Fatalf("got %q truncated=%v n=%d", sb.String(), c.truncated, c.n)
	}
	u := &capWriter{w: &sb}
	_, _ = u.Write(make([]byte, 1<<20))
	if u.truncated {
		t.Fatal("unlimited writer truncated")
	}
}

func TestShellExitCode(t *testing.T) {
	for _, c := range []struct {
		r    ExecResult
		want int
	}{
		{ExecResult{ExitCode: 0}, 0},
		{ExecResult{ExitCode: 42}, 42},
		{ExecResult{ExitCode: -1, Signal: "KILL"}, 137},
		{ExecResult{ExitCode: -1, Signal: "TERM"}, 143},
		{ExecResult{ExitCode: -1, Signal: "SIGINT"}, 130},
	} {
		if got := c.r.ShellExitCode(); got != c.want {
			t.Errorf("%+v: got %d want %d", c.r, got, c.want)
		}
	}
}

func TestParseLDD(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n"
	got, err := ParseLDD(out)
	if err != nil || strings.Join(got, ",") != "/lib/x86_64-linux-gnu/libz.so.1,/lib64/ld-linux-x86-64.so.2" {
		t.Fatalf("%v %v", got, err)
	}
	if _, err := ParseLDD("\tlibfoo.so.1 => not found\n"); err == nil {
		t.Fatal("missing library accepted")
	}
}

func TestCmdlineTBSize(t *testing.T) {
	for _, tc := range []struct {
		accel   Accel
		tb      int
		machine string
		accelOp string
		ok      bool
	}{
		{AccelTCG, 0, "microvm,accel=tcg,rtc=on,mem-merge=off,memory-backend=ram", "", true},
		{AccelTCG, 64, "microvm,rtc=on,mem-merge=off,memory-backend=ram", "tcg,tb-size=64", true},
		{AccelKVM, 64, "microvm,accel=kvm,rtc=on,mem-merge=off,memory-backend=ram", "", true},
		{AccelTCG, -1, "", "", false},
		{AccelTCG, 5000, "", "", false},
	} {
		s := baseSpec()
		s.Accel, s.TCGTBSizeMiB = tc.accel, tc.tb
		argv, err := s.Cmdline()
		if (err == nil) != tc.ok {
			t.Errorf("%s tb %d: %v", tc.accel, tc.tb, err)
			continue
		}
		if !tc.ok {
			continue
		}
		var machine, accelOp string
		for i, a := range argv[:len(argv)-1] {
			switch a {
			case "-machine":
				machine = argv[i+1]
			case "-accel":
				accelOp = argv[i+1]
			}
		}
		if machine != tc.machine || accelOp != tc.accelOp {
			t.Errorf("%s tb %d: -machine %q -accel %q", tc.accel, tc.tb, machine, accelOp)
		}
	}
}

func TestGuestASLROff(t *testing.T) {
	const v72 = "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"
	for _, c := range []struct {
		mode  string
		accel Accel
		qemu  string
		want  bool
	}{
		{GuestASLRAuto, AccelTCG, v72, true},
		{GuestASLRAuto, AccelTCG, "QEMU emulator version 6.2.0", true},
		{GuestASLRAuto, AccelTCG, "QEMU emulator version 8.0.0", false},
		{GuestASLRAuto, AccelTCG, "QEMU emulator version 10.1.2 (Debian)", false},
		{GuestASLRAuto, AccelKVM, v72, false},
		{GuestASLROn, AccelTCG, v72, false},
		{GuestASLRAuto, AccelTCG, "qemu from somewhere", false},
		{GuestASLRAuto, AccelTCG, "", false},
	} {
		if got := GuestASLROff(c.mode, c.accel, c.qemu); got != c.want {
			t.Errorf("GuestASLROff(%q, %s, %q) = %v, want %v", c.mode, c.accel, c.qemu, got, c.want)
		}
	}
	for in, want := range map[string]string{"": "auto", "auto": "auto", "on": "on"} {
		if got, err := ParseGuestASLR(in); err != nil || got != want {
			t.Errorf("ParseGuestASLR(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseGuestASLR("off"); err == nil {
		t.Error(`ParseGuestASLR("off") accepted`)
	}
}

// TestKernelStub: a bzImage's stub is its boot sector and setup and one
// empty sector, whose size the header says; anything else gets none.
func TestKernelStub(t *testing.T) {
	img := make([]byte, 64<<10)
	for i := range img {
		img[i] = byte(i * 7)
	}
	img[0x1f1] = 3 // setup sectors
	binary.LittleEndian.PutUint16(img[0x1fe:], 0xaa55)
	copy(img[0x202:], "HdrS")
	stub := stubOf(img[:1024], bytes.NewReader(img[1024:]))
	if len(stub) != 5*512 {
		t.Fatalf("stub of %d bytes, want %d", len(stub), 5*512)
	}
	want := bytes.Clone(img[:4*512])
	binary.LittleEndian.PutUint32(want[0x1f4:], 512/16)
	if !bytes.Equal(stub[:4*512], want) {
		t.Error("the stub's setup or its kernel size")
	}
	if !bytes.Equal(stub[4*512:], make([]byte, 512)) {
		t.Error("the stub's kernel is not an empty sector")
	}
	img[0x1f1] = 0 // 0 means 4 (the boot protocol)
	if stub := stubOf(img[:1024], bytes.NewReader(img[1024:])); len(stub) != 6*512 {
		t.Errorf("setup_sects 0: stub of %d bytes, want %d", len(stub), 6*512)
	}
	for name, bad := range map[string]func([]byte){
		"no boot flag": func(b []byte) { b[0x1fe] = 0 },
		"no HdrS":      func(b []byte) { copy(b[0x202:], "ELF!") },
	} {
		b := bytes.Clone(img)
		bad(b)
		if stubOf(b[:1024], bytes.NewReader(b[1024:])) != nil {
			t.Errorf("%s: a stub", name)
		}
	}
	if stubOf(img[:1024], bytes.NewReader(nil)) != nil {
		t.Error("a setup cut short: a stub")
	}
}
