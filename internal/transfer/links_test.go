package transfer

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// deep is a/b/c/d/e/f/g/h, the directories of the chain in issue 30's
// finding 4.
func deep() []entry {
	var es []entry
	p := ""
	for _, d := range strings.Split("a/b/c/d/e/f/g/h", "/") {
		p += d
		es = append(es, dir(p))
		p += "/"
	}
	return es
}

// chain is n symlinks top/l0 -> l1 -> … -> l(n-1) -> f, and the file f.
func chain(n int) []entry {
	es := []entry{dir("top")}
	for i := range n {
		to := fmt.Sprintf("l%d", i+1)
		if i == n-1 {
			to = "f"
		}
		es = append(es, symlink(fmt.Sprintf("top/l%d", i), to))
	}
	return append(es, file("top/f", "x"))
}

// linkStreams are streams of symlinks a guest may answer a --get with.
// Each refused one leads out of the tree once its links are resolved
// against the tree's other links, in whichever order they come; a lexical
// join of each target on its own passes every one of them.
var linkStreams = []struct {
	name    string
	entries []entry
	want    string // "" for a stream that passes
}{
	// Finding 4: up resolves to a/b/c/d/e, so esc is four levels above a.
	{"chain through a link to an ancestor", append(deep(),
		symlink("a/b/c/d/e/f/g/h/up", "../../.."),
		symlink("a/b/c/d/e/f/g/h/esc", "up/../../../../../../../../etc/passwd")), "leads out of the transfer"},
	{"chain, the escaping link first", append(deep(),
		symlink("a/b/c/d/e/f/g/h/esc", "up/../../../../../../../../etc/passwd"),
		symlink("a/b/c/d/e/f/g/h/up", "../../..")), "leads out of the transfer"},
	{"through a link given later", []entry{dir("top"), dir("top/a"),
		symlink("top/a/l", "x/../.."), symlink("top/a/x", "..")}, "leads out of the transfer"},
	{"through a link given earlier", []entry{dir("top"), dir("top/a"),
		symlink("top/a/x", ".."), symlink("top/a/l", "x/../..")}, "leads out of the transfer"},
	{"through a link to a link", []entry{dir("top"), dir("top/d"), dir("top/d/e"),
		symlink("top/d/e/up", "../.."), symlink("top/d/e/up2", "up"), symlink("top/d/e/esc", "up2/../x")}, "leads out of the transfer"},
	{"out and back in by the top's name", []entry{dir("top"), file("top/x", "x"), symlink("top/l", "../top/x")}, "leads out of the transfer"},
	{"out through a name not in the tree", []entry{dir("top"), symlink("top/l", "missing/../../etc")}, "leads out of the transfer"},
	{"out through a file", []entry{dir("top"), file("top/f", "x"), symlink("top/l", "f/../../etc")}, "leads out of the transfer"},
	{"a loop", []entry{dir("top"), symlink("top/a", "b"), symlink("top/b", "a")}, "loop"},
	{"a loop to itself", []entry{dir("top"), symlink("top/a", "a/x")}, "loop"},
	{"a chain over the hop bound", chain(maxHops + 1), "more than 40 symlinks"},

	{"a chain at the hop bound", chain(maxHops), ""},
	{"to a directory given later", []entry{dir("top"), dir("top/bin"), symlink("top/bin/py", "../lib/py3/py"),
		dir("top/lib"), dir("top/lib/py3"), file("top/lib/py3/py", "#!")}, ""},
	{"dangling inside", []entry{dir("top"), symlink("top/l", "missing/x/..")}, ""},
	{"to the top", []entry{dir("top"), dir("top/d"), symlink("top/d/l", ".."), symlink("top/dot", ".")}, ""},
	// A lexical join refuses this one, which stays inside: x is two levels
	// deeper than itself.
	{"back up through a deeper link", []entry{dir("top"), dir("top/d"), dir("top/d/e"),
		symlink("top/x", "d/e"), symlink("top/y", "x/../..")}, ""},
	{"through links to directories", []entry{dir("top"), dir("top/d"), dir("top/d/e"),
		symlink("top/d/e/up", ".."), symlink("top/in", "d/e/up/e/up/./e/up/../d")}, ""},
}

func TestLinksResolveThroughTheTree(t *testing.T) {
	for _, tc := range linkStreams {
		t.Run(tc.name, func(t *testing.T) {
			s := craft(t, tc.entries...)
			var out bytes.Buffer
			_, err := Check(bytes.NewReader(s), &out, roomy)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrRefused)):
				t.Fatalf("Check: %v, want a refusal containing %q", err, tc.want)
			}
			// Into a guest, any target passes: it resolves there.
			if _, err := Check(bytes.NewReader(s), &bytes.Buffer{}, intoGuest); err != nil {
				t.Errorf("Check into a guest: %v", err)
			}

			base := t.TempDir()
			parent := filepath.Join(base, "parent")
			if err := os.Mkdir(parent, 0o755); err != nil {
				t.Fatal(err)
			}
			_, err = Extract(bytes.NewReader(s), parent, "out", roomy)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Extract: %v, want an error containing %q", err, tc.want)
				}
				if ents, _ := os.ReadDir(parent); len(ents) != 0 {
					t.Errorf("a refused stream left %v", names(ents))
				}
				return
			}
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if bad := linksOut(t, filepath.Join(parent, "out")); len(bad) > 0 {
				t.Errorf("links that lead out of the tree: %v", bad)
			}
		})
	}
}

// TestCheckWritesLinksLast: the checked stream holds every symlink after
// every file and directory, so a side that extracts it has the whole tree
// when the first link comes.
func TestCheckWritesLinksLast(t *testing.T) {
	s := craft(t, dir("top"), symlink("top/l", "d/f"), dir("top/d"), symlink("top/d/m", "f"), file("top/d/f", "x"))
	var out bytes.Buffer
	if _, err := Check(bytes.NewReader(s), &out, roomy); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range headers(t, out.Bytes()) {
		got = append(got, h.Name)
	}
	if want := []string{"top", "top/d", "top/d/f", "top/l", "top/d/m"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("checked stream's order %v, want %v", got, want)
	}
}

// linksOut resolves every symlink beneath root on the file system, as the
// kernel would (a missing name, or a file, as if it were a directory: the
// host may create one there later), and returns those whose resolution
// steps above root or follows more than maxHops links. It shares no code
// with the checker.
func linksOut(t testing.TB, root string) []string {
	var bad []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var dir []string
		if d := filepath.Dir(rel); d != "." {
			dir = strings.Split(d, "/")
		}
		hops := 0
		if _, ok := follow(root, dir, filepath.Base(rel), &hops); !ok {
			bad = append(bad, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bad
}

// follow resolves the symlink name in the directory dir (components
// beneath root) and returns where it leads; ok is false when a step
// leads above root or more than maxHops links are followed in all.
func follow(root string, dir []string, name string, hops *int) (_ []string, ok bool) {
	if *hops++; *hops > maxHops {
		return nil, false
	}
	target, err := os.Readlink(filepath.Join(slices.Concat([]string{root}, dir, []string{name})...))
	if err != nil || filepath.IsAbs(target) {
		return nil, false
	}
	pos := slices.Clone(dir)
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			if len(pos) == 0 {
				return nil, false
			}
			pos = pos[:len(pos)-1]
		default:
			fi, err := os.Lstat(filepath.Join(slices.Concat([]string{root}, pos, []string{c})...))
			if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
				pos = append(pos, c)
				continue
			}
			if pos, ok = follow(root, pos, c, hops); !ok {
				return nil, false
			}
		}
	}
	return pos, true
}

// headers reads the headers of the tar stream s.
func headers(t testing.TB, s []byte) []*tar.Header {
	t.Helper()
	var out []*tar.Header
	tr := tar.NewReader(bytes.NewReader(s))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
}

// FuzzExtract holds Extract's invariant for a stream from a guest: what
// it accepts creates nothing outside the destination's name, and no
// symlink there resolves (through the tree's other links) above it; what
// it refuses leaves nothing. What Extract accepts, Check accepts.
func FuzzExtract(f *testing.F) {
	for _, tc := range linkStreams {
		f.Add(craft(f, tc.entries...))
	}
	for _, tc := range hostile {
		f.Add(craft(f, tc.entries...))
	}
	f.Add(craft(f, dir("top"), dir("top/d"), file("top/d/f", "x"), symlink("top/l", "d/f"), symlink("top/d/up", "..")))
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		parent := filepath.Join(base, "parent")
		if err := os.Mkdir(parent, 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := Extract(bytes.NewReader(data), parent, "out", roomy)
		if ents, _ := os.ReadDir(base); len(ents) != 1 {
			t.Fatalf("Extract created %v beside its destination's directory", names(ents))
		}
		ents, _ := os.ReadDir(parent)
		if err != nil {
			if len(ents) != 0 {
				t.Fatalf("a refused stream (%v) left %v", err, names(ents))
			}
			return
		}
		if len(ents) != 1 || ents[0].Name() != "out" {
			t.Fatalf("the destination's directory holds %v, want only out", names(ents))
		}
		if bad := linksOut(t, filepath.Join(parent, "out")); len(bad) > 0 {
			t.Fatalf("links that lead out of the tree: %v", bad)
		}
		if _, err := Check(bytes.NewReader(data), &bytes.Buffer{}, roomy); err != nil {
			t.Fatalf("Extract accepted what Check refuses: %v", err)
		}
	})
}

// FuzzLinkTrees holds FuzzExtract's invariant over small trees of
// directories and symlinks that data describes (see linkTree), where the
// chains, loops and orders a guest may try are dense.
func FuzzLinkTrees(f *testing.F) {
	f.Add([]byte{0x04, 0x02, 0x12, 0x00, 0x01, 0x13, 0x21, 0x03})
	f.Add([]byte{0x03, 0x41, 0x00, 0x00, 0x06, 0x02, 0x0f, 0x00, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		es := linkTree(data)
		parent := t.TempDir()
		_, err := Extract(bytes.NewReader(craft(t, es...)), parent, "out", roomy)
		if err != nil {
			if ents, _ := os.ReadDir(parent); len(ents) != 0 {
				t.Fatalf("a refused stream (%v) left %v", err, names(ents))
			}
			return
		}
		if bad := linksOut(t, filepath.Join(parent, "out")); len(bad) > 0 {
			var tree []string
			for _, e := range es {
				tree = append(tree, e.name+map[bool]string{true: " -> " + e.link}[e.typ == tar.TypeSymlink])
			}
			t.Fatalf("%q: links that lead out of the tree: %v", tree, bad)
		}
	})
}

// linkTree reads a tree from data: the directory top, then entries of
// two bytes and, for a symlink, a target of up to 7 more. The first byte
// picks the kind (low 2 bits: directory, file, symlink, symlink) and the
// name among a few short paths; the second the target's length, whose
// elements are each "..", ".", "a", "b" or "c".
func linkTree(data []byte) []entry {
	paths := []string{"a", "b", "c", "a/a", "a/b", "a/c", "b/a", "b/b", "a/a/a", "a/a/b", "a/b/a", "b/a/a"}
	elems := []string{"..", "..", ".", "a", "b", "c"}
	es := []entry{dir("top")}
	for len(data) >= 2 && len(es) < 24 {
		kind, name, n := data[0]&3, "top/"+paths[int(data[0]>>2)%len(paths)], int(data[1]%8)
		data = data[2:]
		switch kind {
		case 0:
			es = append(es, dir(name))
		case 1:
			es = append(es, file(name, "x"))
		default:
			var target []string
			for ; n > 0 && len(data) > 0; n-- {
				target = append(target, elems[int(data[0])%len(elems)])
				data = data[1:]
			}
			if len(target) == 0 {
				target = []string{"."}
			}
			es = append(es, symlink(name, strings.Join(target, "/")))
		}
	}
	return es
}
