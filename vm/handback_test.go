package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSerialDeviceOf(t *testing.T) {
	cases := []struct {
		reply, want string
		ok          bool
	}{
		{`[{"name": "virtio-serial", "path": "/machine/peripheral-anon/device[2]"}, {"name": "virtio-blk", "path": "/machine/peripheral-anon/device[1]"}]`, "/machine/peripheral-anon/device[2]", true},
		{`[{"name": "virtio-blk", "path": "/a"}]`, "", false},
		{`[{"name": "virtio-serial", "path": "/a"}, {"name": "virtio-serial", "path": "/b"}]`, "", false},
		{`[{"name": "virtio-serial", "path": ""}]`, "", false},
		{`[]`, "", false},
		{`{}`, "", false},
	}
	for _, c := range cases {
		got, err := serialDeviceOf(json.RawMessage(c.reply))
		if got != c.want || (err == nil) != c.ok {
			t.Errorf("%s: %q, %v; want %q, ok %v", c.reply, got, err, c.want, c.ok)
		}
	}
}

func TestUsedIndexOf(t *testing.T) {
	cases := []struct {
		reply string
		want  uint16
		ok    bool
	}{
		{`{"used-idx": 7, "last-avail-idx": 7, "queue-index": 3}`, 7, true},
		{`{"used-idx": 65535}`, 65535, true},
		{`{"used-idx": 65536}`, 0, false},
		{`{"used-idx": -1}`, 0, false},
		{`{"last-avail-idx": 7}`, 0, false},
		{`[]`, 0, false},
	}
	for _, c := range cases {
		got, err := usedIndexOf(json.RawMessage(c.reply))
		if got != c.want || (err == nil) != c.ok {
			t.Errorf("%s: %d, %v; want %d, ok %v", c.reply, got, err, c.want, c.ok)
		}
	}
}

// fakeQMP answers x-query-virtio-queue-status with the used indices of
// used, one per query (the last one again once they are used up), and
// writes events[i] before the answer to query i, if any. It returns the
// client end and a function returning how many queries came.
func fakeQMP(t *testing.T, used []int, events map[int]string) (*qmp, func() int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "qmp")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	client, server := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { client.Close(); server.Close() })
	queries := make(chan int, 1)
	queries <- 0
	go func() {
		sc := bufio.NewScanner(server)
		for sc.Scan() {
			var cmd struct {
				Execute string `json:"execute"`
			}
			_ = json.Unmarshal(sc.Bytes(), &cmd)
			if cmd.Execute != "x-query-virtio-queue-status" {
				fmt.Fprintf(server, `{"error": {"class": "CommandNotFound", "desc": "The command %s has not been found"}}`+"\n", cmd.Execute)
				continue
			}
			n := <-queries
			if ev, ok := events[n]; ok {
				fmt.Fprintln(server, ev)
			}
			fmt.Fprintf(server, `{"return": {"used-idx": %d}}`+"\n", used[min(n, len(used)-1)])
			queries <- n + 1
		}
	}()
	return &qmp{c: client, r: bufio.NewReader(client)}, func() int { n := <-queries; queries <- n; return n }
}

// TestAwaitHandBack: a hand-back ends once the control queue's used index
// has moved two from its value at the hang-up (the agent's close and its
// reopen), modulo 2^16, or at the port's event stamped after the hang-up
// that reports it open, if that comes first; a QEMU that does not report
// the index has the event waited for; an index that moves by the close
// alone, or never, ends the wait at its deadline with an error.
func TestAwaitHandBack(t *testing.T) {
	since := time.Unix(1796290515, 0)
	portEvent := fmt.Sprintf(`{"timestamp": {"seconds": %d, "microseconds": 0}, "event": "VSERPORT_CHANGE", "data": {"open": true, "id": %q}}`, since.Unix()+1, AgentPortID)
	closeEvent := fmt.Sprintf(`{"timestamp": {"seconds": %d, "microseconds": 0}, "event": "VSERPORT_CHANGE", "data": {"open": false, "id": %q}}`, since.Unix()+1, AgentPortID)
	oldEvent := fmt.Sprintf(`{"timestamp": {"seconds": %d, "microseconds": 0}, "event": "VSERPORT_CHANGE", "data": {"open": true, "id": %q}}`, since.Unix()-1, AgentPortID)
	cases := []struct {
		name    string
		sent    uint16
		used    []int
		events  map[int]string
		by      string
		queries int
	}{
		{"moved at once", 5, []int{7}, nil, byControlQueue, 1},
		{"the close, then the reopen", 5, []int{5, 6, 6, 7}, nil, byControlQueue, 4},
		{"wraps", 65535, []int{65535, 0, 1}, nil, byControlQueue, 3},
		{"the event first", 5, []int{6}, map[int]string{1: portEvent}, byPortEvent, 2},
		{"a close's event is not it", 5, []int{6, 6, 7}, map[int]string{0: closeEvent}, byControlQueue, 3},
		{"an older event is not it", 5, []int{5, 5, 7}, map[int]string{0: oldEvent}, byControlQueue, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q, queries := fakeQMP(t, c.used, c.events)
			by, err := (&VM{}).awaitHandBack(t.Context(), q, handBackMark{since: since, device: "/dev", sent: c.sent}, false)
			if err != nil || by != c.by || queries() != c.queries {
				t.Errorf("ended by %q after %d queries (%v), want %q after %d", by, queries(), err, c.by, c.queries)
			}
		})
	}
	for _, c := range []struct {
		name string
		used int
	}{{"never moves", 5}, {"the close alone", 6}} {
		t.Run(c.name, func(t *testing.T) {
			q, _ := fakeQMP(t, []int{c.used}, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			if _, err := (&VM{}).awaitHandBack(ctx, q, handBackMark{since: since, device: "/dev", sent: 5}, false); err == nil || !strings.Contains(err.Error(), "did not close and reopen its port") {
				t.Errorf("an index at %d after 5: %v", c.used, err)
			}
		})
	}
	t.Run("no index", func(t *testing.T) {
		q, _ := fakeQMP(t, []int{5}, nil)
		if _, err := serialDevice(t.Context(), q); err == nil || !strings.Contains(err.Error(), "CommandNotFound") {
			t.Fatalf("serialDevice on a QEMU without it: %v", err)
		}
	})
}
