package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLostNotesOutliveRestarts: a lost session's note is told to its
// owner's next command on the name once, across daemon restarts (a
// second one included), and not before; notes older than lostNoteLife
// and unreadable ones are removed at start.
func TestLostNotesOutliveRestarts(t *testing.T) {
	state := t.TempDir()
	newServer := func() *lostNotes {
		n := newLostNotes(filepath.Join(state, lostDir), slog.New(slog.DiscardHandler))
		n.load(time.Now())
		return n
	}
	key := sessionKey{owner: "uid:1000", name: "work"}
	s := newServer()
	s.note(key, "abc123", "vmgated stopped and could not pause it: disk full", time.Now())
	s.note(sessionKey{owner: "uid:1000", name: "old"}, "def456", "long ago", time.Now().Add(-lostNoteLife-time.Hour))
	if err := os.WriteFile(filepath.Join(state, lostDir, "junk.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	newServer()     // a restart that serves nobody on the name
	s = newServer() // and a second one
	if why := s.take(sessionKey{owner: "uid:1001", name: "work"}); why != "" {
		t.Errorf("another caller's session of that name was told %q", why)
	}
	if why := s.take(key); !strings.Contains(why, "disk full") {
		t.Errorf("after two restarts the owner is told %q", why)
	}
	if why := s.take(sessionKey{owner: "uid:1000", name: "old"}); why != "" {
		t.Errorf("a note past its life is told: %q", why)
	}
	if why := newServer().take(key); why != "" {
		t.Errorf("a note told once is told again after a restart: %q", why)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, lostDir)); len(ents) != 0 {
		t.Errorf("notes left: %v", ents)
	}
}

// TestWriteSessionAfterEnd: a pause or a resume that finishes after its
// session was ended (DELETE, its holder gone) does not write the session
// back: its directory stays removed, and a restart does not find it.
func TestWriteSessionAfterEnd(t *testing.T) {
	x := &sessions{log: slog.New(slog.DiscardHandler), stateDir: t.TempDir()}
	ss := &session{sessionRecord: sessionRecord{Owner: "uid:1000", Name: "work", State: stateEnded}, sid: "abc"}
	if err := x.store(ss, func(r *sessionRecord) { r.State, r.Save, r.PausedAt = statePaused, "sp-1", time.Now() }); !errors.Is(err, errSessionClosed) {
		t.Errorf("store on an ended session: %v", err)
	}
	if _, err := os.Stat(x.dir(ss.sid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an ended session's directory was made again: %v", err)
	}
}

// TestLostNotesCapped: one owner's lost notes are bounded (a guest root
// that powers off after every command, under a new name each time, adds
// one each): past maxLostPerOwner the oldest go, file and all, and
// another owner's notes stay.
func TestLostNotesCapped(t *testing.T) {
	dir := t.TempDir()
	n := newLostNotes(dir, slog.New(slog.DiscardHandler))
	t0 := time.Now().Add(-time.Hour)
	n.note(sessionKey{"uid:1001", "other"}, "o", "lost", t0)
	for i := range maxLostPerOwner + 10 {
		n.note(sessionKey{"uid:1000", fmt.Sprintf("s%d", i)}, fmt.Sprintf("sid%d", i), "powered off", t0.Add(time.Duration(i)*time.Second))
	}
	if ents, _ := os.ReadDir(dir); len(ents) != maxLostPerOwner+1 {
		t.Errorf("%d note files, want %d", len(ents), maxLostPerOwner+1)
	}
	if why := n.take(sessionKey{"uid:1000", "s9"}); why != "" {
		t.Errorf("an old note past the bound is kept: %q", why)
	}
	if why := n.take(sessionKey{"uid:1000", "s10"}); why == "" {
		t.Error("the oldest note within the bound was dropped")
	}
	if why := n.take(sessionKey{"uid:1001", "other"}); why == "" {
		t.Error("another owner's note was dropped")
	}
	// A restart reads no more than the bound either.
	for i := range maxLostPerOwner + 10 {
		b, _ := json.Marshal(lostSession{Version: 1, Owner: "uid:1002", Name: fmt.Sprintf("r%d", i), Why: "x", At: t0.Add(time.Duration(i) * time.Second)})
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("r%d.json", i)), b, 0o600)
	}
	m := newLostNotes(dir, slog.New(slog.DiscardHandler))
	m.load(time.Now())
	if why := m.take(sessionKey{"uid:1002", "r0"}); why != "" {
		t.Errorf("a restart keeps a note past the bound: %q", why)
	}
	if why := m.take(sessionKey{"uid:1002", "r10"}); why == "" {
		t.Error("a restart dropped a note within the bound")
	}
}
