// Package tty holds the bounds of a terminal that every side enforces: what
// the local API's tty, an SSH pty-req or window-change, the host's exec
// and the guest agent accept. Every value comes from a peer that may be
// hostile (a client, a guest): the bounds are checked before it is used.
package tty

import "strings"

// Terminal bounds.
const (
	MaxColumns = 4096
	MaxRows    = 4096
	MaxName    = 64
)

// SizeOK reports whether a terminal of cols × rows is within bounds (0
// means "unset" and is allowed: a default applies).
func SizeOK(cols, rows uint32) bool {
	return cols <= MaxColumns && rows <= MaxRows
}

// NameOK reports whether a terminal type (TERM) is acceptable: short, no
// NUL or newline.
func NameOK(term string) bool {
	return len(term) <= MaxName && !strings.ContainsAny(term, "\x00\n")
}
