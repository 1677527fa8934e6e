package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/user"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/policy"
)

type identityKey struct{}

// peerIdentity reads the connecting process's credentials from the kernel.
func peerIdentity(c net.Conn) (policy.Identity, error) {
	if ic, ok := c.(*identConn); ok {
		return ic.id, nil
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return policy.Identity{}, errors.New("peer credentials: not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return policy.Identity{}, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return policy.Identity{}, fmt.Errorf("peer credentials: %w", err)
	}
	if serr != nil {
		return policy.Identity{}, fmt.Errorf("peer credentials: %w", serr)
	}
	return lookupIdentity(cred.Uid, cred.Gid, cred.Pid), nil
}

// lookupIdentity adds user and group names; failed lookups leave them empty.
func lookupIdentity(uid, gid uint32, pid int32) policy.Identity {
	id := policy.Identity{UID: uid, GID: gid, PID: pid}
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		id.User = u.Username
		if gids, err := u.GroupIds(); err == nil {
			for _, g := range gids {
				if gr, err := user.LookupGroupId(g); err == nil {
					id.Groups = append(id.Groups, gr.Name)
				}
			}
		}
	}
	if g, err := user.LookupGroupId(strconv.FormatUint(uint64(gid), 10)); err == nil {
		id.Group = g.Name
	}
	return id
}

// connContext stores the peer identity (or the error reading it) in the
// connection's context.
func connContext(ctx context.Context, c net.Conn) context.Context {
	id, err := peerIdentity(c)
	if err != nil {
		return context.WithValue(ctx, identityKey{}, err)
	}
	return context.WithValue(ctx, identityKey{}, id)
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
