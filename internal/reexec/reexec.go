// Package reexec is vmgated's registry of re-exec roles: the jail's init
// (package isolate), the image build's customize and mkfs steps (package
// cmd/vmgated/imagebuild). A role is registered under a name with [Register], and
// [MaybeRunChild], the first call in main, runs the registered function
// when the process was started as that role. The role travels in the
// environment variable [ChildEnv], never as a user-visible command-line
// verb, and is removed from the environment before the role's function
// runs, so grandchildren do not inherit it. Only /proc/self/exe is
// re-exec'd. The registry grants nothing: each role validates its own
// inputs as untrusted data.
package reexec

import (
	"fmt"
	"os"
	"sync"
)

// ChildEnv names the environment variable that selects a re-exec role.
const ChildEnv = "VMGATE_REEXEC"

var (
	regMu    sync.Mutex
	registry = map[string]func(args []string) error{}
)

// Register records fn as the entry point of the child role name. It panics on
// an empty or duplicate name: both are programming errors found at start-up.
func Register(name string, fn func(args []string) error) {
	regMu.Lock()
	defer regMu.Unlock()
	if name == "" || fn == nil {
		panic("reexec: Register with empty name or nil func")
	}
	if _, dup := registry[name]; dup {
		panic("reexec: duplicate re-exec role " + name)
	}
	registry[name] = fn
}

// MaybeRunChild runs the registered role named by ChildEnv, if any, and exits
// the process: status 0 when the role returns nil, 1 after printing the error
// otherwise. It returns only when the process is not a child role.
func MaybeRunChild() {
	name, ok := os.LookupEnv(ChildEnv)
	if !ok {
		return
	}
	_ = os.Unsetenv(ChildEnv)
	regMu.Lock()
	fn := registry[name]
	regMu.Unlock()
	if fn == nil {
		fmt.Fprintf(os.Stderr, "vmgated: unknown re-exec role %q\n", name)
		os.Exit(2)
	}
	if err := fn(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "vmgated %s: %v\n", name, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// ChildCommandEnv returns an environment for starting role name: env with
// any previous ChildEnv entry removed and the role appended.
func ChildCommandEnv(env []string, name string) []string {
	out := make([]string, 0, len(env)+1)
	prefix := ChildEnv + "="
	for _, kv := range env {
		if len(kv) >= len(prefix) && kv[:len(prefix)] == prefix {
			continue
		}
		out = append(out, kv)
	}
	return append(out, prefix+name)
}
