package boot

import (
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeSystem records every state-changing call as a line of text and fails
// the calls listed in errs. Time advances only in Sleep.
type fakeSystem struct {
	files       map[string]string
	dirs        map[string]bool
	device      string        // path that appears after deviceAfter
	deviceAfter time.Duration // negative: never
	errs        map[string]error
	calls       []string
	now         time.Time
	start       time.Time
	sleeps      int
}

func newFake(cmdline string) *fakeSystem {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	return &fakeSystem{
		files: map[string]string{
			"/proc/cmdline":  cmdline + "\n",
			"/modules/order": "a.ko\nb.ko\n",
		},
		dirs:   map[string]bool{"/root/dev": true, "/root/proc": true, "/root/sys": true},
		device: "/dev/vda",
		errs:   map[string]error{},
		now:    start,
		start:  start,
	}
}

func (f *fakeSystem) call(format string, args ...any) error {
	c := fmt.Sprintf(format, args...)
	f.calls = append(f.calls, c)
	return f.errs[c]
}

func mountFlags(flags uintptr) string {
	names := []struct {
		bit  uintptr
		name string
	}{
		{unix.MS_RDONLY, "ro"}, {unix.MS_NOSUID, "nosuid"}, {unix.MS_NODEV, "nodev"},
		{unix.MS_NOEXEC, "noexec"}, {unix.MS_MOVE, "move"},
	}
	var out []string
	for _, n := range names {
		if flags&n.bit != 0 {
			out = append(out, n.name)
			flags &^= n.bit
		}
	}
	if flags != 0 {
		out = append(out, fmt.Sprintf("%#x", flags))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}

func (f *fakeSystem) Mount(source, target, fstype string, flags uintptr, data string) error {
	if fstype == "" {
		fstype = "-"
	}
	return f.call("mount %s %s %s %s %q", source, target, fstype, mountFlags(flags), data)
}

func (f *fakeSystem) Unmount(target string, flags int) error {
	detach := ""
	if flags&unix.MNT_DETACH != 0 {
		detach = " detach"
	}
	return f.call("unmount %s%s", target, detach)
}

func (f *fakeSystem) LoadModule(path, params string) error {
	return f.call("load %s %q", path, params)
}

func (f *fakeSystem) ReadFile(path string) ([]byte, error) {
	if err := f.call("read %s", path); err != nil {
		return nil, err
	}
	data, ok := f.files[path]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return []byte(data), nil
}

func (f *fakeSystem) Exists(path string) bool {
	if _, ok := f.files[path]; ok {
		return true
	}
	return path == f.device && f.deviceAfter >= 0 && f.now.Sub(f.start) >= f.deviceAfter
}

func (f *fakeSystem) IsDir(path string) bool      { return f.dirs[path] }
func (f *fakeSystem) RemoveAll(path string) error { return f.call("remove %s", path) }
func (f *fakeSystem) Chdir(dir string) error      { return f.call("chdir %s", dir) }
func (f *fakeSystem) Chroot(dir string) error     { return f.call("chroot %s", dir) }
func (f *fakeSystem) PowerOff() error             { return f.call("poweroff") }
func (f *fakeSystem) Now() time.Time              { return f.now }
func (f *fakeSystem) Sleep(d time.Duration)       { f.sleeps++; f.now = f.now.Add(d) }
func (f *fakeSystem) Exec(path string, argv, env []string) error {
	return f.call("exec %s %q %q", path, argv, env)
}

var earlyCalls = []string{
	`mount devtmpfs /dev devtmpfs nosuid,noexec "mode=0755"`,
	`mount proc /proc proc nosuid,nodev,noexec ""`,
	`mount sysfs /sys sysfs nosuid,nodev,noexec ""`,
	`read /proc/cmdline`,
	`read /modules/order`,
	`load /modules/a.ko ""`,
	`load /modules/b.ko ""`,
}

func join(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func run(t *testing.T, f *fakeSystem) string {
	t.Helper()
	var con strings.Builder
	runWith(f, &con)
	t.Logf("console:\n%s", con.String())
	return con.String()
}

func checkCalls(t *testing.T, f *fakeSystem, want []string) {
	t.Helper()
	if !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("calls:\n  %s\nwant:\n  %s", strings.Join(f.calls, "\n  "), strings.Join(want, "\n  "))
	}
}

func checkConsole(t *testing.T, con string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(con, w) {
			t.Errorf("console output lacks %q", w)
		}
	}
	for _, line := range strings.Split(strings.TrimSuffix(con, "\n"), "\n") {
		if !strings.HasPrefix(line, "vmgate-init: ") {
			t.Errorf("console line without prefix: %q", line)
		}
	}
}

func TestBootDefaults(t *testing.T) {
	f := newFake("console=ttyS0 panic=-1")
	f.deviceAfter = 100 * time.Millisecond
	con := run(t, f)
	checkCalls(t, f, join(earlyCalls, []string{
		`mount /dev/vda /root ext4 - ""`,
		`remove /init`,
		`remove /modules`,
		`mount /dev /root/dev - move ""`,
		`mount /proc /root/proc - move ""`,
		`mount /sys /root/sys - move ""`,
		`chdir /root`,
		`mount . / - move ""`,
		`chroot .`,
		`chdir /`,
		`exec /sbin/init ["/sbin/init"] ["HOME=/" "TERM=linux"]`,
	}))
	if f.sleeps != 5 {
		t.Errorf("polled %d times, want 5 (100ms / 20ms)", f.sleeps)
	}
	checkConsole(t, con,
		"vmgate-init: starting\n",
		"vmgate-init: loaded 2 of 2 modules (0 already present) in 0s\n",
		"vmgate-init: root device /dev/vda present after 100ms\n",
		"vmgate-init: mounted /dev/vda (ext4, rw) on /root\n",
		"vmgate-init: executing /sbin/init\n",
	)
}

// An imported root (the marker present) gets the agent as its init,
// unless init= names another program.
func TestBootImportedRoot(t *testing.T) {
	for _, tc := range []struct{ cmdline, exec string }{
		{"console=ttyS0", `exec /usr/local/sbin/vmgate-agent ["vmgate-init"] ["HOME=/" "TERM=linux"]`},
		{"init=/bin/sh", `exec /bin/sh ["/bin/sh"] ["HOME=/" "TERM=linux"]`},
	} {
		f := newFake(tc.cmdline)
		f.files["/etc/vmgate/agent-is-init"] = "" // seen after the switch, as the fake does not move roots
		run(t, f)
		if last := f.calls[len(f.calls)-1]; last != tc.exec {
			t.Errorf("%q: last call %s, want %s", tc.cmdline, last, tc.exec)
		}
	}
}

func TestBootCmdlineOptions(t *testing.T) {
	f := newFake(`root=/dev/vdb rootfstype=xfs "rootflags=noatime,discard" ro init=/usr/bin/agent`)
	f.device = "/dev/vdb"
	f.dirs = map[string]bool{"/root/dev": true} // no /root/proc, /root/sys
	f.errs[`load /modules/a.ko ""`] = syscall.EEXIST
	f.errs[`load /modules/b.ko ""`] = syscall.ENOEXEC
	f.errs["remove /modules"] = syscall.EROFS
	f.errs["unmount /sys detach"] = syscall.EINVAL
	con := run(t, f)
	checkCalls(t, f, join(earlyCalls, []string{
		`mount /dev/vdb /root xfs ro "noatime,discard"`,
		`remove /init`,
		`remove /modules`,
		`mount /dev /root/dev - move ""`,
		`unmount /proc detach`,
		`unmount /sys detach`,
		`chdir /root`,
		`mount . / - move ""`,
		`chroot .`,
		`chdir /`,
		`exec /usr/bin/agent ["/usr/bin/agent"] ["HOME=/" "TERM=linux"]`,
	}))
	checkConsole(t, con,
		"vmgate-init: load module b.ko: exec format error\n",
		"vmgate-init: loaded 0 of 2 modules (1 already present) in 0s\n",
		"vmgate-init: root device /dev/vdb present after 0s\n",
		"vmgate-init: mounted /dev/vdb (xfs, ro) on /root\n",
		"vmgate-init: remove /modules: read-only file system\n",
		"vmgate-init: unmount /sys: invalid argument\n",
	)
}

func TestBootProbe(t *testing.T) {
	f := newFake("console=ttyS0 vmgate.probe=1")
	f.deviceAfter = -1 // the probe must not wait for a disk
	con := run(t, f)
	checkCalls(t, f, join(earlyCalls, []string{"poweroff"}))
	checkConsole(t, con, "vmgate-init: probe ok\n")
	if f.sleeps != 0 {
		t.Errorf("probe slept %d times", f.sleeps)
	}
}

func TestBootProbePowerOffFails(t *testing.T) {
	f := newFake("vmgate.probe=1")
	f.errs["poweroff"] = syscall.EPERM
	con := run(t, f)
	checkCalls(t, f, join(earlyCalls, []string{"poweroff", "poweroff"}))
	checkConsole(t, con,
		"vmgate-init: probe ok\n",
		"vmgate-init: power off after probe: operation not permitted\n",
		"vmgate-init: power off: operation not permitted\n",
	)
}

func TestBootRootDeviceTimeout(t *testing.T) {
	f := newFake("")
	f.deviceAfter = -1
	con := run(t, f)
	checkCalls(t, f, join(earlyCalls, []string{"poweroff"}))
	if want := int(rootWaitTimeout / rootPollInterval); f.sleeps != want {
		t.Errorf("polled %d times, want %d", f.sleeps, want)
	}
	checkConsole(t, con,
		"vmgate-init: still waiting for root device /dev/vda (5s)\n",
		"vmgate-init: still waiting for root device /dev/vda (55s)\n",
		"vmgate-init: wait for root device /dev/vda: not present after 1m0s\n",
	)
	if n := strings.Count(con, "still waiting"); n != 11 {
		t.Errorf("%d still-waiting lines, want 11", n)
	}
}

func TestBootModuleParams(t *testing.T) {
	f := newFake(`console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 virtio-mmio.device=512@0xfeb00c00:11 a.opt "b.msg=hello world" b.flag vmgate.probe=1`)
	f.files["/modules/order"] = "virtio_mmio.ko\na.ko\nb.ko\n"
	run(t, f)
	checkCalls(t, f, join(earlyCalls[:5], []string{
		`load /modules/virtio_mmio.ko "device=512@0xfeb00e00:12 device=512@0xfeb00c00:11"`,
		`load /modules/a.ko "opt"`,
		`load /modules/b.ko "msg=\"hello world\" flag"`,
		"poweroff",
	}))
}

func TestBootPseudoFSAlreadyMounted(t *testing.T) {
	f := newFake("")
	f.errs[earlyCalls[0]] = syscall.EBUSY
	f.errs[earlyCalls[2]] = syscall.EBUSY
	run(t, f)
	if last := f.calls[len(f.calls)-1]; !strings.HasPrefix(last, "exec /sbin/init") {
		t.Fatalf("last call %q, want exec", last)
	}
}

func TestBootMissingModuleList(t *testing.T) {
	f := newFake("")
	delete(f.files, "/modules/order")
	con := run(t, f)
	if last := f.calls[len(f.calls)-1]; !strings.HasPrefix(last, "exec /sbin/init") {
		t.Fatalf("last call %q, want exec", last)
	}
	checkConsole(t, con, "vmgate-init: read module list: file does not exist\n")
}

func TestBootModuleOrderOddities(t *testing.T) {
	f := newFake("vmgate.probe=1")
	f.files["/modules/order"] = "a.ko\n\n  b.ko  \n../evil.ko\n"
	con := run(t, f)
	checkCalls(t, f, join(earlyCalls, []string{"poweroff"}))
	checkConsole(t, con,
		`vmgate-init: load module "../evil.ko": invalid file name`,
		"vmgate-init: loaded 2 of 3 modules",
	)
}

func TestBootFatalErrors(t *testing.T) {
	tests := []struct {
		name    string
		cmdline string
		fail    string
		err     error
		msg     string
	}{
		{"devtmpfs", "", earlyCalls[0], syscall.ENODEV, "vmgate-init: mount devtmpfs on /dev: no such device\n"},
		{"proc", "", earlyCalls[1], syscall.EPERM, "vmgate-init: mount proc on /proc: operation not permitted\n"},
		{"cmdline", "", earlyCalls[3], syscall.EIO, "vmgate-init: read kernel command line: input/output error\n"},
		{"root mount", "", `mount /dev/vda /root ext4 - ""`, syscall.EINVAL, "vmgate-init: mount root /dev/vda (ext4, rw) on /root: invalid argument\n"},
		{"chdir", "", "chdir /root", syscall.ENOENT, "vmgate-init: switch root: chdir /root: no such file or directory\n"},
		{"move root", "", `mount . / - move ""`, syscall.EINVAL, "vmgate-init: switch root: move /root to /: invalid argument\n"},
		{"chroot", "", "chroot .", syscall.EPERM, "vmgate-init: switch root: chroot: operation not permitted\n"},
		{"exec", "init=/nope", `exec /nope ["/nope"] ["HOME=/" "TERM=linux"]`, syscall.ENOENT, "vmgate-init: execute /nope: no such file or directory\n"},
		{"root by uuid", "root=UUID=1234", "", nil, "vmgate-init: root device \"UUID=1234\": only device paths are supported\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(tt.cmdline)
			if tt.fail != "" {
				f.errs[tt.fail] = tt.err
			}
			con := run(t, f)
			checkConsole(t, con, tt.msg)
			if last := f.calls[len(f.calls)-1]; last != "poweroff" {
				t.Fatalf("last call %q, want poweroff", last)
			}
			if tt.fail != "" && !slices.Contains(f.calls, tt.fail) {
				t.Fatalf("failing call %q never made", tt.fail)
			}
		})
	}
}

func TestSayFormat(t *testing.T) {
	var b strings.Builder
	say(&b, "%v", fmt.Errorf("mount root: %w", errors.New("boom")))
	if got := b.String(); got != "vmgate-init: mount root: boom\n" {
		t.Fatalf("got %q", got)
	}
}
