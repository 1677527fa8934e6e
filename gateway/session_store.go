package gateway

// Sessions on disk. Each session's directory, STATE/sessions/SID/, holds
// session.json, its record marshalled whole, and its save points. The
// record says whether the session is paused (and in which save point) or
// running; a start finds the paused ones again, and reports the ones that
// were running when the daemon died as lost (their VMs died with it). A
// change of state is written before it is made: a daemon that dies
// between the two finds the session lost, never resumed into an older
// state.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/internal/durable"
	"github.com/vmgate/vmgate/internal/names"
	"github.com/vmgate/vmgate/vm"
)

const (
	sessionsDir     = "sessions"
	lostDir         = "lost"
	forksDir        = "forks"
	sessionFileName = "session.json"
)

// errSessionClosed is an operation's on a session that was ended while it
// ran (DELETE, its holder gone): the operation's results are undone.
var errSessionClosed = errors.New("the session was ended meanwhile")

// store writes ss's record, as change (nil: none) makes a copy of it, to
// its file, replacing the file atomically. The session itself is not
// changed: the caller makes the change once it is written. A session ended
// meanwhile is not written again (its directory stays removed).
func (x *sessions) store(ss *session, change func(*sessionRecord)) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.State == stateEnded {
		return fmt.Errorf("session file: %w", errSessionClosed)
	}
	rec := ss.sessionRecord
	if change != nil {
		change(&rec)
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	dir := x.dir(ss.sid)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	if err := durable.WriteFile(filepath.Join(dir, sessionFileName), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	return nil
}

// load finds the sessions the daemon's last run left: the paused ones are
// kept (no VM, no slot), the others were running when it died and are
// lost. What forks were being made is removed. It runs before the daemon
// serves.
func (x *sessions) load() {
	x.lost.load(time.Now())
	forks := filepath.Join(x.stateDir, forksDir)
	if ents, _ := os.ReadDir(forks); len(ents) > 0 {
		x.log.Warn("removing fork points a previous run left", "count", len(ents))
	}
	_ = os.RemoveAll(forks)
	dir := filepath.Join(x.stateDir, sessionsDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			x.log.Error("read the sessions directory", "err", err)
		}
		return
	}
	for _, e := range ents {
		ss, why := x.loadOne(e.Name())
		if ss == nil {
			continue
		}
		if why != "" {
			ss.State = stateEnded // its file goes: it is not written again
			x.endProcs(ss, "lost: "+why)
			x.lost.note(ss.key(), ss.sid, why, time.Now())
			x.rec.metrics.sessionLost()
			_ = os.RemoveAll(x.dir(ss.sid))
			x.audit(ss, nil, audit.Record{Message: "lost: " + why})
			x.log.Warn("session lost", "session", ss.Name, "owner", ss.Owner, "why", why)
			continue
		}
		x.table[ss.key()] = ss
		x.log.Info("paused session found", "session", ss.Name, "owner", ss.Owner, "paused_at", ss.PausedAt, "disk_mib", ss.sp.Meta.DiskBytes()>>20)
	}
}

// loadOne reads one session's directory: the session, with why it is
// lost ("" when it is paused and whole); nil for a directory that names
// no session (removed).
func (x *sessions) loadOne(sid string) (*session, string) {
	dir := x.dir(sid)
	var rec sessionRecord
	b, err := os.ReadFile(filepath.Join(dir, sessionFileName))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil || rec.Version != sessionRecordVersion || !names.Session(rec.Name) || rec.Owner != rec.Caller.Key() {
		x.log.Warn("removing a session directory without a readable session", "dir", dir, "err", err)
		_ = os.RemoveAll(dir)
		return nil, ""
	}
	ss := &session{sessionRecord: rec, sid: sid, use: newSessionUse(false, rec.PausedAt), ended: make(chan struct{})}
	if rec.State != statePaused {
		return ss, "vmgated stopped while it was running (its VM ended with the daemon)"
	}
	sp, err := vm.OpenSavePoint(filepath.Join(dir, rec.Save))
	if err != nil {
		return ss, "its saved state cannot be read: " + err.Error()
	}
	ss.sp = sp
	return ss, ""
}
