package vmexec

import (
	"fmt"
	"strings"
)

// resolveEnv turns --env-file lines and -e entries into KEY=VALUE pairs,
// as docker does: a bare KEY takes its value from lookup (here: the
// local environment) and is an error when it is unset; a later entry of
// a KEY replaces an earlier one. Files are read first, -e after.
func resolveEnv(o *vmexecOpts, lookup func(string) (string, bool), readFile func(string) ([]byte, error)) error {
	var out []string
	idx := map[string]int{}
	add := func(where, e string) error {
		key, _, hasValue := strings.Cut(e, "=")
		if key == "" || strings.ContainsAny(key, " \t") {
			return fmt.Errorf("%s: %q is not KEY=VALUE or KEY", where, e)
		}
		if !hasValue {
			v, ok := lookup(key)
			if !ok {
				return fmt.Errorf("%s: %s is not set in this environment (write %s= for an empty value)", where, key, key)
			}
			e = key + "=" + v
		}
		if i, ok := idx[key]; ok {
			out[i] = e
			return nil
		}
		idx[key] = len(out)
		out = append(out, e)
		return nil
	}
	for _, f := range o.envFiles {
		b, err := readFile(f)
		if err != nil {
			return fmt.Errorf("--env-file: %w", err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			line = strings.TrimRight(line, "\r")
			if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "#") {
				continue
			}
			if err := add(fmt.Sprintf("--env-file %s line %d", f, n+1), strings.TrimLeft(line, " \t")); err != nil {
				return err
			}
		}
	}
	for _, e := range o.env {
		if err := add("-e", e); err != nil {
			return err
		}
	}
	o.env = out
	return nil
}
