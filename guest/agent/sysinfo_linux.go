package agent

import (
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// setSystemClock sets CLOCK_REALTIME to t.
func setSystemClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("clock_settime: %w", err)
	}
	return nil
}

// reseedKernel reseeds through a /dev/urandom opened for the call (see
// randomDevice).
func reseedKernel(b []byte) error {
	r, err := openRandomDevice()
	if err != nil {
		return err
	}
	defer r.close()
	return r.reseed(b)
}

// randomDevice is /dev/urandom, opened once by Main: a restored clone
// reseeds with two ioctls and no open, whose path walk is first-time guest
// code after a restore (~18 ms under TCG, docs/benchmarks.md).
type randomDevice struct{ fd int }

func openRandomDevice() (*randomDevice, error) {
	fd, err := unix.Open("/dev/urandom", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("reseed: open /dev/urandom: %w", err)
	}
	return &randomDevice{fd: fd}, nil
}

func (r *randomDevice) close() { _ = unix.Close(r.fd) }

// reseed credits b to the kernel's entropy pool (RNDADDENTROPY, 8 bits
// per byte: it is the host's CSPRNG output) and forces the generator to
// reseed from it (RNDRESEEDCRNG). Both need CAP_SYS_ADMIN (the agent runs
// as root).
func (r *randomDevice) reseed(b []byte) error {
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(b))
	binary.NativeEndian.PutUint32(info[0:], uint32(len(b)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(b)))
	copy(info[8:], b)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(r.fd), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); e != 0 {
		return fmt.Errorf("reseed: RNDADDENTROPY: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(r.fd), unix.RNDRESEEDCRNG, 0); e != 0 {
		return fmt.Errorf("reseed: RNDRESEEDCRNG: %w", e)
	}
	return nil
}

// kernelRelease returns the running kernel's release (uname -r), or "" if
// it cannot be determined.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
