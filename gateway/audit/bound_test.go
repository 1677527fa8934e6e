package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

func TestAbridge(t *testing.T) {
	long := strings.Repeat("é", MaxFieldBytes) // 2 bytes a rune: cut inside one
	sum := sha256.Sum256([]byte(long))
	tests := []struct {
		name, in, want string
	}{
		{"short", "hello", "hello"},
		{"at the bound", strings.Repeat("x", MaxFieldBytes), strings.Repeat("x", MaxFieldBytes)},
		{"over", long, long[:MaxFieldBytes] + fmt.Sprintf("…[abridged: %d bytes, sha256:%s]", len(long), hex.EncodeToString(sum[:]))},
	}
	for _, tt := range tests {
		if got := abridge(tt.in); got != tt.want {
			t.Errorf("%s: abridge = %.80q…, want %.80q…", tt.name, got, tt.want)
		}
	}
	bad := string(bytes.Repeat([]byte{0xff}, 3*MaxFieldBytes))
	if got := abridge(bad); !strings.HasPrefix(got, strings.Repeat("\uFFFD", 1)) || len(got) > 4*MaxFieldBytes {
		t.Errorf("invalid UTF-8: %d bytes", len(got))
	}
}

func TestAbridgeArgv(t *testing.T) {
	many := make([]string, 1000)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	huge := []string{"echo", strings.Repeat("a", 100<<10), "b"}
	tests := []struct {
		name string
		in   []string
		keep int // elements kept as they are
		more string
	}{
		{"small", []string{"ls", "-l"}, 2, ""},
		{"many", many, MaxArgs - 1, "…[745 more arguments; argv: 1000 arguments"},
		{"one huge element", huge, 1, ""},
		{"too many bytes", slicesOf(40, strings.Repeat("z", 1000)), 16, "…[24 more arguments; argv: 40 arguments, 40000 bytes, sha256:"},
	}
	for _, tt := range tests {
		got := abridgeArgv(tt.in)
		for i := 0; i < tt.keep; i++ {
			if got[i] != tt.in[i] {
				t.Errorf("%s: element %d changed: %.40q", tt.name, i, got[i])
			}
		}
		if tt.more != "" && !strings.HasPrefix(got[len(got)-1], tt.more) {
			t.Errorf("%s: last element %q, want prefix %q", tt.name, got[len(got)-1], tt.more)
		}
		size := 0
		for _, a := range got {
			size += len(a)
		}
		if size > MaxArgvBytes+MaxFieldBytes || len(got) > MaxArgs {
			t.Errorf("%s: %d elements, %d bytes kept", tt.name, len(got), size)
		}
	}
	if got := abridgeArgv(huge); !strings.Contains(got[1], "…[abridged: 102400 bytes, sha256:") || got[2] != "b" {
		t.Errorf("huge element: %.60q…, %q", got[1], got[2])
	}
}

func slicesOf(n int, s string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestLog_BoundsHostileRecord: a denied request with a 1 MiB argv of
// invalid UTF-8, and a reason quoting it, makes one small line.
func TestLog_BoundsHostileRecord(t *testing.T) {
	m := newMemFile(nil)
	l := openMem(t, m, Options{})
	junk := string(bytes.Repeat([]byte{0xfe, 0x01}, 512<<10))
	r := Record{Kind: KindDecision, Verdict: VerdictDeny, Argv: []string{junk, junk}, Reason: "no profile matches " + junk, Message: junk}
	if err := l.Write(r); err != nil {
		t.Fatal(err)
	}
	line := m.bytes()
	if len(line) > 64<<10 {
		t.Fatalf("the record is %d bytes", len(line))
	}
	sum := sha256.Sum256([]byte(junk))
	if !bytes.Contains(line, []byte(hex.EncodeToString(sum[:]))) {
		t.Error("the record lacks the hash of the full argument")
	}
	if len(r.Argv[0]) != len(junk) {
		t.Error("the caller's record was changed")
	}
	if _, err := Verify(bytes.NewReader(line)); err != nil {
		t.Fatal(err)
	}

	// What used to be refused as too large is abridged instead: a line
	// of at most 6 bytes per byte kept (a control character's \u00XX).
	for name, r := range map[string]Record{
		"larger than a line": {Kind: KindExec, Argv: []string{strings.Repeat("a", MaxLineSize)}},
		"control characters": {Kind: KindExec, Argv: []string{strings.Repeat("\x01", MaxLineSize/6+1)}},
		"many arguments":     {Kind: KindExec, Argv: slicesOf(1<<20, "x")},
	} {
		before := len(m.bytes())
		if err := l.Write(r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := len(m.bytes()) - before; n > 6*(MaxArgvBytes+2*MaxFieldBytes) {
			t.Errorf("%s: a %d-byte line", name, n)
		}
	}
}

// FuzzWriteBounded writes records built from hostile input: every one is
// accepted, stays within the bounds, verifies, and a redacted argument
// appears nowhere in it.
func FuzzWriteBounded(f *testing.F) {
	f.Add([]byte("--password=hunter2"), "argument 1 \"--password=hunter2\" matches", 3)
	f.Add(bytes.Repeat([]byte{0xff}, 5000), "", 300)
	f.Add([]byte("\x00\"\\"), "\"\\\"", 1)
	f.Fuzz(func(t *testing.T, arg []byte, reason string, n int) {
		n = max(1, min(n, 2*MaxArgs))
		m := newMemFile(nil)
		l := openMem(t, m, Options{Redact: []string{`^--password=`}})
		secret := "--password=" + string(arg)
		argv := append(slicesOf(n, string(arg)), secret)
		if err := l.Write(Record{Kind: KindDecision, Verdict: VerdictDeny, Argv: argv, Reason: reason + " " + secret, Error: string(arg)}); err != nil {
			t.Fatal(err)
		}
		data := m.bytes()
		if len(data) > 6*(MaxArgvBytes+4*MaxFieldBytes)+4096 {
			t.Fatalf("a %d-byte line", len(data))
		}
		if _, err := Verify(bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		r, err := parseLine(bytes.TrimSpace(data))
		if err != nil {
			t.Fatal(err)
		}
		if len(secret) > len("--password=")+8 && strings.Contains(r.Reason, secret) {
			t.Fatalf("the secret is in the reason: %q", r.Reason)
		}
	})
}
