//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/vmgate/vmgate/isolate/escapeprobe/attempts"
)

// modeEnv selects a helper mode when the probe re-executes itself: "exit"
// for exec-self.
const modeEnv = "VMGATE_ESCAPEPROBE_MODE"

func init() {
	// Keep the main goroutine on the main thread for the whole run, so no
	// throw-away goroutine (see onThrowawayThread) can ever land on it: the
	// main thread cannot exit, and a thread whose credentials, namespaces or
	// ptrace links were changed must exit. This also keeps the fork bomb's
	// parent thread alive.
	runtime.LockOSThread()
}

// config holds the command line: host names of things the jail must hide.
type config struct {
	out         string
	hostFiles   []string
	hostDir     string
	otherVMDir  string
	hostSocket  string
	hostPID     int
	writableDir string
	noKVM       bool
	only        map[string]bool
	skip        map[string]bool
}

// outcome is what an attempt function observed.
type outcome struct {
	blocked bool
	skipped bool
	detail  string
}

// attemptFunc makes one attempt. It must be safe to run unjailed as root.
type attemptFunc func(c *config) outcome

// impls maps every name in the attempts table to its implementation.
var impls = map[string]attemptFunc{
	"read-etc-shadow":          readEtcShadow,
	"read-etc-passwd":          readEtcPasswd,
	"read-host-files":          readHostFiles,
	"list-host-dir":            listHostDir,
	"write-host-dir":           writeHostDir,
	"stat-other-vm-dir":        statOtherVMDir,
	"list-other-vm-dir":        listOtherVMDir,
	"write-other-vm-dir":       writeOtherVMDir,
	"read-proc1-environ":       readProc1Environ,
	"count-processes":          countProcesses,
	"proc-host-root":           procHostRoot,
	"kill-host-pid":            killHostPID,
	"kill-parent":              killParent,
	"ptrace-host-pid":          ptraceHostPID,
	"ptrace-parent":            ptraceParent,
	"ptrace-pid-1":             ptracePID1,
	"mount-tmpfs":              mountTmpfs,
	"umount-root":              umountRoot,
	"unshare-user":             unshareUser,
	"unshare-mount":            unshareMount,
	"setns-host-mnt":           setnsHostMnt,
	"setns-host-net":           setnsHostNet,
	"chroot-dotdot":            chrootDotDot,
	"chroot-escape":            chrootEscape,
	"pivot-root":               pivotRoot,
	"exec-bin-sh":              execBinSh,
	"exec-self":                execSelf,
	"socket-inet":              socketInet,
	"socket-inet6":             socketInet6,
	"socket-netlink":           socketNetlink,
	"socket-packet":            socketPacket,
	"socket-vsock":             socketVsock,
	"connect-host-socket":      connectHostSocket,
	"connect-abstract-unix":    connectAbstractUnix,
	"mknod-char-device":        mknodCharDevice,
	"open-dev-mem":             openDev("/dev/mem"),
	"open-dev-kmsg":            openDev("/dev/kmsg"),
	"open-dev-sda":             openDev("/dev/sda"),
	"open-dev-vda":             openDev("/dev/vda"),
	"open-dev-kvm":             openDevKVM,
	"write-etc":                writeSystemDir("/etc"),
	"write-root":               writeSystemDir("/"),
	"write-tmp":                writeSystemDir("/tmp"),
	"write-own-vm-dir":         writeOwnVMDir,
	"read-dev-urandom":         readDevUrandom,
	"rlimit-nofile-raise":      rlimitRaise("RLIMIT_NOFILE", rlimitNOFILE),
	"rlimit-nproc-raise":       rlimitRaise("RLIMIT_NPROC", rlimitNPROC),
	"setuid-0":                 setID("setuid", sysSetuid, getuid),
	"setgid-0":                 setID("setgid", sysSetgid, getgid),
	"capset-regain":            capsetRegain,
	"capeff-zero":              capEffZero,
	"no-new-privs":             noNewPrivs,
	"fork-bomb":                forkBomb,
	"memory-hog":               memoryHog,
	"mmap-1tib":                mmap1TiB,
	"io-uring-setup":           ioUringSetup,
	"bpf-prog-load":            bpfProgLoad,
	"add-key":                  addKey,
	"userfaultfd":              userfaultfd,
	"perf-event-open":          perfEventOpen,
	"init-module":              initModule,
	"finit-module":             finitModule,
	"reboot":                   rebootProbe,
	"iopl":                     ioplProbe,
	"sethostname":              sethostnameSame,
	"write-sys-kernel":         writeSysKernel,
	"write-proc-core-pattern":  openForWrite("/proc/sys/kernel/core_pattern"),
	"write-proc-sysrq-trigger": openForWrite("/proc/sysrq-trigger"),
	"read-proc-kcore":          readProcKcore,
	"open-by-handle-at":        openByHandleAt,
}

func main() {
	switch os.Getenv(modeEnv) {
	case "exit":
		os.Exit(0)
	}
	c, list, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "escapeprobe:", err)
		os.Exit(2)
	}
	if list {
		for _, a := range attempts.All() {
			fmt.Printf("%s\t%s\n", a.Name, a.Doc)
		}
		return
	}
	rep, err := run(c, func(partial attempts.Report) error {
		if c.out == "" {
			return nil
		}
		return writeReport(c.out, partial)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "escapeprobe:", err)
		os.Exit(1)
	}
	fmt.Fprint(os.Stderr, attempts.Table(rep))
	if c.out == "" {
		if err := encodeReport(os.Stdout, rep); err != nil {
			fmt.Fprintln(os.Stderr, "escapeprobe:", err)
			os.Exit(1)
		}
	}
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// parseFlags parses the command line. list reports --list.
func parseFlags(args []string, stderr io.Writer) (c *config, list bool, err error) {
	c = &config{}
	fs := flag.NewFlagSet("escapeprobe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var hostFiles, only, skip stringList
	fs.StringVar(&c.out, "out", "", "write the JSON report to `FILE` (rewritten after every attempt) instead of stdout")
	fs.Var(&hostFiles, "host-file", "host file the jail must hide (repeatable)")
	fs.StringVar(&c.hostDir, "host-dir", "", "host directory the jail must hide")
	fs.StringVar(&c.otherVMDir, "other-vm-dir", "", "another VM's directory the jail must hide")
	fs.StringVar(&c.hostSocket, "host-socket", "", "host Unix socket the jail must hide")
	fs.IntVar(&c.hostPID, "host-pid", 0, "host process the jail must hide")
	fs.StringVar(&c.writableDir, "writable-dir", "", "the VM's own writable directory (positive control)")
	fs.BoolVar(&c.noKVM, "no-kvm", false, "KVM is not in use, so /dev/kvm must not be reachable")
	fs.Var(&only, "only", "run only the attempt `NAME` (repeatable)")
	fs.Var(&skip, "skip", "do not run the attempt `NAME` (repeatable)")
	fs.BoolVar(&list, "list", false, "list the attempts and exit")
	if err := fs.Parse(args); err != nil {
		return nil, false, err
	}
	if fs.NArg() > 0 {
		return nil, false, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.hostPID < 0 {
		return nil, false, fmt.Errorf("--host-pid %d: must be positive", c.hostPID)
	}
	c.hostFiles = hostFiles
	c.only = map[string]bool{}
	c.skip = map[string]bool{}
	for _, n := range only {
		if _, ok := attempts.Lookup(n); !ok {
			return nil, false, fmt.Errorf("--only %q: no such attempt", n)
		}
		c.only[n] = true
	}
	for _, n := range skip {
		if _, ok := attempts.Lookup(n); !ok {
			return nil, false, fmt.Errorf("--skip %q: no such attempt", n)
		}
		c.skip[n] = true
	}
	return c, list, nil
}

// run makes the selected attempts in table order. After each one it calls
// progress with the report so far; an error from progress ends the run.
func run(c *config, progress func(attempts.Report) error) (attempts.Report, error) {
	rep := attempts.Report{Results: []attempts.Result{}}
	for _, info := range attempts.All() {
		if len(c.only) > 0 && !c.only[info.Name] {
			continue
		}
		if c.skip[info.Name] {
			continue
		}
		fn := impls[info.Name]
		if fn == nil {
			return rep, fmt.Errorf("attempt %q has no implementation", info.Name)
		}
		o := runOne(fn, c)
		res := attempts.Result{
			Name:    info.Name,
			Blocked: o.blocked && !o.skipped,
			Control: info.Control,
			Skipped: o.skipped,
			Detail:  o.detail,
		}
		rep.Results = append(rep.Results, res)
		if err := progress(rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// runOne runs fn, turning a panic into a not-blocked outcome so that a
// probe bug never reads as a jail that holds.
func runOne(fn attemptFunc, c *config) (o outcome) {
	defer func() {
		if r := recover(); r != nil {
			o = outcome{blocked: false, detail: fmt.Sprintf("probe bug: panic: %v", r)}
		}
	}()
	return fn(c)
}

func encodeReport(w io.Writer, rep attempts.Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// writeReport rewrites path with rep. It writes in place (no rename), since
// the jail may allow writing the file but not creating its siblings.
func writeReport(path string, rep attempts.Report) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := encodeReport(f, rep); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
