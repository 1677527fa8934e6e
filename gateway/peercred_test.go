package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/policy"
)

// fakeDB is a user database for attribute.
type fakeDB struct {
	users   []account
	groups  map[uint32]string
	members map[string][]string // account name → its groups, primary included
}

func (d fakeDB) byUID(uid uint32) (account, bool) {
	for _, a := range d.users {
		if a.UID == uid {
			return a, true
		}
	}
	return account{}, false
}

func (d fakeDB) byName(name string) (account, bool) {
	for _, a := range d.users {
		if a.Name == name {
			return a, true
		}
	}
	return account{}, false
}

func (d fakeDB) groupName(gid uint32) string { return d.groups[gid] }

func (d fakeDB) groupsOf(a account) []string { return d.members[a.Name] }

func TestAttribute(t *testing.T) {
	db := fakeDB{
		users: []account{{0, 0, "root"}, {999, 999, "vmgate"}, {1000, 1000, "alice"}, {1001, 1001, "bob"}},
		groups: map[uint32]string{0: "root", 999: "vmgate", 1000: "alice", 1001: "bob", 2000: "vmgate-users", 2001: "vmgate-admins",
			100000: "sub-named"},
		members: map[string][]string{"alice": {"alice", "vmgate-users"}, "bob": {"bob", "vmgate-users", "vmgate-admins"}},
	}
	debian := []subRange{{"alice", 100000, 65536}, {"1001", 165536, 65536}, {"root", 300000, 65536}, {"vmgate", 400000, 65536},
		{"ghost", 500000, 10}, {"bob", 600000, 10}, {"alice", 600005, 10}, {"alice", 700000, 10}, {"1000", 700005, 10}}
	const daemon = 999
	tests := []struct {
		name    string
		cred    peerCred
		ranges  []subRange
		rangErr error
		want    policy.Identity
		err     string
	}{
		{"account: its own groups, as the kernel reports them", peerCred{UID: 1000, GID: 1000, PID: 7, Groups: []uint32{2000, 2001, 4242}}, debian, nil,
			policy.Identity{UID: 1000, GID: 1000, PID: 7, User: "alice", Group: "alice", Groups: []string{"vmgate-users", "vmgate-admins"}}, ""},
		{"account: no groups held, none given", peerCred{UID: 1000, GID: 1000, PID: 7}, debian, nil,
			policy.Identity{UID: 1000, GID: 1000, PID: 7, User: "alice", Group: "alice"}, ""},
		{"account: the ranges are not read", peerCred{UID: 1001, GID: 2000}, nil, errors.New("unreadable"),
			policy.Identity{UID: 1001, GID: 2000, User: "bob", Group: "vmgate-users"}, ""},
		{"subordinate uid in a user namespace is its login", peerCred{UID: 100004, GID: 100004, PID: 8, Groups: []uint32{2000}}, debian, nil,
			policy.Identity{UID: 1000, GID: 1000, PID: 8, User: "alice", Group: "alice", Groups: []string{"alice", "vmgate-users"}, SubUID: 100004}, ""},
		{"the last subordinate uid", peerCred{UID: 165535, GID: 2000}, debian, nil,
			policy.Identity{UID: 1000, GID: 1000, User: "alice", Group: "alice", Groups: []string{"alice", "vmgate-users"}, SubUID: 165535}, ""},
		{"the login's groups, not the process's", peerCred{UID: 100000, GID: 2001, Groups: []uint32{2001}}, debian, nil,
			policy.Identity{UID: 1000, GID: 1000, User: "alice", Group: "alice", Groups: []string{"alice", "vmgate-users"}, SubUID: 100000}, ""},
		{"owner named by uid", peerCred{UID: 165536, GID: 165536}, debian, nil,
			policy.Identity{UID: 1001, GID: 1001, User: "bob", Group: "bob", Groups: []string{"bob", "vmgate-users", "vmgate-admins"}, SubUID: 165536}, ""},
		{"two ranges of one login, by name and by uid", peerCred{UID: 700007}, debian, nil,
			policy.Identity{UID: 1000, GID: 1000, User: "alice", Group: "alice", Groups: []string{"alice", "vmgate-users"}, SubUID: 700007}, ""},
		{"root's range is not root", peerCred{UID: 300001, GID: 300001, Groups: []uint32{2000}}, debian, nil,
			policy.Identity{UID: 300001, GID: 300001, Groups: []string{"vmgate-users"}}, ""},
		{"the daemon's range is not the daemon", peerCred{UID: 400001, GID: 2000}, debian, nil,
			policy.Identity{UID: 400001, GID: 2000, Group: "vmgate-users"}, ""},
		{"no account, no range: a caller of its own without an account", peerCred{UID: 250000, GID: 100000, Groups: []uint32{2000}}, debian, nil,
			policy.Identity{UID: 250000, GID: 100000, Group: "sub-named", Groups: []string{"vmgate-users"}}, ""},
		{"no ranges at all", peerCred{UID: 100004, GID: 2000}, nil, nil,
			policy.Identity{UID: 100004, GID: 2000, Group: "vmgate-users"}, ""},
		{"owner without an account", peerCred{UID: 500001}, debian, nil, policy.Identity{},
			`uid 500001 is a subordinate uid of "ghost" (500000-500009), which has no account`},
		{"ranges of two logins", peerCred{UID: 600007}, debian, nil, policy.Identity{},
			"uid 600007 is a subordinate uid of both bob and alice: the ranges overlap"},
		{"ranges unreadable", peerCred{UID: 100004}, nil, errors.New("permission denied"), policy.Identity{},
			"uid 100004 has no account, and the subordinate uid ranges that would name its login cannot be read: permission denied"},
		{"too many groups", peerCred{UID: 1000, Groups: make([]uint32, maxPeerGroups+1)}, debian, nil, policy.Identity{},
			"uid 1000 holds 4097 supplementary groups"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			read := false
			ranges := func() ([]subRange, error) { read = true; return tt.ranges, tt.rangErr }
			id, err := attribute(tt.cred, db, ranges, daemon)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(id, tt.want) {
				t.Errorf("identity\n %+v, want\n %+v", id, tt.want)
			}
			if _, has := db.byUID(tt.cred.UID); has && read {
				t.Error("the ranges were read for a uid with an account")
			}
		})
	}
}

// TestAttributeRootWithoutAccount: a user database without root does not
// make uid 0 a login's subordinate uid (Identity.SubUID 0 means "not
// folded").
func TestAttributeRootWithoutAccount(t *testing.T) {
	db := fakeDB{users: []account{{1000, 1000, "alice"}}}
	ranges := func() ([]subRange, error) { return []subRange{{"alice", 0, 10}}, nil }
	if id, err := attribute(peerCred{UID: 0}, db, ranges, 999); err == nil || err.Error() != "uid 0 has no account and is in a subordinate range of alice" {
		t.Fatalf("%+v %v", id, err)
	}
}

// TestAttributeAndPolicy: the attack of issue 30, finding 6, against a
// policy with a catch-all: 65,536 subordinate uids of one login are one
// caller, and a uid without an account gets nothing from match.any.
func TestAttributeAndPolicy(t *testing.T) {
	p, err := policy.Parse("p.toml", []byte("version = 1\n[[profile]]\nname = \"all\"\nmatch = { any = true }\n"))
	if err != nil {
		t.Fatal(err)
	}
	db := fakeDB{users: []account{{1000, 1000, "alice"}}, groups: map[uint32]string{2000: "vmgate-users"}}
	ranges := func() ([]subRange, error) { return []subRange{{"alice", 100000, 65536}}, nil }
	keys := map[string]bool{}
	for _, uid := range []uint32{1000, 100000, 100001, 123456, 165535} {
		id, err := attribute(peerCred{UID: uid, GID: 2000, Groups: []uint32{2000}}, db, ranges, 999)
		if err != nil {
			t.Fatal(err)
		}
		if v := p.Decide(id, policy.Request{Argv: []string{"true"}}); !v.Allowed {
			t.Errorf("uid %d: %s", uid, v.Reason)
		}
		keys[id.Key()] = true
	}
	if len(keys) != 1 || !keys["uid:1000"] {
		t.Errorf("caller keys %v, want only uid:1000", keys)
	}
	id, err := attribute(peerCred{UID: 165536, GID: 2000, Groups: []uint32{2000}}, db, ranges, 999)
	if err != nil {
		t.Fatal(err)
	}
	if v := p.Decide(id, policy.Request{Argv: []string{"true"}}); v.Allowed || !strings.Contains(v.Reason, "match.any takes only callers whose uid has an account") {
		t.Errorf("uid 165536, no account and no range: %+v", v)
	}
}

// TestPeerGroups: SO_PEERGROUPS reports the groups the connecting process
// holds, which the identity of a caller with an account carries.
func TestPeerGroups(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cred, err := readPeerCred(c)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, g := range cred.Groups {
		got = append(got, int(g))
	}
	slices.Sort(got)
	slices.Sort(want)
	if cred.UID != uint32(os.Geteuid()) || cred.GID != uint32(os.Getegid()) || cred.PID != int32(os.Getpid()) || !slices.Equal(got, want) {
		t.Errorf("peer %+v, want uid %d gid %d pid %d groups %v", cred, os.Geteuid(), os.Getegid(), os.Getpid(), want)
	}
}

// TestUnidentifiedRefused: a connection whose caller cannot be attributed
// is answered 401 with the cause at accept and closed; it is never served
// and takes no place in any uid's count.
func TestUnidentifiedRefused(t *testing.T) {
	dir := t.TempDir()
	subuids := filepath.Join(dir, "subuid")
	if err := os.WriteFile(subuids, []byte("ghost:0:4294967295\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	l := newUIDLimitListener(ln, 1, log)
	l.peers = newPeerResolver(subuids, log)
	l.peers.db = fakeDB{} // no accounts: the test's uid is one of ghost's
	srv := &http.Server{ConnContext: connContext, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("served %s", r.URL)
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	for range 3 { // more than the per-uid bound: none of them counts
		c, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: vmgated\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		c.Close()
		want := fmt.Sprintf(`vmgated cannot identify the caller: uid %d is a subordinate uid of \"ghost\" (0-4294967294), which has no account`, os.Geteuid())
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), want) || !strings.Contains(string(body), `"code":"denied"`) {
			t.Fatalf("answer %d %s, want 401 with %s", resp.StatusCode, body, want)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.open) != 0 {
		t.Errorf("refused connections counted: %v", l.open)
	}
}

// TestCallerOf: the SSH front door's unix: listener counts a subordinate
// uid as its login, as the socket does (attribute), and any other uid as
// itself; a uid that two logins' ranges hold is an error.
func TestCallerOf(t *testing.T) {
	db := fakeDB{users: []account{{0, 0, "root"}, {1000, 1000, "alice"}, {1001, 1001, "bob"}}}
	ranges := []subRange{{"alice", 100000, 65536}, {"bob", 100010, 10}}
	r := &peerResolver{db: db, daemonUID: 999, log: slog.New(slog.DiscardHandler)}
	r.subUIDs = &subUIDFile{path: filepath.Join(t.TempDir(), "subuid")}
	var b strings.Builder
	for _, rg := range ranges {
		fmt.Fprintf(&b, "%s:%d:%d\n", rg.Owner, rg.First, rg.Count)
	}
	if err := os.WriteFile(r.subUIDs.path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for uid, want := range map[uint32]uint32{1000: 1000, 0: 0, 100001: 1000, 4242: 4242} {
		if got, err := r.callerOf(uid); err != nil || got != want {
			t.Errorf("callerOf(%d) = %d, %v; want %d", uid, got, err, want)
		}
	}
	if got, err := r.callerOf(100011); err == nil {
		t.Errorf("a uid of two logins' ranges counts as %d", got)
	}
}
