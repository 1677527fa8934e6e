package imagebuild

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/vm/image"
)

func TestValidateInputs(t *testing.T) {
	good := image.Inputs{Suite: "bookworm", Packages: []string{"python3-minimal", "libstdc++6", "g++"}, DiskSizeMiB: 4096}
	if err := validateInputs(good); err != nil {
		t.Fatalf("valid inputs rejected: %v", err)
	}
	bad := []image.Inputs{
		{Suite: "bookworm", Packages: []string{"--hook=rm -rf /"}, DiskSizeMiB: 4096},
		{Suite: "bookworm", Packages: []string{"curl,wget"}, DiskSizeMiB: 4096},
		{Suite: "bookworm", Packages: []string{"Curl"}, DiskSizeMiB: 4096},
		{Suite: "book worm", DiskSizeMiB: 4096},
		{Suite: "", DiskSizeMiB: 4096},
		{Suite: "bookworm", DiskSizeMiB: 10},
		{Suite: "bookworm", Mirror: "ftp://x", DiskSizeMiB: 4096},
	}
	for i, in := range bad {
		if err := validateInputs(in); err == nil {
			t.Errorf("case %d: %+v accepted", i, in)
		}
	}
}

func TestParseKernelDepends(t *testing.T) {
	out := "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n"
	got, err := ParseKernelDepends(out)
	if err != nil || got != "linux-image-6.1.0-57-amd64" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := ParseKernelDepends("linux-image-amd64\n  Depends: kmod\n"); err == nil {
		t.Fatal("no kernel dependency accepted")
	}
}

func TestMmdebstrapArgs(t *testing.T) {
	in := image.Inputs{Suite: "bookworm", Packages: []string{"curl", "wget"}}
	argv := MmdebstrapArgs(in, "/opt/it's/vmgated", "/tmp/spec.json")
	joined := strings.Join(argv, "\n")
	for _, want := range []string{
		"--variant=minbase", "--include=curl,wget", "bookworm", "/dev/null",
		`--customize-hook=VMGATE_REEXEC=image-customize '/opt/it'\''s/vmgated' "$1" '/tmp/spec.json'`,
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("argv lacks %q:\n%s", want, joined)
		}
	}
	if argv[len(argv)-1] != "/dev/null" {
		t.Errorf("no mirror given but last arg is %q", argv[len(argv)-1])
	}
	in.Mirror = "http://mirror.example/debian"
	argv = MmdebstrapArgs(in, "/x", "/y")
	if argv[len(argv)-1] != in.Mirror {
		t.Errorf("mirror not last: %v", argv)
	}
}

func TestCheckFree(t *testing.T) {
	if err := checkFree("/x", 4<<30, 3<<30); err != nil {
		t.Fatal(err)
	}
	err := checkFree("/x", 1<<30, 3<<30)
	if err == nil || !strings.Contains(err.Error(), "not enough disk space in /x") {
		t.Fatalf("got %v", err)
	}
}

func TestPruned(t *testing.T) {
	dirs := []string{"sound", "drivers/gpu"}
	for rel, want := range map[string]bool{
		"kernel/sound":                    true,
		"kernel/sound/core/snd.ko":        true,
		"kernel/drivers/gpu/drm/x.ko":     true,
		"kernel/drivers/gpux/y.ko":        false,
		"kernel/drivers/virtio/virtio.ko": false,
		"modules.order":                   false,
	} {
		if got := pruned(rel, dirs); got != want {
			t.Errorf("pruned(%q) = %v, want %v", rel, got, want)
		}
	}
}

func TestReplaceDirKeepsOldOnFailure(t *testing.T) {
	root := t.TempDir()
	out := filepath.Join(root, "image")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "old"), []byte("1"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A build dir that does not exist: the swap fails and the old image stays.
	if err := replaceDir(filepath.Join(root, "missing"), out); err == nil {
		t.Fatal("replace with a missing build dir succeeded")
	}
	if _, err := os.Stat(filepath.Join(out, "old")); err != nil {
		t.Fatalf("old image lost: %v", err)
	}
	tmp := filepath.Join(root, ".image.build-1")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "new"), []byte("2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := replaceDir(tmp, out); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(root)
	if len(ents) != 1 {
		t.Fatalf("leftovers beside the image: %v", ents)
	}
	if _, err := os.Stat(filepath.Join(out, "new")); err != nil {
		t.Fatal(err)
	}
}

func TestFindAgentRejectsDynamicBinary(t *testing.T) {
	// /bin/sh is dynamically linked on Debian.
	if _, err := FindAgent("/bin/sh"); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Fatalf("got %v", err)
	}
	if _, err := FindAgent(filepath.Join(t.TempDir(), "nope")); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("got %v", err)
	}
}
