package gateway

import (
	"testing"

	"github.com/vmgate/vmgate/policy"
)

// TestMayRotateAudit: who may move the audit log aside. Before, an
// admin = true profile could, although admin means seeing everyone's
// status (issue 30, finding 5).
func TestMayRotateAudit(t *testing.T) {
	p, err := policy.Parse("rotate.toml", []byte(`
version = 1

[[profile]]
name = "auditors"
match = { groups = ["audit"] }
audit_rotate = true

[[profile]]
name = "admins"
match = { groups = ["wheel"], ssh = true }
admin = true

[[profile]]
name = "everyone"
match = { any = true }
`))
	if err != nil {
		t.Fatal(err)
	}
	const daemon = 991
	for _, c := range []struct {
		name string
		id   policy.Identity
		want bool
	}{
		{"root", policy.Identity{UID: 0}, true},
		{"the daemon's user", policy.Identity{UID: daemon}, true},
		{"audit_rotate profile", policy.Identity{UID: 1002, Groups: []string{"audit"}}, true},
		{"admin profile", policy.Identity{UID: 1000, Groups: []string{"wheel"}}, false},
		{"anyone else", policy.Identity{UID: 1001}, false},
		{"an SSH key of an admin profile", policy.Identity{SSH: &policy.SSHKey{Profile: "admins"}}, false},
	} {
		if got := mayRotateAudit(p, c.id, daemon); got != c.want {
			t.Errorf("%s: mayRotateAudit = %v, want %v", c.name, got, c.want)
		}
	}
}
