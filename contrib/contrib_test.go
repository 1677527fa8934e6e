package contrib

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/isolate/seccomp"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netproc"
)

// maxExposure is the highest `systemd-analyze security` exposure level the
// shipped units may have (systemd 252 measured 2.0 for vmgated.service,
// guest networking included, since the netstacks run in
// vmgate-netstack@.service, and 1.1 for that; see docs/operator.md,
// "Service hardening", for what makes up the rest and why it cannot go
// lower without breaking the jail).
var maxExposure = map[string]float64{
	"vmgated.service":              2.0,
	"vmgate-netstack@test.service": 1.1,
}

// maxExposureTCP is vmgated.service's highest exposure with the drop-in
// for TCP listeners (docs/operator.md, "TCP listeners").
const maxExposureTCP = 2.8

// tcpDropIn is the drop-in that relaxes vmgated.service for TCP
// listeners on loopback, and what it must set: exactly these directives.
const tcpDropIn = "vmgated.service.d/tcp-listen.conf.example"

var tcpDropInSets = map[string]string{
	"PrivateNetwork":          "no",
	"RestrictAddressFamilies": "AF_INET AF_INET6",
	"IPAddressAllow":          "localhost",
}

// netstackRoot is the netstack unit's RootDirectory=, an empty directory
// that tmpfiles.d creates.
const netstackRoot = "/run/vmgate-netstack-root"

// units are the unit files shipped in contrib/systemd.
var units = []string{"vmgated.service", "vmgated.socket", "vmgate-netstack.socket", "vmgate-netstack@.service"}

// installedBinary is the path the units' ExecStart= names.
const installedBinary = "/usr/local/bin/vmgated"

// requireTool returns the path of a systemd tool; it skips the test when the
// tool is missing, or fails under CI (CI=true), where `make deps` installs
// it.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI: %s not installed (apt-get install systemd)", name)
		}
		t.Skipf("%s not installed (apt-get install systemd)", name)
	}
	return p
}

// stageUnits copies the units of contrib/systemd (and the given drop-ins,
// as installed: without ".example") into a temporary directory with
// ExecStart= pointing at a binary that exists (this test binary), so that
// verify judges the units and not the machine.
func stageUnits(t *testing.T, dropIns ...string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range append(units[:len(units):len(units)], dropIns...) {
		b, err := os.ReadFile(filepath.Join("systemd", f))
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte(installedBinary), []byte(self))
		dst := filepath.Join(dir, strings.TrimSuffix(f, ".example"))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// run runs a tool and returns its combined output.
func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

func TestUnits_Verify(t *testing.T) {
	sa := requireTool(t, "systemd-analyze")
	// With the drop-in for TCP listeners beside vmgated.service, where
	// systemd-analyze reads it as systemd would.
	dir := stageUnits(t, tcpDropIn)
	// A template is verified as an instance of it.
	paths := []string{filepath.Join(dir, "vmgated.service"), filepath.Join(dir, "vmgated.socket"),
		filepath.Join(dir, "vmgate-netstack.socket"), filepath.Join(dir, "vmgate-netstack@test.service")}
	if err := os.Symlink("vmgate-netstack@.service", paths[3]); err != nil {
		t.Fatal(err)
	}
	// systemd-analyze verify exits 0 on unknown keys and bad values
	// and only prints them: any output at all is a failure.
	out, err := run(t, sa, append([]string{"verify"}, paths...)...)
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}

	// The check must be able to fail: a unit with a directive this systemd
	// does not know has to produce output.
	bad := filepath.Join(dir, "bad.service")
	b, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte("[Service]\n"), []byte("[Service]\nNoSuchDirective=yes\n"), 1)
	if err := os.WriteFile(bad, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := run(t, sa, "verify", bad); !strings.Contains(out, "NoSuchDirective") {
		t.Fatalf("systemd-analyze verify did not report an unknown directive:\n%s", out)
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for \S+: ([0-9]+\.[0-9]+)`)

func TestUnits_SecurityExposure(t *testing.T) {
	sa := requireTool(t, "systemd-analyze")
	dir := stageUnits(t)
	if err := os.Symlink("vmgate-netstack@.service", filepath.Join(dir, "vmgate-netstack@test.service")); err != nil {
		t.Fatal(err)
	}
	for unit, max := range maxExposure {
		score, out := exposure(t, sa, filepath.Join(dir, unit))
		t.Logf("systemd-analyze security --offline=true %s: exposure %.1f (max %.1f)", unit, score, max)
		if score > max {
			t.Errorf("%s: exposure %.1f > %.1f: a hardening directive was removed or weakened\n%s", unit, score, max, out)
		}
	}
}

// exposure runs systemd-analyze security on a staged unit and returns its
// overall exposure and the report. --offline=true (systemd >= 250) reads
// the unit file instead of asking a running manager.
func exposure(t *testing.T, sa, path string) (float64, string) {
	t.Helper()
	out, err := run(t, sa, "security", "--offline=true", "--no-pager", path)
	if err != nil {
		t.Fatalf("systemd-analyze security --offline=true: %v\n%s", err, out)
	}
	m := exposureRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no overall exposure level in:\n%s", out)
	}
	score, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return score, out
}

// TestUnits_TCPListenDropIn: the drop-in for TCP listeners relaxes
// exactly what a loopback listener needs (PrivateNetwork=, AF_INET,
// loopback in IPAddressAllow=), each relaxation with its reason, and
// systemd reads it: the relaxed unit scores above the shipped one and
// below the documented bound.
func TestUnits_TCPListenDropIn(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("systemd", tcpDropIn))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	lines := strings.Split(string(b), "\n")
	for i, line := range lines {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || line == "[Service]" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("line %d: %q", i+1, line)
		}
		if _, dup := got[k]; dup {
			t.Errorf("%s set twice", k)
		}
		got[k] = v
		// Its reason: the comment block just above, opened by RELAXED.
		j := i - 1
		for j >= 0 && strings.HasPrefix(strings.TrimSpace(lines[j]), "#") && !strings.HasPrefix(strings.TrimSpace(lines[j]), "# RELAXED:") {
			j--
		}
		if j < 0 || !strings.HasPrefix(strings.TrimSpace(lines[j]), "# RELAXED:") {
			t.Errorf("%s= has no \"# RELAXED:\" comment above it", k)
		}
	}
	if !reflect.DeepEqual(got, tcpDropInSets) {
		t.Errorf("the drop-in sets %q, want exactly %q", got, tcpDropInSets)
	}

	sa := requireTool(t, "systemd-analyze")
	base, _ := exposure(t, sa, filepath.Join(stageUnits(t), "vmgated.service"))
	relaxed, out := exposure(t, sa, filepath.Join(stageUnits(t, tcpDropIn), "vmgated.service"))
	t.Logf("vmgated.service: exposure %.1f, with %s %.1f (max %.1f)", base, tcpDropIn, relaxed, maxExposureTCP)
	if relaxed <= base {
		t.Errorf("with the drop-in the exposure is %.1f, not above %.1f: systemd did not read it", relaxed, base)
	}
	if relaxed > maxExposureTCP {
		t.Errorf("with the drop-in the exposure is %.1f > %.1f\n%s", relaxed, maxExposureTCP, out)
	}
}

// directives returns the values of key in vmgated.service's [Service]
// section, in order.
func directives(t *testing.T, key string) []string {
	t.Helper()
	return unitDirectives(t, "vmgated.service", key)
}

// unitDirectives returns the values of key in the [Service] section of a
// unit of contrib/systemd, in order.
func unitDirectives(t *testing.T, unit, key string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join("systemd", unit))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var vals []string
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok && section == "[Service]" && k == key {
			vals = append(vals, v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return vals
}

// syscallGroups parses `systemd-analyze syscall-filter`: group name to
// members (system calls and nested groups).
func syscallGroups(t *testing.T, sa string) map[string][]string {
	t.Helper()
	out, err := exec.Command(sa, "syscall-filter", "--no-pager").Output()
	if err != nil {
		t.Fatalf("systemd-analyze syscall-filter: %v", err)
	}
	groups := map[string][]string{}
	cur := ""
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case !strings.HasPrefix(line, " ") && strings.HasPrefix(f[0], "@"):
			cur = f[0]
			groups[cur] = nil
		case cur != "":
			groups[cur] = append(groups[cur], f[0])
		}
	}
	if len(groups["@system-service"]) == 0 {
		t.Fatalf("could not parse systemd-analyze syscall-filter output:\n%s", out)
	}
	return groups
}

func expand(t *testing.T, groups map[string][]string, name string, into map[string]bool) {
	t.Helper()
	if !strings.HasPrefix(name, "@") {
		into[name] = true
		return
	}
	members, ok := groups[name]
	if !ok {
		t.Fatalf("unknown system call group %s", name)
	}
	for _, m := range members {
		expand(t, groups, m, into)
	}
}

// jailInitSyscalls are what the jail's init (isolate/jail_linux.go) calls
// after the namespaces exist and before its own filter is loaded: mounts,
// pivot_root, rlimits, capability drop, no_new_privs, seccomp, exec.
var jailInitSyscalls = []string{
	"mount", "umount2", "pivot_root", "chdir", "statfs", "mkdirat", "symlinkat", "unlinkat",
	"prlimit64", "capset", "capget", "prctl", "seccomp", "execve", "openat", "close",
}

// TestUnits_SyscallFilterCoversJail checks that the unit's seccomp filter,
// which the jail and QEMU inherit, lets through every system call the
// jail's init makes and every call the jail's own QEMU filter allows, for
// every QEMU configuration.
func TestUnits_SyscallFilterCoversJail(t *testing.T) {
	sa := requireTool(t, "systemd-analyze")
	groups := syscallGroups(t, sa)
	allowed := unitAllows(t, groups, "vmgated.service")
	// A call the unit refuses while the jail's filter answers it with an
	// errno (ENOSYS for clone3 and the like, so glibc falls back) must fail
	// with the jail's errno, not kill QEMU: both filters must return
	// SECCOMP_RET_ERRNO, and the later-loaded (the jail's) data wins.
	if e := directives(t, "SystemCallErrorNumber"); len(e) != 1 || e[0] == "kill" {
		t.Errorf("SystemCallErrorNumber= = %q, want an errno", e)
	}

	need := map[string]string{}
	for _, s := range jailInitSyscalls {
		need[s] = "jail init"
	}
	for _, accel := range []string{"tcg", "kvm"} {
		for _, network := range []bool{false, true} {
			for _, incoming := range []bool{false, true} {
				opts := seccomp.Options{Accel: accel, Network: network, Incoming: incoming}
				rs, err := seccomp.Rules(opts)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rs.Rules {
					if r.Action.Kind == seccomp.Allow {
						need[r.Syscall] = fmt.Sprintf("QEMU %+v", opts)
					}
				}
			}
		}
	}
	var missing []string
	for s, who := range need {
		if !allowed[s] {
			missing = append(missing, s+" ("+who+")")
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Fatalf("vmgated.service's SystemCallFilter= refuses system calls the jail needs:\n  %s", strings.Join(missing, "\n  "))
	}
	t.Logf("%d system calls allowed; all %d the jail and QEMU need are among them", len(allowed), len(need))
}

// unitAllows is the set of system calls a unit's SystemCallFilter= lets
// through.
func unitAllows(t *testing.T, groups map[string][]string, unit string) map[string]bool {
	t.Helper()
	filters := unitDirectives(t, unit, "SystemCallFilter")
	if len(filters) == 0 || strings.HasPrefix(filters[0], "~") {
		t.Fatalf("%s: SystemCallFilter= must start with an allow list, got %q", unit, filters)
	}
	allowed := map[string]bool{}
	for _, line := range filters {
		deny := strings.HasPrefix(line, "~")
		set := map[string]bool{}
		for _, n := range strings.Fields(strings.TrimPrefix(line, "~")) {
			expand(t, groups, n, set)
		}
		for n := range set {
			if deny {
				delete(allowed, n)
			} else {
				allowed[n] = true
			}
		}
	}
	return allowed
}

// TestUnits_NetstackUnit: vmgate-netstack@.service runs vmgated's
// netstack role on its connection, and its SystemCallFilter= lets through
// every call of the netstack's own allowlist (the one vmgated's jail
// loads when it runs the netstack itself).
func TestUnits_NetstackUnit(t *testing.T) {
	const unit = "vmgate-netstack@.service"
	for k, want := range map[string]string{"Environment": "VMGATE_REEXEC=" + netproc.Role, "ExecStart": installedBinary + " --channel-fd 0",
		"StandardInput": "socket", "DynamicUser": "yes", "RestrictAddressFamilies": "AF_INET AF_INET6", "PrivateUsers": "yes"} {
		if got := unitDirectives(t, unit, k); len(got) != 1 || got[0] != want {
			t.Errorf("%s: %s= %q, want %q", unit, k, got, want)
		}
	}
	sa := requireTool(t, "systemd-analyze")
	allowed := unitAllows(t, syscallGroups(t, sa), unit)
	rs, err := seccomp.Rules(seccomp.Options{Program: "netstack"})
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, r := range rs.Rules {
		// execve is the jail's own, before the netstack runs; systemd
		// execs the instance itself.
		if r.Action.Kind == seccomp.Allow && r.Syscall != "execve" && !allowed[r.Syscall] {
			missing = append(missing, r.Syscall)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%s refuses system calls the netstack needs: %q", unit, missing)
	}
}

// TestUnits_NetstackRoot: a compromised netstack under systemd sees an
// empty root with only vmgated's binary, its libraries and the resolver's
// files, can write (so run) nothing new, and reaches no loopback,
// link-local or multicast address.
func TestUnits_NetstackRoot(t *testing.T) {
	const unit = "vmgate-netstack@.service"
	if got := unitDirectives(t, unit, "RootDirectory"); len(got) != 1 || got[0] != netstackRoot {
		t.Errorf("RootDirectory= %q, want %s", got, netstackRoot)
	}
	// What is bound into it: exactly the binary, the libraries a binary
	// linked as vmgated is (this test binary: cgo, libseccomp) names, and
	// the resolver's files, which may be missing ("-").
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ldd", self).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", self, err)
	}
	libs, err := vm.ParseLDD(string(out))
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string{installedBinary, "-/etc/resolv.conf", "-/etc/hosts", "-/etc/nsswitch.conf"}, libs...)
	var bound []string
	for _, v := range unitDirectives(t, unit, "BindReadOnlyPaths") {
		bound = append(bound, strings.Fields(v)...)
	}
	slices.Sort(want)
	slices.Sort(bound)
	if !slices.Equal(bound, want) {
		t.Errorf("BindReadOnlyPaths= %q, want %q (ldd of a cgo build: %q)", bound, want, libs)
	}
	for _, k := range []string{"BindPaths", "ReadWritePaths", "ExecPaths", "NoExecPaths"} {
		if got := unitDirectives(t, unit, k); len(got) != 0 {
			t.Errorf("%s= %q: nothing else is bound, and systemd 252 ignores exec paths under RootDirectory=", k, got)
		}
	}
	// Every place in it that would be writable is an empty read-only
	// noexec tmpfs.
	tmpfs := map[string]string{}
	for _, v := range unitDirectives(t, unit, "TemporaryFileSystem") {
		for _, f := range strings.Fields(v) {
			p, opts, _ := strings.Cut(f, ":")
			tmpfs[p] = opts
		}
	}
	for _, p := range []string{"/tmp", "/var/tmp", "/dev/shm", "/run"} {
		if opts := strings.Split(tmpfs[p], ","); !slices.Contains(opts, "ro") || !slices.Contains(opts, "noexec") {
			t.Errorf("TemporaryFileSystem=%s:%s, want ro and noexec", p, tmpfs[p])
		}
	}
	deny := unitDirectives(t, unit, "IPAddressDeny")
	if len(deny) != 1 {
		t.Fatalf("IPAddressDeny= %q, want one line", deny)
	}
	for _, w := range []string{"localhost", "link-local", "multicast"} {
		if !slices.Contains(strings.Fields(deny[0]), w) {
			t.Errorf("IPAddressDeny=%s lacks %s", deny[0], w)
		}
	}
	if got := unitDirectives(t, unit, "IPAddressAllow"); len(got) != 0 {
		t.Errorf("IPAddressAllow= %q: it would win over IPAddressDeny=", got)
	}
	// No memfd: a file that is nowhere on disk cannot be mapped to run
	// either (the jail's netstack filter has no memfd_create).
	sa := requireTool(t, "systemd-analyze")
	if unitAllows(t, syscallGroups(t, sa), unit)["memfd_create"] {
		t.Error("memfd_create allowed")
	}
}

// TestUnits_NamespacesMatchJail checks RestrictNamespaces= against the
// clone flags the jail uses, so that neither can change without the other.
func TestUnits_NamespacesMatchJail(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "isolate", "jail_linux.go"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{"USER": "user", "NS": "mnt", "PID": "pid", "NET": "net", "IPC": "ipc", "UTS": "uts", "CGROUP": "cgroup"}
	var want []string
	for _, m := range regexp.MustCompile(`CLONE_NEW([A-Z]+)`).FindAllStringSubmatch(string(src), -1) {
		n, ok := names[m[1]]
		if !ok {
			t.Fatalf("jail uses CLONE_NEW%s, unknown to this test", m[1])
		}
		if !slices.Contains(want, n) {
			want = append(want, n)
		}
	}
	slices.Sort(want)
	vals := directives(t, "RestrictNamespaces")
	if len(vals) != 1 {
		t.Fatalf("RestrictNamespaces= set %d times, want once", len(vals))
	}
	got := strings.Fields(vals[0])
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("RestrictNamespaces=%s, but the jail creates %v", vals[0], want)
	}
}

// TestUnits_NoJailBreakingDirectives guards the relaxations documented in
// the unit: each of these directives, if set, breaks the jail or QEMU.
func TestUnits_NoJailBreakingDirectives(t *testing.T) {
	why := map[string]string{
		"MemoryDenyWriteExecute": "QEMU TCG generates code into writable+executable memory",
		"ProtectKernelTunables":  "its read-only /proc/sys mount makes the jail's fresh /proc mount fail (EPERM)",
		"ProtectKernelLogs":      "its /proc/kmsg mount makes the jail's fresh /proc mount fail (EPERM)",
		"ProtectControlGroups":   "on systemd 252 it makes the delegated cgroup read-only",
		"ProcSubset":             "vmgated reads /proc/meminfo and /proc/cpuinfo",
		"RuntimeDirectory":       "starting the service chowns /run/vmgate recursively, the socket included, away from vmgate-users",
	}
	for k, reason := range why {
		for _, v := range directives(t, k) {
			if v != "no" && v != "false" && v != "" {
				t.Errorf("%s=%s: %s", k, v, reason)
			}
		}
	}
	for k, want := range map[string]string{"Delegate": "yes", "KillMode": "control-group", "Type": "notify", "User": "vmgate", "NoNewPrivileges": "yes", "CapabilityBoundingSet": "",
		"PrivateNetwork": "yes", "RestrictAddressFamilies": "AF_UNIX", "PrivateDevices": "yes", "BindPaths": "-/dev/kvm"} {
		if got := directives(t, k); len(got) != 1 || got[0] != want {
			t.Errorf("%s= %q, want %q", k, got, want)
		}
	}
}

// daemonTasks is what the task bound of vmgated.service keeps for the
// daemon itself (its Go runtime's threads) beside its QEMUs.
const daemonTasks = 256

// TestUnits_ResourceBounds: vmgated.service bounds its memory and its
// tasks, so that a daemon that grows without end (issue 43: a QEMU's
// monitor line read without a bound) is stopped inside its unit, not by
// the host's OOM killer; a QEMU killed at the bound ends its VM, not the
// service. The task bound leaves room for the daemon and for every QEMU
// the defaults run at once (--max-vms, the pool and the clone launched
// ahead of one shape, a template build) at its own cgroup's cap: a guest
// that makes its QEMU spawn threads meets its VM's cap first, never the
// unit's, which would crash the daemon (the Go runtime dies when it
// cannot make a thread). docs/operator.md names the shipped values.
func TestUnits_ResourceBounds(t *testing.T) {
	mem := directives(t, "MemoryMax")
	if len(mem) != 1 || mem[0] == "" || mem[0] == "infinity" {
		t.Errorf("MemoryMax= %q, want one bound", mem)
	}
	tasks := directives(t, "TasksMax")
	n := 0
	if len(tasks) == 1 {
		n, _ = strconv.Atoi(tasks[0])
	}
	qemus := gateway.DefaultMaxVMs + gateway.DefaultPoolSize + gateway.DefaultAhead + 1
	perVM := int(vm.JailLimits(512, 1).Pids)
	if need := daemonTasks + qemus*perVM; n < need {
		t.Errorf("TasksMax= %q, want a number of at least %d (%d for the daemon, %d QEMUs of %d tasks)", tasks, need, daemonTasks, qemus, perVM)
	}
	if got := directives(t, "OOMPolicy"); len(got) != 1 || got[0] != "continue" {
		t.Errorf("OOMPolicy= %q, want continue: a QEMU killed for memory must not stop the service", got)
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operator.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"MemoryMax", "TasksMax"} {
		for _, v := range directives(t, d) {
			if w := "`" + d + "=" + v + "`"; !bytes.Contains(doc, []byte(w)) {
				t.Errorf("docs/operator.md does not name %s", w)
			}
		}
	}
}

// TestSysusersTmpfiles applies the sysusers.d and tmpfiles.d files to a
// scratch root with the real tools: they must parse without a word of
// complaint and produce the users, groups and directories the units and
// install.sh rely on.
func TestSysusersTmpfiles(t *testing.T) {
	sysusers := requireTool(t, "systemd-sysusers")
	root := t.TempDir()
	for _, f := range []string{"sysusers.d/vmgate.conf", "tmpfiles.d/vmgate.conf"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(root, "etc", f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// With --root, a bare file name is looked up in the root's
	// configuration directories.
	out, err := run(t, sysusers, "--root="+root, "vmgate.conf")
	if err != nil || strings.Contains(out, "ignoring") || strings.Contains(out, "Failed") {
		t.Fatalf("systemd-sysusers: %v\n%s", err, out)
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc", "passwd"))
	group, _ := os.ReadFile(filepath.Join(root, "etc", "group"))
	if !regexp.MustCompile(`(?m)^vmgate:x:\d+:\d+:[^:]*:/:/usr/sbin/nologin$`).Match(passwd) {
		t.Errorf("no user vmgate in /etc/passwd:\n%s", passwd)
	}
	for _, re := range []string{`(?m)^vmgate:x:\d+:$`, `(?m)^vmgate-users:x:\d+:vmgate$`, `(?m)^kvm:x:\d+:vmgate$`} {
		if !regexp.MustCompile(re).Match(group) {
			t.Errorf("/etc/group does not match %s:\n%s", re, group)
		}
	}

	if os.Geteuid() != 0 {
		t.Skip("systemd-tmpfiles --create changes owners: needs root")
	}
	tmpfiles := requireTool(t, "systemd-tmpfiles")
	out, err = run(t, tmpfiles, "--root="+root, "--create", "vmgate.conf")
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-tmpfiles: %v\n%s", err, out)
	}
	uid := regexp.MustCompile(`(?m)^vmgate:x:(\d+):`).FindSubmatch(passwd)
	if uid == nil {
		t.Fatal("no vmgate uid")
	}
	for dir, want := range map[string]string{
		"var/lib/vmgate": "755 vmgate vmgate", "var/log/vmgate": "750 vmgate vmgate",
		"run/vmgate": "755 vmgate vmgate", "etc/vmgate": "750 root vmgate",
		strings.TrimPrefix(netstackRoot, "/"): "555 root root",
	} {
		out, err := exec.Command("stat", "-c", "%a %u %g", filepath.Join(root, dir)).Output()
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			continue
		}
		f := strings.Fields(string(out))
		got := f[0] + " " + name(f[1], string(uid[1])) + " " + name(f[2], string(uid[1]))
		if got != want {
			t.Errorf("%s: %s, want %s", dir, got, want)
		}
	}
}

// name maps the numeric ids the scratch root uses back to names (the
// vmgate user and group share one id there).
func name(id, vmgate string) string {
	switch id {
	case "0":
		return "root"
	case vmgate:
		return "vmgate"
	}
	return id
}

// TestLogrotate: the snippet lets vmgated continue the audit chain: it
// moves the file and reloads, never truncates it in place, and leaves
// the new file to the daemon.
func TestLogrotate(t *testing.T) {
	b, err := os.ReadFile("logrotate.d/vmgate")
	if err != nil {
		t.Fatal(err)
	}
	var directives []string
	for _, line := range strings.Split(string(b), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			directives = append(directives, l)
		}
	}
	conf := strings.Join(directives, "\n")
	for _, want := range []string{"/var/log/vmgate/audit.jsonl {", "nocreate", "systemctl reload vmgated.service"} {
		if !strings.Contains(conf, want) {
			t.Errorf("logrotate snippet lacks %q", want)
		}
	}
	if strings.Contains(conf, "copytruncate") {
		t.Error("copytruncate cuts the chain")
	}
	if lr, err := exec.LookPath("logrotate"); err == nil {
		if out, err := exec.Command(lr, "-d", "logrotate.d/vmgate").CombinedOutput(); err != nil && strings.Contains(string(out), "error") {
			t.Errorf("logrotate -d: %v\n%s", err, out)
		}
	}
}
