// Package sshmsg holds the payloads of the RFC 4254 session-channel
// requests the SSH front door speaks (gateway/sshfront; ssh.Marshal and
// ssh.Unmarshal them) and the bounds of what they may carry. The terminal
// bounds are also those of the agent protocol's terminals: what the host's
// exec asks for (vm) and what the guest agent accepts (vm/agent).
//
// Every payload comes from a peer that may be hostile (a guest, an SSH
// client): the bounds are checked before a value is used.
package sshmsg

import "strings"

// Request and channel names (RFC 4254 §6).
const (
	Env          = "env"
	PtyReq       = "pty-req"
	WindowChange = "window-change"
	Exec         = "exec"
	Shell        = "shell"
	Signal       = "signal"
	ExitStatus   = "exit-status"
	ExitSignal   = "exit-signal"
)

// EnvRequest is the payload of "env" (§6.4).
type EnvRequest struct {
	Name, Value string
}

// PtyRequest is the payload of "pty-req" (§6.2): terminal type, size in
// characters and pixels, encoded terminal modes.
type PtyRequest struct {
	Term                         string
	Columns, Rows, Width, Height uint32
	Modes                        string
}

// WindowChangeRequest is the payload of "window-change" (§6.7).
type WindowChangeRequest struct {
	Columns, Rows, Width, Height uint32
}

// ExecRequest is the payload of "exec" (§6.5).
type ExecRequest struct {
	Command string
}

// SignalRequest is the payload of "signal" (§6.9): a signal name without
// "SIG".
type SignalRequest struct {
	Signal string
}

// ExitStatusMsg is the payload of "exit-status" (§6.10).
type ExitStatusMsg struct {
	Status uint32
}

// ExitSignalMsg is the payload of "exit-signal" (§6.10).
type ExitSignalMsg struct {
	Signal     string
	CoreDumped bool
	Error      string
	Lang       string
}

// Terminal bounds: what a pty-req, a window-change or the local API's tty
// may ask for.
const (
	MaxTermColumns = 4096
	MaxTermRows    = 4096
	MaxTermName    = 64
)

// TermSizeOK reports whether a terminal of cols × rows is within bounds
// (0 means "unset" and is allowed: a default applies).
func TermSizeOK(cols, rows uint32) bool {
	return cols <= MaxTermColumns && rows <= MaxTermRows
}

// TermNameOK reports whether a terminal type (TERM) is acceptable: short,
// no NUL or newline.
func TermNameOK(term string) bool {
	return len(term) <= MaxTermName && !strings.ContainsAny(term, "\x00\n")
}
