package imagebuild

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/cmd/vmgated/imagebuild/initramfs"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/reexec"
	"github.com/vmgate/vmgate/vm/image"
)

// customizeRole is the re-exec role that mmdebstrap's customize hook runs.
// It runs as (possibly user-namespaced) root with the root filesystem as its
// first argument and the spec file as its second.
const customizeRole = "image-customize"

// mkfsRole runs mkfs.ext4 -d in a private mount namespace in which the
// chroot's /proc, /sys and /dev mounts (set up by mmdebstrap for its hooks)
// are detached, so they are not copied into the image.
const mkfsRole = "image-mkfs"

func init() {
	reexec.Register(customizeRole, runCustomize)
	reexec.Register(mkfsRole, runMkfs)
}

// makeFS creates the ext4 image from root via the mkfs role.
func makeFS(root, img string, sizeMiB int) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("mkfs: %w", err)
	}
	var buf bytes.Buffer
	cmd := exec.Command(self, root, img, strconv.Itoa(sizeMiB))
	cmd.Env = reexec.ChildCommandEnv(os.Environ(), mkfsRole)
	cmd.Stdout, cmd.Stderr = &buf, &buf
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if err := cmd.Run(); err != nil {
		out := buf.String()
		if strings.Contains(out, "Could not allocate block") || strings.Contains(out, "No space left") {
			return fmt.Errorf("mkfs.ext4: the root file system does not fit in %d MiB (use --disk-size): %w", sizeMiB, err)
		}
		return fmt.Errorf("mkfs.ext4: %w: %s", err, lastLines(out, 10))
	}
	return nil
}

func runMkfs(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("usage: ROOTFS IMAGE SIZE_MIB")
	}
	root, img, size := args[0], args[1], args[2]
	mounts, err := mountsUnder(root)
	if err != nil {
		return err
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("detach %s: %w", m, err)
		}
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return fmt.Errorf("mkfs: %w", err)
	}
	argv := []string{"mkfs.ext4", "-q", "-F", "-L", "vmgate-root", "-E", "root_owner=0:0", "-d", root, img, size + "M"}
	return unix.Exec(mkfs, argv, os.Environ())
}

// InitrdModules are loaded by the initramfs, with their dependencies:
// the microvm transport, the disk, the agent channel, the NIC, entropy and
// the root filesystem (crc32c for ext4 metadata checksums).
var InitrdModules = []string{
	"virtio_mmio", "virtio_blk", "virtio_console", "virtio_net", "virtio_rng",
	"ext4", "crc32c_generic",
}

// PrunedModuleDirs are module subtrees (relative to lib/modules/VERSION/kernel)
// left out of the guest: hardware a microvm cannot have. Netfilter, file
// systems and virtual network drivers stay for sysadmin scenarios.
var PrunedModuleDirs = []string{
	"sound", "drivers/gpu", "drivers/media", "drivers/net/wireless",
	"drivers/net/ethernet", "drivers/infiniband", "drivers/staging",
	"drivers/bluetooth", "net/bluetooth", "net/wireless", "net/mac80211",
	"drivers/iio", "drivers/usb", "drivers/input", "drivers/hid",
	"drivers/scsi", "drivers/isdn", "drivers/thunderbolt", "drivers/mtd",
	"drivers/net/can", "drivers/net/usb", "drivers/misc", "drivers/platform",
	"drivers/hwmon", "drivers/leds", "drivers/mfd", "drivers/comedi",
	"drivers/ata", "drivers/target", "drivers/nfc", "net/nfc",
}

// customizeSpec is written by Build and read by the customize role.
type customizeSpec struct {
	WorkDir        string   `json:"work_dir"`
	AgentPath      string   `json:"agent_path"`
	DiskSizeMiB    int      `json:"disk_size_mib"`
	KernelMetaPkg  string   `json:"kernel_meta_pkg"`
	InitrdModules  []string `json:"initrd_modules"`
	PruneModuleDir []string `json:"prune_module_dirs"`
}

// customizeResult is written by the customize role into WorkDir/result.json.
type customizeResult struct {
	KernelVersion string          `json:"kernel_version"`
	KernelPackage string          `json:"kernel_package"`
	Modules       []string        `json:"modules"`
	Packages      []image.Package `json:"packages"`
	Source        *image.Source   `json:"source,omitempty"` // an import's
}

func runCustomize(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: ROOTFS SPEC (got %d arguments)", len(args))
	}
	root, specPath := args[0], args[1]
	b, err := os.ReadFile(specPath)
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	var s customizeSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("parse spec: %w", err)
	}
	if st, err := os.Stat(filepath.Join(root, "etc/os-release")); err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("%s does not look like a root filesystem", root)
	}
	return customize(root, s)
}

func customize(root string, s customizeSpec) error {
	step := func(name string) { fmt.Fprintf(os.Stderr, "vmgate customize: %s\n", name) }

	step("fetching the kernel package")
	k, err := fetchKernel(s.WorkDir, s.KernelMetaPkg)
	if err != nil {
		return err
	}
	kver, kpkg := k.version, k.pkg

	step("installing kernel modules " + kver)
	modDst := filepath.Join(root, "usr/lib/modules", kver)
	if err := copyTree(k.modules, modDst, func(rel string) bool { return pruned(rel, s.PruneModuleDir) }); err != nil {
		return fmt.Errorf("install modules: %w", err)
	}
	if err := runIn("", "chroot", root, "depmod", "-a", kver); err != nil {
		return fmt.Errorf("depmod: %w", err)
	}

	step("writing the initramfs")
	agentBin, mods, err := writeBootFiles(s.WorkDir, k, s.AgentPath, s.InitrdModules)
	if err != nil {
		return err
	}

	step("installing the guest agent and system settings")
	if err := installAgent(root, s, agentBin); err != nil {
		return err
	}
	if err := configureSystem(root); err != nil {
		return err
	}

	step("recording the package list")
	r, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("package list: %w", err)
	}
	pkgs, err := readPackages(r, maxDpkgStatus)
	r.Close()
	if err != nil {
		return err
	}
	for _, g := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*"} {
		m, _ := filepath.Glob(filepath.Join(root, g))
		for _, f := range m {
			_ = os.Remove(f)
		}
	}

	step("creating the ext4 filesystem")
	if err := makeFS(root, filepath.Join(s.WorkDir, "rootfs.ext4"), s.DiskSizeMiB); err != nil {
		return err
	}
	names := make([]string, len(mods))
	for i, m := range mods {
		names[i] = m.Name
	}
	res, _ := json.Marshal(customizeResult{KernelVersion: kver, KernelPackage: kpkg, Modules: names, Packages: pkgs})
	return os.WriteFile(filepath.Join(s.WorkDir, "result.json"), res, 0o644)
}

// kernel is an unpacked kernel package.
type kernel struct {
	pkg, version string
	dir          string // the unpacked package
	modules      string // its lib/modules/VERSION
}

// fetchKernel downloads the kernel image package that the metapackage
// meta depends on into workDir and unpacks it there, with the apt
// configuration in effect (mmdebstrap's for a build, the host's for an
// import).
func fetchKernel(workDir, meta string) (*kernel, error) {
	kpkg, err := kernelPackageName(meta)
	if err != nil {
		return nil, err
	}
	debDir := filepath.Join(workDir, "deb")
	if err := os.MkdirAll(debDir, 0o755); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	if err := runIn(debDir, "apt-get", "-q", "-o", "APT::Sandbox::User=root", "download", kpkg); err != nil {
		return nil, fmt.Errorf("download kernel: %w", err)
	}
	debs, _ := filepath.Glob(filepath.Join(debDir, kpkg+"_*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("download kernel: expected one %s .deb, found %d", kpkg, len(debs))
	}
	kdir := filepath.Join(workDir, "kernel")
	if err := runIn("", "dpkg-deb", "-x", debs[0], kdir); err != nil {
		return nil, fmt.Errorf("unpack kernel: %w", err)
	}
	vers, err := os.ReadDir(filepath.Join(kdir, "lib/modules"))
	if err != nil || len(vers) != 1 {
		return nil, fmt.Errorf("unpack kernel: expected one lib/modules/VERSION directory in %s", debs[0])
	}
	kver := vers[0].Name()
	return &kernel{pkg: kpkg, version: kver, dir: kdir, modules: filepath.Join(kdir, "lib/modules", kver)}, nil
}

// writeBootFiles writes the initramfs (the agent as /init, and the
// modules it loads) and the kernel into workDir; it returns the agent
// binary and the modules.
func writeBootFiles(workDir string, k *kernel, agentPath string, modules []string) ([]byte, []initramfs.Module, error) {
	mods, err := initramfs.ResolveModules(k.modules, modules)
	if err != nil {
		return nil, nil, fmt.Errorf("initramfs: %w", err)
	}
	agentBin, err := os.ReadFile(agentPath)
	if err != nil {
		return nil, nil, fmt.Errorf("initramfs: %w", err)
	}
	var ird bytes.Buffer
	if err := initramfs.Build(&ird, agentBin, mods); err != nil {
		return nil, nil, fmt.Errorf("initramfs: %w", err)
	}
	if err := os.WriteFile(filepath.Join(workDir, image.InitrdFile), ird.Bytes(), 0o644); err != nil {
		return nil, nil, fmt.Errorf("initramfs: %w", err)
	}
	if err := copyFile(filepath.Join(k.dir, "boot", "vmlinuz-"+k.version), filepath.Join(workDir, image.KernelFile), 0o644); err != nil {
		return nil, nil, fmt.Errorf("kernel: %w", err)
	}
	return agentBin, mods, nil
}

// kernelPackageName resolves the kernel metapackage to the versioned image
// package it depends on, using the chroot's apt configuration (mmdebstrap
// exports APT_CONFIG to hooks).
func kernelPackageName(meta string) (string, error) {
	out, err := exec.Command("apt-cache", "depends", meta).Output()
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", meta, err)
	}
	return ParseKernelDepends(string(out))
}

// ParseKernelDepends picks the linux-image-* dependency out of
// `apt-cache depends linux-image-amd64` output.
func ParseKernelDepends(out string) (string, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.TrimPrefix(f[0], "|") == "Depends:" && strings.HasPrefix(f[1], "linux-image-") && validName(f[1]) {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("no linux-image dependency in apt-cache output %q", out)
}

func pruned(rel string, dirs []string) bool {
	rel = filepath.ToSlash(rel)
	for _, d := range dirs {
		p := "kernel/" + d
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return false
}

// agentUnit starts the agent early: it needs only local file systems, not
// the network or the rest of multi-user.target.
const agentUnit = `[Unit]
Description=vmgate guest agent
DefaultDependencies=no
After=local-fs.target systemd-tmpfiles-setup.service systemd-sysusers.service
Before=shutdown.target
Conflicts=shutdown.target

[Service]
ExecStart=` + agentproto.AgentBinaryPath + `
Restart=always
RestartSec=200ms
KillMode=process

[Install]
WantedBy=sysinit.target
`

func installAgent(root string, s customizeSpec, bin []byte) error {
	files := []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{agentproto.AgentBinaryPath, bin, 0o755},
		{agentUnitPath, []byte(agentUnit), 0o644},
	}
	for _, f := range files {
		p := filepath.Join(root, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("install agent: %w", err)
		}
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return fmt.Errorf("install agent: %w", err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			return fmt.Errorf("install agent: %w", err)
		}
	}
	return symlink(agentUnitPath, filepath.Join(root, "etc/systemd/system/sysinit.target.wants/vmgate-agent.service"))
}

// rootFstab names the guest's root disk as makeFS labels it: the only
// disk a VM has.
const rootFstab = "LABEL=vmgate-root\t/\text4\trw,errors=remount-ro\t0\t1\n"

// maskedUnits are not needed in a disposable VM and only slow its boot.
var maskedUnits = []string{
	"serial-getty@ttyS0.service", "getty@tty1.service", "apt-daily.timer",
	"apt-daily-upgrade.timer", "e2scrub_reap.service", "e2scrub_all.timer",
	"fstrim.timer", "systemd-networkd-wait-online.service", "dpkg-db-backup.timer",
	"man-db.timer", "systemd-timesyncd.service", "console-getty.service",
}

func configureSystem(root string) error {
	files := map[string]string{
		"etc/hostname": "vmgate\n",
		"etc/hosts":    "127.0.0.1\tlocalhost\n127.0.1.1\tvmgate\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"etc/fstab":    rootFstab,
		// A VM with a network gets one virtio NIC, configured by DHCP from
		// vmgated's user-space network, whose DNS server is 10.0.2.3 (the
		// only resolver that answers: it resolves allowlisted names).
		"etc/systemd/network/80-vmgate.network": "[Match]\nType=ether\n\n[Network]\nDHCP=ipv4\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n\n[DHCPv4]\nUseDNS=no\nUseHostname=no\n",
		"etc/resolv.conf":                       "nameserver 10.0.2.3\noptions timeout:2 attempts:2\n",
	}
	for p, c := range files {
		full := filepath.Join(root, p)
		_ = os.Remove(full) // resolv.conf may be a symlink
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("configure: %w", err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			return fmt.Errorf("configure: %w", err)
		}
	}
	for unit, wants := range map[string]string{
		"systemd-networkd.service": "multi-user.target.wants",
		"systemd-networkd.socket":  "sockets.target.wants",
	} {
		if err := symlink("/lib/systemd/system/"+unit, filepath.Join(root, "etc/systemd/system", wants, unit)); err != nil {
			return err
		}
	}
	for _, u := range maskedUnits {
		if err := symlink("/dev/null", filepath.Join(root, "etc/systemd/system", u)); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(root, "home", agentproto.UnprivilegedUser)); errors.Is(err, fs.ErrNotExist) {
		if err := runIn("", "chroot", root, "useradd", "--create-home", "--uid", "1000",
			"--shell", "/bin/bash", agentproto.UnprivilegedUser); err != nil {
			return fmt.Errorf("configure: add user: %w", err)
		}
	}
	// machine-id: empty so that each boot generates its own.
	return os.WriteFile(filepath.Join(root, "etc/machine-id"), nil, 0o444)
}

func symlink(target, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	_ = os.Remove(path)
	if err := os.Symlink(target, path); err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	return nil
}

func runIn(dir, name string, args ...string) error {
	var buf bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, lastLines(buf.String(), 10))
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyTree copies regular files, directories and symlinks from src to dst,
// skipping paths (relative to src) for which skip returns true.
func copyTree(src, dst string, skip func(rel string) bool) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if rel != "." && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(target, info.Mode().Perm())
		case info.Mode()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, target)
		case info.Mode().IsRegular():
			return copyFile(p, target, info.Mode().Perm())
		}
		return nil
	})
}
