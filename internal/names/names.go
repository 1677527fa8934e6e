// Package names holds the naming rules that every layer shares: what a
// session and an image may be called. The client checks them before it
// sends a request, the policy before it decides, the daemon and the VM
// layer before a name becomes part of a path. One home keeps them equal.
//
// Both rules keep a name safe as one path element and as an SSH login:
// 1 to 64 of [A-Za-z0-9._-], never "." or "..".
package names

// MaxLen bounds a session or image name.
const MaxLen = 64

// Charset is the characters a name may use, as the error messages spell
// them.
const Charset = "[A-Za-z0-9._-]"

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
