package vm

import (
	"context"
	"testing"
	"time"
)

func TestZZPoolTiming(t *testing.T) {
	opts := Options{ImageDir: "/var/lib/vmgate/image", StateDir: "/tmp/zzstate", Accel: AccelTCG}
	ctx := context.Background()
	tmpl, err := EnsureTemplate(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	p := NewPool(tmpl, opts, 1)
	defer p.Close()
	for _, settle := range []time.Duration{0, 0, 3 * time.Second, 3 * time.Second} {
		for p.Stats().Ready < 1 {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(settle)
		t0 := time.Now()
		v, _, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g := time.Since(t0)
		t1 := time.Now()
		run(t, v, ExecRequest{Argv: []string{"true"}, User: "agent", Env: []string{"LANG=C.UTF-8"}})
		e1 := time.Since(t1)
		t1 = time.Now()
		run(t, v, ExecRequest{Argv: []string{"true"}, User: "agent", Env: []string{"LANG=C.UTF-8"}})
		e2 := time.Since(t1)
		t.Logf("settle %v: get %v exec %v then %v", settle, g, e1, e2)
		v.Close()
	}
}
