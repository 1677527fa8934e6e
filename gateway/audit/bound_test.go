package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
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

func slicesOf[T any](n int, s T) []T {
	out := make([]T, n)
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

func TestBoundTransfers(t *testing.T) {
	small := Transfer{Direction: "get", Guest: "/work/out", Local: "/home/u/out", Files: 3, Bytes: 10, SHA256: strings.Repeat("a", 64)}
	long := small
	long.Guest, long.Local, long.Error = strings.Repeat("g", 4096), strings.Repeat("l", 4096), "entry \""+strings.Repeat("e", 4096)+"\": refused"
	perLong := len(long.Direction) + len(abridge(long.Guest)) + len(abridge(long.Local)) + len(long.SHA256) + len(abridge(long.Error))
	tests := []struct {
		name    string
		in      []Transfer
		kept    int
		omitted int
		cut     bool // the kept ones' long fields are abridged
	}{
		{"none", nil, 0, 0, false},
		{"a few", slicesOf(3, small), 3, 0, false},
		{"at the count", slicesOf(MaxTransfers, small), MaxTransfers, 0, false},
		{"over the count", slicesOf(1000, small), MaxTransfers, 1000 - MaxTransfers, false},
		{"long fields", slicesOf(2, long), 2, 0, true},
		{"over the bytes", slicesOf(MaxTransfers, long), MaxTransfersBytes / perLong, MaxTransfers - MaxTransfersBytes/perLong, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := slices.Clone(tt.in)
			r := Record{Kind: KindExec, Transfers: tt.in}
			bound(&r)
			if !slices.Equal(tt.in, before) {
				t.Error("the caller's transfers were changed")
			}
			if len(r.Transfers) != tt.kept || r.TransfersOmitted != tt.omitted {
				t.Errorf("kept %d, omitted %d; want %d, %d", len(r.Transfers), r.TransfersOmitted, tt.kept, tt.omitted)
			}
			size := 0
			for i, got := range r.Transfers {
				size += len(got.Direction) + len(got.Guest) + len(got.Local) + len(got.SHA256) + len(got.FileSHA256) + len(got.Error)
				if !tt.cut && got != tt.in[i] {
					t.Errorf("transfer %d changed: %+v", i, got)
				}
				if tt.cut && (len(got.Guest) > MaxFieldBytes+100 || !strings.Contains(got.Error, "…[abridged: ") || got.Files != 3 || got.SHA256 != small.SHA256) {
					t.Errorf("transfer %d: guest %d bytes, error %.40q…, %+v", i, len(got.Guest), got.Error, got.Files)
				}
			}
			if size > MaxTransfersBytes {
				t.Errorf("the kept transfers hold %d bytes of strings", size)
			}
		})
	}
}

// TestLog_BoundsTransfers: an exec record listing many transfers with
// long paths stays small, says how many it left out, and verifies.
func TestLog_BoundsTransfers(t *testing.T) {
	m := newMemFile(nil)
	l := openMem(t, m, Options{})
	ts := slicesOf(1000, Transfer{Direction: "put", Guest: strings.Repeat("/g", 2048), Local: strings.Repeat("/l", 2048), Error: strings.Repeat("x", 64<<10)})
	if err := l.Write(Record{Kind: KindExec, Transfers: ts}); err != nil {
		t.Fatal(err)
	}
	line := m.bytes()
	if len(line) > 64<<10 {
		t.Fatalf("the record is %d bytes", len(line))
	}
	r, err := parseLine(bytes.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Transfers)+r.TransfersOmitted != len(ts) || r.TransfersOmitted == 0 {
		t.Errorf("%d transfers listed, %d counted as left out, of %d", len(r.Transfers), r.TransfersOmitted, len(ts))
	}
	if len(ts[0].Error) != 64<<10 {
		t.Error("the caller's record was changed")
	}
	if _, err := Verify(bytes.NewReader(line)); err != nil {
		t.Fatal(err)
	}
}
