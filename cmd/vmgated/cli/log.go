// Package cli implements the command lines of vmgated and vm-exec, so that
// their mains stay a few lines long.
package cli

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"golang.org/x/term"
)

// logFormat is --log-format: auto (text on a terminal, JSON lines
// otherwise), text or json.
var logFormat = "auto"

// checkLogFormat validates --log-format.
func checkLogFormat() error {
	switch logFormat {
	case "auto", "text", "json":
		return nil
	}
	return fmt.Errorf("%w: --log-format %q: want auto, text or json", errUsage, logFormat)
}

// human reports whether f gets output for a person: a terminal, and not
// --log-format json.
func human(f *os.File) bool {
	return logFormat != "json" && (logFormat == "text" || isTerminal(f))
}

// newLogger builds the process logger: text for a person, JSON lines
// otherwise (journald, files).
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if f, ok := w.(*os.File); ok && human(f) || !ok && logFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// progressTo is where a command's progress lines go: stderr for a person,
// otherwise one "progress" log record per line.
func progressTo(log *slog.Logger) io.Writer {
	if human(os.Stderr) {
		return os.Stderr
	}
	return &lineLog{log: log}
}

// lineLog turns written lines into log records.
type lineLog struct {
	log *slog.Logger
	buf []byte
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		if line := strings.TrimSpace(string(l.buf[:i])); line != "" {
			l.log.Info("progress", "line", line)
		}
		l.buf = l.buf[i+1:]
	}
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// levelAndState checks what most commands need first: the log level and
// the state directory (created if missing).
func levelAndState(level, state string) (slog.Level, error) {
	lvl, err := parseLogLevel(level)
	if err != nil {
		return 0, err
	}
	return lvl, ensureStateDir(state)
}
