package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestLog_ConcurrentWrites(t *testing.T) {
	const workers, each = 16, 25
	l, path := openDisk(t, Options{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				r := rec(w*each + i)
				if err := l.Write(r); err != nil {
					t.Errorf("Write: %v", err)
				}
			}
		})
	}
	wg.Wait()
	seq, head := l.Head()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	rep, err := VerifyFile(path)
	if err != nil {
		t.Fatalf("VerifyFile: %v", err)
	}
	const n = workers * each
	if rep.Lines != n || rep.FirstSeq != 1 || rep.LastSeq != n || rep.BrokenLine != 0 {
		t.Errorf("report = %+v, want %d lines, seq 1..%d", rep, n, n)
	}
	if seq != n || rep.Head != head {
		t.Errorf("Head() = %d %s, report head %s", seq, head, rep.Head)
	}
	if rep.FirstTime.IsZero() || rep.LastTime.Before(rep.FirstTime) {
		t.Errorf("times %v .. %v", rep.FirstTime, rep.LastTime)
	}

	// Every record is there once, and seqs run 1..n in file order.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		var r Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r.Seq != uint64(i+1) {
			t.Fatalf("line %d has seq %d", i+1, r.Seq)
		}
		if seen[r.RequestID] {
			t.Fatalf("%s written twice", r.RequestID)
		}
		seen[r.RequestID] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct records, want %d", len(seen), n)
	}
}

func TestLog_ReopenContinuesChain(t *testing.T) {
	l, path := openDisk(t, Options{})
	writeN(t, l, 1, 3)
	_, head := l.Head()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l2, _ := openDisk(t, Options{Path: path})
	if seq, h := l2.Head(); seq != 3 || h != head {
		t.Fatalf("reopened at %d %s, want 3 %s", seq, h, head)
	}
	writeN(t, l2, 4, 5)
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := VerifyFile(path)
	if err != nil {
		t.Fatalf("VerifyFile: %v", err)
	}
	if rep.Lines != 5 || rep.LastSeq != 5 {
		t.Fatalf("report = %+v, want 5 lines", rep)
	}
}

func TestOpen_Modes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "audit")
	l, path := openDisk(t, Options{Path: filepath.Join(dir, "audit.jsonl")})
	writeN(t, l, 1, 1)
	for p, want := range map[string]os.FileMode{dir: 0o750, path: 0o640} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		// The umask may only remove bits.
		if got := fi.Mode().Perm(); got&^want != 0 {
			t.Errorf("%s: mode %v, want at most %v", p, got, want)
		}
	}
}

func TestOpen_Refuses(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real.jsonl")
	if err := os.WriteFile(target, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.jsonl")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no path", Options{}, "no path"},
		{"bad regex", Options{Path: filepath.Join(dir, "a.jsonl"), Redact: []string{"ok", "(unclosed"}}, "redact pattern 1"},
		{"directory", Options{Path: dir}, "is a directory"},
	}
	if openFlags != 0 {
		tests = append(tests, struct {
			name string
			opts Options
			want string
		}{"symlink", Options{Path: link}, "too many levels of symbolic links"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Open(tt.opts)
			if err == nil {
				l.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open: %v, want %q", err, tt.want)
			}
		})
	}
}

func TestOpen_TornLastLine(t *testing.T) {
	l, path := openDisk(t, Options{})
	writeN(t, l, 1, 3)
	l.Close()
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	torn := append(slices.Clone(good), `{"time":"2026-01-01T00:00:00Z","seq":4,"ki`...)
	if err := os.WriteFile(path, torn, 0o640); err != nil {
		t.Fatal(err)
	}

	_, err = Open(Options{Path: path})
	if !errors.Is(err, ErrTornLine) {
		t.Fatalf("Open: %v, want ErrTornLine", err)
	}
	hint := fmt.Sprintf("truncate -s %d %s", len(good), path)
	if !strings.Contains(err.Error(), hint) {
		t.Fatalf("Open: %v\nwant the recovery hint %q", err, hint)
	}

	// Following the hint recovers.
	if err := os.Truncate(path, int64(len(good))); err != nil {
		t.Fatal(err)
	}
	l2, _ := openDisk(t, Options{Path: path})
	writeN(t, l2, 4, 4)
	l2.Close()
	if rep, err := VerifyFile(path); err != nil || rep.Lines != 4 {
		t.Fatalf("VerifyFile = %+v, %v", rep, err)
	}
}

func TestOpen_InvalidLastLine(t *testing.T) {
	for name, content := range map[string]string{
		"garbage":    "hello\n",
		"empty line": "\n",
		"seq 0":      `{"time":"2026-01-01T00:00:00Z","seq":0,"kind":"daemon","prev":""}` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
				t.Fatal(err)
			}
			_, err := Open(Options{Path: path})
			if !errors.Is(err, ErrChainBroken) || !strings.Contains(err.Error(), "move it aside") {
				t.Fatalf("Open: %v, want ErrChainBroken with a recovery hint", err)
			}
		})
	}
}

func TestLastLine(t *testing.T) {
	long := strings.Repeat("x", 200<<10) // spans several read chunks
	tests := []struct {
		in       string
		line     string
		off      int64
		torn     bool
		wantNone bool
	}{
		{in: "", wantNone: true},
		{in: "a\n", line: "a"},
		{in: "a\nbc\n", line: "bc", off: 2},
		{in: "a\nbc", line: "bc", off: 2, torn: true},
		{in: "abc", line: "abc", torn: true},
		{in: "a\n\n", line: "", off: 2},
		{in: "a\n" + long + "\n", line: long, off: 2},
		{in: long + "\n" + long + "\n", line: long, off: int64(len(long)) + 1},
		{in: long + "\n" + long, line: long, off: int64(len(long)) + 1, torn: true},
	}
	for i, tt := range tests {
		line, off, torn, err := lastLine(strings.NewReader(tt.in), int64(len(tt.in)))
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if (line == nil) != tt.wantNone || string(line) != tt.line || off != tt.off || torn != tt.torn {
			t.Errorf("%d: lastLine = %.10q… (nil %v) %d %v, want %.10q… %d %v", i, line, line == nil, off, torn, tt.line, tt.off, tt.torn)
		}
	}
}

func TestLog_Redaction(t *testing.T) {
	l, path := openDisk(t, Options{Redact: []string{`(?i)password=.*`, `^AKIA[0-9A-Z]{16}$`}})
	argv := []string{"mysql", "--PASSWORD=hunter2", "-u", "root", "AKIAABCDEFGHIJKLMNOP", "password"}
	orig := slices.Clone(argv)
	if err := l.Write(Record{Kind: KindDecision, Verdict: VerdictAllow, Argv: argv}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(argv, orig) {
		t.Fatalf("caller's argv modified: %q", argv)
	}
	l.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"hunter2", "AKIAABCDEFGHIJKLMNOP"} {
		if bytes.Contains(data, []byte(secret)) {
			t.Fatalf("secret %q reached the file: %s", secret, data)
		}
	}
	var r Record
	if err := json.Unmarshal(bytes.TrimSpace(data), &r); err != nil {
		t.Fatal(err)
	}
	want := []string{"mysql", Redacted, "-u", "root", Redacted, "password"}
	if !slices.Equal(r.Argv, want) {
		t.Fatalf("argv = %q, want %q", r.Argv, want)
	}
}

// TestLog_RedactsReasons: a denial's reason, an error or a message that
// quotes a redacted argument (whole, or cut as the policy cuts long ones)
// does not carry it into the file.
func TestLog_RedactsReasons(t *testing.T) {
	m := newMemFile(nil)
	l := openMem(t, m, Options{Redact: []string{`^--password=`}})
	long := "--password=" + strings.Repeat("s3cret", 20)
	tests := []Record{
		{Kind: KindDecision, Verdict: VerdictDeny, Argv: []string{"mysql", "--password=hunter2"},
			Reason: `argument 2 "--password=hunter2" matches "--password=*"`},
		{Kind: KindDecision, Verdict: VerdictDeny, Argv: []string{"mysql", long},
			Reason: fmt.Sprintf(`argument 2 %q...(%d bytes) matches "*"`, long[:64], len(long))},
		{Kind: KindExec, Argv: []string{"mysql", "--password=hunter2"}, Error: "exec mysql --password=hunter2: failed"},
		{Kind: KindDecision, Verdict: VerdictDeny, Argv: []string{"sh"}, Reason: `environment entry "--password=x": not KEY=VALUE`},
	}
	for _, r := range tests {
		if err := l.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	data := m.bytes()
	for _, secret := range []string{"hunter2", "s3cret", "--password=x"} {
		if bytes.Contains(data, []byte(secret)) {
			t.Errorf("secret %q reached the file: %s", secret, data)
		}
	}
	if !bytes.Contains(data, []byte(`matches \"*\"`)) {
		t.Errorf("a quoted string that is no secret was redacted: %s", data)
	}
}

func TestLog_RecordEncoding(t *testing.T) {
	m := newMemFile(nil)
	l := openMem(t, m, Options{})
	fixed := time.Date(2026, 3, 4, 5, 6, 7, 890, time.FixedZone("CET", 3600))
	l.now = func() time.Time { return fixed }
	full := Record{
		Time: time.Unix(1, 0), Seq: 77, Prev: "caller's", // ignored
		Kind: KindExec, RequestID: "r", UID: new(uint32(0)), GID: new(uint32(0)), PID: 1, User: "u",
		Profile: "p", Argv: []string{"<&>"}, Shell: true, Session: "s", Verdict: VerdictAllow,
		Rule: "ru", Reason: "re", VMID: "vm", Image: "img", ImageDigest: "sha256:x", ExitCode: new(0),
		Signal: "SIGKILL", TimedOut: true, StdoutBytes: 1, StderrBytes: 2, StdinBytes: 3,
		StdoutSHA256: "o", StderrSHA256: "e", Truncated: true, DurationMS: 4, BootMS: 5,
		VMStart: "pool", DiskBytes: 6, Net: &NetEvent{Proto: "tcp"}, Error: "err", Message: "msg",
	}
	if err := l.Write(full); err != nil {
		t.Fatal(err)
	}
	line := bytes.TrimSuffix(m.bytes(), []byte("\n"))
	var obj map[string]any
	if err := json.Unmarshal(line, &obj); err != nil {
		t.Fatal(err)
	}
	keys := slices.Sorted(maps.Keys(obj))
	want := []string{
		"argv", "boot_ms", "disk_bytes", "duration_ms", "error", "exit_code", "gid", "image", "image_digest", "kind", "message", "net",
		"pid", "prev", "profile", "reason", "request_id", "rule", "seq", "session", "shell", "signal",
		"stderr_bytes", "stderr_sha256", "stdin_bytes", "stdout_bytes", "stdout_sha256", "time",
		"timed_out", "truncated", "uid", "user", "verdict", "vm_id", "vm_start",
	}
	if !slices.Equal(keys, want) {
		t.Errorf("keys = %q\nwant   %q", keys, want)
	}
	if obj["time"] != "2026-03-04T04:06:07.00000089Z" || obj["seq"] != 1.0 || obj["prev"] != GenesisPrev {
		t.Errorf("time/seq/prev = %v %v %v", obj["time"], obj["seq"], obj["prev"])
	}
	if obj["uid"] != 0.0 || obj["exit_code"] != 0.0 {
		t.Errorf("uid 0 and exit code 0 must be written: %s", line)
	}
	if !bytes.Contains(line, []byte(`"argv":["<&>"]`)) {
		t.Errorf("argv HTML-escaped: %s", line)
	}

	// A minimal record omits everything optional.
	m2 := newMemFile(nil)
	l2 := openMem(t, m2, Options{})
	if err := l2.Write(Record{Kind: KindDaemon}); err != nil {
		t.Fatal(err)
	}
	if re := regexp.MustCompile(`^\{"time":"[^"]+Z","seq":1,"kind":"daemon","prev":"` + GenesisPrev + `"\}\n$`); !re.Match(m2.bytes()) {
		t.Errorf("minimal record: %s", m2.bytes())
	}
}

func TestLog_RefusesInvalidRecord(t *testing.T) {
	m := newMemFile(nil)
	l := openMem(t, m, Options{})
	for name, r := range map[string]Record{
		"no kind":     {},
		"bad kind":    {Kind: "exec "},
		"bad verdict": {Kind: KindDecision, Verdict: "maybe"},
	} {
		if err := l.Write(r); err == nil || errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: Write = %v, want a plain error", name, err)
		}
	}
	if err := l.Healthy(); err != nil {
		t.Fatalf("Healthy after refused records: %v", err)
	}
	if len(m.bytes()) != 0 {
		t.Fatalf("refused records written: %q", m.bytes())
	}
	writeN(t, l, 1, 1)
	if seq, _ := l.Head(); seq != 1 {
		t.Fatalf("seq %d after refusals, want 1", seq)
	}
}

// TestLog_NoSpace fails writes with ENOSPC through an injected file, so it
// runs without root; TestLog_TmpfsFull_Isolated does the same on a real
// full file system.
func TestLog_NoSpace(t *testing.T) {
	m := newMemFile(nil)
	m.quota = 4000
	var logs bytes.Buffer
	l := openMem(t, m, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	var (
		ok  int
		err error
	)
	for ; ok < 1000; ok++ {
		if err = l.Write(rec(ok + 1)); err != nil {
			break
		}
	}
	checkFailed(t, l, err, syscall.ENOSPC)
	if ok == 0 {
		t.Fatal("no record fitted")
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || !strings.Contains(logs.String(), "no space left on device") {
		t.Errorf("want the failure logged once, got:\n%s", logs.String())
	}

	// The partial line was cut off: what is there is a valid chain of the
	// records that Write accepted, and a restart continues it.
	content := m.bytes()
	rep, verr := Verify(bytes.NewReader(content))
	if verr != nil || rep.Lines != ok {
		t.Fatalf("Verify = %+v, %v; want %d intact lines", rep, verr, ok)
	}
	l2 := openMem(t, newMemFile(content), Options{})
	writeN(t, l2, ok+1, ok+1)
	if seq, _ := l2.Head(); seq != uint64(ok+1) {
		t.Fatalf("resumed at %d, want %d", seq, ok+1)
	}
}

func TestLog_FsyncFailure(t *testing.T) {
	m := newMemFile(nil)
	m.syncErr = syscall.EIO
	l := openMem(t, m, Options{SyncInterval: time.Millisecond, RetryInterval: -1})
	writeN(t, l, 1, 1) // accepted: the fsync comes later
	eventually(t, "the background fsync to fail", func() bool { return l.Healthy() != nil })
	checkFailed(t, l, l.Write(rec(2)), syscall.EIO)
	if n := m.syncCount(); n != 1 {
		t.Errorf("%d fsyncs, want 1: a failed fsync must not be retried", n)
	}

	// With a negative interval the failing fsync is reported by Write.
	m2 := newMemFile(nil)
	m2.syncErr = syscall.EIO
	l2 := openMem(t, m2, Options{SyncInterval: -1, RetryInterval: -1})
	checkFailed(t, l2, l2.Write(rec(1)), syscall.EIO)
}

// TestLog_RecoversAfterLostFsync: the fsync of three accepted records
// fails and the kernel drops their pages. While the disk keeps failing
// the Log stays failed; once it works, Recover writes the three again,
// records the outage, and the chain goes on: nothing accepted is lost,
// nothing refused appears.
func TestLog_RecoversAfterLostFsync(t *testing.T) {
	for _, interval := range []time.Duration{time.Hour, -1} {
		t.Run(fmt.Sprint("sync interval ", interval), func(t *testing.T) {
			m := newMemFile(nil)
			m.loseUnsynced = true
			l := openMem(t, m, Options{SyncInterval: interval, RetryInterval: -1})
			writeN(t, l, 1, 2)
			m.set(func(m *memFile) { m.syncErr = syscall.EIO })
			accepted := 2
			if err := l.Write(rec(3)); err == nil {
				accepted = 3 // the fsync comes later
				if err := l.Sync(); !errors.Is(err, syscall.EIO) {
					t.Fatalf("Sync = %v", err)
				}
			}
			if len(m.bytes()) != 0 && interval > 0 {
				t.Fatalf("the failed fsync kept %d bytes; the test wants them lost", len(m.bytes()))
			}
			checkFailed(t, l, l.Write(rec(9)), syscall.EIO) // refuses 2: rec(9), rec(0)
			if err := l.Recover(); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "recovery") {
				t.Fatalf("Recover on a failing disk = %v", err)
			}
			m.set(func(m *memFile) { m.syncErr = nil })
			if err := l.Recover(); err != nil {
				t.Fatalf("Recover = %v", err)
			}
			if err := l.Write(rec(accepted + 2)); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(bytes.NewReader(m.bytes()))
			if err != nil || rep.Lines != accepted+2 {
				t.Fatalf("Verify = %+v, %v; want %d lines", rep, err, accepted+2)
			}
			for i, line := range bytes.Split(bytes.TrimSpace(m.bytes()), []byte("\n")) {
				r, err := parseLine(line)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case i < accepted && r.RequestID != fmt.Sprintf("req-%d", i+1):
					t.Errorf("line %d: %+v, want accepted record %d", i+1, r, i+1)
				case i == accepted && (r.Kind != KindDaemon || !strings.Contains(r.Message, "audit log recovered") ||
					!strings.Contains(r.Message, fmt.Sprintf("%d records refused", 5-accepted)) || !strings.Contains(r.Error, "input/output error")):
					t.Errorf("recovery record %+v", r)
				}
			}
		})
	}
}

// TestLog_RecoversWhenSpaceReturns: a full disk fails the Log; once
// there is room again it recovers on its own (RetryInterval) and the
// chain holds every accepted record.
func TestLog_RecoversWhenSpaceReturns(t *testing.T) {
	m := newMemFile(nil)
	m.quota = 4000
	l := openMem(t, m, Options{RetryInterval: time.Hour})
	ok := 0
	for ; ok < 1000; ok++ {
		if err := l.Write(rec(ok + 1)); err != nil {
			break
		}
	}
	checkFailed(t, l, l.Write(rec(0)), syscall.ENOSPC)
	// Not a byte left: the recovery record does not fit either.
	m.set(func(m *memFile) { m.quota = len(m.buf) })
	if err := l.Recover(); !errors.Is(err, ErrUnavailable) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Recover on a full disk = %v", err)
	}
	m.set(func(m *memFile) { m.quota = -1 })
	l.mu.Lock()
	l.retry.Reset(time.Millisecond) // the next attempt, now
	l.mu.Unlock()
	eventually(t, "the Log to recover on its own", func() bool { return l.Healthy() == nil })
	writeN(t, l, ok+1, ok+1)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(bytes.NewReader(m.bytes()))
	if err != nil || rep.Lines != ok+2 {
		t.Fatalf("Verify = %+v, %v; want %d lines (%d accepted, the recovery, one more)", rep, err, ok+2, ok)
	}
}

// checkFailed checks that err, Healthy and a further Write all report the
// failed state caused by cause.
func checkFailed(t *testing.T, l *Log, err error, cause error) {
	t.Helper()
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, cause) {
		t.Fatalf("Write = %v, want ErrUnavailable and %v", err, cause)
	}
	msg := "audit log unavailable: "
	if !strings.HasPrefix(err.Error(), msg) || !strings.HasSuffix(err.Error(), cause.Error()) {
		t.Errorf("message %q, want %q…%q", err, msg, cause.Error())
	}
	if h := l.Healthy(); !errors.Is(h, ErrUnavailable) || !errors.Is(h, cause) {
		t.Errorf("Healthy = %v", h)
	}
	if err := l.Write(rec(0)); !errors.Is(err, ErrUnavailable) || !errors.Is(err, cause) {
		t.Errorf("next Write = %v", err)
	}
	if err := l.Sync(); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Sync = %v", err)
	}
}

func TestLog_SyncInterval(t *testing.T) {
	t.Run("background", func(t *testing.T) {
		m := newMemFile(nil)
		l := openMem(t, m, Options{SyncInterval: time.Millisecond})
		writeN(t, l, 1, 1)
		eventually(t, "a background fsync", func() bool { return m.syncCount() >= 1 })
		n := m.syncCount()
		time.Sleep(20 * time.Millisecond)
		if m.syncCount() != n {
			t.Errorf("fsync without new records")
		}
		writeN(t, l, 2, 2)
		eventually(t, "a second background fsync", func() bool { return m.syncCount() > n })
	})
	t.Run("every write", func(t *testing.T) {
		m := newMemFile(nil)
		l := openMem(t, m, Options{SyncInterval: -1})
		for i := 1; i <= 3; i++ {
			writeN(t, l, i, i)
			if n := m.syncCount(); n != i {
				t.Fatalf("%d fsyncs after %d writes", n, i)
			}
		}
	})
	t.Run("explicit", func(t *testing.T) {
		m := newMemFile(nil)
		l := openMem(t, m, Options{SyncInterval: time.Hour})
		writeN(t, l, 1, 5)
		if n := m.syncCount(); n != 0 {
			t.Fatalf("%d fsyncs before the interval", n)
		}
		if err := l.Sync(); err != nil || m.syncCount() != 1 {
			t.Fatalf("Sync = %v, %d fsyncs", err, m.syncCount())
		}
		if err := l.Sync(); err != nil || m.syncCount() != 1 {
			t.Fatalf("clean Sync = %v, %d fsyncs, want no new fsync", err, m.syncCount())
		}
		if err := l.Close(); err != nil || m.syncCount() != 2 {
			t.Fatalf("Close = %v, %d fsyncs, want a final fsync", err, m.syncCount())
		}
	})
}

func TestLog_Close(t *testing.T) {
	m := newMemFile(nil)
	l := openMem(t, m, Options{})
	writeN(t, l, 1, 1)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if !m.closed {
		t.Fatal("file not closed")
	}
	for name, err := range map[string]error{"Write": l.Write(rec(2)), "Healthy": l.Healthy(), "Sync": l.Sync()} {
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s after Close = %v, want ErrUnavailable", name, err)
		}
	}
}

func TestLog_Mirror(t *testing.T) {
	var got []Record
	l, err := Open(Options{Path: filepath.Join(t.TempDir(), "a.jsonl"), Redact: []string{"^secret$"},
		Mirror: func(r Record) { got = append(got, r) }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Write(Record{Kind: KindExec, Argv: []string{"echo", "secret"}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Write(Record{Kind: "bogus"}); err == nil {
		t.Fatal("invalid record accepted")
	}
	if len(got) != 1 || got[0].Seq != 1 || got[0].Argv[1] != Redacted || got[0].Prev != GenesisPrev {
		t.Fatalf("mirror got %+v", got)
	}
}
