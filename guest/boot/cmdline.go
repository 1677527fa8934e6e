package boot

import "strings"

// Defaults for parameters missing from the kernel command line.
const (
	DefaultRoot       = "/dev/vda"
	DefaultRootFSType = "ext4"
	DefaultInit       = "/sbin/init"
)

// Cmdline is the kernel command line as the guest init understands it.
type Cmdline struct {
	// Args holds the parameters before a "--" separator, in order, with
	// their quotes removed.
	Args []string
	// Params holds every parameter before a "--" separator (the rest belongs
	// to the init program). For repeated keys the last value wins; a flag
	// without '=' maps to "".
	Params map[string]string
	// Probe is set by vmgate.probe=1.
	Probe bool
	// Root is the root device path (root=, default [DefaultRoot]).
	Root string
	// RootFSType is the root file system type (rootfstype=, default
	// [DefaultRootFSType]).
	RootFSType string
	// RootFlags is passed as mount data for the root (rootflags=).
	RootFlags string
	// ReadOnly is true when the last of the flags "ro" and "rw" is "ro".
	ReadOnly bool
	// Init is the program executed after switching root (init=, default
	// [DefaultInit]).
	Init string
	// InitSet reports that init= named a program.
	InitSet bool
}

// ParseCmdline parses a kernel command line such as the contents of
// /proc/cmdline. Parameters are separated by white space; double quotes group
// white space into a parameter and are removed, so both
// rootflags="a b" and "rootflags=a b" give the value "a b". Parsing stops at
// a lone "--". Empty values of root=, rootfstype= and init= select the
// defaults.
func ParseCmdline(s string) Cmdline {
	c := Cmdline{Params: make(map[string]string)}
	for _, arg := range splitCmdline(s) {
		if arg == "--" {
			break
		}
		c.Args = append(c.Args, arg)
		key, value, _ := strings.Cut(arg, "=")
		if key == "" {
			continue
		}
		c.Params[key] = value
		switch key {
		case "ro":
			c.ReadOnly = true
		case "rw":
			c.ReadOnly = false
		}
	}
	c.Probe = c.Params["vmgate.probe"] == "1"
	c.Root = valueOr(c.Params["root"], DefaultRoot)
	c.RootFSType = valueOr(c.Params["rootfstype"], DefaultRootFSType)
	c.RootFlags = c.Params["rootflags"]
	c.Init = valueOr(c.Params["init"], DefaultInit)
	c.InitSet = c.Params["init"] != ""
	return c
}

// ModuleParams returns the parameters the command line sets for the kernel
// module named module, in the form finit_module expects, as modprobe does
// for modules loaded after boot (the kernel applies "module.param=value"
// arguments itself only to built-in code). Every "<module>.<param>[=<value>]"
// argument contributes "<param>[=<value>]", in command line order, separated
// by single spaces; values containing white space are quoted. '-' and '_'
// are equivalent in module names.
func (c Cmdline) ModuleParams(module string) string {
	module = strings.ReplaceAll(module, "-", "_")
	var params []string
	for _, arg := range c.Args {
		key, value, hasValue := strings.Cut(arg, "=")
		mod, param, ok := strings.Cut(key, ".")
		if !ok || mod == "" || param == "" || strings.ReplaceAll(mod, "-", "_") != module {
			continue
		}
		if !hasValue {
			params = append(params, param)
			continue
		}
		if strings.ContainsAny(value, " \t\n\v\f\r") {
			value = `"` + value + `"`
		}
		params = append(params, param+"="+value)
	}
	return strings.Join(params, " ")
}

// valueOr returns v, or def when v is empty.
func valueOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// splitCmdline splits s into parameters at unquoted white space and removes
// the double quotes. A quote left open extends to the end of s.
func splitCmdline(s string) []string {
	var (
		args    []string
		cur     strings.Builder
		inArg   bool
		inQuote bool
	)
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '"':
			inQuote = !inQuote
			inArg = true
		case isSpace(ch) && !inQuote:
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteByte(ch)
			inArg = true
		}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args
}

// isSpace reports whether ch is white space in the kernel's sense (ASCII).
func isSpace(ch byte) bool {
	switch ch {
	case ' ', '\t', '\n', '\v', '\f', '\r':
		return true
	}
	return false
}
