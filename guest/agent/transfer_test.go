package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/transfer"
)

func TestTransferPutThenGet(t *testing.T) {
	src := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(src, []byte("kept\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var tarball bytes.Buffer
	if _, err := transfer.Pack(&tarball, src, transfer.Rules{Dir: transfer.IntoGuest, Limits: transfer.Limits{MaxBytes: 100, MaxFiles: 1}}); err != nil {
		t.Fatal(err)
	}
	guest := t.TempDir()
	var stderr bytes.Buffer
	argv := agentproto.PutArgv(guest+"/work/", "notes.txt", 100, 1)
	if code := Transfer(argv[1:], &tarball, nil, &stderr); code != 0 {
		t.Fatalf("put: exit %d: %s", code, stderr.String())
	}
	if b, err := os.ReadFile(filepath.Join(guest, "work/notes.txt")); err != nil || string(b) != "kept\n" {
		t.Fatalf("put wrote %q, %v", b, err)
	}

	var out bytes.Buffer
	argv = agentproto.GetArgv(filepath.Join(guest, "work"), 100, 2)
	if code := Transfer(argv[1:], nil, &out, &stderr); code != 0 {
		t.Fatalf("get: exit %d: %s", code, stderr.String())
	}
	sum, err := transfer.Check(&out, &bytes.Buffer{}, transfer.Rules{Limits: transfer.Limits{MaxBytes: 100, MaxFiles: 2}, Top: "work"})
	if err != nil || sum.Files != 2 {
		t.Fatalf("get's stream: %+v, %v", sum, err)
	}
}

func TestTransferErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		argv []string
		code int
		want string
	}{
		{"missing path", agentproto.GetArgv(filepath.Join(dir, "nope"), 10, 10), 1, "no such file or directory"},
		{"over the limit", agentproto.GetArgv(dir, 10, 0), 1, "more than 0 files"},
		{"bad top", agentproto.PutArgv(dir, "../x", 10, 10), 1, "invalid --top"},
		{"unknown", []string{"vmgate-agent", "frob", "x"}, 2, "unknown subcommand"},
		{"no path", []string{"vmgate-agent", "get"}, 2, "one path"},
	} {
		var stderr bytes.Buffer
		code := Transfer(tc.argv[1:], strings.NewReader(""), &bytes.Buffer{}, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", tc.name, code, stderr.String(), tc.code, tc.want)
		}
	}
}
