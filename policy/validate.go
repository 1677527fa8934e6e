package policy

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/names"
	"github.com/vmgate/vmgate/policy/netrule"
)

// Built-in values of settings that neither a profile nor [defaults] sets.
// Each is the conservative choice; default.toml relaxes some of them, visibly.
const (
	builtinImage          = "default"
	builtinUser           = userAgent
	builtinMemoryMiB      = 512
	builtinDiskMiB        = DefaultDiskMiB
	builtinCPUs           = 1
	builtinMaxVMs         = 2
	builtinCallerQueue    = 4 // max_queued_per_caller; max_vms_per_caller is half of max_vms
	builtinOutputLimit    = 1 << 20
	builtinAllowShell     = false
	builtinTimeoutDefault = 30 * time.Second
	builtinTimeoutMax     = 10 * time.Minute
	builtinSessions       = false
	builtinSessionIdle    = 10 * time.Minute
	builtinSessionMax     = time.Hour
	// A caller keeps at most 4 paused sessions, of 4 GiB in all, by
	// default; sessions are paused only when pause_after says so.
	builtinMaxPaused    = 4
	builtinMaxPausedMiB = 4096
	maxPausedLimit      = 1000
	maxPausedMiB        = 1 << 24
	// Sessions publish no port unless the profile says so; a published
	// port carries 16 connections at once (a browser opens 6 per host).
	builtinPublish      = false
	builtinPublishAny   = false
	builtinPublishConns = 16
	builtinPublishIdle  = 5 * time.Minute
	// A session runs 8 commands at once and keeps 32 background
	// processes, with 1 MiB of each one's stdout and stderr.
	builtinMaxCommands   = 8
	builtinMaxProcesses  = 32
	builtinProcessBuffer = 1 << 20
	maxMaxCommands       = 256
	maxMaxProcesses      = 1024     // agentproto.MaxProcs
	maxProcessBuffer     = 64 << 20 // agentproto.MaxProcBuffer
	maxPublishConns      = 1024
	builtinNetwork       = networkNone
	builtinNetMaxConns   = 32
	builtinNetMaxBytes   = 256 << 20
	builtinNetRate       = 120
	builtinFileBytes     = 64 << 20 // files.put_max_bytes, get_max_bytes
	builtinFileCount     = 10000    // files.put_max_files, get_max_files
	builtinSeccomp       = "required"
	builtinCgroups       = "auto"
	builtinGuestASLR     = "auto"
)

// DefaultDiskMiB is disk_mib when neither a profile nor [defaults] sets
// it: room for a build's or a download's files, and a small part of a
// state disk when max_vms VMs fill theirs at once. vmgated debug run uses
// it too.
const DefaultDiskMiB = 1024

// Accepted ranges of numeric settings. They catch typos ("memory_mib = 5"),
// not operator intent.
const (
	minMemoryMiB   = 64
	maxMemoryMiB   = 1 << 20
	minDiskMiB     = 64
	maxDiskMiB     = 1 << 20
	maxCPUs        = 64
	maxMaxVMs      = 1024
	maxOutputLimit = 1 << 30
	maxNameLen     = 64
	maxNetConns    = 4096
	maxNetRate     = 100000
	maxFileCount   = 1000000
)

const (
	userAgent        = "agent"
	userRoot         = "root"
	networkNone      = "none"
	networkAllowlist = "allowlist"
)

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	sizeRE    = regexp.MustCompile(`^([0-9]+) ?(B|KiB|MiB|GiB)?$`)
)

// compiler validates a document and builds the Policy it describes. Checks
// append to errs and go on, so that one run reports every problem.
type compiler struct {
	errs []error
}

func (c *compiler) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// docCheck is one step of validation over the whole document.
type docCheck func(c *compiler, d *document, p *Policy)

// docChecks run in order; each reports all it finds.
var docChecks = []docCheck{
	checkVersion,
	checkProfiles,
	checkUniqueNames,
	checkReachable,
	checkIsolate,
	checkSecrets,
}

// checkIsolate validates the [isolate] table.
func checkIsolate(c *compiler, d *document, p *Policy) {
	p.seccomp, p.cgroups, p.guestASLR = builtinSeccomp, builtinCgroups, builtinGuestASLR
	if d.Isolate == nil {
		return
	}
	if d.Isolate.GuestASLR != nil {
		switch v := *d.Isolate.GuestASLR; v {
		case "auto", "on":
			p.guestASLR = v
		default:
			c.errorf("isolate.guest_aslr %q: want \"auto\" or \"on\"", v)
		}
	}
	if d.Isolate.Seccomp != nil {
		switch v := *d.Isolate.Seccomp; v {
		case "required", "off":
			p.seccomp = v
		default:
			c.errorf("isolate.seccomp %q: want \"required\" or \"off\"", v)
		}
	}
	if d.Isolate.Cgroups != nil {
		switch v := *d.Isolate.Cgroups; v {
		case "auto", "required", "off":
			p.cgroups = v
		default:
			c.errorf("isolate.cgroups %q: want \"auto\", \"required\" or \"off\"", v)
		}
	}
}

// compile validates d and returns the Policy. The error joins every problem,
// each prefixed with source.
func compile(source string, d *document) (*Policy, error) {
	c := &compiler{}
	p := &Policy{source: source, doc: d}
	for _, check := range docChecks {
		check(c, d, p)
	}
	if len(c.errs) > 0 {
		errs := make([]error, len(c.errs))
		for i, err := range c.errs {
			errs[i] = fmt.Errorf("%s: %w", source, err)
		}
		return nil, errors.Join(errs...)
	}
	return p, nil
}

func checkVersion(c *compiler, d *document, _ *Policy) {
	switch {
	case d.Version == nil:
		c.errorf("version: missing; the first line of a policy must be version = 1")
	case *d.Version != 1:
		c.errorf("version %d: not supported; this vmgated reads version 1", *d.Version)
	}
}

func checkProfiles(c *compiler, d *document, p *Policy) {
	defaults := c.settings("defaults", d.Defaults)
	c.crossCheck("defaults", defaults.merge(settings{}))
	if len(d.Profiles) == 0 {
		c.errorf("no [[profile]]: every request would be denied; add at least one profile")
	}
	for i := range d.Profiles {
		p.profiles = append(p.profiles, c.profile(i, &d.Profiles[i], defaults))
	}
}

func checkUniqueNames(c *compiler, _ *document, p *Policy) {
	first := map[string]int{}
	for _, prof := range p.profiles {
		if prof.name == "" {
			continue
		}
		if j, ok := first[prof.name]; ok {
			c.errorf("profile[%d]: name %q: already used by profile[%d]", prof.index, prof.name, j)
			continue
		}
		first[prof.name] = prof.index
	}
}

func checkReachable(c *compiler, _ *document, p *Policy) {
	for i, prof := range p.profiles {
		if prof.match.any && i < len(p.profiles)-1 {
			for _, later := range p.profiles[i+1:] {
				// An SSH key names its profile, so a profile that accepts
				// keys stays reachable that way; its local keys do not.
				switch {
				case !later.match.acceptsAnyKey():
					c.errorf("%s: unreachable: %s before it matches any caller (first match wins)", later.label(), prof.label())
				case later.match.hasLocal():
					c.errorf("%s: match: uids, users, gids and groups are unreachable: %s before it matches any local caller (first match wins); keep only ssh = true or e2b = true", later.label(), prof.label())
				}
			}
			return
		}
	}
}

// profile validates one [[profile]] and returns it compiled. Invalid values
// are reported and replaced by built-ins so that later checks still run.
func (c *compiler) profile(i int, d *profileDoc, defaults settings) *profile {
	p := &profile{index: i}
	label := fmt.Sprintf("profile[%d]", i)
	switch {
	case d.Name == nil:
		c.errorf("%s: name: missing", label)
	case !nameRE.MatchString(*d.Name):
		c.errorf("%s: name %q: must be 1 to %d of [a-z0-9-], starting with a letter or digit", label, *d.Name, maxNameLen)
	default:
		p.name = *d.Name
		label = p.label()
	}
	p.match = c.match(label, d.Match)
	p.admin = d.Admin != nil && *d.Admin
	p.rotate = d.AuditRotate != nil && *d.AuditRotate
	if p.rotate && p.match.any {
		c.errorf("%s: audit_rotate = true with match.any = true would let every caller rotate the audit log; match its operators by uids, users, gids or groups", label)
	}

	own := c.settings(label, &d.settingsDoc)
	s := own.merge(defaults)
	if own.timeoutDefault != nil || own.timeoutMax != nil || own.sessionIdle != nil || own.sessionMax != nil {
		c.crossCheck(label, s)
	}
	p.image = pick(builtinImage, s.image)
	p.images = pick([]imageRef{{name: p.image}}, s.images)
	if !hasImage(p.images, p.image) {
		c.errorf("%s: image %q is not one of images %q: the default image must be one a caller may name", label, p.image, imageNames(p.images))
	}
	p.user = pick(builtinUser, s.user)
	p.users = pick([]string{p.user}, s.users)
	if !slices.Contains(p.users, p.user) {
		c.errorf("%s: user %q is not one of users %q: the default user must be one a caller may name", label, p.user, p.users)
	}
	p.secrets = pick(nil, s.secrets)
	p.network = pick(builtinNetwork, s.network)
	if p.network == networkAllowlist {
		p.net = &NetworkPolicy{
			Rules:         pick(nil, s.netAllow),
			AllowedRanges: pick(nil, s.netRanges),
			MaxConns:      pick(builtinNetMaxConns, s.netMaxConns),
			MaxBytes:      pick(builtinNetMaxBytes, s.netMaxBytes),
			ConnectRate:   pick(builtinNetRate, s.netRate),
		}
		if len(p.net.Rules) == 0 {
			c.errorf("%s: network.mode %q without network.allow rules would allow nothing: use mode %q", label, networkAllowlist, networkNone)
		}
	} else if s.netAllow != nil || s.netRanges != nil {
		c.errorf("%s: network.allow and network.allow_ranges need network.mode = %q", label, networkAllowlist)
	}
	p.allowShell = pick(builtinAllowShell, s.allowShell)
	p.env = pick(envAllow{}, s.env)
	p.timeoutMax = pick(builtinTimeoutMax, s.timeoutMax)
	p.limits = Limits{
		Timeout:       pick(builtinTimeoutDefault, s.timeoutDefault),
		OutputLimit:   pick(builtinOutputLimit, s.outputLimit),
		MemoryMiB:     pick(builtinMemoryMiB, s.memoryMiB),
		DiskMiB:       pick(builtinDiskMiB, s.diskMiB),
		CPUs:          pick(builtinCPUs, s.cpus),
		MaxVMs:        pick(builtinMaxVMs, s.maxVMs),
		CallerQueue:   pick(builtinCallerQueue, s.callerQueue),
		SessionIdle:   pick(builtinSessionIdle, s.sessionIdle),
		SessionMax:    pick(builtinSessionMax, s.sessionMax),
		AllowSessions: pick(builtinSessions, s.sessions),
		Paused: PausedLimits{
			After:    pick(0, s.pauseAfter),
			MaxCount: pick(builtinMaxPaused, s.maxPaused),
			MaxBytes: int64(pick(builtinMaxPausedMiB, s.maxPausedMiB)) << 20,
		},
		Publish: PublishLimits{
			Allowed:    pick(builtinPublish, s.publish),
			AnyAddress: pick(builtinPublishAny, s.publishAny),
			MaxConns:   pick(builtinPublishConns, s.publishConns),
			Idle:       pick(builtinPublishIdle, s.publishIdle),
		},
		MaxCommands:   pick(builtinMaxCommands, s.maxCommands),
		MaxProcesses:  pick(builtinMaxProcesses, s.maxProcesses),
		ProcessBuffer: pick(int64(builtinProcessBuffer), s.processBuffer),
		Files: FileLimits{
			PutBytes: pick(builtinFileBytes, s.putBytes), PutFiles: pick(builtinFileCount, s.putFiles),
			GetBytes: pick(builtinFileBytes, s.getBytes), GetFiles: pick(builtinFileCount, s.getFiles),
		},
	}

	c.checkPublish(label, p)

	// A caller gets at most half the profile's VMs unless the policy says
	// otherwise, and never more than max_vms.
	p.limits.CallerVMs = min(pick((p.limits.MaxVMs+1)/2, s.callerVMs), p.limits.MaxVMs)

	ruleNames := map[string]string{}
	for j := range d.Deny {
		p.deny = append(p.deny, c.rule(label, "deny", j, &d.Deny[j], ruleNames))
	}
	for j := range d.Allow {
		p.allow = append(p.allow, c.rule(label, "allow", j, &d.Allow[j], ruleNames))
	}
	return p
}

func (c *compiler) match(label string, d *matchDoc) matcher {
	var m matcher
	if d == nil {
		c.errorf("%s: match: missing; set uids, users, gids, groups, ssh = true, e2b = true, or any = true", label)
		return m
	}
	m.any = d.Any != nil && *d.Any
	if d.Any != nil && !*d.Any {
		c.errorf("%s: match.any false: remove it; only any = true has a meaning", label)
	}
	m.ssh = d.SSH != nil && *d.SSH
	if d.SSH != nil && !*d.SSH {
		c.errorf("%s: match.ssh false: remove it; only ssh = true has a meaning", label)
	}
	m.e2b = d.E2B != nil && *d.E2B
	if d.E2B != nil && !*d.E2B {
		c.errorf("%s: match.e2b false: remove it; only e2b = true has a meaning", label)
	}
	m.uids = c.ids(label, "match.uids", d.UIDs)
	m.gids = c.ids(label, "match.gids", d.GIDs)
	m.users = c.names(label, "match.users", d.Users)
	m.groups = c.names(label, "match.groups", d.Groups)
	others := d.UIDs != nil || d.GIDs != nil || d.Users != nil || d.Groups != nil
	switch {
	case m.any && others:
		c.errorf("%s: match: any = true cannot be combined with uids, users, gids or groups", label)
	case m.any && d.SSH != nil:
		c.errorf("%s: match: any = true already accepts SSH keys that name the profile; remove ssh", label)
	case m.any && d.E2B != nil:
		c.errorf("%s: match: any = true already accepts E2B keys that name the profile; remove e2b", label)
	case !m.any && !others && d.Any == nil && d.SSH == nil && d.E2B == nil:
		c.errorf("%s: match: empty; set uids, users, gids, groups, ssh = true, e2b = true, or any = true", label)
	}
	return m
}

func (c *compiler) ids(label, key string, v *[]int64) []uint32 {
	if v == nil {
		return nil
	}
	if len(*v) == 0 {
		c.errorf("%s: %s: empty list matches nobody; remove the key", label, key)
	}
	out := make([]uint32, 0, len(*v))
	for _, id := range *v {
		// 4294967295 is (uid_t)-1, "no id", which the kernel never reports.
		if id < 0 || id >= math.MaxUint32 {
			c.errorf("%s: %s: %d: not a valid id (0..%d)", label, key, id, uint32(math.MaxUint32-1))
			continue
		}
		out = append(out, uint32(id))
	}
	return out
}

func (c *compiler) names(label, key string, v *[]string) []string {
	if v == nil {
		return nil
	}
	if len(*v) == 0 {
		c.errorf("%s: %s: empty list matches nobody; remove the key", label, key)
	}
	out := make([]string, 0, len(*v))
	for _, n := range *v {
		if n == "" || strings.ContainsFunc(n, isUnsafeRune) || strings.ContainsRune(n, ':') {
			c.errorf("%s: %s: %q: not a valid user or group name", label, key, n)
			continue
		}
		out = append(out, n)
	}
	return out
}

// settings is a parsed settingsDoc: nil means unset (or invalid, already
// reported).
type settings struct {
	image, user, network       *string
	memoryMiB, cpus, maxVMs    *int
	diskMiB                    *int
	callerVMs, callerQueue     *int
	outputLimit                *int64
	allowShell, sessions       *bool
	env                        *envAllow
	timeoutDefault, timeoutMax *time.Duration
	sessionIdle, sessionMax    *time.Duration
	pauseAfter                 *time.Duration
	maxPaused                  *int
	maxPausedMiB               *int
	publish, publishAny        *bool
	publishConns               *int
	publishIdle                *time.Duration
	users                      *[]string
	images                     *[]imageRef
	maxCommands, maxProcesses  *int
	processBuffer              *int64
	badTimeout, badSessions    bool
	netAllow                   *netrule.Rules
	netRanges                  *[]netip.Prefix
	netMaxConns                *int
	netMaxBytes                *int64
	netRate                    *int
	putBytes, getBytes         *int64
	putFiles, getFiles         *int
	secrets                    *[]string
}

// merge returns s with its unset keys taken from d.
func (s settings) merge(d settings) settings {
	m := s
	m.image = first(s.image, d.image)
	m.user = first(s.user, d.user)
	m.network = first(s.network, d.network)
	m.netAllow = first(s.netAllow, d.netAllow)
	m.netRanges = first(s.netRanges, d.netRanges)
	m.netMaxConns = first(s.netMaxConns, d.netMaxConns)
	m.netMaxBytes = first(s.netMaxBytes, d.netMaxBytes)
	m.netRate = first(s.netRate, d.netRate)
	m.memoryMiB = first(s.memoryMiB, d.memoryMiB)
	m.diskMiB = first(s.diskMiB, d.diskMiB)
	m.cpus = first(s.cpus, d.cpus)
	m.maxVMs = first(s.maxVMs, d.maxVMs)
	m.callerVMs = first(s.callerVMs, d.callerVMs)
	m.callerQueue = first(s.callerQueue, d.callerQueue)
	m.outputLimit = first(s.outputLimit, d.outputLimit)
	m.allowShell = first(s.allowShell, d.allowShell)
	m.sessions = first(s.sessions, d.sessions)
	m.env = first(s.env, d.env)
	m.timeoutDefault = first(s.timeoutDefault, d.timeoutDefault)
	m.timeoutMax = first(s.timeoutMax, d.timeoutMax)
	m.sessionIdle = first(s.sessionIdle, d.sessionIdle)
	m.sessionMax = first(s.sessionMax, d.sessionMax)
	m.pauseAfter = first(s.pauseAfter, d.pauseAfter)
	m.maxPaused = first(s.maxPaused, d.maxPaused)
	m.maxPausedMiB = first(s.maxPausedMiB, d.maxPausedMiB)
	m.publish = first(s.publish, d.publish)
	m.publishAny = first(s.publishAny, d.publishAny)
	m.publishConns = first(s.publishConns, d.publishConns)
	m.publishIdle = first(s.publishIdle, d.publishIdle)
	m.users = first(s.users, d.users)
	m.images = first(s.images, d.images)
	m.maxCommands = first(s.maxCommands, d.maxCommands)
	m.maxProcesses = first(s.maxProcesses, d.maxProcesses)
	m.processBuffer = first(s.processBuffer, d.processBuffer)
	m.putBytes = first(s.putBytes, d.putBytes)
	m.putFiles = first(s.putFiles, d.putFiles)
	m.getBytes = first(s.getBytes, d.getBytes)
	m.getFiles = first(s.getFiles, d.getFiles)
	m.secrets = first(s.secrets, d.secrets)
	m.badTimeout = s.badTimeout || d.badTimeout
	m.badSessions = s.badSessions || d.badSessions
	return m
}

func first[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

func pick[T any](builtin T, v *T) T {
	if v != nil {
		return *v
	}
	return builtin
}

// crossCheck checks relations between keys of merged settings s.
func (c *compiler) crossCheck(label string, s settings) {
	if !s.badTimeout {
		def := pick(builtinTimeoutDefault, s.timeoutDefault)
		maxT := pick(builtinTimeoutMax, s.timeoutMax)
		if def > maxT {
			c.errorf("%s: timeout.default %s is above timeout.max %s", label, formatDuration(def), formatDuration(maxT))
		}
	}
	if !s.badSessions {
		idle := pick(builtinSessionIdle, s.sessionIdle)
		life := pick(builtinSessionMax, s.sessionMax)
		if idle > life {
			c.errorf("%s: sessions.idle_timeout %s is above sessions.max_lifetime %s", label, formatDuration(idle), formatDuration(life))
		}
	}
}

func (c *compiler) settings(label string, d *settingsDoc) settings {
	var s settings
	if d == nil {
		return s
	}
	if d.Image != nil {
		if names.Image(*d.Image) {
			s.image = d.Image
		} else {
			c.errorf("%s: image %q: must be %s", label, *d.Image, names.ImageRule)
		}
	}
	s.images = c.parseImages(label, d.Images)
	if d.User != nil {
		if names.Account(*d.User) {
			s.user = d.User
		} else {
			c.errorf("%s: user %q: must be a guest account's name (%s)", label, *d.User, names.AccountRule)
		}
	}
	if d.Users != nil {
		s.users = c.users(label, *d.Users)
	}
	if d.Secrets != nil {
		s.secrets = c.secretNames(label, *d.Secrets)
	}
	s.memoryMiB = c.intIn(label, "memory_mib", d.MemoryMiB, minMemoryMiB, maxMemoryMiB)
	s.diskMiB = c.intIn(label, "disk_mib", d.DiskMiB, minDiskMiB, maxDiskMiB)
	s.cpus = c.intIn(label, "cpus", d.CPUs, 1, maxCPUs)
	s.maxVMs = c.intIn(label, "max_vms", d.MaxVMs, 1, maxMaxVMs)
	s.callerVMs = c.intIn(label, "max_vms_per_caller", d.CallerVMs, 1, maxMaxVMs)
	s.callerQueue = c.intIn(label, "max_queued_per_caller", d.CallerQueue, 0, maxMaxVMs)
	if d.OutputLimit != nil {
		n, err := parseSize(*d.OutputLimit)
		if err != nil {
			c.errorf("%s: output_limit %s: %w", label, d.OutputLimit, err)
		} else {
			s.outputLimit = &n
		}
	}
	s.allowShell = d.AllowShell
	if d.Env != nil {
		s.env = c.env(label, *d.Env)
	}
	if t := d.Timeout; t != nil {
		before := len(c.errs)
		s.timeoutDefault = c.duration(label, "timeout.default", t.Default)
		s.timeoutMax = c.duration(label, "timeout.max", t.Max)
		s.badTimeout = len(c.errs) > before
	}
	if ss := d.Sessions; ss != nil {
		c.sessions(label, ss, &s)
	}
	if n := d.Network; n != nil {
		c.network(label, n, &s)
	}
	if f := d.Files; f != nil {
		s.putBytes = c.size(label, "files.put_max_bytes", f.PutMaxBytes)
		s.getBytes = c.size(label, "files.get_max_bytes", f.GetMaxBytes)
		s.putFiles = c.intIn(label, "files.put_max_files", f.PutMaxFiles, 0, maxFileCount)
		s.getFiles = c.intIn(label, "files.get_max_files", f.GetMaxFiles, 0, maxFileCount)
	}
	return s
}

// users validates a users list: guest accounts' names, each once, not
// none. It returns nil when the list is invalid.
func (c *compiler) users(label string, list []string) *[]string {
	users, ok := []string{}, true
	for _, u := range list {
		switch {
		case !names.Account(u):
			c.errorf("%s: users: %q: must be a guest account's name (%s)", label, u, names.AccountRule)
			ok = false
		case slices.Contains(users, u):
			c.errorf("%s: users: %q is listed twice", label, u)
			ok = false
		default:
			users = append(users, u)
		}
	}
	if !ok {
		return nil
	}
	if len(users) == 0 {
		c.errorf("%s: users is empty: list the guest users a caller may name, the default user among them", label)
		return nil
	}
	return &users
}

// secretNames validates a secrets list: each name once.
func (c *compiler) secretNames(label string, names []string) *[]string {
	list := []string{}
	for _, n := range names {
		if slices.Contains(list, n) {
			c.errorf("%s: secrets: %q is listed twice", label, n)
			continue
		}
		list = append(list, n)
	}
	return &list
}

// sessions validates a [profile.sessions] (or [defaults.sessions]) table
// into s.
func (c *compiler) sessions(label string, ss *sessionsDoc, s *settings) {
	before := len(c.errs)
	s.sessions = ss.Allowed
	s.sessionIdle = c.duration(label, "sessions.idle_timeout", ss.IdleTimeout)
	s.sessionMax = c.duration(label, "sessions.max_lifetime", ss.MaxLifetime)
	s.pauseAfter = c.duration(label, "sessions.pause_after", ss.PauseAfter)
	s.maxPaused = c.intIn(label, "sessions.max_paused", ss.MaxPaused, 0, maxPausedLimit)
	s.maxPausedMiB = c.intIn(label, "sessions.max_paused_mib", ss.MaxPausedMiB, 0, maxPausedMiB)
	s.publish, s.publishAny = ss.Publish, ss.PublishAnyAddress
	s.publishConns = c.intIn(label, "sessions.publish_max_conns", ss.PublishMaxConns, 1, maxPublishConns)
	s.publishIdle = c.duration(label, "sessions.publish_idle", ss.PublishIdle)
	s.maxCommands = c.intIn(label, "sessions.max_commands", ss.MaxCommands, 1, maxMaxCommands)
	s.maxProcesses = c.intIn(label, "sessions.max_processes", ss.MaxProcesses, 0, maxMaxProcesses)
	if b := c.size(label, "sessions.process_buffer", ss.ProcessBuffer); b != nil {
		if *b < 1024 || *b > maxProcessBuffer {
			c.errorf("%s: sessions.process_buffer %d: must be 1KiB to %dMiB", label, *b, maxProcessBuffer>>20)
		} else {
			s.processBuffer = b
		}
	}
	s.badSessions = len(c.errs) > before
}

// network validates a [profile.network] (or [defaults.network]) table.
func (c *compiler) network(label string, n *networkDoc, s *settings) {
	if n.Mode != nil {
		switch *n.Mode {
		case networkNone, networkAllowlist:
			s.network = n.Mode
		default:
			c.errorf("%s: network.mode %q: want %q or %q", label, *n.Mode, networkNone, networkAllowlist)
		}
	}
	if n.Allow != nil {
		rs, err := netrule.ParseRules(*n.Allow)
		if err != nil {
			c.errorf("%s: network.allow: %w", label, err)
		} else {
			s.netAllow = &rs
		}
	}
	if n.AllowRanges != nil {
		var ps []netip.Prefix
		for _, r := range *n.AllowRanges {
			p, err := netip.ParsePrefix(r)
			if err != nil {
				c.errorf("%s: network.allow_ranges %q: %w", label, r, err)
				continue
			}
			ps = append(ps, p.Masked())
		}
		s.netRanges = &ps
	}
	s.netMaxConns = c.intIn(label, "network.max_connections", n.MaxConnections, 1, maxNetConns)
	s.netRate = c.intIn(label, "network.connect_rate", n.ConnectRate, 1, maxNetRate)
	if n.MaxBytes != nil {
		v, err := parseSize(*n.MaxBytes)
		if err != nil {
			c.errorf("%s: network.max_bytes %s: %w", label, n.MaxBytes, err)
		} else {
			s.netMaxBytes = &v
		}
	}
}

// rule validates and compiles one argv rule. names maps rule names already
// used in this profile to their labels.
func (c *compiler) rule(profLabel, kind string, j int, d *ruleDoc, names map[string]string) *rule {
	r := &rule{kind: kind, index: j}
	label := fmt.Sprintf("%s: %s[%d]", profLabel, kind, j)
	if d.Name != nil {
		switch prev, dup := names[*d.Name]; {
		case !nameRE.MatchString(*d.Name):
			c.errorf("%s: name %q: must be 1 to %d of [a-z0-9-], starting with a letter or digit", label, *d.Name, maxNameLen)
		case dup:
			c.errorf("%s: name %q: already used by %s", label, *d.Name, prev)
		default:
			r.name = *d.Name
			names[r.name] = r.label()
		}
	}
	if d.Program == nil && d.Args == nil && d.ArgsAny == nil && d.ArgsRegex == nil {
		c.errorf("%s: no condition; set program, args, args_any or args_regex", label)
	}
	if d.Program != nil {
		if len(*d.Program) == 0 {
			c.errorf("%s: program: empty list matches nothing", label)
		}
		for _, prog := range *d.Program {
			if err := checkProgram(prog); err != nil {
				c.errorf("%s: program %q: %w", label, prog, err)
				continue
			}
			r.programs = append(r.programs, prog)
		}
	}
	if d.Args != nil {
		r.hasArgs = true
		args := *d.Args
		for k, a := range args {
			if a == restMarker || a == restMarkerAlt {
				if k != len(args)-1 {
					c.errorf("%s: args[%d] %q: only allowed as the last element", label, k, a)
				}
				r.argsRest = true
				continue
			}
			g, err := compileGlob(a)
			if err != nil {
				c.errorf("%s: args[%d] %q: %w", label, k, a, err)
				continue
			}
			r.args = append(r.args, g)
		}
	}
	if d.ArgsAny != nil {
		if len(*d.ArgsAny) == 0 {
			c.errorf("%s: args_any: empty list matches nothing", label)
		}
		for k, a := range *d.ArgsAny {
			g, err := compileGlob(a)
			if err != nil {
				c.errorf("%s: args_any[%d] %q: %w", label, k, a, err)
				continue
			}
			r.argsAny = append(r.argsAny, g)
		}
	}
	if d.ArgsRegex != nil {
		re, err := regexp.Compile(*d.ArgsRegex)
		switch {
		case *d.ArgsRegex == "":
			c.errorf("%s: args_regex: empty pattern matches everything; remove it", label)
		case err != nil:
			c.errorf("%s: args_regex %q: %w", label, *d.ArgsRegex, err)
		default:
			r.argsRegex = re
		}
	}
	return r
}
