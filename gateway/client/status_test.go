package client

import (
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
)

// TestWriteStatusCaller: the status says which images the caller may
// name, its profile's first; a caller no profile takes gets no line.
func TestWriteStatusCaller(t *testing.T) {
	var b strings.Builder
	st := &wire.Status{Version: "v", Caller: &wire.Grant{Profile: "agents", Image: "py", Images: []string{"py", "default"}}}
	if err := WriteStatus(&b, st, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "\nprofile agents: image py; may name py, default\n\nCOMMANDS") {
		t.Errorf("status:\n%s", b.String())
	}
	b.Reset()
	st.Caller = nil
	if err := WriteStatus(&b, st, time.Now()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "profile") {
		t.Errorf("a status without a caller names a profile:\n%s", b.String())
	}
}
