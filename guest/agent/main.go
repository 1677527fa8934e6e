package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// Timing of the port handling in Main.
const (
	// portWaitTimeout is how long Main waits for the port device to appear.
	portWaitTimeout = 60 * time.Second
	// portRetryInterval is the pause between looks for the port device.
	portRetryInterval = 200 * time.Millisecond
	// hostPollInterval is the pause between polls while no host is
	// connected, on a device that does not wake a waiting agent.
	hostPollInterval = 30 * time.Millisecond
	// hostRecheck bounds the wait for a host between two checks on a
	// device that wakes a waiting agent (waitHostEvent): a safety net,
	// logged when it finds a host. Each check wakes the idle guest, and
	// under TCG a wake-up of the agent's runtime costs 1-14 ms of CPU: at
	// 250 ms that was 1-3 % of a core for every idle VM, and a template
	// saved just before a check made each of its clones run it during
	// their first contact (docs/benchmarks.md, "The agent step, fixed").
	hostRecheck = 2 * time.Second
	// minRetryDelay and maxRetryDelay bound the pause after a connection
	// that ended without a hello, so that a misbehaving peer cannot make
	// the agent spin.
	minRetryDelay = 50 * time.Millisecond
	maxRetryDelay = time.Second
	// procCloseWait bounds the wait for the background processes killed
	// when Main returns.
	procCloseWait = 5 * time.Second
)

// defaultPortPaths are the places where the agent port device shows up.
var defaultPortPaths = portPaths{
	sysClass: "/sys/class/virtio-ports",
	devDir:   "/dev",
	fallback: "/dev/virtio-ports/" + agentproto.PortName,
}

// Main runs the guest agent daemon until ctx is done. It opens the
// virtio-serial port named agentproto.PortName, waiting up to a minute for
// it to appear, and then serves one host connection after another on it
// with [Serve], opening the device afresh for each (see devicePort). A nil
// log means slog.Default(); version is reported to the host.
//
// Main returns nil once ctx is done, or an error if it cannot start or the
// port device fails.
func Main(ctx context.Context, log *slog.Logger, version string) error {
	if log == nil {
		log = slog.Default()
	}
	open := func() (*os.File, error) {
		return openPort(ctx, defaultPortPaths, portWaitTimeout, portRetryInterval)
	}
	f, err := open()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if err := f.SetDeadline(time.Time{}); errors.Is(err, os.ErrNoDeadline) {
		log.Warn("port device does not support deadlines; ending a connection may have to wait for the host", "port", f.Name())
	}
	log.Info("agent listening", "version", version, "port", f.Name(), "protocol", agentproto.Protocol)

	port := &devicePort{f: f, reopen: open, interval: hostPollInterval, recheck: hostRecheck, log: log}
	defer port.close()
	// The background processes are the agent's: they outlive each host
	// connection, not the agent (the guest is going down, or a restart
	// would find no table to reach them by).
	procs := newProcTable(log)
	defer procs.close(procCloseWait)
	cfg := Config{Logger: log, Version: version, procs: procs}
	if rd, err := openRandomDevice(); err != nil {
		log.Warn("each reseed opens /dev/urandom", "err", err)
	} else {
		defer rd.close()
		cfg.reseed = rd.reseed
	}
	err = servePort(ctx, port, cfg)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// portPaths says where the agent port device is looked for.
type portPaths struct {
	sysClass string // directory of virtio port attributes (sysfs)
	devDir   string // directory of the device nodes
	fallback string // udev's stable name for the port
}

// errPortNotFound reports that no virtio port named agentproto.PortName
// exists yet.
var errPortNotFound = errors.New("virtio port " + agentproto.PortName + " not found")

// findPort returns the device path of the port named agentproto.PortName:
// the devDir node of the sysClass entry whose name attribute matches, or the
// fallback path.
func findPort(p portPaths) (string, error) {
	entries, _ := os.ReadDir(p.sysClass)
	for _, e := range entries {
		name, err := os.ReadFile(filepath.Join(p.sysClass, e.Name(), "name"))
		if err != nil || strings.TrimSpace(string(name)) != agentproto.PortName {
			continue
		}
		dev := filepath.Join(p.devDir, e.Name())
		if _, err := os.Stat(dev); err == nil {
			return dev, nil
		}
	}
	if _, err := os.Stat(p.fallback); err == nil {
		return p.fallback, nil
	}
	return "", errPortNotFound
}

// openPort opens the port device read-write, retrying every interval until
// it exists and can be opened, for at most timeout.
func openPort(ctx context.Context, p portPaths, timeout, interval time.Duration) (*os.File, error) {
	deadline := time.Now().Add(timeout)
	for {
		path, err := findPort(p)
		if err == nil {
			f, openErr := os.OpenFile(path, os.O_RDWR, 0)
			if openErr == nil {
				return f, nil
			}
			err = openErr
		}
		if !time.Now().Before(deadline) {
			return nil, fmt.Errorf("open agent port: %w", err)
		}
		if err := sleep(ctx, interval); err != nil {
			return nil, err
		}
	}
}

// sleep pauses for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// hostPort is a transport on which hosts connect one after another.
type hostPort interface {
	// accept waits until a host is connected and returns the connection to
	// serve; Serve closes it.
	accept(ctx context.Context) (net.Conn, error)
}

// servePort serves host connections on p one after another until ctx is
// done or p fails.
func servePort(ctx context.Context, p hostPort, cfg Config) error {
	log := cfg.logger()
	var delay time.Duration
	for {
		conn, err := p.accept(ctx)
		if err != nil {
			return err
		}
		handshakeDone, err := serve(ctx, conn, cfg)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			log.Warn("host connection ended", "err", err)
		}
		if handshakeDone {
			delay = 0
			continue
		}
		delay = min(max(2*delay, minRetryDelay), maxRetryDelay)
		if err := sleep(ctx, delay); err != nil {
			return err
		}
	}
}

// devicePort is the virtio-serial port device, opened once per host
// connection.
//
// Linux's virtio_console driver hands a port's incoming data to readers
// as soon as its interrupt arrives, but applies the host's open and close
// (VIRTIO_CONSOLE_PORT_OPEN control messages) later, from a work queue.
// So the first bytes of a host that has just connected can be readable
// while poll still reports POLLHUP ("no host"). Bytes that arrive while
// the port reports POLLHUP therefore belong to the next connection and
// are never read or discarded before it is served (discarding them here
// once lost the host's SSH banner; docs/fast-path.md).
//
// Nothing of a connection that ended may reach the next one, so accept
// closes the device and opens it again between connections: closing
// makes the driver drop whatever the guest still holds for the port and
// tells QEMU that no guest reader is there (QEMU then leaves the next
// host's bytes in its socket until the port is open again); opening it
// again makes QEMU report the port open on QMP (VSERPORT_CHANGE), which
// is how the host knows the agent is ready for a new connection.
type devicePort struct {
	f        *os.File
	reopen   func() (*os.File, error)
	interval time.Duration // between polls, on a device that does not wake the agent
	recheck  time.Duration // between checks, on one that does
	log      *slog.Logger  // nil: no log
	last     *fileConn     // the previous connection, if any
}

func (p *devicePort) accept(ctx context.Context) (net.Conn, error) {
	if p.last != nil {
		// No goroutine of the previous connection may still use the
		// device when it is closed.
		p.last.release()
		p.last = nil
		if err := p.f.Close(); err != nil {
			return nil, fmt.Errorf("close agent port: %w", err)
		}
		f, err := p.reopen()
		if err != nil {
			p.f = nil
			return nil, err
		}
		p.f = f
	}
	missed, err := waitHostEvent(ctx, p.f, p.recheck)
	if missed && p.log != nil {
		p.log.Warn("the port did not wake the agent when the host connected; the periodic check found it", "recheck", p.recheck)
	}
	if errors.Is(err, errors.ErrUnsupported) {
		err = waitHost(ctx, func() (bool, error) { return pollHangup(p.f) }, p.interval)
	}
	if err != nil {
		return nil, err
	}
	c, err := newFileConn(p.f)
	if err != nil {
		return nil, err
	}
	p.last = c
	return c, nil
}

// close releases the last connection and closes the device.
func (p *devicePort) close() {
	if p.last != nil {
		p.last.release()
		p.last = nil
	}
	if p.f != nil {
		_ = p.f.Close()
		p.f = nil
	}
}

// waitHost calls hangup every interval until it reports that the peer is
// connected (false), it fails or ctx is done.
func waitHost(ctx context.Context, hangup func() (bool, error), interval time.Duration) error {
	for {
		hup, err := hangup()
		if err != nil {
			return err
		}
		if !hup {
			return nil
		}
		if err := sleep(ctx, interval); err != nil {
			return err
		}
	}
}

// fileConn is a net.Conn for one connection over a long-lived *os.File.
// Close does not close the file: it only makes pending and future I/O of
// this connection fail, by setting a deadline in the past.
type fileConn struct {
	f      *os.File
	closed atomic.Bool
	// inUse is read-locked during every Read and Write, so that release
	// can wait for them to return.
	inUse sync.RWMutex
	// deadlineMu orders Close against the Set*Deadline methods so that
	// no deadline can be set once Close has interrupted the I/O.
	deadlineMu sync.Mutex
}

// newFileConn clears the deadlines of f and wraps it.
func newFileConn(f *os.File) (*fileConn, error) {
	if err := f.SetDeadline(time.Time{}); err != nil && !errors.Is(err, os.ErrNoDeadline) {
		return nil, fmt.Errorf("reset port deadline: %w", err)
	}
	return &fileConn{f: f}, nil
}

// Read reads from the port. EOF means the host hung up (the port reads 0
// only while no host is connected and nothing is buffered): the
// connection is then over, and Read closes it at once. A write still
// waiting would otherwise wait for ever, because a virtio-serial port
// blocks writers while no host is connected; its goroutine holds the
// connection's write lock (package agentconn: one frame at a time), the
// connection could never finish, and the next host would receive the
// bytes that write was still holding.
func (c *fileConn) Read(b []byte) (int, error) {
	c.inUse.RLock()
	defer c.inUse.RUnlock()
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	n, err := c.f.Read(b)
	if errors.Is(err, io.EOF) {
		_ = c.Close()
	}
	return n, err
}

func (c *fileConn) Write(b []byte) (int, error) {
	c.inUse.RLock()
	defer c.inUse.RUnlock()
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	return c.f.Write(b)
}

// Close ends the connection; the file stays open.
func (c *fileConn) Close() error {
	c.deadlineMu.Lock()
	defer c.deadlineMu.Unlock()
	if c.closed.Swap(true) {
		return nil
	}
	if err := c.f.SetDeadline(time.Unix(1, 0)); err != nil {
		return fmt.Errorf("interrupt port i/o: %w", err)
	}
	return nil
}

// release closes the connection and waits until no Read or Write of it is
// in progress.
func (c *fileConn) release() {
	_ = c.Close()
	c.inUse.Lock()
	defer c.inUse.Unlock()
}

func (c *fileConn) LocalAddr() net.Addr  { return portAddr(c.f.Name()) }
func (c *fileConn) RemoteAddr() net.Addr { return portAddr("host") }

func (c *fileConn) SetDeadline(t time.Time) error      { return c.setDeadline(c.f.SetDeadline, t) }
func (c *fileConn) SetReadDeadline(t time.Time) error  { return c.setDeadline(c.f.SetReadDeadline, t) }
func (c *fileConn) SetWriteDeadline(t time.Time) error { return c.setDeadline(c.f.SetWriteDeadline, t) }

func (c *fileConn) setDeadline(set func(time.Time) error, t time.Time) error {
	c.deadlineMu.Lock()
	defer c.deadlineMu.Unlock()
	if c.closed.Load() {
		return net.ErrClosed
	}
	return set(t)
}

// portAddr is the net.Addr of a fileConn end.
type portAddr string

func (a portAddr) Network() string { return "virtio-serial" }
func (a portAddr) String() string  { return string(a) }
