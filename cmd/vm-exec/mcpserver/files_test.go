package mcpserver

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway/client/shelltool"
)

func TestParseWrite(t *testing.T) {
	s, p, data, err := parseWrite(json.RawMessage(`{"session":"s1","path":"/tmp/a/../b.txt","content":"x 'y' \"z\"\n$(rm -rf /)"}`))
	if err != nil || s != "s1" || p != "/tmp/b.txt" || string(data) != "x 'y' \"z\"\n$(rm -rf /)" {
		t.Fatalf("parseWrite = %q %q %q %v", s, p, data, err)
	}
	if _, _, data, err := parseWrite(json.RawMessage(`{"session":"s1","path":"/bin.dat","content":"AAH/","encoding":"base64"}`)); err != nil || string(data) != "\x00\x01\xff" {
		t.Fatalf("base64: %q %v", data, err)
	}
	for name, raw := range map[string]string{
		"no session":    `{"path":"/a","content":""}`,
		"relative path": `{"session":"s","path":"a.txt","content":""}`,
		"directory":     `{"session":"s","path":"/tmp/","content":""}`,
		"NUL in path":   `{"session":"s","path":"/a\u0000b","content":""}`,
		"bad base64":    `{"session":"s","path":"/a","content":"!!","encoding":"base64"}`,
		"bad encoding":  `{"session":"s","path":"/a","content":"","encoding":"hex"}`,
		"unknown field": `{"session":"s","path":"/a","content":"","mode":"0755"}`,
		"too large":     `{"session":"s","path":"/a","content":"` + strings.Repeat("x", maxWrite+1) + `"}`,
		"bad session":   `{"session":"../s","path":"/a","content":""}`,
	} {
		if _, _, _, err := parseWrite(json.RawMessage(raw)); !errors.Is(err, shelltool.ErrArgs) {
			t.Errorf("%s: %v, want an argument error", name, err)
		}
	}
}

func TestParseRead(t *testing.T) {
	if s, p, n, err := parseRead(json.RawMessage(`{"session":"s","path":"/etc/os-release"}`)); err != nil || s != "s" || p != "/etc/os-release" || n != defaultRead {
		t.Fatalf("parseRead = %q %q %d %v", s, p, n, err)
	}
	if _, _, n, err := parseRead(json.RawMessage(`{"session":"s","path":"/a","max_bytes":10}`)); err != nil || n != 10 {
		t.Fatalf("max_bytes: %d %v", n, err)
	}
	for _, raw := range []string{`{"session":"s","path":"/a","max_bytes":0}`, `{"session":"s","path":"/a","max_bytes":2000000}`, `{"session":"s"}`} {
		if _, _, _, err := parseRead(json.RawMessage(raw)); !errors.Is(err, shelltool.ErrArgs) {
			t.Errorf("%s: %v, want an argument error", raw, err)
		}
	}
}

func TestReadResult(t *testing.T) {
	for _, tt := range []struct {
		in    string
		limit int
		want  string
	}{
		{"hello\n", 10, "hello\n"},
		{"hello world", 5, "hello\n[truncated: the first 5 bytes]"},
		{"\x00\xff", 10, "[base64]\nAP8="},
	} {
		if got := readResult([]byte(tt.in), tt.limit); got != tt.want {
			t.Errorf("readResult(%q, %d) = %q, want %q", tt.in, tt.limit, got, tt.want)
		}
	}
}

func FuzzParseWrite(f *testing.F) {
	f.Add([]byte(`{"session":"s1","path":"/tmp/b.txt","content":"x"}`))
	f.Add([]byte(`{"session":"s1","path":"/x","content":"AAH/","encoding":"base64"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, p, data, err := parseWrite(raw)
		if err != nil {
			return
		}
		if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) || len(data) > maxWrite {
			t.Fatalf("accepted path %q, %d bytes", p, len(data))
		}
	})
}
