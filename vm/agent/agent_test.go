package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/vm/agentproto"

	"github.com/vmgate/vmgate/internal/testutil"
)

func TestServeRejectsWrongClientKey(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	_, err := a.dialWith(clientConfig(agentproto.User, newSigner(t), a.hostKey.PublicKey()))
	if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("dial with an unknown key: err = %v, want authentication failure", err)
	}
	a.conn.Close()
	if err := a.waitServe(t); err == nil {
		t.Error("Serve returned nil after a failed handshake")
	}
}

func TestServeRejectsWrongUser(t *testing.T) {
	t.Parallel()
	for _, user := range []string{"root", agentproto.UnprivilegedUser, ""} {
		t.Run(user, func(t *testing.T) {
			a := startAgent(t, nil)
			_, err := a.dialWith(clientConfig(user, a.clientKey, a.hostKey.PublicKey()))
			if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
				t.Fatalf("dial as %q: err = %v, want authentication failure", user, err)
			}
		})
	}
}

func TestServeRejectsPasswordAuth(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	cfg := clientConfig(agentproto.User, a.clientKey, a.hostKey.PublicKey())
	cfg.Auth = []ssh.AuthMethod{ssh.Password("secret"), ssh.KeyboardInteractive(
		func(string, string, []string, []bool) ([]string, error) { return nil, nil })}
	if _, err := a.dialWith(cfg); err == nil {
		t.Fatal("password authentication succeeded")
	}
}

func TestClientRejectsWrongHostKey(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	_, err := a.dialWith(clientConfig(agentproto.User, a.clientKey, newSigner(t).PublicKey()))
	if err == nil || !strings.Contains(err.Error(), "host key mismatch") {
		t.Fatalf("dial pinning another host key: err = %v, want host key mismatch", err)
	}
}

func TestServeAcceptsAnyAuthorizedKey(t *testing.T) {
	t.Parallel()
	second := newSigner(t)
	a := startAgent(t, func(c *Config) {
		c.AuthorizedKeys = append(c.AuthorizedKeys, second.PublicKey())
	})
	c, err := a.dialWith(clientConfig(agentproto.User, second, a.hostKey.PublicKey()))
	if err != nil {
		t.Fatalf("dial with the second authorized key: %v", err)
	}
	c.Close()
}

func TestServeInvalidConfig(t *testing.T) {
	t.Parallel()
	key := newSigner(t)
	for name, cfg := range map[string]Config{
		"no host key":        {AuthorizedKeys: []ssh.PublicKey{key.PublicKey()}},
		"no authorized keys": {HostKey: key},
	} {
		server, peer := testutil.SocketPair(t)
		err := Serve(context.Background(), server, cfg)
		if err == nil {
			t.Errorf("%s: Serve returned nil", name)
		}
		// Serve closed its end: the peer sees EOF.
		_ = peer.SetReadDeadline(time.Now().Add(testTimeout))
		if _, err := peer.Read(make([]byte, 1)); err == nil {
			t.Errorf("%s: connection still open", name)
		}
		peer.Close()
	}
}

func TestServeReturnsNilWhenClientCloses(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	c := a.dial(t)
	c.Close()
	if err := a.waitServe(t); err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
}

func TestServeStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	c := a.dial(t)
	r := openSession(t, c)
	if !r.execSpec(t, agentproto.ExecSpec{Argv: []string{"sh", "-c", "echo $$; exec sleep 100"}}) {
		t.Fatal("exec rejected")
	}
	pid := waitPID(t, r)
	a.cancel()
	if err := a.waitServe(t); !errors.Is(err, context.Canceled) {
		t.Errorf("Serve = %v, want context.Canceled", err)
	}
	if !processGone(pid) {
		t.Errorf("command %d survived the end of Serve", pid)
	}
}

func TestServeRejectsOtherChannelTypes(t *testing.T) {
	t.Parallel()
	c := client(t)
	_, _, err := c.OpenChannel("direct-tcpip", nil)
	var oce *ssh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != ssh.UnknownChannelType {
		t.Fatalf("open direct-tcpip: err = %v, want UnknownChannelType", err)
	}
}

func TestServeRejectsUnknownGlobalRequests(t *testing.T) {
	t.Parallel()
	c := client(t)
	for _, name := range []string{"tcpip-forward", "keepalive@openssh.com", "no-such-request"} {
		ok, _, err := c.SendRequest(name, true, nil)
		if err != nil || ok {
			t.Errorf("%s: ok=%v err=%v, want rejection", name, ok, err)
		}
	}
}

func setTimePayload(doc string) []byte {
	return ssh.Marshal(agentproto.ExecPayload{JSON: doc})
}

func TestSetTime(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		got []time.Time
	)
	a := startAgent(t, func(c *Config) {
		c.setClock = func(tm time.Time) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, tm)
			return nil
		}
	})
	c := a.dial(t)
	want := time.Date(2031, 5, 6, 7, 8, 9, 123456789, time.UTC)
	doc, _ := json.Marshal(agentproto.SetTime{UnixNano: want.UnixNano()})
	ok, _, err := c.SendRequest(agentproto.SetTimeRequest, true, setTimePayload(string(doc)))
	if err != nil || !ok {
		t.Fatalf("set time: ok=%v err=%v", ok, err)
	}
	for _, bad := range [][]byte{
		nil,
		[]byte("garbage"),
		setTimePayload(`{"unix_nano": "soon"}`),
		setTimePayload(`{"unix_nano": 0}`),
		setTimePayload(`{"unix_nano": -5}`),
		setTimePayload(`{"unix_nano": 5, "zone": "UTC"}`),
		setTimePayload(`{"unix_nano": 5} {}`),
	} {
		ok, _, err := c.SendRequest(agentproto.SetTimeRequest, true, bad)
		if err != nil || ok {
			t.Errorf("set time with payload %q: ok=%v err=%v, want rejection", bad, ok, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || !got[0].Equal(want) {
		t.Errorf("clock set to %v, want exactly [%v]", got, want)
	}
}

func TestSetTimeReseeds(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		seeds [][]byte
	)
	a := startAgent(t, func(c *Config) {
		c.setClock = func(time.Time) error { return nil }
		c.reseed = func(b []byte) error {
			mu.Lock()
			defer mu.Unlock()
			seeds = append(seeds, b)
			return nil
		}
	})
	c := a.dial(t)
	seed := []byte("0123456789abcdef0123456789abcdef")
	doc, _ := json.Marshal(agentproto.SetTime{UnixNano: 1700000000000000000, Entropy: seed})
	if ok, _, err := c.SendRequest(agentproto.SetTimeRequest, true, setTimePayload(string(doc))); err != nil || !ok {
		t.Fatalf("set time with entropy: ok=%v err=%v", ok, err)
	}
	// No entropy: no reseed. Too much: refused, nothing done.
	doc, _ = json.Marshal(agentproto.SetTime{UnixNano: 1700000000000000000})
	if ok, _, err := c.SendRequest(agentproto.SetTimeRequest, true, setTimePayload(string(doc))); err != nil || !ok {
		t.Fatalf("set time: ok=%v err=%v", ok, err)
	}
	doc, _ = json.Marshal(agentproto.SetTime{UnixNano: 1700000000000000000, Entropy: make([]byte, agentproto.MaxEntropy+1)})
	if ok, _, err := c.SendRequest(agentproto.SetTimeRequest, true, setTimePayload(string(doc))); err != nil || ok {
		t.Fatalf("set time with too much entropy: ok=%v err=%v, want refusal", ok, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seeds) != 1 || string(seeds[0]) != string(seed) {
		t.Fatalf("reseeded with %q, want exactly [%q]", seeds, seed)
	}
}

func TestSetTimeLeavesARightClock(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	a := startAgent(t, func(c *Config) {
		c.setClock = func(time.Time) error { calls.Add(1); return nil }
	})
	c := a.dial(t)
	for _, off := range []time.Duration{0, 50 * time.Millisecond, -50 * time.Millisecond, time.Second} {
		doc, _ := json.Marshal(agentproto.SetTime{UnixNano: time.Now().Add(off).UnixNano()})
		if ok, _, err := c.SendRequest(agentproto.SetTimeRequest, true, setTimePayload(string(doc))); err != nil || !ok {
			t.Fatalf("offset %v: ok=%v err=%v", off, ok, err)
		}
	}
	if n := calls.Load(); n != 1 { // only the one-second offset
		t.Fatalf("clock set %d times, want 1", n)
	}
}

func TestSetTimeFailureRepliesFalse(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) {
		c.setClock = func(time.Time) error { return os.ErrPermission }
	})
	c := a.dial(t)
	ok, _, err := c.SendRequest(agentproto.SetTimeRequest, true, setTimePayload(`{"unix_nano": 1700000000000000000}`))
	if err != nil || ok {
		t.Fatalf("set time with a failing clock: ok=%v err=%v, want false", ok, err)
	}
}

func TestSetSystemClockUnprivileged(t *testing.T) {
	// Only safe where the call must fail: the tests never change the clock.
	if os.Geteuid() == 0 {
		t.Skip("running as root: setting the clock could succeed")
	}
	if err := setSystemClock(time.Now()); err == nil {
		t.Fatal("setSystemClock succeeded without privileges")
	}
}

func TestInfo(t *testing.T) {
	t.Parallel()
	c := client(t)
	ok, payload, err := c.SendRequest(agentproto.InfoRequest, true, nil)
	if err != nil || !ok {
		t.Fatalf("info: ok=%v err=%v", ok, err)
	}
	var p agentproto.ExecPayload
	if err := ssh.Unmarshal(payload, &p); err != nil {
		t.Fatalf("unmarshal info payload: %v", err)
	}
	var info agentproto.Info
	if err := json.Unmarshal([]byte(p.JSON), &info); err != nil {
		t.Fatalf("decode info %q: %v", p.JSON, err)
	}
	if info.AgentVersion != "test-version" {
		t.Errorf("AgentVersion = %q, want test-version", info.AgentVersion)
	}
	if info.Kernel == "" {
		t.Error("Kernel is empty")
	}
	if len(info.Features) != 1 || info.Features[0] != agentproto.FeatureTransfer {
		t.Errorf("Features = %q, want [%s]", info.Features, agentproto.FeatureTransfer)
	}
	if h, _ := os.Hostname(); info.Hostname != h {
		t.Errorf("Hostname = %q, want %q", info.Hostname, h)
	}
	if b, err := os.ReadFile(bootIDPath); err == nil && info.BootID != strings.TrimSpace(string(b)) {
		t.Errorf("BootID = %q, want %q", info.BootID, strings.TrimSpace(string(b)))
	}
}
