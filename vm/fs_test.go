package vm

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// fsAgent is a fake agent whose commands all end with stdout, stderr and
// status; seen receives each command's spec.
func fsAgent(stdout, stderr string, status uint32, seen chan<- agentproto.ExecSpec) hostileAgent {
	return answering(fakeAnswers{open: func(o agentproto.Open) ([]byte, []byte, uint32) {
		if seen != nil {
			seen <- o.Spec
		}
		return []byte(stdout), []byte(stderr), status
	}})
}

// TestFSExitCodes: each FSExit code is its kind; the guest's message is
// kept without its prefix; a status outside the table is ErrFSFailed.
func TestFSExitCodes(t *testing.T) {
	for status, want := range map[uint32]error{
		agentproto.FSExitFailed:      ErrFSFailed,
		agentproto.FSExitUsage:       ErrFSFailed,
		agentproto.FSExitNotFound:    ErrFileNotFound,
		agentproto.FSExitExists:      ErrFileExists,
		agentproto.FSExitDenied:      ErrPermission,
		agentproto.FSExitNotDir:      ErrNotDir,
		agentproto.FSExitIsDir:       ErrIsDir,
		agentproto.FSExitTooBig:      ErrTooBig,
		agentproto.ExitNotExecutable: ErrFSFailed,
	} {
		v := fakeVM(t, fsAgent("", "vmgate-agent fs rm: /x: why\nsecond line", status, nil))
		err := v.FSRemove(context.Background(), FSCaller{}, "/x", false)
		var fe *FSError
		if !errors.Is(err, want) || !errors.As(err, &fe) || fe.Msg != "/x: why" || fe.Status != int(status) || fe.Op != agentproto.FSRemove {
			t.Errorf("exit %d: %v (%+v), want %v", status, err, fe, want)
		}
	}
}

// TestFSCommands: each method runs the fs subcommand as FSArgv builds it,
// as the caller's user in its directory.
func TestFSCommands(t *testing.T) {
	ctx := context.Background()
	as := FSCaller{User: "builder", Dir: "/work"}
	for name, tc := range map[string]struct {
		call func(v *VM) error
		argv []string
	}{
		"mkdir": {func(v *VM) error { return v.FSMkdir(ctx, as, "a/b", true) }, agentproto.FSArgv(agentproto.FSMkdir, agentproto.FSOptions{Parents: true}, "a/b")},
		"mv":    {func(v *VM) error { return v.FSMove(ctx, as, "a", "b") }, agentproto.FSArgv(agentproto.FSMove, agentproto.FSOptions{}, "a", "b")},
		"rm":    {func(v *VM) error { return v.FSRemove(ctx, as, "a", true) }, agentproto.FSArgv(agentproto.FSRemove, agentproto.FSOptions{Recursive: true}, "a")},
		"write": {func(v *VM) error {
			_, err := v.FSWrite(ctx, as, "f", 0o600, 10, strings.NewReader("data"))
			return err
		}, agentproto.FSArgv(agentproto.FSWrite, agentproto.FSOptions{Max: 10, Mode: 0o600}, "f")},
	} {
		t.Run(name, func(t *testing.T) {
			seen := make(chan agentproto.ExecSpec, 1)
			v := fakeVM(t, fsAgent("", "", 0, seen))
			if err := tc.call(v); err != nil {
				t.Fatal(err)
			}
			spec := <-seen
			if !slices.Equal(spec.Argv, tc.argv) || spec.User != as.User || spec.Dir != as.Dir {
				t.Errorf("ran %+v, want argv %q as %+v", spec, tc.argv, as)
			}
		})
	}
}

// TestFSReplies: what the guest answers is checked: JSON within its
// bound, entries of known types, no more than asked, a read no longer
// than its bound.
func TestFSReplies(t *testing.T) {
	ctx := context.Background()
	entry := `{"path":"/x","name":"x","type":"file","size":3,"mode":420}`
	if e, err := fakeVM(t, fsAgent(entry, "", 0, nil)).FSStat(ctx, FSCaller{}, "/x"); err != nil || e.Size != 3 || e.Mode != 0o644 {
		t.Errorf("stat: %+v, %v", e, err)
	}
	for name, tc := range map[string]struct {
		stdout string
		call   func(v *VM) error
		want   error
	}{
		"not JSON": {"{", func(v *VM) error { _, err := v.FSStat(ctx, FSCaller{}, "/x"); return err }, ErrBadReply},
		"an unknown type": {`{"path":"/x","name":"x","type":"socket"}`, func(v *VM) error {
			_, err := v.FSStat(ctx, FSCaller{}, "/x")
			return err
		}, ErrBadReply},
		"a stat past its bound": {`{"path":"` + strings.Repeat("x", maxEntryJSON) + `"}`, func(v *VM) error {
			_, err := v.FSStat(ctx, FSCaller{}, "/x")
			return err
		}, ErrTooBig},
		"more entries than asked": {`{"entries":[` + entry + "," + entry + `]}`, func(v *VM) error {
			_, err := v.FSList(ctx, FSCaller{}, "/", 1, 1)
			return err
		}, ErrBadReply},
		"a read past its bound": {"12345", func(v *VM) error {
			var b bytes.Buffer
			n, err := v.FSRead(ctx, FSCaller{}, "/x", 4, &b)
			if b.Len() > 4 || n > 4 {
				return errors.New("more than the bound reached the writer")
			}
			return err
		}, ErrTooBig},
	} {
		t.Run(name, func(t *testing.T) {
			if err := tc.call(fakeVM(t, fsAgent(tc.stdout, "", 0, nil))); !errors.Is(err, tc.want) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
	var b bytes.Buffer
	if n, err := fakeVM(t, fsAgent("1234", "", 0, nil)).FSRead(ctx, FSCaller{}, "/x", 4, &b); err != nil || n != 4 || b.String() != "1234" {
		t.Errorf("a read of its bound: %d %q %v", n, b.String(), err)
	}
	l, err := fakeVM(t, fsAgent(`{"entries":[`+entry+`],"truncated":true}`, "", 0, nil)).FSList(ctx, FSCaller{}, "/", 2, 1)
	if err != nil || len(l.Entries) != 1 || !l.Truncated {
		t.Errorf("ls: %+v, %v", l, err)
	}
	v := fakeVM(t, fsAgent("", "", 0, nil))
	for name, err := range map[string]error{
		"an empty path": v.FSMkdir(ctx, FSCaller{}, "", false),
		"depth 0":       func() error { _, err := v.FSList(ctx, FSCaller{}, "/", 0, 1); return err }(),
		"read unbound":  func() error { _, err := v.FSRead(ctx, FSCaller{}, "/x", 0, &b); return err }(),
		"a bad mode":    func() error { _, err := v.FSWrite(ctx, FSCaller{}, "/x", 0o10000, 1, nil); return err }(),
	} {
		if err == nil {
			t.Errorf("%s: taken", name)
		}
	}
}
