package cli

import "testing"

// TestStateDirFor: never a shared, predictable directory such as
// /tmp/vmgate-$USER; without one of its own the caller must name one.
func TestStateDirFor(t *testing.T) {
	tests := []struct {
		name   string
		system bool
		env    map[string]string
		want   string
	}{
		{"explicit", false, map[string]string{"VMGATE_STATE_DIR": "/srv/vg", "HOME": "/home/u"}, "/srv/vg"},
		{"system", true, map[string]string{"HOME": "/root"}, SystemStateDir},
		{"xdg", false, map[string]string{"XDG_STATE_HOME": "/home/u/.st", "HOME": "/home/u"}, "/home/u/.st/vmgate"},
		{"home", false, map[string]string{"HOME": "/home/u", "USER": "u"}, "/home/u/.local/state/vmgate"},
		{"nothing of its own", false, map[string]string{"USER": "u", "TMPDIR": "/tmp"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := stateDirFor(tt.system, func(k string) string { return tt.env[k] }); got != tt.want {
				t.Errorf("state dir %q, want %q", got, tt.want)
			}
		})
	}
	if needStateDir("") == nil || needStateDir("/x") != nil {
		t.Error("needStateDir: an empty directory must be an error, a named one not")
	}
}
