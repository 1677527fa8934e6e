package sshfront

import "testing"

// TestCommandBytes: an exec request's command is an SSH string, bytes of
// any value: it reaches the core as sent, as the shell string of the
// request, whether or not it is UTF-8.
func TestCommandBytes(t *testing.T) {
	tf := newTestFront(t, 1, "", nil)
	cl, err := tf.login(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for b := 1; b <= 0xff; b++ {
		all = append(all, byte(b))
	}
	for _, cmd := range []string{"printf '%s' '\xff\xfe'", "echo \x80", string(all)} {
		mustRun(t, cl, cmd)
	}
}
