// Package transfer moves files between a host and a guest as a tar stream:
// vm-exec --put/--get and vm-exec cp. The same rules apply on all three
// sides: the client packs and extracts, vmgated checks and audits every
// stream it relays, and the guest agent extracts and packs.
//
// Threat model. The guest is hostile: anything a guest sends (the answer
// to a --get) may be crafted to write outside the caller's target, to
// plant a device node or a symlink that points elsewhere on the host, or
// to exhaust the host's disk (a tar bomb). So:
//
//   - A stream holds one tree: its first entry is the top (a regular file
//     or a directory, one path element), every other entry lies beneath it,
//     in clean relative names, below a directory entry already seen, each
//     name once. Nothing else is accepted: no "..", no absolute names, no
//     hard links, devices, FIFOs or sockets.
//   - A symlink from a guest ([FromGuest]) must be relative and stay inside
//     the tree; into a guest ([IntoGuest]) any link target passes, since it
//     resolves in the guest only. "Inside" is decided as the kernel will
//     resolve the link on the host, not by joining its target to its name:
//     each name of the target is looked up in the tree, a symlink among
//     them is resolved in its turn (so "up/../x", with up -> "../..",
//     climbs from where up leads), and a ".." from the top is refused,
//     even one that comes back down by the top's name (the tree may land
//     under another name, beside other files). A name the tree does not
//     hold counts as a directory, so that what the host creates there
//     later opens no way out either. A resolution that follows more than
//     maxHops (40) symlinks, or a loop, is refused. Entry order is the
//     sender's choice, so a link may come before the links its target
//     goes through: the rule is applied once the tree is whole, to every
//     link, and symlinks reach the other side only then. [Check] writes
//     them after every file and directory; [Extract] creates them last,
//     so nothing is ever written through a symlink of the tree, and no
//     symlink exists on the host before its resolution has passed.
//   - Limits bound the entries and the bytes of a stream; an entry over a
//     limit is refused from its header, before its content is read.
//   - [Extract] writes beneath a fresh staging directory opened as an
//     os.Root, so no name, and no symlink in the tree, can reach outside it,
//     and renames the finished tree into place: a refused or broken stream
//     leaves nothing behind, and only a regular file replaces anything (a
//     regular file). Modes keep the permission bits only (no set-id bits).
//
// [Check] applies the rules to a stream and writes a normalised copy;
// vmgated relays only that copy, and records its size, entry count and
// SHA-256 (of each file, when the stream is one file).
//
// [Pack] reads a local tree that may change under it: it opens each file
// without following a symlink or blocking on a FIFO, and sends it only if
// the open file is the one the walk's lstat found (same device, inode,
// and a regular file), so a file swapped for a link meanwhile is not read
// through the link.

package transfer

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"
)

// Limits bound one stream. Zero values mean "none allowed", not "no limit".
type Limits struct {
	MaxBytes int64 // file content, all entries together
	MaxFiles int   // entries: files, directories and symlinks
}

// Rules are what a stream must satisfy.
type Rules struct {
	Dir Direction
	Limits
	// Top, when set, is the name the stream's first entry must have.
	Top string
}

// Direction selects the symlink rule.
type Direction int

const (
	// FromGuest: a stream a guest produced, to be written on the host.
	FromGuest Direction = iota
	// IntoGuest: a stream to be written in a guest.
	IntoGuest
)

// Summary describes a checked stream.
type Summary struct {
	Top   string `json:"top"`   // name of the first entry
	Files int    `json:"files"` // entries
	Bytes int64  `json:"bytes"` // content bytes
	// SHA256 is the hex SHA-256 of the stream as written (Check) or read
	// (Extract), tar headers included.
	SHA256 string `json:"sha256"`
	// FileSHA256 is the hex SHA-256 of the content when the stream is one
	// regular file.
	FileSHA256 string `json:"file_sha256,omitempty"`
}

// ErrLimit is wrapped by errors about a stream over its Limits.
var ErrLimit = errors.New("over the transfer limit")

// ErrRefused is wrapped by errors about an entry the rules refuse.
var ErrRefused = errors.New("refused")

// maxName bounds an entry's name and link target.
const maxName = 4096

// checker applies the rules to a stream's headers in order (check), then
// to the whole tree (checkLinks).
type checker struct {
	rules Rules
	top   string
	nodes map[string]*node // the entries so far, by name
	links []*node          // the symlinks among them, in stream order
	sum   Summary
}

func newChecker(r Rules) *checker {
	return &checker{rules: r, nodes: map[string]*node{}}
}

func refused(name, format string, args ...any) error {
	return fmt.Errorf("entry %q: %w: %s", name, ErrRefused, fmt.Sprintf(format, args...))
}

// ValidTop reports whether name can be the top of a stream: one path
// element, not "." or "..".
func ValidTop(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00") && len(name) <= 255
}

// check validates h, the next header of the stream, and returns the
// entry's type: tar.TypeReg, TypeDir or TypeSymlink. Limits count h.
func (c *checker) check(h *tar.Header) (byte, error) {
	name := strings.TrimSuffix(h.Name, "/")
	typ := h.Typeflag // archive/tar reads an old TypeRegA as TypeReg
	switch {
	case len(name) > maxName || strings.ContainsRune(name, 0):
		return 0, refused(name[:min(len(name), 64)], "name longer than %d bytes or holding a NUL", maxName)
	case name == "" || strings.HasPrefix(name, "/"):
		return 0, refused(name, "not a relative name")
	case path.Clean(name) != name || name == "." || slices.Contains(strings.Split(name, "/"), ".."):
		return 0, refused(name, "not a clean name (no \"..\", \".\" or empty elements)")
	}
	switch typ {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
	case tar.TypeLink:
		return 0, refused(name, "hard links are not copied")
	case tar.TypeChar, tar.TypeBlock:
		return 0, refused(name, "device files are not copied")
	case tar.TypeFifo:
		return 0, refused(name, "FIFOs are not copied")
	default:
		return 0, refused(name, "entry type %q is not copied", typ)
	}
	var parent *node
	if c.top == "" {
		if !ValidTop(name) {
			return 0, refused(name, "the first entry must be one path element")
		}
		if typ == tar.TypeSymlink {
			return 0, refused(name, "the top of a transfer must be a file or a directory")
		}
		if want := c.rules.Top; want != "" && name != want {
			return 0, refused(name, "the transfer is of %q", want)
		}
		c.top, c.sum.Top = name, name
	} else {
		parent = c.nodes[path.Dir(name)]
		if parent == nil || parent.kind != tar.TypeDir {
			return 0, refused(name, "not beneath a directory of the transfer")
		}
		if _, dup := c.nodes[name]; dup {
			return 0, refused(name, "given twice")
		}
	}
	if typ == tar.TypeSymlink {
		if err := c.checkTarget(name, h.Linkname); err != nil {
			return 0, err
		}
	}
	if typ == tar.TypeReg && h.Size < 0 {
		return 0, refused(name, "negative size")
	}
	c.sum.Files++
	if c.sum.Files > c.rules.MaxFiles {
		return 0, fmt.Errorf("entry %q: %w: more than %d files", name, ErrLimit, c.rules.MaxFiles)
	}
	if typ == tar.TypeReg {
		c.sum.Bytes += h.Size
		if c.sum.Bytes > c.rules.MaxBytes || c.sum.Bytes < 0 {
			return 0, fmt.Errorf("entry %q: %w: more than %d bytes", name, ErrLimit, c.rules.MaxBytes)
		}
	}
	c.add(name, typ, parent, h.Linkname)
	return typ, nil
}

// checkTarget applies the part of the symlink rule that needs only the
// link; checkLinks applies the rest once the tree is whole.
func (c *checker) checkTarget(name, target string) error {
	switch {
	case target == "" || len(target) > maxName || strings.ContainsRune(target, 0):
		return refused(name, "empty symlink target, or longer than %d bytes, or holding a NUL", maxName)
	case c.rules.Dir == IntoGuest:
		return nil
	case strings.HasPrefix(target, "/"):
		return refused(name, "absolute symlink (to %q) from the guest", target)
	}
	return nil
}

// next reads the next header of tr and checks it; io.EOF at the end.
func (c *checker) next(tr *tar.Reader) (*tar.Header, byte, error) {
	h, err := tr.Next()
	if errors.Is(err, io.EOF) {
		return nil, 0, io.EOF
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read tar stream: %w", err)
	}
	typ, err := c.check(h)
	return h, typ, err
}

// header returns the normalised header of a checked entry: name, type,
// permission bits, size, link target, modification time; nothing else
// (owners, set-id bits, xattrs) passes.
func header(h *tar.Header, typ byte) *tar.Header {
	out := &tar.Header{Typeflag: typ, Name: strings.TrimSuffix(h.Name, "/"), Mode: h.Mode & 0o777,
		ModTime: h.ModTime.Truncate(time.Second), Format: tar.FormatPAX}
	switch typ {
	case tar.TypeReg:
		out.Size = h.Size
	case tar.TypeSymlink:
		out.Linkname = h.Linkname
	}
	return out
}

// fileHash hashes the content of a stream that is one regular file.
type fileHash struct {
	h     hash.Hash
	count int
}

func (f *fileHash) entry(typ byte) io.Writer {
	f.count++
	if typ != tar.TypeReg || f.count > 1 {
		f.h = nil
		return io.Discard
	}
	f.h = sha256.New()
	return f.h
}

func (f *fileHash) sum() string {
	if f.h == nil || f.count != 1 {
		return ""
	}
	return hex.EncodeToString(f.h.Sum(nil))
}

// Check reads a tar stream from r, applies the rules to it and writes a
// normalised stream of the same tree to w: its files and directories in
// the order they came, then its symlinks, written only once the whole
// tree has passed. It stops at the first refused entry, before writing
// any of it. An empty stream is an error.
func Check(r io.Reader, w io.Writer, rules Rules) (Summary, error) {
	c := newChecker(rules)
	out := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(w, out))
	tr := tar.NewReader(r)
	var fh fileHash
	var links []*tar.Header // at most MaxFiles, of names and targets within maxName
	for {
		h, typ, err := c.next(tr)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return c.sum, err
		}
		cw := fh.entry(typ)
		if typ == tar.TypeSymlink {
			links = append(links, header(h, typ))
			continue
		}
		if err := tw.WriteHeader(header(h, typ)); err != nil {
			return c.sum, fmt.Errorf("write tar stream: %w", err)
		}
		if typ == tar.TypeReg {
			if _, err := io.Copy(io.MultiWriter(tw, cw), tr); err != nil {
				return c.sum, fmt.Errorf("copy %q: %w", h.Name, err)
			}
		}
	}
	if c.top == "" {
		return c.sum, errors.New("empty tar stream: nothing to copy")
	}
	if err := c.checkLinks(); err != nil {
		return c.sum, err
	}
	for _, h := range links {
		if err := tw.WriteHeader(h); err != nil {
			return c.sum, fmt.Errorf("write tar stream: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return c.sum, fmt.Errorf("write tar stream: %w", err)
	}
	c.sum.SHA256 = hex.EncodeToString(out.Sum(nil))
	c.sum.FileSHA256 = fh.sum()
	return c.sum, nil
}

// fileMode is the permission of a checked entry as it is created.
func fileMode(h *tar.Header) fs.FileMode { return fs.FileMode(h.Mode) & fs.ModePerm }
