package migstream

// The stream's sections other than the RAM's records: the configuration,
// the RAM section's start and its footers, and what follows it.

import (
	"fmt"
	"io"
)

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
