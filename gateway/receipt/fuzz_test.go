package receipt

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"testing"
)

// FuzzVerify: Verify never panics on any document, and accepts only what
// the key signed: a document it accepts has a body that the signer's
// encoding reproduces byte for byte.
func FuzzVerify(f *testing.F) {
	k := testKey(1)
	pub := k.Public().(ed25519.PublicKey)
	doc, err := Sign(k, sampleBody())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(doc)
	min, _ := Sign(k, &Body{RequestID: "r", Argv: ArgvOf([]string{"\xff"})})
	f.Add(min)
	f.Add([]byte(`{"vmgate_receipt":1,"body":{},"sig":""}`))
	f.Add([]byte(`{"vmgate_receipt":1,"body":{"argv":[{"base64":"/w=="}]},"sig":"AA=="}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Verify(data, pub)
		if _, _, perr := Parse(data); perr != nil && err == nil {
			t.Fatalf("verified what Parse refuses: %v", perr)
		}
		if err != nil {
			return
		}
		d, _, _ := Parse(data)
		again, merr := json.Marshal(b)
		if merr != nil || !bytes.Equal(again, d.Body) {
			t.Fatalf("accepted a body the signer would not write:\n%s\n%s", d.Body, again)
		}
	})
}

// TestFuzzCorpus runs the fuzz target's seeds as a plain test (go test
// runs them anyway; this names the invariant).
func TestFuzzCorpus(t *testing.T) {
	k := testKey(1)
	doc, _ := Sign(k, sampleBody())
	if _, err := Verify(doc, k.Public().(ed25519.PublicKey)); err != nil {
		t.Fatal(err)
	}
}
