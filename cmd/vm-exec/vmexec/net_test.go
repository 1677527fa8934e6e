package vmexec

import (
	"reflect"
	"testing"
)

// TestParseNetFlags: --no-network and --net-allow narrow a command's
// network, --net-lock a session's, whose rules are its arguments.
func TestParseNetFlags(t *testing.T) {
	for _, c := range []struct {
		args     []string
		noNet    bool
		lock     bool
		allow    []string
		argv     []string
		usageErr bool
	}{
		{args: []string{"--no-network", "curl", "x"}, noNet: true, argv: []string{"curl", "x"}},
		{args: []string{"--net-allow", "a.test:80", "--net-allow", "b.test:*", "apt-get", "update"}, allow: []string{"a.test:80", "b.test:*"}, argv: []string{"apt-get", "update"}},
		{args: []string{"--no-network", "--net-allow", "a.test:80", "true"}, usageErr: true},
		{args: []string{"wget", "--no-network"}, argv: []string{"wget", "--no-network"}}, // the command's own flag
		{args: []string{"--session", "s", "--net-lock"}, lock: true},
		{args: []string{"--session", "s", "--net-lock", "a.test:80", "b.test:443"}, lock: true, allow: []string{"a.test:80", "b.test:443"}},
		{args: []string{"--session", "s", "--net-lock", "--net-allow", "a.test:80"}, lock: true, allow: []string{"a.test:80"}},
		{args: []string{"--net-lock"}, usageErr: true},
		{args: []string{"--session", "s", "--net-lock", "-c", "true"}, usageErr: true},
		{args: []string{"--session", "s", "--net-lock", "--no-network"}, usageErr: true},
		{args: []string{"--session", "s", "--net-lock", "--pause"}, usageErr: true},
		{args: []string{"--session", "s", "--net-lock", "--receipt", "r.json"}, usageErr: true},
	} {
		o, err := parseVMExec(c.args)
		if (err != nil) != c.usageErr {
			t.Errorf("%q: err %v, want a usage error %v", c.args, err, c.usageErr)
			continue
		}
		if err != nil {
			if _, ok := err.(*usageError); !ok {
				t.Errorf("%q: %T, want a usage error", c.args, err)
			}
			continue
		}
		if o.noNetwork != c.noNet || o.netLock != c.lock || !reflect.DeepEqual(o.netAllow, c.allow) || !reflect.DeepEqual(o.argv, c.argv) {
			t.Errorf("%q: no-network %v, lock %v, allow %q, argv %q", c.args, o.noNetwork, o.netLock, o.netAllow, o.argv)
		}
	}
}
