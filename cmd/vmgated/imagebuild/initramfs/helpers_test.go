package initramfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// readEntry is one member decoded by readNewc, with the header fields the
// writer promises to set.
type readEntry struct {
	Ino, Mode, UID, GID, Nlink, Mtime uint32
	DevMajor, DevMinor                uint32
	RdevMajor, RdevMinor              uint32
	Name                              string
	Data                              []byte
}

// readNewc is a strict newc decoder for tests: it checks the magic, the
// checksum field, the NUL terminator, the 4-byte alignment of names and data
// (padding must be zero), and that nothing follows the trailer.
func readNewc(t testing.TB, archive []byte) []readEntry {
	t.Helper()
	var out []readEntry
	off := 0
	hex := func(field int) uint32 {
		s := string(archive[off+6+8*field : off+6+8*field+8])
		v, err := strconv.ParseUint(s, 16, 32)
		if err != nil || strings.ToLower(s) != s {
			t.Fatalf("offset %d: bad hex field %d %q", off, field, s)
		}
		return uint32(v)
	}
	zeroPad := func(from, to int) {
		if to > len(archive) {
			t.Fatalf("archive truncated at %d, want %d bytes", len(archive), to)
		}
		for i := from; i < to; i++ {
			if archive[i] != 0 {
				t.Fatalf("non-zero padding byte at %d", i)
			}
		}
	}
	for {
		if off%4 != 0 {
			t.Fatalf("header at unaligned offset %d", off)
		}
		if off+headerLen > len(archive) {
			t.Fatalf("archive truncated: header at %d, length %d", off, len(archive))
		}
		if got := string(archive[off : off+6]); got != "070701" {
			t.Fatalf("offset %d: magic %q", off, got)
		}
		e := readEntry{
			Ino: hex(0), Mode: hex(1), UID: hex(2), GID: hex(3), Nlink: hex(4), Mtime: hex(5),
			DevMajor: hex(7), DevMinor: hex(8), RdevMajor: hex(9), RdevMinor: hex(10),
		}
		size, namesize, check := int(hex(6)), int(hex(11)), hex(12)
		if check != 0 {
			t.Fatalf("offset %d: check field %d", off, check)
		}
		nameStart := off + headerLen
		nameEnd := nameStart + namesize
		if namesize < 2 || nameEnd > len(archive) || archive[nameEnd-1] != 0 {
			t.Fatalf("offset %d: bad name (namesize %d)", off, namesize)
		}
		e.Name = string(archive[nameStart : nameEnd-1])
		if strings.IndexByte(e.Name, 0) >= 0 {
			t.Fatalf("offset %d: NUL inside name %q", off, e.Name)
		}
		dataStart := nameEnd + pad4(nameEnd)
		zeroPad(nameEnd, dataStart)
		dataEnd := dataStart + size
		next := dataEnd + pad4(dataEnd)
		zeroPad(dataEnd, next)
		e.Data = archive[dataStart:dataEnd]
		off = next
		if e.Name == "TRAILER!!!" {
			if e.Data, e.Name = nil, ""; !reflect.DeepEqual(e, readEntry{Nlink: 1}) || size != 0 {
				t.Fatalf("unexpected trailer header %+v", e)
			}
			break
		}
		out = append(out, e)
	}
	if off != len(archive) {
		t.Fatalf("%d bytes after the trailer", len(archive)-off)
	}
	return out
}

// readEntries decodes an archive and converts its members back to Entry
// values, checking the fixed header fields on the way.
func readEntries(t testing.TB, archive []byte) []Entry {
	t.Helper()
	var out []Entry
	for i, r := range readNewc(t, archive) {
		wantNlink := uint32(1)
		if r.Mode&0o170000 == modeIFDIR {
			wantNlink = 2
		}
		if r.Ino != uint32(i+1) || r.UID != 0 || r.GID != 0 || r.Mtime != 0 || r.DevMajor != 0 || r.DevMinor != 0 || r.Nlink != wantNlink {
			t.Errorf("%s: unexpected header fields %+v", r.Name, r)
		}
		e := Entry{Name: r.Name, Mode: fs.FileMode(r.Mode & 0o777), DevMajor: r.RdevMajor, DevMinor: r.RdevMinor}
		if r.Mode&modeISUID != 0 {
			e.Mode |= fs.ModeSetuid
		}
		if r.Mode&modeISGID != 0 {
			e.Mode |= fs.ModeSetgid
		}
		if r.Mode&modeISVTX != 0 {
			e.Mode |= fs.ModeSticky
		}
		switch r.Mode & 0o170000 {
		case modeIFREG:
			if len(r.Data) > 0 {
				e.Data = r.Data
			}
		case modeIFDIR:
			e.Mode |= fs.ModeDir
		case modeIFLNK:
			e.Mode |= fs.ModeSymlink
			e.Linkname = string(r.Data)
		case modeIFCHR:
			e.Mode |= fs.ModeDevice | fs.ModeCharDevice
		case modeIFBLK:
			e.Mode |= fs.ModeDevice
		default:
			t.Fatalf("%s: unexpected mode %o", r.Name, r.Mode)
		}
		if r.Mode&0o170000 != modeIFREG && r.Mode&0o170000 != modeIFLNK && len(r.Data) != 0 {
			t.Errorf("%s: %d data bytes on a non-regular member", r.Name, len(r.Data))
		}
		out = append(out, e)
	}
	return out
}

// fakeELF returns a minimal little-endian ELF64 relocatable object whose only
// real section is .modinfo holding the given key=value strings, each
// NUL-terminated, as the kernel's MODULE_INFO macros lay them out.
func fakeELF(t testing.TB, modinfo ...string) []byte {
	t.Helper()
	var info []byte
	for _, kv := range modinfo {
		info = append(info, kv...)
		info = append(info, 0)
	}
	return rawELF(t, ".modinfo", info)
}

// rawELF returns an ELF64 relocatable object with one PROGBITS section named
// secName holding data, plus the section name table.
func rawELF(t testing.TB, secName string, data []byte) []byte {
	t.Helper()
	const ehsize, shentsize = 64, 64
	shstrtab := []byte("\x00" + secName + "\x00.shstrtab\x00")
	dataOff := uint64(ehsize)
	strOff := dataOff + uint64(len(data))
	shoff := strOff + uint64(len(shstrtab))
	shoff += (8 - shoff%8) % 8

	var buf bytes.Buffer
	hdr := elf.Header64{
		Type:      uint16(elf.ET_REL),
		Machine:   uint16(elf.EM_X86_64),
		Version:   uint32(elf.EV_CURRENT),
		Shoff:     shoff,
		Ehsize:    ehsize,
		Shentsize: shentsize,
		Shnum:     3,
		Shstrndx:  2,
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(binary.Write(&buf, binary.LittleEndian, hdr))
	buf.Write(data)
	buf.Write(shstrtab)
	buf.Write(make([]byte, int(shoff)-buf.Len()))
	sections := []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_PROGBITS), Flags: uint64(elf.SHF_ALLOC), Off: dataOff, Size: uint64(len(data)), Addralign: 1},
		{Name: uint32(1 + len(secName) + 1), Type: uint32(elf.SHT_STRTAB), Off: strOff, Size: uint64(len(shstrtab)), Addralign: 1},
	}
	must(binary.Write(&buf, binary.LittleEndian, sections))
	return buf.Bytes()
}

// writeModule writes a fake module at root/rel whose .modinfo holds modinfo.
func writeModule(t testing.TB, root, rel string, modinfo ...string) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, fakeELF(t, modinfo...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// names returns the module names of mods.
func names(mods []Module) []string {
	out := make([]string, len(mods))
	for i, m := range mods {
		out[i] = m.Name
	}
	return out
}

// indexOf returns the position of name in mods, failing the test if absent.
func indexOf(t testing.TB, mods []Module, name string) int {
	t.Helper()
	for i, m := range mods {
		if m.Name == name {
			return i
		}
	}
	t.Fatalf("module %s not in %v", name, names(mods))
	return -1
}

func TestFakeELFReadable(t *testing.T) {
	f, err := elf.NewFile(bytes.NewReader(fakeELF(t, "name=x", "depends=")))
	if err != nil {
		t.Fatal(err)
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		t.Fatal("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(data), "name=x\x00depends=\x00"; got != want {
		t.Fatalf("section data %q, want %q", got, want)
	}
}
