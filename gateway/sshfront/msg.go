package sshfront

// The payloads of the RFC 4254 session-channel requests the front door
// speaks (ssh.Marshal and ssh.Unmarshal them). Every payload comes from a
// client that may be hostile: bounds (package tty for terminals) are
// checked before a value is used.

// Request and channel names (RFC 4254 §6).
const (
	reqEnv          = "env"
	reqPtyReq       = "pty-req"
	reqWindowChange = "window-change"
	reqExec         = "exec"
	reqShell        = "shell"
	reqSignal       = "signal"
	reqExitStatus   = "exit-status"
	reqExitSignal   = "exit-signal"
)

// envRequest is the payload of "env" (§6.4).
type envRequest struct {
	Name, Value string
}

// ptyRequest is the payload of "pty-req" (§6.2): terminal type, size in
// characters and pixels, encoded terminal modes.
type ptyRequest struct {
	Term                         string
	Columns, Rows, Width, Height uint32
	Modes                        string
}

// windowChangeRequest is the payload of "window-change" (§6.7).
type windowChangeRequest struct {
	Columns, Rows, Width, Height uint32
}

// execRequest is the payload of "exec" (§6.5).
type execRequest struct {
	Command string
}

// signalRequest is the payload of "signal" (§6.9): a signal name without
// "SIG".
type signalRequest struct {
	Signal string
}

// exitStatusMsg is the payload of "exit-status" (§6.10).
type exitStatusMsg struct {
	Status uint32
}

// exitSignalMsg is the payload of "exit-signal" (§6.10).
type exitSignalMsg struct {
	Signal     string
	CoreDumped bool
	Error      string
	Lang       string
}
