package policy

import (
	"fmt"
	"strings"

	"github.com/vmgate/vmgate/policy/netrule"
)

// NetLimit narrows a profile's network: only the egress rules in Allow
// (network.allow syntax), none meaning no network at all. A request may
// carry one (vm-exec --no-network, --net-allow), and a session may be
// locked to one for the rest of its life (vm-exec --net-lock). Each rule
// must be within what the profile allows (and within the session's lock):
// a rule that is not is refused, naming it, never clamped.
type NetLimit struct {
	Allow []string `json:"allow"`
}

// The rules that refuse a network narrowing, in Verdict.Rule.
const (
	// RuleNetAllow refuses a rule outside the profile's network.allow.
	RuleNetAllow = "network.allow"
	// RuleNetLock refuses a rule outside the session's network lock.
	RuleNetLock = "session network lock"
)

// What narrowed a verdict's network, in Verdict.NetNarrowed.
const (
	NarrowedByRequest = "request"
	NarrowedByLock    = "session lock"
)

// Bounds of a NetLimit, whatever the profile says.
const (
	// MaxNetRules is the largest number of rules in a NetLimit.
	MaxNetRules = 64
	// MaxNetRuleBytes is the longest rule (a DNS name is at most 253).
	MaxNetRuleBytes = 300
)

// maxListed bounds the rules a reason lists.
const maxListed = 8

// checkNetLimit returns the reason to refuse a limit of the wrong shape,
// or "".
func checkNetLimit(l *NetLimit) string {
	if l == nil {
		return ""
	}
	if len(l.Allow) > MaxNetRules {
		return fmt.Sprintf("%d network rules; the limit is %d", len(l.Allow), MaxNetRules)
	}
	for i, r := range l.Allow {
		if len(r) > MaxNetRuleBytes {
			return fmt.Sprintf("network rule %d is %d bytes; the limit is %d", i, len(r), MaxNetRuleBytes)
		}
	}
	return ""
}

// narrowNet is the network of a request under prof's network, the
// session's lock (nil: none) and the request's own limit (nil: none):
// the egress to enforce (nil: no NIC) and what narrowed it; or the rule
// and reason of a refusal. Pure.
//
// The lock's rules were checked when it was set; a rule of it that does
// not parse now (a damaged state file) allows nothing. A profile without
// a network has nothing to narrow: a limit that names a rule is refused,
// an empty one is no change.
func narrowNet(prof *NetworkPolicy, lock, req *NetLimit) (net *NetworkPolicy, narrowed []string, rule, reason string) {
	if prof == nil {
		if req != nil && len(req.Allow) > 0 {
			return nil, nil, RuleNetAllow, fmt.Sprintf("network rule %s: the profile has no network (network.mode = %q)", quote(req.Allow[0]), networkNone)
		}
		return nil, nil, "", ""
	}
	rules := prof.Rules
	if lock != nil {
		locked, _ := netrule.ParseRules(lock.Allow) // rules that do not parse allow nothing
		rules = rules.Intersect(locked)
		narrowed = append(narrowed, NarrowedByLock)
	}
	if req != nil {
		asked, rule, reason := within(req.Allow, prof.Rules, rules, lock != nil)
		if reason != "" {
			return nil, nil, rule, reason
		}
		rules = asked
		narrowed = append([]string{NarrowedByRequest}, narrowed...)
	}
	out := *prof
	out.Rules = rules
	return &out, narrowed, "", ""
}

// within parses list and checks that each rule is within the profile's
// rules and within allowed (the profile's under the session's lock, when
// locked): the rules, or the rule and reason of a refusal.
func within(list []string, profile, allowed netrule.Rules, locked bool) (netrule.Rules, string, string) {
	var out netrule.Rules
	for _, s := range list {
		r, err := netrule.ParseRule(s)
		if err != nil {
			return nil, RuleNetAllow, fmt.Sprintf("%v (want HOST:PORT, *.DOMAIN:PORT or CIDR:PORT; PORT may be *)", err)
		}
		if _, ok := profile.Covering(r); !ok {
			return nil, RuleNetAllow, fmt.Sprintf("network rule %s is not within the profile's network.allow (%s): a request may only narrow it", quote(s), listRules(profile))
		}
		if _, ok := allowed.Covering(r); !ok && locked {
			return nil, RuleNetLock, fmt.Sprintf("network rule %s is not within the session's network lock (%s): a locked session's network only narrows", quote(s), listRules(allowed))
		}
		out = append(out, r)
	}
	return out, "", ""
}

// listRules lists rules for a reason: at most maxListed, then a count.
func listRules(rs netrule.Rules) string {
	if len(rs) == 0 {
		return "nothing"
	}
	var b strings.Builder
	for i, r := range rs {
		if i == maxListed {
			fmt.Fprintf(&b, " and %d more", len(rs)-maxListed)
			break
		}
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(r.Text)
	}
	return b.String()
}

// DecideNetLock decides id's request to lock a session's network to want
// for the rest of the session's life (vm-exec --net-lock): allowed when
// DecideSession allows the session's image (image; "": the profile's)
// and every rule of want is within the
// profile's network.allow and within the session's present lock (old;
// nil: none), so that a lock only ever narrows. The verdict's Network is
// the session's network under the new lock (nil: the profile has none),
// Rule "network lock". Pure.
func (p *Policy) DecideNetLock(id Identity, image string, old *NetLimit, want NetLimit) Verdict {
	v := p.DecideSession(id, image)
	if !v.Allowed {
		return v
	}
	prof, _ := p.profileFor(id)
	if reason := checkNetLimit(&want); reason != "" {
		return Verdict{Profile: prof.name, Reason: reason}
	}
	if _, _, rule, reason := narrowNet(prof.net, old, &want); reason != "" {
		return Verdict{Profile: prof.name, Rule: rule, Reason: reason}
	}
	v.Network, v.NetNarrowed, _, _ = narrowNet(prof.net, &want, nil)
	rules, _ := netrule.ParseRules(want.Allow) // each parsed above
	v.Rule, v.Reason = "network lock", "the session's network is locked to "+listRules(rules)
	return v
}

// SessionNetwork is the network a session's VM has between its commands,
// under p: its caller id's profile's network, narrowed by the session's
// lock (nil: none) and by the limit its last command asked for (nil:
// none), each by intersection, so that nothing is ever widened: a rule of
// either that is no longer within the profile allows only what the two
// share. nil: the profile has no network (or none matches id), and the
// VM's NIC allows nothing. A reload re-decides every running session's
// network so, and a fork's copies get theirs so. Pure.
func (p *Policy) SessionNetwork(id Identity, lock, last *NetLimit) (net *NetworkPolicy, narrowed []string) {
	if p == nil {
		return nil, nil
	}
	prof, _ := p.profileFor(id)
	if prof == nil || prof.net == nil {
		return nil, nil
	}
	rules := prof.net.Rules
	if lock != nil {
		locked, _ := netrule.ParseRules(lock.Allow) // rules that do not parse allow nothing
		rules = rules.Intersect(locked)
		narrowed = append(narrowed, NarrowedByLock)
	}
	if last != nil {
		asked, _ := netrule.ParseRules(last.Allow)
		rules = rules.Intersect(asked)
		narrowed = append([]string{NarrowedByRequest}, narrowed...)
	}
	out := *prof.net
	out.Rules = rules
	return &out, narrowed
}
