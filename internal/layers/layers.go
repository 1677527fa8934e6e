// Package layers is the module's architecture as a rule: every package
// stands on a floor, and a package imports only from its own floor or
// below. From the ground up:
//
//  0. leaves: the shared rules and small libraries that import no other
//     package of the module (internal/…, policy/netrule, the agent
//     protocol's contract guest/agentproto);
//  1. the policy and the jail (policy, isolate/…);
//  2. the guest side (guest/…): agent, /init, the
//     protocol's connection; it never imports the host's VM packages;
//  3. the host's VM layer (vm, vm/image, vm/netstack, vm/netproc);
//  4. the daemon and its protocol (gateway/…);
//  5. the commands and their apps (cmd/…), and the shipped files'
//     checks (contrib).
//
// A second rule holds across floors: no two top-level folders import each
// other (Folders), so that each folder can be read, and moved, as one
// piece: internal/ imports nothing of policy/, the guest tree nothing of
// vm/.
//
// Tests are not held to it (a test may reach any floor); the test of this
// package runs go list over the module and fails on an upward import or
// on two folders that import each other.
package layers

import (
	"fmt"
	"sort"
	"strings"
)

// Module is the module path.
const Module = "github.com/vmgate/vmgate"

// floors lists each floor's path prefixes (relative to the module); the
// longest matching prefix decides a package's floor.
var floors = []struct {
	name     string
	prefixes []string
}{
	{"leaves", []string{"internal/", "policy/netrule", "guest/agentproto"}},
	{"policy and jail", []string{"policy", "isolate"}},
	{"guest", []string{"guest"}},
	{"host VM", []string{"vm"}},
	{"daemon", []string{"gateway"}},
	{"commands", []string{"cmd", "contrib"}},
}

// Floor returns the floor of the package at rel (a path relative to the
// module) and its name; ok is false for a path on no floor.
func Floor(rel string) (floor int, name string, ok bool) {
	best, bestLen := -1, -1
	for i, f := range floors {
		for _, p := range f.prefixes {
			if matches(rel, p) && len(p) > bestLen {
				best, bestLen = i, len(p)
			}
		}
	}
	if best < 0 {
		return 0, "", false
	}
	return best, floors[best].name, true
}

func matches(rel, prefix string) bool {
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(rel, prefix)
	}
	return rel == prefix || strings.HasPrefix(rel, prefix+"/")
}

// Check returns one message per import of imports (package → the
// module's packages it imports, full paths) that runs up a floor, or that
// names a package on no floor, sorted.
func Check(imports map[string][]string) []string {
	var out []string
	for pkg, deps := range imports {
		rel, ok := strings.CutPrefix(pkg, Module+"/")
		if !ok {
			continue
		}
		f, fname, ok := Floor(rel)
		if !ok {
			out = append(out, fmt.Sprintf("%s stands on no floor (add it to package layers)", rel))
			continue
		}
		for _, d := range deps {
			drel, ok := strings.CutPrefix(d, Module+"/")
			if !ok {
				continue
			}
			g, gname, ok := Floor(drel)
			if !ok {
				out = append(out, fmt.Sprintf("%s stands on no floor (add it to package layers)", drel))
				continue
			}
			if g > f {
				out = append(out, fmt.Sprintf("%s (%s) imports %s (%s): an import up a floor", rel, fname, drel, gname))
			}
		}
	}
	sort.Strings(out)
	return out
}

// Folders returns one message per pair of the module's top-level folders
// that import each other (through any of their packages), sorted.
func Folders(imports map[string][]string) []string {
	top := func(pkg string) (string, bool) {
		rel, ok := strings.CutPrefix(pkg, Module+"/")
		if !ok {
			return "", false
		}
		dir, _, _ := strings.Cut(rel, "/")
		return dir, true
	}
	edge := map[[2]string]string{} // folder -> folder: one import that makes it
	for pkg, deps := range imports {
		a, ok := top(pkg)
		if !ok {
			continue
		}
		for _, d := range deps {
			if b, ok := top(d); ok && a != b {
				if _, seen := edge[[2]string{a, b}]; !seen {
					edge[[2]string{a, b}] = strings.TrimPrefix(pkg, Module+"/") + " imports " + strings.TrimPrefix(d, Module+"/")
				}
			}
		}
	}
	var out []string
	for e, why := range edge {
		if back, ok := edge[[2]string{e[1], e[0]}]; ok && e[0] < e[1] {
			out = append(out, fmt.Sprintf("folders %s and %s import each other (%s; %s)", e[0], e[1], why, back))
		}
	}
	sort.Strings(out)
	return out
}
