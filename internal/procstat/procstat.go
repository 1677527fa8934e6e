// Package procstat splits a /proc/PID/stat line, whose second field (the
// command name, in parentheses) may hold blanks and parentheses of its own.
package procstat

import "strings"

// Fields returns the fields of a /proc/PID/stat line that follow the
// command name: Fields(stat)[0] is field 3 of proc(5) (state), [1] field
// 4 (ppid), and field N is [N-3]. ok is false when the line has no
// command name.
func Fields(stat string) (fields []string, ok bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(stat[i+1:]), true
}
