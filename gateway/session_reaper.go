package gateway

import "time"

// startReaper ends sessions that expired or whose VM died, and pauses
// the idle ones due for it (one pause at a time: a pause costs the host a
// QEMU's start and a copy of the guest's RAM). stop ends it.
func (x *sessions) startReaper() (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				x.reap(now)
			}
		}
	}()
	return func() { close(quit); <-done }
}

// reap is one round of the reaper.
func (x *sessions) reap(now time.Time) {
	for _, ss := range x.all() {
		ss.mu.Lock()
		dead := ss.State == stateRunning && ss.vm != nil && ss.vm.Gone()
		busy := ss.use.inUse()
		expired := !busy && !now.Before(ss.expiryLocked())
		due := ss.pauseDueLocked(now)
		var work []func()
		if !busy {
			work, ss.use.idleWork = ss.use.idleWork, nil
		}
		ss.mu.Unlock()
		if len(work) > 0 {
			go func() {
				for _, f := range work {
					f()
				}
			}()
		}
		switch {
		case dead && busy:
			x.endOffReaper(ss, func() { x.destroy(ss, "its vm died") }) // its command is told
		case dead:
			// No command saw it: the owner's next one is told, rather
			// than run in a new, empty session.
			x.endOffReaper(ss, func() { x.lose(ss, "its VM died while no command ran") })
		case due:
			if ss.tryTake() {
				x.autoPause(ss, now)
			}
		case expired:
			x.endOffReaper(ss, func() { x.destroy(ss, "expired") })
		}
	}
}

// endOffReaper runs end, the end of ss, in the reaper's round, or in a
// goroutine of its own when ss has published ports: their stops wait for
// their connections to be relayed to the end and audited, which no other
// session's end, pause or death may wait for. end runs once whatever
// happens twice (destroy is idempotent).
func (x *sessions) endOffReaper(ss *session, end func()) {
	ss.mu.Lock()
	pubs := len(ss.pubs)
	ss.mu.Unlock()
	if pubs > 0 {
		go end()
		return
	}
	end()
}
