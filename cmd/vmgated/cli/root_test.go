package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway/wire"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := Command()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		out  string // in the output
		code int    // exitCode of the error
	}{
		{[]string{"--help"}, "Available Commands:", 0},
		{[]string{"serve", "--help"}, "--max-vms", 0},
		{[]string{"help", "image", "import"}, "docker export", 0},
		{[]string{"policy"}, "check", 0},
		{[]string{"bench", "--help"}, "agent", 0},
		{[]string{"--version"}, "QEMU", 0},
		{[]string{"imag"}, "", wire.ExitUsage},
		{[]string{"image", "biuld"}, "", wire.ExitUsage},
		{[]string{"serve", "--bogus"}, "", wire.ExitUsage},
		{[]string{"policy", "check"}, "", wire.ExitUsage},
		{[]string{"bench", "report", "a", "b"}, "", wire.ExitUsage},
		{[]string{"completion", "bash"}, "bash completion", 0},
		{[]string{"receipt"}, "verify", 0},
		{[]string{"receipt", "verify"}, "", receiptUsage},
		{[]string{"receipt", "verify", "--nope", "x"}, "", receiptUsage},
		{[]string{"receipt", "key", "extra"}, "", wire.ExitUsage},
	} {
		out, err := run(t, tc.args...)
		if code := exitCode(err); code != tc.code || !strings.Contains(out, tc.out) {
			t.Errorf("%q: exit %d (%v), output %.200q; want %d and %q", tc.args, code, err, out, tc.code, tc.out)
		}
	}
	_, err := run(t, "image", "biuld")
	if err == nil || !strings.Contains(err.Error(), "did you mean build?") {
		t.Errorf("no suggestion: %v", err)
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{nil, 0},
		{errors.New("boom"), 1},
		{exitWith(3, nil), 3},
		{exitWith(wire.ExitVMFailed, errors.New("vm died")), wire.ExitVMFailed},
		{errUsage, wire.ExitUsage},
	} {
		if got := exitCode(tc.err); got != tc.code {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}
