package gateway

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/transfer"
)

// putRules are a put's rules with room for the test trees.
var putRules = transfer.Rules{Dir: transfer.IntoGuest, Limits: transfer.Limits{MaxBytes: 1 << 20, MaxFiles: 10}, Top: "t"}

// tarOf is a tar stream of one file t/f holding body.
func tarOf(t *testing.T, body string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range []*tar.Header{{Name: "t/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "t/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := io.WriteString(tw, body); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// stalledClient is a put's pipe from a client that sends the start of a
// tree (the headers and part of a file) and then nothing, without going
// away. The frames it would send are dropped once the daemon closes the
// pipe.
func stalledClient(t *testing.T) *io.PipeReader {
	t.Helper()
	r, w := io.Pipe()
	stream := tarOf(t, string(bytes.Repeat([]byte("x"), 4096)))
	go func() { _, _ = w.Write(stream[:stalledBytes]) }()
	t.Cleanup(func() { w.Close() })
	return r
}

// stalledBytes is what a stalled client sends: the headers of t/ and
// t/f and half of t/f's data, all of which the checker passes on.
const stalledBytes = 3 * 1024

// relayed runs relayPut and returns its outcome, failing the test when it
// has not returned within limit: a put that never ends holds its VM and
// its request for ever.
func relayed(t *testing.T, src *io.PipeReader, stall time.Duration, guest func(io.Reader) error, limit time.Duration) (checked, error) {
	t.Helper()
	type result struct {
		c   checked
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := relayPut(src, putRules, stall, guest)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-time.After(limit):
		t.Fatalf("the put had not ended after %v", limit)
		return checked{}, nil
	}
}

// TestRelayPut_GuestEndsFirst: when the guest's put ends (its time limit
// killed it) while the client has stopped sending, the put ends at once:
// the client's side is closed rather than read for ever.
func TestRelayPut_GuestEndsFirst(t *testing.T) {
	guestDone := make(chan struct{})
	timedOut := errors.New("timed out")
	c, err := relayed(t, stalledClient(t), time.Hour, func(stdin io.Reader) error {
		// It reads all that the client sent, and waits for more until
		// its time limit ends it.
		if _, err := io.ReadFull(stdin, make([]byte, stalledBytes)); err != nil {
			t.Errorf("the guest's read: %v", err)
		}
		close(guestDone)
		return timedOut
	}, 10*time.Second)
	<-guestDone
	if !errors.Is(err, timedOut) || c.err == nil {
		t.Fatalf("guest %v, checker %v: want the guest's error and a broken stream", err, c.err)
	}
}

// TestRelayPut_ClientStalls: a client that sends none of a put's data
// for the stall time is gone: its stream breaks with that reason, the
// guest's put sees the broken stream, and the put ends, however long the
// command's own time limit.
func TestRelayPut_ClientStalls(t *testing.T) {
	var guestErr error
	c, err := relayed(t, stalledClient(t), 200*time.Millisecond, func(stdin io.Reader) error {
		_, guestErr = io.Copy(io.Discard, stdin) // a put reads until its stream ends
		return nil
	}, 10*time.Second)
	if err != nil || !errors.Is(c.err, errPutStalled) || guestErr == nil {
		t.Fatalf("guest %v (its read: %v), checker %v: want a checker error wrapping %v, seen by the guest", err, guestErr, c.err, errPutStalled)
	}
	if got := transferFailure(c.err, nil, nil, "put: unexpected EOF"); got != c.err.Error() {
		t.Errorf("the put's failure reads %q, want the stall: %q", got, c.err)
	}
}

// TestRelayPut_Whole: a client that sends a whole tree gets it checked
// and into the guest, with what it sends after the stream's end dropped
// once the guest is done.
func TestRelayPut_Whole(t *testing.T) {
	r, w := io.Pipe()
	go func() {
		_, _ = w.Write(tarOf(t, "hello"))
		w.Close()
	}()
	var got bytes.Buffer
	c, err := relayed(t, r, time.Hour, func(stdin io.Reader) error {
		_, err := io.Copy(&got, stdin)
		return err
	}, 10*time.Second)
	if err != nil || c.err != nil || c.sum.Files != 2 || c.sum.Bytes != 5 {
		t.Fatalf("guest %v, checker %v, summary %+v", err, c.err, c.sum)
	}
	tr := tar.NewReader(&got)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatal("the guest got no t/f")
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "t/f" {
			b, _ := io.ReadAll(tr)
			if string(b) != "hello" {
				t.Fatalf("t/f: %q", b)
			}
			return
		}
	}
}
