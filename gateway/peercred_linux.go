package gateway

// Caller identity. A local caller is the process at the other end of the
// socket, as the kernel recorded it when that process connected:
// SO_PEERCRED (uid, gid, pid) and SO_PEERGROUPS (its supplementary
// groups), both in the daemon's user namespace. Nothing the client sends
// takes part.
//
// Threat model: a local user may run processes under any uid the kernel
// lets it, and every such uid is a caller of its own unless the daemon
// knows better. A login with subordinate uids (/etc/subuid, see
// subuid.go) runs as up to 65,536 of them, inside its user namespaces or,
// through set-user-ID files it made there, in the host's, and keeps its
// groups while doing so (issue 30, finding 6). attribute counts such a
// uid as its login: per-caller VM and queue shares, the per-uid
// connection bound and the audit flood gate then hold for the login. The
// daemon runs unprivileged and cannot read another user's /proc/PID/ns
// (that takes ptrace access, and the unit's ProtectProc=invisible hides
// other users' processes), so the attribution is by uid, not by user
// namespace: that also covers a subordinate uid in the host's namespace,
// which no namespace check sees.
//
// Rules, in order (attribute):
//  1. A uid with an account is that account, with the groups its process
//     holds (SO_PEERGROUPS), not those the group database lists now.
//  2. A uid in a subordinate range of a login is that login, with the
//     login's account: its uid, primary gid and groups. The uid the
//     process ran as is kept (Identity.SubUID) for logs and reasons.
//     Ranges of root or of the daemon's own user are not folded: their
//     uids are containers that root or the daemon arranged, not root or
//     the daemon, and stay as in rule 3.
//  3. Any other uid is a caller of its own, without an account: match.any
//     takes none of them (policy.Identity.HasAccount).
//
// A peer that cannot be attributed (its range's owner has no account,
// ranges of two logins hold its uid, the ranges cannot be read) is
// refused: fail closed, with an error that names the cause.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/policy"
)

type identityKey struct{}

// maxPeerGroups bounds the supplementary groups of a peer whose names are
// looked up (each a user-database lookup on the accept path). Only root
// grants groups; a peer with more is refused rather than judged by a part
// of its groups, which could skip a profile meant for it.
const maxPeerGroups = 4096

// peerCred is what the kernel recorded of a connecting process, in the
// daemon's user namespace.
type peerCred struct {
	UID, GID uint32
	PID      int32
	Groups   []uint32 // supplementary groups (SO_PEERGROUPS)
}

// readPeerCred reads the peer's SO_PEERCRED and SO_PEERGROUPS.
func readPeerCred(c net.Conn) (peerCred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peerCred{}, errors.New("peer credentials: not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peerCred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var groups []uint32
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if serr == nil {
			groups, serr = peerGroups(int(fd))
		}
	}); err != nil {
		return peerCred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if serr != nil {
		return peerCred{}, fmt.Errorf("peer credentials: %w", serr)
	}
	return peerCred{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid, Groups: groups}, nil
}

// peerGroups reads SO_PEERGROUPS: the supplementary groups the peer held
// when it connected. x/sys/unix has no wrapper that grows its buffer.
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for {
		size := uint32(len(buf) * 4)
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		switch {
		case e == 0:
			return buf[:size/4], nil
		case e == unix.ERANGE && int(size/4) > len(buf) && size/4 <= maxPeerGroups:
			buf = make([]uint32, size/4)
		case e == unix.ERANGE:
			return nil, fmt.Errorf("the process holds %d supplementary groups, more than the %d vmgated resolves", size/4, maxPeerGroups)
		default:
			return nil, os.NewSyscallError("getsockopt SO_PEERGROUPS", e)
		}
	}
}

// account is an entry of the user database.
type account struct {
	UID, GID uint32
	Name     string
}

// accounts is the user database, as attribute reads it.
type accounts interface {
	// byUID returns uid's account; ok is false when it has none (or the
	// lookup failed).
	byUID(uid uint32) (a account, ok bool)
	// byName returns the account named name.
	byName(name string) (a account, ok bool)
	// groupName returns gid's name, or "" when the lookup fails.
	groupName(gid uint32) string
	// groupsOf returns the names of the groups a's account lists, its
	// primary group included.
	groupsOf(a account) []string
}

// attribute returns the caller a process with credentials cred counts as,
// by the rules in this file's comment. ranges returns the subordinate uid
// ranges; it is called only for a uid without an account. daemonUID is
// the daemon's own uid. attribute is pure given db and ranges.
func attribute(cred peerCred, db accounts, ranges func() ([]subRange, error), daemonUID uint32) (policy.Identity, error) {
	if len(cred.Groups) > maxPeerGroups {
		return policy.Identity{}, fmt.Errorf("uid %d holds %d supplementary groups, more than the %d vmgated resolves", cred.UID, len(cred.Groups), maxPeerGroups)
	}
	if a, ok := db.byUID(cred.UID); ok {
		return policy.Identity{UID: cred.UID, GID: cred.GID, PID: cred.PID, User: a.Name,
			Group: db.groupName(cred.GID), Groups: groupNames(db, cred.Groups)}, nil
	}
	rs, err := ranges()
	if err != nil {
		return policy.Identity{}, fmt.Errorf("uid %d has no account, and the subordinate uid ranges that would name its login cannot be read: %w", cred.UID, err)
	}
	owner, found, err := subUIDOwner(cred.UID, rs, db)
	if err != nil {
		return policy.Identity{}, err
	}
	if !found || owner.UID == 0 || owner.UID == daemonUID {
		return policy.Identity{UID: cred.UID, GID: cred.GID, PID: cred.PID,
			Group: db.groupName(cred.GID), Groups: groupNames(db, cred.Groups)}, nil
	}
	if cred.UID == 0 {
		// Identity.SubUID 0 means "not folded": root is never a
		// subordinate uid, and a database without root is not trusted.
		return policy.Identity{}, fmt.Errorf("uid 0 has no account and is in a subordinate range of %s", owner.Name)
	}
	return policy.Identity{UID: owner.UID, GID: owner.GID, PID: cred.PID, User: owner.Name,
		Group: db.groupName(owner.GID), Groups: db.groupsOf(owner), SubUID: cred.UID}, nil
}

// subUIDOwner returns the account of the login whose subordinate ranges
// hold uid; found is false when none does. Ranges of two logins that both
// hold uid, or an owner without an account, are an error: the operator's
// file does not say whose uid it is.
func subUIDOwner(uid uint32, ranges []subRange, db accounts) (owner account, found bool, err error) {
	for _, r := range ranges {
		if !r.contains(uid) {
			continue
		}
		var a account
		var ok bool
		if n, numeric := r.ownerUID(); numeric {
			a, ok = db.byUID(n)
		} else {
			a, ok = db.byName(r.Owner)
		}
		if !ok {
			return account{}, false, fmt.Errorf("uid %d is a subordinate uid of %q (%d-%d), which has no account", uid, r.Owner, r.First, uint64(r.First)+uint64(r.Count)-1)
		}
		if found && a.UID != owner.UID {
			return account{}, false, fmt.Errorf("uid %d is a subordinate uid of both %s and %s: the ranges overlap", uid, owner.Name, a.Name)
		}
		owner, found = a, true
	}
	return owner, found, nil
}

// groupNames returns the names of gids, leaving out those without one.
func groupNames(db accounts, gids []uint32) []string {
	var names []string
	for _, g := range gids {
		if n := db.groupName(g); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// userDB is the system's user database (os/user: NSS with cgo, the files
// without).
type userDB struct{}

func (userDB) byUID(uid uint32) (account, bool) {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return account{}, false
	}
	return accountOf(u)
}

func (userDB) byName(name string) (account, bool) {
	u, err := user.Lookup(name)
	if err != nil {
		return account{}, false
	}
	return accountOf(u)
}

func accountOf(u *user.User) (account, bool) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return account{}, false
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return account{}, false
	}
	return account{UID: uint32(uid), GID: uint32(gid), Name: u.Username}, true
}

func (userDB) groupName(gid uint32) string {
	g, err := user.LookupGroupId(strconv.FormatUint(uint64(gid), 10))
	if err != nil {
		return ""
	}
	return g.Name
}

func (userDB) groupsOf(a account) []string {
	u := &user.User{Uid: strconv.FormatUint(uint64(a.UID), 10), Gid: strconv.FormatUint(uint64(a.GID), 10), Username: a.Name}
	gids, err := u.GroupIds()
	if err != nil {
		return nil
	}
	var names []string
	for _, g := range gids {
		if gr, err := user.LookupGroupId(g); err == nil {
			names = append(names, gr.Name)
		}
	}
	return names
}

// peerResolver attributes connecting processes to callers.
type peerResolver struct {
	db        accounts
	subUIDs   *subUIDFile
	daemonUID uint32
	log       *slog.Logger
}

func newPeerResolver(subUIDPath string, log *slog.Logger) *peerResolver {
	return &peerResolver{db: userDB{}, subUIDs: &subUIDFile{path: subUIDPath}, daemonUID: uint32(os.Getuid()), log: log}
}

// identify returns the caller at the other end of c. cred is what the
// kernel reported, also when err is set (zero if it could not be read).
func (r *peerResolver) identify(c net.Conn) (id policy.Identity, cred peerCred, err error) {
	cred, err = readPeerCred(c)
	if err != nil {
		return policy.Identity{}, cred, err
	}
	id, err = attribute(cred, r.db, r.ranges, r.daemonUID)
	return id, cred, err
}

// callerOf is the uid a peer uid counts as: its login's, for a
// subordinate uid of one (attribute's rules), else itself. The SSH front
// door's unix: listener counts its peers so (sshfront.Config.CallerOf).
func (r *peerResolver) callerOf(uid uint32) (uint32, error) {
	id, err := attribute(peerCred{UID: uid}, r.db, r.ranges, r.daemonUID)
	if err != nil {
		return 0, err
	}
	return id.UID, nil
}

// ranges returns the subordinate uid ranges, logging the file's skipped
// lines once per version of it.
func (r *peerResolver) ranges() ([]subRange, error) {
	rs, problems, fresh, err := r.subUIDs.load()
	if err != nil {
		return nil, fmt.Errorf("subordinate uids: %w", err)
	}
	if fresh {
		r.log.Debug("subordinate uid ranges read", "file", r.subUIDs.path, "ranges", len(rs))
	}
	for _, p := range problems {
		r.log.Warn("subordinate uid file: line skipped, as newuidmap skips it; its uids are callers of their own", "file", r.subUIDs.path, "problem", p)
	}
	return rs, nil
}

// connContext stores the peer identity (or the error reading it) in the
// connection's context. Connections come from uidLimitListener, which
// identified them once.
func connContext(ctx context.Context, c net.Conn) context.Context {
	ic, ok := c.(*identConn)
	if !ok {
		return context.WithValue(ctx, identityKey{}, errors.New("peer identity: connection not accepted by vmgated's listener"))
	}
	return context.WithValue(ctx, identityKey{}, ic.id)
}

func identityFrom(ctx context.Context) (policy.Identity, error) {
	switch v := ctx.Value(identityKey{}).(type) {
	case policy.Identity:
		return v, nil
	case error:
		return policy.Identity{}, v
	}
	return policy.Identity{}, errors.New("no peer identity")
}
