package policy

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/vmgate/vmgate/internal/names"

	"github.com/vmgate/vmgate/policy/netrule"
)

// Request size limits that Decide enforces whatever the profile says. They
// bound the work a request can cause and keep well under the guest's ARG_MAX.
const (
	// MaxArgs is the largest number of argv elements.
	MaxArgs = 4096
	// MaxArgBytes is the largest single argv element or environment entry.
	MaxArgBytes = 128 << 10
	// MaxRequestBytes bounds argv and environment together, each string
	// counted with its terminating NUL as execve does.
	MaxRequestBytes = 256 << 10
	// MaxEnv is the largest number of environment entries.
	MaxEnv = 256
)

// ErrDenied is wrapped by [Verdict.Err] for every denial.
var ErrDenied = errors.New("denied by policy")

// Identity is the caller of a request: a local process, as the daemon
// learnt it from SO_PEERCRED, SO_PEERGROUPS and the user database, or (SSH
// set) the holder of an SSH key listed in the front door's authorized-keys
// file.
//
// A process that runs as a subordinate uid of a login (/etc/subuid: the
// uids a user namespace of that login maps to) is that login: the daemon
// fills in the login's UID, GID, User, Group and Groups, and SubUID holds
// the uid the process ran as. One login is thus one caller however many
// subordinate uids it uses.
type Identity struct {
	UID, GID uint32 // from SO_PEERCRED, or the owning login's (SubUID set)
	PID      int32  // from SO_PEERCRED; for the audit log, not for decisions
	// User is the name of UID's account. Empty means UID has no account
	// (or the lookup failed): such a caller matches no match.any profile,
	// only profiles that name its uid, gid or groups.
	User  string
	Group string // name of GID; empty if the lookup failed
	// Groups holds the names of the caller's supplementary groups: those
	// the kernel reports for the connecting process (SO_PEERGROUPS), or
	// those the owning login's account lists (SubUID set); may be empty.
	Groups []string
	// SubUID is the uid the connecting process ran as when that was a
	// subordinate uid of the login UID; 0 otherwise (uid 0 is root's, a
	// login, never a subordinate uid). For the audit log and messages,
	// not for decisions.
	SubUID uint32
	// SSH is set for a caller of a front door that identifies callers by
	// key: the SSH door, or the E2B door (SSH.Door). Such a caller has no
	// local uid: the fields above are zero and never consulted (uid 0 here
	// is not root), and the profile is the one its key names.
	SSH *SSHKey
}

// Front doors that identify callers by key (SSHKey.Door).
const (
	DoorSSH = ""    // the SSH front door
	DoorE2B = "e2b" // the E2B-compatible API
)

// SSHKey identifies a caller that proved possession of a key listed in a
// front door's keys file: an SSH public key of the SSH door's
// authorized-keys file, or an API key of the E2B door's keys file. Only
// Door and Profile take part in decisions; the rest is for the audit log
// and messages.
type SSHKey struct {
	// Door is the front door: DoorSSH or DoorE2B.
	Door string
	// Profile is the profile the key's entry names (profile="NAME").
	Profile string
	// Fingerprint is the key's SHA-256 fingerprint, "SHA256:…".
	Fingerprint string
	// Comment is the entry's comment (usually who holds the key).
	Comment string
	// User is the user name the SSH client sent; informational.
	User string
	// RemoteAddr is the client's address ("127.0.0.1:41234", or "@" for
	// a Unix socket).
	RemoteAddr string
}

// doorName names k's front door in messages: "SSH" or "E2B".
func (k *SSHKey) doorName() string {
	if k.Door == DoorE2B {
		return "E2B"
	}
	return "SSH"
}

// Local reports whether id is a local caller (identified by SO_PEERCRED)
// rather than an SSH key.
func (id Identity) Local() bool { return id.SSH == nil }

// Key names the caller as one principal: its uid (a login's subordinate
// uids are that login's, folded before the identity is made), or its SSH
// key. Sessions belong to it, and the per-caller VM shares, queue places
// and audit flood gate count by it.
func (id Identity) Key() string {
	if id.SSH != nil {
		if id.SSH.Door == DoorE2B {
			return "e2b:" + id.SSH.Fingerprint
		}
		return "ssh:" + id.SSH.Fingerprint
	}
	return "uid:" + strconv.FormatUint(uint64(id.UID), 10)
}

// describe names the caller in reasons: "uid 1000 (user alice)" or
// "SSH key SHA256:…".
func (id Identity) describe() string {
	if id.SSH != nil {
		return id.SSH.doorName() + " key " + quoteName(id.SSH.Fingerprint)
	}
	if id.SubUID != 0 {
		return fmt.Sprintf("uid %d (%s, as its subordinate uid %d)", id.UID, userDesc(id.User), id.SubUID)
	}
	return fmt.Sprintf("uid %d (%s)", id.UID, userDesc(id.User))
}

// HasAccount reports whether id is a local caller whose uid has an
// account (a user name): only those match.any takes.
func (id Identity) HasAccount() bool { return id.SSH == nil && id.User != "" }

// isShellArgv reports whether argv is a shell string's: sh -c STRING, or
// bash -l -c STRING (a login shell's, as E2B's commands run).
func isShellArgv(argv []string) bool {
	switch len(argv) {
	case 3:
		return argv[0] == "sh" && argv[1] == "-c"
	case 4:
		return argv[0] == "bash" && argv[1] == "-l" && argv[2] == "-c"
	}
	return false
}

// Request is one exec request, untrusted.
type Request struct {
	// Argv is the command. For a shell string (vm-exec -c STRING) it is
	// ["sh", "-c", STRING] (or, for a login shell's string,
	// ["bash", "-l", "-c", STRING]) and Shell is true.
	Argv  []string
	Shell bool
	// Session names a session to run in; empty for a one-off VM.
	Session string
	// Timeout is the requested timeout; 0 means the profile's default.
	Timeout time.Duration
	// Env holds KEY=VALUE entries the client asks to pass.
	Env []string
	// Interactive marks an interactive login shell on a terminal (the SSH
	// front door without a command): Argv is the shell, run for as long
	// as its user keeps it open. It needs allow_shell and sessions, its
	// time limit is sessions.max_lifetime (Timeout must be 0) and the
	// front door ends it after sessions.idle_timeout without traffic.
	// With Session set (an SSH session login) the shell runs in that
	// session's VM, which outlives it.
	Interactive bool
	// Puts are the trees copied into the guest before the command, Gets
	// the number of paths copied out after it. A request in a session may
	// copy files and run nothing: Argv is then empty, and no argv rule
	// applies.
	Puts []Upload
	Gets int
	// Net narrows the profile's network for this request; nil: the
	// profile's (NetLimit).
	Net *NetLimit
	// NetLock is the network lock of the session the request runs in, as
	// the daemon keeps it (never the client's word); nil: none.
	NetLock *NetLimit
	// User is the guest user the caller asks to run as; "": ImageUser
	// when that is one of the profile's users, else the profile's user.
	// It must be one of the profile's users.
	User string
	// ImageUser is the configured user of the image the request runs in
	// (its container configuration's User, as the daemon read it); "":
	// none. It is the default user of commands in the image when it is
	// one of the profile's users.
	ImageUser string
	// Image is the image the request runs in: the one the caller names
	// for a fresh VM or a new session, or (the daemon's word) the image of
	// the session it runs in; "": the profile's image. It must be one of
	// the profile's images.
	Image string
	// ImageManifestDigest is the manifest digest of that image as the
	// daemon finds it now ("": it has none). A pinned image (images =
	// ["NAME@sha256:…"]) whose digest is another refuses the request:
	// the image was imported or pulled again while the daemon ran.
	ImageManifestDigest string
	// Detach starts the command as a background process of its session
	// (Session set): it outlives its client, and without Timeout its time
	// limit is timeout.max rather than timeout.default.
	Detach bool
	// Secrets are the secrets the caller asks for: each must be one of
	// the profile's secrets. HeldSecrets are those its session holds
	// already (the daemon's word): granted again while the profile still
	// lists them, dropped silently otherwise.
	Secrets     []string
	HeldSecrets []string
}

// transferOnly reports whether req copies files and runs nothing.
func (req *Request) transferOnly() bool {
	return len(req.Argv) == 0 && len(req.Puts)+req.Gets > 0
}

// Limits are the resources a request gets.
type Limits struct {
	Timeout     time.Duration // for this command
	OutputLimit int64         // bytes, per stream (stdout and stderr each)
	MemoryMiB   int
	CPUs        int
	// DiskMiB bounds what the guest may write to its disk: its root file
	// system's free space when it is handed out (vmgated enforces it on
	// the host, package vm).
	DiskMiB int
	MaxVMs  int // concurrent VMs of the profile
	// CallerVMs bounds one caller's concurrent VMs of the profile (its
	// sessions included), CallerQueue its requests waiting for one: no
	// caller can take every VM or queue place from the others.
	CallerVMs     int
	CallerQueue   int
	SessionIdle   time.Duration // idle timeout of a session
	SessionMax    time.Duration // maximum lifetime of a session
	AllowSessions bool
	// Paused bounds the caller's paused sessions and says when an idle
	// session is paused.
	Paused PausedLimits
	// Publish says whether and where a session's ports may be published
	// on the host, and bounds their connections.
	Publish PublishLimits
	Files   FileLimits
	// MaxCommands bounds the commands that run at once in one session
	// (sessions.max_commands), MaxProcesses its background processes
	// (sessions.max_processes), and ProcessBuffer the bytes of each of
	// their streams that are kept (sessions.process_buffer).
	MaxCommands   int
	MaxProcesses  int
	ProcessBuffer int64
}

// FileLimits bound file transfers (vm-exec --put, --get, cp): the content
// bytes and the entries (files, directories, symlinks) of each tree copied
// into the guest (Put) or out of it (Get). A zero count allows none.
type FileLimits struct {
	PutBytes int64
	PutFiles int
	GetBytes int64
	GetFiles int
}

// PausedLimits are a profile's rules for paused sessions: a session idle
// for After (0: never, unless idle_timeout comes first and After is set)
// is paused to disk instead of kept running, and a caller keeps at most
// MaxCount paused sessions of MaxBytes on disk in all.
type PausedLimits struct {
	After    time.Duration
	MaxCount int
	MaxBytes int64
}

// Upload is one tree a request copies into the guest, as the client
// declares it.
type Upload struct {
	Files int
	Bytes int64
}

// RuleUsers is the rule of a verdict that refused a request's user (not
// one of the profile's users).
const RuleUsers = "users"

// Verdict is the outcome of [Policy.Decide].
//
// Postcondition: when Allowed is false only Profile (if a profile matched),
// Rule (if a rule decided) and Reason are set; the rest is zero.
type Verdict struct {
	Allowed bool
	// Profile is the name of the matching profile, empty if none matched.
	Profile string
	// Rule is the rule that decided: "deny[0] no-upload", "allow[1]
	// wget-https", or "default" when the profile has no allow rules. Empty
	// when the request was refused before rules were consulted or no allow
	// rule matched.
	Rule string
	// Reason explains the verdict in one line, for the caller and the audit
	// log. Request data in it is quoted and truncated.
	Reason string
	Limits Limits
	// Env is the environment to pass: the request's entries, in order.
	Env []string
	// User is the guest user the command runs as: "agent" or "root".
	User string
	// Image is the guest image name.
	Image string
	// Network is the guest's egress policy; nil: no NIC at all. It is
	// the profile's, narrowed by the request's Net and the session's
	// NetLock (never widened): NetNarrowed says by which
	// (NarrowedByRequest, NarrowedByLock).
	Network     *NetworkPolicy
	NetNarrowed []string
	// Secrets are the secrets granted: those asked for and those its
	// session holds that the profile still lists, by name.
	Secrets []Secret
}

// NetworkPolicy is a profile's guest network (network.mode = "allowlist").
type NetworkPolicy = netrule.Egress

// Err returns nil for an allowed verdict, and otherwise an error that wraps
// [ErrDenied] and says which profile and rule refused and why.
func (v Verdict) Err() error {
	if v.Allowed {
		return nil
	}
	var b strings.Builder
	if v.Profile != "" {
		fmt.Fprintf(&b, "profile %q: ", v.Profile)
	}
	if v.Rule != "" {
		b.WriteString(v.Rule)
		b.WriteString(": ")
	}
	b.WriteString(v.Reason)
	return fmt.Errorf("%w: %s", ErrDenied, b.String())
}

// Decide returns the verdict for req from the caller id. It is pure: no I/O,
// no clock, no mutation; safe for concurrent use. A nil Policy denies
// everything. Decide never panics on any request.
//
// Order: the first profile that matches id; then request checks (see the
// package doc); then the network's narrowing; then deny rules; then allow
// rules.
func (p *Policy) Decide(id Identity, req Request) Verdict {
	if p == nil {
		return Verdict{Reason: "no policy loaded"}
	}
	prof, reason := p.profileFor(id)
	if prof == nil {
		return Verdict{Reason: reason}
	}
	return prof.decide(p, req)
}

// decide is Decide once the profile is known.
func (prof *profile) decide(p *Policy, req Request) Verdict {
	deny := func(rule, reason string) Verdict {
		return Verdict{Profile: prof.name, Rule: rule, Reason: reason}
	}
	if reason := checkRequest(&req); reason != "" {
		return deny("", reason)
	}
	if req.User != "" && !slices.Contains(prof.users, req.User) {
		return deny(RuleUsers, fmt.Sprintf("user %s is not one of the profile's users (%s)", quote(req.User), strings.Join(prof.users, ", ")))
	}
	image, rule, reason := prof.chooseImage(req.Image)
	if reason == "" {
		rule, reason = prof.checkPin(image, req.ImageManifestDigest)
	}
	if reason != "" {
		return deny(rule, reason)
	}
	secrets, rule, reason := p.secretsOf(prof, req.Secrets, req.HeldSecrets)
	if reason != "" {
		return deny(rule, reason)
	}
	timeout, reason := prof.check(&req)
	if reason != "" {
		return deny("", reason)
	}
	net, narrowed, netRule, reason := narrowNet(prof.net, req.NetLock, req.Net)
	if reason != "" {
		return deny(netRule, reason)
	}
	allow := func(rule, why string) Verdict {
		v := prof.allowed(req, rule, why, timeout)
		v.Network, v.NetNarrowed, v.Secrets = net, narrowed, secrets
		return v
	}

	if req.transferOnly() {
		return allow("files", "file transfer in session "+quoteName(req.Session))
	}
	view := &argvView{argv: req.Argv}
	for _, r := range prof.deny {
		if ok, detail := r.match(view); ok {
			reason := "argv matches deny rule"
			if detail != "" {
				reason += ": " + detail
			}
			return deny(r.label(), reason)
		}
	}
	rule, why := "default", "allowed: the profile has no allow rules"
	if len(prof.allow) > 0 {
		rule = ""
		for _, r := range prof.allow {
			if ok, _ := r.match(view); ok {
				rule, why = r.label(), "allowed by "+r.label()
				break
			}
		}
		if rule == "" {
			return deny("", fmt.Sprintf("no allow rule matches argv (program %s)", quote(req.Argv[0])))
		}
	}
	return allow(rule, why)
}

// allowed is the verdict of an allowed request.
func (prof *profile) allowed(req Request, rule, why string, timeout time.Duration) Verdict {
	limits := prof.limits
	limits.Timeout = timeout
	var env []string
	if len(req.Env) > 0 {
		env = append(make([]string, 0, len(req.Env)), req.Env...)
	}
	user := prof.defaultUser(req.ImageUser)
	if req.User != "" {
		user = req.User // checked against prof.users
	}
	image := prof.image
	if req.Image != "" {
		image = req.Image // checked against prof.images
	}
	return Verdict{
		Allowed: true,
		Profile: prof.name,
		Rule:    rule,
		Reason:  why,
		Limits:  limits,
		Env:     env,
		User:    user,
		Image:   image,
		Network: prof.net,
	}
}

// defaultUser is the user of a request that names none, in an image
// whose configured user is imageUser: that user when it is one of the
// profile's users, else the profile's user.
func (prof *profile) defaultUser(imageUser string) string {
	if imageUser != "" && slices.Contains(prof.users, imageUser) {
		return imageUser
	}
	return prof.user
}

// DecideSession decides a request of id that runs no command but keeps
// sessions (a pause, a fork's new sessions named in names) in image, the
// session's ("": the profile's image): the verdict of its profile,
// allowed when the profile allows sessions, image is one of its images
// (a reload may have taken it away: RuleImages), and every name is a
// session name. The verdict's Image is the image. Pure; argv rules do not
// apply.
func (p *Policy) DecideSession(id Identity, image string, sessionNames ...string) Verdict {
	if p == nil {
		return Verdict{Reason: "no policy loaded"}
	}
	prof, reason := p.profileFor(id)
	if prof == nil {
		return Verdict{Reason: reason}
	}
	if !prof.limits.AllowSessions {
		return Verdict{Profile: prof.name, Reason: "sessions are not allowed"}
	}
	if _, rule, reason := prof.chooseImage(image); reason != "" {
		return Verdict{Profile: prof.name, Rule: rule, Reason: reason}
	}
	for _, n := range sessionNames {
		if !names.Session(n) {
			return Verdict{Profile: prof.name, Reason: fmt.Sprintf("session name %s: must be %s", quote(n), names.SessionRule)}
		}
	}
	return prof.allowed(Request{Image: image}, "sessions", "sessions are allowed", prof.limits.Timeout)
}

// FileRequest is a file operation in a session (stat, list, mkdir, move,
// remove, read or write one file) as the policy decides it.
type FileRequest struct {
	// Image is the session's image ("": the profile's); ImageUser its
	// configured user, as for Request.
	Image, ImageUser string
	// User is the guest user the caller names; "": ImageUser when that
	// is one of the profile's users, else the profile's user.
	User string
}

// DecideFile decides a file operation of id's in one of its sessions:
// allowed when DecideSession allows the session's image and the user is
// one of the profile's users. The verdict's User is the user it runs as,
// its Limits.Files bound a read (GetBytes) and a write (PutBytes). Pure;
// argv rules do not apply.
func (p *Policy) DecideFile(id Identity, req FileRequest) Verdict {
	v := p.DecideSession(id, req.Image)
	if !v.Allowed {
		return v
	}
	prof, _ := p.profileFor(id)
	v.User = prof.defaultUser(req.ImageUser)
	if req.User != "" {
		if !slices.Contains(prof.users, req.User) {
			return Verdict{Profile: prof.name, Rule: RuleUsers, Reason: fmt.Sprintf("user %s is not one of the profile's users (%s)", quote(req.User), strings.Join(prof.users, ", "))}
		}
		v.User = req.User
	}
	v.Rule, v.Reason = "files", "file operations in a session are allowed"
	return v
}

// AllowsEnv reports whether a request of id may pass the environment
// variable name: the profile id gets allows it. The SSH front door asks
// this when a client sends an "env" request; Decide checks the variable
// again with the request.
func (p *Policy) AllowsEnv(id Identity, name string) bool {
	if p == nil {
		return false
	}
	prof, _ := p.profileFor(id)
	return prof != nil && envNameRE.MatchString(name) && prof.env.allows(name)
}

// IsAdmin reports whether id's profile has admin = true: its callers see
// every caller's commands and sessions in status, not only their own.
func (p *Policy) IsAdmin(id Identity) bool {
	if p == nil {
		return false
	}
	prof, _ := p.profileFor(id)
	return prof != nil && prof.admin
}

// MayRotateAudit reports whether id's profile has audit_rotate = true and
// id is a local caller: it may move the audit log aside (vmgated audit
// rotate) besides root and vmgated's own user, whom the daemon admits
// without asking the policy. An SSH key never may, whatever its profile
// says, and admin = true does not grant it (issue 30, finding 5).
func (p *Policy) MayRotateAudit(id Identity) bool {
	if p == nil || !id.Local() {
		return false
	}
	prof, _ := p.profileFor(id)
	return prof != nil && prof.rotate
}

// CheckKeyProfile returns nil if an SSH key may name the profile: it
// exists and accepts SSH keys (match.ssh or match.any). Otherwise the
// error says which.
func (p *Policy) CheckKeyProfile(name string) error { return p.CheckDoorKeyProfile(DoorSSH, name) }

// CheckDoorKeyProfile returns nil if a key of the front door may name
// the profile: it exists and accepts the door's keys (match.ssh,
// match.e2b or match.any). Otherwise the error says which.
func (p *Policy) CheckDoorKeyProfile(door, name string) error {
	if p == nil {
		return errors.New("no policy loaded")
	}
	_, reason := p.keyProfile(&SSHKey{Door: door, Profile: name})
	if reason != "" {
		return errors.New(reason)
	}
	return nil
}

// profileFor returns the profile id gets, or nil and the reason there is
// none: for a local caller the first profile whose match fits; for an SSH
// key the profile it names, if that profile accepts keys.
func (p *Policy) profileFor(id Identity) (*profile, string) {
	if id.SSH != nil {
		return p.keyProfile(id.SSH)
	}
	skippedAny := false
	for _, prof := range p.profiles {
		if prof.match.matches(id) {
			return prof, ""
		}
		skippedAny = skippedAny || prof.match.any
	}
	if skippedAny {
		return nil, "no policy profile matches " + id.describe() + ": match.any takes only callers whose uid has an account"
	}
	return nil, "no policy profile matches " + id.describe()
}

// keyProfile returns the profile a front door's key names, or nil and the
// reason.
func (p *Policy) keyProfile(k *SSHKey) (*profile, string) {
	door, name := k.doorName(), k.Profile
	for _, prof := range p.profiles {
		if prof.name != name {
			continue
		}
		if !prof.match.acceptsKeys(k.Door) {
			return nil, fmt.Sprintf("the %s key's profile %s does not accept %s keys (its match has neither %s = true nor any = true)",
				door, quote(name), door, strings.ToLower(door))
		}
		return prof, ""
	}
	return nil, fmt.Sprintf("the %s key's profile %s is not in the policy", door, quote(name))
}

func userDesc(user string) string {
	if user == "" {
		return "user name unknown"
	}
	return "user " + quoteName(user)
}

var plainNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// quoteName quotes s only if it needs it, so reasons read "user alice".
func quoteName(s string) string {
	if plainNameRE.MatchString(s) {
		return s
	}
	return quote(s)
}

// checkRequest checks the profile-independent shape of req and returns the
// reason for a denial, or "".
func checkRequest(req *Request) string {
	if req.transferOnly() {
		if req.Session == "" || req.Shell || req.Interactive {
			return "a request without argv copies files in a session, and nothing else"
		}
	} else if len(req.Argv) == 0 {
		return "empty argv"
	}
	if len(req.Argv) > MaxArgs {
		return fmt.Sprintf("argv has %d elements; the limit is %d", len(req.Argv), MaxArgs)
	}
	if len(req.Env) > MaxEnv {
		return fmt.Sprintf("environment has %d entries; the limit is %d", len(req.Env), MaxEnv)
	}
	total := 0
	for i, a := range req.Argv {
		if len(a) > MaxArgBytes {
			return fmt.Sprintf("argument %d is %d bytes; the limit is %d", i, len(a), MaxArgBytes)
		}
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Sprintf("argument %d contains a NUL byte", i)
		}
		total += len(a) + 1
	}
	for i, e := range req.Env {
		if len(e) > MaxArgBytes {
			return fmt.Sprintf("environment entry %d is %d bytes; the limit is %d", i, len(e), MaxArgBytes)
		}
		if strings.IndexByte(e, 0) >= 0 {
			return fmt.Sprintf("environment entry %d contains a NUL byte", i)
		}
		total += len(e) + 1
	}
	if total > MaxRequestBytes {
		return fmt.Sprintf("argv and environment total %d bytes; the limit is %d", total, MaxRequestBytes)
	}
	if len(req.Argv) > 0 {
		if err := checkProgram(req.Argv[0]); err != nil {
			return fmt.Sprintf("program %s: %v", quote(req.Argv[0]), err)
		}
	}
	if req.Shell && !isShellArgv(req.Argv) {
		return `malformed shell request: argv must be ["sh", "-c", STRING] or ["bash", "-l", "-c", STRING]`
	}
	if req.Interactive && req.Shell {
		return "malformed interactive request: an interactive shell is not a shell string"
	}
	if req.Interactive && req.Timeout != 0 {
		return "an interactive shell takes no timeout: its limit is the profile's sessions.max_lifetime"
	}
	if req.Session != "" && !names.Session(req.Session) {
		return fmt.Sprintf("session name %s: must be %s", quote(req.Session), names.SessionRule)
	}
	if req.Timeout < 0 {
		return fmt.Sprintf("timeout %s: must not be negative", formatDuration(req.Timeout))
	}
	if reason := checkNetLimit(req.Net); reason != "" {
		return reason
	}
	if reason := checkSecretNames(req); reason != "" {
		return reason
	}
	seen := make(map[string]bool, len(req.Env))
	for _, e := range req.Env {
		name, _, ok := strings.Cut(e, "=")
		switch {
		case !ok:
			return fmt.Sprintf("environment entry %s: not KEY=VALUE", quote(e))
		case name == "":
			return fmt.Sprintf("environment entry %s: empty name", quote(e))
		case seen[name]:
			return fmt.Sprintf("environment variable %s given twice", quote(name))
		}
		seen[name] = true
	}
	return ""
}

// check applies the profile's settings to req and returns the timeout to use,
// or the reason for a denial.
// Precondition: checkRequest(req) returned "".
func (prof *profile) check(req *Request) (time.Duration, string) {
	if req.Shell && !prof.allowShell {
		return 0, "shell strings (vm-exec -c) are not allowed; run the program directly"
	}
	if req.Session != "" && !prof.limits.AllowSessions {
		return 0, "sessions are not allowed"
	}
	if req.Interactive && (!prof.allowShell || !prof.limits.AllowSessions) {
		return 0, "interactive shells are not allowed: the profile needs allow_shell = true and sessions.allowed = true; run a command instead"
	}
	if req.Detach && (req.Session == "" || req.Interactive || len(req.Puts)+req.Gets > 0) {
		return 0, "a background process runs in a session, without a terminal or file transfers"
	}
	if reason := prof.limits.Files.check(req); reason != "" {
		return 0, reason
	}
	timeout := prof.limits.Timeout
	switch {
	case req.Interactive:
		timeout = prof.limits.SessionMax
	case req.Detach:
		timeout = prof.timeoutMax
	}
	if req.Timeout > 0 {
		if req.Timeout > prof.timeoutMax {
			return 0, fmt.Sprintf("requested timeout %s exceeds the maximum %s", formatDuration(req.Timeout), formatDuration(prof.timeoutMax))
		}
		timeout = req.Timeout
	}
	for _, e := range req.Env {
		name, _, _ := strings.Cut(e, "=")
		if !prof.env.allows(name) {
			allowed := prof.env.String()
			if allowed == "" {
				allowed = "none"
			}
			return 0, fmt.Sprintf("environment variable %s is not allowed (allowed: %s)", quote(name), allowed)
		}
	}
	return timeout, ""
}

// quote returns s quoted for a reason or log line, cut to 64 bytes on a rune
// boundary, with the full length when cut. Bytes that are not UTF-8 are
// escaped (\xff); a cut backs off at most a rune's length, so that a run
// of continuation bytes is not cut to nothing.
func quote(s string) string {
	const maxLen = 64
	if len(s) <= maxLen {
		return strconv.Quote(s)
	}
	cut := maxLen
	for cut > maxLen-utf8.UTFMax+1 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s...(%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// check returns the reason to refuse req's transfers, or "".
func (f FileLimits) check(req *Request) string {
	if len(req.Puts) > 0 && f.PutFiles == 0 {
		return "copying files into the VM is not allowed (files.put_max_files = 0)"
	}
	if req.Gets > 0 && f.GetFiles == 0 {
		return "copying files out of the VM is not allowed (files.get_max_files = 0)"
	}
	for i, u := range req.Puts {
		switch {
		case u.Files > f.PutFiles:
			return fmt.Sprintf("put %d: %d files exceed files.put_max_files = %d", i, u.Files, f.PutFiles)
		case u.Bytes > f.PutBytes:
			return fmt.Sprintf("put %d: %s exceed files.put_max_bytes = %s", i, formatSize(u.Bytes), formatSize(f.PutBytes))
		}
	}
	return ""
}
