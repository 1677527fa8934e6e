// Package cli implements the command lines of vmgated and vm-exec, so that
// their mains stay a few lines long.
package cli

import (
	"io"
	"log/slog"
	"os"

	"golang.org/x/term"
)

// newLogger builds the process logger: text on a terminal, JSON lines
// otherwise (journald, files).
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }
