//go:build linux

package audit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
	"golang.org/x/sys/unix"
)

// TestLog_TmpfsFull_Isolated fills a 64 KiB tmpfs: the Log must fail
// closed with ENOSPC, leave a valid chain behind, recover in place once
// the operator makes room (here: remounts the tmpfs larger), and a restart
// continues the chain.
func TestLog_TmpfsFull_Isolated(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("tmpfs", dir, "tmpfs", flags, "size=64k,mode=0700"); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("mount tmpfs: %v (no CAP_SYS_ADMIN in this container?)", err)
		}
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})

	path := filepath.Join(dir, "audit", "audit.jsonl")
	l, _ := openDisk(t, Options{Path: path, RetryInterval: -1})
	big := strings.Repeat("x", 3000)
	var (
		ok  int
		err error
	)
	for ; ok < 1000; ok++ {
		r := rec(ok + 1)
		r.Argv = append(r.Argv, big)
		if err = l.Write(r); err != nil {
			break
		}
	}
	if ok == 0 || ok == 1000 {
		t.Fatalf("%d records fitted in 64 KiB", ok)
	}
	checkFailed(t, l, err, syscall.ENOSPC)
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the file", err)
	}
	rep, err := VerifyFile(path)
	if err != nil || rep.Lines != ok {
		t.Fatalf("VerifyFile = %+v, %v; want %d intact lines", rep, err, ok)
	}
	// The operator makes room: the same Log records again.
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|flags, "size=1m"); err != nil {
		t.Fatalf("remount: %v", err)
	}
	if err := l.Recover(); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	writeN(t, l, ok+1, ok+1)
	l.Close()
	if rep, err := VerifyFile(path); err != nil || rep.Lines != ok+2 {
		t.Fatalf("after recovery: %+v, %v; want %d lines", rep, err, ok+2)
	}

	// A restart continues the chain.
	l2, _ := openDisk(t, Options{Path: path})
	writeN(t, l2, ok+2, ok+2)
	l2.Close()
	if rep, err := VerifyFile(path); err != nil || rep.Lines != ok+3 {
		t.Fatalf("after restart: %+v, %v", rep, err)
	}
}
