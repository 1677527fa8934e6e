package agentproto

import "strconv"

// File operations (stat, list, make a directory, move, remove, read or
// write one file) run the agent binary as an ordinary command
// (ExecSpec), as the request's user in its working directory, as file
// transfers do: the guest's own permissions decide, and two operations on
// one file at once behave as two processes of one machine would. The
// subcommands and their flags are built by [FSArgv]; a result is JSON on
// stdout (stat: a FileEntry; ls: a FileList), a file's bytes (read), or
// nothing; a failure is a one-line message on stderr and one of the
// FSExit codes.
//
// Symbolic links are followed where the system call follows them: read,
// write and the directory ls lists; stat, mv and rm act on the link.
// ls walks no symbolic link and lists a subdirectory it cannot read
// without its entries. read and write without --max have no bound. write
// stops at --max: nothing past it is written, a file it created is
// removed, one that existed is left empty (truncated at the open, as a
// shell's ">" does), and it exits FSExitTooBig; --mode is the new file's
// mode exactly (not masked), and an existing file keeps its own. JSON
// cannot carry a name's bytes that are not UTF-8: such a name is shown
// with U+FFFD in their place.

// FeatureFS: the agent has the fs subcommand (FSArgv).
const FeatureFS = "fs"

// FSCommand is the agent's subcommand of file operations.
const FSCommand = "fs"

// File operations (FSArgv's op).
const (
	FSStat   = "stat"  // PATH → FileEntry (a symlink's own entry)
	FSList   = "ls"    // PATH, --depth N (1, the default: its entries), --max N (entries) → FileList
	FSMkdir  = "mkdir" // PATH, --parents
	FSMove   = "mv"    // SRC DST: rename(2), a directory included (onto an empty one too)
	FSRemove = "rm"    // PATH, --recursive for a directory with entries
	FSRead   = "read"  // PATH, --max N (bytes) → its bytes on stdout
	FSWrite  = "write" // PATH, --max N (bytes), --mode OCTAL: stdin into it (created or truncated)
)

// Exit codes of a failed file operation, so that the host can say what
// failed without parsing the message.
const (
	FSExitFailed   = 1 // anything else; the message says what
	FSExitUsage    = 2 // a bad command line
	FSExitNotFound = 3 // the path (or a parent) does not exist
	FSExitExists   = 4 // the path exists (mkdir without --parents, mv onto a directory with entries)
	FSExitDenied   = 5 // permission denied
	FSExitNotDir   = 6 // a parent is not a directory, or ls of a file
	FSExitIsDir    = 7 // read or write of a directory, rm of one with entries without --recursive
	FSExitTooBig   = 8 // past --max
)

// Bounds of one file operation.
const (
	// MaxListDepth bounds FileList's depth.
	MaxListDepth = 16
	// MaxListEntries bounds a FileList, whatever --max says.
	MaxListEntries = 100000
)

// Types of a FileEntry.
const (
	FileRegular = "file"
	FileDir     = "dir"
	FileSymlink = "symlink"
	FileOther   = "other"
)

// FileEntry is one file as stat(2) (lstat) sees it.
type FileEntry struct {
	// Path is as asked (stat) or the directory listed joined with the
	// entry's path under it (ls); Name is its last element.
	Path string `json:"path"`
	// Abs is the absolute path (stat only): a relative Path starts at the
	// caller's working directory, the user's home unless asked otherwise.
	Abs  string `json:"abs,omitempty"`
	Name string `json:"name"`
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is its permission bits and set-id/sticky bits (07777).
	Mode uint32 `json:"mode"`
	// ModTime is Unix time in nanoseconds.
	ModTime int64  `json:"mod_time"`
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
	Owner   string `json:"owner,omitempty"`
	Group   string `json:"group,omitempty"`
	// Target is a symlink's target, as it reads.
	Target string `json:"target,omitempty"`
}

// FileList is the result of ls: the entries under a directory, depth
// first in name order, to the depth asked; Truncated says that --max cut
// it.
type FileList struct {
	Entries   []FileEntry `json:"entries"`
	Truncated bool        `json:"truncated,omitempty"`
}

// FSArgv is the command of file operation op on paths, with its flags
// (depth for ls, parents for mkdir, recursive for rm, maxBytes for read
// and write and, for ls, the most entries; mode for write, 0: 0644).
func FSArgv(op string, o FSOptions, paths ...string) []string {
	argv := []string{AgentBinaryPath, FSCommand, op}
	if o.Depth > 0 {
		argv = append(argv, "--depth", strconv.Itoa(o.Depth))
	}
	if o.Max > 0 {
		argv = append(argv, "--max", strconv.FormatInt(o.Max, 10))
	}
	if o.Parents {
		argv = append(argv, "--parents")
	}
	if o.Recursive {
		argv = append(argv, "--recursive")
	}
	if o.Mode != 0 {
		argv = append(argv, "--mode", strconv.FormatUint(uint64(o.Mode), 8))
	}
	return append(append(argv, "--"), paths...)
}

// FSOptions are the flags of a file operation (FSArgv).
type FSOptions struct {
	Depth     int    // ls
	Max       int64  // ls: entries; read and write: bytes
	Parents   bool   // mkdir
	Recursive bool   // rm
	Mode      uint32 // write
}
