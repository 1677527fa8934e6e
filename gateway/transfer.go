package gateway

// File transfers (vm-exec --put, --get, cp): each tree is one tar stream
// that the daemon checks with package transfer's rules while it relays it
// between the front door and the guest agent's put or get command, and
// records in the audit log. Only the checked copy of a stream reaches
// the other side.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/transfer"
	"github.com/vmgate/vmgate/vm"
)

// transferIO is a front door's side of a request's file transfers.
type transferIO struct {
	// puts[i] carries put i's tar stream from the client; the daemon
	// closes it with an error to drop what the client still sends.
	puts []*io.PipeReader
	// getStream is where the checked streams of gets go, one after the
	// other; getEnd ends one.
	getStream io.Writer
	getEnd    func(wire.Transfer) error
}

// TransferError reports a put that failed: the command did not run.
type TransferError struct{ Msg string }

func (e *TransferError) Error() string { return e.Msg }

// maxTrailing bounds what a client may send after a put's tar stream ends.
const maxTrailing = 1 << 20

// agentMessage is the first line of what the agent's put or get wrote to
// stderr, kept to a bounded size.
type agentMessage struct{ bytes.Buffer }

func (m *agentMessage) Write(p []byte) (int, error) {
	if room := 4096 - m.Len(); room > 0 {
		m.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (m *agentMessage) text() string {
	line, _, _ := strings.Cut(strings.TrimSpace(m.String()), "\n")
	return line
}

type checked struct {
	sum transfer.Summary
	err error
}

// put relays put i of st's request from src into the guest.
func (s *Server) put(ctx context.Context, st *execState, m *vm.VM, i int, src *io.PipeReader) wire.Transfer {
	spec, lim := st.req.Put[i], st.verdict.Limits.Files
	rules := transfer.Rules{Dir: transfer.IntoGuest, Limits: transfer.Limits{MaxBytes: lim.PutBytes, MaxFiles: lim.PutFiles}, Top: spec.Top}
	var msg agentMessage
	var res *vm.ExecResult
	c, err := relayPut(src, rules, putStall, func(stdin io.Reader) (err error) {
		res, err = m.Exec(ctx, vm.ExecRequest{Argv: vm.PutCommand(spec.Guest, spec.Top, lim.PutBytes, lim.PutFiles),
			Dir: st.dir, User: st.verdict.User, Stdin: stdin, Stderr: &msg,
			Timeout: st.verdict.Limits.Timeout, OutputLimit: 64 << 10})
		return err
	})
	out := outcome("put", spec.Guest, c.sum)
	out.Error = transferFailure(c.err, res, err, msg.text())
	return out
}

// putStall ends a put whose client sends none of its data for this long:
// the client is gone, or holds its VM without sending (as writeStall
// ends a command whose client takes none of its output).
const putStall = writeStall

// errPutStalled is why a put ends whose client stopped sending.
var errPutStalled = errors.New("the client sent none of the put's data")

// relayPut checks the client's put stream src with rules while guest (the
// guest's put command) reads the checked copy as its stdin. It returns
// guest's error once both sides have ended, and they end together:
//   - once the guest's side has ended (done, failed, or killed at its
//     time limit), the client's side is closed: its checker would
//     otherwise wait for frames of a client that sends no more, and hold
//     the request and its VM for ever;
//   - a read of the client's side that waits longer than stall breaks
//     the stream (errPutStalled), which ends the guest's side.
func relayPut(src *io.PipeReader, rules transfer.Rules, stall time.Duration, guest func(stdin io.Reader) error) (checked, error) {
	pr, pw := io.Pipe()
	done := make(chan checked, 1)
	go func() {
		in := &stallReader{r: src, stall: stall}
		sum, err := transfer.Check(in, pw, rules)
		if err == nil {
			if n, _ := io.CopyN(io.Discard, in, maxTrailing+1); n > maxTrailing {
				err = errors.New("more data after the end of the tar stream")
			}
		}
		if err != nil {
			src.CloseWithError(err) // the client's further frames are dropped
		}
		pw.CloseWithError(err)
		done <- checked{sum, err}
	}()
	err := guest(pr)
	ended := errors.New("the guest's put ended")
	pr.CloseWithError(ended)
	// Whatever the client still sends of this put is not read: a guest
	// that read the whole stream has ended after the checker, which
	// wrote its end last.
	src.CloseWithError(ended)
	return <-done, err
}

// stallReader reads a put's stream from its client, and breaks it when
// one read waits longer than stall. Only the client fills the pipe (the
// checker's reads never wait for the guest), so a read that waits is a
// client that does not send.
type stallReader struct {
	r       *io.PipeReader
	stall   time.Duration
	stalled atomic.Bool
}

func (s *stallReader) Read(p []byte) (int, error) {
	t := time.AfterFunc(s.stall, func() {
		s.stalled.Store(true)
		s.r.CloseWithError(errPutStalled) // what the client's side sees
	})
	n, err := s.r.Read(p)
	t.Stop()
	if err != nil && s.stalled.Load() {
		err = fmt.Errorf("%w for %v", errPutStalled, s.stall)
	}
	return n, err
}

// get relays the tree at get i's guest path to the front door.
func (s *Server) get(ctx context.Context, st *execState, m *vm.VM, i int, files *transferIO) wire.Transfer {
	spec, lim := st.req.Get[i], st.verdict.Limits.Files
	rules := transfer.Rules{Dir: transfer.FromGuest, Limits: transfer.Limits{MaxBytes: lim.GetBytes, MaxFiles: lim.GetFiles}, Top: wire.GetTop(spec.Guest)}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan checked, 1)
	go func() {
		sum, err := transfer.Check(pr, files.getStream, rules)
		if err != nil {
			cancel() // stop a guest that sends what is refused anyway
		}
		pr.CloseWithError(err)
		done <- checked{sum, err}
	}()
	var msg agentMessage
	// Headers take at most a few KiB per entry: the output limit only
	// backs the checker's byte limit.
	res, err := m.Exec(ctx, vm.ExecRequest{Argv: vm.GetCommand(spec.Guest, lim.GetBytes, lim.GetFiles),
		Dir: st.dir, User: st.verdict.User, Stdout: pw, Stderr: &msg,
		Timeout: st.verdict.Limits.Timeout, OutputLimit: lim.GetBytes + int64(lim.GetFiles)*(8<<10) + 1<<20})
	pw.Close()
	c := <-done
	out := outcome("get", spec.Guest, c.sum)
	out.Error = transferFailure(c.err, res, err, msg.text())
	return out
}

func outcome(dir, guest string, sum transfer.Summary) wire.Transfer {
	return wire.Transfer{Direction: dir, Guest: guest, Files: sum.Files, Bytes: sum.Bytes, SHA256: sum.SHA256, FileSHA256: sum.FileSHA256}
}

// transferFailure says why a transfer failed, or "" if it did not: the
// stream's checker refused it or its client stalled, the guest's command
// could not run or did not exit 0 (its stderr says why), or the stream
// broke.
func transferFailure(checkErr error, res *vm.ExecResult, execErr error, msg string) string {
	switch {
	case checkErr != nil && (errors.Is(checkErr, transfer.ErrRefused) || errors.Is(checkErr, transfer.ErrLimit) || errors.Is(checkErr, errPutStalled)):
		return checkErr.Error()
	case execErr != nil:
		return execErr.Error()
	case res.ExitCode == 0 && res.Signal == "" && !res.TimedOut:
		if checkErr != nil {
			return checkErr.Error()
		}
		return ""
	case res.TimedOut:
		return "timed out in the guest"
	case msg != "":
		return msg
	case res.Signal != "":
		return "killed in the guest by " + res.Signal
	}
	return fmt.Sprintf("failed in the guest (exit %d)", res.ExitCode)
}

// transfersRun runs st's puts (before: true) or gets in target and
// appends their outcomes to *done. A failed put stops the puts and is
// returned as a *TransferError; a failed get is reported and the next
// one runs.
func (s *Server) transfersRun(ctx context.Context, st *execState, target *vmTarget, files *transferIO, before bool, done *[]wire.Transfer) error {
	if files == nil || len(st.req.Put)+len(st.req.Get) == 0 {
		return nil
	}
	// Asked once, before the puts: the gets' phase follows only a
	// request whose first phase passed.
	if ok, err := canTransfer(ctx, before, target.vm); err != nil || !ok {
		why := "the image's agent predates file transfers: rebuild the image (vmgated image build, or image import)"
		if err != nil {
			why = "cannot ask the agent whether it copies files: " + err.Error()
		}
		for _, p := range files.puts {
			p.CloseWithError(errors.New(why))
		}
		if err != nil && (errors.Is(err, vm.ErrVMDied) || errors.Is(err, vm.ErrAgentLost) || errors.Is(err, vm.ErrAgentUnresponsive) || target.vm.Gone()) {
			// Not a transfer's failure: the VM's (exit 205), and a
			// session's VM ends with the request.
			return fmt.Errorf("%s: %w", why, err)
		}
		return &TransferError{Msg: why}
	}
	if before {
		for i := range st.req.Put {
			t := s.put(ctx, st, target.vm, i, files.puts[i])
			*done = append(*done, t)
			if t.Error != "" {
				for _, p := range files.puts[i+1:] {
					p.CloseWithError(errors.New("an earlier put failed"))
				}
				return &TransferError{Msg: fmt.Sprintf("put %s: %s", t.Guest, t.Error)}
			}
		}
		return nil
	}
	for i := range st.req.Get {
		t := s.get(ctx, st, target.vm, i, files)
		*done = append(*done, t)
		if err := files.getEnd(t); err != nil {
			return err
		}
	}
	return nil
}

// auditTransfers is the audit form of transfers; requested, when done
// is nil, lists what the request asks for.
func auditTransfers(req *wire.ExecRequest, done []wire.Transfer) []audit.Transfer {
	var out []audit.Transfer
	if done == nil {
		for _, p := range req.Put {
			out = append(out, audit.Transfer{Direction: "put", Guest: p.Guest, Local: p.Local, Files: p.Files, Bytes: p.Bytes})
		}
		for _, g := range req.Get {
			out = append(out, audit.Transfer{Direction: "get", Guest: g.Guest, Local: g.Local})
		}
		return out
	}
	for i, t := range done {
		a := audit.Transfer{Direction: t.Direction, Guest: t.Guest, Files: t.Files, Bytes: t.Bytes, SHA256: t.SHA256, FileSHA256: t.FileSHA256, Error: t.Error}
		if j := i - len(req.Put); j < 0 {
			a.Local = req.Put[i].Local
		} else if j < len(req.Get) {
			a.Local = req.Get[j].Local
		}
		out = append(out, a)
	}
	return out
}

// canTransfer asks the agent in the first phase of a request; the second
// phase runs only after the first passed.
func canTransfer(ctx context.Context, first bool, m *vm.VM) (bool, error) {
	if !first {
		return true, nil
	}
	return m.CanTransfer(ctx)
}
