// Package names holds the naming rules that every layer shares: what a
// session and an image may be called, and what a DNS name is (the
// policy's allowlist, the netstack's DNS answers and the sniffers of HTTP
// heads and TLS hellos all normalise host names the same way). The client checks them before it
// sends a request, the policy before it decides, the daemon and the VM
// layer before a name becomes part of a path. One home keeps them equal.
//
// Both rules keep a name safe as one path element and as an SSH login:
// 1 to 64 of [A-Za-z0-9._-], never "." or "..". SessionRule and ImageRule
// are their texts, for every message, schema and reference that states
// them.
package names

import (
	"errors"
	"fmt"
	"strings"
)

// MaxLen bounds a session or image name.
const MaxLen = 64

// Charset is the characters a name may use, as the error messages spell
// them.
const Charset = "[A-Za-z0-9._-]"

// SessionRule is the rule of Session as a message states it, e.g.
// "session name %q: must be " + SessionRule. (64 is MaxLen: a constant
// string cannot be made of an integer constant; TestRules ties them.)
const SessionRule = "1 to 64 of " + Charset + ", not . or .."

// ImageRule is the rule of Image as a message states it.
const ImageRule = "1 to 64 of " + Charset + ", starting with a letter or digit"

// plain reports whether r is a letter or a digit.
func plain(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

// Session reports whether s is an acceptable session name: 1 to 64 of
// [A-Za-z0-9._-], and not "." or "..".
func Session(s string) bool {
	if s == "" || len(s) > MaxLen || s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		if !plain(r) && r != '.' && r != '_' && r != '-' {
			return false
		}
	}
	return true
}

// Image reports whether s can name an image: 1 to 64 of [A-Za-z0-9._-],
// starting with a letter or digit, so that STATE/images/NAME is always
// one directory below STATE/images.
func Image(s string) bool {
	if s == "" || !plain(rune(s[0])) {
		return false
	}
	return Session(s)
}

// AccountRule is the text of the rule of a guest account's name
// (Account).
const AccountRule = "1 to 32 of [a-z0-9_-], starting with a letter or _"

// Account reports whether s can name a guest account (a command's user):
// 1 to 32 of [a-z0-9_-], starting with a letter or an underscore, as
// useradd takes it by default.
func Account(s string) bool {
	if s == "" || len(s) > 32 || !(s[0] >= 'a' && s[0] <= 'z' || s[0] == '_') {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// EnvVarRule is the text of the rule of an environment variable's name
// as a secret's (EnvVar).
const EnvVarRule = "1 to 128 of [A-Za-z0-9_], not starting with a digit"

// EnvVar reports whether s can name an environment variable that holds
// a secret's placeholder: 1 to 128 of [A-Za-z0-9_], not starting with a
// digit.
func EnvVar(s string) bool {
	if s == "" || len(s) > 128 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// CheckHost accepts DNS names of letters, digits, hyphens, underscores
// and dots: at most 253 bytes, labels of 1 to 63 that neither start nor
// end with a hyphen. It expects a lower-case name without a trailing dot.
func CheckHost(n string) error {
	if n == "" || len(n) > 253 {
		return errors.New("empty or too long name")
	}
	for _, label := range strings.Split(n, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("bad name label %q", label)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("bad character %q in name", c)
			}
		}
	}
	return nil
}

// Host lowers a DNS name and drops its trailing dot; it returns "" for a
// name that is not a valid DNS name (CheckHost).
func Host(n string) string {
	n = strings.ToLower(strings.TrimSuffix(n, "."))
	if CheckHost(n) != nil {
		return ""
	}
	return n
}
