package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// busyboxTarball writes a root file system of the host's static busybox,
// as a tarball such as docker export writes, compressed with the named
// tool ("" for none), and returns its path. As root, bin/owned belongs
// to 1234:5678 with mode 4750.
func busyboxTarball(t *testing.T, compress string) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox (Debian: busybox-static) is needed to make a root file system")
	}
	root := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"bin", "etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("cp", bb, filepath.Join(root, "bin/busybox")).CombinedOutput(); err != nil {
		t.Fatalf("cp busybox: %v %s", err, out)
	}
	for _, applet := range []string{"sh", "ls", "cat"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	for p, c := range map[string]string{"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n", "etc/group": "root:x:0:\n", "bin/owned": "x"} {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(filepath.Join(root, "bin/owned"), 1234, 5678); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(root, "bin/owned"), os.ModeSetuid|0o750); err != nil {
			t.Fatal(err)
		}
	}
	tarball := filepath.Join(t.TempDir(), "rootfs.tar")
	if out, err := exec.Command("tar", "-C", root, "--numeric-owner", "-cf", tarball, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	if compress == "" {
		return tarball
	}
	if _, err := exec.LookPath(compress); err != nil {
		t.Skipf("no %s here", compress)
	}
	if out, err := exec.Command(compress, "-q", "-1", tarball).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v %s", compress, err, out)
	}
	m, _ := filepath.Glob(tarball + ".*")
	if len(m) != 1 {
		t.Fatalf("%s wrote %v", compress, m)
	}
	return m[0]
}

var testLimits = unpackLimits{bytes: DefaultImportMaxBytes, entries: DefaultImportMaxEntries}

// testOpts are unpack's options of a test: owners kept as root.
func testOpts(lim unpackLimits) unpackOptions {
	return unpackOptions{lim: lim, owners: os.Geteuid() == 0}
}

// TestUnpack: a busybox root, plain or compressed as images come, is
// unpacked whole, with its links, numeric owners and modes; set-id bits
// are cleared, unless kept (--keep-setid).
func TestUnpack(t *testing.T) {
	for _, compress := range []string{"", "gzip", "bzip2", "xz", "zstd"} {
		t.Run("compress="+compress, func(t *testing.T) {
			tarball := busyboxTarball(t, compress)
			root := t.TempDir()
			if err := unpack(t.Context(), tarball, root, testOpts(testLimits)); err != nil {
				t.Fatal(err)
			}
			kept := t.TempDir()
			opt := testOpts(testLimits)
			opt.keepSetid = true
			if err := unpack(t.Context(), tarball, kept, opt); err != nil {
				t.Fatal(err)
			}
			if l, err := os.Readlink(filepath.Join(root, "bin/sh")); err != nil || l != "busybox" {
				t.Errorf("bin/sh: %q, %v", l, err)
			}
			if b, err := os.ReadFile(filepath.Join(root, "etc/passwd")); err != nil || string(b) != "root:x:0:0:root:/root:/bin/sh\n" {
				t.Errorf("etc/passwd: %q, %v", b, err)
			}
			if os.Geteuid() != 0 {
				return
			}
			fi, err := os.Stat(filepath.Join(root, "bin/owned"))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid != 1234 || st.Gid != 5678 || fi.Mode() != 0o750 {
				t.Errorf("bin/owned: %d:%d %v, want 1234:5678 -rwxr-x---", st.Uid, st.Gid, fi.Mode())
			}
			if fi, err := os.Stat(filepath.Join(kept, "bin/owned")); err != nil || fi.Mode() != os.ModeSetuid|0o750 {
				t.Errorf("bin/owned, set-id kept: %v %v, want -rwsr-x---", fi.Mode(), err)
			}
		})
	}
}

// zeroTarball writes a gzipped tarball of files of n zero bytes each: a
// few KiB that unpack to n*len(names) bytes.
func zeroTarball(t *testing.T, n int64, names ...string) string {
	t.Helper()
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	tw := tar.NewWriter(z)
	zeros := make([]byte, 1<<20)
	for _, name := range names {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: n, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		for left := n; left > 0; left -= int64(len(zeros)) {
			if _, err := tw.Write(zeros[:min(left, int64(len(zeros)))]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "bomb.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestUnpackBounds: a tarball over the bytes or entries an import allows
// fails with errTooLarge, saying which bound, and unpacking stops there:
// tar has written no more than the bound.
func TestUnpackBounds(t *testing.T) {
	// A tar header for a 100 MiB file and no data: refused on its
	// header, before anything is read for it.
	var huge bytes.Buffer
	tw := tar.NewWriter(&huge)
	if err := tw.WriteHeader(&tar.Header{Name: "big", Mode: 0o644, Size: 100 << 20, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	hugeTar := filepath.Join(t.TempDir(), "huge.tar")
	if err := os.WriteFile(hugeTar, huge.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// 40 empty files, each with 512 KiB of extended header: 20 MiB of
	// stream, no file data.
	var padded bytes.Buffer
	tw = tar.NewWriter(&padded)
	for i := range 40 {
		h := &tar.Header{Name: fmt.Sprint(i), Mode: 0o644, Typeflag: tar.TypeReg, Format: tar.FormatPAX,
			PAXRecords: map[string]string{"VMGATE.pad": strings.Repeat("x", 512<<10)}}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	paddedTar := filepath.Join(t.TempDir(), "padded.tar")
	if err := os.WriteFile(paddedTar, padded.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		tarball string
		lim     unpackLimits
		want    string
	}{
		{"a 64 MiB gzip bomb, 8 MiB allowed", zeroTarball(t, 64<<20, "zeros"), unpackLimits{bytes: 8 << 20, entries: 10}, "its files hold more than 8 MiB"},
		{"a gzip bomb of 1 MiB files", zeroTarball(t, 1<<20, "a", "b", "c", "d", "e", "f", "g", "h", "i", "j"), unpackLimits{bytes: 8 << 20, entries: 10}, "more than 8 MiB"},
		{"a 20 MiB stream, 8 MiB allowed", paddedTar, unpackLimits{bytes: 8 << 20, entries: 100}, "it unpacks to more than 8 MiB"},
		{"a file larger than allowed", hugeTar, unpackLimits{bytes: 1 << 20, entries: 10}, "its files hold more than 1 MiB"},
		{"more entries than allowed", zeroTarball(t, 0, "a", "b", "c", "d"), unpackLimits{bytes: 1 << 20, entries: 3}, "it has more than 3 entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			err := unpack(t.Context(), tc.tarball, root, testOpts(tc.lim))
			if !errors.Is(err, errTooLarge) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("unpack: %v, want errTooLarge: %s", err, tc.want)
			}
			var written int64
			_ = filepath.Walk(root, func(_ string, fi os.FileInfo, err error) error {
				if err == nil && fi.Mode().IsRegular() {
					written += fi.Sys().(*syscall.Stat_t).Blocks * 512
				}
				return nil
			})
			if written > tc.lim.bytes {
				t.Errorf("tar wrote %d bytes, more than the bound %d", written, tc.lim.bytes)
			}
		})
	}
	// At the bounds, the same tarballs unpack.
	if err := unpack(t.Context(), zeroTarball(t, 0, "a", "b", "c"), t.TempDir(), testOpts(unpackLimits{bytes: 1 << 20, entries: 3})); err != nil {
		t.Errorf("3 entries, 3 allowed: %v", err)
	}
}

// TestUnpackBadInput: what is not a readable tarball is an error that
// says what is wrong with it.
func TestUnpackBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gz, err := os.ReadFile(zeroTarball(t, 1<<20, "zeros"))
	if err != nil {
		t.Fatal(err)
	}
	corrupt := bytes.Clone(gz)
	corrupt[len(corrupt)-6] ^= 0xff // the CRC
	for _, tc := range []struct {
		name, tarball, want string
	}{
		{"not a tar archive", write("junk.tar", bytes.Repeat([]byte("junk"), 1000)), "not a readable tar archive"},
		{"truncated gzip", write("cut.tar.gz", gz[:len(gz)/2]), "unexpected EOF"},
		{"gzip checksum", write("crc.tar.gz", corrupt), "gzip: invalid checksum"},
		{"corrupt xz", write("bad.tar.xz", append([]byte{0xfd, '7', 'z', 'X', 'Z', 0}, bytes.Repeat([]byte{1}, 100)...)), "xz: exit status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := unpack(t.Context(), tc.tarball, t.TempDir(), testOpts(testLimits))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("unpack: %v, want an error with %q", err, tc.want)
			}
		})
	}
	// A root that is not there is said so.
	err = unpack(t.Context(), busyboxTarball(t, ""), filepath.Join(dir, "missing"), testOpts(testLimits))
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("unpack into a missing directory: %v", err)
	}
}

// TestImportOverLimitLeavesNothing: an import whose tarball is over the
// bound fails with errTooLarge and leaves neither an image nor a build
// directory behind.
func TestImportOverLimitLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("image import needs root")
	}
	for _, tool := range importTools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("image import needs %s", tool)
		}
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox here")
	}
	parent := t.TempDir()
	out := filepath.Join(parent, "img")
	_, err = Import(t.Context(), ImportOptions{OutDir: out, Source: zeroTarball(t, 64<<20, "zeros"), AgentPath: bb, MaxBytes: 8 << 20})
	if !errors.Is(err, errTooLarge) {
		t.Fatalf("Import: %v, want errTooLarge", err)
	}
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		if e.Name() != ".img.lock" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}
