package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/durable"
	"github.com/vmgate/vmgate/internal/integrity"
	"github.com/vmgate/vmgate/vm/netstack"
)

// A template is a booted, quiesced VM saved once, from which fresh VMs are
// restored in a fraction of a boot:
//
//   - overlay.qcow2: its disk, frozen (read-only); each clone gets a new
//     overlay on top of it.
//   - ram: its guest RAM, written through a shared file-backed memory
//     backend; the migration stream leaves it out (x-ignore-shared).
//   - state: the device state (QEMU's migration stream, tens of KB).
//   - template.json: what it was built from (TemplateMeta).
//
// Clones must never be able to change the template. The RAM file is not
// given to them: the daemon copies it once into a sealed memfd
// (F_SEAL_WRITE|SHRINK|GROW|SEAL) and hands each clone that fd, which QEMU
// maps private copy-on-write through /proc/self/fd/4. A compromised clone
// can open it read-write but neither write to it nor map it shared
// writable; pages it writes are its own. The overlay and state file sit
// in the template directory, bound read-only into each clone's jail.
const (
	TemplateMetaFile  = "template.json"
	TemplateStateFile = "state"
	templatesDir      = "templates"
	// templateFormat changes when the template layout or the devices of
	// the QEMU command line change, so that old templates are rebuilt.
	// 5: the guest keeps time by the TSC (tsc=reliable). 6: the guest's
	// disk reserve (DiskMiB).
	templateFormat = 6
)

// TemplateMeta describes a built template: the machine its clones run on,
// and what a template adds to it (its key, which names its directory,
// the guest's disk reserve and address space randomisation).
type TemplateMeta struct {
	Format int    `json:"format"`
	Key    string `json:"key"`
	Machine
	DiskMiB int `json:"disk_mib"` // the guest's disk limit (its reserve)
	// GuestASLR: the guest kept its address space randomisation
	// (GuestASLROff).
	GuestASLR    bool      `json:"guest_aslr"`
	BuiltAt      time.Time `json:"built_at"`
	BootMillis   int64     `json:"boot_ms"`
	SaveMillis   int64     `json:"save_ms"`
	StateBytes   int64     `json:"state_bytes"`
	RAMDataBytes int64     `json:"ram_data_bytes"` // allocated (non-hole) bytes of the RAM file
	// SHA-256 of the frozen files (the RAM file's logical content, holes
	// read as zeros), checked when the template is loaded.
	OverlaySHA256 string `json:"overlay_sha256"`
	StateSHA256   string `json:"state_sha256"`
	RAMSHA256     string `json:"ram_sha256"`
}

// templateKey names a template by everything a restore depends on: the
// image, the VM shape, the accelerator, the QEMU build and the layout. It
// is pure.
func templateKey(m TemplateMeta) string {
	h := sha256.New()
	fmt.Fprintf(h, "format=%d\nimage=%s\nkernel=%s\ninitrd=%s\nmem=%d\ncpus=%d\ndisk=%d\naccel=%s\nqemu=%s\nnetwork=%v\naslr=%v\n",
		templateFormat, m.ImageDigest, m.KernelDigest, m.InitrdDigest, m.MemoryMiB, m.CPUs, m.DiskMiB, m.Accel, m.QEMUVersion, m.Network, m.GuestASLR)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Template is a loaded template, ready to restore clones from.
type Template struct {
	Meta TemplateMeta
	Dir  string
	// clone is the configuration of the template's clones.
	clone Options
	img   *imageFiles
	accel Accel
	ram   *os.File // sealed memfd with the template's RAM
	// Built is true when this call built the template (false: loaded).
	Built bool

	handshakeFailures atomic.Int64
}

var (
	qemuVersionMu    sync.Mutex
	qemuVersionCache = map[string]string{}
)

// QEMUVersion returns the first line of `qemu --version`, cached.
func QEMUVersion(qemu string) (string, error) {
	qemuVersionMu.Lock()
	defer qemuVersionMu.Unlock()
	if v, ok := qemuVersionCache[qemu]; ok {
		return v, nil
	}
	out, err := exec.Command(qemu, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("qemu --version: %w", err)
	}
	v, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	qemuVersionCache[qemu] = v
	return v, nil
}

// ErrNoTemplate reports that no usable template exists for a shape: none
// was built, or the one there does not match or is damaged (the error says
// which; a damaged one has been removed).
var ErrNoTemplate = errors.New("no usable VM template")

// EnsureTemplate loads the template for opts' image and shape, building it
// first (a full boot, ~20 s under TCG) when it is missing or stale. Stale
// templates of the same shape are removed.
func EnsureTemplate(ctx context.Context, opts Options) (*Template, error) {
	return ensureTemplate(ctx, opts, true)
}

// LoadTemplate loads the template for opts' image and shape when a usable
// one exists (its files are checked against their digests: a second or
// so), and returns an error wrapping ErrNoTemplate otherwise. It never
// boots a VM: a daemon can wait for a load, where it would boot cold
// rather than wait for a build.
func LoadTemplate(ctx context.Context, opts Options) (*Template, error) {
	return ensureTemplate(ctx, opts, false)
}

func ensureTemplate(ctx context.Context, opts Options, build bool) (*Template, error) {
	clone := opts
	clone.setRestoreDefaults(nil)
	opts.setDefaults()
	img, accel, err := prepare(ctx, opts)
	if err != nil {
		return nil, err
	}
	want, err := wantTemplate(opts, accel)
	if err != nil {
		return nil, err
	}
	root := opts.TemplateDir
	if root == "" {
		root = filepath.Join(opts.StateDir, templatesDir)
	}
	root, err = filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	// One loader or builder per template at a time (a daemon and
	// `vmgated image warm` may share the directory); other shapes' loads
	// do not wait for this one's build.
	lock, err := lockKey(root, want.Key, true)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	dir := filepath.Join(root, want.Key)
	t := &Template{Dir: dir, clone: clone, img: img, accel: accel}
	// The frozen files are hashed only here, where the template is used;
	// looking at other templates (stale ones, Discard) needs the metadata.
	meta, err := readTemplateMeta(dir)
	if err == nil {
		err = verifyTemplateFiles(dir, meta)
	}
	if err == nil {
		if merr := meta.matches(want); merr != nil {
			err = fmt.Errorf("template %s: %w", dir, merr)
		}
	}
	if err == nil {
		t.ram, err = loadRAM(dir, meta)
	}
	if err != nil {
		missing := errors.Is(err, os.ErrNotExist)
		if !missing {
			opts.Log.Warn("template unusable, removing it", "dir", dir, "err", err)
			if rerr := removeTemplateDir(dir); rerr != nil {
				return nil, fmt.Errorf("template: %w", rerr)
			}
		}
		if !build {
			return nil, fmt.Errorf("%w for %d MiB, %d CPU, %d MiB of disk, network %v: %w", ErrNoTemplate, want.MemoryMiB, want.CPUs, want.DiskMiB, want.Network, err)
		}
		if err := removeTemplateDir(dir); err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
		if meta, err = buildTemplate(ctx, opts, img, accel, want, root); err != nil {
			return nil, err
		}
		t.Built = true
		if t.ram, err = loadRAM(dir, meta); err != nil {
			return nil, err
		}
	}
	t.Meta = *meta
	if err := removeStaleTemplates(root, want); err != nil {
		opts.Log.Warn("remove stale templates", "err", err)
	}
	return t, nil
}

// wantTemplate is the metadata a template for opts must have.
func wantTemplate(opts Options, accel Accel) (TemplateMeta, error) {
	m, err := machineOf(opts, accel)
	if err != nil {
		return TemplateMeta{}, err
	}
	want := TemplateMeta{Format: templateFormat, Machine: m, DiskMiB: opts.DiskMiB, GuestASLR: !GuestASLROff(opts.GuestASLR, accel, m.QEMUVersion)}
	want.Key = templateKey(want)
	return want, nil
}

// matches reports whether the template m, found under want's key, is the
// one wanted: its machine (Machine.diff) and then its key, which covers
// the rest (the layout's format, the disk reserve, the guest's address
// space randomisation).
func (m *TemplateMeta) matches(want TemplateMeta) error {
	if d := m.diff(want.Machine); d != "" {
		return errors.New(d)
	}
	if m.Key != want.Key {
		return fmt.Errorf("key %s does not match its directory", m.Key)
	}
	return nil
}

// loadRAM copies the template's RAM into a sealed memfd and checks it.
func loadRAM(dir string, m *TemplateMeta) (*os.File, error) {
	size := int64(m.MemoryMiB) << 20
	ram, err := sealedCopy(filepath.Join(dir, RAMFile), size)
	if err != nil {
		return nil, err
	}
	sum, err := integrity.ReaderSHA256(io.NewSectionReader(ram, 0, size))
	if err == nil && sum != m.RAMSHA256 {
		err = fmt.Errorf("RAM sha256 %s, template.json says %s", sum, m.RAMSHA256)
	}
	if err != nil {
		ram.Close()
		return nil, fmt.Errorf("template %s: %w", dir, err)
	}
	return ram, nil
}

// removeTemplateDir removes a (read-only) template directory.
func removeTemplateDir(dir string) error {
	if err := os.Chmod(dir, 0o700); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.RemoveAll(dir)
}

// verifyTemplateFiles checks the overlay and state files against meta
// (the RAM file is checked as it is loaded, by loadRAM).
func verifyTemplateFiles(dir string, m *TemplateMeta) error {
	for _, c := range []struct{ file, want string }{{OverlayFile, m.OverlaySHA256}, {TemplateStateFile, m.StateSHA256}} {
		got, err := integrity.FileSHA256(filepath.Join(dir, c.file))
		if err != nil {
			return fmt.Errorf("template %s: %w", dir, err)
		}
		if got != c.want {
			return fmt.Errorf("template %s: %s sha256 %s, template.json says %s", dir, c.file, got, c.want)
		}
	}
	return nil
}

func readTemplateMeta(dir string) (*TemplateMeta, error) {
	b, err := os.ReadFile(filepath.Join(dir, TemplateMetaFile))
	if err != nil {
		return nil, err
	}
	var m TemplateMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("template %s: %w", dir, err)
	}
	if m.Format != templateFormat {
		return nil, fmt.Errorf("template %s: format %d, want %d", dir, m.Format, templateFormat)
	}
	for _, f := range []string{OverlayFile, RAMFile, TemplateStateFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return nil, fmt.Errorf("template %s: %w", dir, err)
		}
	}
	return &m, nil
}

// lockKey takes the lock of the template key in root (flock of
// root/.lock-KEY): waiting for it, or failing at once when another holds
// it (wait false).
func lockKey(root, key string, wait bool) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(root, ".lock-"+key), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	how := unix.LOCK_EX
	if !wait {
		how |= unix.LOCK_NB
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("template: lock %s: %w", key, err)
	}
	return f, nil
}

// buildDirPrefix starts the name of a template being built.
const buildDirPrefix = ".build-"

// removeStaleTemplates removes templates of the same shape as want with
// another key (older image or QEMU) and unfinished builds. The caller
// holds want's lock; another key's files are removed only when its lock is
// free (no one loads or builds it now).
func removeStaleTemplates(root string, want TemplateMeta) error {
	keep := want.Key
	ents, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var errs []error
	remove := func(key, dir string) {
		if key != keep {
			l, err := lockKey(root, key, false)
			if err != nil {
				return // in use
			}
			defer l.Close()
		}
		errs = append(errs, removeTemplateDir(dir))
	}
	for _, e := range ents {
		if !e.IsDir() || e.Name() == keep {
			continue
		}
		d := filepath.Join(root, e.Name())
		if rest, ok := strings.CutPrefix(e.Name(), buildDirPrefix); ok {
			key, _, _ := strings.Cut(rest, "-")
			remove(key, d)
			continue
		}
		if m, err := readTemplateMeta(d); err != nil || sameShape(*m, want) {
			remove(e.Name(), d)
		}
	}
	return errors.Join(errs...)
}

// sameShape reports whether two templates serve the same VM shape.
func sameShape(a, b TemplateMeta) bool {
	return a.MemoryMiB == b.MemoryMiB && a.CPUs == b.CPUs && a.DiskMiB == b.DiskMiB && a.Network == b.Network
}

// buildTemplate boots a VM with its RAM in a shared file, quiesces it,
// saves its device state and moves the files into root/<key>.
func buildTemplate(ctx context.Context, opts Options, img *imageFiles, accel Accel, meta TemplateMeta, root string) (*TemplateMeta, error) {
	log := opts.Log.With("template", meta.Key)
	log.Info("building VM template", "memory_mib", meta.MemoryMiB, "cpus", meta.CPUs, "disk_mib", meta.DiskMiB, "accel", accel, "network", meta.Network)
	if opts.Network != nil {
		// The template's guest gets its DHCP lease while it boots, and
		// nothing else: no name resolves, no connection is made.
		opts.Network = &netstack.Config{Log: opts.Log}
	}
	v, err := newLaunch(opts, img, accel, launchMode{backing: img.base, readOnly: img.qemuFiles(), ram: ramSharedFile}).finish(ctx, bootSteps)
	if err != nil {
		return nil, fmt.Errorf("template boot: %w", err)
	}
	defer v.Close()
	meta.BootMillis = v.BootDuration().Milliseconds()
	// Quiesce. The agent answers long before the guest has finished
	// booting; a template saved then makes every clone finish the boot
	// (udev workers, service start-up) while it runs commands: wait for
	// systemd to reach its target ("degraded" is fine: the state is all
	// that matters here) and for udev to settle, then flush the disk.
	// Caches are kept: dropping them saved 2 MiB of shared RAM here and
	// made each clone read its binaries from disk again.
	var out strings.Builder
	quiesce := "systemctl is-system-running --wait >/dev/null; udevadm settle --timeout=60; sync"
	res, err := v.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", quiesce}, Stdout: &out, Stderr: &out, Timeout: 3 * time.Minute})
	if err != nil || res.ExitCode != 0 {
		return nil, fmt.Errorf("template quiesce: %v %+v: %s", err, res, out.String())
	}
	t0 := time.Now()
	if err := v.save(ctx); err != nil {
		return nil, err
	}
	meta.SaveMillis = time.Since(t0).Milliseconds()

	tmp, err := os.MkdirTemp(root, buildDirPrefix+meta.Key+"-")
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	defer os.RemoveAll(tmp)
	for _, f := range []string{OverlayFile, RAMFile, TemplateStateFile} {
		if err := moveFile(filepath.Join(v.Dir, f), filepath.Join(tmp, f)); err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
		// The file was the VM's: never followed through a symlink.
		if err := chmodQEMUFile(filepath.Join(tmp, f), 0o400); err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
	}
	if st, err := os.Stat(filepath.Join(tmp, TemplateStateFile)); err == nil {
		meta.StateBytes = st.Size()
	}
	meta.RAMDataBytes = allocatedBytes(filepath.Join(tmp, RAMFile))
	for _, h := range []struct {
		file string
		sum  *string
	}{{OverlayFile, &meta.OverlaySHA256}, {TemplateStateFile, &meta.StateSHA256}, {RAMFile, &meta.RAMSHA256}} {
		if *h.sum, err = integrity.FileSHA256(filepath.Join(tmp, h.file)); err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
	}
	meta.BuiltAt = time.Now().UTC()
	b, _ := json.MarshalIndent(meta, "", "  ")
	if err := durable.WriteNew(filepath.Join(tmp, TemplateMetaFile), append(b, '\n'), 0o400); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	final := filepath.Join(root, meta.Key)
	if err := os.Rename(tmp, final); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if err := os.Chmod(final, 0o500); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	log.Info("VM template saved", "dir", final, "boot_ms", meta.BootMillis, "save_ms", meta.SaveMillis,
		"state_bytes", meta.StateBytes, "ram_data_mib", meta.RAMDataBytes>>20)
	return &meta, nil
}

// Close releases the template's RAM copy; running clones keep their own
// reference.
func (t *Template) Close() error {
	if t.ram == nil {
		return nil
	}
	err := t.ram.Close()
	t.ram = nil
	return err
}

// Discard closes the template and removes its directory: a restore from it
// failed, so it is not trusted any more and the next EnsureTemplate builds
// it again. Running clones keep their open files.
func (t *Template) Discard() error {
	_ = t.Close()
	lock, err := lockKey(filepath.Dir(t.Dir), t.Meta.Key, true)
	if err != nil {
		return err
	}
	defer lock.Close()
	// Only this template's files: a rebuild under the same key may have
	// replaced them since (it would carry a newer build time).
	m, err := readTemplateMeta(t.Dir)
	if err == nil && !m.BuiltAt.Equal(t.Meta.BuiltAt) {
		return nil
	}
	return removeTemplateDir(t.Dir)
}

// Shape reports the memory and CPUs of the template's VMs.
func (t *Template) Shape() (memMiB, cpus int) { return t.Meta.MemoryMiB, t.Meta.CPUs }

// Restore starts a fresh VM from the template: a new overlay on the frozen
// template disk, QEMU started waiting for the saved state, RAM mapped
// private copy-on-write from the sealed copy, the agent reconnected, the
// guest clock set and its entropy reseeded from the host. The clone has
// the template's configuration (its shape, log, jail, cgroups and, with a
// NIC, a network that allows nothing until SetPolicy).
//
// Postcondition: on error nothing of the VM is left.
func (t *Template) Restore(ctx context.Context) (*VM, error) {
	return t.restore(ctx, false)
}

// restore is Restore, at the lowest CPU weight when background (a pool's
// filler).
func (t *Template) restore(ctx context.Context, background bool) (*VM, error) {
	l, err := t.launch(background)
	if err != nil {
		return nil, err
	}
	v, err := l.finish(ctx, append(slices.Clip(aheadSteps), completeSteps...))
	// A failed first contact is a failed restore, counted
	// (HandshakeFailures, /v1/status, bench exec), never retried with
	// another clone: retries once hid the garbled handshakes of
	// docs/fast-path.md.
	if errors.Is(err, ErrHandshake) {
		t.handshakeFailures.Add(1)
	}
	return v, err
}

// launch is a new clone's launch. The state file is opened for each
// clone (QEMU reads it sequentially through an fd that shares its offset
// with ours); the launch closes it once QEMU holds its copy.
func (t *Template) launch(background bool) (*launch, error) {
	if t.ram == nil {
		return nil, errors.New("restore: template closed")
	}
	state, err := os.Open(filepath.Join(t.Dir, TemplateStateFile))
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	o := t.clone
	o.Background = background
	m := t.cloneMode(state)
	l := newLaunch(o, t.img, t.accel, m)
	l.owned = append(l.owned, state)
	return l, nil
}

// Prestart launches a clone ahead of its request: a new overlay, and QEMU
// started in its jail with the template's RAM and state, up and waiting
// for the state (-incoming defer), at the lowest CPU weight. QEMU's
// start-up (~50 ms under load) then leaves the request's critical path.
// No guest code runs until Launched.Complete: the clone's clock and
// entropy are set there, as in Restore.
//
// Postcondition: on error nothing of the VM is left.
func (t *Template) Prestart(ctx context.Context) (*Launched, error) {
	l, err := t.launch(true)
	if err != nil {
		return nil, err
	}
	if err := l.run(ctx, aheadSteps); err != nil {
		l.abort()
		return nil, err
	}
	return &Launched{tmpl: t, id: l.vm.ID, l: l}, nil
}

// HandshakeFailures counts clones whose first agent contact failed.
func (t *Template) HandshakeFailures() int64 { return t.handshakeFailures.Load() }

// cloneMode is how a clone of the template is launched: a new overlay on
// the frozen disk, the sealed RAM copy and the state file as fds.
func (t *Template) cloneMode(state *os.File) launchMode {
	return launchMode{
		backing:  filepath.Join(t.Dir, OverlayFile),
		readOnly: append(t.img.qemuFiles(), t.Dir),
		ram:      ramPrivateFD,
		files:    []*os.File{t.ram, state},
		restore:  true,
	}
}

// String describes the template for logs.
func (t *Template) String() string {
	return "template " + t.Meta.Key + " (" + strconv.Itoa(t.Meta.MemoryMiB) + " MiB, " + strconv.Itoa(t.Meta.CPUs) + " CPU, " + strconv.Itoa(t.Meta.DiskMiB) + " MiB of disk)"
}
