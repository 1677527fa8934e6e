package policy

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Policy is a validated operator policy. It is immutable and safe for
// concurrent use; obtain one from [Parse], [Load] or [Default].
type Policy struct {
	source   string    // file name, for messages
	digest   string    // hex SHA-256 of the text parsed
	doc      *document // as decoded, for Validate
	profiles []*profile
	seccomp  string // [isolate] seccomp: "required" or "off"
	cgroups  string // [isolate] cgroups: "auto", "required" or "off"
	// [isolate] guest_aslr: "auto" or "on"
	guestASLR string
	// secrets are the [[secret]] tables by name; values their values,
	// once read (ReadSecrets).
	secrets map[string]*secretDecl
	values  map[string]SecretValue
}

// GuestASLR is the guests' address space randomisation from [isolate]
// guest_aslr: "auto" (the default: off under TCG with a QEMU before 8.0,
// where it makes every exec translate its code again, a logged
// relaxation; on otherwise) or "on". It is read when the daemon starts.
func (p *Policy) GuestASLR() string {
	if p == nil || p.guestASLR == "" {
		return builtinGuestASLR
	}
	return p.guestASLR
}

// Cgroups is the jail's cgroup mode from [isolate] cgroups: "auto" (the
// default: a cgroup per VM when the daemon has a delegated one, otherwise
// rlimits only, logged as a relaxation), "required" (the daemon does not
// start without one) or "off". It is read when the daemon starts.
func (p *Policy) Cgroups() string {
	if p == nil || p.cgroups == "" {
		return builtinCgroups
	}
	return p.cgroups
}

// Seccomp is the jail's seccomp mode from [isolate] seccomp: "required"
// (the default: QEMU does not start without the filter) or "off".
func (p *Policy) Seccomp() string {
	if p == nil || p.seccomp == "" {
		return builtinSeccomp
	}
	return p.seccomp
}

// profile is a compiled [[profile]] with its settings resolved.
type profile struct {
	index      int
	name       string // "" only while compiling an invalid profile
	match      matcher
	admin      bool // sees everyone in status
	rotate     bool // may rotate the audit log (audit_rotate)
	image      string
	images     []imageRef // the images a caller may name (Request.Image); image among them
	user       string
	users      []string // the users a caller may name (Request.User); user among them
	secrets    []string // the secrets a caller may ask for (Request.Secrets)
	network    string
	net        *NetworkPolicy // set when network == "allowlist"
	limits     Limits         // Timeout holds timeout.default
	timeoutMax time.Duration
	allowShell bool
	env        envAllow
	deny       []*rule
	allow      []*rule
}

// label names prof in messages: `profile "web-fetch"`.
func (prof *profile) label() string {
	if prof.name == "" {
		return fmt.Sprintf("profile[%d]", prof.index)
	}
	return fmt.Sprintf("profile %q", prof.name)
}

// Parse decodes and validates a policy. name (usually the file name) prefixes
// every error. Decoding is strict: a syntax error, a type error or an
// unknown key is reported with name:line; then every validation problem is
// reported at once (errors.Join), each naming its key path. A syntax error
// wraps toml.ParseError.
func Parse(name string, data []byte) (*Policy, error) {
	doc, err := decode(name, data)
	if err != nil {
		return nil, err
	}
	p, err := compile(name, doc)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	p.digest = hex.EncodeToString(sum[:])
	return p, nil
}

// Load reads and parses the policy file at path. If the file does not exist
// the error wraps fs.ErrNotExist; the daemon then uses [Default].
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	return Parse(path, data)
}

//go:embed default.toml
var defaultTOML []byte

// DefaultTOML returns the text of the built-in policy.
func DefaultTOML() []byte { return bytes.Clone(defaultTOML) }

var defaultPolicy = sync.OnceValue(func() *Policy {
	p, err := Parse("built-in default.toml", defaultTOML)
	if err != nil {
		panic(fmt.Sprintf("policy: embedded default.toml is invalid: %v", err))
	}
	return p
})

// Default returns the built-in policy, used when no policy file exists: one
// profile, "default", that matches every caller (root included; operators
// should write explicit profiles) with conservative limits — no network, 30s
// default and 10m maximum timeout, 1 MiB of output per stream, 512 MiB and
// one CPU — and any argv, shell strings and sessions allowed. Its source,
// with the reason for each value, is default.toml in this package.
func Default() *Policy {
	return defaultPolicy()
}

// Validate checks the policy again and reports every problem. It returns nil
// for any Policy from Parse, Load or Default.
func (p *Policy) Validate() error {
	if p == nil || p.doc == nil {
		return errors.New("validate policy: no policy")
	}
	_, err := compile(p.source, p.doc)
	return err
}

// Source returns the name the policy was parsed under (its file name).
func (p *Policy) Source() string {
	if p == nil {
		return ""
	}
	return p.source
}

// Digest is the hex SHA-256 of the text the policy was parsed from (the
// file's bytes as read): what a receipt names, so that a reader can tell
// which policy decided (sha256sum of the file gives the same value).
func (p *Policy) Digest() string {
	if p == nil {
		return ""
	}
	return p.digest
}

// Shape is the form of the VMs a profile asks for: a template and a pool
// serve every profile of one shape.
type Shape struct {
	Image     string // the guest image's name (profile.image, or another of images)
	MemoryMiB int
	CPUs      int
	DiskMiB   int  // the guest's disk limit (disk_mib)
	Network   bool // the VMs have a NIC (network.mode = "allowlist")
}

// Shapes lists the distinct VM shapes of the policy's profiles, in profile
// order, one per image a profile's callers may run in (its image first).
// It is pure.
func (p *Policy) Shapes() []Shape {
	if p == nil {
		return nil
	}
	var out []Shape
	seen := map[Shape]bool{}
	for _, prof := range p.profiles {
		for _, r := range prof.imageList() {
			s := Shape{Image: r.name, MemoryMiB: prof.limits.MemoryMiB, CPUs: prof.limits.CPUs, DiskMiB: prof.limits.DiskMiB, Network: prof.net != nil}
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out
}
