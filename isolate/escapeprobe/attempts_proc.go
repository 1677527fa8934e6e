//go:build linux

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// fewProcesses is how many /proc entries a jail's own pid namespace may show
// (the probe, perhaps a jail init, and their threads' leaders).
const fewProcesses = 16

func readProc1Environ(*config) outcome {
	if os.Getpid() == 1 {
		return outcome{blocked: true, detail: "contained: pid 1 is the probe itself (own pid namespace)"}
	}
	b, err := os.ReadFile("/proc/1/environ")
	if err != nil {
		return outcome{blocked: true, detail: errText(err)}
	}
	comm, _ := os.ReadFile("/proc/1/comm")
	// The environment's contents are never put in the report.
	return outcome{blocked: false, detail: fmt.Sprintf("read %d bytes of the environment of pid 1 (%s), which is not the probe", len(b), strings.TrimSpace(string(comm)))}
}

func countProcesses(c *config) outcome {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return outcome{blocked: true, detail: errText(err)}
	}
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	if c.hostPID == 0 {
		return outcome{
			blocked: n <= fewProcesses,
			detail:  fmt.Sprintf("%d processes visible in /proc (contained means at most %d); no --host-pid given", n, fewProcesses),
		}
	}
	_, herr := os.Stat(fmt.Sprintf("/proc/%d", c.hostPID))
	hostVisible := herr == nil
	return outcome{
		blocked: n <= fewProcesses && !hostVisible,
		detail:  fmt.Sprintf("%d processes visible in /proc (contained means at most %d); host pid %d visible: %t", n, fewProcesses, c.hostPID, hostVisible),
	}
}

func procHostRoot(c *config) outcome {
	if c.hostPID == 0 {
		return skip("no --host-pid given")
	}
	return listDir(fmt.Sprintf("/proc/%d/root", c.hostPID))
}

func killHostPID(c *config) outcome {
	if c.hostPID == 0 {
		return skip("no --host-pid given")
	}
	return blockedIf(fmt.Sprintf("kill(%d, 0)", c.hostPID), unix.Kill(c.hostPID, 0))
}

func killParent(*config) outcome {
	ppid := os.Getppid()
	if ppid == 0 {
		return outcome{blocked: true, detail: "contained: getppid() is 0, the parent is outside our pid namespace"}
	}
	return blockedIf(fmt.Sprintf("kill(%d, 0) of our parent", ppid), unix.Kill(ppid, 0))
}

// ptraceProbe tries to become pid's tracer. PTRACE_SEIZE runs the same
// permission check as PTRACE_ATTACH but does not stop the target; it is
// made on a throw-away thread, whose exit detaches the target.
func ptraceProbe(pid int, what string) outcome {
	var err error
	onThrowawayThread(func() {
		err = unix.PtraceSeize(pid)
	})
	if err != nil {
		return outcome{blocked: true, detail: fmt.Sprintf("ptrace(PTRACE_SEIZE, %d) %s: %s", pid, what, errText(err))}
	}
	return outcome{blocked: false, detail: fmt.Sprintf("ptrace(PTRACE_SEIZE, %d) %s: succeeded (detached when the tracing thread exited)", pid, what)}
}

func ptraceHostPID(c *config) outcome {
	if c.hostPID == 0 {
		return skip("no --host-pid given")
	}
	return ptraceProbe(c.hostPID, "of the host pid")
}

func ptraceParent(*config) outcome {
	ppid := os.Getppid()
	if ppid == 0 {
		return outcome{blocked: true, detail: "contained: getppid() is 0, the parent is outside our pid namespace"}
	}
	return ptraceProbe(ppid, "of our parent")
}

func ptracePID1(*config) outcome {
	if os.Getpid() == 1 {
		return ptraceProbe(1, "of pid 1, the probe itself")
	}
	return ptraceProbe(1, "of pid 1")
}
