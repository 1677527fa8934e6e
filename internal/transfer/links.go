package transfer

import (
	"archive/tar"
	"strings"
)

// maxHops bounds the symlinks one link's resolution follows, nested ones
// included, as Linux's MAXSYMLINKS bounds a path lookup.
const maxHops = 40

// node is an entry of the tree a stream builds, as the checker knows it.
type node struct {
	name     string
	kind     byte             // tar.TypeDir, TypeReg or TypeSymlink
	parent   *node            // the directory holding it; nil for the top
	children map[string]*node // a directory's entries, by base name

	// A symlink's target and, once resolve has run, where it leads.
	target string
	state  linkState
	at     spot
	hops   int // symlinks its resolution follows, itself included
}

type linkState uint8

const (
	unresolved linkState = iota
	resolving
	resolved
)

// spot is a position in the tree: below names, none of which is in the
// tree, beneath the node n (a directory, or a file).
type spot struct {
	n     *node
	below int
}

// add records the checked entry name of type typ beneath parent (nil for
// the top).
func (c *checker) add(name string, typ byte, parent *node, target string) {
	n := &node{name: name, kind: typ, parent: parent, target: target}
	if parent != nil {
		if parent.children == nil {
			parent.children = map[string]*node{}
		}
		parent.children[name[strings.LastIndexByte(name, '/')+1:]] = n
	}
	c.nodes[name] = n
	if typ == tar.TypeSymlink {
		c.links = append(c.links, n)
	}
}

// checkLinks applies the symlink rule of a stream from a guest to the
// whole tree, once its last entry is in: each link, resolved through the
// tree's other links, must never step above the top, and must follow at
// most maxHops links. It reports the first link, in stream order, that
// fails.
func (c *checker) checkLinks() error {
	if c.rules.Dir != FromGuest {
		return nil
	}
	for _, l := range c.links {
		if err := c.resolve(l, 0); err != nil {
			return err
		}
	}
	return nil
}

// resolve finds where the symlink l leads, as the kernel resolves it: its
// target's names from l's directory, each symlink among them resolved in
// its turn, ".." to the parent of where the walk is, after a symlink too.
// A name the tree does not hold, or one beneath a file, counts as a
// directory: what the host may create there later must not open a way
// out. depth is how many resolutions are under way around this one.
//
// Each link is resolved once (its place and hops are kept), so the work
// is linear in the bytes of the stream's targets.
func (c *checker) resolve(l *node, depth int) error {
	switch l.state {
	case resolved:
		return nil
	case resolving:
		return refused(l.name, "symlink loop (to %q)", l.target)
	}
	if depth >= maxHops {
		return refused(l.name, "resolves through more than %d symlinks", maxHops)
	}
	l.state = resolving
	at, hops := spot{n: l.parent}, 1
	for c2 := range strings.SplitSeq(l.target, "/") {
		switch c2 {
		case "", ".":
		case "..":
			switch {
			case at.below > 0:
				at.below--
			case at.n.parent == nil:
				return refused(l.name, "symlink (to %q) leads out of the transfer, above its top", l.target)
			default:
				at.n = at.n.parent
			}
		default:
			next := at.n.children[c2]
			switch {
			case at.below > 0 || next == nil:
				at.below++
			case next.kind == tar.TypeSymlink:
				if err := c.resolve(next, depth+1); err != nil {
					return err
				}
				if hops += next.hops; hops > maxHops {
					return refused(l.name, "resolves through more than %d symlinks", maxHops)
				}
				at = next.at
			default:
				at = spot{n: next}
			}
		}
	}
	l.state, l.at, l.hops = resolved, at, hops
	return nil
}
