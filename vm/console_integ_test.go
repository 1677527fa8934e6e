package vm

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testutil"
)

// TestVM_ConsoleFlood: a root guest floods its serial console: 8 MiB by
// default, eight times the file's bound (the emulated UART takes about
// 2 s per MiB under TCG; VMGATE_TEST_CONSOLE_MIB=200 runs the 200 MiB of
// the security review in about 7 minutes).
// console.log stays at its bound, the daemon allocates far less than what
// the guest wrote (nothing of it accumulates), and the details of the
// VM's death (not its message) show the console's last lines.
func TestVM_ConsoleFlood(t *testing.T) {
	img := testutil.RequiresImage(t)
	opts := Options{Runtime: Runtime{StateDir: t.TempDir(), Accel: AccelAuto, TemplateDir: testutil.TemplateDir(t)}, ImageDir: img}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tmpl, err := EnsureTemplate(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tmpl.Close()
	v, err := tmpl.Restore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	size := os.Getenv("VMGATE_TEST_CONSOLE_MIB")
	if size == "" {
		size = "8"
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	res, err := v.Exec(ctx, ExecRequest{User: "root", Argv: []string{"sh", "-c",
		"head -c " + size + "M /dev/zero | tr '\\0' x > /dev/ttyS0; echo the-last-line > /dev/ttyS0"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("flood: %v %+v", err, res)
	}
	took := time.Since(t0)
	_ = v.Kill()
	<-v.Exited()
	died := v.died("after the flood")
	msg := Details(died)
	runtime.ReadMemStats(&after)
	st, err := os.Stat(filepath.Join(v.Dir, ConsoleLog))
	if err != nil {
		t.Fatal(err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%s MiB in %v; console.log %d bytes; %d MiB allocated meanwhile", size, took.Round(time.Millisecond), st.Size(), alloc>>20)
	if st.Size() > ConsoleLogMax+4096 {
		t.Errorf("console.log is %d bytes, bound %d", st.Size(), ConsoleLogMax)
	}
	if alloc > 64<<20 {
		t.Errorf("the daemon allocated %d MiB while the guest wrote %s MiB", alloc>>20, size)
	}
	if !strings.Contains(msg, "the-last-line") {
		t.Errorf("the death's details lack the console's last line: %.300s", msg)
	}
	// What the guest wrote is for the host's log, never in the error a
	// client could be shown.
	if strings.Contains(died.Error(), "the-last-line") {
		t.Errorf("the death's message carries the guest's console: %.300s", died.Error())
	}
}
