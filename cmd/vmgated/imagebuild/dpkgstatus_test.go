package imagebuild

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/vm/image"
)

// dpkgStatusCases are parseDpkgStatus's table, and the fuzz seeds.
var dpkgStatusCases = []struct {
	name, in string
	want     []image.Package
	err      string // a part of the error; "" for none
}{
	{name: "empty", in: ""},
	{name: "two packages, long fields, sorted",
		in: "Package: wget\nStatus: install ok installed\nVersion: 1.21.3-1+b2\nDescription: x\n more\n .\n\tmore\n\n" +
			"Package: curl\nStatus: install ok installed\nArchitecture: amd64\nVersion: 7.88.1-10+deb12u5\n",
		want: []image.Package{{Name: "curl", Version: "7.88.1-10+deb12u5"}, {Name: "wget", Version: "1.21.3-1+b2"}}},
	{name: "field names in any case, blank space around values, CRLF",
		in:   "package:  a0\r\nSTATUS: hold ok unpacked\r\nversion:1:2.0~rc1\r\n \r\n",
		want: []image.Package{{Name: "a0", Version: "1:2.0~rc1"}}},
	{name: "removed packages are not installed",
		in:   "Package: gone\nStatus: purge ok not-installed\n\nPackage: conf\nStatus: deinstall ok config-files\nVersion: 1\n\nPackage: half\nStatus: install reinstreq half-installed\nVersion: 2\n",
		want: []image.Package{{Name: "half", Version: "2"}}},
	{name: "two architectures",
		in:   "Package: libc6\nStatus: install ok installed\nVersion: 2.36-9\nArchitecture: i386\n\nPackage: libc6\nStatus: install ok installed\nVersion: 2.36-9\nArchitecture: amd64\n",
		want: []image.Package{{Name: "libc6", Version: "2.36-9"}, {Name: "libc6", Version: "2.36-9"}}},
	{name: "no package", in: "Status: install ok installed\nVersion: 1\n", err: "stanza at line 1: no Package field"},
	{name: "no status", in: "Package: a\nVersion: 1\n", err: "package a (line 1): no Status field"},
	{name: "bad status", in: "Package: a\nStatus: installed\nVersion: 1\n", err: `status "installed" is not WANT FLAG STATE`},
	{name: "unknown state", in: "Package: a\nStatus: install ok borked\nVersion: 1\n", err: "is not WANT FLAG STATE"},
	{name: "no version", in: "\n\nPackage: a\nStatus: install ok installed\n", err: `package a (line 3): "" is not a package version`},
	{name: "bad version", in: "Package: a\nStatus: install ok installed\nVersion: 1 2\n", err: `"1 2" is not a package version`},
	{name: "bad name", in: "Package: ../a\nStatus: install ok installed\nVersion: 1\n", err: `"../a" is not a package name`},
	{name: "non-ASCII name", in: "Package: aé\nStatus: install ok installed\nVersion: 1\n", err: "is not a package name"},
	{name: "duplicate field", in: "Package: a\nPackage: b\nStatus: install ok installed\nVersion: 1\n", err: "line 2: field package given twice"},
	{name: "not a field", in: "Package: a\nnonsense\n", err: `line 2: "nonsense" is not a field`},
	{name: "continuation first", in: " Package: a\n", err: "line 1: a continuation line with no field before it"},
}

func TestParseDpkgStatus(t *testing.T) {
	for _, tc := range dpkgStatusCases {
		got, err := parseDpkgStatus(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err == "" && !reflect.DeepEqual(got, tc.want):
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestParseDpkgStatusMatchesDpkgQuery: on this host's own dpkg database,
// the parser lists what `dpkg-query -W` lists (every package there is
// installed).
func TestParseDpkgStatusMatchesDpkgQuery(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Skip("no dpkg here")
	}
	b, err := os.ReadFile("/var/lib/dpkg/status")
	if err != nil {
		t.Skip(err)
	}
	if strings.Contains(string(b), " config-files\n") {
		t.Skip("packages in config-files state: dpkg-query -W lists them, the parser does not")
	}
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Package}\t${Version}\n").Output()
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseDpkgStatus(string(b))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, p := range got {
		lines = append(lines, p.Name+"\t"+p.Version)
	}
	want := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d packages, dpkg-query lists %d", len(lines), len(want))
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Fatalf("package %d: %q, dpkg-query says %q", i, lines[i], want[i])
		}
	}
}

// FuzzParseDpkgStatus: never panics; what it returns is valid, sorted,
// and parses back to itself.
func FuzzParseDpkgStatus(f *testing.F) {
	for _, tc := range dpkgStatusCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, in string) {
		pkgs, err := parseDpkgStatus(in)
		if err != nil {
			return
		}
		var b strings.Builder
		for i, p := range pkgs {
			if checkPackageName(p.Name) != nil || checkPackageVersion(p.Version) != nil {
				t.Fatalf("invalid %+v from %q", p, in)
			}
			if i > 0 && (pkgs[i-1].Name > p.Name || pkgs[i-1].Name == p.Name && pkgs[i-1].Version > p.Version) {
				t.Fatalf("not sorted: %v", pkgs)
			}
			fmt.Fprintf(&b, "Package: %s\nStatus: install ok installed\nVersion: %s\n\n", p.Name, p.Version)
		}
		again, err := parseDpkgStatus(b.String())
		if err != nil || len(again) != len(pkgs) || len(pkgs) > 0 && !reflect.DeepEqual(again, pkgs) {
			t.Fatalf("round trip of %v: %v, %v", pkgs, again, err)
		}
	})
}

// TestReadPackagesStaysInRoot: the status file is read through the root:
// a link out of it (absolute, or climbing above it) is an error and the
// host's file is not read; an oversized file is refused; no dpkg is no
// package.
func TestReadPackagesStaysInRoot(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "status")
	if err := os.WriteFile(outside, []byte("Package: host-secret\nStatus: install ok installed\nVersion: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, link := range map[string]string{"absolute": outside, "climbing": "../../../../../../../../.." + outside} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "var/lib/dpkg"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(link, filepath.Join(root, dpkgStatusFile)); err != nil {
				t.Fatal(err)
			}
			pkgs, err := readPackages(openRoot(t, root), maxDpkgStatus)
			if err == nil {
				t.Fatalf("read through a link out of the root: %v", pkgs)
			}
		})
	}
	root := t.TempDir()
	r := openRoot(t, root)
	if pkgs, err := readPackages(r, maxDpkgStatus); err != nil || pkgs != nil {
		t.Errorf("no dpkg: %v, %v", pkgs, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "var/lib/dpkg/updates"), 0o755); err != nil {
		t.Fatal(err)
	}
	status := "Package: a\nStatus: install ok installed\nVersion: 1\n"
	if err := os.WriteFile(filepath.Join(root, dpkgStatusFile), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	// dpkg's journal of pending changes is dpkg's to read, not ours: a
	// link in it to a host file is never followed.
	if err := os.Symlink(outside, filepath.Join(root, "var/lib/dpkg/updates/0001")); err != nil {
		t.Fatal(err)
	}
	if pkgs, err := readPackages(r, maxDpkgStatus); err != nil || !reflect.DeepEqual(pkgs, []image.Package{{Name: "a", Version: "1"}}) {
		t.Errorf("a root with a link to a host file in dpkg's journal: %v, %v", pkgs, err)
	}
	if pkgs, err := readPackages(r, int64(len(status))); err != nil || len(pkgs) != 1 {
		t.Errorf("a status file at the cap: %v, %v", pkgs, err)
	}
	if _, err := readPackages(r, int64(len(status))-1); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("an oversized status file: %v", err)
	}
}

func openRoot(t *testing.T, dir string) *os.Root {
	t.Helper()
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
