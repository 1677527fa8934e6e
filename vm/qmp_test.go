package vm

import "testing"

func TestParseQMPLine(t *testing.T) {
	cases := []struct {
		line string
		ok   bool
		kind string
	}{
		{`{"QMP": {"version": {}, "capabilities": []}}`, true, "greeting"},
		{`{"return": {}}`, true, "return"},
		{`{"return": {"status": "running", "running": true}}`, true, "return"},
		{`{"error": {"class": "GenericError", "desc": "no"}}`, true, "error"},
		{`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 2}}`, true, "event"},
		{`{}`, false, ""},
		{`not json`, false, ""},
		{`{"return": `, false, ""},
		{`[1,2]`, false, ""},
	}
	for _, c := range cases {
		r, err := parseQMPLine([]byte(c.line))
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v", c.line, err)
			continue
		}
		if !c.ok {
			continue
		}
		kind := ""
		switch {
		case r.QMP != nil:
			kind = "greeting"
		case r.Error != nil:
			kind = "error"
		case r.Return != nil:
			kind = "return"
		case r.Event != "":
			kind = "event"
		}
		if kind != c.kind {
			t.Errorf("%s: kind %s, want %s", c.line, kind, c.kind)
		}
	}
}

func FuzzParseQMPLine(f *testing.F) {
	f.Add([]byte(`{"return": {}}`))
	f.Add([]byte(`{"error": {"class": "x", "desc": "y"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseQMPLine(b)
	})
}
