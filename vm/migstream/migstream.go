// Package migstream reads QEMU's migration stream as far as vmgate needs
// to save a VM without a second QEMU: it splits the stream of a stopped
// VM into the pages of one RAM block (the guest's RAM), which it writes at
// their offsets into a RAM image, and everything else (the device state,
// the pages of the small blocks: firmware, ROMs), which it passes on as a
// stream of its own. QEMU loads that stream as it loads a template's
// state: with x-ignore-shared, the block's pages come from the RAM image
// mapped as the guest's memory, not from the stream.
//
// What it reads (QEMU's savevm.c and ram.c, stable since QEMU 2.x for the
// parts here): the header (magic, version, the configuration section with
// its subsections), then the RAM section: its start (the list of RAM
// blocks) and its parts and end, each a list of records (a page, a zero
// page, the end of the section), each section ending with an optional
// footer. Everything after the end of the RAM section (the other devices'
// sections, the stream's end, its JSON description) is passed on as it
// is, unread. Features that change the records (compression, XBZRLE,
// multifd, postcopy, RDMA) are refused with an error that names them:
// vmgate never turns them on.
//
// Threat model. The stream comes from the saved VM's QEMU, which a guest
// that escaped into it controls: every byte is hostile. The reader trusts
// no length: a string is at most 255 bytes by its encoding, a block list
// is at most MaxBlocks long and must add up to the total it announced,
// the main block must have the size the caller expects, each of its pages
// must lie inside it, page-aligned, after the previous one (so the image
// is written once, in order, and its digest taken as it is written), and
// what is passed on is bounded by Options.MaxState. Nothing read is
// interpreted beyond that: a lying stream can only give the VM a wrong
// RAM or state, which only that VM's jailed QEMU ever loads, as a guest
// could have written them itself. Every error leaves the RAM image and the
// state partial: the caller removes them.
package migstream

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vmgate/vmgate/internal/integrity"
)

// pageSize is the page of the streams read (x86's target page: the
// configuration's target-page-bits must be 12), the RAM image's.
const pageSize = integrity.PageSize

// MaxBlocks bounds the RAM block list of a stream.
const MaxBlocks = 256

// Stream framing (QEMU migration/savevm.h).
const (
	fileMagic   = 0x5145564d // "QEVM"
	fileVersion = 3

	secEOF     = 0x00
	secStart   = 0x01
	secPart    = 0x02
	secEnd     = 0x03
	secFull    = 0x04
	subsection = 0x05
	secConfig  = 0x07
	secFooter  = 0x7e
)

// RAM record flags (QEMU migration/ram.c), in the low bits of a record's
// first 8 bytes; the rest is a page's offset in its block.
const (
	flagFull         = 0x01
	flagZero         = 0x02
	flagMemSize      = 0x04
	flagPage         = 0x08
	flagEOS          = 0x10
	flagContinue     = 0x20
	flagXBZRLE       = 0x40
	flagHook         = 0x80
	flagCompress     = 0x100
	flagMultifdFlush = 0x200
	flagMask         = pageSize - 1
)

// unsupported names the record flags of features vmgate never turns on.
var unsupported = []struct {
	flag uint64
	what string
}{
	{flagFull, "full pages (an obsolete format)"},
	{flagXBZRLE, "XBZRLE"},
	{flagHook, "RDMA"},
	{flagCompress, "compression"},
	{flagMultifdFlush, "multifd"},
}

// ErrStream reports a stream that is not one this package reads: damaged,
// hostile, or from a QEMU feature or version it does not know. The error
// says what was found where.
var ErrStream = errors.New("migration stream not understood")

// Options says what to split.
type Options struct {
	// Block is the id of the RAM block whose pages go to the RAM image
	// (the memory backend's id), and BlockBytes its size.
	Block      string
	BlockBytes int64
	// MaxState bounds what is passed on (device state and the other
	// blocks' pages); 0 means DefaultMaxState.
	MaxState int64
	// MACKey, if set, has the block's keyed check taken too
	// (integrity.NewPageCheck; Result.RAMMAC).
	MACKey []byte
}

// DefaultMaxState bounds what is passed on unless Options says otherwise:
// a VM's device state is tens of KiB, its firmware and ROM blocks about
// 256 KiB.
const DefaultMaxState = 64 << 20

// Result is what a split found.
type Result struct {
	// RAMDigest is the digest of the block's content
	// (integrity.PageDigest).
	RAMDigest string
	// RAMMAC is its keyed check under Options.MACKey, if one was given.
	RAMMAC string
	// DataPages is how many of its pages are not all zeros (written to
	// the image); ZeroPages how many the stream sent as zero.
	DataPages, ZeroPages int64
	// StateBytes is what was passed on.
	StateBytes int64
}

// Split reads a migration stream from r. The pages of o.Block that are not
// all zeros are written to ram at their offsets (ram must read as zeros
// where nothing is written: a new sparse file or memory file of
// o.BlockBytes bytes); the rest of the stream, without them, is written to
// state. Split returns once r is at its end.
//
// Precondition: the stream is of a stopped VM whose migration had the
// capability x-ignore-shared, and o.Block is not shared memory (its pages
// are in the stream).
func Split(r io.Reader, state io.Writer, ram io.WriterAt, o Options) (Result, error) {
	if o.MaxState <= 0 {
		o.MaxState = DefaultMaxState
	}
	if o.BlockBytes <= 0 || o.BlockBytes%pageSize != 0 || o.Block == "" || len(o.Block) > 255 {
		return Result{}, fmt.Errorf("migstream: block %q of %d bytes: not a RAM block", o.Block, o.BlockBytes)
	}
	digest := integrity.NewPageDigest()
	if o.MACKey != nil {
		var err error
		if digest, err = integrity.NewPageCheck(o.MACKey, true); err != nil {
			return Result{}, err
		}
	}
	buf := int(min(runBytes, o.BlockBytes))
	s := &splitter{
		in:     bufio.NewReaderSize(r, max(buf, 2*pageSize)),
		out:    &limitWriter{w: state, n: o.MaxState},
		ram:    ram,
		o:      o,
		digest: digest,
		run:    make([]byte, 0, buf),
	}
	if err := s.split(); err != nil {
		return Result{}, err
	}
	return Result{RAMDigest: s.digest.Sum(), RAMMAC: s.digest.MAC(), DataPages: s.dataPages, ZeroPages: s.zeroPages, StateBytes: s.out.written}, nil
}

// runBytes is how much of the image is written at once: a run of pages
// at consecutive offsets.
const runBytes = 1 << 20

type splitter struct {
	in     *bufio.Reader
	out    *limitWriter
	ram    io.WriterAt
	o      Options
	digest *integrity.PageDigest

	ignoreShared bool
	ramSection   uint32 // the RAM section's id, once started
	started      bool
	mainSeen     bool // the block list named the main block
	lastBlock    string
	next         int64 // the lowest offset the next page of the block may have
	run          []byte
	runAt        int64
	dataPages    int64
	zeroPages    int64
	pos          int64 // bytes read, for errors
}

func (s *splitter) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrStream, s.pos, fmt.Sprintf(format, args...))
}

func (s *splitter) split() error {
	magic, err := s.u32()
	if err != nil {
		return err
	}
	version, err := s.u32()
	if err != nil {
		return err
	}
	if magic != fileMagic || version != fileVersion {
		return s.errorf("magic %#x version %d, want QEVM version %d", magic, version, fileVersion)
	}
	s.out.u32(magic)
	s.out.u32(version)
	for {
		kind, err := s.u8()
		if err != nil {
			return err
		}
		switch kind {
		case secConfig:
			s.out.u8(kind)
			if err := s.config(); err != nil {
				return err
			}
		case secStart:
			if err := s.start(); err != nil {
				return err
			}
		case secPart, secEnd:
			id, err := s.u32()
			if err != nil {
				return err
			}
			if !s.started || id != s.ramSection {
				return s.errorf("section %d continues before or besides the RAM section", id)
			}
			s.out.u8(kind)
			s.out.u32(id)
			if err := s.records(); err != nil {
				return err
			}
			if err := s.footer(id); err != nil {
				return err
			}
			if kind == secEnd {
				return s.rest()
			}
		default:
			return s.errorf("section type %#x before the end of the RAM section", kind)
		}
		if s.out.err != nil {
			return s.out.err
		}
	}
}

// config reads the configuration section: the machine's name and the
// subsections QEMU sends (page bits, validated capabilities, the UUID).
func (s *splitter) config() error {
	n, err := s.u32()
	if err != nil {
		return err
	}
	if n > 255 {
		return s.errorf("machine name of %d bytes", n)
	}
	name, err := s.bytes(int(n))
	if err != nil {
		return err
	}
	s.out.u32(n)
	s.out.write(name)
	for {
		b, err := s.in.Peek(1)
		if err != nil {
			return s.readErr(err)
		}
		if b[0] != subsection {
			break
		}
		_, _ = s.u8()
		sub, err := s.str()
		if err != nil {
			return err
		}
		ver, err := s.u32()
		if err != nil {
			return err
		}
		s.out.u8(subsection)
		s.out.str(sub)
		s.out.u32(ver)
		switch sub {
		case "configuration/target-page-bits":
			bits, err := s.u32()
			if err != nil {
				return err
			}
			if bits != 12 {
				return s.errorf("target page bits %d, want 12", bits)
			}
			s.out.u32(bits)
		case "configuration/capabilities":
			count, err := s.u32()
			if err != nil {
				return err
			}
			if count > 64 {
				return s.errorf("%d capabilities", count)
			}
			s.out.u32(count)
			for range count {
				c, err := s.str()
				if err != nil {
					return err
				}
				if c == "x-ignore-shared" {
					s.ignoreShared = true
				}
				s.out.str(c)
			}
		case "configuration/uuid":
			u, err := s.bytes(16)
			if err != nil {
				return err
			}
			s.out.write(u)
		default:
			return s.errorf("configuration subsection %q (a QEMU newer than this reader)", sub)
		}
	}
	return nil
}

// start reads a section's start, which must be RAM's.
func (s *splitter) start() error {
	id, err := s.u32()
	if err != nil {
		return err
	}
	name, err := s.str()
	if err != nil {
		return err
	}
	instance, err := s.u32()
	if err != nil {
		return err
	}
	version, err := s.u32()
	if err != nil {
		return err
	}
	if name != "ram" || s.started {
		return s.errorf("section %q starts before the end of the RAM section", name)
	}
	if !s.ignoreShared {
		return s.errorf("the stream was not made with x-ignore-shared")
	}
	s.started, s.ramSection = true, id
	s.out.u8(secStart)
	s.out.u32(id)
	s.out.str(name)
	s.out.u32(instance)
	s.out.u32(version)
	if err := s.records(); err != nil {
		return err
	}
	if !s.mainSeen {
		return s.errorf("no RAM block %q of %d bytes in the stream", s.o.Block, s.o.BlockBytes)
	}
	return s.footer(id)
}

// footer reads the optional footer of section id.
func (s *splitter) footer(id uint32) error {
	b, err := s.in.Peek(1)
	if err != nil {
		return s.readErr(err)
	}
	if b[0] != secFooter {
		return nil
	}
	_, _ = s.u8()
	got, err := s.u32()
	if err != nil {
		return err
	}
	if got != id {
		return s.errorf("footer of section %d ends section %d", got, id)
	}
	s.out.u8(secFooter)
	s.out.u32(got)
	return nil
}

// records reads one RAM section's records, up to and with its end.
func (s *splitter) records() error {
	for {
		head, err := s.u64()
		if err != nil {
			return err
		}
		flags, addr := head&flagMask, int64(head&^flagMask)
		for _, u := range unsupported {
			if flags&u.flag != 0 {
				return s.errorf("RAM record with flags %#x: %s is not read", flags, u.what)
			}
		}
		switch {
		case flags == flagEOS:
			if err := s.flush(); err != nil {
				return err
			}
			s.out.u64(head)
			return s.out.err
		case flags == flagMemSize:
			s.out.u64(head)
			if err := s.blockList(addr); err != nil {
				return err
			}
		case flags&^flagContinue == flagZero, flags&^flagContinue == flagPage:
			if err := s.page(head, flags, addr); err != nil {
				return err
			}
		default:
			return s.errorf("RAM record with flags %#x", flags)
		}
		if s.out.err != nil {
			return s.out.err
		}
	}
}

// blockList reads the RAM blocks' list: names and sizes adding up to
// total.
func (s *splitter) blockList(total int64) error {
	for n := 0; total > 0; n++ {
		if n == MaxBlocks {
			return s.errorf("more than %d RAM blocks", MaxBlocks)
		}
		name, err := s.str()
		if err != nil {
			return err
		}
		size, err := s.u64()
		if err != nil {
			return err
		}
		addr, err := s.u64() // with x-ignore-shared: where it is mapped
		if err != nil {
			return err
		}
		if size > uint64(total) {
			return s.errorf("RAM block %q of %d bytes, more than the %d left of the total", name, size, total)
		}
		if name == s.o.Block {
			if int64(size) != s.o.BlockBytes || s.mainSeen {
				return s.errorf("RAM block %q of %d bytes, want one of %d", name, size, s.o.BlockBytes)
			}
			s.mainSeen = true
		}
		total -= int64(size)
		s.out.str(name)
		s.out.u64(size)
		s.out.u64(addr)
	}
	return nil
}

// page reads a page or zero page record: the main block's go to the RAM
// image, the others are passed on.
func (s *splitter) page(head, flags uint64, addr int64) error {
	block := s.lastBlock
	var name string
	if flags&flagContinue == 0 {
		var err error
		if name, err = s.str(); err != nil {
			return err
		}
		block = name
		s.lastBlock = name
	} else if s.lastBlock == "" {
		return s.errorf("a RAM record continues no block")
	}
	zero := flags&^flagContinue == flagZero
	if block != s.o.Block {
		s.out.u64(head)
		if flags&flagContinue == 0 {
			s.out.str(name)
		}
		n := 1
		if !zero {
			n = pageSize
		}
		b, err := s.bytes(n)
		if err != nil {
			return err
		}
		s.out.write(b)
		return nil
	}
	if addr < s.next || addr >= s.o.BlockBytes {
		return s.errorf("page at %#x of RAM block %q: outside it or not after the previous page", addr, block)
	}
	s.next = addr + pageSize
	if zero {
		fill, err := s.u8()
		if err != nil {
			return err
		}
		if fill != 0 {
			return s.errorf("page at %#x filled with %#x: only zero pages are read", addr, fill)
		}
		s.zeroPages++
		return nil
	}
	b, err := s.bytes(pageSize)
	if err != nil {
		return err
	}
	if integrity.IsZeroPage(b) {
		s.zeroPages++
		return nil
	}
	s.dataPages++
	if err := s.digest.AddPage(addr, b); err != nil {
		return s.errorf("%v", err)
	}
	if len(s.run) > 0 && (s.runAt+int64(len(s.run)) != addr || len(s.run) == cap(s.run)) {
		if err := s.flush(); err != nil {
			return err
		}
	}
	if len(s.run) == 0 {
		s.runAt = addr
	}
	s.run = append(s.run, b...)
	return nil
}

// flush writes the run of pages gathered.
func (s *splitter) flush() error {
	if len(s.run) == 0 {
		return nil
	}
	if _, err := s.ram.WriteAt(s.run, s.runAt); err != nil {
		return fmt.Errorf("migstream: write RAM at %#x: %w", s.runAt, err)
	}
	s.run = s.run[:0]
	return nil
}

// rest passes on what follows the RAM section, unread.
func (s *splitter) rest() error {
	if s.out.err != nil {
		return s.out.err
	}
	n, err := io.Copy(s.out, s.in)
	s.pos += n
	if err != nil {
		if s.out.err != nil {
			return s.out.err
		}
		return fmt.Errorf("migstream: read: %w", err)
	}
	return nil
}

// Readers of the stream's big-endian fields; a stream that ends early is
// an error.

func (s *splitter) bytes(n int) ([]byte, error) {
	b, err := s.in.Peek(n)
	if err != nil {
		return nil, s.readErr(err)
	}
	_, _ = s.in.Discard(n)
	s.pos += int64(n)
	return b, nil
}

func (s *splitter) u8() (byte, error) {
	b, err := s.in.ReadByte()
	if err != nil {
		return 0, s.readErr(err)
	}
	s.pos++
	return b, nil
}

func (s *splitter) u32() (uint32, error) {
	b, err := s.bytes(4)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b), nil
}

func (s *splitter) u64() (uint64, error) {
	b, err := s.bytes(8)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b), nil
}

// str reads a string: a length byte, then as many bytes.
func (s *splitter) str() (string, error) {
	n, err := s.u8()
	if err != nil {
		return "", err
	}
	b, err := s.bytes(int(n))
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func (s *splitter) readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return s.errorf("the stream ends early")
	}
	return fmt.Errorf("migstream: read: %w", err)
}

// limitWriter passes on at most n bytes; its first error sticks.
type limitWriter struct {
	w       io.Writer
	n       int64
	written int64
	err     error
	buf     [8]byte
}

// ErrStateTooBig reports a stream whose state is over Options.MaxState.
var ErrStateTooBig = errors.New("migstream: the device state is larger than allowed")

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if l.written+int64(len(p)) > l.n {
		l.err = fmt.Errorf("%w (%d bytes)", ErrStateTooBig, l.n)
		return 0, l.err
	}
	n, err := l.w.Write(p)
	l.written += int64(n)
	if err != nil {
		l.err = fmt.Errorf("migstream: write state: %w", err)
	}
	return n, l.err
}

func (l *limitWriter) write(p []byte) { _, _ = l.Write(p) }
func (l *limitWriter) u8(v byte)      { l.buf[0] = v; l.write(l.buf[:1]) }
func (l *limitWriter) u32(v uint32) {
	binary.BigEndian.PutUint32(l.buf[:4], v)
	l.write(l.buf[:4])
}

func (l *limitWriter) u64(v uint64) {
	binary.BigEndian.PutUint64(l.buf[:8], v)
	l.write(l.buf[:8])
}

func (l *limitWriter) str(v string) {
	l.u8(byte(len(v)))
	l.write([]byte(v))
}
