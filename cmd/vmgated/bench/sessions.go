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

// sessions measures pause, resume and fork (see above) in a daemon of
// their own: one session, baseSession, filled and then paused and
// resumed, forked into 1 and 4 copies, and into ForkIdle idle ones.
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
	s := sessionRun{execRun: r, c: d.Client}
	r.step("session: %d MiB of files and a background process", o.SessionFileMiB)
	if err := fill(ctx, s.c, baseSession, o.SessionFileMiB); err != nil {
		return err
	}
	runs := min(o.Runs, 5)
	if err := s.pauseResume(ctx, runs); err != nil {
		return err
	}
	if rep.ForkMS, err = s.forkTimes(ctx, 1, runs); err != nil {
		return err
	}
	if rep.Fork4MS, err = s.forkTimes(ctx, 4, runs); err != nil {
		return err
	}
	if err := s.idleCopies(ctx, o.ForkIdle); err != nil {
		return err
	}
	return s.machine(ctx, o.Runs)
}

// baseSession is the session that is paused and forked; its copies are
// copy0, copy1, ….
const baseSession = "base"

// sessionRun measures sessions through one daemon's client c.
type sessionRun struct {
	*execRun
	c *client.Client
}

// run runs the shell string cmd in session, which must exit 0.
func (s sessionRun) run(ctx context.Context, session, cmd string) error {
	res, err := s.c.Exec(ctx, wire.ExecRequest{Argv: []string{cmd}, Shell: true, Session: session}, client.ExecIO{})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%q in session %s: exit %d", cmd, session, res.ExitCode)
	}
	return err
}

// pauseResume times runs pauses of baseSession, each followed by a
// command that resumes it, and what it takes on disk paused.
func (s sessionRun) pauseResume(ctx context.Context, runs int) error {
	var pauses, resumes []time.Duration
	for i := range runs {
		s.step("pause and resume %d/%d", i+1, runs)
		t0 := time.Now()
		ss, err := s.c.PauseSession(ctx, baseSession)
		if err != nil {
			return err
		}
		pauses = append(pauses, time.Since(t0))
		s.rep.PausedDiskMiB = math.Round(float64(ss.DiskBytes)/(1<<20)*10) / 10
		t1 := time.Now()
		if err := s.run(ctx, baseSession, "true"); err != nil {
			return err
		}
		resumes = append(resumes, time.Since(t1))
	}
	s.rep.PauseMS, s.rep.ResumeMS = summarize(pauses), summarize(resumes)
	return nil
}

// copyName is the name of baseSession's copy i.
func copyName(i int) string { return "copy" + strconv.Itoa(i) }

// fork forks baseSession into k copies and times it until every copy
// has answered `true`.
func (s sessionRun) fork(ctx context.Context, k int) (time.Duration, error) {
	names := make([]string, k)
	for i := range names {
		names[i] = copyName(i)
	}
	t0 := time.Now()
	if _, err := s.c.ForkSession(ctx, baseSession, names); err != nil {
		return 0, err
	}
	for _, nm := range names {
		if err := s.run(ctx, nm, "true"); err != nil {
			return 0, err
		}
	}
	return time.Since(t0), nil
}

// endCopies ends the k copies fork made.
func (s sessionRun) endCopies(ctx context.Context, k int) error {
	for i := range k {
		if err := s.c.EndSession(ctx, copyName(i)); err != nil {
			return err
		}
	}
	return nil
}

// forkTimes times runs forks into k copies, the copies ended after each.
func (s sessionRun) forkTimes(ctx context.Context, k, runs int) (Stat, error) {
	var ds []time.Duration
	for i := range runs {
		s.step("fork into %d, %d/%d", k, i+1, runs)
		dur, err := s.fork(ctx, k)
		if err != nil {
			return Stat{}, err
		}
		ds = append(ds, dur)
		if err := s.endCopies(ctx, k); err != nil {
			return Stat{}, err
		}
	}
	return summarize(ds), nil
}

// idleCopies measures n idle copies of one fork point: their QEMUs' mean
// RSS and PSS.
func (s sessionRun) idleCopies(ctx context.Context, n int) error {
	s.step("%d idle copies of one fork point", n)
	if _, err := s.fork(ctx, n); err != nil {
		return err
	}
	qemus, err := s.copyQEMUs(ctx)
	if err != nil {
		return err
	}
	if len(qemus) != n {
		return fmt.Errorf("found the QEMUs of %d copies, want %d", len(qemus), n)
	}
	s.rep.ForkIdle = idleMemory(ctx, qemus)
	s.rep.ForkIdlePSS = s.rep.ForkIdle.PSSMiB
	return s.endCopies(ctx, n)
}

// copyQEMUs are the QEMU processes of baseSession's running copies.
func (s sessionRun) copyQEMUs(ctx context.Context) ([]int, error) {
	ss, err := s.c.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	var qemus []int
	for _, x := range ss {
		if x.Parent == baseSession && x.VMID != "" {
			if pid := qemuOf(x.VMID); pid > 0 {
				qemus = append(qemus, pid)
			}
		}
	}
	return qemus, nil
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
