package cgroup_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/isolate/cgroup/cgrouptest"

	"github.com/vmgate/vmgate/isolate/cgroup"
)

const roleEnv = "VMGATE_CGROUP_TEST_ROLE"

// TestMain runs the helper roles: each waits for a line on stdin (sent
// after the test has moved it into a group), then does its thing.
func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "":
		os.Exit(m.Run())
	case "hog":
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		b := make([]byte, 512<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		fmt.Println("touched 512 MiB")
		os.Exit(0)
	case "forker":
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		var cmds []*exec.Cmd
		var firstErr error
		for i := 0; i < 40; i++ {
			c := exec.Command("sleep", "60")
			if err := c.Start(); err != nil {
				firstErr = err
				break
			}
			cmds = append(cmds, c)
		}
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		fmt.Printf("started %d, then: %v\n", len(cmds), firstErr)
		os.Exit(0)
	}
	os.Exit(2)
}

// runInGroup starts this binary in role, moves it into g, lets it go and
// returns its output and exit error.
func runInGroup(t *testing.T, g *cgroup.Group, role string) (string, error) {
	t.Helper()
	self, _ := os.Executable()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), roleEnv+"="+role)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal(err)
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	for _, d := range g.Dirs() {
		name := d[strings.LastIndex(d, "/")+1:]
		if !strings.Contains(string(b), name) {
			t.Errorf("process not in %s: /proc/PID/cgroup:\n%s", d, b)
		}
	}
	_, _ = io.WriteString(in, "go\n")
	in.Close()
	err = cmd.Wait()
	return out.String(), err
}

func TestGroup_PidsLimit(t *testing.T) {
	m := cgrouptest.RequiresCgroups(t)
	if !contains(m.Controllers(), "pids") {
		t.Fatalf("%s: no pids controller", m)
	}
	g, err := m.New("pids", cgroup.Limits{Pids: 12})
	if err != nil {
		t.Fatal(err)
	}
	defer removeAndCheck(t, g)
	out, err := runInGroup(t, g, "forker")
	t.Logf("%s: %s", m, out)
	if err != nil {
		t.Fatalf("forker: %v", err)
	}
	var n int
	if _, err := fmt.Sscanf(out, "started %d", &n); err != nil || n >= 12 || !strings.Contains(out, "resource temporarily unavailable") {
		t.Fatalf("pids limit 12 not enforced: %q", out)
	}
}

func TestGroup_MemoryLimit(t *testing.T) {
	m := cgrouptest.RequiresCgroups(t)
	if !contains(m.Controllers(), "memory") {
		t.Fatalf("%s: no memory controller", m)
	}
	g, err := m.New("mem", cgroup.Limits{MemoryBytes: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer removeAndCheck(t, g)
	out, err := runInGroup(t, g, "hog")
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("hog in a 128 MiB group: want OOM kill, got %v: %q (stat %v)", err, out, g.Stat())
	}
	t.Logf("hog killed as expected: %v; stat %v", err, g.Stat())
}

func TestGroup_CPUAndRemove(t *testing.T) {
	m := cgrouptest.RequiresCgroups(t)
	g, err := m.New("cpu", cgroup.Limits{CPUs: 0.5, Pids: 64, MemoryBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// A process still in the group is killed by Remove.
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	removeAndCheck(t, g)
	if err := <-done; err == nil {
		t.Fatal("sleep in a removed group was not killed")
	}
	if _, err := m.New("bad/id", cgroup.Limits{}); err == nil {
		t.Fatal("a VM id with a slash was accepted")
	}
}

func removeAndCheck(t *testing.T, g *cgroup.Group) {
	t.Helper()
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.Dirs() {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still exists: %v", d, err)
		}
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestManager_BaseRemovedFromOutside: an operator or a cleanup tool
// removes the daemon's group; the next VM's group makes it again, with
// its limits working, instead of every later start failing.
func TestManager_BaseRemovedFromOutside(t *testing.T) {
	m := cgrouptest.RequiresCgroups(t)
	g, err := m.New("before", cgroup.Limits{Pids: 32})
	if err != nil {
		t.Fatal(err)
	}
	var bases []string
	for _, d := range g.Dirs() {
		bases = append(bases, filepath.Dir(d))
	}
	removeAndCheck(t, g)
	for _, d := range bases {
		if err := os.Remove(d); err != nil {
			t.Fatalf("remove the daemon's group from outside: %v", err)
		}
	}
	g, err = m.New("after", cgroup.Limits{Pids: 12})
	if err != nil {
		t.Fatalf("a VM group after its parent was removed: %v", err)
	}
	defer removeAndCheck(t, g)
	if !contains(m.Controllers(), "pids") {
		return
	}
	out, err := runInGroup(t, g, "forker")
	if err != nil || !strings.Contains(out, "resource temporarily unavailable") {
		t.Fatalf("pids limit in the recreated group: %v %q", err, out)
	}
}
