package image

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestInputsDigestIgnoresOrderAndDuplicates(t *testing.T) {
	a := Inputs{BuilderVersion: 1, Suite: "bookworm", Packages: []string{"curl", "wget", "curl"}, AgentSHA256: "x", DiskSizeMiB: 4096}
	b := Inputs{BuilderVersion: 1, Suite: "bookworm", Packages: []string{" wget", "curl"}, AgentSHA256: "x", DiskSizeMiB: 4096}
	if a.Digest() != b.Digest() {
		t.Fatalf("digest depends on package order/duplicates")
	}
	for name, mod := range map[string]func(*Inputs){
		"suite":   func(i *Inputs) { i.Suite = "trixie" },
		"package": func(i *Inputs) { i.Packages = append(i.Packages, "vim") },
		"agent":   func(i *Inputs) { i.AgentSHA256 = "y" },
		"builder": func(i *Inputs) { i.BuilderVersion++ },
		"disk":    func(i *Inputs) { i.DiskSizeMiB = 2048 },
		"mirror":  func(i *Inputs) { i.Mirror = "http://m/debian" },
	} {
		c := a
		c.Packages = append([]string(nil), a.Packages...)
		mod(&c)
		if c.Digest() == a.Digest() {
			t.Errorf("changing %s does not change the digest", name)
		}
	}
}

func TestManifestRoundTripAndVerify(t *testing.T) {
	dir := t.TempDir()
	m := &Manifest{Artifacts: map[string]Artifact{}, KernelVersion: "6.1.0-1-amd64"}
	for _, n := range ArtifactNames {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, []byte("content of "+n), 0o600); err != nil {
			t.Fatal(err)
		}
		a, err := ArtifactOf(p)
		if err != nil {
			t.Fatal(err)
		}
		m.Artifacts[n] = a
	}
	if err := WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	got, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Artifacts, m.Artifacts) || got.KernelVersion != m.KernelVersion {
		t.Fatalf("round trip: got %+v want %+v", got, m)
	}
	if err := got.Verify(dir, true); err != nil {
		t.Fatalf("verify intact image: %v", err)
	}
	// Same size, different content: only the full check notices.
	if err := os.WriteFile(filepath.Join(dir, KernelFile), []byte("content of vmlinuX"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := got.Verify(dir, false); err != nil {
		t.Fatalf("size check should pass: %v", err)
	}
	if err := got.Verify(dir, true); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("full verify of a changed kernel: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, InitrdFile)); err != nil {
		t.Fatal(err)
	}
	if err := got.Verify(dir, false); err == nil {
		t.Fatal("verify with a missing initrd passed")
	}
}

func TestReadManifestMissing(t *testing.T) {
	_, err := ReadManifest(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "image build") {
		t.Fatalf("want a hint to build the image, got %v", err)
	}
}

func TestCheckRunnable(t *testing.T) {
	for v, ok := range map[int]bool{1: false, MinBuilderVersion - 1: false, MinBuilderVersion: true, MinBuilderVersion + 1: true} {
		m := &Manifest{Inputs: Inputs{BuilderVersion: v}}
		err := m.CheckRunnable("/img")
		if ok != (err == nil) {
			t.Errorf("builder %d: %v", v, err)
		}
		if err != nil && (!errors.Is(err, ErrStale) || !strings.Contains(err.Error(), "vmgated image build --out /img")) {
			t.Errorf("builder %d: %v, want ErrStale saying how to rebuild", v, err)
		}
	}
}
