package vm

import (
	"context"
	"crypto/rand"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/isolate"
	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/vm/netstack"
)

// VM is one running disposable virtual machine, as a launch (launch.go)
// brought it up: QEMU running in its jail, the agent connected.
//
// Lock order: mu guards closing, the cleanup stack and cause only; it is never held
// while waiting on QEMU or the network.
type VM struct {
	ID    string
	Dir   string
	Accel Accel

	log      *slog.Logger
	cmd      *exec.Cmd
	exited   chan struct{} // closed when QEMU has exited
	exitErr  error         // valid after exited is closed
	agent    *agentconn.Conn
	bootTime time.Duration
	phases   []Phase
	cgroup   *cgroup.Group // nil without cgroups
	net      GuestNetwork
	console  *console
	// control bounds a control step or call the agent answers at once
	// (0: controlTimeout).
	control time.Duration
	// What the VM was launched with, for Save: its options, its image,
	// and whether its overlay is on the base image itself (flat: a cold
	// boot, or a VM Save flattened) rather than on a template's or a
	// save point's disk.
	opts Options
	img  *imageFiles
	flat bool
	// from is the save point the VM was restored from (its disk is the
	// overlay's backing), released when the VM closes; nil otherwise.
	from *SavePoint
	// ram is the VM's own guest RAM, a memory file its QEMU maps shared
	// (a VM resumed alone from a save point), which a save copies instead
	// of migrating it page by page; nil for a VM whose RAM is QEMU's or a
	// private mapping.
	ram *os.File
	// handedBackBy says how the last save learnt that the guest agent had
	// closed its port (handback.go): byControlQueue, byPortEvent or
	// byEarlierEvent.
	handedBackBy string

	mu     sync.Mutex
	cause  error // why the daemon killed QEMU, if it did
	closed bool
	// retired are agent connections the host closed on purpose (a
	// template's save, a save point's): their end does not end the VM.
	retired  map[*agentconn.Conn]bool
	cleanups []func() error
	closeErr error
}

// CPU weights (cgroup v2 scale) of background and foreground VMs.
const (
	backgroundWeight = 1
	foregroundWeight = 100
)

// Foreground gives a VM started with Options.Background the normal CPU
// weight.
func (v *VM) Foreground() error {
	if v.cgroup == nil {
		return nil
	}
	return v.cgroup.SetCPUWeight(foregroundWeight)
}

// BootDuration is the time from the start request to a VM whose agent
// answers (a cold boot or a restore).
func (v *VM) BootDuration() time.Duration { return v.bootTime }

// Phase is one step of starting a VM and its duration.
type Phase struct {
	Name string        `json:"name"`
	Dur  time.Duration `json:"ns"`
}

// Phases breaks BootDuration down by launch step: overlay, jail+qemu
// launch, state load (restores), agent connection, clock/entropy refresh,
// network.
func (v *VM) Phases() []Phase { return slices.Clone(v.phases) }

func phasesString(ps []Phase) string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%dms", p.Name, p.Dur.Milliseconds())
	}
	return b.String()
}

// Gone reports whether QEMU has exited (without waiting).
func (v *VM) Gone() bool {
	select {
	case <-v.exited:
		return true
	default:
		return false
	}
}

// Exited is closed when the QEMU process has exited.
func (v *VM) Exited() <-chan struct{} { return v.exited }

// Pid is the QEMU process id.
func (v *VM) Pid() int { return v.cmd.Process.Pid }

// GuestNetwork is a VM's user-space network as its user sees it: a
// policy that can be replaced (netstack.Network.SetPolicy), which
// returns once the new policy is in force: the guest's next packet is
// judged by it (netproc.Proc.SetPolicy); and connections into the
// guest's ports, made by the network, for a published port
// (netstack.Network.DialGuest).
type GuestNetwork interface {
	SetPolicy(netstack.Policy)
	DialGuest(ctx context.Context, port uint16) (net.Conn, error)
}

// Network is the VM's user-space network, or nil when it has no NIC.
func (v *VM) Network() GuestNetwork { return v.net }

// JailReport describes the confinement of the VM's QEMU process.
func (v *VM) JailReport() (*isolate.Report, error) { return isolate.ReadReport(v.Pid()) }

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// push adds a step to the VM's cleanup stack (Close runs it in reverse).
func (v *VM) push(fn func() error) {
	v.mu.Lock()
	v.cleanups = append(v.cleanups, fn)
	v.mu.Unlock()
}

// attach makes c the VM's agent connection, closed with the VM. The VM
// lives only as long as the connection: one that ends while the VM is in
// use (the guest hung up or broke the protocol, or a call timed out) ends
// the VM, with the reason as its cause (ErrAgentLost, unless a cause was
// set), so that whoever waits on it learns why. Only detach (a template's
// save) and Close end the connection without that.
func (v *VM) attach(c *agentconn.Conn) {
	v.agent = c
	v.push(c.Close)
	go func() {
		<-c.Done()
		err := c.Err()
		var pe *agentconn.ProtocolError
		// A QEMU that exits closes the socket first: isDead gives the
		// exit a moment, so that the VM's end says why QEMU died rather
		// than that the connection ended.
		if !errors.As(err, &pe) && v.isDead() {
			return
		}
		v.mu.Lock()
		quiet := v.retired[c] || v.closed
		if !quiet && v.cause == nil {
			v.cause = fmt.Errorf("%w: %w", ErrAgentLost, err)
		}
		v.mu.Unlock()
		if !quiet {
			v.log.Warn("guest agent connection lost; killing the VM", "err", err)
			_ = v.Kill()
		}
	}()
}

// detach closes the agent connection without ending the VM.
func (v *VM) detach() {
	v.mu.Lock()
	if v.retired == nil {
		v.retired = map[*agentconn.Conn]bool{}
	}
	v.retired[v.agent] = true
	v.mu.Unlock()
	_ = v.agent.Close()
}

// lost is the error of a step that found the agent connection ended: the
// VM ends with it (attach), and its end says why.
func (v *VM) lost(during string) error {
	select {
	case <-v.exited:
	case <-time.After(killWait):
	}
	return v.died(during)
}

// controlLimit bounds a control step or call of the agent.
func (v *VM) controlLimit() time.Duration {
	if v.control > 0 {
		return v.control
	}
	return controlTimeout
}

// killWait bounds the wait for a QEMU that was sent SIGKILL.
const killWait = 10 * time.Second

// refresh sets the guest clock from the host and, with reseed, mixes 64
// bytes of host randomness into the guest's entropy pool and reseeds its
// generator, so that clones of one template never share random numbers.
func (v *VM) refresh(ctx context.Context, reseed bool) error {
	st := agentproto.SetTime{UnixNano: time.Now().UnixNano()}
	if reseed {
		st.Entropy = make([]byte, 64)
		if _, err := rand.Read(st.Entropy); err != nil {
			return fmt.Errorf("refresh: %w", err)
		}
	}
	if err := v.call(ctx, agentproto.CallSetTime, st, nil, v.controlLimit()); err != nil {
		return fmt.Errorf("set time: %w", err)
	}
	return nil
}

// Info asks the agent about the guest.
func (v *VM) Info(ctx context.Context) (*agentproto.Info, error) {
	var info agentproto.Info
	if err := v.call(ctx, agentproto.CallInfo, nil, &info, v.controlLimit()); err != nil {
		return nil, fmt.Errorf("info: %w", err)
	}
	return &info, nil
}

// call sends the agent a call and waits for its reply, decoded into
// result: at most limit, and while ctx lasts and QEMU runs. An agent that
// does not answer in time loses its connection: the VM is then unusable
// and the caller destroys it.
func (v *VM) call(ctx context.Context, op string, args encoding.BinaryMarshaler, result encoding.BinaryUnmarshaler, limit time.Duration) error {
	if v.agent == nil {
		return ErrClosed
	}
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- v.agent.Call(cctx, op, args, result) }()
	select {
	case err := <-done:
		switch {
		case err == nil:
			return nil
		case cctx.Err() != nil:
			return v.giveUp(ctx, op, limit, err)
		case v.agent.Err() != nil:
			return v.lost("while waiting for the agent")
		}
		return err
	case <-cctx.Done():
		// The call's own write may be stuck on a guest that stopped
		// reading: its limit holds all the same.
		err := v.giveUp(ctx, op, limit, cctx.Err())
		<-done
		return err
	case <-v.exited:
		_ = v.agent.Close()
		<-done
		return v.died("while waiting for the agent")
	}
}

// giveUp ends a call that ran past its limit or its context: the
// connection goes (and with it the VM), so that no late reply is taken
// for the answer to a later call.
func (v *VM) giveUp(ctx context.Context, op string, limit time.Duration, err error) error {
	why := err
	if ctx.Err() == nil {
		why = fmt.Errorf("%w: it did not answer %s within %v", ErrAgentUnresponsive, op, limit)
	}
	v.setCause(why)
	_ = v.agent.Close()
	return why
}

// Close kills QEMU and removes the VM's directory. It runs the cleanup stack
// in reverse order once; later calls return the first call's result.
func (v *VM) Close() error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return v.closeErr
	}
	v.closed = true
	cl := v.cleanups
	v.cleanups = nil
	v.mu.Unlock()
	var errs []error
	for i := len(cl) - 1; i >= 0; i-- {
		if err := cl[i](); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	v.mu.Lock()
	v.closeErr = err
	v.mu.Unlock()
	if err == nil {
		v.log.Debug("vm destroyed")
	}
	return err
}

// Kill terminates QEMU abruptly without cleaning up (fault injection and
// emergency stop); Close still has to be called. It does nothing before
// QEMU started.
func (v *VM) Kill() error {
	if v.cmd == nil {
		return nil
	}
	return v.cmd.Process.Signal(syscall.SIGKILL)
}
