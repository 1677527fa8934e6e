// Command wedgeagent is a hostile guest agent for the daemon's tests: a
// guest root that takes the agent's place on its port, accepts a command
// with stdin, stops reading the port and reports the command's exit
// (docs/security.md, a guest that stops reading its port). It is never
// part of an image: a test puts it into a session's guest and runs it as
// a command, as any guest root could.
//
// Run by the agent as a command (as root), it:
//
//  1. kills the agent, its parent, and opens the port the agent held
//     (/dev/virtio-ports/vmgate.agent). The host's connection does not
//     end: QEMU keeps its socket to the host while a guest process closes
//     and another opens the port, and vmgated sees nothing but the frames
//     that follow. The agent's restart (systemd's Restart=always) then
//     finds the port busy.
//  2. reports the command that started it as ended with -status. It does
//     not know that command's channel id (the agent had it), so it sends
//     the exit and a close for each of the ids maxID down to 1: the host
//     drops frames for channels it does not have (agentconn's threat
//     model) and takes those of its open one; the ids below it are of
//     channels that are over, never reused. The command's client then
//     sees -status, which no agent would report for this program: the
//     takeover is done when that command returns.
//  3. answers the host's calls (info says it copies files), and takes the
//     host's next command: accepts it, grants it a large window so that
//     the host writes as much stdin as it has, sends "wedged\n" as its
//     output, and stops reading the port. After -exit-after it ends the
//     command's output and reports its exit (status 0), and then holds
//     the port for ever, still not reading it.
//
// It speaks the frames of package agentproto. It cannot be served by
// agentconn's guest side (Serve): that starts a connection with the
// host's hello, and this program joins one in its middle.
//
// Before it kills the agent its errors go to stderr, the command's; after,
// there is no one to read them (the agent held the command's pipes): they
// go to the kernel log (/dev/kmsg), which is the guest's console.
//
// Usage:
//
//	wedgeagent [-status N] [-exit-after D]
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// portPath is udev's name for the agent's port.
const portPath = "/dev/virtio-ports/" + agentproto.PortName

// maxID bounds the channel ids the takeover answers for: a host gives
// each call and command of a connection the next id, and a session's
// connection has made a few dozen at most when its command runs this
// program.
const maxID = 1024

// wedgeWindow is the credit granted to the wedged command's stdin: far
// more than the port, QEMU and the host's socket buffer together.
const wedgeWindow = 1 << 30

// portOpenTimeout bounds the wait for the dead agent's port.
const portOpenTimeout = 10 * time.Second

func main() {
	status := flag.Uint("status", 42, "exit status to report for the command that runs this program")
	exitAfter := flag.Duration("exit-after", 10*time.Second, "how long the wedged command runs before its exit is reported")
	flag.Parse()
	if err := run(uint32(*status), *exitAfter); err != nil {
		fmt.Fprintf(os.Stderr, "wedgeagent: %v\n", err)
		os.Exit(1)
	}
}

// run takes the port over; once the agent is dead it never returns.
func run(status uint32, exitAfter time.Duration) error {
	agent := os.Getppid()
	exe, err := os.Readlink("/proc/" + strconv.Itoa(agent) + "/exe")
	if err != nil || exe != agentproto.AgentBinaryPath {
		return fmt.Errorf("the parent, pid %d (%s, %v), is not the agent: run this program as a command", agent, exe, err)
	}
	if _, err := os.Stat(portPath); err != nil {
		return fmt.Errorf("the agent's port: %w", err)
	}
	// The agent's pipes break with it; nothing here may die of that.
	signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM)
	if err := syscall.Kill(agent, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill the agent: %w", err)
	}
	port, err := openPort(portPath, portOpenTimeout)
	if err != nil {
		fail("%v", err)
	}
	logf("took over %s from the agent (pid %d)", portPath, agent)
	if err := wedge(port, status, exitAfter); err != nil {
		fail("%v", err)
	}
	logf("the wedged command's exit is sent; holding the port, not reading it")
	for {
		time.Sleep(time.Hour)
		runtime.KeepAlive(port) // closing it would let the agent back
	}
}

// openPort opens the port once the dead agent has let it go (the driver
// allows one opener: EBUSY until then).
func openPort(path string, timeout time.Duration) (*os.File, error) {
	deadline := time.Now().Add(timeout)
	for {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return nil, fmt.Errorf("open the agent's port: %w", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// wedge serves the host on rw, in the middle of its connection, from the
// takeover to the wedged command's exit (steps 2 and 3 of the package
// doc).
func wedge(rw io.ReadWriter, status uint32, exitAfter time.Duration) error {
	if _, err := rw.Write(takeoverFrames(status)); err != nil {
		return fmt.Errorf("report the takeover: %w", err)
	}
	var buf []byte
	for {
		f, err := agentproto.ReadFrame(rw, &buf, agentproto.MaxHostPayload)
		if err != nil {
			return fmt.Errorf("read the host: %w", err)
		}
		switch f.Type {
		case agentproto.FrameCall:
			if _, err := rw.Write(replyFrame(f)); err != nil {
				return fmt.Errorf("reply: %w", err)
			}
		case agentproto.FrameOpen:
			if _, err := rw.Write(acceptFrames(f.ID)); err != nil {
				return fmt.Errorf("accept: %w", err)
			}
			// Nothing more is read.
			time.Sleep(exitAfter)
			if _, err := rw.Write(exitFrames(f.ID)); err != nil {
				return fmt.Errorf("exit: %w", err)
			}
			return nil
		}
		// The rest (the host's close of the command that started this
		// program, data, windows) needs no answer.
	}
}

// takeoverFrames reports the end of the command that runs this program,
// with status, on each channel id it may have, the highest first: once
// the host has taken that command's exit, the frames that follow are for
// channels that are over, and none for a channel it may open next.
func takeoverFrames(status uint32) []byte {
	var b []byte
	exit := agentproto.EncodeExit(agentproto.Exit{Status: status})
	for id := uint32(maxID); id >= 1; id-- {
		b = agentproto.AppendFrame(b, agentproto.FrameExit, id, exit)
		b = agentproto.AppendFrame(b, agentproto.FrameClose, id, nil)
	}
	return b
}

// replyFrame answers a call: info as an agent that copies files, settime
// with nothing, any other call with an error.
func replyFrame(f agentproto.Frame) []byte {
	var call agentproto.Call
	var r agentproto.Reply
	switch err := call.UnmarshalBinary(f.Payload); {
	case err != nil:
		r.Error = err.Error()
	case call.Op == agentproto.CallInfo:
		r.Result, _ = agentproto.Info{AgentVersion: "wedgeagent", Features: []string{agentproto.FeatureTransfer}}.MarshalBinary()
	case call.Op != agentproto.CallSetTime:
		r.Error = "wedgeagent: " + call.Op + " is not served"
	}
	p, _ := r.MarshalBinary()
	return agentproto.AppendFrame(nil, agentproto.FrameReply, f.ID, p)
}

// acceptFrames accepts command id, grants its stdin wedgeWindow and
// sends the output that tells its client the command runs.
func acceptFrames(id uint32) []byte {
	b := agentproto.AppendFrame(nil, agentproto.FrameOpenOK, id, nil)
	b = agentproto.AppendFrame(b, agentproto.FrameWindow, id, agentproto.EncodeUint32(wedgeWindow))
	return agentproto.AppendFrame(b, agentproto.FrameData, id, []byte("wedged\n"))
}

// exitFrames end the output of command id and report its exit, status
// 0, as an agent does when a command ends.
func exitFrames(id uint32) []byte {
	b := agentproto.AppendFrame(nil, agentproto.FrameEOF, id, nil)
	return agentproto.AppendFrame(b, agentproto.FrameExit, id, agentproto.EncodeExit(agentproto.Exit{Status: 0}))
}

// logf writes to the kernel log, the guest's console (best effort).
func logf(format string, args ...any) {
	msg := fmt.Sprintf("wedgeagent: "+format+"\n", args...)
	if f, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0); err == nil {
		_, _ = f.WriteString(msg)
		f.Close()
	}
}

// fail logs why the takeover failed and exits.
func fail(format string, args ...any) {
	logf(format, args...)
	os.Exit(1)
}
