package imagebuild

import (
	"errors"
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
	// A relative symlink that climbs out of the root is not followed: the
	// write fails, the host is untouched. An absolute one is the guest's:
	// the write lands where the guest finds it, inside the root.
	outside := t.TempDir()
	if err := os.Symlink("../../../../../../../.."+outside, filepath.Join(dir, "usr")); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := prepareImported(r, []byte("agent"), ""); !errors.Is(err, errLinkOut) {
		t.Fatalf("prepareImported through a symlink that leaves the root: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "usr")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "usr")); err != nil {
		t.Fatal(err)
	}
	if err := prepareImported(r, []byte("agent"), ""); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written outside the root: %v", ents)
	}
	if b, err := os.ReadFile(filepath.Join(dir, outside, "local/sbin/vmgate-agent")); err != nil || string(b) != "agent" {
		t.Fatalf("the agent through /usr -> %s: %q, %v", outside, b, err)
	}
	if err := os.Remove(filepath.Join(dir, "usr")); err != nil {
		t.Fatal(err)
	}
	if err := prepareImported(r, []byte("agent"), ""); err != nil {
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
	if err := prepareImported(r, []byte("agent"), ""); err != nil {
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
// in the root (merged /usr; an absolute link, the guest's), logs in with
// bash; one with only /bin/sh, or whose bash is a link out of the root or
// a loop, with sh.
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
		{"a link to itself", func(root string) error { return os.Symlink("/bin/bash", filepath.Join(root, "bin/bash")) }, image.ShellSh},
		{"a relative link out of the root", func(root string) error {
			return os.Symlink("../../../../../../../bin/bash", filepath.Join(root, "bin/bash"))
		}, image.ShellSh},
		{"an absolute link in the root", func(root string) error {
			if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(root, "usr/bin/bash"), nil, 0o755); err != nil {
				return err
			}
			return os.Symlink("/usr/bin/bash", filepath.Join(root, "bin/bash"))
		}, image.ShellBash},
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

// TestStatInAbsoluteShell: Alpine's /bin/sh is a link to /bin/busybox.
// os.Root refuses the absolute target; statIn finds the file as the guest
// does, so the import's "has a /bin/sh" check passes.
func TestStatInAbsoluteShell(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), []byte("bb"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/bin/busybox", filepath.Join(root, "bin/sh")); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Stat("bin/sh"); err == nil {
		t.Fatal("os.Root followed an absolute link: the premise of statIn is gone")
	}
	if fi, err := statIn(r, "bin/sh"); err != nil || !fi.Mode().IsRegular() || fi.Size() != 2 {
		t.Fatalf("statIn(bin/sh) = %v, %v; want bin/busybox", fi, err)
	}
}

// TestPrepareImportedSystemd: a root that keeps its systemd gets the
// agent's and the network's units, enabled, the masks, and no marker;
// an init that is not systemd, or none, is refused with the way out.
func TestPrepareImportedSystemd(t *testing.T) {
	mk := func(t *testing.T, init string) (string, *os.Root) {
		dir := t.TempDir()
		for p, c := range map[string]string{
			"etc/passwd":               "root:x:0:0:root:/root:/bin/sh\n",
			"etc/group":                "root:x:0:\n",
			"lib/systemd/systemd":      "systemd",
			"bin/busybox":              "busybox",
			"etc/vmgate/agent-is-init": "an export of an import",
		} {
			if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if init != "" {
			if err := os.MkdirAll(filepath.Join(dir, "sbin"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(init, filepath.Join(dir, "sbin/init")); err != nil {
				t.Fatal(err)
			}
		}
		r, err := os.OpenRoot(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return dir, r
	}
	dir, r := mk(t, "/lib/systemd/systemd")
	if err := prepareImported(r, []byte("agent"), image.InitSystemd); err != nil {
		t.Fatal(err)
	}
	got := tree(t, dir)
	for p, want := range map[string]string{
		"etc/systemd/system/vmgate-agent.service":                        "file:" + agentUnit,
		"etc/systemd/system/vmgate-network.service":                      "file:" + networkUnit,
		"etc/systemd/system/sysinit.target.wants/vmgate-agent.service":   "link:" + agentUnitPath,
		"etc/systemd/system/sysinit.target.wants/vmgate-network.service": "link:" + networkUnitPath,
		"etc/systemd/system/serial-getty@ttyS0.service":                  "link:/dev/null",
		"usr/local/sbin/vmgate-agent":                                    "file:agent",
	} {
		if got[p] != want {
			t.Errorf("%s: %q, want %q", p, got[p], want)
		}
	}
	if _, ok := got["etc/vmgate/agent-is-init"]; ok {
		t.Error("the marker is left: the agent would be the init")
	}
	if !strings.Contains(networkUnit, "ExecStart=/usr/local/sbin/vmgate-agent network\n") {
		t.Errorf("the network unit does not run the agent's network command:\n%s", networkUnit)
	}
	for _, c := range []struct{ init, errHas string }{
		{"/bin/busybox", "keeps only systemd (vmgate starts its agent as a systemd unit), and /sbin/init is /bin/busybox (import with --init agent"},
		{"", "/sbin/init cannot be used"},
		{"../../../../../../lib/systemd/systemd", "/sbin/init cannot be used: a symlink leads it out of the root"},
	} {
		dir, r := mk(t, c.init)
		if err := prepareImported(r, []byte("agent"), image.InitSystemd); err == nil || !strings.Contains(err.Error(), c.errHas) {
			t.Errorf("init %q: %v, want %q", c.init, err, c.errHas)
		}
		if _, err := os.Stat(filepath.Join(dir, "etc/vmgate/agent-is-init")); err != nil {
			t.Errorf("init %q: a refused root was changed: %v", c.init, err)
		}
	}
	for mode, want := range map[string]string{"": "", InitAgent: "", InitImage: image.InitSystemd} {
		if got, err := initInput(mode); err != nil || got != want {
			t.Errorf("initInput(%q) = %q, %v; want %q", mode, got, err, want)
		}
	}
	if _, err := initInput("openrc"); err == nil || !strings.Contains(err.Error(), "must be agent") {
		t.Errorf("initInput(openrc): %v", err)
	}
}
