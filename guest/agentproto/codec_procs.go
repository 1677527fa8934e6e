package agentproto

import (
	"bytes"
	"errors"
)

// The payloads of the proc calls (procs.go), in codec.go's encoding.
// Counts of items are bounded by what the payload can hold (minimum sizes
// below), so that a count cannot make the reader allocate beyond the
// payload's size.

// bin reads a byte string as a copy (nil when it is empty).
func (d *decoder) bin() []byte {
	b := d.take(uint64(d.u32()))
	if len(b) == 0 {
		return nil
	}
	return bytes.Clone(b)
}

func (e *encoder) bin(p []byte) { e.u32(uint32(len(p))); e.b = append(e.b, p...) }

// count reads a list's count, each item at least min bytes.
func (d *decoder) count(min int) int {
	n := uint64(d.u32())
	if d.err == nil && n > uint64(len(d.p))/uint64(min) {
		d.err = errShort
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

func (e *encoder) spec(s ExecSpec) {
	e.strs(s.Argv)
	e.strs(s.Env)
	e.str(s.Dir)
	e.str(s.User)
}

func (d *decoder) spec() ExecSpec {
	return ExecSpec{Argv: d.strs(), Env: d.strs(), Dir: d.str(), User: d.str()}
}

// MarshalBinary encodes a ProcStart.
func (m ProcStart) MarshalBinary() ([]byte, error) {
	var e encoder
	e.spec(m.Spec)
	e.i64(m.TimeoutMS)
	e.i64(m.BufferBytes)
	e.boolean(m.Stdin)
	e.i64(int64(m.MaxProcs))
	return e.b, nil
}

// UnmarshalBinary decodes a ProcStart.
func (m *ProcStart) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = ProcStart{Spec: d.spec(), TimeoutMS: d.i64(), BufferBytes: d.i64(), Stdin: d.boolean(), MaxProcs: int(d.i64())}
	return d.end("proc start")
}

// procInfoMin is the fewest bytes a ProcInfo takes.
const procInfoMin = 8 + 8 + 4 + 1 + 4 + 4 + 4 + 1 + 1 + 7*8 + 1

func (e *encoder) info(m ProcInfo) {
	e.i64(m.Handle)
	e.i64(int64(m.PID))
	e.strs(m.Argv)
	e.boolean(m.ArgvCut)
	e.str(m.User)
	e.str(m.Dir)
	e.str(m.State)
	e.boolean(m.Exit != nil)
	if m.Exit != nil {
		e.u32(m.Exit.Status)
		e.str(m.Exit.Signal)
		e.boolean(m.Exit.CoreDumped)
	}
	e.boolean(m.TimedOut)
	for _, v := range []int64{m.Started, m.Ended, m.Out, m.Err, m.OutDropped, m.ErrDropped, m.Next} {
		e.i64(v)
	}
	e.boolean(m.StdinOpen)
}

func (d *decoder) info() ProcInfo {
	m := ProcInfo{Handle: d.i64(), PID: int(d.i64()), Argv: d.strs(), ArgvCut: d.boolean(), User: d.str(), Dir: d.str(), State: d.text()}
	if d.boolean() {
		x := &Exit{Status: d.u32(), Signal: d.str(), CoreDumped: d.boolean()}
		if x.Signal != "" && d.err == nil {
			if err := checkSignalName(x.Signal); err != nil {
				d.err = err
			}
		}
		m.Exit = x
	}
	m.TimedOut = d.boolean()
	m.Started, m.Ended, m.Out, m.Err = d.i64(), d.i64(), d.i64(), d.i64()
	m.OutDropped, m.ErrDropped, m.Next = d.i64(), d.i64(), d.i64()
	m.StdinOpen = d.boolean()
	return m
}

// MarshalBinary encodes a ProcInfo.
func (m ProcInfo) MarshalBinary() ([]byte, error) {
	var e encoder
	e.info(m)
	return e.b, nil
}

// UnmarshalBinary decodes a ProcInfo.
func (m *ProcInfo) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = d.info()
	return d.end("proc info")
}

// MarshalBinary encodes a ProcListQuery.
func (m ProcListQuery) MarshalBinary() ([]byte, error) {
	var e encoder
	e.i64(m.After)
	return e.b, nil
}

// UnmarshalBinary decodes a ProcListQuery.
func (m *ProcListQuery) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = ProcListQuery{After: d.i64()}
	return d.end("proc list query")
}

// MarshalBinary encodes a ProcList.
func (m ProcList) MarshalBinary() ([]byte, error) {
	var e encoder
	e.u32(uint32(len(m.Procs)))
	for _, pi := range m.Procs {
		e.info(pi)
	}
	e.boolean(m.More)
	return e.b, nil
}

// UnmarshalBinary decodes a ProcList.
func (m *ProcList) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = ProcList{}
	if n := d.count(procInfoMin); n > 0 {
		m.Procs = make([]ProcInfo, 0, n)
		for range n {
			m.Procs = append(m.Procs, d.info())
		}
	}
	m.More = d.boolean()
	if d.err != nil {
		m.Procs = nil
	}
	return d.end("proc list")
}

// MarshalBinary encodes a ProcLogs.
func (m ProcLogs) MarshalBinary() ([]byte, error) {
	var e encoder
	e.i64(m.Handle)
	e.i64(m.Since)
	e.i64(m.Max)
	e.i64(m.WaitMS)
	return e.b, nil
}

// UnmarshalBinary decodes a ProcLogs.
func (m *ProcLogs) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = ProcLogs{Handle: d.i64(), Since: d.i64(), Max: d.i64(), WaitMS: d.i64()}
	return d.end("proc logs")
}

// chunkMin is the fewest bytes an OutputChunk takes.
const chunkMin = 1 + 8 + 4

// errStream reports a chunk of neither stream.
var errStream = errors.New("agent protocol: a chunk of an unknown stream")

// MarshalBinary encodes a ProcOutput.
func (m ProcOutput) MarshalBinary() ([]byte, error) {
	var e encoder
	e.u32(uint32(len(m.Chunks)))
	for _, c := range m.Chunks {
		e.u8(uint8(c.Stream))
		e.i64(c.Offset)
		e.bin(c.Data)
	}
	e.i64(m.Next)
	e.i64(m.Dropped)
	e.info(m.Info)
	return e.b, nil
}

// UnmarshalBinary decodes a ProcOutput.
func (m *ProcOutput) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = ProcOutput{}
	if n := d.count(chunkMin); n > 0 {
		m.Chunks = make([]OutputChunk, 0, n)
		for range n {
			c := OutputChunk{Stream: int(d.u8()), Offset: d.i64(), Data: d.bin()}
			if d.err == nil && c.Stream != StreamStdout && c.Stream != StreamStderr {
				d.err = errStream
			}
			m.Chunks = append(m.Chunks, c)
		}
	}
	m.Next, m.Dropped = d.i64(), d.i64()
	m.Info = d.info()
	if d.err != nil {
		m.Chunks = nil
	}
	return d.end("proc output")
}

// MarshalBinary encodes a ProcInput.
func (m ProcInput) MarshalBinary() ([]byte, error) {
	var e encoder
	e.i64(m.Handle)
	e.bin(m.Data)
	e.boolean(m.EOF)
	return e.b, nil
}

// UnmarshalBinary decodes a ProcInput.
func (m *ProcInput) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = ProcInput{Handle: d.i64(), Data: d.bin(), EOF: d.boolean()}
	return d.end("proc input")
}

// MarshalBinary encodes a ProcSignal.
func (m ProcSignal) MarshalBinary() ([]byte, error) {
	var e encoder
	e.i64(m.Handle)
	e.str(m.Signal)
	return e.b, nil
}

// UnmarshalBinary decodes a ProcSignal.
func (m *ProcSignal) UnmarshalBinary(p []byte) error {
	d := decoder{p: p}
	*m = ProcSignal{Handle: d.i64(), Signal: d.str()}
	return d.end("proc signal")
}
