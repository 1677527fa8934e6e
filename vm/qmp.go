package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// qmpMaxLine bounds one line QEMU sends on its monitor. The longest
// vmgate asks for (query-migrate, x-query-virtio) is a few KiB; a QEMU
// the guest took over (the save path's threat model) may send a line
// without end, which unbounded reads buffered at about twice the rate it
// came, until the daemon was killed for its memory (issue 43, item 2).
const qmpMaxLine = 64 << 10

// errQMPLineTooLong is the end of a monitor whose QEMU sent a line over
// the bound.
var errQMPLineTooLong = errors.New("qemu sent a monitor line longer than vmgated reads")

// qmp is a minimal client of QEMU's machine protocol on the VM's QMP
// socket: one command at a time; events are skipped, except by waitEvent.
// Every line is read by readLine, which bounds it.
type qmp struct {
	c *net.UnixConn
	r *bufio.Reader // its size is the bound of a line (qmpMaxLine)
	// broken, once set, is the error of every read: the monitor ended.
	broken error
	// onEvent, when set, sees the events run and waitEvent read past on
	// the way to what they wait for.
	onEvent func(r qmpReply)
}

// qmpReply is one line QEMU sends: a greeting, an event, a return or an
// error.
type qmpReply struct {
	QMP       json.RawMessage `json:"QMP"`
	Event     string          `json:"event"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"` // an event's: when QEMU made it (host time)
	Data   json.RawMessage `json:"data"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

// stamp is the time QEMU made the event r.
func (r qmpReply) stamp() time.Time {
	return time.Unix(r.Timestamp.Seconds, r.Timestamp.Microseconds*1000)
}

// parseQMPLine decodes one line from QEMU. QEMU runs the guest, so its
// output is treated as untrusted: malformed lines are errors, never panics.
func parseQMPLine(line []byte) (qmpReply, error) {
	var r qmpReply
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("qmp: malformed reply %.200q: %w", line, err)
	}
	if r.QMP == nil && r.Event == "" && r.Return == nil && r.Error == nil {
		return r, fmt.Errorf("qmp: reply %.200q is neither greeting, event, return nor error", line)
	}
	return r, nil
}

// dialQMP connects to the QMP socket at path (retrying until it exists,
// ctx ends or exited is closed) and negotiates capabilities.
func dialQMP(ctx context.Context, path string, exited <-chan struct{}) (*qmp, error) {
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			q := &qmp{c: c.(*net.UnixConn), r: bufio.NewReaderSize(c, qmpMaxLine)}
			if err := q.handshake(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return q, nil
		}
		select {
		case <-exited:
			return nil, errors.New("qmp: qemu exited")
		case <-ctx.Done():
			return nil, fmt.Errorf("qmp: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (q *qmp) handshake(ctx context.Context) error {
	q.deadline(ctx)
	line, err := q.readLine()
	if err != nil {
		return fmt.Errorf("qmp greeting: %w", err)
	}
	if r, err := parseQMPLine(line); err != nil || r.QMP == nil {
		return fmt.Errorf("qmp: no greeting (%v)", err)
	}
	_, err = q.run(ctx, "qmp_capabilities", nil)
	return err
}

func (q *qmp) deadline(ctx context.Context) {
	d := time.Now().Add(30 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(d) {
		d = dl
	}
	_ = q.c.SetDeadline(d)
}

// run executes a command with arguments (nil for none), passing fds with
// it (SCM_RIGHTS, for getfd), and returns its "return" value.
func (q *qmp) run(ctx context.Context, cmd string, args any, fds ...int) (json.RawMessage, error) {
	if q.broken != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, q.broken)
	}
	q.deadline(ctx)
	msg := map[string]any{"execute": cmd}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := q.c.WriteMsgUnix(append(b, '\n'), oob, nil); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	for {
		line, err := q.readLine()
		if err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		r, err := parseQMPLine(line)
		if err != nil {
			return nil, err
		}
		switch {
		case r.Error != nil:
			return nil, fmt.Errorf("qmp %s: %s: %s", cmd, r.Error.Class, r.Error.Desc)
		case r.Return != nil:
			return r.Return, nil
		}
		// An event or a stray greeting: keep reading.
		if r.Event != "" && q.onEvent != nil {
			q.onEvent(r)
		}
	}
}

// waitEvent reads QEMU's output until an event named name arrives whose
// data match accepts, or ctx ends. Replies are skipped, and other events
// given to onEvent, if set: call it with no command outstanding.
func (q *qmp) waitEvent(ctx context.Context, name string, match func(r qmpReply) bool) error {
	q.deadline(ctx)
	return q.readUntil(name, match)
}

// readUntil reads QEMU's output until an event named name arrives whose
// data match accepts, the connection ends or its deadline passes.
func (q *qmp) readUntil(name string, match func(r qmpReply) bool) error {
	for {
		line, err := q.readLine()
		if err != nil {
			return fmt.Errorf("qmp: waiting for %s: %w", name, err)
		}
		r, err := parseQMPLine(line)
		if err != nil {
			return err
		}
		if r.Event == name && match(r) {
			return nil
		}
		if r.Event != "" && q.onEvent != nil {
			q.onEvent(r)
		}
	}
}

// readLine returns QEMU's next line, valid until the next read: the one
// read of the monitor. A line longer than the reader's buffer ends the
// monitor: the connection is closed (what follows cannot be told apart
// from the rest of that line) and every later read fails the same way.
// Nothing past the buffer is ever held.
func (q *qmp) readLine() ([]byte, error) {
	if q.broken != nil {
		return nil, q.broken
	}
	line, err := q.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		q.broken = fmt.Errorf("%w (%d bytes): QEMU no longer speaks QMP, a guest may have taken it over; its monitor is closed", errQMPLineTooLong, q.r.Size())
		if q.c != nil {
			_ = q.c.Close()
		}
		return nil, q.broken
	}
	return line, err
}

// status returns the VM's run state (query-status), e.g. "running",
// "paused", "inmigrate", "postmigrate".
func (q *qmp) status(ctx context.Context) (string, error) {
	raw, err := q.run(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return "", fmt.Errorf("qmp query-status: %w", err)
	}
	return st.Status, nil
}

// migrationStatus returns query-migrate's status ("" before any migration)
// and its error description when it failed.
func (q *qmp) migrationStatus(ctx context.Context) (string, string, error) {
	raw, err := q.run(ctx, "query-migrate", nil)
	if err != nil {
		return "", "", err
	}
	var st struct {
		Status string `json:"status"`
		Error  string `json:"error-desc"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return "", "", fmt.Errorf("qmp query-migrate: %w", err)
	}
	return st.Status, st.Error, nil
}

// migrationEvents is the migration capability that has QEMU send a
// MIGRATION event at each change of a migration's status.
var migrationEvents = map[string]any{"capabilities": []map[string]any{{"capability": "events", "state": true}}}

// runMigration runs cmd ("migrate" or "migrate-incoming", its fd passed
// before) and waits for the migration it starts to end: nil when it
// completed. It waits for QEMU's MIGRATION event rather than asking
// query-migrate: each query takes QEMU's main lock, and asked every 2 ms
// they halved the speed of a stopped VM's 180 MiB migration (8.8 s
// against 4.2 s asked every 100 ms, TCG). An end that comes before cmd's
// reply (a stream from a file can load within the command) is seen on
// the way to the reply.
func (q *qmp) runMigration(ctx context.Context, cmd string, args any) error {
	if _, err := q.run(ctx, "migrate-set-capabilities", migrationEvents); err != nil {
		return err
	}
	end := ""
	prev := q.onEvent
	q.onEvent = func(r qmpReply) {
		if st, ok := migrationEnd(r.Event, r.Data); ok && end == "" {
			end = st
		}
		if prev != nil {
			prev(r)
		}
	}
	_, err := q.run(ctx, cmd, args)
	q.onEvent = prev
	if err != nil {
		return err
	}
	if end != "" {
		return q.migrationEnded(ctx, end)
	}
	return q.awaitMigration(ctx)
}

// awaitMigration waits for the MIGRATION event that ends the migration
// under way (its events asked for before it started, and no command run
// since): nil when it completed.
func (q *qmp) awaitMigration(ctx context.Context) error {
	end := ""
	if err := q.awaitEvent(ctx, "MIGRATION", func(r qmpReply) bool {
		st, ok := migrationEnd(r.Event, r.Data)
		end = st
		return ok
	}); err != nil {
		return fmt.Errorf("migration: %w", err)
	}
	return q.migrationEnded(ctx, end)
}

// migrationEnded is the error of a migration that ended as end.
func (q *qmp) migrationEnded(ctx context.Context, end string) error {
	if end == "completed" {
		return nil
	}
	desc := ""
	if _, d, err := q.migrationStatus(ctx); err == nil {
		desc = d
	}
	return fmt.Errorf("migration %s: %s", end, desc)
}

// migrationEnd tells whether an event is the end of a migration, and
// how it ended: "completed", "failed" or "cancelled".
func migrationEnd(event string, data json.RawMessage) (string, bool) {
	if event != "MIGRATION" {
		return "", false
	}
	var d struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(data, &d) != nil {
		return "", false
	}
	switch d.Status {
	case "completed", "failed", "cancelled":
		return d.Status, true
	}
	return "", false
}

// awaitEvent is waitEvent for as long as ctx lets it, not the 30 s a
// command's reply gets: a migration sends no event while it runs.
func (q *qmp) awaitEvent(ctx context.Context, name string, match func(r qmpReply) bool) error {
	dl, _ := ctx.Deadline()
	_ = q.c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = q.c.SetDeadline(time.Now()) })
	defer stop()
	err := q.readUntil(name, match)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// ignoreShared is the migration capability that leaves shared
// (file-backed) RAM out of the stream.
var ignoreShared = map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}

func (q *qmp) Close() error { return q.c.Close() }
