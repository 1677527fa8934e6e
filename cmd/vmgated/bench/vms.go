package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/vm"
)

// Figures of the VM layer alone, no daemon: cold boots (part "cold");
// restores from a template, from clones launched ahead, the idle memory
// of restored VMs and commands in a kept VM (part "restore").

// cold measures the cold path: new overlay, full boot, first command.
func (r *execRun) cold(ctx context.Context) error {
	var cold []time.Duration
	coldPhases := map[string][]time.Duration{}
	for i := 0; i < r.o.ColdRuns; i++ {
		r.step("cold boot %d/%d", i+1, r.o.ColdRuns)
		t0 := time.Now()
		v, err := vm.Start(ctx, r.base)
		if err != nil {
			return fmt.Errorf("cold boot: %w", err)
		}
		if err := execTrue(ctx, v); err != nil {
			v.Close()
			return fmt.Errorf("cold boot: %w", err)
		}
		cold = append(cold, time.Since(t0))
		r.rep.Machine.Accel = string(v.Accel)
		for _, p := range v.Phases() {
			coldPhases[p.Name] = append(coldPhases[p.Name], p.Dur)
		}
		if i == r.o.ColdRuns-1 {
			r.rep.IdleCold = idleMemory(ctx, []int{v.Pid()})
		}
		if err := v.Close(); err != nil {
			return err
		}
	}
	r.rep.ColdBootMS = summarize(cold)
	for k, d := range coldPhases {
		r.rep.ColdPhasesMS[k] = summarize(d)
	}
	return nil
}

// template measures the restores from a template (built or reused), the
// idle memory of restored VMs and a kept VM's commands.
func (r *execRun) template(ctx context.Context) error {
	r.step("template")
	t0 := time.Now()
	tmpl, err := vm.EnsureTemplate(ctx, r.base)
	if err != nil {
		return err
	}
	defer tmpl.Close()
	r.rep.TemplateMS = ms(time.Since(t0))
	r.rep.TemplateBuilt = tmpl.Built
	r.rep.Machine.Accel = string(tmpl.Meta.Accel)
	r.rep.TemplateRAMMiB = float64(tmpl.Meta.RAMDataBytes) / (1 << 20)
	for _, phase := range []func(context.Context, *vm.Template) error{r.restores, r.restoresAhead, r.idleAndSession} {
		if err := phase(ctx, tmpl); err != nil {
			return err
		}
	}
	r.rep.RestoreHandshakeFailures += tmpl.HandshakeFailures()
	return nil
}

// restores measures restores (request to agent ready) and the first
// command after each.
func (r *execRun) restores(ctx context.Context, tmpl *vm.Template) error {
	var err error
	r.rep.RestoreMS, r.rep.RestoreFirstMS, r.rep.RestorePhasesMS, err = r.sampleRestores(ctx, "restore", func(int) (*vm.VM, error) {
		return tmpl.Restore(ctx)
	})
	return err
}

// restoresAhead measures restores completed from clones launched ahead
// (each waits a moment first, as one in a pool does), the first command
// after each, and a waiting clone's memory.
func (r *execRun) restoresAhead(ctx context.Context, tmpl *vm.Template) error {
	var err error
	r.rep.RestoreAheadMS, r.rep.RestoreAheadFirstMS, r.rep.RestoreAheadPhasesMS, err = r.sampleRestores(ctx, "restore launched ahead", func(i int) (*vm.VM, error) {
		a, err := tmpl.Prestart(ctx)
		if err != nil {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond) // QEMU settles, as it would while it waits in a pool
		if i == 0 {
			r.rep.IdleAhead = idleMemory(ctx, []int{a.Pid()})
		}
		return a.Complete(ctx)
	})
	return err
}

// sampleRestores makes Runs VMs with restore, timing each (its own
// account: BootDuration and phases) and the first command in it.
func (r *execRun) sampleRestores(ctx context.Context, what string, restore func(i int) (*vm.VM, error)) (all, first Stat, phases map[string]Stat, err error) {
	var restores, firsts []time.Duration
	byPhase := map[string][]time.Duration{}
	for i := 0; i < r.o.Runs; i++ {
		r.step("%s %d/%d", what, i+1, r.o.Runs)
		v, err := restore(i)
		if err != nil {
			return all, first, nil, err
		}
		restores = append(restores, v.BootDuration())
		for _, p := range v.Phases() {
			byPhase[p.Name] = append(byPhase[p.Name], p.Dur)
		}
		t1 := time.Now()
		err = execTrue(ctx, v)
		firsts = append(firsts, time.Since(t1))
		v.Close()
		if err != nil {
			return all, first, nil, err
		}
	}
	phases = map[string]Stat{}
	for k, d := range byPhase {
		phases[k] = summarize(d)
	}
	return summarize(restores), summarize(firsts), phases, nil
}

// idleAndSession measures the memory of idle restored VMs and commands in
// a kept VM.
func (r *execRun) idleAndSession(ctx context.Context, tmpl *vm.Template) error {
	r.step("idle memory and session exec")
	var idle []*vm.VM
	defer func() {
		for _, v := range idle {
			v.Close()
		}
	}()
	for _, n := range []int{1, 2, 4, 8} {
		for len(idle) < n {
			v, err := tmpl.Restore(ctx)
			if err != nil {
				return err
			}
			idle = append(idle, v)
			if err := execTrue(ctx, v); err != nil {
				return err
			}
		}
		m := idleMemory(ctx, pids(idle))
		if n == 2 {
			r.rep.IdleRestored = m
		} else {
			r.rep.IdleRestoredN = append(r.rep.IdleRestoredN, m)
		}
	}
	var sess []time.Duration
	for i := 0; i < r.o.Runs; i++ {
		t1 := time.Now()
		if err := execTrue(ctx, idle[0]); err != nil {
			return err
		}
		sess = append(sess, time.Since(t1))
	}
	r.rep.SessionExecMS = summarize(sess)
	return nil
}

func execTrue(ctx context.Context, v *vm.VM) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	res, err := v.Exec(ctx, vm.ExecRequest{Argv: []string{"true"}})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("true exited %d", res.ExitCode)
	}
	return err
}
