package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestExecRequestNet: a request may narrow its network, and one that does
// not says nothing of it, as before the field existed (old clients and
// old daemons read each other's requests).
func TestExecRequestNet(t *testing.T) {
	for body, want := range map[string]*NetLimit{
		`{"argv":["true"]}`:                                          nil,
		`{"argv":["true"],"net":{"allow":[]}}`:                       {Allow: []string{}},
		`{"argv":["true"],"net":{}}`:                                 {},
		`{"argv":["true"],"net":{"allow":["a.test:80","b.test:*"]}}`: {Allow: []string{"a.test:80", "b.test:*"}},
	} {
		req, err := DecodeExecRequest(strings.NewReader(body))
		if err != nil || !reflect.DeepEqual(req.Net, want) {
			t.Errorf("%s: net %+v %v, want %+v", body, req.Net, err, want)
		}
	}
	for _, body := range []string{
		`{"argv":["true"],"net":{"allow":["a.test:80"],"deny":[]}}`,
		`{"argv":["true"],"net":{"allow":"a.test:80"}}`,
		`{"argv":["true"],"net":["a.test:80"]}`,
		"{\"argv\":[\"true\"],\"net\":{\"allow\":[\"a\\u0000:80\"]}}",
	} {
		if _, err := DecodeExecRequest(strings.NewReader(body)); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
	b, _ := json.Marshal(ExecRequest{Argv: []string{"true"}})
	if strings.Contains(string(b), "net") {
		t.Errorf("a request that narrows nothing says %s", b)
	}
	b, _ = json.Marshal(ExecRequest{Argv: []string{"true"}, Net: &NetLimit{}})
	if !strings.Contains(string(b), `"net":{"allow":null}`) {
		t.Errorf("a request for no network says %s", b)
	}
}

var netLimitCases = []struct {
	body string
	ok   bool
}{
	{`{"allow":[]}`, true},
	{`{}`, true},
	{`{"allow":["repo.test:80","*.debian.org:*"]}`, true},
	{`{"allow":["x"]}`, true}, // the policy refuses it, naming it
	{`{"allow":["x"],"more":1}`, false},
	{`{"allow":[1]}`, false},
	{`{"allow":["a"]} {}`, false},
	{"{\"allow\":[\"\\u0000\"]}", false},
	{``, false},
	{`null`, true},
}

func TestDecodeNetLimit(t *testing.T) {
	for _, c := range netLimitCases {
		if _, err := DecodeNetLimit(strings.NewReader(c.body)); (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok %v", c.body, err, c.ok)
		}
	}
}

func FuzzDecodeNetLimit(f *testing.F) {
	for _, c := range netLimitCases {
		f.Add([]byte(c.body))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := DecodeNetLimit(bytes.NewReader(b))
		if err != nil {
			return
		}
		for _, a := range l.Allow {
			if strings.IndexByte(a, 0) >= 0 {
				t.Fatal("NUL accepted")
			}
		}
		enc, _ := json.Marshal(l)
		again, err := DecodeNetLimit(bytes.NewReader(enc))
		if err != nil || !reflect.DeepEqual(l, again) {
			t.Fatalf("%s read as %+v, re-encoded as %s, read as %+v, %v", b, l, enc, again, err)
		}
	})
}
