package vmexec

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmgate/vmgate/internal/names"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/transfer"
)

// A copy as the command line names it: a local path and a guest path.
type copySpec struct{ local, guest string }

// parsePut splits --put LOCAL:GUEST at its last colon: a guest path holds
// none.
func parsePut(v string) (copySpec, error) {
	i := strings.LastIndexByte(v, ':')
	if i <= 0 || i == len(v)-1 {
		return copySpec{}, fmt.Errorf("--put %q: want LOCAL:GUESTPATH", v)
	}
	return copySpec{local: v[:i], guest: v[i+1:]}, nil
}

// parseGet splits --get GUEST:LOCAL at its first colon.
func parseGet(v string) (copySpec, error) {
	i := strings.IndexByte(v, ':')
	if i <= 0 || i == len(v)-1 {
		return copySpec{}, fmt.Errorf("--get %q: want GUESTPATH:LOCAL", v)
	}
	return copySpec{guest: v[:i], local: v[i+1:]}, nil
}

// guestSide reports whether a cp argument names the guest, as docker cp's
// CONTAINER:PATH does: SESSION:PATH, or :PATH for the --session. The part
// before the colon holds no "/", so ./a:b is local.
func guestSide(arg string) (session, guest string, ok bool) {
	before, after, found := strings.Cut(arg, ":")
	if !found || after == "" || strings.Contains(before, "/") || (before != "" && !names.Session(before)) {
		return "", "", false
	}
	return before, after, true
}

// parseCp recognises `cp SRC DST` with exactly one guest side, and sets
// o's session and copy; it reports false for any other argv (then the
// guest's own cp runs).
func parseCp(o *vmexecOpts) (bool, error) {
	if len(o.argv) != 3 || o.argv[0] != "cp" {
		return false, nil
	}
	s1, g1, in1 := guestSide(o.argv[1])
	s2, g2, in2 := guestSide(o.argv[2])
	if in1 == in2 {
		return false, nil
	}
	session, spec := s2, copySpec{local: o.argv[1], guest: g2}
	if in1 {
		session, spec = s1, copySpec{guest: g1, local: o.argv[2]}
		o.gets = append(o.gets, spec)
	} else {
		o.puts = append(o.puts, spec)
	}
	switch {
	case session != "" && o.session != "" && session != o.session:
		return false, fmt.Errorf("cp: %q names session %q, but --session is %q", o.argv[1:], session, o.session)
	case session == "" && o.session == "":
		return false, errors.New("cp: :PATH needs --session NAME (or write NAME:PATH)")
	case session != "":
		o.session = session
	}
	o.argv = nil
	return true, nil
}

// unlimited: the client packs and extracts within the daemon's limits,
// which it does not know; the daemon enforces them.
var unlimited = transfer.Limits{MaxBytes: math.MaxInt64, MaxFiles: math.MaxInt}

// lazyPack packs a local tree into a pipe once the first byte is read:
// nothing is read from disk for a request the daemon refuses.
type lazyPack struct {
	src     string
	started bool
	r       *io.PipeReader
}

func (l *lazyPack) Read(p []byte) (int, error) {
	if !l.started {
		l.started = true
		pr, pw := io.Pipe()
		l.r = pr
		go func() {
			_, err := transfer.Pack(pw, l.src, transfer.Rules{Dir: transfer.IntoGuest, Limits: unlimited})
			pw.CloseWithError(err)
		}()
	}
	return l.r.Read(p)
}

// addTransfers fills in req's puts and gets and sio's streams from the
// command line, checking the local side first: a source that cannot be
// read, or a destination whose directory is missing, stops vm-exec before
// it asks for a VM.
func addTransfers(o *vmexecOpts, req *wire.ExecRequest, sio *client.ExecIO) error {
	for _, p := range o.puts {
		sum, err := transfer.Measure(p.local, transfer.Rules{Dir: transfer.IntoGuest, Limits: unlimited})
		if err != nil {
			return fmt.Errorf("--put %s: %w", p.local, err)
		}
		abs, _ := filepath.Abs(p.local)
		req.Put = append(req.Put, wire.PutSpec{Guest: p.guest, Top: sum.Top, Files: sum.Files, Bytes: sum.Bytes, Local: abs})
		sio.Puts = append(sio.Puts, &lazyPack{src: p.local})
	}
	for _, g := range o.gets {
		top := wire.GetTop(g.guest)
		if top == "" {
			return fmt.Errorf("--get %s: names no file or directory to copy", g.guest)
		}
		parent, name, err := transfer.Resolve(g.local, top)
		if err != nil {
			return fmt.Errorf("--get %s: %w", g.guest, err)
		}
		abs, _ := filepath.Abs(filepath.Join(parent, name))
		req.Get = append(req.Get, wire.GetSpec{Guest: g.guest, Local: abs})
		sio.Gets = append(sio.Gets, func(r io.Reader) error {
			_, err := transfer.Extract(r, parent, name, transfer.Rules{Dir: transfer.FromGuest, Limits: unlimited, Top: top})
			return err
		})
	}
	return nil
}

// reportTransfers prints each failed transfer and returns the exit code
// after them: the command's, or ExitTransfer when the command succeeded
// (or there was none) and a transfer failed.
func reportTransfers(res *wire.Result, code int) int {
	failed := false
	for _, t := range res.Transfers {
		if t.Error != "" {
			fmt.Fprintf(os.Stderr, "vm-exec: %s %s: %s\n", t.Direction, t.Guest, t.Error)
			failed = true
		}
	}
	if failed && code == 0 {
		return wire.ExitTransfer
	}
	return code
}
