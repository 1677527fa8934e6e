package wire

import (
	"fmt"
	"io"
	"strings"

	"github.com/vmgate/vmgate/internal/names"
)

// File operations on a session's guest, run by the guest agent as the
// request's user (the guest's permissions decide), with the same path
// rules and limits as transfers; each is one audit record.
//
//	POST /v1/sessions/{name}/files/stat     FileRequest → FileEntry
//	POST /v1/sessions/{name}/files/list     FileRequest (Depth, Max) → FileList
//	POST /v1/sessions/{name}/files/mkdir    FileRequest (Parents) → 204
//	POST /v1/sessions/{name}/files/move     FileRequest (To) → 204
//	POST /v1/sessions/{name}/files/remove   FileRequest (Recursive) → 204
//	GET  /v1/sessions/{name}/files/read     ?path=&user=&dir= → the file's bytes
//	PUT  /v1/sessions/{name}/files/write    ?path=&user=&dir=&mode= and the bytes → FileWritten
//
// A refusal of the guest's (no such file, permission denied, …) is a
// wire.Error whose FileError names it (FileNotFound, …).

// FileRequest is a file operation's body.
type FileRequest struct {
	Path string `json:"path"`
	// To is a move's destination.
	To string `json:"to,omitempty"`
	// User is the guest user to run as (one of the profile's users;
	// empty: its user); Dir the directory relative paths start from
	// (empty: the user's home).
	User string `json:"user,omitempty"`
	Dir  string `json:"dir,omitempty"`
	// Depth is a list's depth (1: the directory's entries), Max the most
	// entries it returns.
	Depth int   `json:"depth,omitempty"`
	Max   int64 `json:"max,omitempty"`
	// Parents makes a directory's missing parents (mkdir -p); Recursive
	// removes a directory with what it holds (rm -r).
	Parents   bool `json:"parents,omitempty"`
	Recursive bool `json:"recursive,omitempty"`
}

// Bounds of file operations.
const (
	MaxListDepth   = 16
	MaxListEntries = 100000
)

// File operations (the path's last element).
const (
	FileOpStat   = "stat"
	FileOpList   = "list"
	FileOpMkdir  = "mkdir"
	FileOpMove   = "move"
	FileOpRemove = "remove"
	FileOpRead   = "read"
	FileOpWrite  = "write"
)

// Check checks a file request of op (the structure; the policy and the
// guest decide the rest).
func (r *FileRequest) Check(op string) error {
	guestOK := func(p string) bool {
		return p != "" && len(p) <= maxGuestPath && strings.IndexByte(p, 0) < 0
	}
	switch {
	case !guestOK(r.Path):
		return fmt.Errorf("%s: path empty, over %d bytes or holding a NUL", op, maxGuestPath)
	case op == FileOpMove && !guestOK(r.To):
		return fmt.Errorf("move: to empty, over %d bytes or holding a NUL", maxGuestPath)
	case op != FileOpMove && r.To != "":
		return fmt.Errorf("%s takes no to", op)
	case r.Dir != "" && (len(r.Dir) > maxGuestPath || strings.IndexByte(r.Dir, 0) >= 0):
		return fmt.Errorf("%s: dir over %d bytes or holding a NUL", op, maxGuestPath)
	case r.User != "" && !names.Account(r.User):
		return fmt.Errorf("%s: user %q: must be %s", op, r.User, names.AccountRule)
	case r.Depth < 0 || r.Depth > MaxListDepth || (r.Depth != 0 && op != FileOpList):
		return fmt.Errorf("%s: depth 1 to %d, for a list only", op, MaxListDepth)
	case r.Max < 0 || r.Max > MaxListEntries || (r.Max != 0 && op != FileOpList):
		return fmt.Errorf("%s: max 1 to %d entries, for a list only", op, MaxListEntries)
	case r.Parents && op != FileOpMkdir, r.Recursive && op != FileOpRemove:
		return fmt.Errorf("%s: parents goes with mkdir, recursive with remove", op)
	}
	return nil
}

// DecodeFileRequest parses a file operation's body strictly.
func DecodeFileRequest(r io.Reader, op string) (*FileRequest, error) {
	var f FileRequest
	if err := decodeStrict(r, 3*maxGuestPath+4096, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := f.Check(op); err != nil {
		return nil, err
	}
	return &f, nil
}

// Types of a FileEntry.
const (
	FileTypeRegular = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// FileEntry is one file, as lstat(2) sees it in the guest.
type FileEntry struct {
	Path string `json:"path"`
	// Abs is the absolute path, in a stat's answer: a relative Path starts
	// at the request's Dir, or the user's home.
	Abs     string `json:"abs,omitempty"`
	Name    string `json:"name"`
	Type    string `json:"type"`
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode"`     // permission, set-id and sticky bits (07777)
	ModTime int64  `json:"mod_time"` // Unix time, nanoseconds
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
	Owner   string `json:"owner,omitempty"`
	Group   string `json:"group,omitempty"`
	Target  string `json:"target,omitempty"` // a symlink's
}

// FileList is a directory's entries to a depth, depth first in name
// order; Truncated says that Max cut it.
type FileList struct {
	Entries   []FileEntry `json:"entries"`
	Truncated bool        `json:"truncated,omitempty"`
}

// FileWritten answers a write: the bytes written.
type FileWritten struct {
	Bytes int64 `json:"bytes"`
}

// Refusals of the guest (Error.FileError).
const (
	FileNotFound = "not-found"
	FileExists   = "exists"
	FileDenied   = "permission-denied"
	FileNotDir   = "not-a-directory"
	FileIsDir    = "is-a-directory"
	FileTooBig   = "too-big"
)
