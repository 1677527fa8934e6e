package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Explain describes the policy for a person, as `vmgated policy check FILE`
// prints it: each profile in order, whom it matches, its guest and limits,
// its argv rules, and a "relaxations" list that names every setting that
// widens what callers can do.
func (p *Policy) Explain() string {
	if p == nil {
		return "no policy: every request is denied\n"
	}
	var b strings.Builder
	n := len(p.profiles)
	fmt.Fprintf(&b, "policy %s: version 1, %d %s.\n", p.source, n, plural(n, "profile", "profiles"))
	b.WriteString("Profiles are tried in order; the first whose match fits the caller decides.\n")
	b.WriteString("A caller that no profile matches is denied.\n")
	b.WriteString("An SSH key (vmgated serve --ssh-listen) gets the profile its authorized-keys entry names, if that profile accepts keys (match.ssh or match.any).\n")
	if p.Seccomp() == "off" {
		b.WriteString("RELAXATION: isolate.seccomp = \"off\": QEMU runs in its jail without the seccomp allowlist.\n")
	} else {
		b.WriteString("QEMU runs jailed with the seccomp allowlist (isolate.seccomp = \"required\").\n")
	}
	switch p.Cgroups() {
	case "off":
		b.WriteString("RELAXATION: isolate.cgroups = \"off\": QEMU's memory, tasks and CPU are bounded by rlimits only.\n")
	case "required":
		b.WriteString("Each VM's jail gets a cgroup with memory, pids and cpu limits; vmgated does not start without one (isolate.cgroups = \"required\").\n")
	default:
		b.WriteString("Each VM's jail gets a cgroup with memory, pids and cpu limits when vmgated has a delegated cgroup; otherwise rlimits only, logged at start (isolate.cgroups = \"auto\").\n")
	}
	if p.GuestASLR() == "on" {
		b.WriteString("Guests keep their address space randomisation (isolate.guest_aslr = \"on\").\n")
	} else {
		b.WriteString("RELAXATION (under TCG with QEMU before 8.0 only): guests run without address space randomisation, which makes each exec translate its code again there (isolate.guest_aslr = \"auto\").\n")
	}
	for i, prof := range p.profiles {
		b.WriteString("\n")
		prof.explain(&b, i, n)
	}
	return b.String()
}

// explain describes profile i of n: whom it matches, its guest and
// limits, what its callers may do, its argv rules, and its relaxations.
func (prof *profile) explain(b *strings.Builder, i, n int) {
	fmt.Fprintf(b, "%s (%d of %d)\n", prof.label(), i+1, n)
	prof.explainGuest(b)
	prof.explainAccess(b)
	prof.explainArgv(b)
	relax, notes := prof.relaxations()
	if len(relax) > 0 {
		b.WriteString("  relaxations:\n")
		for _, r := range relax {
			fmt.Fprintf(b, "    ! %s\n", r)
		}
	}
	for _, nt := range notes {
		fmt.Fprintf(b, "  note: %s\n", nt)
	}
}

// explainGuest writes whom the profile matches, its guest, its limits
// and its network.
func (prof *profile) explainGuest(b *strings.Builder) {
	l := &prof.limits
	fmt.Fprintf(b, "  matches:  %s\n", prof.match.describe())
	user := prof.user
	if len(prof.users) > 1 {
		user += " (a caller may name " + strings.Join(prof.users, ", ") + ")"
	}
	image := strconv.Quote(prof.image)
	if refs := prof.imageList(); len(refs) > 1 || refs[0].digest != "" {
		var list []string
		for _, r := range refs {
			list = append(list, r.String())
		}
		image += " (a caller may name " + strings.Join(list, ", ") + ")"
	}
	fmt.Fprintf(b, "  guest:    image %s, user %s, %d %s, %d MiB memory, %d MiB to write on its disk, network %s\n",
		image, user, l.CPUs, plural(l.CPUs, "CPU", "CPUs"), l.MemoryMiB, l.DiskMiB, prof.network)
	fmt.Fprintf(b, "  limits:   timeout %s by default, at most %s; output %s per stream; at most %d %s at once, %d per caller (%d more waiting)\n",
		formatDuration(l.Timeout), formatDuration(prof.timeoutMax), formatSize(l.OutputLimit), l.MaxVMs, plural(l.MaxVMs, "VM", "VMs"), l.CallerVMs, l.CallerQueue)
	if nw := prof.net; nw != nil {
		var rules []string
		for _, r := range nw.Rules {
			rules = append(rules, r.Text)
		}
		fmt.Fprintf(b, "  network:  egress only to %s (names must resolve to public addresses); at most %d connections at once, %d a minute, %s per VM\n",
			strings.Join(rules, ", "), nw.MaxConns, nw.ConnectRate, formatSize(nw.MaxBytes))
		for _, p := range nw.AllowedRanges {
			fmt.Fprintf(b, "  RELAXATION: network.allow_ranges %s: names may resolve into this range\n", p)
		}
	}
}

// explainAccess writes what the profile's callers may do besides argv:
// shell strings, sessions, the audit log's rotation, SSH, environment.
func (prof *profile) explainAccess(b *strings.Builder) {
	l := &prof.limits
	fmt.Fprintf(b, "  shell:    %s\n", yesNo(prof.allowShell, "allowed (vm-exec -c)", "not allowed"))
	if l.AllowSessions {
		fmt.Fprintf(b, "  sessions: %s\n", l.describeSessions())
	}
	if prof.rotate {
		b.WriteString("  audit:    its local callers may rotate the audit log (audit_rotate = true)\n")
	}
	if prof.match.acceptsKeys(DoorSSH) {
		ssh := "nothing: SSH commands are shell strings and need allow_shell = true"
		switch {
		case prof.allowShell && l.AllowSessions:
			ssh = "commands (run as sh -c STRING) and interactive shells"
		case prof.allowShell:
			ssh = "commands (run as sh -c STRING); no interactive shells (they need sessions.allowed)"
		}
		fmt.Fprintf(b, "  ssh:      %s\n", ssh)
	}
	if prof.match.acceptsKeys(DoorE2B) {
		e2b := "sandboxes with commands (run as bash -l -c STRING)"
		switch {
		case !l.AllowSessions:
			e2b = "nothing: E2B sandboxes are sessions and need sessions.allowed = true"
		case !prof.allowShell:
			e2b = "sandboxes, but no commands: E2B commands are shell strings and need allow_shell = true"
		}
		fmt.Fprintf(b, "  e2b:      %s\n", e2b)
	}
	env := prof.env.String()
	if env == "" {
		env = "none pass"
	} else {
		env = "may pass " + env
	}
	fmt.Fprintf(b, "  env:      %s\n", env)
}

// explainArgv writes the profile's argv rules, deny rules first.
func (prof *profile) explainArgv(b *strings.Builder) {
	if len(prof.deny) == 0 && len(prof.allow) == 0 {
		b.WriteString("  argv:     any (no rules)\n")
		return
	}
	b.WriteString("  argv:     deny rules first (any match denies), then ")
	if len(prof.allow) == 0 {
		b.WriteString("anything else is allowed (no allow rules)\n")
	} else {
		b.WriteString("an allow rule must match\n")
	}
	for _, r := range prof.deny {
		fmt.Fprintf(b, "    %s: %s\n", r.label(), r.describe())
	}
	for _, r := range prof.allow {
		fmt.Fprintf(b, "    %s: %s\n", r.label(), r.describe())
	}
}

// relaxations lists every setting of the profile that widens what its
// callers can do, and notes on what a setting does not do (pure).
func (prof *profile) relaxations() (relax, notes []string) {
	l := &prof.limits
	if prof.match.any {
		relax = append(relax, "matches ANY caller whose uid has an account, including root (uid 0), and SSH keys that name it: write explicit profiles for your users")
	}
	if prof.match.ssh {
		relax = append(relax, "SSH keys that name this profile get it (vmgated serve --ssh-listen): callers need no local account")
	}
	switch {
	case prof.user == userRoot:
		relax = append(relax, "commands run as root in the guest")
	case slices.Contains(prof.users, userRoot):
		relax = append(relax, "a caller may run commands as root in the guest (users)")
	}
	if prof.allowShell {
		relax = append(relax, "shell strings (vm-exec -c) allowed")
		if len(prof.allow) > 0 {
			notes = append(notes, `shell strings are checked as ["sh", "-c", STRING] and need an allow rule for sh`)
		}
	}
	if l.AllowSessions {
		relax = append(relax, "sessions allowed: a VM and its files persist across commands")
	}
	switch pub := l.Publish; {
	case pub.AnyAddress:
		relax = append(relax, fmt.Sprintf("session ports may be published on ANY host address, which other machines reach (sessions.publish_any_address), %d connections each", pub.MaxConns))
	case pub.Allowed:
		relax = append(relax, fmt.Sprintf("session ports may be published on loopback addresses and Unix sockets of the host (sessions.publish), %d connections each", pub.MaxConns))
	}
	if len(prof.allow) == 0 {
		relax = append(relax, "any argv that no deny rule matches is allowed (no allow rules)")
		if !prof.allowShell {
			notes = append(notes, `allow_shell = false refuses vm-exec -c only: with no allow rules, argv such as ["sh", "-c", …] is still allowed`)
		}
	}
	switch {
	case prof.env.all:
		relax = append(relax, "any environment variable passes")
	case len(prof.env.prefixes) > 0 || len(prof.env.names) > 0:
		relax = append(relax, "environment variables pass: "+prof.env.String())
	}
	return relax, notes
}

func (m *matcher) describe() string {
	if m.any {
		return "any caller whose uid has an account (and SSH keys that name the profile)"
	}
	var parts []string
	if len(m.uids) > 0 {
		parts = append(parts, plural(len(m.uids), "uid ", "uids ")+joinIDs(m.uids))
	}
	if len(m.users) > 0 {
		parts = append(parts, plural(len(m.users), "user ", "users ")+joinNames(m.users))
	}
	if len(m.gids) > 0 {
		parts = append(parts, plural(len(m.gids), "gid ", "gids ")+joinIDs(m.gids))
	}
	if len(m.groups) > 0 {
		parts = append(parts, "members of "+plural(len(m.groups), "group ", "groups ")+joinNames(m.groups))
	}
	if m.ssh {
		parts = append(parts, "SSH keys that name the profile in the authorized-keys file")
	}
	if len(parts) == 0 {
		return "nobody"
	}
	return strings.Join(parts, "; or ")
}

func (r *rule) describe() string {
	var parts []string
	if r.programs != nil {
		parts = append(parts, "program "+joinNames(r.programs))
	}
	if r.hasArgs {
		srcs := make([]string, len(r.args))
		for i, g := range r.args {
			srcs[i] = strconv.Quote(g.src)
		}
		switch {
		case r.argsRest && len(srcs) == 0:
			parts = append(parts, "any arguments")
		case r.argsRest:
			parts = append(parts, "arguments start "+strings.Join(srcs, " ")+" then any")
		case len(srcs) == 0:
			parts = append(parts, "no arguments")
		default:
			parts = append(parts, "arguments exactly "+strings.Join(srcs, " "))
		}
	}
	if r.argsAny != nil {
		srcs := make([]string, len(r.argsAny))
		for i, g := range r.argsAny {
			srcs[i] = strconv.Quote(g.src)
		}
		parts = append(parts, "some argument matches "+strings.Join(srcs, " or "))
	}
	if r.argsRegex != nil {
		parts = append(parts, "argv joined by spaces matches regexp "+strconv.Quote(r.argsRegex.String()))
	}
	return strings.Join(parts, "; and ")
}

func joinIDs(ids []uint32) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(s, ", ")
}

func joinNames(names []string) string {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = quoteName(n)
	}
	return strings.Join(s, ", ")
}

// formatSize prints a byte count in the largest binary unit that divides it.
func formatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d %s", n, plural(int(n), "byte", "bytes"))
}

// formatDuration prints d as time.Duration does, without trailing zero
// units: "10m", not "10m0s".
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func yesNo(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}

// describeSessions says how long a profile's sessions live, when they are
// paused, and what a caller may keep paused.
func (l *Limits) describeSessions() string {
	var life string
	switch after := l.Paused.After; {
	case after > 0 && after < l.SessionIdle:
		life = fmt.Sprintf("paused to disk after %s without a command (sessions.pause_after; idle_timeout %s pauses too)", formatDuration(after), formatDuration(l.SessionIdle))
	case after > 0:
		life = fmt.Sprintf("paused to disk after %s without a command (idle_timeout, with sessions.pause_after set)", formatDuration(l.SessionIdle))
	default:
		life = fmt.Sprintf("ended after %s without a command; paused only when their owner asks (no sessions.pause_after)", formatDuration(l.SessionIdle))
	}
	return fmt.Sprintf("%s; ended %s after they began, paused or not; a caller keeps at most %d paused, %s in all",
		life, formatDuration(l.SessionMax), l.Paused.MaxCount, formatSize(l.Paused.MaxBytes))
}
