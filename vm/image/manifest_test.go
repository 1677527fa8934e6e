package image

import (
	"encoding/json"
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
		"import":  func(i *Inputs) { i.Import = "sha256:ab" },
		"setid":   func(i *Inputs) { i.KeepSetid = true },
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

// TestManifestSource: an image's source survives the round trip, and a
// manifest written before there were sources reads with none, and the
// same inputs digest (the new input is omitted when unset).
func TestManifestSource(t *testing.T) {
	dir := t.TempDir()
	src := &Source{Kind: SourceRegistry, Reference: "reg.test/a/b:1", ManifestDigest: "sha256:aa", ConfigDigest: "sha256:bb",
		Platform: "linux/amd64", Env: []string{"PATH=/bin"}, WorkingDir: "/w", User: "1000"}
	m := &Manifest{Artifacts: map[string]Artifact{BaseFile: {}, KernelFile: {}, InitrdFile: {}}, Source: src}
	if err := WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	got, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Source, src) {
		t.Errorf("source: %+v, want %+v", got.Source, src)
	}
	old := `{"inputs":{"builder_version":3,"suite":"import","packages":null,"agent_sha256":"x","disk_size_mib":4096,"import":"sha256:cc"},
		"artifacts":{"base.qcow2":{},"vmlinuz":{},"initrd.img":{}}}`
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = ReadManifest(dir)
	if err != nil || got.Source != nil {
		t.Fatalf("an older manifest: %+v, %v", got, err)
	}
	in := Inputs{BuilderVersion: 3, Suite: "import", AgentSHA256: "x", DiskSizeMiB: 4096, Import: "sha256:cc"}
	if got.Inputs.Digest() != in.Digest() || !strings.Contains(string(mustJSON(t, in)), `"import":"sha256:cc"}`) {
		t.Errorf("an older import's inputs digest changed: %s", mustJSON(t, in))
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
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
