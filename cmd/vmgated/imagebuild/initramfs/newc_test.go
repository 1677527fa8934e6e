package initramfs

import (
	"bytes"
	"errors"
	"io/fs"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

func sampleEntries() []Entry {
	return []Entry{
		{Name: "bin", Mode: fs.ModeDir | 0o755},
		{Name: "bin/tool", Mode: 0o755, Data: []byte("#!/bin/sh\necho hi\n")},
		{Name: "bin/sh", Mode: fs.ModeSymlink | 0o777, Linkname: "tool"},
		{Name: "dev", Mode: fs.ModeDir | 0o755},
		{Name: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, DevMajor: 5, DevMinor: 1},
		{Name: "dev/vda", Mode: fs.ModeDevice | 0o660, DevMajor: 254, DevMinor: 0},
		{Name: "empty", Mode: 0o644},
		{Name: "tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Name: "suid", Mode: fs.ModeSetuid | fs.ModeSetgid | 0o755, Data: []byte{0, 1, 2, 3, 4}},
		{Name: "a-much-longer-name-for-padding", Mode: 0o600, Data: []byte("abc")},
	}
}

func TestWriteNewcRoundTrip(t *testing.T) {
	in := sampleEntries()
	var buf bytes.Buffer
	if err := WriteNewc(&buf, in); err != nil {
		t.Fatal(err)
	}
	got := readEntries(t, buf.Bytes())
	if !reflect.DeepEqual(got, in) {
		t.Fatalf("round trip mismatch:\n got %+v\nwant %+v", got, in)
	}

	var again bytes.Buffer
	if err := WriteNewc(&again, sampleEntries()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Fatal("two writes of the same entries differ")
	}
}

func TestWriteNewcExactBytes(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteNewc(&buf, []Entry{{Name: "a", Mode: fs.ModeDir | 0o755}}); err != nil {
		t.Fatal(err)
	}
	want := "070701" +
		"00000001" + "000041ed" + "00000000" + "00000000" + "00000002" + "00000000" + // ino mode uid gid nlink mtime
		"00000000" + "00000000" + "00000000" + "00000000" + "00000000" + // filesize devmajor devminor rdevmajor rdevminor
		"00000002" + "00000000" + "a\x00" + // namesize check name (110+2 = 112, aligned)
		"070701" +
		"00000000" + "00000000" + "00000000" + "00000000" + "00000001" + "00000000" +
		"00000000" + "00000000" + "00000000" + "00000000" + "00000000" +
		"0000000b" + "00000000" + "TRAILER!!!\x00" + "\x00\x00\x00" // 110+11 = 121, padded to 124
	if got := buf.String(); got != want {
		t.Fatalf("archive bytes:\n got %q\nwant %q", got, want)
	}
}

func TestWriteNewcEmpty(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteNewc(&buf, nil); err != nil {
		t.Fatal(err)
	}
	if got := readNewc(t, buf.Bytes()); len(got) != 0 {
		t.Fatalf("entries in empty archive: %+v", got)
	}
}

func TestWriteNewcCpioTool(t *testing.T) {
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("cpio not installed")
	}
	var buf bytes.Buffer
	if err := WriteNewc(&buf, sampleEntries()); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cpio, "-it", "--quiet")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -it: %v\n%s", err, out)
	}
	var want []string
	for _, e := range sampleEntries() {
		want = append(want, e.Name)
	}
	if got := strings.Fields(string(out)); !reflect.DeepEqual(got, want) {
		t.Fatalf("cpio -it listed %q, want %q", got, want)
	}
}

func TestWriteNewcValidation(t *testing.T) {
	dir := Entry{Name: "d", Mode: fs.ModeDir | 0o755}
	file := Entry{Name: "f", Mode: 0o644}
	tests := []struct {
		name    string
		entries []Entry
		msg     string
	}{
		{"empty name", []Entry{{Name: "", Mode: 0o644}}, "empty name"},
		{"absolute", []Entry{{Name: "/f", Mode: 0o644}}, "absolute"},
		{"dot", []Entry{{Name: ".", Mode: fs.ModeDir}}, "not clean"},
		{"dot slash", []Entry{{Name: "./f", Mode: 0o644}}, "not clean"},
		{"trailing slash", []Entry{dir, {Name: "d/", Mode: 0o644}}, "not clean"},
		{"double slash", []Entry{dir, {Name: "d//f", Mode: 0o644}}, "not clean"},
		{"dotdot", []Entry{{Name: "..", Mode: fs.ModeDir}}, "escapes"},
		{"dotdot prefix", []Entry{{Name: "../f", Mode: 0o644}}, "escapes"},
		{"dotdot inside", []Entry{dir, {Name: "d/../f", Mode: 0o644}}, "not clean"},
		{"NUL", []Entry{{Name: "f\x00g", Mode: 0o644}}, "NUL"},
		{"trailer name", []Entry{{Name: "TRAILER!!!", Mode: 0o644}}, "reserved"},
		{"missing parent", []Entry{{Name: "d/f", Mode: 0o644}}, `parent directory "d"`},
		{"parent after child", []Entry{{Name: "d/f", Mode: 0o644}, dir}, `parent directory "d"`},
		{"parent is a file", []Entry{file, {Name: "f/g", Mode: 0o644}}, `parent directory "f"`},
		{"duplicate", []Entry{file, file}, "duplicate"},
		{"symlink without target", []Entry{{Name: "l", Mode: fs.ModeSymlink | 0o777}}, "without target"},
		{"symlink target NUL", []Entry{{Name: "l", Mode: fs.ModeSymlink | 0o777, Linkname: "a\x00"}}, "NUL"},
		{"symlink with data", []Entry{{Name: "l", Mode: fs.ModeSymlink | 0o777, Linkname: "x", Data: []byte("x")}}, "data"},
		{"dir with data", []Entry{{Name: "d", Mode: fs.ModeDir | 0o755, Data: []byte("x")}}, "data"},
		{"device with data", []Entry{{Name: "c", Mode: fs.ModeDevice | fs.ModeCharDevice, Data: []byte("x")}}, "data"},
		{"file with linkname", []Entry{{Name: "f", Mode: 0o644, Linkname: "x"}}, "link target"},
		{"file with device number", []Entry{{Name: "f", Mode: 0o644, DevMinor: 3}}, "device number"},
		{"named pipe", []Entry{{Name: "p", Mode: fs.ModeNamedPipe | 0o644}}, "unsupported file type"},
		{"socket", []Entry{{Name: "s", Mode: fs.ModeSocket | 0o644}}, "unsupported file type"},
		{"append-only bit", []Entry{{Name: "f", Mode: fs.ModeAppend | 0o644}}, "unsupported mode bits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := WriteNewc(&buf, tt.entries)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalidEntry) {
				t.Errorf("error %v does not wrap ErrInvalidEntry", err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not mention %q", err, tt.msg)
			}
			if buf.Len() != 0 {
				t.Errorf("%d bytes written despite the error", buf.Len())
			}
		})
	}
}

type failWriter struct{ after int }

func (f *failWriter) Write(p []byte) (int, error) {
	if f.after <= 0 {
		return 0, errors.New("disk full")
	}
	f.after--
	return len(p), nil
}

func TestWriteNewcWriteError(t *testing.T) {
	for after := 0; after < 6; after++ {
		err := WriteNewc(&failWriter{after: after}, sampleEntries())
		if err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("after %d writes: error %v, want disk full", after, err)
		}
	}
}
