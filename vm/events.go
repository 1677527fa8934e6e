package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// EventsSocket is the VM's second QMP monitor. Only the VM's event
// watcher reads it, so qmp.sock stays free for the restore and the save.
const EventsSocket = "evmon.sock"

// ErrStateDiskFull reports that QEMU stopped the guest because a write to
// its overlay found no space on the disk of the state directory.
var ErrStateDiskFull = errors.New("no space left on the disk of vmgated's state directory")

// blockIOError is the data of QEMU's BLOCK_IO_ERROR event.
type blockIOError struct {
	Device    string `json:"device"`
	NodeName  string `json:"node-name"`
	Operation string `json:"operation"`
	Action    string `json:"action"`
	NoSpace   bool   `json:"nospace"`
	Reason    string `json:"reason"`
}

// noSpace reports whether a BLOCK_IO_ERROR event's data says the host
// disk is full; malformed data (QEMU runs the guest) never matches.
func noSpace(data json.RawMessage) (blockIOError, bool) {
	var e blockIOError
	if err := json.Unmarshal(data, &e); err != nil {
		return e, false
	}
	return e, e.NoSpace
}

// watchEvents ends the VM when its disk cannot grow. A write to the
// overlay that finds the host disk full makes QEMU stop the guest
// (werror=enospc, QEMU's default): without the watcher the command would
// hang, silent, until its time limit. The watcher kills QEMU, so that the
// request fails at once with ErrStateDiskFull and the overlay's space is
// given back. It returns when QEMU exits.
func (v *VM) watchEvents() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := dialQMP(ctx, filepath.Join(v.Dir, EventsSocket), v.exited)
	if err != nil {
		if !v.isDead() {
			v.log.Warn("event monitor unavailable: a full state disk will stop this VM silently", "err", err)
		}
		return
	}
	defer q.Close()
	// QEMU drops events sent before the monitor's negotiation: a guest
	// stopped before it is found by its status, and one stopped while
	// the status is asked by the event read on the way to the reply.
	var early *blockIOError
	q.onEvent = func(r qmpReply) {
		if e, full := noSpace(r.Data); r.Event == "BLOCK_IO_ERROR" && full && early == nil {
			early = &e
		}
	}
	st, err := q.status(ctx)
	q.onEvent = nil
	switch {
	case early != nil:
		v.stopDiskFull(*early)
		return
	case err == nil && st == "io-error":
		v.stopDiskFull(blockIOError{Reason: "the guest was stopped by an I/O error before the watcher connected"})
		return
	}
	// From here on the watch lasts as long as QEMU: its exit ends the
	// connection.
	_ = q.c.SetDeadline(time.Time{})
	var ev blockIOError
	err = q.readUntil("BLOCK_IO_ERROR", func(r qmpReply) bool {
		var full bool
		ev, full = noSpace(r.Data)
		return full
	})
	switch {
	case err == nil:
		v.stopDiskFull(ev)
	case !v.isDead():
		v.log.Warn("event monitor ended: a full state disk will stop this VM silently", "err", err)
	}
}

// stopDiskFull records why the VM ends and kills its QEMU.
func (v *VM) stopDiskFull(ev blockIOError) {
	v.mu.Lock()
	v.cause = fmt.Errorf("%w (QEMU stopped the guest writing its disk: %s)", ErrStateDiskFull, ev.Reason)
	v.mu.Unlock()
	v.log.Error("VM stopped: the state directory's disk is full", "dir", v.Dir, "operation", ev.Operation, "reason", ev.Reason)
	_ = v.Kill()
}

// setCause records why the daemon ends the VM, unless a cause is known.
func (v *VM) setCause(err error) {
	v.mu.Lock()
	if v.cause == nil {
		v.cause = err
	}
	v.mu.Unlock()
}

// stopCause is why the daemon ended the VM, or nil.
func (v *VM) stopCause() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.cause
}

// ramFileFull explains a QEMU that died of SIGBUS while its guest RAM was
// a file in the VM directory (a template being built): the kernel sends
// SIGBUS when a page of a shared file mapping cannot be allocated, which
// on the state directory's disk (or tmpfs) means it is full.
func (v *VM) ramFileFull() error {
	var ee *exec.ExitError
	if !errors.As(v.exitErr, &ee) {
		return nil
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGBUS {
		return nil
	}
	if _, err := os.Stat(filepath.Join(v.Dir, RAMFile)); err != nil {
		return nil
	}
	return fmt.Errorf("%w (QEMU died of SIGBUS: the guest's RAM file could not grow)", ErrStateDiskFull)
}
