package vm

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// hostileVMDir is a VM directory whose QEMU replaced file with a symlink
// to one of the daemon's files (mode 0644, returned), as a QEMU that a
// guest took over can: the directory is QEMU's, read-write in its jail.
func hostileVMDir(t *testing.T, file string) (dir, secret string) {
	t.Helper()
	dir = t.TempDir()
	secret = filepath.Join(t.TempDir(), "daemon-secret")
	if err := os.WriteFile(secret, []byte("the daemon's own file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(secret, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, file)); err != nil {
		t.Fatal(err)
	}
	return dir, secret
}

// unchanged fails t if the daemon's file lost its mode or content.
func unchanged(t *testing.T, secret string) {
	t.Helper()
	st, err := os.Stat(secret)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("the daemon's file: %v (%v), want its mode 0644 kept", st.Mode(), err)
	}
}

// TestCopySparseRefusesSymlink: a copy of a file from a VM's directory
// never follows a symlink its QEMU put there: no daemon file is copied
// into a save point or a template.
func TestCopySparseRefusesSymlink(t *testing.T) {
	dir, secret := hostileVMDir(t, OverlayFile)
	dst := filepath.Join(t.TempDir(), OverlayFile)
	if err := copySparse(filepath.Join(dir, OverlayFile), dst); err == nil {
		t.Error("a symlink was copied")
	}
	if b, _ := os.ReadFile(dst); bytes.Contains(b, []byte("daemon")) {
		t.Error("the daemon's file was copied")
	}
	unchanged(t, secret)
}

// TestCopyDiskRefusesSymlink: a save takes the stopped VM's overlay by a
// link (the VM is left stopped) or a copy (it runs on); neither follows a
// symlink that its QEMU put in the overlay's place, nor changes the mode
// of what it points to.
func TestCopyDiskRefusesSymlink(t *testing.T) {
	for _, keep := range []bool{false, true} {
		dir, secret := hostileVMDir(t, OverlayFile)
		s := &saving{v: &VM{Dir: dir}, tmp: t.TempDir(), o: SaveOptions{Keep: keep}}
		err := s.copyDisk(t.Context())
		if err == nil {
			err = s.awaitCopy()
		}
		if err == nil {
			t.Errorf("keep %v: the overlay's symlink was taken", keep)
		}
		if b, _ := os.ReadFile(filepath.Join(s.tmp, OverlayFile)); bytes.Contains(b, []byte("daemon")) {
			t.Errorf("keep %v: the daemon's file is the save point's disk", keep)
		}
		unchanged(t, secret)
	}
}

// TestFileTailRefusesSymlink: a failed VM's error quotes the end of its
// QEMU's log, never of a file a symlink in its place points to.
func TestFileTailRefusesSymlink(t *testing.T) {
	dir, _ := hostileVMDir(t, QEMULog)
	if b := fileTail(filepath.Join(dir, QEMULog), consoleKeep); len(b) != 0 {
		t.Errorf("the log's tail is %q, the daemon's file", b)
	}
	if err := os.Remove(filepath.Join(dir, QEMULog)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, QEMULog), []byte("qemu: an error\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b := fileTail(filepath.Join(dir, QEMULog), consoleKeep); string(b) != "qemu: an error\n" {
		t.Errorf("the log's tail is %q", b)
	}
}

// TestChmodQEMUFile: a template's files, moved out of the VM's directory,
// get their mode on the file itself: a symlink in their place is refused
// and what it points to keeps its mode, and a FIFO is refused at once
// (its open would wait for a writer).
func TestChmodQEMUFile(t *testing.T) {
	dir, secret := hostileVMDir(t, RAMFile)
	if err := chmodQEMUFile(filepath.Join(dir, RAMFile), 0o400); err == nil {
		t.Error("a symlink's target got the mode")
	}
	unchanged(t, secret)
	fifo := filepath.Join(dir, TemplateStateFile)
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := chmodQEMUFile(fifo, 0o400); err == nil {
		t.Error("a FIFO got the mode")
	}
	file := filepath.Join(dir, OverlayFile)
	if err := os.WriteFile(file, []byte("qcow"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := chmodQEMUFile(file, 0o400); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(file); err != nil || st.Mode() != 0o400 {
		t.Errorf("the file's mode is %v (%v), want 0400", st.Mode(), err)
	}
}
