package relay

import (
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// tcpPair is a connected pair of loopback TCP connections.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// TestConns: a client's request crosses the relay, its half-close
// reaches the server, whose answer still comes back after it; the counts
// are the bytes of each way. A side that goes away ends the relay.
func TestConns(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	done := make(chan [2]int64, 1)
	go func() {
		ab, ba := Conns(a, b)
		done <- [2]int64{ab, ba}
	}()
	_ = server.SetDeadline(time.Now().Add(10 * time.Second))
	_ = client.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(client, "request"); err != nil {
		t.Fatal(err)
	}
	_ = client.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(server)
	if err != nil || string(got) != "request" {
		t.Fatalf("server read %q, %v (the half-close must reach it)", got, err)
	}
	answer := strings.Repeat("x", 100<<10)
	if _, err := io.WriteString(server, answer); err != nil {
		t.Fatal(err)
	}
	server.Close()
	back, err := io.ReadAll(client)
	if err != nil || string(back) != answer {
		t.Fatalf("client read %d bytes, %v", len(back), err)
	}
	select {
	case n := <-done:
		if n[0] != int64(len("request")) || n[1] != int64(len(answer)) {
			t.Errorf("counts %v, want [%d %d]", n, len("request"), len(answer))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not end with both directions")
	}
}

// TestConns_Cut: closing one relayed connection from elsewhere ends the
// relay, whatever its peers do.
func TestConns_Cut(t *testing.T) {
	_, a := tcpPair(t)
	b, _ := tcpPair(t)
	done := make(chan struct{})
	go func() {
		Conns(a, b)
		close(done)
	}()
	a.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not end when one side was closed")
	}
}

// TestConns_Linger: once one direction has ended, a peer that keeps the
// other open and silent holds the relay no longer than the linger, while
// one that still sends keeps it: only idleness ends it.
func TestConns_Linger(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	done := make(chan time.Time, 1)
	go func() {
		conns(a, b, 300*time.Millisecond)
		done <- time.Now()
	}()
	_ = client.(*net.TCPConn).CloseWrite() // the client is done; the server answers slowly
	go func() {
		for range 6 {
			if _, err := io.WriteString(server, "x"); err != nil {
				return
			}
			time.Sleep(150 * time.Millisecond)
		}
		// and then keeps its side open, silent
	}()
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(client)
	if string(got) != "xxxxxx" {
		t.Errorf("the client got %q while the server still sent, want all six bytes", got)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a silent peer held the relay after the other direction ended")
	}
}

// TestWith_Idle: a relay over which no byte moves either way for its idle
// bound ends (both directions, as an error would), and says so; one whose
// bytes keep moving, in either direction only, does not, and reports its
// activity, at most once per activeEvery.
func TestWith_Idle(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	var active atomic.Int32
	done := make(chan Result, 1)
	go func() { done <- With(a, b, Options{Idle: 400 * time.Millisecond, Active: func() { active.Add(1) }}) }()
	// The server alone talks, for longer than the idle bound: the
	// client's silent direction is not idle while the other moves.
	go func() {
		for range 8 {
			if _, err := io.WriteString(server, "x"); err != nil {
				return
			}
			time.Sleep(150 * time.Millisecond)
		}
	}()
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 8)
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatalf("the client got %q, %v while the server still sent", got, err)
	}
	t0 := time.Now()
	select {
	case r := <-done:
		if !r.Idle || r.BToA != 8 {
			t.Errorf("result %+v, want idle and 8 bytes", r)
		}
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("ended %v after the last byte", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an idle relay did not end")
	}
	if n := active.Load(); n < 1 || n > 3 {
		t.Errorf("Active called %d times over ~1.2 s of traffic", n)
	}
	// Both sides see the end.
	if _, err := client.Read(got); err == nil {
		t.Error("the client's side stays open after the idle end")
	}
}
