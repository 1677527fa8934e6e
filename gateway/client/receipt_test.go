package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
)

// fakeDaemon answers one exec on a Unix socket the way vmgated does:
// before answering it reads the request and the client's stdin, then
// either refuses (status != 0) or upgrades, sends stdout and a result.
type fakeDaemon struct {
	stdout []byte
	status int // refuse with this status and a denial
	// receipt makes the receipt from what the fake relayed.
	receipt func(stdin, stdout []byte) []byte
}

func (f *fakeDaemon) serve(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		hr, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		req, err := wire.DecodeExecRequest(hr.Body)
		if err != nil || !req.Receipt {
			fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
			return
		}
		if f.status != 0 {
			b, _ := json.Marshal(wire.Error{Code: wire.CodeDenied, Error: "no", RequestID: "r1", Receipt: f.receipt(nil, nil)})
			fmt.Fprintf(c, "HTTP/1.1 %d Forbidden\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", f.status, len(b), b)
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", wire.Upgrade)
		var stdin []byte
		for {
			typ, p, err := wire.ReadFrame(br)
			if err != nil || typ == wire.FrameStdinEOF {
				break
			}
			stdin = append(stdin, p...)
		}
		_ = wire.WriteFrame(c, wire.FrameStdout, f.stdout)
		_ = wire.WriteJSONFrame(c, wire.FrameResult, wire.Result{RequestID: "r1", ExitCode: 0, Receipt: f.receipt(stdin, f.stdout)})
	}()
	return sock
}

func signedBy(t *testing.T, k ed25519.PrivateKey, change func(*receipt.Body)) func(stdin, stdout []byte) []byte {
	return func(stdin, stdout []byte) []byte {
		code := 0
		b := &receipt.Body{RequestID: "r1", Verdict: receipt.VerdictAllow, ExitCode: &code,
			Stdin: receipt.StreamOf(stdin), Stdout: receipt.StreamOf(stdout), Stderr: receipt.StreamOf(nil)}
		if change != nil {
			change(b)
		}
		doc, err := receipt.Sign(k, b)
		if err != nil {
			t.Error(err)
		}
		return doc
	}
}

// TestExecReceiptCheck: the client keeps a receipt only when it agrees
// with the streams it received and sent; one that disagrees, is missing
// or unreadable is refused and removed; a denial's receipt comes with the
// refusal.
func TestExecReceiptCheck(t *testing.T) {
	k := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32))
	run := func(f *fakeDaemon) (*wire.Result, string, error) {
		c := New(f.serve(t))
		var out bytes.Buffer
		res, err := c.Exec(context.Background(), wire.ExecRequest{Argv: []string{"cat"}, Receipt: true},
			ExecIO{Stdin: strings.NewReader("input"), Stdout: &out})
		return res, out.String(), err
	}
	res, out, err := run(&fakeDaemon{stdout: []byte("hello"), receipt: signedBy(t, k, nil)})
	if err != nil || len(res.Receipt) == 0 || out != "hello" {
		t.Fatalf("agreeing receipt: %v %q", err, out)
	}
	for name, f := range map[string]*fakeDaemon{
		"stdout hash":   {stdout: []byte("hello"), receipt: signedBy(t, k, func(b *receipt.Body) { b.Stdout = receipt.StreamOf([]byte("hellO")) })},
		"stdin read":    {stdout: []byte("hello"), receipt: signedBy(t, k, func(b *receipt.Body) { b.Stdin = receipt.StreamOf([]byte("inpuT")) })},
		"exit code":     {stdout: []byte("hello"), receipt: signedBy(t, k, func(b *receipt.Body) { c := 1; b.ExitCode = &c })},
		"request id":    {stdout: []byte("hello"), receipt: signedBy(t, k, func(b *receipt.Body) { b.RequestID = "r2" })},
		"no receipt":    {stdout: []byte("hello"), receipt: func(_, _ []byte) []byte { return nil }},
		"not a receipt": {stdout: []byte("hello"), receipt: func(_, _ []byte) []byte { return []byte(`{"vmgate_receipt":1}`) }},
	} {
		res, _, err := run(f)
		var re *ReceiptError
		if !errors.As(err, &re) || res == nil || len(res.Receipt) != 0 {
			t.Errorf("%s: %v (result %v)", name, err, res)
		}
	}
	// A denial: the refusal carries its receipt, checked.
	_, _, err = run(&fakeDaemon{status: 403, receipt: signedBy(t, k, func(b *receipt.Body) {
		b.Verdict, b.ExitCode, b.Stdin, b.Stdout = receipt.VerdictDeny, nil, receipt.StreamOf(nil), receipt.StreamOf(nil)
	})})
	if !errors.Is(err, ErrDenied) || len(ReceiptOf(err)) == 0 {
		t.Fatalf("denial: %v, receipt %s", err, ReceiptOf(err))
	}
	_, _, err = run(&fakeDaemon{status: 403, receipt: signedBy(t, k, func(b *receipt.Body) { b.RequestID = "other" })})
	var re *ReceiptError
	if !errors.Is(err, ErrDenied) || !errors.As(err, &re) || len(ReceiptOf(err)) != 0 {
		t.Fatalf("denial with a wrong receipt: %v", err)
	}
}
