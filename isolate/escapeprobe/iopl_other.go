//go:build linux && !(amd64 || 386)

package main

import "golang.org/x/sys/unix"

// iopl does not exist outside x86; the kernel would answer ENOSYS.
func iopl(int) error { return unix.ENOSYS }
