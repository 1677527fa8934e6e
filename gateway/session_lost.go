package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/vmgate/vmgate/internal/durable"
	"github.com/vmgate/vmgate/internal/names"
)

// lostSession is a session the daemon could not keep: its owner's next
// command on it is told, once. The note is a file (STATE/lost/SID.json),
// so that a restart, or a second one, does not turn it into a new, empty
// session silently.
type lostSession struct {
	Version int       `json:"version"`
	Owner   string    `json:"owner"`
	Name    string    `json:"name"`
	Why     string    `json:"why"`
	At      time.Time `json:"at"`
	file    string
}

// lostNoteLife is how long a lost note waits for its owner's next command
// on the name; older ones are removed at start.
const lostNoteLife = 30 * 24 * time.Hour

// maxLostPerOwner bounds one owner's lost notes: a guest root that
// powers its VM off after each command, under a new session name each
// time, adds a note each; past the bound the oldest go.
const maxLostPerOwner = 64

// lostNotes are the notes of lost sessions, in memory and in dir.
type lostNotes struct {
	dir string
	log *slog.Logger

	mu    sync.Mutex
	notes map[sessionKey]lostSession
}

func newLostNotes(dir string, log *slog.Logger) *lostNotes {
	return &lostNotes{dir: dir, log: log, notes: map[sessionKey]lostSession{}}
}

// note keeps why the session key (sid) was lost for its owner's next
// command, on disk as well.
func (n *lostNotes) note(key sessionKey, sid, why string, at time.Time) {
	l := lostSession{Version: 1, Owner: key.owner, Name: key.name, Why: why, At: at, file: filepath.Join(n.dir, sid+".json")}
	b, err := json.Marshal(l)
	if err == nil {
		if err = os.MkdirAll(n.dir, 0o700); err == nil {
			err = durable.WriteFile(l.file, b, 0o600)
		}
	}
	if err != nil {
		n.log.Error("keep a lost session's note: its owner is told until vmgated stops", "session", key.name, "err", err)
		l.file = ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.notes[key]; ok && old.file != "" && old.file != l.file {
		_ = os.Remove(old.file)
	}
	n.notes[key] = l
	n.capLocked(key.owner)
}

// capLocked drops owner's oldest notes past maxLostPerOwner.
// Precondition: n.mu held.
func (n *lostNotes) capLocked(owner string) {
	var mine []sessionKey
	for k := range n.notes {
		if k.owner == owner {
			mine = append(mine, k)
		}
	}
	if len(mine) <= maxLostPerOwner {
		return
	}
	slices.SortFunc(mine, func(a, b sessionKey) int { return n.notes[a].At.Compare(n.notes[b].At) })
	for _, k := range mine[:len(mine)-maxLostPerOwner] {
		if f := n.notes[k].file; f != "" {
			_ = os.Remove(f)
		}
		delete(n.notes, k)
	}
	n.log.Warn("a caller's oldest lost session notes dropped", "owner", owner, "dropped", len(mine)-maxLostPerOwner, "kept", maxLostPerOwner)
}

// take returns and forgets why the caller's session was lost, or "".
func (n *lostNotes) take(key sessionKey) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, ok := n.notes[key]
	if !ok {
		return ""
	}
	delete(n.notes, key)
	if l.file != "" {
		if err := os.Remove(l.file); err != nil && !errors.Is(err, os.ErrNotExist) {
			n.log.Warn("remove a lost session's note", "session", key.name, "err", err)
		}
	}
	return fmt.Sprintf("%s (at %s)", l.Why, l.At.UTC().Format(time.RFC3339))
}

// load reads the notes a previous run left; notes older than
// lostNoteLife, or unreadable, are removed.
func (n *lostNotes) load(now time.Time) {
	ents, err := os.ReadDir(n.dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			n.log.Error("read the lost sessions' notes", "err", err)
		}
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range ents {
		p := filepath.Join(n.dir, e.Name())
		var l lostSession
		b, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(b, &l)
		}
		switch {
		case err != nil || l.Version != 1 || !names.Session(l.Name) || l.Owner == "":
			n.log.Warn("removing an unreadable lost session's note", "file", p, "err", err)
			_ = os.Remove(p)
		case now.Sub(l.At) > lostNoteLife:
			n.log.Info("removing a lost session's note nobody asked for", "session", l.Name, "owner", l.Owner, "lost_at", l.At)
			_ = os.Remove(p)
		default:
			l.file = p
			n.notes[sessionKey{l.Owner, l.Name}] = l
			n.capLocked(l.Owner)
		}
	}
}

// lose ends a session that cannot go on, and keeps why for its owner's
// next command.
func (x *sessions) lose(ss *session, why string) {
	x.lost.note(ss.key(), ss.sid, why, time.Now())
	x.endLost(ss, why)
}

// endLost ends a lost session whose loss the command at hand is told.
func (x *sessions) endLost(ss *session, why string) {
	x.rec.metrics.sessionLost()
	x.destroy(ss, "lost: "+why)
}

// lostError is what the command on a lost session is told.
func lostError(name, why string) *RequestError {
	return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("session %q was lost: %s; this command did not run, and the next one starts a new session", name, why)}
}
