// Package image builds and verifies vmgate guest images.
//
// An image is a directory holding base.qcow2 (the root filesystem, never
// written after the build: every VM gets its own overlay on it), vmlinuz (the
// Debian kernel, unpacked from its package, not the host's /boot), initrd.img
// (a small initramfs generated in Go by package initramfs) and
// manifest.json describing all of it. Images are built from Debian
// packages only (mmdebstrap), with nothing else downloaded.
//
// The build runs in a temporary directory beside the output and is renamed
// into place only when complete, so a failed or interrupted build never
// leaves a half-written image under the final name. A build whose inputs
// match the manifest of an existing, intact image is skipped.
//
// # Imported roots
//
// Import takes a root file system tarball that the operator may not have
// made (a `docker export` of someone's image). What it holds is the
// guest's business; it must not reach the host, nor make the guest's
// unprivileged user root. So: it is unpacked within bounds on its bytes
// and entries (DefaultImportMaxBytes, DefaultImportMaxEntries; a
// compressed tarball is a few KiB that could expand to any size); every
// later read and write goes through an os.Root, which no link leads out
// of; the package list is parsed in Go from dpkg's status file, with a
// size cap, rather than by dpkg-query run as root; and the guest user
// "agent" is made fresh, replacing any entry of that name the tarball
// has (the guest agent refuses an "agent" of uid 0 as well).
package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// File names inside an image directory.
const (
	BaseFile     = "base.qcow2"
	KernelFile   = "vmlinuz"
	InitrdFile   = "initrd.img"
	ManifestFile = "manifest.json"
)

// BuilderVersion changes whenever the build procedure changes in a way that
// makes older images stale; it is part of the inputs digest. Version 3:
// the guest agent speaks the framed protocol (package agentproto), not
// SSH, and the image has no agent keys.
const BuilderVersion = 3

// MinBuilderVersion is the oldest image vmgated can run: the agent of an
// image from before it speaks SSH.
const MinBuilderVersion = 3

// ErrStale reports an image built by an older vmgated whose guest agent
// this one cannot talk to.
var ErrStale = errors.New("image built by an older vmgated")

// ErrNotBuilt reports an image directory without a usable image.
var ErrNotBuilt = errors.New("image not built")

// DefaultSuite is the Debian release images are built from.
const DefaultSuite = "bookworm"

// DefaultPackages are installed on top of the minbase variant: what a
// sysadmin agent needs in its VM.
var DefaultPackages = []string{
	"systemd", "systemd-sysv", "udev", "dbus", "openssh-server", "nginx-light",
	"curl", "wget", "ca-certificates", "iproute2", "procps", "lsof", "psmisc",
	"python3-minimal", "python3", "openssl", "cron", "sudo", "less", "nano", "kmod", "iptables",
}

// Inputs are everything that determines an image's content. Two builds with
// equal Inputs produce equivalent images (modulo Debian archive updates,
// which --force picks up).
type Inputs struct {
	BuilderVersion int      `json:"builder_version"`
	Suite          string   `json:"suite"`
	Mirror         string   `json:"mirror,omitempty"`
	Packages       []string `json:"packages"`
	AgentSHA256    string   `json:"agent_sha256"`
	DiskSizeMiB    int      `json:"disk_size_mib"`
	// Import is "sha256:HEX" of the root file system tarball of an
	// imported image (Suite is then ImportSuite).
	Import string `json:"import,omitempty"`
}

// Normalize sorts and de-duplicates the package list so that order does not
// change the digest.
func (in Inputs) Normalize() Inputs {
	p := slices.Clone(in.Packages)
	for i := range p {
		p[i] = strings.TrimSpace(p[i])
	}
	p = slices.DeleteFunc(p, func(s string) bool { return s == "" })
	slices.Sort(p)
	in.Packages = slices.Compact(p)
	return in
}

// Digest is the sha256 of the normalised inputs' canonical JSON.
func (in Inputs) Digest() string {
	b, err := json.Marshal(in.Normalize())
	if err != nil {
		panic(err) // plain struct of strings and ints: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Package is one installed Debian package.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// Artifact is one file of the image with its size and digest.
type Artifact struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Manifest describes a built image. It is written last, so its presence
// marks a complete image.
type Manifest struct {
	Inputs        Inputs              `json:"inputs"`
	InputsDigest  string              `json:"inputs_digest"`
	KernelVersion string              `json:"kernel_version"`
	KernelPackage string              `json:"kernel_package"`
	Modules       []string            `json:"initramfs_modules"`
	Packages      []Package           `json:"packages"`
	Artifacts     map[string]Artifact `json:"artifacts"`
	BuiltAt       time.Time           `json:"built_at"`
	BuildSeconds  float64             `json:"build_seconds"`
}

// artifactNames are the files every manifest must describe.
var artifactNames = []string{BaseFile, KernelFile, InitrdFile}

// ReadManifest loads dir/manifest.json. A missing file yields ErrNotBuilt.
func ReadManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w (run: vmgated image build --out %s)", dir, ErrNotBuilt, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, ManifestFile), err)
	}
	for _, n := range artifactNames {
		if _, ok := m.Artifacts[n]; !ok {
			return nil, fmt.Errorf("manifest in %s lists no %s: %w", dir, n, ErrNotBuilt)
		}
	}
	return &m, nil
}

// Verify checks that every artefact in dir matches the manifest. With full
// set it hashes every file; otherwise it compares sizes only (cheap, used on
// the hot path of daemon start).
func (m *Manifest) Verify(dir string, full bool) error {
	for _, n := range artifactNames {
		want := m.Artifacts[n]
		p := filepath.Join(dir, n)
		st, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("image %s: %w", dir, err)
		}
		if st.Size() != want.Size {
			return fmt.Errorf("image %s: %s has %d bytes, manifest says %d", dir, n, st.Size(), want.Size)
		}
		if !full {
			continue
		}
		got, err := fileSHA256(p)
		if err != nil {
			return err
		}
		if got != want.SHA256 {
			return fmt.Errorf("image %s: %s sha256 %s, manifest says %s", dir, n, got, want.SHA256)
		}
	}
	return nil
}

// CheckRunnable reports an image that vmgated cannot run any more
// (ErrStale), saying how to replace it.
func (m *Manifest) CheckRunnable(dir string) error {
	if m.Inputs.BuilderVersion < MinBuilderVersion {
		return fmt.Errorf("image %s: %w (builder %d; its guest agent speaks SSH, this vmgated the framed agent protocol): rebuild it with: vmgated image build --out %s",
			dir, ErrStale, m.Inputs.BuilderVersion, dir)
	}
	return nil
}

// WriteManifest writes m as dir/manifest.json (atomically, fsynced).
func WriteManifest(dir string, m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	return writeFileSync(filepath.Join(dir, ManifestFile), append(b, '\n'), 0o644)
}

func writeFileSync(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// artifact describes the file at path.
func artifact(path string) (Artifact, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Artifact{}, fmt.Errorf("artifact: %w", err)
	}
	sum, err := fileSHA256(path)
	if err != nil {
		return Artifact{}, err
	}
	return Artifact{Size: st.Size(), SHA256: sum}, nil
}
