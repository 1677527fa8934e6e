package imagebuild

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/vm/image"
)

func TestWithGuestUser(t *testing.T) {
	const entry = "agent:x:%d:%d::/home/agent:/bin/sh\n"
	for _, tc := range []struct {
		name string
		in   accounts
		want accounts
		id   int
	}{
		{"nothing", accounts{}, accounts{passwd: []byte("agent:x:1000:1000::/home/agent:/bin/sh\n"), group: []byte("agent:x:1000:\n")}, 1000},
		{"others hold 1000 and 1001",
			accounts{passwd: []byte("root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh"), group: []byte("node:x:1000:\nb:x:1001:\n")},
			accounts{passwd: []byte("root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\nagent:x:1002:1002::/home/agent:/bin/sh\n"),
				group: []byte("node:x:1000:\nb:x:1001:\nagent:x:1002:\n")}, 1002},
		{"the tarball's agent is root",
			accounts{
				passwd:  []byte("root:x:0:0:root:/root:/bin/sh\nagent:x:0:0:root:/root:/bin/sh\n  agent:x:0:0::/:/bin/sh\n"),
				group:   []byte("root:x:0:agent\nagent:x:0:\nsudo:x:27:bob,agent,carol\n"),
				shadow:  []byte("root:*:19000:0:99999:7:::\nagent:$6$hash:19000:0:99999:7:::\n"),
				gshadow: []byte("root:*::agent\nagent:!::\nsudo:*:agent:agent,bob\n"),
			},
			accounts{
				passwd:  []byte("root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n"),
				group:   []byte("root:x:0:\nsudo:x:27:bob,carol\nagent:x:1000:\n"),
				shadow:  []byte("root:*:19000:0:99999:7:::\nagent:!:::::::\n"),
				gshadow: []byte("root:*::\nsudo:*::bob\nagent:!::\n"),
			}, 1000},
		{"the tarball's agent has its own free id", // only its own entries held 1000
			accounts{passwd: []byte("agent:x:1000:1000::/home/agent:/bin/bash\n"), group: []byte("agent:x:1000:\n"), shadow: []byte{}},
			accounts{passwd: []byte("agent:x:1000:1000::/home/agent:/bin/sh\n"), group: []byte("agent:x:1000:\n"), shadow: []byte("agent:!:::::::\n")}, 1000},
		{"comments and look-alikes stay",
			accounts{passwd: []byte("# agent:x:0:0::/:/bin/sh\nagents:x:1000:1000::/:/bin/sh\n"), group: []byte("x:x:5:agents\n")},
			accounts{passwd: []byte("# agent:x:0:0::/:/bin/sh\nagents:x:1000:1000::/:/bin/sh\n" + fmt.Sprintf(entry, 1001, 1001)),
				group: []byte("x:x:5:agents\nagent:x:1001:\n")}, 1001},
	} {
		got, id := withGuestUser(tc.in, "/bin/sh")
		if id != tc.id || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: id %d, got\n%s\nwant id %d,\n%s", tc.name, id, dumpAccounts(got), tc.id, dumpAccounts(tc.want))
		}
	}
}

func dumpAccounts(a accounts) string {
	return fmt.Sprintf("passwd %q\ngroup %q\nshadow %q\ngshadow %q", a.passwd, a.group, a.shadow, a.gshadow)
}

// FuzzWithGuestUser: whatever account files a tarball brings, the result
// has exactly one entry for the guest user in each file, with the new id,
// which is not 0 and which no other entry uses.
func FuzzWithGuestUser(f *testing.F) {
	f.Add("root:x:0:0::/root:/bin/sh\nagent:x:0:0::/:/bin/sh\n", "root:x:0:agent\nagent:x:0:\n", "agent:hash:::::::\n")
	f.Add("", "", "")
	f.Add(" agent:x:1000:0\r\nx:x:1001:1000\n", "g:x:1000:agent,\n", "\n")
	f.Fuzz(func(t *testing.T, passwd, group, shadow string) {
		out, id := withGuestUser(accounts{passwd: []byte(passwd), group: []byte(group), shadow: []byte(shadow)}, "/bin/sh")
		if id < firstGuestID {
			t.Fatalf("id %d", id)
		}
		for file, b := range map[string][]byte{"passwd": out.passwd, "group": out.group, "shadow": out.shadow} {
			n := 0
			for line := range strings.Lines(string(b)) {
				f := strings.Split(strings.TrimSpace(line), ":")
				if len(f) > 1 && f[0] == "agent" {
					n++
					if file != "shadow" && f[2] != strconv.Itoa(id) {
						t.Errorf("%s: agent entry %q, want id %d", file, line, id)
					}
					continue
				}
				for _, i := range []int{2, 3} {
					if file != "shadow" && len(f) > i && f[i] == strconv.Itoa(id) {
						t.Errorf("%s: %q uses the new id %d", file, line, id)
					}
				}
			}
			if n != 1 {
				t.Errorf("%s has %d agent entries:\n%s", file, n, b)
			}
		}
	})
}

func TestPrepareImported(t *testing.T) {
	dir := t.TempDir()
	for p, c := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nagent:x:0:0:root:/root:/bin/sh\n",
		"etc/group":  "root:x:0:agent\nagent:x:0:\n",
		"etc/shadow": "root:*:19000:0:99999:7:::\nagent:$6$x:19000:0:99999:7:::\n",
	} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A symlink out of the root is not followed: the write fails, the
	// host is untouched.
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "usr")); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := prepareImported(r, []byte("agent")); err == nil {
		t.Fatal("prepareImported wrote through a symlink that leaves the root")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written outside the root: %v", ents)
	}
	if err := os.Remove(filepath.Join(dir, "usr")); err != nil {
		t.Fatal(err)
	}
	if err := prepareImported(r, []byte("agent")); err != nil {
		t.Fatal(err)
	}
	// The tarball's agent, root in disguise, is replaced by a fresh user.
	passwd, _ := os.ReadFile(filepath.Join(dir, "etc/passwd"))
	if string(passwd) != "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n" {
		t.Errorf("passwd:\n%s", passwd)
	}
	for p, want := range map[string]string{
		"etc/group":  "root:x:0:\nagent:x:1000:\n",
		"etc/shadow": "root:*:19000:0:99999:7:::\nagent:!:::::::\n",
	} {
		if got, _ := os.ReadFile(filepath.Join(dir, p)); string(got) != want {
			t.Errorf("%s:\n%s\nwant\n%s", p, got, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "home/agent")); err != nil {
		t.Error(err)
	} else if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 1000 {
		t.Errorf("home/agent belongs to uid %d, want 1000", uid)
	}
	for _, p := range []string{"usr/local/sbin/vmgate-agent", "etc/vmgate/agent-is-init", "home/agent"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Error(err)
		}
	}
	// A second run changes nothing in passwd.
	if err := prepareImported(r, []byte("agent")); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "etc/passwd")); string(again) != string(passwd) {
		t.Errorf("passwd changed on a second run:\n%s", again)
	}
}

func TestProgressRender(t *testing.T) {
	p := newProgress(nil, slog.New(slog.NewTextHandler(io.Discard, nil)), 5)
	p.step("keys")
	p.step("building root filesystem (mmdebstrap bookworm)")
	w := &lines{fn: p.detail}
	_, _ = io.WriteString(w, "Unpacking a (1)\nSetting up a (1) ...\nSetting up b (2) ...\rpartial")
	got := p.render(83 * time.Second)
	want := "████░░░░░░░░░░░░░░░░ 2/5 1m23s building root filesystem (mmdebstrap bookworm): 2 packages set up · Setting up…"
	if got != want {
		t.Errorf("render:\n%q\nwant\n%q", got, want)
	}
	p.stop()
}

// TestShellOf: a root with bash, as a file or through a link that stays
// in the root (merged /usr), logs in with bash; one with only /bin/sh, or
// whose bash is a link out of the root, with sh.
func TestShellOf(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(root string) error
		want  string
	}{
		{"busybox", func(string) error { return nil }, image.ShellSh},
		{"bin/bash", func(root string) error { return os.WriteFile(filepath.Join(root, "bin/bash"), nil, 0o755) }, image.ShellBash},
		{"merged /usr", func(root string) error {
			if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(root, "usr/bin/bash"), nil, 0o755)
		}, image.ShellBash},
		{"a link out of the root", func(root string) error { return os.Symlink("/bin/bash", filepath.Join(root, "bin/bash")) }, image.ShellSh},
		{"a directory", func(root string) error { return os.Mkdir(filepath.Join(root, "bin/bash"), 0o755) }, image.ShellSh},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.Mkdir(filepath.Join(root, "bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("busybox", filepath.Join(root, "bin/sh")); err != nil {
				t.Fatal(err)
			}
			if err := c.setup(root); err != nil {
				t.Fatal(err)
			}
			r, err := os.OpenRoot(root)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if got := shellOf(r); got != c.want {
				t.Errorf("%q, want %q", got, c.want)
			}
		})
	}
}
