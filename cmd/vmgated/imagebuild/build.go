package imagebuild

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/reexec"
	"github.com/vmgate/vmgate/vm/image"
)

// Options configure Build.
type Options struct {
	// OutDir is the final image directory. Required.
	OutDir string
	// Suite is the Debian release (default DefaultSuite).
	Suite string
	// Mirror is an optional Debian mirror URL; empty lets mmdebstrap choose.
	Mirror string
	// ExtraPackages are added to DefaultPackages.
	ExtraPackages []string
	// AgentPath is the static guest agent binary; empty means FindAgent("").
	AgentPath string
	// DiskSizeMiB is the size of the guest's root filesystem (default 4096).
	// The qcow2 file only stores what is used.
	DiskSizeMiB int
	// Force rebuilds even when an intact image with the same inputs exists.
	Force bool
	// Log receives progress records; nil means slog.Default().
	Log *slog.Logger
	// Progress, when non-nil, receives a human progress display (a TTY).
	Progress io.Writer
}

// Result reports what Build did.
type Result struct {
	Manifest *image.Manifest
	// Cached is true when an existing image was kept.
	Cached bool
}

// minFreeBytes is the free space a build needs beside the output directory:
// the unpacked root filesystem, the kernel package, the raw ext4 image
// (sparse) and the qcow2 copy.
const minFreeBytes = 3 << 30

// Tools the build runs, checked before anything else happens.
var requiredTools = []string{"mmdebstrap", "mkfs.ext4", "qemu-img", "dpkg-deb", "apt-get", "apt-cache", "chroot"}

// Build builds the image described by opts into opts.OutDir.
//
// Postcondition: on success OutDir holds a complete image whose manifest
// verifies; on failure OutDir is unchanged (a previous image stays intact)
// and no temporary directory is left behind.
func Build(ctx context.Context, opts Options) (*Result, error) {
	agent, in, err := buildInputs(opts)
	if err != nil {
		return nil, err
	}
	return produce(ctx, job{out: opts.OutDir, in: in, agent: agent, force: opts.Force, log: opts.Log, progress: opts.Progress,
		steps: 5, tools: requiredTools, make: (*builder).build})
}

// job is one image to produce: by a build or an import.
type job struct {
	out      string
	in       image.Inputs
	agent    string
	force    bool
	log      *slog.Logger
	progress io.Writer
	steps    int
	tools    []string
	make     func(*builder, context.Context) (*image.Manifest, error)
}

// produce makes j's image in a temporary directory beside j.out, unless an
// intact image of the same inputs is there, and swaps it into place.
func produce(ctx context.Context, j job) (*Result, error) {
	log := j.log
	if log == nil {
		log = slog.Default()
	}
	if j.out == "" {
		return nil, errors.New("image build: no output directory")
	}
	out, err := filepath.Abs(j.out)
	if err != nil {
		return nil, fmt.Errorf("image build: %w", err)
	}
	digest := j.in.Digest()
	if !j.force {
		if m, err := image.ReadManifest(out); err == nil && m.InputsDigest == digest {
			if verr := m.Verify(out, true); verr == nil {
				log.Info("image up to date, not rebuilding", "dir", out, "inputs", digest[:12])
				return &Result{Manifest: m, Cached: true}, nil
			} else {
				log.Warn("existing image does not verify, rebuilding", "dir", out, "err", verr)
			}
		}
	}

	if err := preflight(filepath.Dir(out), j.tools); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return nil, fmt.Errorf("image build: %w", err)
	}
	unlock, err := lockOut(out)
	if err != nil {
		return nil, err
	}
	defer unlock()
	removeStaleBuilds(out, log)
	tmp, err := os.MkdirTemp(filepath.Dir(out), "."+filepath.Base(out)+".build-")
	if err != nil {
		return nil, fmt.Errorf("image build: %w", err)
	}
	defer func() {
		if err := removeBuildDir(tmp); err != nil {
			log.Error("clean up build directory", "err", err)
		}
	}()
	b := &builder{in: j.in, digest: digest, agent: j.agent, tmp: tmp, work: filepath.Join(tmp, "work"), log: log,
		p: newProgress(j.progress, log, j.steps), start: time.Now()}
	defer b.p.stop()
	m, err := j.make(b, ctx)
	if err != nil {
		b.p.fail()
		return nil, err
	}
	b.p.step("installing image")
	if err := replaceDir(tmp, out); err != nil {
		return nil, err
	}
	log.Info("image built", "dir", out, "kernel", m.KernelVersion, "packages", len(m.Packages),
		"base_bytes", m.Artifacts[image.BaseFile].Size, "seconds", m.BuildSeconds)
	return &Result{Manifest: m}, nil
}

// buildInputs resolves the agent binary and what the image is built from.
func buildInputs(opts Options) (string, image.Inputs, error) {
	agent, err := FindAgent(opts.AgentPath)
	if err != nil {
		return "", image.Inputs{}, err
	}
	agentSum, err := image.FileSHA256(agent)
	if err != nil {
		return "", image.Inputs{}, err
	}
	in := image.Inputs{
		BuilderVersion: image.BuilderVersion,
		Suite:          cmp(opts.Suite, image.DefaultSuite),
		Mirror:         opts.Mirror,
		Packages:       append(slices.Clone(image.DefaultPackages), opts.ExtraPackages...),
		AgentSHA256:    agentSum,
		DiskSizeMiB:    opts.DiskSizeMiB,
	}
	if in.DiskSizeMiB == 0 {
		in.DiskSizeMiB = 4096
	}
	in = in.Normalize()
	if err := validateInputs(in); err != nil {
		return "", image.Inputs{}, err
	}
	return agent, in, nil
}

// builder is one image build in its temporary directory, step by step.
type builder struct {
	in     image.Inputs
	digest string
	agent  string
	tmp    string // the new image directory
	work   string // scratch inside tmp
	log    *slog.Logger
	p      *progress
	start  time.Time
}

// build runs every step up to a complete image in b.tmp.
func (b *builder) build(ctx context.Context) (*image.Manifest, error) {
	if err := b.begin(); err != nil {
		return nil, err
	}
	specPath, err := b.writeSpec()
	if err != nil {
		return nil, err
	}
	b.p.step("building root filesystem (mmdebstrap " + b.in.Suite + ")")
	res, err := b.rootfs(ctx, specPath)
	if err != nil {
		return nil, err
	}
	_ = os.Remove(specPath)
	return b.finish(ctx, res)
}

// begin makes the scratch directory.
func (b *builder) begin() error {
	if err := os.Mkdir(b.work, 0o700); err != nil {
		return fmt.Errorf("image build: %w", err)
	}
	return nil
}

// finish turns the root filesystem and boot files in b.work into the
// image's artefacts and manifest.
func (b *builder) finish(ctx context.Context, res *customizeResult) (*image.Manifest, error) {
	b.p.step("converting root filesystem to qcow2")
	if err := b.artifacts(ctx); err != nil {
		return nil, err
	}
	b.p.step("hashing artefacts and writing manifest")
	m, err := b.manifest(res)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(b.work); err != nil {
		return nil, fmt.Errorf("image build: %w", err)
	}
	if err := image.WriteManifest(b.tmp, m); err != nil {
		return nil, err
	}
	if err := os.Chmod(b.tmp, 0o755); err != nil {
		return nil, fmt.Errorf("image build: %w", err)
	}
	return m, nil
}

// writeSpec writes what the customize step (run inside mmdebstrap) does.
func (b *builder) writeSpec() (string, error) {
	spec := customizeSpec{
		WorkDir:        b.work,
		AgentPath:      b.agent,
		DiskSizeMiB:    b.in.DiskSizeMiB,
		KernelMetaPkg:  "linux-image-amd64",
		InitrdModules:  InitrdModules,
		PruneModuleDir: PrunedModuleDirs,
	}
	specPath := filepath.Join(b.tmp, "customize.json")
	sb, _ := json.Marshal(spec)
	if err := os.WriteFile(specPath, sb, 0o600); err != nil {
		return "", fmt.Errorf("image build: %w", err)
	}
	return specPath, nil
}

// rootfs runs mmdebstrap, whose customize hook (a re-exec of this binary)
// installs the agent and makes the root filesystem, kernel and initramfs.
func (b *builder) rootfs(ctx context.Context, specPath string) (*customizeResult, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("image build: find own executable: %w", err)
	}
	argv := MmdebstrapArgs(b.in, self, specPath)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var logBuf tailBuffer
	out := io.MultiWriter(&logBuf, &lines{fn: b.p.detail})
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "TMPDIR="+b.tmp)
	// On cancellation let mmdebstrap unmount and clean up its chroot; kill it
	// only if it does not finish within the grace period.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 60 * time.Second
	b.log.Info("running mmdebstrap", "argv", strings.Join(argv, " "))
	if err := cmd.Run(); err != nil {
		return nil, explainMmdebstrap(err, logBuf.String())
	}
	var res customizeResult
	if data, err := os.ReadFile(filepath.Join(b.work, "result.json")); err != nil {
		return nil, fmt.Errorf("image build: customize step left no result: %w", err)
	} else if err := json.Unmarshal(data, &res); err != nil {
		return nil, fmt.Errorf("image build: customize result: %w", err)
	}
	return &res, nil
}

// artifacts converts the root filesystem to qcow2 and puts the kernel and
// initramfs beside it.
func (b *builder) artifacts(ctx context.Context) error {
	if err := run(ctx, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", filepath.Join(b.work, "rootfs.ext4"), filepath.Join(b.tmp, image.BaseFile)); err != nil {
		return fmt.Errorf("image build: %w", err)
	}
	for _, n := range []string{image.KernelFile, image.InitrdFile} {
		if err := os.Rename(filepath.Join(b.work, n), filepath.Join(b.tmp, n)); err != nil {
			return fmt.Errorf("image build: %w", err)
		}
	}
	return nil
}

// manifest hashes the artefacts and describes the image.
func (b *builder) manifest(res *customizeResult) (*image.Manifest, error) {
	m := &image.Manifest{
		Inputs:        b.in,
		InputsDigest:  b.digest,
		KernelVersion: res.KernelVersion,
		KernelPackage: res.KernelPackage,
		Modules:       res.Modules,
		Packages:      res.Packages,
		Artifacts:     map[string]image.Artifact{},
		BuiltAt:       time.Now().UTC().Truncate(time.Second),
		Source:        res.Source,
	}
	for _, n := range image.ArtifactNames {
		a, err := image.ArtifactOf(filepath.Join(b.tmp, n))
		if err != nil {
			return nil, fmt.Errorf("image build: %w", err)
		}
		m.Artifacts[n] = a
	}
	m.BuildSeconds = time.Since(b.start).Round(time.Second).Seconds()
	return m, nil
}

func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// validateInputs rejects package names and suites that could smuggle options
// into mmdebstrap's command line.
func validateInputs(in image.Inputs) error {
	if !validName(in.Suite) {
		return fmt.Errorf("image build: invalid suite %q", in.Suite)
	}
	for _, p := range in.Packages {
		if !validName(p) {
			return fmt.Errorf("image build: invalid package name %q", p)
		}
	}
	if in.Mirror != "" && !(strings.HasPrefix(in.Mirror, "http://") || strings.HasPrefix(in.Mirror, "https://") || strings.HasPrefix(in.Mirror, "file://")) {
		return fmt.Errorf("image build: mirror %q is not an http(s) or file URL", in.Mirror)
	}
	if in.DiskSizeMiB < 1024 || in.DiskSizeMiB > 1<<20 {
		return fmt.Errorf("image build: disk size %d MiB out of range [1024, 1048576]", in.DiskSizeMiB)
	}
	return nil
}

// validName accepts Debian package and suite names (policy §5.6.1, plus an
// optional "=version" or ":arch" is deliberately not accepted).
func validName(s string) bool {
	if s == "" || len(s) > 128 || s[0] == '-' {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '+', r == '-', r == '.':
		default:
			return false
		}
	}
	return true
}

// MmdebstrapArgs is the pure builder of the mmdebstrap command line. The
// customize hook re-executes self in the image-customize role with the root
// directory and the spec file.
func MmdebstrapArgs(in image.Inputs, self, specPath string) []string {
	hook := reexec.ChildEnv + "=" + customizeRole + " " + shellQuote(self) + ` "$1" ` + shellQuote(specPath)
	argv := []string{
		"mmdebstrap",
		"--variant=minbase",
		"--include=" + strings.Join(in.Packages, ","),
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--customize-hook=" + hook,
		in.Suite,
		"/dev/null",
	}
	if in.Mirror != "" {
		argv = append(argv, in.Mirror)
	}
	return argv
}

// shellQuote quotes s for POSIX sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// explainMmdebstrap turns a failed mmdebstrap run into one clear error.
func explainMmdebstrap(err error, output string) error {
	var reason string
	switch {
	case strings.Contains(output, "No space left on device"):
		reason = "the disk is full"
	case strings.Contains(output, "Temporary failure resolving"), strings.Contains(output, "Could not resolve"),
		strings.Contains(output, "Failed to fetch"), strings.Contains(output, "Unable to connect"),
		strings.Contains(output, "Could not connect"):
		reason = "the Debian archive is unreachable (no network or mirror down)"
	case strings.Contains(output, "unshare") && strings.Contains(output, "subuid"):
		reason = "running unprivileged needs subordinate uids for the user (/etc/subuid) or run as root"
	}
	msg := "mmdebstrap failed"
	if reason != "" {
		msg += ": " + reason
	}
	return fmt.Errorf("image build: %s: %w\n--- last output ---\n%s", msg, err, lastLines(output, 25))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// tailBuffer keeps the last 64 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 64<<10 {
		t.b = append([]byte(nil), t.b[len(t.b)-64<<10:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }

// preflight checks tools and free space before any work starts.
func preflight(parent string, tools []string) error {
	var missing []string
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("image build: missing tools: %s (on Debian: apt-get install mmdebstrap e2fsprogs qemu-utils dpkg apt coreutils)", strings.Join(missing, ", "))
	}
	dir := parent
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		next := filepath.Dir(dir)
		if next == dir {
			break
		}
		dir = next
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("image build: statfs %s: %w", dir, err)
	}
	return checkFree(dir, st.Bavail*uint64(st.Bsize), minFreeBytes)
}

// checkFree reports an error when avail < need.
func checkFree(dir string, avail, need uint64) error {
	if avail < need {
		return fmt.Errorf("image build: not enough disk space in %s: %.1f GiB free, need %.1f GiB", dir, float64(avail)/(1<<30), float64(need)/(1<<30))
	}
	return nil
}

// removeStaleBuilds removes build directories that an interrupted build
// (killed, power loss) left beside out. Called with the lock held, so no
// other build is using them.
func removeStaleBuilds(out string, log *slog.Logger) {
	for _, pat := range []string{".build-*", ".build-*.old"} {
		m, _ := filepath.Glob(filepath.Join(filepath.Dir(out), "."+filepath.Base(out)+pat))
		for _, d := range m {
			if err := removeBuildDir(d); err != nil {
				log.Warn("stale build directory", "dir", d, "err", err)
				continue
			}
			log.Info("removed stale build directory", "dir", d)
		}
	}
}

// replaceDir renames the finished build tmp to out, moving an older image
// aside first and removing it after the swap.
func replaceDir(tmp, out string) error {
	var old string
	if _, err := os.Lstat(out); err == nil {
		old = tmp + ".old"
		if err := os.Rename(out, old); err != nil {
			return fmt.Errorf("image build: move old image aside: %w", err)
		}
	}
	if err := os.Rename(tmp, out); err != nil {
		if old != "" {
			_ = os.Rename(old, out)
		}
		return fmt.Errorf("image build: install image: %w", err)
	}
	if old != "" {
		if err := os.RemoveAll(old); err != nil {
			return fmt.Errorf("image build: remove old image: %w", err)
		}
	}
	return nil
}

func run(ctx context.Context, name string, args ...string) error {
	var buf bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, lastLines(buf.String(), 10))
	}
	return nil
}

// FindAgent locates the static guest agent binary: explicit if set, else
// beside the running executable, else in /usr/local/lib/vmgate or
// /usr/lib/vmgate. It rejects dynamically linked binaries, which cannot run
// as /init in the initramfs.
func FindAgent(explicit string) (string, error) {
	var cands []string
	if explicit != "" {
		cands = []string{explicit}
	} else {
		if exe, err := os.Executable(); err == nil {
			cands = append(cands, filepath.Join(filepath.Dir(exe), "vmgate-agent"))
		}
		cands = append(cands, "/usr/local/lib/vmgate/vmgate-agent", "/usr/lib/vmgate/vmgate-agent")
	}
	for _, c := range cands {
		if _, err := os.Stat(c); err != nil {
			continue
		}
		abs, err := filepath.Abs(c)
		if err != nil {
			return "", fmt.Errorf("agent binary: %w", err)
		}
		if err := checkStatic(abs); err != nil {
			return "", err
		}
		return abs, nil
	}
	return "", fmt.Errorf("guest agent binary not found (looked in %s); build it with: make build", strings.Join(cands, ", "))
}

func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("agent binary %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("agent binary %s is dynamically linked; build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}
