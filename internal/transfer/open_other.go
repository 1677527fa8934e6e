//go:build !unix

package transfer

import "os"

// openNoFollow opens p for reading. Without O_NOFOLLOW here, a symlink at
// p is followed; openSame's comparison with the walk's lstat then refuses
// what it opened.
func openNoFollow(p string) (*os.File, error) { return os.Open(p) }
