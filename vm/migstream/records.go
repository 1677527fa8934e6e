package migstream

// The RAM section's records: the block list, and the pages, whose main
// block's go to the RAM image and the others' are passed on.

import (
	"fmt"

	"github.com/vmgate/vmgate/internal/integrity"
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
