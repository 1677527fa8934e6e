package reexec

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func init() {
	Register("reexec-test-ok", func(args []string) error {
		if os.Getenv(ChildEnv) != "" {
			os.Exit(3) // the role's name must not reach it
		}
		return nil
	})
}

func TestMain(m *testing.M) {
	MaybeRunChild()
	os.Exit(m.Run())
}

func TestRegisterRefusesDuplicatesAndEmpty(t *testing.T) {
	for name, fn := range map[string]func(){
		"duplicate": func() { Register("reexec-test-ok", func([]string) error { return nil }) },
		"empty":     func() { Register("", func([]string) error { return nil }) },
		"nil":       func() { Register("x", nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			fn()
		}()
	}
}

func TestChildCommandEnv(t *testing.T) {
	got := ChildCommandEnv([]string{"A=1", ChildEnv + "=old", "B=2"}, "new")
	if want := []string{"A=1", "B=2", ChildEnv + "=new"}; !slices.Equal(got, want) {
		t.Errorf("%q, want %q", got, want)
	}
}

// TestMaybeRunChild re-execs this test binary as a role: the role runs,
// without its name in the environment, and an unknown role exits 2.
func TestMaybeRunChild(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for role, want := range map[string]int{"reexec-test-ok": 0, "no-such-role": 2} {
		cmd := exec.Command(self)
		cmd.Env = ChildCommandEnv(os.Environ(), role)
		out, _ := cmd.CombinedOutput()
		if got := cmd.ProcessState.ExitCode(); got != want {
			t.Errorf("role %s: exit %d, want %d: %s", role, got, want, out)
		}
		if want == 2 && !strings.Contains(string(out), "unknown re-exec role") {
			t.Errorf("unknown role: %q", out)
		}
	}
}
