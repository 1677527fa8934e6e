package policy

import (
	"fmt"
	"strings"

	"github.com/vmgate/vmgate/internal/names"
)

// The images a profile's callers may choose among (images): each a name,
// pinned or not to the manifest digest of an imported or pulled image.

// RuleImages is the rule of a verdict that refused a request's image (not
// one of the profile's images).
const RuleImages = "images"

// digestPrefix starts a pinned digest; digestHexLen hex digits follow it.
const (
	digestPrefix = "sha256:"
	digestHexLen = 64
)

// imageRef is one entry of a profile's images: an image's name, and the
// manifest digest ("sha256:HEX") it is pinned to, or "".
type imageRef struct {
	name, digest string
}

// String is the entry as the policy writes it: NAME or NAME@sha256:HEX.
func (r imageRef) String() string {
	if r.digest == "" {
		return r.name
	}
	return r.name + "@" + r.digest
}

// parseImageRef parses an entry of images: NAME (names.Image) or
// NAME@sha256:HEX, HEX 64 lower-case hex digits.
func parseImageRef(s string) (imageRef, error) {
	name, digest, pinned := strings.Cut(s, "@")
	if !names.Image(name) {
		return imageRef{}, fmt.Errorf("image name %q: must be %s", name, names.ImageRule)
	}
	if !pinned {
		return imageRef{name: name}, nil
	}
	hex, ok := strings.CutPrefix(digest, digestPrefix)
	if !ok || len(hex) != digestHexLen || strings.Trim(hex, "0123456789abcdef") != "" {
		return imageRef{}, fmt.Errorf("pin %q: must be %s followed by %d lower-case hex digits (the image's manifest digest, as vmgated image list shows it)", digest, digestPrefix, digestHexLen)
	}
	return imageRef{name: name, digest: digest}, nil
}

// parseImages parses images as [defaults] or a profile writes it; nil
// when it is unset or invalid (reported).
func (c *compiler) parseImages(label string, list *[]string) *[]imageRef {
	if list == nil {
		return nil
	}
	out := []imageRef{}
	ok := true
	for _, s := range *list {
		r, err := parseImageRef(s)
		switch {
		case err != nil:
			c.errorf("%s: images: %v", label, err)
			ok = false
		case hasImage(out, r.name):
			c.errorf("%s: images: %q is listed twice", label, r.name)
			ok = false
		default:
			out = append(out, r)
		}
	}
	if !ok {
		return nil
	}
	if len(out) == 0 {
		c.errorf("%s: images is empty: list the images a caller may name, the profile's image among them", label)
		return nil
	}
	return &out
}

func hasImage(refs []imageRef, name string) bool {
	for _, r := range refs {
		if r.name == name {
			return true
		}
	}
	return false
}

func imageNames(refs []imageRef) []string {
	out := make([]string, 0, len(refs))
	for _, r := range refs {
		out = append(out, r.name)
	}
	return out
}

// chooseImage is the image a request of the profile runs in: name, or
// the profile's image when name is "". rule and reason say why not
// (reason "": allowed): a name that is not one an image can have, or
// one that is not among the profile's images (RuleImages).
func (prof *profile) chooseImage(name string) (image, rule, reason string) {
	switch {
	case name == "":
		return prof.image, "", ""
	case !names.Image(name):
		return "", "", fmt.Sprintf("image %s: must be %s", quote(name), names.ImageRule)
	case !hasImage(prof.images, name):
		return "", RuleImages, fmt.Sprintf("image %s is not one of the profile's images (%s)", quote(name), strings.Join(imageNames(prof.images), ", "))
	}
	return name, "", ""
}

// checkPin is why image, the chosen one, may not run with manifest
// digest digest (rule RuleImages), or "" when it may: the profile pins it
// to another (CheckPin).
func (prof *profile) checkPin(image, digest string) (rule, reason string) {
	for _, r := range prof.images {
		if r.name == image {
			if err := CheckPin(r.digest, digest); err != nil {
				return RuleImages, fmt.Sprintf("image %s: %v", quote(image), err)
			}
		}
	}
	return "", ""
}

// ProfileImage is an image a profile's callers may run in: the profile's
// image, or another of its images. Digest is the manifest digest the
// policy pins it to ("sha256:HEX"), or "".
type ProfileImage struct{ Profile, Image, Digest string }

// Images lists, in profile order, every image each profile's callers may
// run in (its images, its image first): the daemon refuses a policy
// naming an image that is not there, or one whose manifest digest is not
// the one pinned. It is pure.
func (p *Policy) Images() []ProfileImage {
	if p == nil {
		return nil
	}
	var out []ProfileImage
	for _, prof := range p.profiles {
		for _, r := range prof.imageList() {
			out = append(out, ProfileImage{Profile: prof.name, Image: r.name, Digest: r.digest})
		}
	}
	return out
}

// imageList is the profile's images, its image first.
func (prof *profile) imageList() []imageRef {
	out := make([]imageRef, 0, len(prof.images))
	for _, r := range prof.images {
		if r.name == prof.image {
			out = append([]imageRef{r}, out...)
		} else {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		out = append(out, imageRef{name: prof.image})
	}
	return out
}

// CheckPin checks an image's manifest digest against the one a policy
// pins it to: nil when pin is "" or the two are equal. digest is the
// image's ("": it has none, as a built image or an imported root file
// system has not). Pure.
func CheckPin(pin, digest string) error {
	switch {
	case pin == "" || pin == digest:
		return nil
	case digest == "":
		return fmt.Errorf("pinned to %s, but the image has no manifest digest (built, or imported from a root file system or a docker save archive without an OCI layout): pull or import the pinned image", pin)
	}
	return fmt.Errorf("pinned to %s, but the image's manifest digest is %s: pull or import the pinned image, or change the pin", pin, digest)
}
