package sshfront

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/testutil"
)

// dialAs connects to addr as a process running as uid does: from an OS
// thread of its own whose uids are all uid (a raw setresuid changes that
// thread only). The thread is never given back: it ends with its
// goroutine, and the runtime starts no thread from a locked one. The
// socket is made and connected on that thread, so the kernel records uid
// as its owner (TCP) and its peer (SO_PEERCRED). Root only.
func dialAs(t *testing.T, uid int, network, addr string) net.Conn {
	t.Helper()
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			ch <- result{err: os.NewSyscallError("setresuid", e)}
			return
		}
		c, err := net.DialTimeout(network, addr, 5*time.Second)
		ch <- result{c, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("connect as uid %d: %v", uid, r.err)
	}
	t.Cleanup(func() { r.c.Close() })
	return r.c
}

// silentAs is testFront.silent from a process running as uid.
func (tf *testFront) silentAs(t *testing.T, uid int) (net.Conn, error) {
	t.Helper()
	c := dialAs(t, uid, tf.network, tf.addr)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "SSH-2.0-vmgated\r\n" {
		return c, fmt.Errorf("no version string from the front door: %q, %v", line, err)
	}
	return c, nil
}

// gatedConn holds its writes until open is closed: a client whose login
// takes its time (a FIDO key's touch, a slow host) while it is pending.
type gatedConn struct {
	net.Conn
	open <-chan struct{}
}

func (g gatedConn) Write(b []byte) (int, error) {
	<-g.open
	return g.Conn.Write(b)
}

// TestPreauthFloodOverTCP_Isolated: over loopback TCP, a local process
// that floods the front door with connections that never authenticate
// displaces its own pending connections, not another user's pending
// login. Before, every local process was the peer 127.0.0.1: the flood's
// fourth connection displaced the waiting login, whose handshake then
// failed (issue 43, item 9). The peers are told apart by the owner of
// their client socket (/proc/net/tcp).
func TestPreauthFloodOverTCP_Isolated(t *testing.T) {
	testutil.RequiresRoot(t)
	const pending, flooder = 4, 65534
	tf := newTestFront(t, 1, "", func(c *Config) { c.MaxUnauthConns = pending })

	open := make(chan struct{})
	raw, err := net.DialTimeout(tf.network, tf.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(time.Minute))
	type login struct {
		cl  *ssh.Client
		err error
	}
	done := make(chan login, 1)
	go func() {
		cc, chans, reqs, err := ssh.NewClientConn(gatedConn{raw, open}, tf.addr, &ssh.ClientConfig{User: "agent",
			Auth: []ssh.AuthMethod{ssh.PublicKeys(tf.keys[0])}, HostKeyCallback: ssh.FixedHostKey(tf.hostPK)})
		if err != nil {
			done <- login{err: err}
			return
		}
		done <- login{cl: ssh.NewClient(cc, chans, reqs)}
	}()

	// The login waits (pending); the flood, accepted after it, takes
	// twice the pending budget.
	for i := range 2 * pending {
		if _, err := tf.silentAs(t, flooder); err != nil {
			t.Fatalf("flood connection %d: %v", i, err)
		}
	}
	close(open)
	lg := <-done
	if lg.err != nil {
		t.Fatalf("a pending login of uid %d was displaced by uid %d's flood over TCP: %v\n%s", os.Getuid(), flooder, lg.err, tf.logs)
	}
	defer lg.cl.Close()
	_ = raw.SetDeadline(time.Time{})
	mustRun(t, lg.cl, "echo after the flood")
	if logs := tf.logs.String(); !strings.Contains(logs, fmt.Sprintf(`closed_peer="uid %d"`, flooder)) || strings.Contains(logs, fmt.Sprintf(`closed_peer="uid %d"`, os.Getuid())) {
		t.Errorf("the flood's connections, and only those, should have made room:\n%s", logs)
	}
}

// TestPerUIDLimitUnix_SubUIDs_Isolated: on a unix: listener the per-uid
// bound counts a subordinate uid as its login (Config.CallerOf, the
// daemon's attribution), so that a login's subordinate uids share its
// bound instead of each having one, as on the local API; a uid whose
// caller cannot be told is closed at accept; uids of no login are their
// own. Without CallerOf each subordinate uid is a caller of its own.
func TestPerUIDLimitUnix_SubUIDs_Isolated(t *testing.T) {
	testutil.RequiresRoot(t)
	const login, unknown = 4242, 65531
	callerOf := func(uid uint32) (uint32, error) {
		switch {
		case uid == unknown:
			return 0, errors.New("uid 65531 is a subordinate uid of both a and b: the ranges overlap")
		case uid >= 65532 && uid <= 65534:
			return login, nil
		}
		return uid, nil
	}
	for _, fold := range []bool{true, false} {
		t.Run(fmt.Sprintf("fold=%v", fold), func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "ssh.sock")
			tf := newTestFront(t, 1, "unix:"+sock, func(c *Config) {
				c.MaxConnsPerUID, c.MaxUnauthConns = 2, 16
				if fold {
					c.CallerOf = callerOf
				}
			})
			// Let the other uids reach the socket.
			for _, p := range []string{filepath.Dir(dir), dir} {
				if err := os.Chmod(p, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(sock, 0o777); err != nil {
				t.Fatal(err)
			}
			for _, uid := range []int{65534, 65533} {
				if _, err := tf.silentAs(t, uid); err != nil {
					t.Fatalf("uid %d: %v", uid, err)
				}
			}
			third := dialAs(t, 65532, "unix", sock)
			if fold {
				if _, err := closedByServer(third); err != nil {
					t.Fatalf("a third subordinate uid of one login over its bound of 2: %v", err)
				}
				if _, err := closedByServer(dialAs(t, unknown, "unix", sock)); err != nil {
					t.Fatalf("a uid whose caller cannot be told: %v", err)
				}
			} else {
				_ = third.SetReadDeadline(time.Now().Add(10 * time.Second))
				if line, err := bufio.NewReader(third).ReadString('\n'); err != nil {
					t.Fatalf("without CallerOf a third uid has a bound of its own: %q, %v", line, err)
				}
			}
			cl, err := tf.login(t, 0) // root: no login's subordinate uid
			if err != nil {
				t.Fatal(err)
			}
			mustRun(t, cl, "echo root is its own caller")
			logs := tf.logs.String()
			if fold && (!strings.Contains(logs, fmt.Sprintf("uid=%d ran_as=65532 max=2", login)) || !strings.Contains(logs, "cannot tell who an SSH client is")) {
				t.Errorf("logs should name the login and the uid it ran as, and the refused unknown:\n%s", logs)
			}
		})
	}
}
