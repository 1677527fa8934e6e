package gateway

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/internal/reexec"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/policy"
)

// peerRole is the re-exec role of a test peer: it connects to the socket
// args[0], asks for the path args[1] and prints the answer's status and
// body.
const peerRole = "gateway-test-peer"

func init() {
	reexec.Register(peerRole, func(args []string) error {
		if len(args) != 2 {
			return fmt.Errorf("want SOCKET PATH, got %q", args)
		}
		c, err := net.Dial("unix", args[0])
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: vmgated\r\n\r\n", args[1]); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		fmt.Printf("%d %s", resp.StatusCode, body)
		return nil
	})
}

// peerServer serves, on a socket anyone may connect to, the daemon's
// listener and ConnContext with a handler that sends each request's
// identity on ids; a request for /hold then waits for release.
type peerServer struct {
	sock    string
	ids     chan policy.Identity
	release chan struct{}
}

func servePeers(t *testing.T, dir, subuids string, maxConns int) *peerServer {
	t.Helper()
	s := &peerServer{sock: filepath.Join(dir, fmt.Sprintf("s%d.sock", maxConns)), ids: make(chan policy.Identity, 8), release: make(chan struct{})}
	ln, err := net.Listen("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(s.sock, 0o777); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	l := newUIDLimitListener(ln, maxConns, log)
	l.peers = newPeerResolver(subuids, log)
	srv := &http.Server{ConnContext: connContext, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := identityFrom(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		s.ids <- id
		if r.URL.Path == "/hold" {
			<-s.release
		}
		fmt.Fprint(w, "ok")
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

// TestPeerIdentity_SubordinateUID_Isolated runs peers as subordinate uids
// of a login, as `unshare --user --map-auto` and `setpriv --reuid=N` do
// (issue 30, finding 6), and checks that the daemon's listener and
// ConnContext see the login: inside a user namespace, in the host's
// namespace (a set-user-ID file made in such a namespace gets there),
// and that the login's subordinate uids share its connection bound. A
// uid without an account and outside every range stays itself, with no
// user name.
func TestPeerIdentity_SubordinateUID_Isolated(t *testing.T) {
	testutil.RequiresRoot(t)
	owner, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("the test needs the nobody account: %v", err)
	}
	ownerUID, _ := strconv.ParseUint(owner.Uid, 10, 32)
	ownerGID, _ := strconv.ParseUint(owner.Gid, 10, 32)
	// What the resolver should give for the login: its account's groups.
	login, ok := userDB{}.byUID(uint32(ownerUID))
	if !ok {
		t.Fatal("no account for nobody's uid")
	}
	loginGroups := userDB{}.groupsOf(login)

	dir := t.TempDir()
	for d := dir; d != filepath.Dir(d) && d != os.TempDir(); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	subuids := filepath.Join(dir, "subuid")
	if err := os.WriteFile(subuids, []byte("nobody:200000:100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := testutil.ForOthers(t, exe)
	peer := func(sock, path string, attr *syscall.SysProcAttr) *exec.Cmd {
		cmd := exec.Command(bin, sock, path)
		cmd.Env = reexec.ChildCommandEnv(os.Environ(), peerRole)
		cmd.SysProcAttr = attr
		cmd.Stderr = os.Stderr
		return cmd
	}
	// inUserNS: uid 5 of a user namespace whose uid 0 is the login and
	// whose uids 1-99 are its subordinate uids, as newuidmap maps them: the
	// process runs as host uid 200004.
	inUserNS := func() *syscall.SysProcAttr {
		return &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(ownerUID), Size: 1}, {ContainerID: 1, HostID: 200000, Size: 99}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(ownerGID), Size: 1}, {ContainerID: 1, HostID: 200000, Size: 99}},
			Credential:  &syscall.Credential{Uid: 5, Gid: 5, NoSetGroups: true},
		}
	}
	// hostNS: uid in the host's user namespace, holding group 0 (root),
	// which the login's account does not list: a folded caller has its
	// login's groups, not the ones its process holds.
	hostNS := func(uid uint32) *syscall.SysProcAttr {
		return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{0}}}
	}
	folded := func(sub uint32) policy.Identity {
		return policy.Identity{UID: uint32(ownerUID), GID: uint32(ownerGID), User: owner.Username, Group: userDB{}.groupName(uint32(ownerGID)),
			Groups: loginGroups, SubUID: sub}
	}

	s := servePeers(t, dir, subuids, 64)
	for _, tt := range []struct {
		name string
		attr *syscall.SysProcAttr
		want policy.Identity
	}{
		{"subordinate uid in a user namespace", inUserNS(), folded(200004)},
		{"subordinate uid in the host's namespace", hostNS(200007), folded(200007)},
		{"uid without an account or a range", hostNS(300000), policy.Identity{UID: 300000, GID: 300000, Group: userDB{}.groupName(300000),
			Groups: []string{userDB{}.groupName(0)}}},
	} {
		cmd := peer(s.sock, "/", tt.attr)
		out, err := cmd.Output()
		if err != nil || string(out) != "200 ok" {
			t.Fatalf("%s: %q %v", tt.name, out, err)
		}
		id := <-s.ids
		if id.PID != int32(cmd.Process.Pid) {
			t.Errorf("%s: pid %d, want %d", tt.name, id.PID, cmd.Process.Pid)
		}
		id.PID = 0
		if !reflect.DeepEqual(id, tt.want) {
			t.Errorf("%s: identity\n %+v, want\n %+v", tt.name, id, tt.want)
		}
	}

	// One connection per uid: a subordinate uid's connection counts as
	// its login's, and another subordinate uid finds the bound taken.
	s = servePeers(t, dir, subuids, 1)
	holder := peer(s.sock, "/hold", inUserNS())
	var held strings.Builder
	holder.Stdout = &held
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	defer func() {
		if !waited {
			close(s.release)
			_ = holder.Wait()
		}
	}()
	if id := <-s.ids; id.UID != uint32(ownerUID) {
		t.Fatalf("holder: %+v", id)
	}
	out, err := peer(s.sock, "/", hostNS(200008)).Output()
	want := fmt.Sprintf(`503 {"code":"busy","error":"uid %d has 1 connections open to vmgated`, ownerUID)
	if err != nil || !strings.HasPrefix(string(out), want) {
		t.Errorf("second subordinate uid while the first holds its login's connection: %q %v, want %s…", out, err, want)
	}
	close(s.release)
	waited = true
	if err := holder.Wait(); err != nil || held.String() != "200 ok" {
		t.Errorf("holder: %q %v", held.String(), err)
	}
}
