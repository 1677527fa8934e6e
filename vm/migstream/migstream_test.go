package migstream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/internal/integrity"
)

// stream builds migration streams as QEMU writes them.
type stream struct{ bytes.Buffer }

func (b *stream) u8(v byte) *stream { b.WriteByte(v); return b }
func (b *stream) u32(v uint32) *stream {
	b.Write(binary.BigEndian.AppendUint32(nil, v))
	return b
}

func (b *stream) u64(v uint64) *stream {
	b.Write(binary.BigEndian.AppendUint64(nil, v))
	return b
}
func (b *stream) str(s string) *stream { b.u8(byte(len(s))); b.WriteString(s); return b }

// header writes the magic, the version and a configuration section with
// the capabilities caps.
func (b *stream) header(caps ...string) *stream {
	b.u32(fileMagic).u32(fileVersion).u8(secConfig).u32(7)
	b.WriteString("microvm")
	if len(caps) > 0 {
		b.u8(subsection).str("configuration/capabilities").u32(1).u32(uint32(len(caps)))
		for _, c := range caps {
			b.str(c)
		}
	}
	return b
}

type block struct {
	name string
	size uint64
}

// start opens the RAM section (id 2) with its block list.
func (b *stream) start(blocks ...block) *stream {
	b.u8(secStart).u32(2).str("ram").u32(0).u32(4)
	var total uint64
	for _, bl := range blocks {
		total += bl.size
	}
	b.u64(total | flagMemSize)
	for _, bl := range blocks {
		b.str(bl.name).u64(bl.size).u64(0xfeed)
	}
	return b.u64(flagEOS).footer()
}

func (b *stream) footer() *stream { return b.u8(secFooter).u32(2) }

// page writes a page record: data nil for a zero page; block "" continues
// the last block.
func (b *stream) page(blk string, off uint64, data []byte) *stream {
	f := uint64(flagPage)
	if data == nil {
		f = flagZero
	}
	if blk == "" {
		f |= flagContinue
	}
	b.u64(off | f)
	if blk != "" {
		b.str(blk)
	}
	if data == nil {
		return b.u8(0)
	}
	b.Write(data)
	return b
}

func (b *stream) section(kind byte) *stream { return b.u8(kind).u32(2) }
func (b *stream) eos() *stream              { return b.u64(flagEOS).footer() }

// devices is what follows the RAM section: passed on unread.
var devices = append([]byte{secFull, 0, 0, 0, 3, 4, 'a', 'p', 'i', 'c', 0, 0, 0, 0, 0, 0, 0, 1, 0xaa, secFooter, 0, 0, 0, 3, secEOF}, `{"page_size": 4096}`...)

func fill(c byte) []byte { return bytes.Repeat([]byte{c}, pageSize) }

// mem is an io.WriterAt over a byte slice.
type mem struct{ b []byte }

func (m *mem) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(m.b)) {
		return 0, errors.New("out of range")
	}
	return copy(m.b[off:], p), nil
}

const ramPages = 16

var blocks = []block{{"ram", ramPages * pageSize}, {"pc.bios", 2 * pageSize}, {"/rom@etc/acpi/tables", pageSize}}

// sample is a stream of a VM: RAM pages with data, zero pages and pages of
// zeros sent as data, in two sections, the firmware's pages among them;
// want the state it must leave, image the RAM image.
func sample() (in, want []byte, image []byte) {
	var s, w stream
	image = make([]byte, ramPages*pageSize)
	for _, b := range []*stream{&s, &w} {
		b.header("x-ignore-shared").start(blocks...)
		b.section(secPart)
	}
	s.page("ram", 0, fill(1)).page("", pageSize, nil).page("", 2*pageSize, fill(2)).page("", 3*pageSize, fill(3))
	copy(image[0:], fill(1))
	copy(image[2*pageSize:], fill(2))
	copy(image[3*pageSize:], fill(3))
	for _, b := range []*stream{&s, &w} {
		b.page("pc.bios", 0, fill(9)).page("", pageSize, nil)
	}
	s.page("ram", 4*pageSize, fill(0)).page("", 9*pageSize, fill(4))
	copy(image[9*pageSize:], fill(4))
	for _, b := range []*stream{&s, &w} {
		b.eos().section(secEnd)
	}
	s.page("ram", 10*pageSize, fill(5)).page("", 15*pageSize, nil)
	copy(image[10*pageSize:], fill(5))
	for _, b := range []*stream{&s, &w} {
		b.page("/rom@etc/acpi/tables", 0, fill(7)).eos()
		b.Write(devices)
	}
	return s.Bytes(), w.Bytes(), image
}

func TestSplit(t *testing.T) {
	in, want, image := sample()
	var state bytes.Buffer
	ram := &mem{make([]byte, ramPages*pageSize)}
	res, err := Split(bytes.NewReader(in), &state, ram, Options{Block: "ram", BlockBytes: ramPages * pageSize})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(state.Bytes(), want) {
		t.Errorf("state:\n%x\nwant\n%x", state.Bytes(), want)
	}
	if !bytes.Equal(ram.b, image) {
		t.Error("the RAM image is not the VM's RAM")
	}
	d := integrity.NewPageDigest()
	if err := d.Add(0, image); err != nil {
		t.Fatal(err)
	}
	if res.RAMDigest != d.Sum() || res.RAMMAC != "" || res.DataPages != 5 || res.ZeroPages != 3 || res.StateBytes != int64(len(want)) {
		t.Errorf("result %+v; want digest %s, no check, 5 data pages, 3 zero, %d bytes of state", res, d.Sum(), len(want))
	}
	// With a key, the keyed check too.
	key := bytes.Repeat([]byte{5}, integrity.KeySize)
	c, _ := integrity.NewPageCheck(key, true)
	_ = c.Add(0, image)
	keyed, err := Split(bytes.NewReader(in), io.Discard, &mem{make([]byte, ramPages*pageSize)}, Options{Block: "ram", BlockBytes: ramPages * pageSize, MACKey: key})
	if err != nil || keyed.RAMDigest != d.Sum() || keyed.RAMMAC != c.MAC() || c.MAC() == "" {
		t.Errorf("split with a key: %+v %v; want digest %s, check %s", keyed, err, d.Sum(), c.MAC())
	}
	if _, err := Split(bytes.NewReader(in), io.Discard, &mem{make([]byte, ramPages*pageSize)}, Options{Block: "ram", BlockBytes: ramPages * pageSize, MACKey: key[:5]}); err == nil {
		t.Error("split with a key of 5 bytes")
	}
	// The state is itself a stream with no page of the block.
	var again bytes.Buffer
	res2, err := Split(bytes.NewReader(want), &again, &mem{make([]byte, ramPages*pageSize)}, Options{Block: "ram", BlockBytes: ramPages * pageSize})
	if err != nil || !bytes.Equal(again.Bytes(), want) || res2.DataPages+res2.ZeroPages != 0 {
		t.Errorf("split of the state: %+v %v", res2, err)
	}
}

func TestSplitRefuses(t *testing.T) {
	good := func() *stream { var s stream; s.header("x-ignore-shared").start(blocks...).section(secPart); return &s }
	cases := []struct {
		name string
		in   func() []byte
		want string
	}{
		{"not a stream", func() []byte { return []byte("GET / HTTP/1.1\r\n\r\n") }, "magic"},
		{"without x-ignore-shared", func() []byte { var s stream; s.header().start(blocks...); return s.Bytes() }, "x-ignore-shared"},
		{"unknown subsection", func() []byte {
			var s stream
			s.header("x-ignore-shared").u8(subsection).str("configuration/new").u32(1).u32(0)
			return s.Bytes()
		}, `"configuration/new"`},
		{"a device before the RAM", func() []byte {
			var s stream
			s.header("x-ignore-shared").Write(devices)
			return s.Bytes()
		}, "before the end of the RAM"},
		{"no main block", func() []byte { var s stream; s.header("x-ignore-shared").start(blocks[1:]...); return s.Bytes() }, "no RAM block"},
		{"main block of another size", func() []byte {
			var s stream
			s.header("x-ignore-shared").start(block{"ram", pageSize})
			return s.Bytes()
		}, "want one of"},
		{"blocks over the total", func() []byte {
			var s stream
			s.header("x-ignore-shared").u8(secStart).u32(2).str("ram").u32(0).u32(4).u64(pageSize | flagMemSize).str("ram").u64(2 * pageSize).u64(0)
			return s.Bytes()
		}, "more than the"},
		{"page out of order", func() []byte {
			return good().page("ram", 2*pageSize, fill(1)).page("", pageSize, fill(1)).Bytes()
		}, "not after the previous page"},
		{"page twice", func() []byte {
			return good().page("ram", pageSize, fill(1)).page("", pageSize, fill(1)).Bytes()
		}, "not after the previous page"},
		{"page outside the block", func() []byte { return good().page("ram", ramPages*pageSize, fill(1)).Bytes() }, "outside it"},
		{"a continuation of nothing", func() []byte { return good().page("", 0, fill(1)).Bytes() }, "continues no block"},
		{"filled page", func() []byte { return good().u64(flagZero).str("ram").u8(7).Bytes() }, "filled with"},
		{"compressed page", func() []byte { return good().u64(flagCompress).Bytes() }, "compression"},
		{"xbzrle page", func() []byte { return good().u64(flagXBZRLE | flagContinue).Bytes() }, "XBZRLE"},
		{"multifd", func() []byte { return good().u64(flagMultifdFlush).Bytes() }, "multifd"},
		{"section of another id", func() []byte { return good().eos().u8(secPart).u32(9).Bytes() }, "besides the RAM"},
		{"wrong footer", func() []byte { return good().u64(flagEOS).u8(secFooter).u32(5).Bytes() }, "footer of section 5"},
		{"cut short", func() []byte { return good().page("ram", 0, fill(1)).Bytes()[:good().Len()+20] }, "ends early"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Split(bytes.NewReader(c.in()), io.Discard, &mem{make([]byte, ramPages*pageSize)}, Options{Block: "ram", BlockBytes: ramPages * pageSize})
			if !errors.Is(err, ErrStream) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an ErrStream saying %q", err, c.want)
			}
		})
	}
}

// TestSplitEveryCut: a stream cut anywhere before its RAM section ends is
// an error, never a panic or a success (every byte of the headers, then
// every 61st, and every byte of the last records).
func TestSplitEveryCut(t *testing.T) {
	in, _, _ := sample()
	end := bytes.Index(in, devices)
	for n := 0; n < end; n++ {
		if n > 400 && n < end-100 && n%61 != 0 {
			continue
		}
		_, err := Split(bytes.NewReader(in[:n]), io.Discard, &mem{make([]byte, ramPages*pageSize)}, Options{Block: "ram", BlockBytes: ramPages * pageSize})
		if !errors.Is(err, ErrStream) {
			t.Fatalf("cut at %d of %d: %v", n, end, err)
		}
	}
}

// errWriterAt fails every write as a full disk does.
type errWriterAt struct{}

func (errWriterAt) WriteAt([]byte, int64) (int, error) { return 0, syscall.ENOSPC }

func TestSplitWriteErrors(t *testing.T) {
	in, want, _ := sample()
	_, err := Split(bytes.NewReader(in), io.Discard, errWriterAt{}, Options{Block: "ram", BlockBytes: ramPages * pageSize})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a RAM image that cannot be written: %v", err)
	}
	_, err = Split(bytes.NewReader(in), io.Discard, &mem{make([]byte, ramPages*pageSize)}, Options{Block: "ram", BlockBytes: ramPages * pageSize, MaxState: int64(len(want) - 1)})
	if !errors.Is(err, ErrStateTooBig) {
		t.Errorf("a state over the bound: %v", err)
	}
	if _, err := Split(bytes.NewReader(in), io.Discard, &mem{}, Options{Block: "ram", BlockBytes: 100}); err == nil {
		t.Error("a block size that is no number of pages")
	}
}

// FuzzSplit: no input panics or writes outside the image; a stream that
// splits leaves a state that splits again into itself, with no page of
// the block, and a RAM image whose digest is the one reported.
func FuzzSplit(f *testing.F) {
	in, want, _ := sample()
	_ = want
	// Small seeds: the fuzzer minimises what it finds, which is slow on
	// streams of many pages.
	var s stream
	s.header("x-ignore-shared").start(blocks...).section(secEnd).page("ram", pageSize, []byte(strings.Repeat("\x01", pageSize))).page("pc.bios", 0, nil).eos()
	s.Write(devices)
	f.Add(s.Bytes())
	f.Add(in[:200])
	f.Fuzz(func(t *testing.T, in []byte) {
		o := Options{Block: "ram", BlockBytes: ramPages * pageSize, MaxState: 1 << 20}
		ram := &mem{make([]byte, ramPages*pageSize)}
		var state bytes.Buffer
		res, err := Split(bytes.NewReader(in), &state, ram, o)
		if err != nil {
			return
		}
		d := integrity.NewPageDigest()
		_ = d.Add(0, ram.b)
		if d.Sum() != res.RAMDigest {
			t.Fatalf("digest %s of the image, reported %s", d.Sum(), res.RAMDigest)
		}
		var again bytes.Buffer
		res2, err := Split(bytes.NewReader(state.Bytes()), &again, &mem{make([]byte, ramPages*pageSize)}, o)
		if err != nil || !bytes.Equal(again.Bytes(), state.Bytes()) || res2.DataPages+res2.ZeroPages != 0 {
			t.Fatalf("the state does not split into itself: %+v %v", res2, err)
		}
	})
}
