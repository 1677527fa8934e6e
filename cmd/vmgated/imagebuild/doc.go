// Package imagebuild builds and imports vmgate guest images: the work of
// `vmgated image build` and `vmgated image import`. What an image is (its
// files and manifest), and the checks the VM runtime makes of one, are in
// package vm/image; the daemon only reads images.
//
// Images are built from Debian packages only (mmdebstrap), with nothing
// else downloaded. The build runs in a temporary directory beside the
// output and is renamed into place only when complete, so a failed or
// interrupted build never leaves a half-written image under the final
// name. A build whose inputs match the manifest of an existing, intact
// image is skipped.
//
// # Imported roots
//
// Import takes a root file system tarball that the operator may not have
// made (a `docker export` of someone's image). What it holds is the
// guest's business; it must not reach the host. So: it is unpacked in Go
// (unpacker) within bounds on its bytes and entries
// (DefaultImportMaxBytes, DefaultImportMaxEntries; a compressed tarball
// is a few KiB that could expand to any size); names with ".." or
// absolute ones are refused; every write, link and later read goes
// through an os.Root, which no link leads out of (GNU tar, run once per
// layer of a container image, would follow a symlink an earlier layer
// left); device nodes and FIFOs are skipped, never made on the host; the
// package list is parsed in Go from dpkg's status file, with a size cap,
// rather than by dpkg-query run as root; and the guest user "agent" is
// made fresh, replacing any entry of that name the tarball has (the guest
// agent refuses an "agent" of uid 0 as well). Set-user-ID and
// set-group-ID bits are cleared, since a set-user-ID-root program the
// tarball holds would let "agent" become the guest's root; an operator
// who needs them passes --keep-setid, which is logged as a warning
// (docs/security.md, "Imported images under attack").
package imagebuild
