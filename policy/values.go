package policy

// The scalar values of a policy file: sizes, bounded integers, durations
// and the environment allowlist, each parsed with its key named in the
// error.

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// size parses an optional size key.
func (c *compiler) size(label, key string, v *sizeValue) *int64 {
	if v == nil {
		return nil
	}
	n, err := parseSize(*v)
	if err != nil {
		c.errorf("%s: %s %s: %w", label, key, v, err)
		return nil
	}
	return &n
}

func (c *compiler) intIn(label, key string, v *int64, lo, hi int64) *int {
	if v == nil {
		return nil
	}
	if *v < lo || *v > hi {
		c.errorf("%s: %s %d: must be between %d and %d", label, key, *v, lo, hi)
		return nil
	}
	n := int(*v)
	return &n
}

func (c *compiler) duration(label, key string, v *string) *time.Duration {
	if v == nil {
		return nil
	}
	d, err := time.ParseDuration(*v)
	switch {
	case err != nil:
		c.errorf("%s: %s %q: invalid duration; write a Go duration such as \"30s\" or \"1h30m\"", label, key, *v)
		return nil
	case d <= 0:
		c.errorf("%s: %s %q: must be positive", label, key, *v)
		return nil
	}
	return &d
}

// parseSize converts an output_limit value to bytes.
func parseSize(v sizeValue) (int64, error) {
	n, mult := v.n, int64(1)
	if v.isText {
		m := sizeRE.FindStringSubmatch(v.s)
		if m == nil {
			return 0, errors.New(`invalid size; write bytes as an integer or a string such as "512KiB", "1MiB", "1GiB"`)
		}
		var err error
		if n, err = strconv.ParseInt(m[1], 10, 64); err != nil {
			n = math.MaxInt64 // only overflow is possible: report as too large
		}
		switch m[2] {
		case "KiB":
			mult = 1 << 10
		case "MiB":
			mult = 1 << 20
		case "GiB":
			mult = 1 << 30
		}
	}
	if n < 1 || n > maxOutputLimit/mult {
		return 0, fmt.Errorf("must be between 1 byte and 1GiB")
	}
	return n * mult, nil
}

// envAllow is a profile's environment allowlist.
type envAllow struct {
	names    []string // exact names
	prefixes []string // from "PREFIX*"
	all      bool     // from "*"
	list     []string // as written, for Explain
}

func (e *envAllow) allows(name string) bool {
	if e.all {
		return true
	}
	for _, n := range e.names {
		if n == name {
			return true
		}
	}
	for _, p := range e.prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// String lists the allowlist as written, or "" if empty.
func (e *envAllow) String() string {
	return strings.Join(e.list, ", ")
}

func (c *compiler) env(label string, list []string) *envAllow {
	e := &envAllow{}
	seen := map[string]bool{}
	for _, v := range list {
		if seen[v] {
			c.errorf("%s: env: %q listed twice", label, v)
			continue
		}
		seen[v] = true
		e.list = append(e.list, v)
		switch {
		case v == "*":
			e.all = true
		case strings.HasSuffix(v, "*") && envNameRE.MatchString(strings.TrimSuffix(v, "*")):
			e.prefixes = append(e.prefixes, strings.TrimSuffix(v, "*"))
		case envNameRE.MatchString(v):
			e.names = append(e.names, v)
		default:
			c.errorf("%s: env: %q: not a variable name ([A-Za-z_][A-Za-z0-9_]*, optionally ending in *)", label, v)
		}
	}
	return e
}
