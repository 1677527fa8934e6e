//go:build linux && (amd64 || 386)

package main

import "golang.org/x/sys/unix"

// iopl raises the calling thread's I/O privilege level and, if that worked,
// lowers it again. Call it only on a throw-away thread.
func iopl(level int) error {
	if err := unix.Iopl(level); err != nil {
		return err
	}
	return unix.Iopl(0)
}
