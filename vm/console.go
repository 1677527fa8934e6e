package vm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// The serial console. A guest with root can write to it as fast as QEMU
// emulates the UART, for as long as it likes, so nothing of it grows
// without bound: QEMU writes it into a pipe, the daemon reads the pipe and
// keeps the first ConsoleLogMax bytes in ConsoleLog (the boot, for an
// operator) and the last consoleKeep bytes in memory (for error messages);
// the rest is counted and dropped.
const (
	// ConsoleLogMax bounds the console.log file of a VM.
	ConsoleLogMax = 1 << 20
	consoleKeep   = 16 << 10
)

// console reads a VM's serial console from QEMU's pipe.
type console struct {
	r    *os.File // the pipe's read end
	log  *os.File // ConsoleLog
	done chan struct{}

	mu      sync.Mutex
	last    []byte // the last consoleKeep bytes
	total   int64  // bytes the guest wrote
	written int64  // bytes in ConsoleLog
}

// startConsole creates ConsoleLog in dir and the pipe QEMU writes the
// console to; it returns the write end, to pass to QEMU and close once
// QEMU has it. The console is read until QEMU closes the pipe (exits).
func startConsole(dir string) (*console, *os.File, error) {
	log, err := os.OpenFile(filepath.Join(dir, ConsoleLog), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("console log: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		log.Close()
		return nil, nil, fmt.Errorf("console pipe: %w", err)
	}
	c := &console{r: r, log: log, done: make(chan struct{})}
	go c.run()
	return c, w, nil
}

func (c *console) run() {
	defer close(c.done)
	defer c.r.Close()
	defer c.log.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.r.Read(buf)
		if n > 0 {
			c.take(buf[:n])
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_, _ = fmt.Fprintf(c.log, "\n[vmgate: reading the console failed: %v]\n", err)
			}
			return
		}
	}
}

// take records p: into the file while it is under its bound (then one
// line saying the rest is not kept), and into the in-memory tail.
func (c *console) take(p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(p))
	if room := ConsoleLogMax - c.written; room > 0 {
		k := min(int64(len(p)), room)
		if _, err := c.log.Write(p[:k]); err == nil {
			c.written += k
		}
		if k < int64(len(p)) || c.written == ConsoleLogMax {
			_, _ = fmt.Fprintf(c.log, "\n[vmgate: console.log stops at %d bytes; later output is not kept]\n", ConsoleLogMax)
			c.written = ConsoleLogMax
		}
	}
	c.last = append(c.last, p...)
	if over := len(c.last) - consoleKeep; over > 0 {
		c.last = append(c.last[:0], c.last[over:]...)
	}
}

// tail returns the last lines of the console, at most n.
func (c *console) tail(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return lastLines(c.last, n)
}

// wait waits until QEMU has closed the pipe and the reader is done.
func (c *console) wait() { <-c.done }

// lastLines returns the last n lines of b (trimmed), joined by " | ".
func lastLines(b []byte, n int) string {
	t := strings.TrimSpace(string(bytes.ToValidUTF8(b, []byte("\uFFFD"))))
	if t == "" {
		return ""
	}
	lines := strings.Split(t, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// fileTail returns the last n bytes of the file at path, a VM's
// (openQEMUFile), or nothing.
func fileTail(path string, n int64) []byte {
	f, err := openQEMUFile(path, os.O_RDONLY)
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(0, st.Size()-n)
	b := make([]byte, st.Size()-off)
	k, _ := f.ReadAt(b, off)
	return b[:k]
}
