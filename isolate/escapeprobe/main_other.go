//go:build !linux

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "escapeprobe: only Linux is supported")
	os.Exit(2)
}
