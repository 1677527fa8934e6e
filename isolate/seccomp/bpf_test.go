//go:build linux && cgo && amd64

package seccomp

import (
	"bytes"
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Seccomp return values (linux/seccomp.h).
const (
	retKillProcess = 0x80000000
	retErrno       = 0x00050000
	retAllow       = 0x7fff0000
	x32SyscallBit  = 0x40000000
)

// loadVM exports the compiled filter for opts and loads it into x/net/bpf's
// VM.
func loadVM(t *testing.T, opts Options) *bpf.VM {
	t.Helper()
	var buf bytes.Buffer
	if err := ExportBPF(opts, &buf); err != nil {
		t.Fatalf("ExportBPF: %v", err)
	}
	raw := buf.Bytes()
	if len(raw) == 0 || len(raw)%8 != 0 {
		t.Fatalf("BPF program of %d bytes", len(raw))
	}
	prog := make([]bpf.Instruction, 0, len(raw)/8)
	for i := 0; i < len(raw); i += 8 {
		ri := bpf.RawInstruction{
			Op: binary.NativeEndian.Uint16(raw[i:]),
			Jt: raw[i+2],
			Jf: raw[i+3],
			K:  binary.NativeEndian.Uint32(raw[i+4:]),
		}
		prog = append(prog, ri.Disassemble())
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatalf("bpf.NewVM: %v", err)
	}
	return vm
}

// seccompData builds struct seccomp_data for the VM. The kernel loads
// 32-bit words in host (little-endian) order, x/net/bpf loads them big-
// endian; so each 32-bit word is written big-endian, and each 64-bit
// argument as its low word then its high word, as a little-endian u64
// is laid out.
func seccompData(arch uint32, nr int, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], uint32(nr))
	binary.BigEndian.PutUint32(b[4:], arch)
	for i, a := range args {
		off := 16 + 8*i
		binary.BigEndian.PutUint32(b[off:], uint32(a))
		binary.BigEndian.PutUint32(b[off+4:], uint32(a>>32))
	}
	return b
}

func TestBPF_Decisions(t *testing.T) {
	const x86 = unix.AUDIT_ARCH_X86_64
	type call struct {
		name string
		arch uint32
		nr   int
		args []uint64
		want func(o Options) uint32 // expected return value
	}
	def := func(o Options) uint32 {
		if o.DefaultAction == "kill" {
			return retKillProcess
		}
		return retErrno | uint32(unix.EPERM)
	}
	allow := func(Options) uint32 { return retAllow }
	kill := func(Options) uint32 { return retKillProcess }
	eperm := func(Options) uint32 { return retErrno | uint32(unix.EPERM) }
	enosys := func(Options) uint32 { return retErrno | uint32(unix.ENOSYS) }
	ifOpt := func(pred func(Options) bool) func(Options) uint32 {
		return func(o Options) uint32 {
			if pred(o) {
				return retAllow
			}
			return def(o)
		}
	}
	threadFlags := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID)
	calls := []call{
		{"read", x86, unix.SYS_READ, nil, allow},
		{"execve", x86, unix.SYS_EXECVE, nil, allow},
		{"execveat", x86, unix.SYS_EXECVEAT, nil, def},
		{"socket AF_UNIX", x86, unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM | unix.SOCK_CLOEXEC}, allow},
		{"socket AF_UNIX with high bits", x86, unix.SYS_SOCKET, []uint64{1<<32 | unix.AF_UNIX}, def},
		{"socket AF_INET", x86, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM}, def},
		{"socket AF_INET6", x86, unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_DGRAM}, def},
		{"socket AF_NETLINK", x86, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW}, def},
		{"socket AF_PACKET", x86, unix.SYS_SOCKET, []uint64{unix.AF_PACKET, unix.SOCK_RAW}, def},
		{"socket AF_VSOCK", x86, unix.SYS_SOCKET, []uint64{unix.AF_VSOCK, unix.SOCK_STREAM}, def},
		{"socketpair AF_INET", x86, unix.SYS_SOCKETPAIR, []uint64{unix.AF_INET}, def},
		{"clone thread", x86, unix.SYS_CLONE, []uint64{threadFlags}, allow},
		{"clone CLONE_NEWUSER", x86, unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, def},
		{"clone CLONE_NEWNET thread", x86, unix.SYS_CLONE, []uint64{threadFlags | unix.CLONE_NEWNET}, def},
		{"clone3", x86, unix.SYS_CLONE3, nil, enosys},
		{"openat2", x86, unix.SYS_OPENAT2, nil, enosys},
		{"io_uring_setup", x86, unix.SYS_IO_URING_SETUP, nil, eperm},
		{"io_uring_enter", x86, unix.SYS_IO_URING_ENTER, nil, eperm},
		{"unshare", x86, unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER}, def},
		{"ptrace", x86, unix.SYS_PTRACE, nil, def},
		{"bpf", x86, unix.SYS_BPF, nil, def},
		{"userfaultfd", x86, unix.SYS_USERFAULTFD, nil, def},
		{"mknodat", x86, unix.SYS_MKNODAT, nil, def},
		{"personality", x86, unix.SYS_PERSONALITY, []uint64{0xffffffff}, def},
		{"prctl PR_SET_NO_NEW_PRIVS", x86, unix.SYS_PRCTL, []uint64{unix.PR_SET_NO_NEW_PRIVS, 1}, allow},
		{"prctl PR_SET_DUMPABLE", x86, unix.SYS_PRCTL, []uint64{unix.PR_SET_DUMPABLE, 1}, def},
		{"ioctl KVM_RUN", x86, unix.SYS_IOCTL, []uint64{5, 0xae80}, ifOpt(isKVM)},
		{"ioctl TIOCSTI", x86, unix.SYS_IOCTL, []uint64{0, unix.TIOCSTI}, def},
		{"connect", x86, unix.SYS_CONNECT, nil, ifOpt(isNet)},
		{"setsockopt TCP_NODELAY", x86, unix.SYS_SETSOCKOPT, []uint64{3, unix.SOL_TCP, unix.TCP_NODELAY}, ifOpt(isNet)},
		{"setsockopt SO_REUSEADDR", x86, unix.SYS_SETSOCKOPT, []uint64{3, unix.SOL_SOCKET, unix.SO_REUSEADDR}, def},
		{"readv", x86, unix.SYS_READV, nil, ifOpt(isIn)},
		{"i386 ABI", unix.AUDIT_ARCH_I386, 1, nil, kill},
		{"x32 ABI", x86, x32SyscallBit | unix.SYS_READ, nil, kill},
	}
	for _, o := range []Options{
		{Accel: "tcg", DefaultAction: "errno"},
		{Accel: "tcg", DefaultAction: "kill"},
		{Accel: "tcg", Network: true, Incoming: true, DefaultAction: "errno"},
		{Accel: "kvm", DefaultAction: "kill"},
	} {
		t.Run(optName(o), func(t *testing.T) {
			vm := loadVM(t, o)
			for _, c := range calls {
				got, err := vm.Run(seccompData(c.arch, c.nr, c.args...))
				if err != nil {
					t.Errorf("%s: %v", c.name, err)
					continue
				}
				if want := c.want(o); uint32(got) != want {
					t.Errorf("%s: filter returns %#x, want %#x", c.name, uint32(got), want)
				}
			}
		})
	}
}

// TestBPF_Netstack: the compiled filters of the netstack role answer as
// their rule tables say (TestRules_Netstack, TestRules_NetstackServing).
func TestBPF_Netstack(t *testing.T) {
	const x86 = unix.AUDIT_ARCH_X86_64
	threadFlags := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID)
	forkFlags := uint64(unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | uint64(unix.SIGCHLD))
	vforkFlags := uint64(unix.CLONE_VFORK | unix.CLONE_VM | uint64(unix.SIGCHLD))
	allow, eperm, enosys, kill := uint32(retAllow), uint32(retErrno|uint32(unix.EPERM)), uint32(retErrno|uint32(unix.ENOSYS)), uint32(retKillProcess)
	type call struct {
		name string
		nr   int
		args []uint64
		want uint32
	}
	// A foreign ABI is killed by every filter, the default-allow one too.
	i386 := call{"i386 ABI", 1, nil, kill}
	for _, tc := range []struct {
		opts  Options
		calls []call
	}{
		{Options{Program: "netstack"}, []call{
			{"execve", unix.SYS_EXECVE, nil, allow},
			{"execveat", unix.SYS_EXECVEAT, nil, eperm},
			{"fork", unix.SYS_FORK, nil, eperm},
			{"clone thread", unix.SYS_CLONE, []uint64{threadFlags}, allow},
			{"clone fork", unix.SYS_CLONE, []uint64{forkFlags}, eperm},
			{"clone vfork", unix.SYS_CLONE, []uint64{vforkFlags}, eperm},
			{"clone thread CLONE_NEWNET", unix.SYS_CLONE, []uint64{threadFlags | unix.CLONE_NEWNET}, eperm},
			{"clone3", unix.SYS_CLONE3, nil, enosys},
			{"socket AF_INET", unix.SYS_SOCKET, []uint64{unix.AF_INET}, allow},
			{"socket AF_UNIX", unix.SYS_SOCKET, []uint64{unix.AF_UNIX}, eperm},
			{"seccomp", unix.SYS_SECCOMP, []uint64{1}, allow},
			{"prctl PR_SET_NO_NEW_PRIVS", unix.SYS_PRCTL, []uint64{unix.PR_SET_NO_NEW_PRIVS, 1}, allow},
			{"prctl PR_SET_DUMPABLE", unix.SYS_PRCTL, []uint64{unix.PR_SET_DUMPABLE, 1}, eperm},
			{"bind", unix.SYS_BIND, nil, eperm},
			i386,
		}},
		{Options{Program: "netstack-serving"}, []call{
			{"execve", unix.SYS_EXECVE, nil, eperm},
			{"execveat", unix.SYS_EXECVEAT, nil, eperm},
			{"fork", unix.SYS_FORK, nil, eperm},
			{"vfork", unix.SYS_VFORK, nil, eperm},
			{"clone fork", unix.SYS_CLONE, []uint64{forkFlags}, eperm},
			{"clone vfork", unix.SYS_CLONE, []uint64{vforkFlags}, eperm},
			{"clone thread", unix.SYS_CLONE, []uint64{threadFlags}, allow},
			{"clone3", unix.SYS_CLONE3, nil, enosys},
			{"read", unix.SYS_READ, nil, allow},
			{"socket AF_UNIX", unix.SYS_SOCKET, []uint64{unix.AF_UNIX}, allow}, // the first filter's to refuse
			i386,
		}},
		{Options{Program: "netstack-serving", DefaultAction: "kill"}, []call{
			{"execve", unix.SYS_EXECVE, nil, kill},
			{"clone fork", unix.SYS_CLONE, []uint64{forkFlags}, kill},
			{"clone thread", unix.SYS_CLONE, []uint64{threadFlags}, allow},
			{"clone3", unix.SYS_CLONE3, nil, enosys},
		}},
	} {
		t.Run(tc.opts.Program+"-"+tc.opts.DefaultAction, func(t *testing.T) {
			vm := loadVM(t, tc.opts)
			for _, c := range tc.calls {
				arch := uint32(x86)
				if c.name == i386.name {
					arch = unix.AUDIT_ARCH_I386
				}
				got, err := vm.Run(seccompData(arch, c.nr, c.args...))
				if err != nil {
					t.Errorf("%s: %v", c.name, err)
					continue
				}
				if uint32(got) != c.want {
					t.Errorf("%s: filter returns %#x, want %#x", c.name, uint32(got), c.want)
				}
			}
		})
	}
}
