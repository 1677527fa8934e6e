package seccomp

import (
	"fmt"
	"slices"
	"strings"

	"syscall"
)

// Options selects the QEMU configuration the filter must let through.
type Options struct {
	// Accel is the accelerator QEMU runs with: "kvm" or "tcg". There is
	// no "auto": the caller has already chosen (vm.ResolveAccel: an
	// accelerator is never a silent guess).
	Accel string
	// Network is true when the guest NIC is connected with -netdev stream
	// over a Unix socket.
	Network bool
	// Incoming is true when QEMU restores from a migration stream on an
	// inherited fd (-incoming defer + migrate-incoming fd:N).
	Incoming bool
	// Program is the jailed program: "qemu" (the default; Accel,
	// Network and Incoming shape its filter) or "netstack", vmgated's
	// guest network role (a Go program; Accel is ignored). The
	// netstack's second filter, which it loads itself after its start-up,
	// is "netstack-serving": stacked on the first, it denies exec and new
	// processes and allows the rest.
	Program string
	// DefaultAction is what happens to a syscall no rule matches:
	// "errno" (EPERM; the default when empty) or "kill" (the whole process).
	DefaultAction string
}

// ActionKind is what a filter does with a matching syscall.
type ActionKind int

// Action kinds.
const (
	// Allow lets the syscall run.
	Allow ActionKind = iota
	// Errno fails the syscall with Action.Errno without running it.
	Errno
	// KillProcess kills the whole process with SIGSYS.
	KillProcess
)

// Action is a filter verdict.
type Action struct {
	Kind  ActionKind
	Errno syscall.Errno // only for Kind == Errno
}

// String renders the action as "allow", "errno(EPERM)" or "kill-process".
func (a Action) String() string {
	switch a.Kind {
	case Allow:
		return "allow"
	case Errno:
		return "errno(" + errnoName(a.Errno) + ")"
	case KillProcess:
		return "kill-process"
	}
	return fmt.Sprintf("action(%d)", a.Kind)
}

var (
	actAllow  = Action{Kind: Allow}
	actEPERM  = Action{Kind: Errno, Errno: errEPERM}
	actENOSYS = Action{Kind: Errno, Errno: errENOSYS}
	actKill   = Action{Kind: KillProcess}
)

// Op is an argument comparison.
type Op int

// Comparison operators; they map one to one onto libseccomp's.
const (
	// Equal matches when the argument equals Value.
	Equal Op = iota
	// NotEqual matches when the argument differs from Value.
	NotEqual
	// MaskedEqual matches when argument & Mask == Value.
	MaskedEqual
)

// Cond is one condition on a syscall argument. All conditions of a Rule
// must hold (AND); several Rules for one syscall are alternatives (OR).
type Cond struct {
	Arg   uint   // argument index, 0..5
	Op    Op     // comparison
	Value uint64 // compared value
	Mask  uint64 // only for MaskedEqual
	Name  string // human-readable value, for String
}

func (c Cond) String() string {
	name := c.Name
	if name == "" {
		name = fmt.Sprintf("%#x", c.Value)
	}
	switch c.Op {
	case Equal:
		return fmt.Sprintf("arg%d == %s", c.Arg, name)
	case NotEqual:
		return fmt.Sprintf("arg%d != %s", c.Arg, name)
	case MaskedEqual:
		return fmt.Sprintf("arg%d & %#x == %s", c.Arg, c.Mask, name)
	}
	return fmt.Sprintf("arg%d op(%d) %s", c.Arg, c.Op, name)
}

// Rule applies Action to Syscall when all Conds hold (or always, when
// Conds is empty).
type Rule struct {
	Syscall string
	Action  Action
	Conds   []Cond
	// Why says where the rule comes from: "traced: …" (seen in a strace
	// of QEMU with our command line, DERIVATION.md), "assumed: …" (from
	// documentation or source, untested here) or "deny: …".
	Why string
}

// RuleSet is a complete filter: the rules plus the actions for unmatched
// syscalls and foreign architectures. The zero value is not useful; build
// one with Rules.
type RuleSet struct {
	// Default applies to every syscall no rule matches.
	Default Action
	// BadArch applies to syscalls made with a non-x86_64 ABI (i386 int
	// 0x80, x32): always KillProcess.
	BadArch Action
	// Rules are sorted by syscall name, then by rendered conditions.
	Rules []Rule
	// Denied documents syscalls that are deliberately absent from the
	// allowlist (they get Default) and why. They are not filter rules.
	Denied []Rule
	// Warnings lists every relaxation of this rule set; Install logs each
	// as a "SECCOMP WARNING".
	Warnings []string
}

// Allowed reports whether name has at least one Allow rule (possibly
// conditional).
func (rs RuleSet) Allowed(name string) bool {
	for _, r := range rs.Rules {
		if r.Syscall == name && r.Action.Kind == Allow {
			return true
		}
	}
	return false
}

// Lookup returns the rules for syscall name, in order.
func (rs RuleSet) Lookup(name string) []Rule {
	var out []Rule
	for _, r := range rs.Rules {
		if r.Syscall == name {
			out = append(out, r)
		}
	}
	return out
}

// Names returns the distinct syscall names that have an Allow rule.
func (rs RuleSet) Names() []string {
	var out []string
	for _, r := range rs.Rules {
		if r.Action.Kind == Allow && (len(out) == 0 || out[len(out)-1] != r.Syscall) {
			out = append(out, r.Syscall)
		}
	}
	return out
}

// String renders the rule set as reviewable text: one line per rule,
// sorted, with conditions and provenance, then the documented denials and
// the warnings. The golden test keeps this text under review.
func (rs RuleSet) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "default: %s\n", rs.Default)
	fmt.Fprintf(&b, "bad-arch: %s\n", rs.BadArch)
	fmt.Fprintf(&b, "allowed-syscalls: %d\n", len(rs.Names()))
	b.WriteString("\n# rules (several lines for one syscall are alternatives)\n")
	for _, r := range rs.Rules {
		writeRule(&b, r)
	}
	b.WriteString("\n# denied (no allow rule: the default action applies)\n")
	for _, r := range rs.Denied {
		writeRule(&b, r)
	}
	b.WriteString("\n# warnings\n")
	for _, w := range rs.Warnings {
		fmt.Fprintf(&b, "SECCOMP WARNING: %s\n", w)
	}
	return b.String()
}

func writeRule(b *strings.Builder, r Rule) {
	fmt.Fprintf(b, "%-24s %-14s", r.Syscall, r.Action)
	if len(r.Conds) > 0 {
		cs := make([]string, len(r.Conds))
		for i, c := range r.Conds {
			cs[i] = c.String()
		}
		fmt.Fprintf(b, " if %s", strings.Join(cs, " && "))
	}
	if r.Why != "" {
		fmt.Fprintf(b, "  # %s", r.Why)
	}
	b.WriteString("\n")
}

func condString(cs []Cond) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = c.String()
	}
	return strings.Join(s, " && ")
}

func sortRules(rs []Rule) {
	slices.SortStableFunc(rs, func(a, b Rule) int {
		if c := strings.Compare(a.Syscall, b.Syscall); c != 0 {
			return c
		}
		return strings.Compare(condString(a.Conds), condString(b.Conds))
	})
}
