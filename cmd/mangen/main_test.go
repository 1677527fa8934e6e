package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra/doc"

	"github.com/vmgate/vmgate/cmd/vm-exec/vmexec"
	"github.com/vmgate/vmgate/cmd/vmgated/cli"
)

func TestManPages(t *testing.T) {
	dir := t.TempDir()
	if err := doc.GenManTree(command(vmexec.Describe()), &doc.GenManHeader{Section: "1"}, dir); err != nil {
		t.Fatal(err)
	}
	if err := doc.GenManTree(cli.Command(), &doc.GenManHeader{Section: "1"}, dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "vm-exec.1"))
	if err != nil || !strings.Contains(string(b), "--no-stdin") {
		t.Fatalf("vm-exec.1: %v\n%.300s", err, b)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "vm-exec-ps.1")); err != nil || !strings.Contains(string(b), "--json") {
		t.Fatalf("vm-exec-ps.1: %v\n%.300s", err, b)
	}
	if _, err := os.Stat(filepath.Join(dir, "vmgated-image-import.1")); err != nil {
		t.Fatal(err)
	}
}
