package relay

import (
	"io"
	"net"
	"strings"
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
