package bench

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/inproc"
	"github.com/vmgate/vmgate/gateway/wire"
)

// Sessions that last and branch, measured on one session of the default
// shape (512 MiB) that has written SessionFileMiB of files and runs a
// background process, through the real daemon:
//   - pause_ms: POST pause → the session paused (its VM gone);
//   - resume_ms: a paused session's command `true` → answered;
//   - fork_ms, fork4_ms: a fork into 1 (4) copies → each copy answered
//     `true` (the parent keeps running);
//   - fork_idle: ForkIdle idle copies of one fork point, their QEMUs'
//     mean RSS and PSS (the copies share the fork point's RAM);
//   - paused_disk_mib: what the paused session takes on disk.

// sessionPolicy is the bench policy with room for the fork's copies and
// their parent, and for as many paused sessions.
func sessionPolicy(maxVMs int) []byte {
	text := benchPolicy(maxVMs, false)
	return bytes.Replace(text, []byte("[profile.sessions]\n"), []byte(fmt.Sprintf("[profile.sessions]\nmax_paused = %d\nmax_paused_mib = %d\n", maxVMs, maxVMs*2048)), 1)
}

// sessions measures pause, resume and fork (see above).
func (r *execRun) sessions(ctx context.Context) error {
	o, rep := r.o, r.rep
	n := max(o.ForkIdle, 4) + 2 // the copies, their parent, a spare
	d, err := inproc.Start(ctx, inproc.Options{Dir: filepath.Join(r.work, "sessions"), ImageDir: o.ImageDir, TemplateDir: o.TemplateDir,
		Policy: withASLR(sessionPolicy(n), o.GuestASLR), MaxVMs: n, PoolSize: 1, Ahead: o.Ahead, Accel: o.Accel, TBSizeMiB: o.TBSizeMiB, Log: o.Log})
	if err != nil {
		return err
	}
	defer d.Stop()
	if err := d.WaitPool(ctx, 1); err != nil {
		return err
	}
	c := d.Client
	run := func(session, cmd string) error {
		res, err := c.Exec(ctx, wire.ExecRequest{Argv: []string{cmd}, Shell: true, Session: session}, client.ExecIO{})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("%q in session %s: exit %d", cmd, session, res.ExitCode)
		}
		return err
	}
	r.step("session: %d MiB of files and a background process", o.SessionFileMiB)
	if err := fill(ctx, c, "base", o.SessionFileMiB); err != nil {
		return err
	}
	runs := min(o.Runs, 5)
	var pauses, resumes []time.Duration
	for i := range runs {
		r.step("pause and resume %d/%d", i+1, runs)
		t0 := time.Now()
		ss, err := c.PauseSession(ctx, "base")
		if err != nil {
			return err
		}
		pauses = append(pauses, time.Since(t0))
		rep.PausedDiskMiB = math.Round(float64(ss.DiskBytes)/(1<<20)*10) / 10
		t1 := time.Now()
		if err := run("base", "true"); err != nil {
			return err
		}
		resumes = append(resumes, time.Since(t1))
	}
	rep.PauseMS, rep.ResumeMS = summarize(pauses), summarize(resumes)
	fork := func(k int) (time.Duration, error) {
		names := make([]string, k)
		for i := range names {
			names[i] = "copy" + strconv.Itoa(i)
		}
		t0 := time.Now()
		if _, err := c.ForkSession(ctx, "base", names); err != nil {
			return 0, err
		}
		for _, nm := range names {
			if err := run(nm, "true"); err != nil {
				return 0, err
			}
		}
		return time.Since(t0), nil
	}
	end := func(k int) error {
		for i := range k {
			if err := c.EndSession(ctx, "copy"+strconv.Itoa(i)); err != nil {
				return err
			}
		}
		return nil
	}
	for _, f := range []struct {
		k    int
		stat *Stat
	}{{1, &rep.ForkMS}, {4, &rep.Fork4MS}} {
		var ds []time.Duration
		for i := range runs {
			r.step("fork into %d, %d/%d", f.k, i+1, runs)
			dur, err := fork(f.k)
			if err != nil {
				return err
			}
			ds = append(ds, dur)
			if err := end(f.k); err != nil {
				return err
			}
		}
		*f.stat = summarize(ds)
	}
	r.step("%d idle copies of one fork point", o.ForkIdle)
	if _, err := fork(o.ForkIdle); err != nil {
		return err
	}
	ss, err := c.Sessions(ctx)
	if err != nil {
		return err
	}
	var qemus []int
	for _, s := range ss {
		if s.Parent == "base" && s.VMID != "" {
			if pid := qemuOf(s.VMID); pid > 0 {
				qemus = append(qemus, pid)
			}
		}
	}
	if len(qemus) != o.ForkIdle {
		return fmt.Errorf("found the QEMUs of %d copies, want %d", len(qemus), o.ForkIdle)
	}
	rep.ForkIdle = idleMemory(ctx, qemus)
	rep.ForkIdlePSS = rep.ForkIdle.PSSMiB
	return end(o.ForkIdle)
}

// fill has session write mib MiB of random data into a file of its
// user's home and start a background process, and checks that the file
// has that size (the command runs as the profile's unprivileged user: a
// path it cannot write fails the benchmark, not the figures).
func fill(ctx context.Context, c *client.Client, session string, mib int) error {
	var out bytes.Buffer
	cmd := fmt.Sprintf(`set -e; head -c %dM /dev/urandom > "$HOME/data"; sync; stat -c %%s "$HOME/data"; setsid sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &`, mib)
	res, err := c.Exec(ctx, wire.ExecRequest{Argv: []string{cmd}, Shell: true, Session: session}, client.ExecIO{Stdout: &out})
	if err != nil {
		return err
	}
	if got, want := strings.TrimSpace(out.String()), strconv.Itoa(mib<<20); res.ExitCode != 0 || got != want {
		return fmt.Errorf("session %s: writing %d MiB of files: exit %d, file size %q, want %s", session, mib, res.ExitCode, got, want)
	}
	return nil
}

// qemuOf finds the QEMU process of VM id: the one whose command line
// names its directory.
func qemuOf(id string) int {
	ents, _ := os.ReadDir("/proc")
	needle := []byte(string(filepath.Separator) + "vms" + string(filepath.Separator) + id + string(filepath.Separator))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, needle) && bytes.Contains(b, []byte("qemu")) {
			return pid
		}
	}
	return 0
}
