package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/isolate/cgroup/cgrouptest"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm/image"
)

// TestTemplate_RestoreClones builds a template, restores two clones from
// it and checks that each is a fresh, independent VM: it runs commands,
// its clock and random numbers are its own, its disk writes stay in its
// own overlay, and the template is unchanged afterwards.
func TestTemplate_RestoreClones(t *testing.T) {
	img := testutil.RequiresImage(t)
	state := t.TempDir()
	opts := Options{Runtime: Runtime{StateDir: state, Accel: AccelAuto, TemplateDir: testutil.TemplateDir(t)}, ImageDir: img}
	if os.Geteuid() == 0 {
		opts.Cgroups = cgrouptest.RequiresCgroups(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	tmpl, err := EnsureTemplate(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tmpl.Close()
	t.Logf("%s: %+v", tmpl, tmpl.Meta)
	before := map[string][32]byte{}
	for _, f := range []string{OverlayFile, RAMFile, TemplateStateFile} {
		before[f] = hashFile(t, filepath.Join(tmpl.Dir, f))
	}

	// The RAM copy clones map is sealed: nobody can write it.
	if _, err := tmpl.ram.WriteAt([]byte("x"), 0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("write to the sealed template RAM: %v, want EPERM", err)
	}

	// Clone b is launched ahead and waits while clone a is restored: the
	// checks below hold across both ways of making a clone.
	ahead, err := tmpl.Prestart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ahead.Close()
	clones := make([]*VM, 2)
	for i := range clones {
		var v *VM
		if i == 0 {
			v, err = tmpl.Restore(ctx)
		} else {
			v, err = ahead.Complete(ctx)
		}
		if err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
		defer v.Close()
		t.Logf("clone %d: %s restored in %v", i, v.ID, v.BootDuration())
		clones[i] = v
	}
	if _, err := ahead.Complete(ctx); err == nil {
		t.Error("a clone launched ahead was completed twice")
	}
	a, b := clones[0], clones[1]
	t.Run("jailed", func(t *testing.T) {
		rep, err := a.JailReport()
		if err != nil {
			t.Fatal(err)
		}
		if !rep.NoNewPrivs || rep.SeccompMode != 2 || len(rep.NewNamespaces) < 6 {
			t.Errorf("clone not jailed: %s", rep)
		}
	})
	t.Run("disk limit", func(t *testing.T) {
		// The template made the guest's reserve before it was saved; the
		// clone's bound is its overlay's, not the template's RAM file.
		if tmpl.Meta.DiskMiB != DefaultDiskMiB {
			t.Errorf("template of %d MiB of disk, want %d", tmpl.Meta.DiskMiB, DefaultDiskMiB)
		}
		checkDiskLimit(t, b, tmpl.img.diskMiB, DefaultDiskMiB)
	})
	t.Run("exec", func(t *testing.T) {
		o := run(t, a, ExecRequest{Argv: []string{"sh", "-c", "echo hi; exit 3"}})
		if o.stdout != "hi\n" || o.res.ExitCode != 3 {
			t.Fatalf("got %+v %q %q", o.res, o.stdout, o.stderr)
		}
	})
	t.Run("clock", func(t *testing.T) {
		o := run(t, b, ExecRequest{Argv: []string{"date", "+%s"}})
		guest, err := strconv.ParseInt(strings.TrimSpace(o.stdout), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Now().Unix() - guest; d < -5 || d > 5 {
			t.Errorf("guest clock off by %d s", d)
		}
	})
	t.Run("address space randomisation", func(t *testing.T) {
		// Off where TCG would translate each process's code again
		// (GuestASLROff), as the template says; the same library at the
		// same address in two processes then, at two otherwise.
		qv := tmpl.Meta.QEMUVersion
		off := GuestASLROff(GuestASLRAuto, a.Accel, qv)
		if tmpl.Meta.GuestASLR == off {
			t.Errorf("template meta guest_aslr %v under %s, %s", tmpl.Meta.GuestASLR, a.Accel, qv)
		}
		o := run(t, a, ExecRequest{Argv: []string{"sh", "-c", "cat /proc/sys/kernel/randomize_va_space; grep -m1 libc /proc/self/maps | cut -d- -f1; grep -m1 libc /proc/self/maps | cut -d- -f1"}})
		lines := strings.Fields(o.stdout)
		if len(lines) != 3 {
			t.Fatalf("got %+v %q %q", o.res, o.stdout, o.stderr)
		}
		want := "2"
		if off {
			want = "0"
		}
		if lines[0] != want || (lines[1] == lines[2]) != off {
			t.Errorf("randomize_va_space %s, libc at %s and %s; want %s (%s, %s)", lines[0], lines[1], lines[2], want, a.Accel, qv)
		}
	})
	t.Run("random numbers differ", func(t *testing.T) {
		cmd := ExecRequest{Argv: []string{"sh", "-c", "head -c 32 /dev/urandom | od -An -tx1; cat /proc/sys/kernel/random/uuid"}}
		ra, rb := run(t, a, cmd), run(t, b, cmd)
		if ra.stdout == rb.stdout || ra.stdout == "" {
			t.Errorf("two clones produced the same random bytes:\n%s", ra.stdout)
		}
	})
	t.Run("disks are separate", func(t *testing.T) {
		run(t, a, ExecRequest{Argv: []string{"sh", "-c", "echo only-a > /root/mark && sync"}})
		o := run(t, b, ExecRequest{Argv: []string{"cat", "/root/mark"}})
		if o.res.ExitCode == 0 {
			t.Errorf("clone b sees clone a's file: %q", o.stdout)
		}
		o = run(t, a, ExecRequest{Argv: []string{"cat", "/root/mark"}})
		if o.stdout != "only-a\n" {
			t.Errorf("clone a lost its file: %+v %q", o.res, o.stdout)
		}
	})
	t.Run("memory is separate", func(t *testing.T) {
		run(t, a, ExecRequest{Argv: []string{"sh", "-c", "echo a-was-here > /dev/shm/m"}})
		o := run(t, b, ExecRequest{Argv: []string{"cat", "/dev/shm/m"}})
		if o.res.ExitCode == 0 {
			t.Errorf("clone b sees clone a's tmpfs: %q", o.stdout)
		}
	})
	for _, v := range clones {
		if err := v.Close(); err != nil {
			t.Fatal(err)
		}
	}
	assertNoVMs(t, state)
	for f, h := range before {
		if hashFile(t, filepath.Join(tmpl.Dir, f)) != h {
			t.Errorf("template %s changed", f)
		}
	}
	t.Run("pool", func(t *testing.T) { testPool(t, ctx, tmpl, opts) })
	assertNoVMs(t, state)

	// A second load finds the template instead of building it.
	t2, err := EnsureTemplate(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Close()
	if t2.Built || t2.Meta.Key != tmpl.Meta.Key {
		t.Fatalf("second EnsureTemplate rebuilt: %+v", t2.Meta)
	}
}

func testPool(t *testing.T, ctx context.Context, tmpl *Template, opts Options) {
	p := NewPool(tmpl, 2, 1)
	defer p.Close()
	waitFull := func() {
		for st := p.Stats(); st.Ready < 2 || st.Ahead < 1; st = p.Stats() {
			select {
			case <-ctx.Done():
				t.Fatalf("pool never filled: %+v", p.Stats())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	waitFull()
	seen := map[string]bool{}
	for i := 0; i < 2; i++ {
		v, fromPool, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !fromPool || seen[v.ID] {
			t.Errorf("get %d: fromPool=%v id=%s (seen %v)", i, fromPool, v.ID, seen)
		}
		seen[v.ID] = true
		if o := run(t, v, ExecRequest{Argv: []string{"true"}}); o.res.ExitCode != 0 {
			t.Errorf("pooled VM: %+v", o.res)
		}
		if err := v.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Under memory pressure the pool gives its idle VMs back and stops
	// refilling.
	waitFull()
	p.mu.Lock()
	p.memAvailable = func() (int64, error) { return 0, nil }
	p.mu.Unlock()
	p.kick()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		st := p.Stats()
		if st.Ready == 0 && st.Ahead == 0 && st.Shrunk > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool did not shrink: %+v", st)
		}
		p.kick()
		time.Sleep(100 * time.Millisecond)
	}
	// Empty pool: Get restores on demand.
	v, fromPool, err := p.Get(ctx)
	if err != nil || fromPool {
		t.Fatalf("get from an empty pool: %v fromPool=%v", err, fromPool)
	}
	_ = v.Close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("pool stats: %+v", p.Stats())

	// Size 0 keeps nothing ready.
	p0 := NewPool(tmpl, 0, 0)
	time.Sleep(200 * time.Millisecond)
	if st := p0.Stats(); st.Ready != 0 || st.Restored != 0 || st.Ahead != 0 {
		t.Errorf("size-0 pool restored VMs: %+v", st)
	}
	if err := p0.Close(); err != nil {
		t.Fatal(err)
	}

	// Size 0 with one clone launched ahead: a Get completes it.
	pa := NewPool(tmpl, 0, 1)
	for st := pa.Stats(); st.Ahead < 1; st = pa.Stats() {
		select {
		case <-ctx.Done():
			t.Fatalf("nothing launched ahead: %+v", st)
		case <-time.After(50 * time.Millisecond):
		}
	}
	got, fromPool, err := pa.Get(ctx)
	if err != nil || fromPool {
		t.Fatalf("get with a clone launched ahead: %v fromPool=%v", err, fromPool)
	}
	if o := run(t, got, ExecRequest{Argv: []string{"true"}}); o.res.ExitCode != 0 {
		t.Errorf("clone launched ahead: %+v", o.res)
	}
	_ = got.Close()
	if st := pa.Stats(); st.AheadUsed != 1 || st.AheadFailed != 0 {
		t.Errorf("stats: %+v, want 1 used and none failed", st)
	}
	if err := pa.Close(); err != nil {
		t.Fatal(err)
	}

	// A clone launched ahead whose QEMU died while it waited is never
	// used: a restore replaces it, and the filler's prune closes one it
	// finds. (A pool without its fillers, so that nothing else takes or
	// adds clones.)
	bare := &Pool{tmpl: tmpl, log: tmpl.clone.Log, aheadN: 1, ready: make(chan *VM, 1), ahead: make(chan *Launched, 1), wake: make(chan struct{}, 1), wakeAhead: make(chan struct{}, 1)}
	deadClone := func() *Launched {
		d, err := tmpl.Prestart(ctx)
		if err != nil {
			t.Fatal(err)
		}
		v := d.l.vm
		if err := v.Kill(); err != nil {
			t.Fatal(err)
		}
		<-v.Exited()
		return d
	}
	dead := deadClone()
	deadID := dead.ID()
	bare.ahead <- dead
	got, err = bare.restore(ctx, false)
	if err != nil || got.ID == deadID {
		t.Fatalf("restore with a dead clone launched ahead: %v (the dead one: %v)", err, got != nil && got.ID == deadID)
	}
	if o := run(t, got, ExecRequest{Argv: []string{"true"}}); o.res.ExitCode != 0 {
		t.Errorf("the replacement: %+v", o.res)
	}
	_ = got.Close()
	bare.ahead <- deadClone()
	prune(bare, bare.ahead, "launch ahead")
	if st := bare.Stats(); st.Ahead != 0 || st.AheadUsed != 1 || st.AheadFailed != 2 {
		t.Errorf("stats: %+v, want none waiting, 1 used, 2 failed", st)
	}
	assertNoVMs(t, opts.StateDir)
}

// TestTemplate_ImageChangeAndCorruption checks that a template whose files
// were damaged is refused when loaded, and that a changed image gets a new
// template that replaces the old one of the same shape.
func TestTemplate_ImageChangeAndCorruption(t *testing.T) {
	img := testutil.RequiresImage(t)
	tdir := t.TempDir() // this test damages templates: never the shared ones
	opts := Options{Runtime: Runtime{StateDir: t.TempDir(), Accel: AccelAuto, TemplateDir: tdir}, ImageDir: img}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	t1, err := EnsureTemplate(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t1.Close()

	// A damaged state file or RAM file is detected on load.
	for _, f := range []string{TemplateStateFile, RAMFile} {
		p := filepath.Join(t1.Dir, f)
		orig, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		_ = os.Chmod(t1.Dir, 0o700)
		_ = os.Chmod(p, 0o600)
		bad := append([]byte(nil), orig...)
		bad[len(bad)/2] ^= 0xff
		if err := os.WriteFile(p, bad, 0o400); err != nil {
			t.Fatal(err)
		}
		m, err := readTemplateMeta(t1.Dir)
		if err == nil {
			err = verifyTemplateFiles(t1.Dir, m)
		}
		if err == nil {
			_, err = loadRAM(t1.Dir, m)
		}
		if err == nil || !strings.Contains(err.Error(), "sha256") {
			t.Errorf("damaged %s: %v", f, err)
		}
		if err := os.WriteFile(p, orig, 0o400); err != nil {
			t.Fatal(err)
		}
	}

	// A changed image: the same files but a different initramfs (zero
	// padding after the cpio trailer, which the kernel ignores).
	img2 := filepath.Join(t.TempDir(), "image")
	if out, err := exec.Command("cp", "-al", img, img2).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	initrd := filepath.Join(img2, image.InitrdFile)
	b, err := os.ReadFile(initrd)
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, make([]byte, 512)...)
	if err := os.Remove(initrd); err != nil { // a hard link to the real image
		t.Fatal(err)
	}
	if err := os.WriteFile(initrd, b, 0o644); err != nil {
		t.Fatal(err)
	}
	man, err := image.ReadManifest(img2)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	man.Artifacts[image.InitrdFile] = image.Artifact{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b))}
	if err := os.Remove(filepath.Join(img2, image.ManifestFile)); err != nil {
		t.Fatal(err)
	}
	if err := image.WriteManifest(img2, man); err != nil {
		t.Fatal(err)
	}
	opts.ImageDir = img2
	t2, err := EnsureTemplate(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Close()
	if !t2.Built || t2.Meta.Key == t1.Meta.Key {
		t.Fatalf("changed image: built=%v key %s (old %s)", t2.Built, t2.Meta.Key, t1.Meta.Key)
	}
	if _, err := os.Stat(t1.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old image's template of the same shape was kept: %v", err)
	}
	v, err := t2.Restore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if o := run(t, v, ExecRequest{Argv: []string{"true"}}); o.res.ExitCode != 0 {
		t.Fatalf("clone of the new template: %+v", o.res)
	}
}

// TestTemplate_BuildOnFullDisk builds a template with its state directory
// on a tmpfs too small for the guest's RAM: the build fails saying the
// disk is full, and leaves no template, build directory or VM directory.
func TestTemplate_BuildOnFullDisk(t *testing.T) {
	img := testutil.RequiresImage(t)
	mnt := testutil.Tmpfs(t, "32m")
	root := filepath.Join(mnt, "templates")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tm, err := EnsureTemplate(ctx, Options{Runtime: Runtime{StateDir: mnt, Accel: AccelAuto, TemplateDir: root}, ImageDir: img})
	if err == nil {
		tm.Close()
		t.Fatal("a template was built on a 32 MiB disk")
	}
	if !errors.Is(err, ErrStateDiskFull) {
		t.Fatalf("build on a full disk: %v; want %v", err, ErrStateDiskFull)
	}
	t.Logf("build on a full disk: %.300s", err)
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if e.IsDir() {
			t.Errorf("left in the template directory: %s", e.Name())
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(mnt, "vms")); len(ents) != 0 {
		t.Errorf("%d VM directories left", len(ents))
	}
}
