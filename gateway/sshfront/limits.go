package sshfront

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// Connection budgets of the front door (issue #30, finding 9).
//
// Threat: anyone who can reach a listener (every local process on a
// loopback port; the socket's group on a unix: listener) can open
// connections without a key, and each one holds a file descriptor, a
// goroutine and a handshake's memory until it finishes or times out. With
// one budget for every connection, a process that opened them all and
// sent nothing kept every key holder out. So:
//
//   - Connections that have not been admitted (handshake and
//     authentication not yet done, or authenticated but over a limit
//     below) have a budget of their own, maxPre, apart from the
//     authenticated ones, and a deadline from accept (HandshakeTimeout).
//     When it is full a new connection is not refused: it displaces the
//     oldest pending connection of the peer that holds the most of them
//     (pickVictim). Holding connections open therefore keeps nobody out;
//     only opening them faster than a client completes its handshake can
//     delay new logins. The group is the peer's uid wherever the kernel
//     tells it: SO_PEERCRED on a unix: listener, and on loopback TCP the
//     owner of the client's socket (tcpowner.go); a subordinate uid counts
//     as its login (Config.CallerOf). A uid's flood then displaces its own
//     connections first and delays only its own logins. Over TCP from
//     another host, or when the client's socket is gone, the group is the
//     remote IP, which does not tell local processes apart (any of them
//     may bind a source address in 127.0.0.0/8). Authenticated
//     connections are never displaced.
//   - Authenticated connections are bounded in all (maxAuthed) and per key
//     (perKey), so that one key cannot hold the front door for the others.
//   - On a unix: listener the peer's uid (SO_PEERCRED; its login's for a
//     subordinate uid) is bounded too (perUID), authenticated or not,
//     whoever it is: vmgated's own uid and root get no exemption, as no
//     process needs more than its share.
//
// Refusals are logged once per burst (burstLog), not once per connection:
// a log flood is a denial of service too.

// limit names a bound a connection met.
type limit int

const (
	limitNone    limit = iota
	limitUID           // perUID: closed at accept, before SSH
	limitPending       // maxPre: the connection was displaced
	limitConns         // maxAuthed: its sessions are refused
	limitKey           // perKey: its sessions are refused
)

// peer is where a connection comes from, as far as the front door can
// tell.
type peer struct {
	// group is the eviction group: "uid N" when the peer's uid is known,
	// else the remote IP.
	group string
	// uid is the caller's uid, when known (hasUID): the uid the peer ran
	// as (ranAs), or the login Config.CallerOf counts it as.
	uid, ranAs uint32
	hasUID     bool
	// capped counts the connection against perUID: a unix: connection.
	capped bool
}

// tracked is one connection in the budget.
type tracked struct {
	peer   peer
	closer io.Closer // closes a displaced connection
	state  connPhase
	key    string // the key's fingerprint, once admitted
}

type connPhase int

const (
	phasePending connPhase = iota
	phaseAdmitted
	phaseGone
)

// budget counts the front door's connections against its limits. It
// decides; the caller closes what it displaces and logs.
type budget struct {
	maxPre, maxAuthed, perKey, perUID int

	mu      sync.Mutex
	pending []*tracked // not admitted, oldest first
	authed  int
	keys    map[string]int // admitted connections per key fingerprint
	uids    map[uint32]int // connections per peer uid, any phase
}

func newBudget(maxPre, maxAuthed, perKey, perUID int) *budget {
	return &budget{maxPre: maxPre, maxAuthed: maxAuthed, perKey: perKey, perUID: perUID,
		keys: map[string]int{}, uids: map[uint32]int{}}
}

// open counts a new connection as pending. It returns the connection's
// entry, or limitUID when its uid has perUID connections already; and
// the pending connection it displaces to make room, if any, which the
// caller closes.
func (b *budget) open(p peer, c io.Closer) (t, displaced *tracked, l limit) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p.capped && b.uids[p.uid] >= b.perUID {
		return nil, nil, limitUID
	}
	t = &tracked{peer: p, closer: c}
	if len(b.pending) >= b.maxPre {
		i := pickVictim(b.pending, p.group)
		displaced = b.pending[i]
		b.pending = append(b.pending[:i], b.pending[i+1:]...)
		b.dropLocked(displaced)
	}
	b.pending = append(b.pending, t)
	if p.capped {
		b.uids[p.uid]++
	}
	return t, displaced, limitNone
}

// pickVictim is the index of the pending connection to displace for a
// new one of group: the oldest of the group with the most pending
// connections, the new one counted. A peer that floods thus displaces
// its own connections before anyone else's, and among equals the one
// waiting longest goes.
//
// Precondition: pending is not empty.
func pickVictim(pending []*tracked, group string) int {
	n := map[string]int{group: 1}
	most := 1
	for _, t := range pending {
		n[t.peer.group]++
		most = max(most, n[t.peer.group])
	}
	for i, t := range pending {
		if n[t.peer.group] == most {
			return i
		}
	}
	return 0 // not reached: a pending group has the most, or the new one's, which then has a pending connection
}

// admit moves an authenticated connection from pending to admitted for
// key. On limitConns or limitKey it stays pending (so it is still
// bounded, displaceable and under its deadline) for the caller to refuse;
// a displaced or closed connection gets limitPending.
func (b *budget) admit(t *tracked, key string) limit {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case t.state != phasePending:
		return limitPending
	case b.authed >= b.maxAuthed:
		return limitConns
	case b.keys[key] >= b.perKey:
		return limitKey
	}
	b.removePendingLocked(t)
	t.state, t.key = phaseAdmitted, key
	b.authed++
	b.keys[key]++
	return limitNone
}

// done forgets a connection that ended; it may be called more than once.
func (b *budget) done(t *tracked) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.state == phasePending {
		b.removePendingLocked(t)
	}
	b.dropLocked(t)
}

// dropLocked takes t out of the counts (not out of pending).
func (b *budget) dropLocked(t *tracked) {
	switch t.state {
	case phaseGone:
		return
	case phaseAdmitted:
		b.authed--
		if b.keys[t.key]--; b.keys[t.key] <= 0 {
			delete(b.keys, t.key)
		}
	}
	if t.peer.capped {
		if b.uids[t.peer.uid]--; b.uids[t.peer.uid] <= 0 {
			delete(b.uids, t.peer.uid)
		}
	}
	t.state = phaseGone
}

func (b *budget) removePendingLocked(t *tracked) {
	for i, x := range b.pending {
		if x == t {
			b.pending = append(b.pending[:i], b.pending[i+1:]...)
			return
		}
	}
}

// refusalMessage is what a client over limitConns or limitKey reads in
// the rejection of its session.
func (b *budget) refusalMessage(l limit, key string) string {
	switch l {
	case limitConns:
		return fmt.Sprintf("vmgated serves at most %d SSH connections at once and all are in use; try again when one ends", b.maxAuthed)
	case limitKey:
		return fmt.Sprintf("key %s has %d SSH connections open, the most one key may; close one and try again", key, b.perKey)
	}
	return ""
}

// burstLog logs a refusal at most once per every for each key (a limit,
// or a limit and who met it), and counts the ones it did not log; the
// next line it logs carries that count. It forgets quiet keys, so that
// its memory stays bounded whatever the peers.
type burstLog struct {
	logger *slog.Logger
	every  time.Duration
	now    func() time.Time

	mu   sync.Mutex
	seen map[string]*burst
}

type burst struct {
	logged time.Time
	missed int
}

// maxBurstKeys is the number of keys above which quiet ones are
// forgotten.
const maxBurstKeys = 1024

func newBurstLog(log *slog.Logger, every time.Duration) *burstLog {
	return &burstLog{logger: log, every: every, now: time.Now, seen: map[string]*burst{}}
}

// warn logs msg with args at Warn for key, unless it logged key less than
// every ago. It reports whether it logged.
func (b *burstLog) warn(key, msg string, args ...any) bool {
	return b.log(slog.LevelWarn, key, msg, args...)
}

// log is warn at level.
func (b *burstLog) log(level slog.Level, key, msg string, args ...any) bool {
	b.mu.Lock()
	now := b.now()
	st := b.seen[key]
	if st != nil && now.Sub(st.logged) < b.every {
		st.missed++
		b.mu.Unlock()
		return false
	}
	missed := 0
	if st == nil {
		if len(b.seen) >= maxBurstKeys {
			for k, s := range b.seen {
				if now.Sub(s.logged) >= b.every {
					delete(b.seen, k)
				}
			}
		}
		st = &burst{}
		b.seen[key] = st
	} else {
		missed = st.missed
	}
	st.logged, st.missed = now, 0
	b.mu.Unlock()
	b.logger.Log(context.Background(), level, msg, append(args, "not_logged_since_last", missed, "next_log_after", b.every.String())...)
	return true
}
