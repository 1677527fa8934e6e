// Package image is what a vmgate guest image is, as the VM runtime reads
// it: the files of an image directory and its manifest, and the checks
// that an image is whole and runnable (cmd/vmgated/imagebuild builds
// and imports images).
//
// An image is a directory holding base.qcow2 (the root filesystem, never
// written after the build: every VM gets its own overlay on it), vmlinuz (the
// Debian kernel, unpacked from its package, not the host's /boot), initrd.img
// (a small initramfs generated in Go by package initramfs) and
// manifest.json describing all of it.
package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/durable"
	"github.com/vmgate/vmgate/internal/integrity"
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
	// imported image (Suite is then ImportSuite), or of a container
	// image's configuration (its ID: the configuration names every
	// layer's content).
	Import string `json:"import,omitempty"`
	// KeepSetid is set when the import kept set-user-ID and
	// set-group-ID bits (vmgated image import --keep-setid).
	KeepSetid bool `json:"keep_setid,omitempty"`
	// Init is how an imported root starts: "" (the agent is its init,
	// agentproto.RootInitMarker) or InitSystemd (its own systemd is,
	// and starts the agent: vmgated image import --init image).
	Init string `json:"init,omitempty"`
}

// InitSystemd is Inputs.Init of an imported root that keeps its own
// systemd as init.
const InitSystemd = "systemd"

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
	// Source is where an imported or pulled image came from; nil for a
	// built one (and one imported before it was recorded).
	Source *Source `json:"source,omitempty"`
}

// Source kinds.
const (
	SourceRootFS   = "rootfs-tar"     // a root file system tarball (docker export)
	SourceLayout   = "oci-layout"     // an OCI image layout, a directory or its tar
	SourceArchive  = "docker-archive" // a docker save archive
	SourceRegistry = "registry"       // vmgated image pull
)

// Source is where an image came from, and the configuration a container
// image brings (its Env, WorkingDir and User: the defaults its commands
// were made for).
type Source struct {
	Kind string `json:"kind"`
	// Reference is what the operator named: the file or directory
	// imported (absolute), or the reference pulled, fully qualified.
	Reference string `json:"reference"`
	// ManifestDigest is "sha256:HEX" of the image manifest (for
	// Platform), the digest a registry and a pin name; empty for a
	// root file system tarball and a docker save archive without an
	// OCI layout (it has no manifest).
	ManifestDigest string `json:"manifest_digest,omitempty"`
	// ConfigDigest is "sha256:HEX" of the image's configuration: its ID.
	ConfigDigest string `json:"config_digest,omitempty"`
	// Platform is "linux/amd64": the only platform vmgate runs.
	Platform   string   `json:"platform,omitempty"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	// Shell is the interactive shell the root offers, found when it was
	// imported: ShellBash when it has bash, else ShellSh (an imported
	// root must have /bin/sh). Empty for an image imported before it was
	// recorded: bash, as vmgate's own build has (LoginShell).
	Shell string `json:"shell,omitempty"`
}

// Shells an imported root may offer (Source.Shell).
const (
	ShellBash = "/bin/bash"
	ShellSh   = "/bin/sh"
)

// ArtifactNames are the files every manifest must describe.
var ArtifactNames = []string{BaseFile, KernelFile, InitrdFile}

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
	for _, n := range ArtifactNames {
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
	for _, n := range ArtifactNames {
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
		got, err := FileSHA256(p)
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
	return durable.WriteFile(filepath.Join(dir, ManifestFile), append(b, '\n'), 0o644)
}

// FileSHA256 is the hex SHA-256 of the file at path.
func FileSHA256(path string) (string, error) {
	sum, err := integrity.FileSHA256(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return sum, nil
}

// ArtifactOf describes the file at path as a manifest does.
func ArtifactOf(path string) (Artifact, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Artifact{}, fmt.Errorf("artifact: %w", err)
	}
	sum, err := FileSHA256(path)
	if err != nil {
		return Artifact{}, err
	}
	return Artifact{Size: st.Size(), SHA256: sum}, nil
}
