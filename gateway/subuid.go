package gateway

// Subordinate uids (subuid(5)). /etc/subuid gives a login ranges of uids
// that newuidmap(1) lets it map into the user namespaces it creates: on
// Debian, useradd gives every new login 65,536 of them when uidmap is
// installed. Each is a real host uid: the kernel's SO_PEERCRED reports it
// for a process that runs as it, whether inside the login's user
// namespace or, through a set-user-ID file the login made there, in the
// host's. Taken at face value, one login would be 65,536 callers, each
// with its own shares of VMs and queue, its own connection bound and its
// own audit flood gate (issue 30, finding 6). peercred_linux.go counts a
// uid of a login's ranges as that login; this file reads the ranges.
//
// The file is the operator's, trusted like the policy, and read as
// newuidmap reads it: "owner:first:count" lines, owner a user name or a
// uid in decimal, the numbers as strtoul(3) with base 0 reads them. A line
// newuidmap would not take is skipped here too, and logged. Subordinate
// ids served by NSS (subid: in nsswitch.conf) are not read: their uids
// stay callers of their own, and match.any takes none of them.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultSubUIDFile is where the subordinate uid ranges are read from.
const DefaultSubUIDFile = "/etc/subuid"

// maxSubUIDBytes bounds the subuid file read: a line per login is some
// 30 bytes, so this is about 100,000 logins.
const maxSubUIDBytes = 4 << 20

// subRange is one range of a subuid file: Owner may map the uids First to
// First+Count-1. Count is at least 1 and the range does not wrap.
type subRange struct {
	Owner        string // a user name, or a uid in decimal
	First, Count uint32
}

func (r subRange) contains(uid uint32) bool { return uid >= r.First && uid-r.First < r.Count }

// ownerUID returns the uid an owner field names when it is one in
// decimal as newuidmap writes it ("1000", not "01000"); ok is false for a
// user name.
func (r subRange) ownerUID() (uid uint32, ok bool) {
	n, err := strconv.ParseUint(r.Owner, 10, 32)
	if err != nil || strconv.FormatUint(n, 10) != r.Owner {
		return 0, false
	}
	return uint32(n), true
}

// parseSubUIDs parses the text of a subuid file. It returns the ranges in
// file order, and a problem for each line that is skipped because
// newuidmap would not take it either ("line 3: ..."). Empty lines, lines
// starting with '#' and ranges of no uids are skipped without a problem.
func parseSubUIDs(b []byte) (ranges []subRange, problems []string) {
	for n := 1; len(b) > 0; n++ {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		r, err := parseSubUIDLine(string(line))
		if err != nil {
			problems = append(problems, fmt.Sprintf("line %d: %v", n, err))
			continue
		}
		if r.Count > 0 {
			ranges = append(ranges, r)
		}
	}
	return ranges, problems
}

func parseSubUIDLine(line string) (subRange, error) {
	f := strings.Split(line, ":")
	if len(f) != 3 {
		return subRange{}, fmt.Errorf("%d fields, want owner:first:count", len(f))
	}
	if f[0] == "" {
		return subRange{}, errors.New("empty owner")
	}
	first, err := parseCNumber(f[1])
	if err != nil {
		return subRange{}, fmt.Errorf("first uid: %w", err)
	}
	count, err := parseCNumber(f[2])
	if err != nil {
		return subRange{}, fmt.Errorf("count: %w", err)
	}
	if count > 0 && uint64(first)+uint64(count)-1 > math.MaxUint32 {
		return subRange{}, fmt.Errorf("range %d+%d goes past the last uid", first, count)
	}
	return subRange{Owner: f[0], First: first, Count: count}, nil
}

// parseCNumber reads an unsigned number as strtoul(3) with base 0 does,
// without its leading space or sign: "0x" starts hex, "0" octal.
func parseCNumber(s string) (uint32, error) {
	base, digits := 10, s
	switch {
	case len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X"):
		base, digits = 16, s[2:]
	case len(s) > 1 && s[0] == '0':
		base, digits = 8, s[1:]
	}
	// With a base given, ParseUint takes no sign, prefix or "_".
	n, err := strconv.ParseUint(digits, base, 32)
	if errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%q is above %d", s, uint32(math.MaxUint32))
	}
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	return uint32(n), nil
}

// subUIDFile is a subuid file, re-read when it changes (its inode, size,
// or change time differ from the last read): peers without an account are
// attributed on the accept path, which must not parse a large file for
// each connection.
type subUIDFile struct {
	path string

	mu       sync.Mutex
	stamp    fileStamp
	ranges   []subRange
	problems []string
}

// fileStamp tells one version of a file from another.
type fileStamp struct {
	dev, ino, size uint64
	mtime, ctime   time.Time
}

func stampOf(fi fs.FileInfo) fileStamp {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileStamp{}
	}
	return fileStamp{dev: st.Dev, ino: st.Ino, size: uint64(st.Size),
		mtime: time.Unix(st.Mtim.Unix()), ctime: time.Unix(st.Ctim.Unix())}
}

// load returns the file's ranges. A missing file has none (newuidmap then
// maps nothing either). fresh is true when the file was (re)read, and
// problems are then its skipped lines, for the caller to log once.
func (f *subUIDFile) load() (ranges []subRange, problems []string, fresh bool, err error) {
	file, err := os.Open(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.stamp, f.ranges, f.problems = fileStamp{}, nil, nil
		return nil, nil, false, nil
	}
	if err != nil {
		return nil, nil, false, err
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, nil, false, err
	}
	stamp := stampOf(fi)
	f.mu.Lock()
	defer f.mu.Unlock()
	if stamp == f.stamp && stamp != (fileStamp{}) {
		return f.ranges, nil, false, nil
	}
	b, err := io.ReadAll(io.LimitReader(file, maxSubUIDBytes+1))
	if err != nil {
		return nil, nil, false, err
	}
	if len(b) > maxSubUIDBytes {
		return nil, nil, false, fmt.Errorf("%s is larger than %d bytes", f.path, maxSubUIDBytes)
	}
	f.ranges, f.problems = parseSubUIDs(b)
	f.stamp = stamp
	return f.ranges, f.problems, true, nil
}
