package cli

import (
	"errors"
	"testing"

	"github.com/vmgate/vmgate/vm/image"
)

func TestSourceColumns(t *testing.T) {
	for _, tc := range []struct {
		src                   *image.Source
		ref, digest, platform string
	}{
		{nil, "-", "-", "-"},
		{&image.Source{Kind: image.SourceRootFS, Reference: "/x/rootfs.tar"}, "/x/rootfs.tar", "-", "-"},
		{&image.Source{Kind: image.SourceRegistry, Reference: "reg.test/a:1", ManifestDigest: "sha256:aa", ConfigDigest: "sha256:bb", Platform: "linux/amd64"},
			"reg.test/a:1", "sha256:aa", "linux/amd64"},
		{&image.Source{Kind: image.SourceArchive, Reference: "/x/save.tar", ConfigDigest: "sha256:bb", Platform: "linux/amd64"},
			"/x/save.tar", "id sha256:bb", "linux/amd64"},
	} {
		ref, digest, platform := sourceColumns(tc.src)
		if ref != tc.ref || digest != tc.digest || platform != tc.platform {
			t.Errorf("sourceColumns(%+v) = %q %q %q; want %q %q %q", tc.src, ref, digest, platform, tc.ref, tc.digest, tc.platform)
		}
	}
}

func TestDefaultImageName(t *testing.T) {
	for ref, want := range map[string]string{
		"python:3.12-slim": "python",
		"ubuntu":           "ubuntu",
		"reg.test:5000/team/tool@sha256:" + hex64: "tool",
		"127.0.0.1:5000/a/b/c:1":                  "c",
		"UPPER:1":                                 "", // not a reference
	} {
		got, err := defaultImageName(ref)
		if want == "" {
			if !errors.Is(err, errUsage) {
				t.Errorf("defaultImageName(%q) = %q, %v; want a usage error", ref, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("defaultImageName(%q) = %q, %v; want %q", ref, got, err, want)
		}
	}
}

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
