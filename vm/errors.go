package vm

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// ErrVMDied reports that QEMU exited while the VM was in use.
var ErrVMDied = errors.New("vm died")

// ErrClosed reports use of a VM after Close.
var ErrClosed = errors.New("vm closed")

// ErrHandshake reports that the guest agent answered, but not with a
// working hello (package agentconn).
var ErrHandshake = errors.New("agent handshake failed")

// ErrAgentLost reports a VM whose agent connection ended while the VM was
// in use: the guest broke the protocol or hung up. The VM is then killed:
// no command can reach it any more.
var ErrAgentLost = errors.New("guest agent connection lost")

// Error is a VM that failed: in which phase (Phase: "vm died during
// exec", "restore", …), of which kind (Kind: one of the package's
// sentinels, or nil), why (Err), and what QEMU's log and the guest's
// serial console last said.
//
// Error() is the phase and the cause only: the console is written by the
// guest, which is hostile, so its text never reaches a client through an
// error message. The daemon logs and audits Details instead.
type Error struct {
	Phase string
	Kind  error
	Err   error
	// QEMULog and Console are the last lines of QEMU's log and of the
	// guest's console, for the host's log only.
	QEMULog, Console string
	// Guest, when set, is what the host saw of a guest that did not
	// answer in time (guestState), for the host's log only.
	Guest string
}

func (e *Error) Error() string { return e.Phase + ": " + e.Err.Error() }

// Unwrap gives errors.Is and errors.As the kind and the cause.
func (e *Error) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}

// Diagnostics is the end of QEMU's log and of the console, or "".
func (e *Error) Diagnostics() string {
	var parts []string
	if e.QEMULog != "" {
		parts = append(parts, QEMULog+": "+e.QEMULog)
	}
	if e.Console != "" {
		parts = append(parts, ConsoleLog+": "+e.Console)
	}
	if e.Guest != "" {
		parts = append(parts, "guest: "+e.Guest)
	}
	return strings.Join(parts, "; ")
}

// Diagnostics returns the diagnostics of the first *Error in err's chain,
// or "" when there is none (or it has none): what QEMU and the guest's
// console last said, for the host's log and audit.
func Diagnostics(err error) string {
	var ve *Error
	if errors.As(err, &ve) {
		return ve.Diagnostics()
	}
	return ""
}

// Details is err's text followed by its diagnostics, for the host's log
// and audit (never for a client).
func Details(err error) string {
	if d := Diagnostics(err); d != "" {
		return err.Error() + "; " + d
	}
	return err.Error()
}

// fail returns an *Error of the VM in phase, with the end of its logs.
func (v *VM) fail(phase string, kind, err error) *Error {
	e := &Error{Phase: phase, Kind: kind, Err: err, QEMULog: lastLines(fileTail(filepath.Join(v.Dir, QEMULog), consoleKeep), 8)}
	if v.console != nil {
		e.Console = v.console.tail(8)
	}
	return e
}

// died describes why QEMU is gone: the cause the daemon recorded when it
// killed QEMU, a RAM file that could not grow, or QEMU's exit status.
func (v *VM) died(during string) error {
	c := v.stopCause()
	if c == nil {
		c = v.ramFileFull()
	}
	if c == nil {
		c = fmt.Errorf("qemu exited (%v)", v.exitErr)
	}
	return v.fail(ErrVMDied.Error()+" "+during, ErrVMDied, c)
}
