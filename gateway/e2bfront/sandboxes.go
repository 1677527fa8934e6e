package e2bfront

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/internal/durable"
)

// A sandbox is a session of the daemon's, named by the sandbox's id, that
// the door made for a key. The door keeps what E2B's API has and the
// session does not: the access token, the template, the metadata, the
// environment of its processes and its deadline. The records are written
// whole to one file (mode 0600) at each change, so a paused sandbox can
// be resumed after the daemon's restart.

// sandboxRecord is what the door keeps of a sandbox.
type sandboxRecord struct {
	ID string `json:"id"`
	// Key is the fingerprint of the key that made it, Profile that key's
	// profile then: only that key reaches it.
	Key     string `json:"key"`
	Profile string `json:"profile"`
	// Template is the templateID it was created with; Image the image
	// the daemon was asked for ("" for the profile's own).
	Template string `json:"template"`
	Image    string `json:"image,omitempty"`
	// Token is its access token (X-Access-Token).
	Token     string            `json:"token"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	StartedAt time.Time         `json:"started_at"`
	EndAt     time.Time         `json:"end_at"`
	AutoPause bool              `json:"auto_pause,omitempty"`
	// AllowOut is the network it was narrowed to, when it was.
	AllowOut *[]string `json:"allow_out,omitempty"`
}

type sandbox struct {
	sandboxRecord
	timer   *time.Timer
	streams int
}

// sandboxes is the door's table of sandboxes.
type sandboxes struct {
	mu   sync.Mutex
	path string
	log  *slog.Logger
	m    map[string]*sandbox
	// expire is called when a sandbox's deadline passes.
	expire func(id string)
}

type sandboxFile struct {
	Version   int             `json:"version"`
	Sandboxes []sandboxRecord `json:"sandboxes"`
}

const sandboxFileVersion = 1

func loadSandboxes(path string, log *slog.Logger) (*sandboxes, error) {
	x := &sandboxes{path: path, log: log, m: map[string]*sandbox{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return x, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sandboxes: %w", err)
	}
	var f sandboxFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("sandboxes: %s: %w", path, err)
	}
	if f.Version != sandboxFileVersion {
		return nil, fmt.Errorf("sandboxes: %s: version %d, want %d", path, f.Version, sandboxFileVersion)
	}
	for _, r := range f.Sandboxes {
		x.m[r.ID] = &sandbox{sandboxRecord: r}
	}
	return x, nil
}

// saveLocked writes the table; x.mu is held.
func (x *sandboxes) saveLocked() {
	f := sandboxFile{Version: sandboxFileVersion, Sandboxes: []sandboxRecord{}}
	for _, id := range slices.Sorted(maps.Keys(x.m)) {
		f.Sandboxes = append(f.Sandboxes, x.m[id].sandboxRecord)
	}
	data, err := json.MarshalIndent(f, "", "\t")
	if err == nil {
		err = durable.WriteFile(x.path, append(data, '\n'), 0o600)
	}
	if err != nil {
		// The sandboxes go on; only a restart would lose track of them
		// (their sessions stay the daemon's, and are listed by vm-exec).
		x.log.Error("cannot save the e2b sandboxes", "file", x.path, "err", err)
	}
}

func (x *sandboxes) count() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.m)
}

// newSandboxID returns a new sandbox id: a session name.
func newSandboxID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "sbx-" + hex.EncodeToString(b[:])
}

// newToken returns a new access token: 256 bits.
func newToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// add records r and arms its deadline.
func (x *sandboxes) add(r sandboxRecord) {
	x.mu.Lock()
	defer x.mu.Unlock()
	sb := &sandbox{sandboxRecord: r}
	x.m[r.ID] = sb
	x.armLocked(sb)
	x.saveLocked()
}

// armLocked (re)starts sb's deadline timer.
func (x *sandboxes) armLocked(sb *sandbox) {
	if sb.timer != nil {
		sb.timer.Stop()
	}
	if x.expire == nil {
		return
	}
	id := sb.ID
	sb.timer = time.AfterFunc(time.Until(sb.EndAt), func() { x.expire(id) })
}

// get returns a copy of the record of id if key owns it.
func (x *sandboxes) get(id, key string) (sandboxRecord, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	sb, ok := x.m[id]
	if !ok || sb.Key != key {
		return sandboxRecord{}, false
	}
	return sb.sandboxRecord, true
}

// byToken returns the record of id if token is its access token,
// compared in constant time.
func (x *sandboxes) byToken(id, token string) (sandboxRecord, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	sb, ok := x.m[id]
	if !ok || subtle.ConstantTimeCompare([]byte(sb.Token), []byte(token)) != 1 {
		return sandboxRecord{}, false
	}
	return sb.sandboxRecord, true
}

// list returns copies of key's records, by start time.
func (x *sandboxes) list(key string) []sandboxRecord {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []sandboxRecord
	for _, sb := range x.m {
		if sb.Key == key {
			out = append(out, sb.sandboxRecord)
		}
	}
	slices.SortFunc(out, func(a, b sandboxRecord) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// setEnd moves id's deadline.
func (x *sandboxes) setEnd(id string, end time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if sb, ok := x.m[id]; ok {
		sb.EndAt = end
		x.armLocked(sb)
		x.saveLocked()
	}
}

// remove forgets id.
func (x *sandboxes) remove(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if sb, ok := x.m[id]; ok {
		if sb.timer != nil {
			sb.timer.Stop()
		}
		delete(x.m, id)
		x.saveLocked()
	}
}

// openStream counts one more stream of id, refusing one over max.
func (x *sandboxes) openStream(id string, max int) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	sb, ok := x.m[id]
	if !ok || sb.streams >= max {
		return false
	}
	sb.streams++
	return true
}

func (x *sandboxes) closeStream(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if sb, ok := x.m[id]; ok && sb.streams > 0 {
		sb.streams--
	}
}

// startTimers arms every deadline (at Serve: a deadline that passed
// while the daemon was down fires at once).
func (f *Front) startTimersOf(x *sandboxes) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.expire = f.expire
	for _, sb := range x.m {
		x.armLocked(sb)
	}
}

func (x *sandboxes) startTimers(f *Front) { f.startTimersOf(x) }

func (x *sandboxes) stopTimers() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.expire = nil
	for _, sb := range x.m {
		if sb.timer != nil {
			sb.timer.Stop()
			sb.timer = nil
		}
	}
}

// peek returns the record of id, for a check of its own (a signed URL).
func (x *sandboxes) peek(id string) (sandboxRecord, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	sb, ok := x.m[id]
	if !ok {
		return sandboxRecord{}, false
	}
	return sb.sandboxRecord, true
}

func constantEq(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
