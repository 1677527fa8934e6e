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
