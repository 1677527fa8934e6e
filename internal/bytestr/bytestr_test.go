package bytestr

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// allBytes is one list with every byte value alone, and one string of
// them all.
func allBytes() List {
	var l List
	var all []byte
	for b := range 256 {
		l = append(l, string([]byte{byte(b)}), "x"+string([]byte{byte(b)})+"y")
		all = append(all, byte(b))
	}
	return append(l, string(all), "\xff\xfe", "caf\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "")
}

// TestRoundTrip: every byte, alone and in company, comes back as it was
// sent, by json.Marshal and by an encoder that does not escape HTML.
func TestRoundTrip(t *testing.T) {
	in := allBytes()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out List
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(in, out) {
		for i := range in {
			if i < len(out) && in[i] != out[i] {
				t.Errorf("element %d: sent %q, got %q", i, in[i], out[i])
			}
		}
		t.Fatalf("%d elements sent, %d back", len(in), len(out))
	}
	if !strings.Contains(string(b), `{"b64":"/w=="}`) || !strings.Contains(string(b), `"x\u0000y"`) {
		t.Errorf("\\xff or NUL not in the expected form: %s", b)
	}
}

// TestTextAsBefore: a list of valid UTF-8 is written byte for byte as
// encoding/json writes a []string, with and without HTML escaping, so
// that old readers and old records see no change.
func TestTextAsBefore(t *testing.T) {
	text := []string{"", "plain", "<a&b>", "tab\there", "nl\n", "\x00\x01\x1f\x7f", "é ü 日本", "\u2028\u2029", "\ufffd", `"\`}
	for _, escape := range []bool{true, false} {
		enc := func(v any) string {
			var buf bytes.Buffer
			e := json.NewEncoder(&buf)
			e.SetEscapeHTML(escape)
			if err := e.Encode(v); err != nil {
				t.Fatal(err)
			}
			return buf.String()
		}
		if got, want := enc(List(text)), enc(text); got != want {
			t.Errorf("escapeHTML %v: %s, encoding/json writes %s", escape, got, want)
		}
		type rec struct {
			A List     `json:"a,omitempty"`
			B []string `json:"b,omitempty"`
		}
		if got, want := enc(rec{A: List{}}), enc(rec{B: []string{}}); got != `{}`+"\n" || want != got {
			t.Errorf("empty list with omitempty: %s, want %s", got, want)
		}
	}
	if b, _ := json.Marshal(List(nil)); string(b) != "null" {
		t.Errorf("nil list: %s", b)
	}
}

var decodeCases = []struct {
	in   string
	want List // nil with ok false: an error
	ok   bool
}{
	{`null`, nil, true},
	{`[]`, List{}, true},
	{`["a", {"b64": "/w=="}, {"b64":""}, "\u00ff"]`, List{"a", "\xff", "", "\u00ff"}, true},
	{`[{"b64": "aGk="}]`, List{"hi"}, true}, // text in base64: allowed
	{`[ { "b64" : "AA==" } ]`, List{"\x00"}, true},
	{`[{"b64": "/w"}]`, nil, false},       // no padding
	{`[{"b64": "/x=="}]`, nil, false},     // padding bits set
	{`[{"b64": "/w==\n"}]`, nil, false},   // line break
	{`[{"b64": "/w\r\n=="}]`, nil, false}, // line break inside
	{`[{"b64": "_w=="}]`, nil, false},     // URL alphabet
	{`[{"b64": "!!!!"}]`, nil, false},     // not base64
	{`[{"B64": "/w=="}]`, nil, false},     // key case
	{`[{"b64": "/w==", "x": 1}]`, nil, false},
	{`[{"b64": "/w==", "b64": "AA=="}]`, nil, false},
	{`[{}]`, nil, false},
	{`[{"b64": 5}]`, nil, false},
	{`[{"b64": null}]`, nil, false},
	{`[{"b64": {"b64": "AA=="}}]`, nil, false},
	{`[null]`, nil, false},
	{`[1]`, nil, false},
	{`[["a"]]`, nil, false},
	{`"a"`, nil, false},
	{`{"b64": "AA=="}`, nil, false},
	{`[`, nil, false},
}

func TestDecode(t *testing.T) {
	for _, c := range decodeCases {
		var l List
		err := json.Unmarshal([]byte(c.in), &l)
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok %v", c.in, err, c.ok)
			continue
		}
		if c.ok && (!slices.Equal(l, c.want) || (l == nil) != (c.want == nil)) {
			t.Errorf("%s: %q, want %q", c.in, l, c.want)
		}
	}
	var l List
	err := json.Unmarshal([]byte(`["a", {"b64": "/x=="}]`), &l)
	if err == nil || !strings.Contains(err.Error(), "element 1") {
		t.Errorf("error does not name the element: %v", err)
	}
}

// FuzzList: whatever decodes, encodes and decodes back to itself, in the
// canonical form; and any strings (the second input, split at 0x1e)
// survive a round trip.
func FuzzList(f *testing.F) {
	for _, c := range decodeCases {
		f.Add([]byte(c.in), "a\x1e\xff\x1e")
	}
	f.Fuzz(func(t *testing.T, data []byte, joined string) {
		var l List
		if json.Unmarshal(data, &l) == nil {
			b, err := json.Marshal(l)
			if err != nil {
				t.Fatal(err)
			}
			var again List
			if err := json.Unmarshal(b, &again); err != nil || !slices.Equal(l, again) {
				t.Fatalf("%q: encoded %s, decoded %q, %v", l, b, again, err)
			}
			if b2, _ := json.Marshal(again); !bytes.Equal(b, b2) {
				t.Fatalf("two encodings: %s, %s", b, b2)
			}
		}
		in := List(strings.Split(joined, "\x1e"))
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var out List
		if err := json.Unmarshal(b, &out); err != nil || !slices.Equal(in, out) {
			t.Fatalf("%q: encoded %s, decoded %q, %v", in, b, out, err)
		}
	})
}
