package agentproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Payloads are binary, written and read by hand: big-endian integers,
// strings and byte strings as a uint32 length and the bytes, lists as a
// uint32 count and the items, a trailing byte string as the rest of the
// payload. Nothing is reflected on: after a restore every code path in
// the guest runs first under TCG's translator, and encoding/json's
// reflection cost 20-50 ms per message type there (docs/benchmarks.md).
// Strings pass byte for byte (argv need not be UTF-8); text a guest sends
// for people to read is made valid UTF-8 on the host.
//
// A decoded message owns its bytes: strings are copies, and so are byte
// strings (rest), because the payload is the frame reader's buffer, which
// the next ReadFrame overwrites while the message may still be in use on
// another goroutine (a Reply goes from the reader to the caller waiting
// for it).

// errShort reports a payload that ends inside a field.
var errShort = errors.New("agent protocol: payload too short")

// encoder appends fields to b.
type encoder struct{ b []byte }

func (e *encoder) u8(v uint8)    { e.b = append(e.b, v) }
func (e *encoder) u32(v uint32)  { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) i64(v int64)   { e.b = binary.BigEndian.AppendUint64(e.b, uint64(v)) }
func (e *encoder) str(s string)  { e.u32(uint32(len(s))); e.b = append(e.b, s...) }
func (e *encoder) rest(p []byte) { e.b = append(e.b, p...) }

func (e *encoder) strs(ss []string) {
	e.u32(uint32(len(ss)))
	for _, s := range ss {
		e.str(s)
	}
}

func (e *encoder) boolean(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

// decoder reads fields from p; the first failure sticks in err and makes
// every later read return a zero value.
type decoder struct {
	p   []byte
	err error
}

func (d *decoder) take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.p)) {
		d.err = errShort
		return nil
	}
	b := d.p[:n]
	d.p = d.p[n:]
	return b
}

func (d *decoder) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) i64() int64 {
	if b := d.take(8); b != nil {
		return int64(binary.BigEndian.Uint64(b))
	}
	return 0
}

func (d *decoder) str() string { return string(d.take(uint64(d.u32()))) }

// text is a string a guest sent for people to read: valid UTF-8.
func (d *decoder) text() string { return strings.ToValidUTF8(d.str(), "\uFFFD") }

func (d *decoder) boolean() bool {
	switch d.u8() {
	case 0:
		return false
	case 1:
		return true
	}
	if d.err == nil {
		d.err = errors.New("agent protocol: a flag is neither 0 nor 1")
	}
	return false
}

// strs reads a list of strings; its count is bounded by what the payload
// can hold (four bytes per string at least), so a count cannot make the
// reader allocate beyond the payload's size.
func (d *decoder) strs() []string {
	n := uint64(d.u32())
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.p))/4 {
		d.err = errShort
		return nil
	}
	var ss []string
	if n > 0 {
		ss = make([]string, 0, n)
	}
	for range n {
		ss = append(ss, d.str())
	}
	if d.err != nil {
		return nil
	}
	return ss
}

// rest reads the rest of the payload as a copy (nil when it is empty).
func (d *decoder) rest() []byte {
	if d.err != nil || len(d.p) == 0 {
		return nil
	}
	b := bytes.Clone(d.p)
	d.p = nil
	return b
}

// end reports the first failure, or bytes left over.
func (d *decoder) end(what string) error {
	if d.err == nil && len(d.p) > 0 {
		d.err = fmt.Errorf("agent protocol: %d bytes after the %s", len(d.p), what)
	}
	if d.err != nil {
		return fmt.Errorf("%s: %w", what, d.err)
	}
	return nil
}

// MarshalBinary encodes a Hello.
func (m Hello) MarshalBinary() ([]byte, error) {
	var e encoder
	e.u32(uint32(m.Protocol))
	return e.b, nil
}

// UnmarshalBinary decodes a Hello.
func (m *Hello) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = Hello{Protocol: int(d.u32())}
	return d.end("hello")
}

// MarshalBinary encodes a HelloReply.
func (m HelloReply) MarshalBinary() ([]byte, error) {
	var e encoder
	e.u32(uint32(m.Protocol))
	e.str(m.AgentVersion)
	e.str(m.Error)
	return e.b, nil
}

// UnmarshalBinary decodes a HelloReply.
func (m *HelloReply) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = HelloReply{Protocol: int(d.u32()), AgentVersion: d.text(), Error: d.text()}
	return d.end("hello reply")
}

// MarshalBinary encodes a Call.
func (m Call) MarshalBinary() ([]byte, error) {
	var e encoder
	e.str(m.Op)
	e.rest(m.Args)
	return e.b, nil
}

// UnmarshalBinary decodes a Call.
func (m *Call) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = Call{Op: d.str(), Args: d.rest()}
	return d.end("call")
}

// MarshalBinary encodes a Reply.
func (m Reply) MarshalBinary() ([]byte, error) {
	var e encoder
	e.boolean(m.Error != "")
	if m.Error != "" {
		e.rest([]byte(m.Error))
	} else {
		e.rest(m.Result)
	}
	return e.b, nil
}

// UnmarshalBinary decodes a Reply.
func (m *Reply) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	failed := d.boolean()
	rest := d.rest()
	*m = Reply{}
	if failed {
		m.Error = strings.ToValidUTF8(string(rest), "\uFFFD")
		if m.Error == "" {
			m.Error = "unspecified error"
		}
	} else {
		m.Result = rest
	}
	return d.end("reply")
}

// MarshalBinary encodes an Open.
func (m Open) MarshalBinary() ([]byte, error) {
	var e encoder
	e.strs(m.Spec.Argv)
	e.strs(m.Spec.Env)
	e.str(m.Spec.Dir)
	e.str(m.Spec.User)
	e.boolean(m.PTY != nil)
	if m.PTY != nil {
		e.str(m.PTY.Term)
		e.u32(m.PTY.Columns)
		e.u32(m.PTY.Rows)
	}
	return e.b, nil
}

// UnmarshalBinary decodes an Open.
func (m *Open) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = Open{Spec: ExecSpec{Argv: d.strs(), Env: d.strs(), Dir: d.str(), User: d.str()}}
	if d.boolean() {
		m.PTY = &PTY{Term: d.str(), Columns: d.u32(), Rows: d.u32()}
	}
	return d.end("open")
}

// MarshalBinary encodes a SetTime.
func (m SetTime) MarshalBinary() ([]byte, error) {
	var e encoder
	e.i64(m.UnixNano)
	e.rest(m.Entropy)
	return e.b, nil
}

// UnmarshalBinary decodes a SetTime.
func (m *SetTime) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = SetTime{UnixNano: d.i64(), Entropy: d.rest()}
	return d.end("set time")
}

// MarshalBinary encodes an Info.
func (m Info) MarshalBinary() ([]byte, error) {
	var e encoder
	e.str(m.AgentVersion)
	e.str(m.Kernel)
	e.str(m.Hostname)
	e.str(m.BootID)
	e.strs(m.Features)
	return e.b, nil
}

// UnmarshalBinary decodes an Info.
func (m *Info) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = Info{AgentVersion: d.text(), Kernel: d.text(), Hostname: d.text(), BootID: d.text(), Features: d.strs()}
	return d.end("info")
}

// MarshalBinary encodes a NetReady.
func (m NetReady) MarshalBinary() ([]byte, error) {
	var e encoder
	e.i64(m.TimeoutMS)
	return e.b, nil
}

// UnmarshalBinary decodes a NetReady.
func (m *NetReady) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = NetReady{TimeoutMS: d.i64()}
	return d.end("net ready")
}

// MarshalBinary encodes a NetReadyStatus.
func (m NetReadyStatus) MarshalBinary() ([]byte, error) {
	var e encoder
	e.boolean(m.Ready)
	for _, s := range []string{m.Interface, m.Address, m.Gateway, m.Resolver, m.Detail} {
		e.str(s)
	}
	e.i64(m.WaitedMS)
	return e.b, nil
}

// UnmarshalBinary decodes a NetReadyStatus.
func (m *NetReadyStatus) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = NetReadyStatus{Ready: d.boolean(), Interface: d.text(), Address: d.text(), Gateway: d.text(),
		Resolver: d.text(), Detail: d.text(), WaitedMS: d.i64()}
	return d.end("net ready status")
}
