package image

import (
	"reflect"
	"strings"
	"testing"
)

// TestCommandDefaults: the image's Env comes before the caller's, which
// replaces an entry of the same name in place; the image's WorkingDir is
// the directory of a command that asks for none.
func TestCommandDefaults(t *testing.T) {
	src := &Source{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "bad", "=x", "NUL=a\x00b", "APP=1"}, WorkingDir: "/srv/app"}
	for _, tc := range []struct {
		name    string
		src     *Source
		env     []string
		want    []string
		dir     string
		wantDir string
	}{
		{"no source", nil, []string{"A=1"}, []string{"A=1"}, "", ""},
		{"no source, a dir", nil, nil, nil, "/tmp", "/tmp"},
		{"the image's", src, nil, []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "APP=1"}, "", "/srv/app"},
		{"the caller's win", src, []string{"APP=2", "GREETING=hi"}, []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "APP=2", "GREETING=hi"}, "/tmp", "/tmp"},
		{"a relative WorkingDir", &Source{WorkingDir: "app"}, nil, nil, "", ""},
		{"no configuration", &Source{}, []string{"A=1"}, []string{"A=1"}, "", ""},
	} {
		env := append([]string(nil), tc.env...)
		if got := tc.src.CommandEnv(env); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: env %q, want %q", tc.name, got, tc.want)
		}
		if !reflect.DeepEqual(env, tc.env) && !(len(env) == 0 && len(tc.env) == 0) {
			t.Errorf("%s: the caller's env changed: %q", tc.name, env)
		}
		if got := tc.src.CommandDir(tc.dir); got != tc.wantDir {
			t.Errorf("%s: dir %q, want %q", tc.name, got, tc.wantDir)
		}
	}
}

// TestCommandUser: an account's name is the image's user; a number is not.
func TestCommandUser(t *testing.T) {
	for user, want := range map[string]string{"": "", "node": "node", "node:staff": "node", "1000": "", "1000:1000": "", "Root": "", "www-data": "www-data"} {
		if got := (&Source{User: user}).CommandUser(); got != want {
			t.Errorf("User %q: %q, want %q", user, got, want)
		}
	}
	if got := (*Source)(nil).CommandUser(); got != "" {
		t.Errorf("no source: %q", got)
	}
}

// TestLoginShell: a root imported without bash logs in with sh; every
// other image (built, imported with bash, or from before the shell was
// recorded) with bash.
func TestLoginShell(t *testing.T) {
	for _, c := range []struct {
		src       *Source
		want, cmd string
	}{
		{nil, "bash -l", "bash -l -c echo hi"},
		{&Source{}, "bash -l", "bash -l -c echo hi"},
		{&Source{Shell: ShellBash}, "bash -l", "bash -l -c echo hi"},
		{&Source{Shell: ShellSh}, "sh -l", "sh -c echo hi"},
	} {
		if got := strings.Join(c.src.LoginShell(), " "); got != c.want {
			t.Errorf("%+v: %q, want %q", c.src, got, c.want)
		}
		if got := strings.Join(c.src.LoginCommand("echo hi"), " "); got != c.cmd {
			t.Errorf("%+v: a command %q, want %q", c.src, got, c.cmd)
		}
	}
}
