package testutil

import (
	"net"
	"sync"
	"testing"
)

// HoldConns accepts every connection on ln and keeps it open, unanswered,
// until the test ends: a peer that is there but says nothing (a daemon
// still starting, a netstack instance that never reads).
func HoldConns(t testing.TB, ln net.Listener) {
	t.Helper()
	var mu sync.Mutex
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
}
