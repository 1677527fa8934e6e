// Package policy holds vmgate's operator policy: a strictly decoded, versioned
// TOML file, its validation, and the pure decision function that vmgated calls
// for every exec request.
//
// # Threat model
//
// The operator who writes the policy file is trusted: the file is decoded
// strictly (unknown keys and type errors are reported with file:line) and
// validated as a whole, but its choices are honoured. Requests are not trusted:
// they come from local users and, through them, from LLM agents that may be
// steered by hostile input. Every request field is checked in [Policy.Decide]
// before any rule is consulted, and a request that is malformed, too large, or
// asks for more than its profile grants is denied with a reason — never
// clamped, silently dropped, or passed on.
//
//   - Default deny. A caller that no profile matches is denied ("no policy
//     profile matches uid N (user U)"). A profile with allow rules denies argv
//     that none of them matches.
//   - First match wins. Profiles are tried in file order and the first whose
//     match fits the caller decides; later profiles are not consulted.
//   - SSH keys name their profile. A caller of vmgated's SSH front door has
//     no local uid: it is identified by a public key from the operator's
//     authorized-keys file, whose entry names a profile (profile="NAME").
//     That profile decides if it accepts keys (match.ssh = true or
//     match.any = true); otherwise, or if it does not exist, the request is
//     denied. Identity.SSH carries the key's fingerprint and comment for
//     the audit log; they take no part in decisions.
//   - Visible relaxations. [Policy.Explain] (vmgated policy check FILE) prints
//     every profile in order, whom it matches, its limits and rules, and lists
//     each relaxation — any caller, guest root, shell strings, sessions, any
//     argv, environment pass-through — so an operator can review the effect of
//     a file before deploying it.
//   - Purity. Decide does no I/O and reads no clock; the same policy, identity
//     and request always give the same verdict. A [Policy] is immutable after
//     [Parse] and safe for concurrent use.
//
// Argv rules are guard rails, not the isolation boundary: the boundary is the
// disposable VM, its jail and the host-side network policy. An allow-all
// profile lets a command copy /usr/bin/wget to /tmp/x and run that, so deny
// rules on program names only stop the obvious spelling. Allow rules with
// exact shapes (see args below) are the strong form.
//
// # Request checks
//
// Decide denies, with a reason, a request that has: an empty argv; a NUL byte
// in any argument, environment entry or the session name; more than [MaxArgs]
// arguments; an argument or environment entry longer than [MaxArgBytes];
// argv and environment together over [MaxRequestBytes] (each string counted
// with its terminating NUL); more than [MaxEnv] environment entries; an
// environment entry without "=", with an empty name, with a name the profile
// does not allow, or a name given twice (denied, not dropped: a command that
// silently loses its environment misbehaves in ways an agent cannot
// diagnose); a negative timeout or one above the profile's timeout.max (0
// means timeout.default); a shell string when allow_shell is false, or one not
// shaped ["sh", "-c", STRING]; a session when sessions are not allowed, or a
// session name that names.Session rejects.
//
// A request may narrow its profile's network (Request.Net: vm-exec
// --no-network, --net-allow), and a session's lock narrows every request
// in it (Request.NetLock, which the daemon keeps; [Policy.DecideNetLock]
// decides a lock). Each rule asked for must be within a rule of the
// profile's network.allow (a name within a name or a *.wildcard on its
// port, or on any port; a range within a range), and within the lock:
// one that is not, or does not parse, is denied by rule "network.allow"
// or "session network lock", naming it; it is never clamped. More than
// [MaxNetRules] rules, or one over [MaxNetRuleBytes], are denied too.
// The verdict's network is then the rules asked for, or the profile's
// under the lock (their exact intersection); its limits stay the
// profile's, and a narrowed network keeps its NIC, so the VM's shape
// does not change.
//
// Program names (argv[0]) must be either a bare name ("wget") or a clean
// absolute path ("/usr/bin/wget"): not empty, valid UTF-8, without white
// space, control characters or invisible format characters (U+200B and the
// like, which make one name read as another in logs), not "." or "..", and
// for paths
// path.Clean must leave them unchanged — so "/usr/bin/../bin/sh",
// "//bin/sh", "/bin/sh/" and relative paths with a slash ("./wget",
// "../../bin/sh") are denied. A bare name is resolved through PATH in the
// guest. There is no Unicode normalisation: "wgеt" with a Cyrillic "е" is a
// different name from "wget" and matches no ASCII pattern (so an allow rule
// for wget does not allow it; a deny rule for wget does not deny it either,
// which is one more reason deny rules are guard rails).
//
// # File format (version 1)
//
// A complete, commented example is example.toml in this directory; the
// built-in policy used when no file exists is default.toml (see [Default]).
// docs/policy.md lists every key with its type, tables, built-in default
// and meaning; that list is generated from the decoding types by
// [Reference], and a test keeps it current.
//
//	version = 1                 # required; other versions are rejected
//
//	[defaults]                  # optional: any profile setting below, inherited
//	memory_mib = 1024           # by every profile that does not set it
//
//	[[profile]]                 # ordered; the first matching profile decides
//	name = "web-fetch"          # required, unique, [a-z0-9-], at most 64 bytes
//	match = { groups = ["agents"] }
//
// Match keys (a caller matches when ANY listed key matches; at least one key
// is required, and any = true cannot be combined with the others):
//
//	uids   = [1000]             # peer uid (SO_PEERCRED)
//	users  = ["alice"]          # user name of that uid (never matches if lookup failed)
//	gids   = [1000]             # peer gid (SO_PEERCRED)
//	groups = ["vmgate-admins"]  # name of the peer gid or of any of the user's groups
//	ssh    = true               # SSH keys whose authorized-keys entry names this profile
//	any    = true               # every local caller with an account, root included, and SSH keys naming it
//
// ssh = true matches no local caller; it may stand alone (a profile only for
// SSH keys) or sit beside local keys. A profile after an any = true profile
// is reachable only through ssh = true.
//
// Profile settings (also allowed in [defaults]; a key missing from both takes
// the built-in value in parentheses, which is always the conservative one):
//
//	image        = "default"    # guest image name ("default")
//	user         = "agent"      # guest user: "agent" or "root" ("agent")
//	memory_mib   = 512          # guest memory, 64..1048576 (512)
//	cpus         = 1            # guest CPUs, 1..64 (1)
//	disk_mib     = 1024         # what the guest may write to its disk, 64..1048576 (1024)
//	max_vms      = 2            # concurrent VMs for this profile, 1..1024 (2)
//	max_vms_per_caller = 1      # of them, one caller's (a uid or SSH key), its
//	                            # sessions included, ≤ max_vms (half of max_vms, rounded up)
//	max_queued_per_caller = 4   # one caller's requests waiting for a VM, 0..1024 (4)
//	output_limit = "1MiB"       # per stream (stdout, stderr); bytes as an
//	                            # integer or "N", "NKiB", "NMiB", "NGiB"; ≤ 1 GiB (1MiB)
//	allow_shell  = false        # allow vm-exec -c STRING (false)
//	env          = ["LANG"]     # variables a client may pass; "LC_*" allows a
//	                            # prefix, "*" any name ([])
//	timeout  = { default = "30s", max = "10m" }     # Go durations, > 0, default ≤ max
//	sessions = { allowed = false, idle_timeout = "10m", max_lifetime = "1h" }
//	network  = { mode = "none" }                    # no NIC at all (the default)
//	[profile.network]                               # or: egress by allowlist
//	mode            = "allowlist"
//	allow           = ["*.wikipedia.org:443", "example.com:80", "203.0.113.0/24:443"]
//	allow_ranges    = []        # special ranges names may resolve into (a relaxation)
//	max_connections = 32        # concurrent connections per VM (1..4096)
//	max_bytes       = "256MiB"  # bytes per VM, both directions
//	connect_rate    = 120       # new connections per minute per VM
//
// The timeout, sessions and network tables merge key by key: a profile that
// sets only timeout.max keeps timeout.default from [defaults] or the built-in.
// allow rules are host:port with "*.name" for any subdomain (not the name
// itself), "*" for any port, and CIDR ranges for direct addresses; names
// that resolve to loopback, private, CGNAT, link-local, multicast or other
// special addresses are refused unless allow_ranges covers them
// (docs/network.md has the whole model).
//
// # Argv rules
//
// A profile may have [[profile.deny]] and [[profile.allow]] rules. Deny rules
// are checked first, in order: any match denies, naming the rule ("deny[0]
// no-upload"). Then, if the profile has allow rules, one of them must match
// ("no allow rule matches"); a profile without allow rules allows any argv
// that no deny rule matched. Shell strings are checked as ["sh", "-c",
// STRING], so a profile with allow rules also needs one for sh.
//
// A rule has an optional name ([a-z0-9-], unique within the profile) and at
// least one condition; it matches when all of its conditions match:
//
//	program    = ["wget", "/usr/bin/curl"]
//	    argv[0] is one of these. A name without a slash matches the base name
//	    of argv[0] (so "wget" matches "/tmp/wget" too); a name with a slash
//	    must be a clean absolute path and matches argv[0] exactly. No globs.
//	args       = ["-U", "?*", "https://?*"]
//	    one glob per argument, argv[1], argv[2], …; the argument count must be
//	    equal, unless the last element is "..." or "**", which matches any
//	    remaining arguments (zero or more). args = [] means "no arguments".
//	args_any   = ["--post-file*", "--post-data*"]
//	    some argument (argv[1:]) matches one of these globs.
//	args_regex = '^curl( |$)'
//	    RE2 regular expression matched against the whole argv joined with
//	    single spaces; unanchored unless you anchor it. The joined form cannot
//	    tell ["a b"] from ["a", "b"]: prefer args for allow rules.
//
// Globs use path.Match syntax (*, ?, [class], [^class], \ escapes; malformed
// patterns are rejected) with one deliberate difference: * and ? also match
// "/". Arguments are not paths, and with path.Match's rule a deny pattern
// "--post-file*" would miss "--post-file=/etc/passwd". The flip side is for
// allow rules: "https://*.example.com/*" also matches
// "https://evil.test/x.example.com/"; use the network allowlist for hosts,
// not argv. Arguments are matched as bytes of UTF-8; an
// invalid byte counts as U+FFFD.
//
// args_any and args see every argument, including those after "--". For most
// programs "--" ends the options, so "wget -- -U x" passes "-U" as a URL, not
// an option: a rule that requires an option with args_any can be fooled that
// way. Deny "--" (as example.toml does) or write exact shapes with args.
//
// # The [isolate] table
//
//	[isolate]
//	seccomp = "required"   # default; "off" runs QEMU's jail without the
//	                       # seccomp allowlist (a logged relaxation)
//	cgroups = "auto"       # default: a cgroup per VM (memory, pids, cpu)
//	                       # when vmgated has a delegated cgroup, else
//	                       # rlimits only (logged); "required" refuses to
//	                       # start without one; "off" is a logged relaxation
//	guest_aslr = "auto"    # default: guests without address space
//	                       # randomisation under TCG with QEMU < 8.0
//	                       # (a logged relaxation; execs 3-4x faster);
//	                       # "on" keeps it
//
// It configures how vmgated jails QEMU for every VM; requests cannot change
// it. vmgated serve --seccomp overrides the seccomp key. The cgroups and
// guest_aslr keys are read when the daemon starts (a reload does not change
// them).
package policy
