package gateway_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/internal/testutil"
)

// fidelityCases are real commands with their own flags. Each runs
// through vm-exec as PROG ARGS… and, as the baseline, as a shell string
// in the guest (sh -c 'exec PROG ARGS…', quoted), in the same session;
// stdout, stderr and the exit code must be the same.
var fidelityCases = []struct {
	name  string
	argv  []string
	stdin string
	flags []string // vm-exec's own, before PROG
	// looseStderr: the shell words its own message for a program it
	// cannot run; the exit code must still match and both must say
	// something.
	looseStderr bool
	// stdout, when set, is the exact output both ways must give: where
	// both could be wrong alike (bytes that are not UTF-8, which the
	// baseline's shell string carries too).
	stdout string
}{
	{name: "echo", argv: []string{"echo", "hello"}},
	{name: "ls -h", argv: []string{"ls", "-h", "/"}},
	{name: "ls --help", argv: []string{"ls", "--help"}},
	{name: "ls -la -h", argv: []string{"ls", "-la", "-h", "/etc/hostname"}},
	{name: "grep -h", argv: []string{"grep", "-h", "root", "/etc/passwd"}},
	{name: "grep -e -e", argv: []string{"grep", "-e", "root", "-e", "daemon", "/etc/passwd"}},
	{name: "grep --help", argv: []string{"grep", "--help"}},
	{name: "sh -c with args", argv: []string{"sh", "-c", `echo "$0|$1|$2"`, "zero", "one two", ""}},
	{name: "head -n", argv: []string{"head", "-n", "2", "/etc/passwd"}},
	{name: "cat -n", argv: []string{"cat", "-n", "/etc/hostname"}},
	{name: "empty and spaced arguments", argv: []string{"printf", "[%s]", "", "a b", "  ", "", "'\"$HOME`"}},
	{name: "arguments like vm-exec's flags", argv: []string{"echo", "--timeout", "5s", "--session", "x", "-i", "-t", "-n", "-e", "-c", "--", "-h", "--help", "--version"}},
	{name: "echo -n -e", argv: []string{"echo", "-n", "-e", `a\tb`}},
	{name: "true", argv: []string{"true"}},
	{name: "false", argv: []string{"false"}},
	{name: "exit code", argv: []string{"sh", "-c", "echo out; echo err >&2; exit 42"}},
	{name: "signal exit", argv: []string{"sh", "-c", "kill -TERM $$"}},
	{name: "missing program", argv: []string{"no-such-program", "-x"}, looseStderr: true},
	{name: "not executable", argv: []string{"/etc/passwd"}, looseStderr: true},
	{name: "ls of a missing path", argv: []string{"ls", "/nonexistent"}},
	{name: "stdin piped", argv: []string{"cat"}, stdin: "line one\nline two\n"},
	{name: "stdin counted", argv: []string{"wc", "-c"}, stdin: strings.Repeat("x", 100000)},
	{name: "stdin closed", argv: []string{"cat"}, flags: []string{"-n"}},
	{name: "stdin transformed", argv: []string{"tr", "a-z", "A-Z"}, stdin: "shout\n"},
	{name: "sort -r", argv: []string{"sort", "-r"}, stdin: "a\nc\nb\n"},
	{name: "env -i", argv: []string{"env", "-i", "A=1", "B=two words", "env"}},
	{name: "sed -n", argv: []string{"sed", "-n", "1p", "/etc/passwd"}},
	{name: "awk -F", argv: []string{"awk", "-F:", "{print $1}", "/etc/passwd"}},
	{name: "find", argv: []string{"find", "/etc", "-maxdepth", "1", "-name", "host*", "-type", "f"}},
	{name: "test -d", argv: []string{"test", "-d", "/tmp"}},
	{name: "test -f", argv: []string{"test", "-f", "/nope"}},
	{name: "basename --", argv: []string{"basename", "--", "-x"}},
	{name: "expr", argv: []string{"expr", "2", "+", "3"}},
	{name: "seq -s", argv: []string{"seq", "-s", ",", "3"}},
	{name: "cut -d -f", argv: []string{"cut", "-d:", "-f1", "/etc/passwd"}},
	{name: "date -u -d", argv: []string{"date", "-u", "-d", "@0"}},
	{name: "stat -c", argv: []string{"stat", "-c", "%s %n", "/etc/hostname"}},
	{name: "python3 argv", argv: []string{"python3", "-c", "import sys; print(sys.argv[1:])", "-h", "--help", "--", "x y", ""}},
	{name: "printf of a NUL", argv: []string{"printf", `x\0y`}},
	{name: "uname -s", argv: []string{"uname", "-s"}},
	{name: "id -un", argv: []string{"id", "-un"}},
	{name: "working directory", argv: []string{"pwd"}, flags: []string{"-w", "/etc"}},
	{name: "arguments not UTF-8", argv: []string{"printf", "[%s]", "\xff\xfe", "a\x80b", "\xc3", "\xed\xa0\x80"},
		stdout: "[\xff\xfe][a\x80b][\xc3][\xed\xa0\x80]"},
	{name: "every byte in an argument", argv: []string{"printf", "%s", everyByte}, stdout: everyByte},
	{name: "env value not UTF-8", argv: []string{"printenv", "GREETING"}, flags: []string{"-e", "GREETING=\xff\x80 \xfe"}, stdout: "\xff\x80 \xfe\n"},
	{name: "shell string not UTF-8", argv: []string{"sh", "-c", "printf '%s|' '\xff' \"$0\"", "\xfe\x80"}, stdout: "\xff|\xfe\x80|"},
}

// everyByte holds every byte value but NUL, in order.
var everyByte = func() string {
	b := make([]byte, 0xff)
	for i := range b {
		b[i] = byte(i + 1)
	}
	return string(b)
}()

// shQuote quotes s for sh.
func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func TestGateway_DropInFidelity(t *testing.T) {
	d := gatewaytest.Start(t, testPolicy, nil)
	work := t.TempDir()
	run := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(testutil.Binary(t, "vm-exec"), append([]string{"--socket", d.Socket, "--session", "fidelity"}, args...)...)
		cmd.Dir = work
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		return testutil.Run(t, cmd)
	}
	for _, tc := range fidelityCases {
		t.Run(tc.name, func(t *testing.T) {
			quoted := make([]string, len(tc.argv))
			for i, a := range tc.argv {
				quoted[i] = shQuote(a)
			}
			var baseFlags []string
			for i := 0; i < len(tc.flags); i++ {
				switch tc.flags[i] {
				case "-w": // the baseline changes directory itself
					quoted = append([]string{"cd", shQuote(tc.flags[i+1]), "&&"}, quoted...)
					i++
				default:
					baseFlags = append(baseFlags, tc.flags[i])
				}
			}
			script := strings.Join(quoted, " ")
			if !strings.HasPrefix(script, "cd ") {
				script = "exec " + script
			}
			wantOut, wantErr, wantCode := run(tc.stdin, append(baseFlags, "-c", script)...)
			gotOut, gotErr, gotCode := run(tc.stdin, append(tc.flags, tc.argv...)...)
			if gotOut != wantOut || gotCode != wantCode {
				t.Errorf("vm-exec %q\nstdout %q, exit %d\nsh -c gives\nstdout %q, exit %d", tc.argv, gotOut, gotCode, wantOut, wantCode)
			}
			if tc.stdout != "" && (gotOut != tc.stdout || wantOut != tc.stdout) {
				t.Errorf("vm-exec %q: stdout %q, and %q by sh -c; want %q", tc.argv, gotOut, wantOut, tc.stdout)
			}
			switch {
			case tc.looseStderr && (gotErr == "" || wantErr == ""):
				t.Errorf("stderr %q, sh -c's %q: both should say why", gotErr, wantErr)
			case !tc.looseStderr && gotErr != wantErr:
				t.Errorf("stderr %q, sh -c's %q", gotErr, wantErr)
			}
		})
	}
	if n := len(fidelityCases); n < 30 {
		t.Errorf("only %d cases", n)
	}
	checkAuditBytes(t, d.Config.AuditPath)
}

// checkAuditBytes: the audit log holds the exact bytes of the arguments
// that are not UTF-8 (as {"b64": …}), and its chain verifies.
func checkAuditBytes(t *testing.T, path string) {
	t.Helper()
	if os.Getenv("VMGATE_TEST_BIN") == "" {
		return // the cases did not run
	}
	if _, err := audit.VerifyFile(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"printf", "%s", everyByte}
	found := 0
	for line := range bytes.Lines(data) {
		var r audit.Record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if slices.Equal(r.Argv, want) {
			found++
		}
	}
	if found != 2 { // the decision and the outcome
		t.Errorf("%d audit records of argv %q, want 2", found, want)
	}
}
