//go:build !linux

package audit

import "os"

const openFlags = 0

// lockFile does nothing off Linux: vmgated runs only on Linux, and the
// lock guards against a second daemon, not against an attacker. Verifying
// logs works everywhere.
func lockFile(*os.File) error { return nil }

// renameNoReplace renames from to to unless to exists (an error wrapping
// os.ErrExist).
func renameNoReplace(from, to string) error { return linkThenRemove(from, to) }

// currentName is unknown off Linux.
func currentName(file) string { return "" }
