package vm

import (
	"context"
	"encoding"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/signum"
)

// Background processes in the guest (agentproto's proc calls): thin
// wrappers that bound each call, and check each reply as the word of a
// possibly hostile guest. The table is the guest agent's; the host keeps
// handles only as names (DESIGN.md, round four).
//
// A caller that gives up (its ctx ends) gets its answer at once, and the
// call itself goes on, within its own limit, in the background: a client
// that stops following a process's output must not cost the VM. Only an
// agent that does not answer within the limit loses its connection (and
// the VM), as with every call.

// Refusals of the proc calls (agentproto's ProcErr codes).
var (
	// ErrNoProcess: the guest's table has no process with the handle.
	ErrNoProcess = errors.New("no such background process")
	// ErrProcLimit: as many background processes run as the start
	// allowed (ProcStart.MaxProcs).
	ErrProcLimit = errors.New("too many background processes")
	// ErrProcEnded: the process has ended, or its input is closed.
	ErrProcEnded = errors.New("background process has ended")
	// ErrProcBusy: the process has not read the input sent before.
	ErrProcBusy = errors.New("background process is not reading its input")
)

// Bounds the host holds a guest's answers to.
const (
	// maxListed bounds the processes of a whole list: MaxProcs running
	// and the ended ones the agent keeps (twice as many).
	maxListed = 3 * agentproto.MaxProcs
	// maxGuestText bounds a guest's refusal text passed on in an error.
	maxGuestText = 200
)

// Features asks the agent what it can do beyond running commands
// (agentproto.Info.Features: FeatureTransfer, FeatureProcs, FeatureUsers,
// FeatureFS). An agent built before a feature does not list it: its
// image must be rebuilt for it.
func (v *VM) Features(ctx context.Context) ([]string, error) {
	info, err := v.Info(ctx)
	if err != nil {
		return nil, err
	}
	return info.Features, nil
}

// Has reports whether the VM's agent has feature (see Features).
func (v *VM) Has(ctx context.Context, feature string) (bool, error) {
	f, err := v.Features(ctx)
	if err != nil {
		return false, err
	}
	return slices.Contains(f, feature), nil
}

// procCall makes a proc call with limit, decoding its result into a new
// value that it returns only when the call succeeded: when ctx ends
// first, the call goes on in the background (see above) and its late
// result is dropped.
func procCall[T any, PT interface {
	*T
	encoding.BinaryUnmarshaler
}](ctx context.Context, v *VM, op string, args encoding.BinaryMarshaler, limit time.Duration) (*T, error) {
	type answer struct {
		res *T
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res := new(T)
		err := v.call(context.WithoutCancel(ctx), op, args, PT(res), limit)
		done <- answer{res, err}
	}()
	select {
	case a := <-done:
		if a.err != nil {
			return nil, procError(op, a.err)
		}
		return a.res, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w", op, ctx.Err())
	}
}

// procError maps a proc call's refusal to the package's errors.
func procError(op string, err error) error {
	var ce *agentconn.CallError
	if !errors.As(err, &ce) {
		return fmt.Errorf("%s: %w", op, err)
	}
	code, detail := agentproto.ProcErrorCode(ce.Msg)
	detail = guestText(detail)
	kind := map[string]error{
		agentproto.ProcErrNoHandle: ErrNoProcess, agentproto.ProcErrLimit: ErrProcLimit,
		agentproto.ProcErrEnded: ErrProcEnded, agentproto.ProcErrBusy: ErrProcBusy,
	}[code]
	if kind == nil {
		return fmt.Errorf("%s: the agent refused: %s", op, detail)
	}
	return fmt.Errorf("%s: %w: %s", op, kind, detail)
}

// guestText is a guest's text made fit for an error: one line, at most
// maxGuestText bytes.
func guestText(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > maxGuestText {
		s = strings.ToValidUTF8(s[:maxGuestText], "") + "…"
	}
	return s
}

// ProcStart starts a background process (agentproto.ProcStart) and
// returns it as the agent entered it: running, or already ended when it
// could not start (126 or 127, the reason on its stderr, as a command).
// A start past the request's MaxProcs running processes is ErrProcLimit.
//
// Precondition: the agent has FeatureProcs (Has); an older one refuses
// the call.
func (v *VM) ProcStart(ctx context.Context, req agentproto.ProcStart) (*agentproto.ProcInfo, error) {
	const op = "proc start"
	if err := checkProcStart(req); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	pi, err := procCall[agentproto.ProcInfo](ctx, v, agentproto.CallProcStart, req, v.controlLimit())
	if err != nil {
		return nil, err
	}
	if err := checkProcInfo(*pi, 0); err != nil {
		return nil, v.hostileReply(op, err)
	}
	return pi, nil
}

// checkProcStart checks a start before it goes to the guest.
func checkProcStart(req agentproto.ProcStart) error {
	switch {
	case len(req.Spec.Argv) == 0 || req.Spec.Argv[0] == "":
		return errors.New("empty argv")
	case req.TimeoutMS < 0 || req.BufferBytes < 0 || req.BufferBytes > agentproto.MaxProcBuffer || req.MaxProcs < 0:
		return fmt.Errorf("timeout %d ms, buffer %d bytes (at most %d), max procs %d", req.TimeoutMS, req.BufferBytes, agentproto.MaxProcBuffer, req.MaxProcs)
	case len(req.Spec.Dir) > agentproto.MaxProcDir || len(req.Spec.User) > agentproto.MaxUserName:
		return errors.New("dir or user too long")
	}
	for _, s := range slices.Concat(req.Spec.Argv, req.Spec.Env, []string{req.Spec.Dir, req.Spec.User}) {
		if strings.IndexByte(s, 0) >= 0 {
			return errors.New("argument or environment contains a NUL byte")
		}
	}
	return nil
}

// ProcList returns every process of the guest's table, oldest first,
// asking page after page.
func (v *VM) ProcList(ctx context.Context) ([]agentproto.ProcInfo, error) {
	const op = "proc list"
	var all []agentproto.ProcInfo
	var q agentproto.ProcListQuery
	for {
		l, err := procCall[agentproto.ProcList](ctx, v, agentproto.CallProcList, q, v.controlLimit())
		if err != nil {
			return nil, err
		}
		if err := checkProcPage(*l, q.After, len(all)); err != nil {
			return nil, v.hostileReply(op, err)
		}
		all = append(all, l.Procs...)
		if !l.More {
			return all, nil
		}
		q.After = l.Procs[len(l.Procs)-1].Handle
	}
}

// checkProcPage checks a page of a list that has had seen processes
// before it, all with handles up to after.
func checkProcPage(l agentproto.ProcList, after int64, seen int) error {
	if l.More && len(l.Procs) == 0 {
		return errors.New("an empty page with more to come")
	}
	if seen+len(l.Procs) > maxListed {
		return fmt.Errorf("more than %d processes", maxListed)
	}
	last := after
	for _, pi := range l.Procs {
		if pi.Handle <= last {
			return fmt.Errorf("handle %d after %d", pi.Handle, last)
		}
		if err := checkProcInfo(pi, 0); err != nil {
			return err
		}
		last = pi.Handle
	}
	return nil
}

// ProcLogs asks for a process's output (agentproto.ProcLogs): at most
// req.Max bytes (MaxLogsChunk if more) from req.Since on, waiting up to
// req.WaitMS (at most MaxLogsWait) for some, or for the process's end.
// The reply is checked: chunks in order, within the bounds asked, and
// offsets that agree with each other and with the process's counts.
func (v *VM) ProcLogs(ctx context.Context, req agentproto.ProcLogs) (*agentproto.ProcOutput, error) {
	const op = "proc logs"
	if req.Since < 0 || req.Max < 0 || req.WaitMS < 0 || req.WaitMS > agentproto.MaxLogsWait {
		return nil, fmt.Errorf("%s: since %d, max %d, wait %d ms (at most %d)", op, req.Since, req.Max, req.WaitMS, agentproto.MaxLogsWait)
	}
	limit := v.controlLimit() + time.Duration(req.WaitMS)*time.Millisecond
	out, err := procCall[agentproto.ProcOutput](ctx, v, agentproto.CallProcLogs, req, limit)
	if err != nil {
		return nil, err
	}
	if err := checkProcOutput(*out, req); err != nil {
		return nil, v.hostileReply(op, err)
	}
	return out, nil
}

// checkProcOutput checks a ProcOutput against what was asked.
func checkProcOutput(out agentproto.ProcOutput, req agentproto.ProcLogs) error {
	if err := checkProcInfo(out.Info, req.Handle); err != nil {
		return err
	}
	budget := min(req.Max, agentproto.MaxLogsChunk)
	switch {
	case len(out.Chunks) > agentproto.MaxLogsChunks:
		return fmt.Errorf("%d chunks, at most %d", len(out.Chunks), agentproto.MaxLogsChunks)
	case out.Dropped < 0:
		return fmt.Errorf("%d bytes dropped", out.Dropped)
	}
	at := req.Since + out.Dropped
	var n int64
	for i, c := range out.Chunks {
		switch {
		case c.Stream != agentproto.StreamStdout && c.Stream != agentproto.StreamStderr:
			return fmt.Errorf("chunk %d of stream %d", i, c.Stream)
		case len(c.Data) == 0:
			return fmt.Errorf("chunk %d is empty", i)
		case i == 0 && c.Offset != at:
			return fmt.Errorf("the first chunk at %d, not %d (since %d, %d dropped)", c.Offset, at, req.Since, out.Dropped)
		case c.Offset < at:
			return fmt.Errorf("chunk %d at %d overlaps the one before, which ends at %d", i, c.Offset, at)
		}
		n += int64(len(c.Data))
		if n > budget {
			return fmt.Errorf("more than the %d bytes asked", budget)
		}
		at = c.Offset + int64(len(c.Data))
	}
	if out.Next != at || out.Next > out.Info.Next {
		return fmt.Errorf("next %d, where the chunks end at %d and the output at %d", out.Next, at, out.Info.Next)
	}
	return nil
}

// checkProcInfo checks a process as the guest describes it; handle, when
// not 0, is the one asked about.
func checkProcInfo(pi agentproto.ProcInfo, handle int64) error {
	argv := 0
	for _, a := range pi.Argv {
		argv += 4 + len(a)
	}
	switch {
	case pi.Handle <= 0 || (handle != 0 && pi.Handle != handle):
		return fmt.Errorf("handle %d, asked %d", pi.Handle, handle)
	case pi.PID < 0:
		return fmt.Errorf("pid %d", pi.PID)
	case argv > agentproto.MaxInfoArgv || len(pi.User) > agentproto.MaxUserName || len(pi.Dir) > agentproto.MaxProcDir:
		return errors.New("argv, user or dir past its bound")
	case pi.State != agentproto.ProcRunning && pi.State != agentproto.ProcExited:
		return fmt.Errorf("state %.20q", pi.State)
	case (pi.State == agentproto.ProcExited) != (pi.Exit != nil):
		return fmt.Errorf("state %s with exit %v", pi.State, pi.Exit)
	case pi.Exit != nil && pi.Exit.Signal != "" && pi.Exit.Status != 0:
		return fmt.Errorf("exit %+v", *pi.Exit)
	case pi.Out < 0 || pi.Err < 0 || pi.OutDropped < 0 || pi.ErrDropped < 0 || pi.OutDropped > pi.Out || pi.ErrDropped > pi.Err:
		return fmt.Errorf("out %d (%d dropped), err %d (%d dropped)", pi.Out, pi.OutDropped, pi.Err, pi.ErrDropped)
	case pi.Next != pi.Out+pi.Err:
		return fmt.Errorf("next %d, but %d and %d bytes written", pi.Next, pi.Out, pi.Err)
	}
	return nil
}

// noResult is the result of a call that has none.
type noResult struct{}

func (*noResult) UnmarshalBinary(p []byte) error {
	if len(p) > 0 {
		return fmt.Errorf("a result of %d bytes where there is none", len(p))
	}
	return nil
}

// hostileReply is a reply the guest should never send: the VM's agent is
// not to be believed any more, and the error says so.
func (v *VM) hostileReply(op string, err error) error {
	v.log.Warn("the guest agent's reply breaks its contract", "op", op, "err", err)
	return fmt.Errorf("%s: %w: %w", op, ErrBadReply, err)
}

// ErrBadReply reports a reply of the guest agent that breaks the
// protocol's contract (an offset out of order, a count past a bound):
// the guest is broken or hostile.
var ErrBadReply = errors.New("the guest agent's reply breaks the contract")

// ProcInput writes data (at most agentproto.MaxInputChunk bytes) to a
// process's input and then, with eof, closes it. ErrProcBusy: the process
// has not read what was sent before (nothing of data was taken; try
// again later); ErrProcEnded: its input is closed.
func (v *VM) ProcInput(ctx context.Context, handle int64, data []byte, eof bool) error {
	const op = "proc input"
	if len(data) > agentproto.MaxInputChunk {
		return fmt.Errorf("%s: %d bytes, at most %d", op, len(data), agentproto.MaxInputChunk)
	}
	_, err := procCall[noResult](ctx, v, agentproto.CallProcInput, agentproto.ProcInput{Handle: handle, Data: data, EOF: eof}, v.controlLimit())
	return err
}

// ProcSignal sends a process's process group a signal (an RFC 4254 name:
// "TERM", "KILL", …). ErrProcEnded: it has ended.
func (v *VM) ProcSignal(ctx context.Context, handle int64, signal string) error {
	const op = "proc signal"
	if !signum.IsRFC4254(signal) {
		return fmt.Errorf("%s: %q is not a signal name", op, signal)
	}
	_, err := procCall[noResult](ctx, v, agentproto.CallProcSignal, agentproto.ProcSignal{Handle: handle, Signal: signal}, v.controlLimit())
	return err
}
