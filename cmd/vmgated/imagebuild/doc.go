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
// Import takes a root file system that the operator may not have made:
// a tarball (a `docker export` of someone's image), a `docker save`
// archive, an OCI image layout, or (Pull) a registry's image. What it
// holds is the guest's business; it must not reach the host, nor fill
// its disk. The threats and what meets each:
//
//   - Names that lead out of the root ("../x", "/etc/x"): refused, the
//     import fails (entryPath). Every write goes through an os.Root, so
//     a symlink an entry (or an earlier layer) made never leads a later
//     entry, a hard link or a whiteout out of it either: the write
//     fails. GNU tar, run once per layer, would follow it; this is why
//     the unpacker (unpacker) is ours.
//   - Device nodes and FIFOs: skipped, never made on the host (the
//     guest's /dev is its kernel's devtmpfs).
//   - Size: a compressed few KiB can expand to anything. The bytes
//     unpacked, the bytes of files and the entries are bounded over the
//     whole image (DefaultImportMaxBytes, DefaultImportMaxEntries), a
//     manifest, index and configuration each before it is parsed
//     (maxManifestBytes, maxConfigBytes), and the chain of indexes
//     (maxIndexDepth).
//   - Content that is not what it says: every manifest, configuration
//     and layer is checked against its descriptor's digest and size, and
//     each layer's tar against the configuration's diff ID; a blob is
//     hashed as it streams, so a bad layer fails the import after its
//     entries reached the scratch root, which the import removes.
//     Unknown media types are refused; so is an image that is not
//     linux/amd64.
//   - A registry that answers slowly, stops, or sends endless garbage:
//     a pull has a deadline, a bound on a registry's silence and on the
//     bytes it may download (boundedTransport), and speaks plain HTTP
//     only to loopback (checkScheme).
//   - The guest's own root: set-user-ID and set-group-ID bits are
//     cleared unless the operator asks to keep them (--keep-setid,
//     logged as a warning), since a set-user-ID-root program would let a
//     command run as "agent" become the guest's root (docs/security.md,
//     "Imported images under attack"); file capabilities and other
//     extended attributes are never unpacked; the package list is parsed
//     in Go from dpkg's status file, with a size cap, rather than by
//     dpkg-query run as root; and the guest user "agent" is made fresh,
//     replacing any entry of that name the image has (the guest agent
//     refuses an "agent" of uid 0 as well).
//
// Whatever fails, the import leaves nothing behind: it works in a
// directory beside the image's, renamed into place only when complete.
package imagebuild
