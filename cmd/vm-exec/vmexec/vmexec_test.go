package vmexec

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

var parseCases = []struct {
	args    []string
	argv    []string
	shell   bool
	wantErr bool
}{
	{[]string{"uname", "-a"}, []string{"uname", "-a"}, false, false},
	{[]string{"--", "-weird", "--timeout"}, []string{"-weird", "--timeout"}, false, false},
	{[]string{"--timeout", "5s", "wget", "-U", "Mozilla", "https://x"}, []string{"wget", "-U", "Mozilla", "https://x"}, false, false},
	{[]string{"-c", "echo hi | wc -c"}, []string{"echo hi | wc -c"}, true, false},
	{[]string{"-c", ""}, []string{""}, true, false},
	{[]string{"-c", "x", "extra"}, nil, false, true},
	{[]string{}, nil, false, true},
	{[]string{"--timeout", "-1s", "true"}, nil, false, true},
	{[]string{"--timeout", "banana", "true"}, nil, false, true},
	{[]string{"--list-sessions"}, nil, false, false},
	{[]string{"--list-sessions", "ls"}, nil, false, true},
	{[]string{"--end-session", "s1"}, nil, false, false},
	{[]string{"--session", "s1", "-e", "A=1", "-e", "B=2", "env"}, []string{"env"}, false, false},
	{[]string{"--nonsense", "true"}, nil, false, true},
	{[]string{"cp", "a", "b"}, []string{"cp", "a", "b"}, false, false},
	{[]string{"--", "cp", "a", "s:/b"}, []string{"cp", "a", "s:/b"}, false, false},
	{[]string{"df", "-h"}, []string{"df", "-h"}, false, false},
	{[]string{"ls", "--help"}, []string{"ls", "--help"}, false, false},
	{[]string{"grep", "-h", "root", "/etc/passwd"}, []string{"grep", "-h", "root", "/etc/passwd"}, false, false},
	{[]string{"-it", "bash"}, []string{"bash"}, false, false},
	{[]string{"-n", "-w", "/tmp", "sh", "-c", "pwd", "--timeout", "1s"}, []string{"sh", "-c", "pwd", "--timeout", "1s"}, false, false},
	{[]string{"-n", "-i", "true"}, nil, false, true},
	{[]string{"echo", "--session", "x", "-e", "A=1"}, []string{"echo", "--session", "x", "-e", "A=1"}, false, false},
	{[]string{"cp", "a", ":/b"}, nil, false, true},
	{[]string{"--session", "t", "cp", "a", "s:/b"}, nil, false, true},
	{[]string{"--put", "nocolon", "true"}, nil, false, true},
	{[]string{"--get", ":x", "true"}, nil, false, true},
	{[]string{"--receipt", "r.json", "--session", "s", "true"}, []string{"true"}, false, false},
	{[]string{"--receipt", "r.json", "-c", "echo"}, []string{"echo"}, true, false},
	{[]string{"--list-sessions", "--receipt", "r.json"}, nil, false, true},
	{[]string{"--receipt"}, nil, false, true},
	{[]string{"--session", "web", "--publish", "127.0.0.1:0:8000"}, nil, false, false},
	{[]string{"--session", "web", "--publish", "/tmp/app.sock:8000"}, nil, false, false},
	{[]string{"--publish", "8080:8000"}, nil, false, true},
	{[]string{"--session", "web", "--publish", "8080:8000", "ls"}, nil, false, true},
	{[]string{"--session", "web", "--publish", "8080:8000", "--pause"}, nil, false, true},
	{[]string{"--session", "web", "--publish", "8080"}, nil, false, true},
	{[]string{"--session", "web", "--publish", "host:8080:8000"}, nil, false, true},
	{[]string{"--session", "web", "--publish", ""}, nil, false, true},
	{[]string{"--image", "py", "python3", "-V"}, []string{"python3", "-V"}, false, false},
	{[]string{"--image", "py", "--session", "s", "-c", "true"}, []string{"true"}, true, false},
	{[]string{"--image", "py", "--session", "s", "--detach", "sleep", "9"}, []string{"sleep", "9"}, false, false},
	{[]string{"--image", "../py", "true"}, nil, false, true},
	{[]string{"--image", "", "true"}, nil, false, true},
	{[]string{"--image", "py@sha256:00", "true"}, nil, false, true},
	{[]string{"--image", "py", "--list-sessions"}, nil, false, true},
	{[]string{"--image", "py", "--session", "s", "--pause"}, nil, false, true},
	{[]string{"--image", "py", "--session", "s", "--procs"}, nil, false, true},
}

func TestParseVMExec(t *testing.T) {
	for _, c := range parseCases {
		o, err := parseVMExec(c.args)
		if (err != nil) != c.wantErr {
			t.Errorf("%q: err=%v wantErr=%v", c.args, err, c.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		if c.argv != nil && !reflect.DeepEqual(o.argv, c.argv) {
			t.Errorf("%q: argv %q want %q", c.args, o.argv, c.argv)
		}
		if o.shellMode != c.shell {
			t.Errorf("%q: shell %v", c.args, o.shellMode)
		}
	}
	o, _ := parseVMExec([]string{"--session", "s1", "-e", "A=1", "-e", "B=2", "--timeout", "2m", "env"})
	if o.session != "s1" || len(o.env) != 2 || o.timeout != 2*time.Minute {
		t.Fatalf("%+v", o)
	}
}

func FuzzParseVMExec(f *testing.F) {
	for _, c := range parseCases {
		f.Add(strings.Join(c.args, "\x00"))
	}
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, "\x00")
		o, err := parseVMExec(args)
		if err != nil || o.help || o.version {
			return
		}
		sessionOp := o.session != "" && (o.pause || len(o.forks) > 0 || o.pub.GuestPort != 0)
		if !o.list && o.endSession == "" && !sessionOp && len(o.argv) == 0 && (o.session == "" || len(o.puts)+len(o.gets) != 1) {
			t.Fatalf("accepted %q without a command", args)
		}
		if o.pub.GuestPort != 0 && (o.session == "" || len(o.argv) > 0 || o.pause || len(o.forks) > 0) {
			t.Fatalf("accepted --publish with more: %q", args)
		}
		if o.shellMode && len(o.argv) != 1 {
			t.Fatalf("shell mode with argv %q", o.argv)
		}
	})
}

func TestParseTransfers(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		session    string
		puts, gets []copySpec
		argv       []string
	}{
		{[]string{"--put", "./src:/work/", "--put", "a:b:/c", "--get", "/out/x:./x", "--get", "/y:C:/z", "make"}, "",
			[]copySpec{{"./src", "/work/"}, {"a:b", "/c"}}, []copySpec{{"./x", "/out/x"}, {"C:/z", "/y"}}, []string{"make"}},
		{[]string{"cp", "./report.txt", "s1:/tmp/"}, "s1", []copySpec{{"./report.txt", "/tmp/"}}, nil, nil},
		{[]string{"--session", "s1", "cp", ":/var/log/app", "logs"}, "s1", nil, []copySpec{{"logs", "/var/log/app"}}, nil},
		{[]string{"--session", "s1", "cp", "./a:b", "/c"}, "s1", nil, nil, []string{"cp", "./a:b", "/c"}},
	} {
		o, err := parseVMExec(tc.args)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if o.session != tc.session || !reflect.DeepEqual(o.puts, tc.puts) || !reflect.DeepEqual(o.gets, tc.gets) || !reflect.DeepEqual(o.argv, tc.argv) {
			t.Errorf("%q: session %q puts %v gets %v argv %q", tc.args, o.session, o.puts, o.gets, o.argv)
		}
	}
}

func TestParseFlagsBeforeProg(t *testing.T) {
	o, err := parseVMExec([]string{"-it", "-e", "A=1", "-eB", "--env-file", "f", "-w", "/srv", "bash", "-l"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.tty || !o.forceStdin || o.dir != "/srv" || !reflect.DeepEqual(o.env, []string{"A=1", "B"}) || !reflect.DeepEqual(o.envFiles, []string{"f"}) || !reflect.DeepEqual(o.argv, []string{"bash", "-l"}) {
		t.Fatalf("%+v", o)
	}
	for _, args := range [][]string{{"-h"}, {"--help", "ls"}, {"--version"}} {
		if o, err := parseVMExec(args); err != nil || !(o.help || o.version) {
			t.Errorf("%q: %+v %v", args, o, err)
		}
	}
	if _, err := parseVMExec([]string{"--bogus", "ls"}); err == nil || !strings.Contains(err.Error(), "unknown flag: --bogus") {
		t.Errorf("unknown flag: %v", err)
	}
}

func TestResolveEnv(t *testing.T) {
	local := map[string]string{"HOME": "/home/a", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := local[k]; return v, ok }
	files := map[string]string{"app.env": "# settings\nA=1\n\n  B=spaced\nHOME\nA=2\n", "bad.env": "MISSING\n"}
	read := func(f string) ([]byte, error) {
		if b, ok := files[f]; ok {
			return []byte(b), nil
		}
		return nil, errors.New("no such file")
	}
	o := &vmexecOpts{envFiles: []string{"app.env"}, env: []string{"EMPTY", "C=3", "A=9"}}
	if err := resolveEnv(o, lookup, read); err != nil {
		t.Fatal(err)
	}
	if want := []string{"A=9", "B=spaced", "HOME=/home/a", "EMPTY=", "C=3"}; !reflect.DeepEqual(o.env, want) {
		t.Errorf("env %q, want %q", o.env, want)
	}
	for _, o := range []*vmexecOpts{{env: []string{"NOPE"}}, {envFiles: []string{"bad.env"}}, {envFiles: []string{"missing.env"}}, {env: []string{"=x"}}} {
		if err := resolveEnv(o, lookup, read); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}
