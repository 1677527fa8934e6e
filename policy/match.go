package policy

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// In args, a last element "..." (or "**") matches any remaining arguments.
const (
	restMarker    = "..."
	restMarkerAlt = "**"
)

// matcher is a compiled match table.
type matcher struct {
	any           bool
	ssh           bool // SSH keys that name the profile get it
	e2b           bool // E2B API keys that name the profile get it
	uids, gids    []uint32
	users, groups []string
}

// hasLocal reports whether m names local callers (uids, users, gids,
// groups).
func (m *matcher) hasLocal() bool {
	return len(m.uids) > 0 || len(m.gids) > 0 || len(m.users) > 0 || len(m.groups) > 0
}

// acceptsKeys reports whether a key of the front door may name the
// profile: match.any, or match.ssh for an SSH key and match.e2b for an
// E2B API key.
func (m *matcher) acceptsKeys(door string) bool {
	if door == DoorE2B {
		return m.any || m.e2b
	}
	return m.any || m.ssh
}

// acceptsAnyKey reports whether a key of some front door may name the
// profile.
func (m *matcher) acceptsAnyKey() bool { return m.ssh || m.e2b }

// matches reports whether the local caller id fits m. Empty names (lookup
// failed) never match a name. An SSH caller (id.SSH set) never matches
// here: its key names its profile (see [Policy.Decide]).
//
// match.any takes only callers whose uid has an account: a uid without
// one is not a login but, most often, a uid that some login's user
// namespaces or set-user-ID files run as, and "any caller" would make
// each of them one more caller with its own shares of VMs and queue
// (issue 30, finding 6). The daemon folds the subordinate uids it knows
// (/etc/subuid) into their login; any other uid without an account
// needs a profile that names its uid, gid or groups.
func (m *matcher) matches(id Identity) bool {
	if id.SSH != nil {
		return false
	}
	if m.any {
		return id.HasAccount()
	}
	if slices.Contains(m.uids, id.UID) || slices.Contains(m.gids, id.GID) {
		return true
	}
	if id.User != "" && slices.Contains(m.users, id.User) {
		return true
	}
	if id.Group != "" && slices.Contains(m.groups, id.Group) {
		return true
	}
	for _, g := range id.Groups {
		if g != "" && slices.Contains(m.groups, g) {
			return true
		}
	}
	return false
}

// glob is a compiled argument pattern.
type glob struct {
	src string
	re  *regexp.Regexp
}

func (g *glob) match(s string) bool { return g.re.MatchString(s) }

// compileGlob compiles a glob in path.Match syntax into an equivalent RE2
// expression in which * and ? also match "/" (see the package doc for why).
// RE2 keeps matching linear in the argument's length.
func compileGlob(p string) (*glob, error) {
	if !utf8.ValidString(p) {
		return nil, errors.New("not valid UTF-8")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return nil, errors.New("contains a NUL byte, which no argument can")
	}
	// path.Match checks the whole pattern's syntax; this reports
	// path.ErrBadPattern exactly where path.Match would.
	if _, err := path.Match(p, ""); err != nil {
		return nil, err
	}
	src, err := globRegexp(p)
	if err != nil {
		return nil, err
	}
	re, err := regexp.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("translate glob: %w", err)
	}
	return &glob{src: p, re: re}, nil
}

func globRegexp(p string) (string, error) {
	var b strings.Builder
	b.WriteString(`\A(?s:`)
	for i := 0; i < len(p); {
		switch p[i] {
		case '*':
			b.WriteString(`.*`)
			i++
		case '?':
			b.WriteString(`.`)
			i++
		case '[':
			i++
			b.WriteByte('[')
			if i < len(p) && p[i] == '^' {
				b.WriteByte('^')
				i++
			}
			for n := 0; ; n++ {
				if i < len(p) && p[i] == ']' && n > 0 {
					i++
					break
				}
				lo, w, err := classChar(p[i:])
				if err != nil {
					return "", err
				}
				i += w
				hi := lo
				if i < len(p) && p[i] == '-' {
					if hi, w, err = classChar(p[i+1:]); err != nil {
						return "", err
					}
					i += 1 + w
				}
				if lo > hi {
					return "", fmt.Errorf("character range %q-%q is empty", lo, hi)
				}
				fmt.Fprintf(&b, `\x{%x}-\x{%x}`, lo, hi)
			}
			b.WriteByte(']')
		case '\\':
			i++
			if i >= len(p) {
				return "", path.ErrBadPattern
			}
			fallthrough
		default:
			r, w := utf8.DecodeRuneInString(p[i:])
			b.WriteString(regexp.QuoteMeta(string(r)))
			i += w
		}
	}
	b.WriteString(`)\z`)
	return b.String(), nil
}

// classChar reads one possibly escaped character of a [class], as
// path.Match does.
func classChar(s string) (r rune, width int, err error) {
	if s == "" || s[0] == '-' || s[0] == ']' {
		return 0, 0, path.ErrBadPattern
	}
	if s[0] == '\\' {
		width = 1
		s = s[1:]
		if s == "" {
			return 0, 0, path.ErrBadPattern
		}
	}
	r, n := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && n <= 1 || n == len(s) {
		return 0, 0, path.ErrBadPattern // invalid UTF-8 or unterminated class
	}
	return r, width + n, nil
}

// isUnsafeRune reports runes that program names must not contain: white
// space, control characters (NUL included) and invisible format characters
// such as U+200B, which would make a name read as another in logs.
func isUnsafeRune(r rune) bool {
	return unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
}

// checkProgram checks a program name (argv[0], or a program in a rule): a
// bare name, or a clean absolute path. See the package doc.
func checkProgram(s string) error {
	switch {
	case s == "":
		return errors.New("empty program name")
	case !utf8.ValidString(s):
		return errors.New("program name is not valid UTF-8")
	case strings.ContainsFunc(s, isUnsafeRune):
		return errors.New("program name contains white space, a control or an invisible character")
	case s == "." || s == "..":
		return errors.New("not a program name")
	case !strings.Contains(s, "/"):
		return nil
	case !strings.HasPrefix(s, "/"):
		return errors.New("relative path; use a bare name or an absolute path")
	case strings.HasSuffix(s, "/"):
		return errors.New("path ends with a slash")
	case path.Clean(s) != s:
		return errors.New(`path is not clean (has ".", ".." or "//")`)
	}
	return nil
}

// rule is a compiled argv rule.
type rule struct {
	kind      string // "deny" or "allow"
	index     int
	name      string
	programs  []string
	hasArgs   bool
	args      []*glob
	argsRest  bool
	argsAny   []*glob
	argsRegex *regexp.Regexp
}

// label names r as verdicts do: "deny[0] no-upload", or "allow[2]".
func (r *rule) label() string {
	if r.name == "" {
		return fmt.Sprintf("%s[%d]", r.kind, r.index)
	}
	return fmt.Sprintf("%s[%d] %s", r.kind, r.index, r.name)
}

// argvView is the request's argv with the joined form computed at most once.
type argvView struct {
	argv   []string
	joined string
	done   bool
}

func (a *argvView) join() string {
	if !a.done {
		a.joined = strings.Join(a.argv, " ")
		a.done = true
	}
	return a.joined
}

// match reports whether every condition of r holds for argv. detail names the
// argument that args_any found, for deny reasons.
// Precondition: argv passed checkRequest (non-empty, clean program name).
func (r *rule) match(a *argvView) (ok bool, detail string) {
	argv := a.argv
	if r.programs != nil && !programMatches(r.programs, argv[0]) {
		return false, ""
	}
	if r.hasArgs {
		rest := argv[1:]
		if len(rest) < len(r.args) || !r.argsRest && len(rest) != len(r.args) {
			return false, ""
		}
		for k, g := range r.args {
			if !g.match(rest[k]) {
				return false, ""
			}
		}
	}
	if r.argsAny != nil {
		found := false
	args:
		for k, arg := range argv[1:] {
			for _, g := range r.argsAny {
				if g.match(arg) {
					found = true
					detail = fmt.Sprintf("argument %d %s matches %q", k+1, quote(arg), g.src)
					break args
				}
			}
		}
		if !found {
			return false, ""
		}
	}
	if r.argsRegex != nil && !r.argsRegex.MatchString(a.join()) {
		return false, ""
	}
	return true, detail
}

// programMatches reports whether argv0 is one of progs: by base name for a
// bare name, exactly for a path.
func programMatches(progs []string, argv0 string) bool {
	base := path.Base(argv0)
	for _, p := range progs {
		if strings.Contains(p, "/") {
			if p == argv0 {
				return true
			}
		} else if p == base {
			return true
		}
	}
	return false
}
