package receipt

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// testKey is a fixed key (from a seed), so that documents are reproducible.
func testKey(seed byte) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
}

func sampleBody() *Body {
	code := 3
	uid, gid := uint32(1000), uint32(1000)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	return &Body{
		RequestID: "0123456789abcdef", Caller: Caller{UID: &uid, GID: &gid, PID: 42, User: "alice"},
		Verdict: VerdictAllow, Rule: "allow[0] any", Profile: "default",
		Policy: Policy{Source: "/etc/vmgate/vmgate.toml", SHA256: strings.Repeat("ab", 32)},
		Image:  &Image{Name: "default", SHA256: strings.Repeat("cd", 32)},
		Argv:   ArgvOf([]string{"sh", "-c", "echo <hi> && exit 3", "caf\xe9"}), Shell: true,
		EnvNames: []string{"LANG"}, Dir: "/tmp", VMID: "vm-1",
		Start: t0, End: t0.Add(1500 * time.Millisecond), ExitCode: &code,
		Stdin: StreamOf(nil), Stdout: StreamOf([]byte("<hi>\n")), Stderr: StreamOf(nil),
		Transfers: []Transfer{{Direction: "put", Guest: "/tmp/x", Files: 1, Bytes: 5, SHA256: strings.Repeat("ef", 32)}},
		Network: Network{Mode: "allowlist", Allow: []string{"example.com:443"}, Connections: 1,
			Destinations: []Destination{{Proto: "tcp", Name: "example.com", Port: 443, Allowed: true, Count: 1}}},
		Audit: &AuditRef{Seq: 7, Hash: strings.Repeat("12", 32), HeadSeq: 8, Head: strings.Repeat("34", 32)},
	}
}

func TestSignVerify(t *testing.T) {
	k := testKey(1)
	doc, err := Sign(k, sampleBody())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Verify(doc, k.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatalf("verify: %v\n%s", err, doc)
	}
	want := sampleBody()
	want.Key = Fingerprint(k.Public().(ed25519.PublicKey))
	if got, _ := json.Marshal(b); !bytes.Equal(got, mustJSON(t, want)) {
		t.Fatalf("body round trip:\n got %s\nwant %s", got, mustJSON(t, want))
	}
	if string(b.Argv[3]) != "caf\xe9" {
		t.Fatalf("non-UTF-8 argument came back as %q", b.Argv[3])
	}
	if !bytes.Contains(doc, []byte(`{"base64":"Y2Fm6Q=="}`)) {
		t.Fatalf("non-UTF-8 argument not in base64: %s", doc)
	}
	// Go's re-encoding of a document carrying it (a result frame) keeps
	// the signed bytes.
	var res struct {
		Receipt json.RawMessage `json:"receipt"`
	}
	res.Receipt = doc
	wrapped, _ := json.Marshal(res)
	if err := json.Unmarshal(wrapped, &res); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(res.Receipt, k.Public().(ed25519.PublicKey)); err != nil {
		t.Fatalf("after re-encoding: %v", err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTamper: every one-byte change anywhere in a receipt fails
// verification, a change inside the body as a bad signature; a swapped
// signature, another daemon's key and a key field rewritten to name
// another key each fail with their reason.
func TestTamper(t *testing.T) {
	k, other := testKey(1), testKey(2)
	pub, otherPub := k.Public().(ed25519.PublicKey), other.Public().(ed25519.PublicKey)
	doc, err := Sign(k, sampleBody())
	if err != nil {
		t.Fatal(err)
	}
	var d Document
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	bodyAt := bytes.Index(doc, d.Body)
	for i := range doc {
		for _, c := range []byte{'0', 'a', ' ', '"', doc[i] ^ 0x01} {
			if c == doc[i] {
				continue
			}
			bad := bytes.Clone(doc)
			bad[i] = c
			_, err := Verify(bad, pub)
			if err == nil {
				t.Fatalf("byte %d %q → %q: verified\n%s", i, doc[i], c, bad)
			}
			// Inside the body a change that keeps the JSON valid fails
			// the signature (or, in the key field, names another key).
			if i > bodyAt && i < bodyAt+len(d.Body) && !errors.Is(err, ErrSignature) && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrKey) {
				t.Fatalf("byte %d of the body: %v", i-bodyAt, err)
			}
		}
	}
	// Each field's value changed, re-encoded as the signer would: the
	// signature fails and says the body changed.
	for name, change := range map[string]func(*Body){
		"request_id": func(b *Body) { b.RequestID = "fedcba9876543210" },
		"argv":       func(b *Body) { b.Argv[2] = "echo <hi> && exit 0" },
		"exit_code":  func(b *Body) { c := 0; b.ExitCode = &c },
		"stdout":     func(b *Body) { b.Stdout = StreamOf([]byte("other\n")) },
		"policy":     func(b *Body) { b.Policy.SHA256 = strings.Repeat("00", 32) },
		"image":      func(b *Body) { b.Image.SHA256 = strings.Repeat("00", 32) },
		"verdict":    func(b *Body) { b.Verdict = VerdictDeny },
		"audit seq":  func(b *Body) { b.Audit.Seq = 6 },
		"network":    func(b *Body) { b.Network.Refused = 1 },
		"caller":     func(b *Body) { u := uint32(0); b.Caller.UID = &u },
	} {
		_, body, _ := Parse(doc)
		change(body)
		raw, _ := json.Marshal(body)
		bad := bytes.Replace(doc, d.Body, raw, 1)
		_, err := Verify(bad, pub)
		if !errors.Is(err, ErrSignature) || !strings.Contains(err.Error(), "body was changed") {
			t.Errorf("%s changed: %v", name, err)
		}
	}
	// A signature swapped in from another receipt of the same key.
	b2 := sampleBody()
	b2.RequestID = "1111111111111111"
	doc2, _ := Sign(k, b2)
	var d2 Document
	_ = json.Unmarshal(doc2, &d2)
	swapped := bytes.Replace(doc, []byte(d.Sig), []byte(d2.Sig), 1)
	if _, err := Verify(swapped, pub); !errors.Is(err, ErrSignature) {
		t.Errorf("swapped signature: %v", err)
	}
	// Signed by another daemon's key.
	foreign, _ := Sign(other, sampleBody())
	if _, err := Verify(foreign, pub); !errors.Is(err, ErrKey) || !strings.Contains(err.Error(), Fingerprint(otherPub)) || !strings.Contains(err.Error(), Fingerprint(pub)) {
		t.Errorf("another key: %v", err)
	}
	// A key field rewritten to name the verifier's key.
	claimed := bytes.Replace(foreign, []byte(Fingerprint(otherPub)), []byte(Fingerprint(pub)), 1)
	if _, err := Verify(claimed, pub); !errors.Is(err, ErrSignature) {
		t.Errorf("key field rewritten: %v", err)
	}
	if _, err := Verify(doc); !errors.Is(err, ErrKey) {
		t.Errorf("no key: %v", err)
	}
}

func TestParseMalformed(t *testing.T) {
	k := testKey(1)
	doc, _ := Sign(k, sampleBody())
	for name, bad := range map[string][]byte{
		"empty":          nil,
		"not json":       []byte("receipt"),
		"trailing data":  append(bytes.Clone(doc), []byte(" {}")...),
		"unknown field":  bytes.Replace(doc, []byte(`"sig"`), []byte(`"extra":1,"sig"`), 1),
		"unknown body":   bytes.Replace(doc, []byte(`{"key"`), []byte(`{"extra":1,"key"`), 1),
		"wrong format":   bytes.Replace(doc, []byte(`"vmgate_receipt":1`), []byte(`"vmgate_receipt":2`), 1),
		"no sig":         bytes.Replace(doc, []byte(`"sig"`), []byte(`"sag"`), 1),
		"sig not base64": []byte(strings.Replace(string(doc), `"sig":"`, `"sig":"!`, 1)),
		"too large":      bytes.Repeat([]byte(" "), MaxSize+1),
		"argv b64 utf8":  bytes.Replace(doc, []byte(`"sh"`), []byte(`{"base64":"c2g="}`), 1),
	} {
		if _, err := Verify(bad, k.Public().(ed25519.PublicKey)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestCheck(t *testing.T) {
	code := 0
	body := &Body{RequestID: "r1", ExitCode: &code, Stdout: StreamOf([]byte("out")), Stderr: StreamOf(nil), Stdin: StreamOf([]byte("ab"))}
	ok := Received{RequestID: "r1", Stdout: StreamOf([]byte("out")), Stderr: StreamOf(nil), StdinSent: StreamOf([]byte("abcdef")), StdinHead: []byte("abcdef"),
		Outcome: &Outcome{}}
	if notes, err := body.Check(ok); err != nil || len(notes) > 0 {
		t.Fatalf("agreeing receipt: %v %v", notes, err)
	}
	for name, r := range map[string]func(*Received){
		"stdout differs":      func(r *Received) { r.Stdout = StreamOf([]byte("ouT")) },
		"stderr longer":       func(r *Received) { r.Stderr = StreamOf([]byte("e")) },
		"request id":          func(r *Received) { r.RequestID = "r2" },
		"exit code":           func(r *Received) { r.Outcome = &Outcome{ExitCode: 1} },
		"timed out":           func(r *Received) { r.Outcome = &Outcome{TimedOut: true} },
		"stdin read > sent":   func(r *Received) { r.StdinSent, r.StdinHead = StreamOf([]byte("a")), []byte("a") },
		"stdin prefix differ": func(r *Received) { r.StdinSent, r.StdinHead = StreamOf([]byte("xbcdef")), []byte("xbcdef") },
		"stdin whole differs": func(r *Received) { r.StdinSent, r.StdinHead = StreamOf([]byte("aB")), []byte("aB") },
	} {
		rc := ok
		r(&rc)
		if _, err := body.Check(rc); !errors.Is(err, ErrMismatch) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A refusal: no outcome on either side, nothing relayed.
	refusal := &Body{RequestID: "r1", Stdin: StreamOf(nil), Stdout: StreamOf(nil), Stderr: StreamOf(nil)}
	if _, err := refusal.Check(Received{RequestID: "r1", Stdout: StreamOf(nil), Stderr: StreamOf(nil)}); err != nil {
		t.Errorf("refusal: %v", err)
	}
	// A command that read part of a stdin longer than the client keeps.
	long := Received{RequestID: "r1", Stdout: ok.Stdout, Stderr: ok.Stderr, StdinSent: Stream{Bytes: MaxStdinHead + 10, SHA256: "x"}, StdinHead: make([]byte, 1)}
	body.Stdin = Stream{Bytes: 5, SHA256: "y"}
	if notes, err := body.Check(long); err != nil || len(notes) != 1 {
		t.Fatalf("partial read of a long stdin: %v %v", notes, err)
	}
}

func TestHasherAndSentReader(t *testing.T) {
	var out bytes.Buffer
	h := &Hasher{W: &out}
	if h.Stream() != StreamOf(nil) {
		t.Fatalf("empty: %+v", h.Stream())
	}
	_, _ = h.Write([]byte("ab"))
	_, _ = h.Write([]byte("c"))
	if h.Stream() != StreamOf([]byte("abc")) || out.String() != "abc" {
		t.Fatalf("%+v %q", h.Stream(), out.String())
	}
	sr := &SentReader{R: strings.NewReader("hello")}
	b := make([]byte, 2)
	for {
		if _, err := sr.Read(b); err != nil {
			break
		}
	}
	s, head := sr.Sent()
	if s != StreamOf([]byte("hello")) || string(head) != "hello" {
		t.Fatalf("%+v %q", s, head)
	}
}

func TestArgJSON(t *testing.T) {
	for _, a := range []string{"", "plain", "<&>", "\x00\xff", "é", "\u2028"} {
		b, err := json.Marshal(Arg(a))
		if err != nil {
			t.Fatal(err)
		}
		var back Arg
		if err := json.Unmarshal(b, &back); err != nil || string(back) != a {
			t.Errorf("%q → %s → %q %v", a, b, back, err)
		}
	}
}

// BenchmarkSign and BenchmarkVerifyCheck: the CPU cost of a receipt, on
// the daemon (encode and sign) and the client (parse and check; a reader
// verifies as well).
func BenchmarkSign(b *testing.B) {
	k := testKey(1)
	for b.Loop() {
		if _, err := Sign(k, sampleBody()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyCheck(b *testing.B) {
	k := testKey(1)
	doc, _ := Sign(k, sampleBody())
	pub := k.Public().(ed25519.PublicKey)
	r := Received{RequestID: "0123456789abcdef", Stdout: StreamOf([]byte("<hi>\n")), Stderr: StreamOf(nil), Outcome: &Outcome{ExitCode: 3}}
	for b.Loop() {
		body, err := Verify(doc, pub)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := body.Check(r); err != nil {
			b.Fatal(err)
		}
	}
}
