package policy

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/names"
)

// Reference returns the reference of the policy file format in Markdown,
// generated from the types that [Parse] decodes into: a section per table
// and a row per key, with its dotted path, TOML type, the tables it may be
// written in, its built-in default (from the constants that validation
// uses) and its description. docs/policy.md embeds it, and a test keeps the
// two equal, so the reference follows every change of the schema.
//
// Reference is pure: the same build always returns the same text.
func Reference() string {
	keys := referenceKeys()
	var b strings.Builder
	writeValueTypes(&b, keys)

	// Sections in the order their first key was reached; keys within a
	// section in walk order.
	var sections []string
	bySection := map[string][]*refKey{}
	for _, k := range keys {
		if _, ok := bySection[k.section]; !ok {
			sections = append(sections, k.section)
		}
		bySection[k.section] = append(bySection[k.section], k)
	}
	for _, s := range sections {
		fmt.Fprintf(&b, "\n## %s\n\n", sectionTitle(bySection[s]))
		b.WriteString("| Key | Type | In | Default | Description |\n")
		b.WriteString("|---|---|---|---|---|\n")
		for _, k := range bySection[s] {
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n",
				k.path, k.typ, k.in(), k.defaultCell(), mdCell(refDescriptions[k.path]))
		}
	}
	return b.String()
}

// refKey is one key of the schema. A key that the decoding types reach at
// several places is one refKey: a setting in both [defaults] and
// [[profile]], a rule key in both [[profile.deny]] and [[profile.allow]].
type refKey struct {
	path    string   // the dotted path shown, and the key of refDescriptions and refDefaults
	paths   []string // every dotted path of the key, path first
	tables  []string // the header of the table that holds each path ("" at the top level)
	section string   // the dotted path of the table that holds path
	typ     string   // the TOML type, as the reference names it
	isTable bool     // a table or an array of tables
	seq     int      // walk position of path
}

// defaultsTable is the key of [defaults]. A key reached both under it and
// elsewhere is shown by its other path, in the section of the profile's
// tables.
const defaultsTable = "defaults"

// referenceKeys walks the decoding types from document, following their
// toml tags as the decoder does (an untagged embedded struct is
// flattened), and returns every key: value keys and table keys.
func referenceKeys() []*refKey {
	type field struct {
		owner reflect.Type // the struct type that declares it
		tag   string
	}
	type place struct {
		path, table, parent string
		seq                 int
	}
	var keys []*refKey
	places := map[*refKey][]place{}
	byField := map[field]*refKey{}
	seq := 0
	var walk func(t reflect.Type, prefix, header string)
	walk = func(t reflect.Type, prefix, header string) {
		for f := range t.Fields() {
			tag := f.Tag.Get("toml")
			if f.Anonymous && tag == "" {
				walk(f.Type, prefix, header)
				continue
			}
			if tag == "" || tag == "-" || strings.Contains(tag, ",") {
				panic(fmt.Sprintf("policy: reference: field %s.%s: want a plain toml tag, have %q", t.Name(), f.Name, tag))
			}
			path := tag
			if prefix != "" {
				path = prefix + "." + tag
			}
			typ, elem, array := refTypeOf(f.Type)
			id := field{t, tag}
			k := byField[id]
			if k == nil {
				k = &refKey{typ: typ, isTable: elem != nil}
				byField[id] = k
				keys = append(keys, k)
			}
			places[k] = append(places[k], place{path: path, table: header, parent: prefix, seq: seq})
			seq++
			if elem != nil {
				h := "[" + path + "]"
				if array {
					h = "[" + h + "]"
				}
				walk(elem, path, h)
			}
		}
	}
	walk(reflect.TypeFor[document](), "", "")

	for _, k := range keys {
		ps := places[k]
		// Show the first path outside [defaults]: [defaults] is described
		// by the keys it shares with [[profile]].
		i := slices.IndexFunc(ps, func(p place) bool {
			return p.path != defaultsTable && !strings.HasPrefix(p.path, defaultsTable+".")
		})
		if i > 0 {
			ps = append([]place{ps[i]}, slices.Delete(slices.Clone(ps), i, i+1)...)
		}
		k.path, k.section, k.seq = ps[0].path, ps[0].parent, ps[0].seq
		for _, p := range ps {
			k.paths = append(k.paths, p.path)
			k.tables = append(k.tables, p.table)
		}
		if refDurations[k.path] {
			if k.typ != "string" {
				panic(fmt.Sprintf("policy: reference: %s is listed as a duration but decodes as %s", k.path, k.typ))
			}
			k.typ = "duration"
		}
	}
	slices.SortStableFunc(keys, func(a, b *refKey) int { return a.seq - b.seq })
	return keys
}

// refTypeOf names the TOML type of a field of type t. For a table or an
// array of tables it also returns the struct type of the table.
func refTypeOf(t reflect.Type) (name string, table reflect.Type, array bool) {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[sizeValue]():
		return "size", nil, false
	case t.Kind() == reflect.Struct:
		return "table", t, false
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		return "array of tables", t.Elem(), true
	case t.Kind() == reflect.Slice:
		return "array of " + refScalar(t.Elem()) + "s", nil, false
	}
	return refScalar(t), nil, false
}

func refScalar(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Int64:
		return "integer"
	case reflect.Bool:
		return "boolean"
	}
	panic(fmt.Sprintf("policy: reference: no TOML type name for Go type %s", t))
}

// in lists the tables k may be written in.
func (k *refKey) in() string {
	s := make([]string, len(k.tables))
	for i, t := range k.tables {
		if t == "" {
			s[i] = "top level"
		} else {
			s[i] = "`" + t + "`"
		}
	}
	return strings.Join(s, ", ")
}

func (k *refKey) defaultCell() string {
	switch d, ok := refDefaults[k.path]; {
	case !ok || d == "":
		return "—"
	case d == refRequired:
		return "*required*"
	default:
		return "`" + d + "`"
	}
}

// sectionTitle names the tables that hold keys: "Top level", or their
// headers ("`[[profile]]` and `[defaults]`").
func sectionTitle(keys []*refKey) string {
	var headers []string
	for _, k := range keys {
		for _, t := range k.tables {
			if !slices.Contains(headers, t) {
				headers = append(headers, t)
			}
		}
	}
	if len(headers) == 1 && headers[0] == "" {
		return "Top level"
	}
	for i, h := range headers {
		headers[i] = "`" + h + "`"
	}
	if n := len(headers); n > 1 {
		return strings.Join(headers[:n-1], ", ") + " and " + headers[n-1]
	}
	return headers[0]
}

// mdCell makes s safe in a Markdown table cell.
func mdCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// writeValueTypes writes the legend of the types and columns.
func writeValueTypes(b *strings.Builder, keys []*refKey) {
	var merged []string
	for _, k := range keys {
		if k.typ == "table" && slices.Contains(k.tables, "["+defaultsTable+"]") {
			merged = append(merged, "`"+k.path[strings.LastIndex(k.path, ".")+1:]+"`")
		}
	}
	list := strings.Join(merged, ", ")
	if n := len(merged); n > 1 {
		list = strings.Join(merged[:n-1], ", ") + " and " + merged[n-1]
	}
	fmt.Fprintf(b, `## Value types

- **string**, **integer**, **boolean**: TOML values of that type.
- **array of strings**, **array of integers**: TOML arrays. A profile's
  array replaces the one in `+"`[defaults]`"+`; arrays are never merged.
- **duration**: a string in Go's duration syntax, such as `+"`\"30s\"`, `\"10m\"` or `\"1h30m\"`"+`,
  greater than zero.
- **size**: a byte count, written as a TOML integer (`+"`1048576`"+`) or as a
  string `+"`\"N\"`, `\"NB\"`, `\"NKiB\"`, `\"NMiB\"` or `\"NGiB\"`"+` with binary units
  (`+"`\"1MiB\"`"+` is 1048576 bytes), from 1 byte to %s.
- **table**: a `+"`[header]`"+` section or an inline table
  (`+"`timeout = { max = \"1h\" }`"+`). A profile's tables follow its `+"`[[profile]]`"+`
  header as `+"`[profile.timeout]`"+`, `+"`[[profile.allow]]`"+` and so on (a `+"`[timeout]`"+`
  there would start a top-level table, an error).
  The %s tables merge key by key: a profile that sets only
  `+"`timeout.max`"+` keeps `+"`timeout.default`"+` from `+"`[defaults]`"+` or the built-in default.
- **array of tables**: each `+"`[[header]]`"+` adds one element, in file order;
  the keys and tables that follow it belong to that element.

**In** lists the tables a key may be written in. A key in `+"`[defaults]`"+`
applies to every profile that does not set it. **Default** is the built-in
value of a key that is set nowhere; for profile settings it is always the
conservative choice. A *required* key must be written. A dash means that
there is no single built-in value: a table's keys have their own, and for
other keys the description says what leaving them out means.
`, formatSize(maxOutputLimit), list)
}

// refRequired in refDefaults marks a key that must be written.
const refRequired = "required"

// refDurations lists the string keys that validation parses as durations.
var refDurations = map[string]bool{
	"profile.timeout.default":       true,
	"profile.timeout.max":           true,
	"profile.sessions.idle_timeout": true,
	"profile.sessions.max_lifetime": true,
	"profile.sessions.pause_after":  true,
	"profile.sessions.publish_idle": true,
}

// refDefaults holds the built-in default of every value key, as a TOML
// value built from the constant that validation uses; "" for a key without
// one, refRequired for a key that must be written. Table keys may appear
// too. A test sets each key to its listed default and checks that the
// compiled policy does not change.
var refDefaults = map[string]string{
	"version":              refRequired,
	"profile":              refRequired,
	"profile.name":         refRequired,
	"profile.admin":        "false",
	"profile.audit_rotate": "false",
	"profile.match":        refRequired,
	"profile.image":        strconv.Quote(builtinImage),
	"profile.images":       "",
	"profile.secrets":      "",
	"secret":               "",
	"secret.name":          refRequired,
	"secret.file":          "",
	"secret.credential":    "",
	"secret.hosts":         refRequired,
	"secret.headers":       "",
	"secret.query":         "",
	"profile.user":         strconv.Quote(builtinUser),
	"profile.cpus":         strconv.Itoa(builtinCPUs),
	"profile.max_vms":      strconv.Itoa(builtinMaxVMs),
	// Half of max_vms, rounded up: 1 with the built-in max_vms.
	"profile.max_vms_per_caller":    strconv.Itoa((builtinMaxVMs + 1) / 2),
	"profile.max_queued_per_caller": strconv.Itoa(builtinCallerQueue),
	"profile.env":                   "[]",

	"profile.memory_mib":   strconv.Itoa(builtinMemoryMiB),
	"profile.disk_mib":     strconv.Itoa(builtinDiskMiB),
	"profile.output_limit": tomlSize(builtinOutputLimit),
	"profile.allow_shell":  strconv.FormatBool(builtinAllowShell),

	"profile.match.any":    "",
	"profile.match.uids":   "",
	"profile.match.users":  "",
	"profile.match.gids":   "",
	"profile.match.groups": "",
	"profile.match.ssh":    "",
	"profile.match.e2b":    "",

	"profile.timeout.default": tomlDuration(builtinTimeoutDefault),
	"profile.timeout.max":     tomlDuration(builtinTimeoutMax),

	"profile.sessions.allowed":             strconv.FormatBool(builtinSessions),
	"profile.sessions.idle_timeout":        tomlDuration(builtinSessionIdle),
	"profile.sessions.max_lifetime":        tomlDuration(builtinSessionMax),
	"profile.sessions.pause_after":         "",
	"profile.sessions.max_paused":          strconv.Itoa(builtinMaxPaused),
	"profile.sessions.max_paused_mib":      strconv.Itoa(builtinMaxPausedMiB),
	"profile.sessions.publish":             strconv.FormatBool(builtinPublish),
	"profile.sessions.publish_any_address": strconv.FormatBool(builtinPublishAny),
	"profile.sessions.publish_max_conns":   strconv.Itoa(builtinPublishConns),
	"profile.sessions.publish_idle":        tomlDuration(builtinPublishIdle),
	"profile.sessions.max_commands":        strconv.Itoa(builtinMaxCommands),
	"profile.sessions.max_processes":       strconv.Itoa(builtinMaxProcesses),
	"profile.sessions.process_buffer":      tomlSize(builtinProcessBuffer),
	"profile.users":                        "",

	"profile.network.mode":            strconv.Quote(builtinNetwork),
	"profile.network.allow":           "",
	"profile.network.allow_ranges":    "[]",
	"profile.network.max_connections": strconv.Itoa(builtinNetMaxConns),
	"profile.network.max_bytes":       tomlSize(builtinNetMaxBytes),
	"profile.network.connect_rate":    strconv.Itoa(builtinNetRate),

	"profile.files.put_max_bytes": tomlSize(builtinFileBytes),
	"profile.files.put_max_files": strconv.Itoa(builtinFileCount),
	"profile.files.get_max_bytes": tomlSize(builtinFileBytes),
	"profile.files.get_max_files": strconv.Itoa(builtinFileCount),

	"profile.deny.name":       "",
	"profile.deny.program":    "",
	"profile.deny.args":       "",
	"profile.deny.args_any":   "",
	"profile.deny.args_regex": "",

	"isolate.seccomp":    strconv.Quote(builtinSeccomp),
	"isolate.cgroups":    strconv.Quote(builtinCgroups),
	"isolate.guest_aslr": strconv.Quote(builtinGuestASLR),
}

// tomlSize writes n as a size value: in the largest binary unit that
// divides it, else as an integer.
func tomlSize(n int64) string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.Quote(strconv.FormatInt(n/u.mult, 10) + u.name)
		}
	}
	return strconv.FormatInt(n, 10)
}

func tomlDuration(d time.Duration) string { return strconv.Quote(formatDuration(d)) }

// refDescriptions describes every key of the schema, by the path that
// Reference shows: a key shared by [defaults] and [[profile]] is described
// once, under profile, and a rule key once, under profile.deny. Each is
// one line of Markdown. A test fails when a key has no description or a
// description names no key.
var refDescriptions = map[string]string{
	"version": "Format version of the file. Must be 1: a file without it, or with another version, is rejected.",
	"defaults": "Settings that every profile inherits unless it sets them: the keys whose **In** column lists `[defaults]`. " +
		"Optional.",
	"profile": "The profiles, tried in file order: the first whose `match` fits the caller decides, and later profiles are not consulted. " +
		"A caller that no profile matches is denied. At least one profile is required.",
	"isolate": "How vmgated jails QEMU for every VM. Requests cannot change it. Optional.",

	"profile.name": fmt.Sprintf("Name of the profile, unique in the file: 1 to %d of `[a-z0-9-]`, starting with a letter or digit. ", maxNameLen) +
		"Verdicts and the audit log name the profile by it, and an SSH authorized-keys entry names its profile with `profile=\"NAME\"`.",
	"profile.match": "Whom the profile applies to. A caller matches when any of its keys matches; at least one key is required. " +
		"Usually inline: `match = { groups = [\"vmgate-agents\"] }`.",
	"profile.image": "Name of the guest image: " + strings.Replace(names.ImageRule, names.Charset, "`"+names.Charset+"`", 1) + ". " +
		"`default` is the daemon's image (`vmgated serve --image`); any other NAME is `STATE/images/NAME`, built with `vmgated image build --name NAME` or imported with `vmgated image import --name NAME ROOTFS.tar` " +
		"(`vmgated image list` shows them). Each image has its own templates and pools; vmgated refuses a policy naming an image that is not built, at start and at reload. " +
		"It is the image of commands whose caller names none of `images`.",
	"secret":            "A value the guest never holds (docs/secrets.md). A command that asks for it (`vm-exec --secret NAME`) sees a placeholder in the variable NAME; the VM's network stack replaces the placeholder with the value only in requests to the secret's hosts, only where `headers` and `query` allow, and refuses and audits a request that carries it anywhere else. The daemon reads values at start and reload. Optional.",
	"secret.name":       "The guest's variable, and the name a request asks for: `[A-Za-z_][A-Za-z0-9_]*`.",
	"secret.file":       "The file holding the value, read by vmgated only: a regular file owned by vmgated's user, mode 0600 or 0400; one trailing newline is dropped. Set this or `credential`; a missing, world-readable or foreign file refuses the policy at start and reload.",
	"secret.credential": "A systemd credential holding the value (`LoadCredential=NAME:PATH` in vmgated.service): read from `$CREDENTIALS_DIRECTORY/NAME`. Set this or `file`.",
	"secret.hosts":      "The hosts the value may go to, in `network.allow`'s syntax (`api.github.com:443`); every profile that lists the secret must allow each of them. HTTPS to them is terminated by the network stack with a per-session CA the guest trusts.",
	"secret.headers":    "The request header fields where the placeholder is replaced (`Authorization`); a placeholder in any other field, the path or the body refuses the request.",
	"secret.query":      "Also replace the placeholder in the request target's query string.",
	"profile.secrets":   "The secrets (`[[secret]]` names) a caller may ask for; another name is refused, naming this key. Needs `network.mode = \"allowlist\"` allowing each secret's hosts. A session keeps the secrets its commands asked for: its later commands see them too.",
	"profile.images": "The images a caller may name for a fresh VM or a new session (`vm-exec --image NAME`, the socket API's and MCP's `image`); another name is refused, naming this key. " +
		"Default: `image` alone, which must be one of them. An entry `NAME@" + digestPrefix + "HEX` pins the image NAME to a manifest digest (what `vmgated image list` shows of an imported or pulled image): " +
		"vmgated refuses a policy whose pinned image has another digest, or none (a built image), at start and at reload, as it refuses one naming an image that is not built. " +
		"A session keeps the image it began with; a reload that takes that image away from `images` refuses the session's further commands and operations. " +
		"Each image is a VM shape of its own, with its own templates and pools: `vmgated serve` and `vmgated image warm` make them for every image listed.",
	"profile.user": fmt.Sprintf("Guest user that commands run as unless the caller names another of `users` (or their image's configuration names one of `users`: docs/images.md): `%q`, unprivileged, `%q`, a relaxation that lets commands change the (disposable) guest system, "+
		"or any account of the guest's (%s); one other than root that has uid 0 there is refused.", userAgent, userRoot, names.AccountRule),
	"profile.users": "The guest users a caller may name (`vm-exec --user NAME`, the socket API's and MCP's `user`); another name is refused, naming this key. " +
		"Default: `user` alone. `root` in it is a relaxation. The audit record and the receipt say which user ran a command.",
	"profile.memory_mib": fmt.Sprintf("Guest memory in MiB, %d to %d.", minMemoryMiB, maxMemoryMiB),
	"profile.cpus":       fmt.Sprintf("Guest CPUs, 1 to %d.", maxCPUs),
	"profile.disk_mib": fmt.Sprintf("What a VM may write to its disk, in MiB, %d to %d. ", minDiskMiB, maxDiskMiB) +
		"Its root file system has this much free space when the VM is handed out, for root and the unprivileged user alike, " +
		"so a command that writes more gets \"No space left on device\" and the VM runs on. " +
		"vmgated also bounds the VM's disk file on the host to this plus a margin for the file system's own writes; " +
		"a guest root that gets past the free space (it can delete the reserve file that holds it) meets that bound as I/O errors (docs/security.md). " +
		"A session keeps the limit it began with. Each value is a VM shape of its own, with its own template and pool.",
	"profile.max_vms": fmt.Sprintf("VMs of this profile that may run at once, 1 to %d. ", maxMaxVMs) +
		"A request beyond it waits in vmgated's queue and is refused as busy if no VM frees in time (`vmgated serve --queue`, `--queue-wait`); " +
		"`vmgated serve --max-vms` bounds all profiles together.",
	"profile.max_vms_per_caller": fmt.Sprintf("VMs of this profile that one caller (a uid, or an SSH key) may hold at once, its sessions included, 1 to %d; ", maxMaxVMs) +
		"by default half of max_vms, rounded up, and never more than max_vms. A caller's request beyond it waits like any other, " +
		"so that no caller can take every VM of a profile from the others.",
	"profile.max_queued_per_caller": fmt.Sprintf("Requests of one caller that may wait for a VM of this profile at once, 0 to %d; one more is refused as busy at once. ", maxMaxVMs) +
		"It keeps one caller from filling vmgated's queue (`vmgated serve --queue`) that all callers share.",
	"profile.output_limit": "Output delivered per stream, stdout and stderr each. Output beyond it is discarded and the result is marked truncated; " +
		"the command runs on.",
	"profile.allow_shell": "Whether a client may send a shell string (`vm-exec -c STRING`), a relaxation. " +
		"A shell string is checked against the argv rules as `[\"sh\", \"-c\", STRING]`, so a profile with allow rules also needs one for `sh`. " +
		"SSH commands are shell strings. With `false` and no allow rules, argv such as `[\"sh\", \"-c\", …]` is still allowed.",
	"profile.env": "Environment variables a client may pass: exact names (`[A-Za-z_][A-Za-z0-9_]*`), `\"PREFIX*\"` for every name with that prefix, " +
		"or `\"*\"` for any name, a relaxation. A request with any other variable is denied, not stripped. " +
		"The rest of the guest environment is the image's.",
	"profile.timeout":  "Timeouts of commands.",
	"profile.sessions": "Sessions: one VM, with its files, kept across commands.",
	"profile.network":  "The guest's network; docs/network.md has the whole model.",
	"profile.files": "File transfers: `vm-exec --put`, `--get` and `cp` (docs/files.md). Each tree copied is one tar stream, " +
		"checked by vmgated entry by entry and audited with its SHA-256.",
	"profile.deny": "Deny rules, checked first and in order: a request whose argv any of them matches is denied, naming the rule (`deny[0] no-upload`). " +
		"A rule matches when all of its conditions (`program`, `args`, `args_any`, `args_regex`) match, and needs at least one.",
	"profile.allow": "Allow rules, with the keys of deny rules, checked after them: if the profile has any, one of them must match, " +
		"or the request is denied (`no allow rule matches`). A profile without allow rules allows any argv that no deny rule matches, a relaxation.",

	"profile.match.any": "`true`: every local caller whose uid has an account (a user name), root included, and SSH keys that name the profile; a relaxation. " +
		"A uid without an account is most often one that a login's user namespaces or set-user-ID files run as: vmgated counts the subordinate uids of `/etc/subuid` as their login, " +
		"and any other uid without an account matches only a profile that names its uid, gid or groups. " +
		"Only `true` is accepted, and not together with other match keys. Later profiles are reachable only through `ssh = true`.",
	"profile.match.uids":  fmt.Sprintf("Peer uids (SO_PEERCRED), 0 to %d; a subordinate uid of a login (`/etc/subuid`) is that login's uid. An empty list is an error.", uint32(math.MaxUint32-1)),
	"profile.match.users": "User names of the peer uid; they never match when the name lookup failed. An empty list is an error.",
	"profile.match.gids":  fmt.Sprintf("Peer gids (SO_PEERCRED), 0 to %d; a subordinate uid's caller has its login's primary gid. An empty list is an error.", uint32(math.MaxUint32-1)),
	"profile.match.groups": "Group names: of the peer gid, or of any supplementary group the peer process holds (SO_PEERGROUPS: what it was given at login, " +
		"not what the group database lists now); they never match when the name lookup failed. A subordinate uid's caller has the groups of its login's account. " +
		"An empty list is an error.",
	"profile.match.e2b": "`true`: E2B API keys whose keys-file entry names this profile (`profile=\"NAME\"`) get it, through `vmgated serve --e2b-listen` (docs/e2b.md). " +
		"Matches no local caller; it may stand alone or sit beside local keys. Only `true` is accepted.",
	"profile.match.ssh": "`true`: SSH keys whose authorized-keys entry names this profile (`profile=\"NAME\"`) get it, through `vmgated serve --ssh-listen`. " +
		"Matches no local caller; it may stand alone or sit beside local keys. Only `true` is accepted.",

	"profile.timeout.default": "Timeout of a command whose request asks for none (or 0). At most `timeout.max`.",
	"profile.timeout.max":     "Longest timeout a request may ask for; a request above it is denied, not clamped.",

	"profile.sessions.allowed": "Whether clients may open sessions, a relaxation. Interactive SSH shells need it, and `allow_shell` too.",
	"profile.sessions.idle_timeout": "A session that runs no command for this long is closed. " +
		"At most `sessions.max_lifetime`.",
	"profile.sessions.max_lifetime": "A session is closed this long after it was opened, busy or not, running or paused. It is also the limit of an interactive shell.",
	"profile.sessions.pause_after": "A session that runs no command for this long is paused to disk: its RAM, device state and disk " +
		"are saved in vmgated's state directory, its VM and its slot of `max_vms` are freed, and its next command resumes it with " +
		"everything it left (files, running processes) and a fresh clock and entropy. With it, `idle_timeout` pauses too, " +
		"whichever comes first, instead of ending the session. Unset: sessions are paused only when their owner asks " +
		"(`vm-exec --session S --pause`).",
	"profile.sessions.max_paused": "How many paused sessions a caller may keep. A pause beyond it is refused with the reason " +
		"and the session keeps running.",
	"profile.sessions.max_paused_mib": "How many MiB of disk a caller's paused sessions may take in all (their RAM's data and their disk's " +
		"changes). A pause beyond it is refused with the reason and the session keeps running.",
	"profile.sessions.publish": "Whether a caller may publish a port of its session on the host (`vm-exec --session S --publish " +
		"[ADDR:]PORT:GUESTPORT`, or a Unix socket's path for `ADDR:PORT`), a relaxation: host connections to it reach the guest's port, " +
		"each one audited, for as long as the session lives. Only loopback addresses and Unix sockets unless `publish_any_address` " +
		fmt.Sprintf("says otherwise. Needs `sessions.allowed` and `network.mode = %q` (the port is reached through the VM's NIC).", networkAllowlist),
	"profile.sessions.publish_any_address": "`true`: a published port may listen on any host address (`0.0.0.0`, a LAN address), " +
		"which other machines can reach, a logged relaxation. Needs `publish`.",
	"profile.sessions.publish_max_conns": fmt.Sprintf("Connections one published port carries at once, 1 to %d; ", maxPublishConns) +
		"one beyond is refused at once (closed, reset over TCP) and audited.",
	"profile.sessions.max_commands": fmt.Sprintf("Commands that run at once in one session, 1 to %d; the next waits (as long as for a VM) and is then refused as busy, naming this key. ", maxMaxCommands) +
		"A pause or a fork waits for the ones running.",
	"profile.sessions.max_processes":  fmt.Sprintf("Background processes (`vm-exec --detach`) one session keeps running at once, 0 to %d; one more is refused, naming this key.", maxMaxProcesses),
	"profile.sessions.process_buffer": fmt.Sprintf("Output of a background process kept per stream, stdout and stderr each, 1KiB to %dMiB: past it the oldest bytes go, and the count dropped is reported.", maxProcessBuffer>>20),
	"profile.sessions.publish_idle": "A connection of a published port over which no byte moves either way for this long is cut " +
		"(and its record says so): an idle one holds one of the port's connections. The bytes a port carries count as use of its " +
		"session, which then neither idles out nor pauses; an open but silent connection does not.",

	"profile.network.mode": fmt.Sprintf("`%q`: the guest has no NIC at all. ", networkNone) +
		fmt.Sprintf("`%q`: one NIC on a user-space network that vmgated runs for the VM, ", networkAllowlist) +
		"with egress only as `network.allow` permits, and every DNS query and connection audited. The other keys of this table apply to this mode.",
	"profile.network.allow": fmt.Sprintf("Egress rules; required with `mode = %q` and refused without it. ", networkAllowlist) +
		"`\"name:port\"` allows a name, `\"*.name:port\"` any subdomain (not the name itself), a port `*` any port, " +
		"and `\"CIDR:port\"` direct connections to a range. Names that resolve to loopback, private, CGNAT, link-local, multicast " +
		"or other special addresses are refused unless `allow_ranges` covers them. " +
		"A request may narrow them (`vm-exec --no-network`, `--net-allow RULE`) and a session be locked to fewer " +
		"(`vm-exec --session S --net-lock [RULE…]`), each rule within one of these; never widen them (docs/network.md).",
	"profile.network.allow_ranges": "CIDR ranges of special addresses that allowed names may resolve into, a logged relaxation. " +
		fmt.Sprintf("Only with `mode = %q`.", networkAllowlist),
	"profile.network.max_connections": fmt.Sprintf("Connections open at once per VM, 1 to %d.", maxNetConns),
	"profile.network.max_bytes": fmt.Sprintf("Bytes per VM, both directions together, from 1 byte to %s. ", formatSize(maxOutputLimit)) +
		"The connection that crosses it is closed; the VM runs on.",
	"profile.network.connect_rate": fmt.Sprintf("New connections per minute per VM, 1 to %d, in bursts of up to a tenth of it.", maxNetRate),

	"profile.files.put_max_bytes": fmt.Sprintf("Content bytes of one tree copied into the VM, from 1 byte to %s. ", formatSize(maxOutputLimit)) +
		"A request that declares more is refused before any VM is touched; a stream that carries more is cut off and nothing of it is kept.",
	"profile.files.put_max_files": fmt.Sprintf("Entries (files, directories, symlinks) of one tree copied into the VM, 0 to %d; 0 allows no copying in.", maxFileCount),
	"profile.files.get_max_bytes": fmt.Sprintf("Content bytes of one tree copied out of the VM, from 1 byte to %s. ", formatSize(maxOutputLimit)) +
		"A guest that sends more (a tar bomb) is cut off at the entry that crosses it, and the client keeps nothing.",
	"profile.files.get_max_files": fmt.Sprintf("Entries of one tree copied out of the VM, 0 to %d; 0 allows no copying out.", maxFileCount),

	"profile.admin": "`true`: the profile's callers see every caller's running commands and sessions in `vmgated status` and `vm-exec ps`; " +
		"others see their own. It grants nothing else: not `audit_rotate`.",
	"profile.audit_rotate": "`true`: the profile's local callers may move the audit log aside with `vmgated audit rotate`, as root and vmgated's own user may. " +
		"SSH keys never may. Not allowed with `match.any = true`: rotating starts a new file, so it is an operator's right, not every caller's.",

	"profile.deny.name": fmt.Sprintf("Name of the rule, optional: 1 to %d of `[a-z0-9-]`, unique among the profile's deny and allow rules. ", maxNameLen) +
		"Verdicts name the rule by it.",
	"profile.deny.program": "`argv[0]` is one of these. A name without a slash matches the base name of `argv[0]` (`\"wget\"` matches `/tmp/wget` too); " +
		"a name with a slash must be a clean absolute path and matches `argv[0]` exactly. No globs. An empty list is an error.",
	"profile.deny.args": "One glob per argument, `argv[1]`, `argv[2]`, …: the number of arguments must be equal, " +
		fmt.Sprintf("unless the last element is `%q` or `%q`, which matches any remaining arguments (zero or more). ", restMarker, restMarkerAlt) +
		"`args = []` means no arguments. Globs use `path.Match` syntax, except that `*` and `?` also match `/`.",
	"profile.deny.args_any": "Some argument (`argv[1:]`) matches one of these globs, which use `path.Match` syntax except that `*` and `?` also match `/`. " +
		"An empty list is an error. Arguments after `--` count too.",
	"profile.deny.args_regex": "RE2 regular expression matched against the whole argv joined with single spaces, unanchored unless it anchors itself. " +
		"The joined form cannot tell `[\"a b\"]` from `[\"a\", \"b\"]`: prefer `args` in allow rules.",

	"isolate.seccomp": fmt.Sprintf("`%q`: QEMU does not start without its seccomp allowlist. ", builtinSeccomp) +
		"`\"off\"`: QEMU runs in its jail without it, a logged relaxation. `vmgated serve --seccomp` overrides this key.",
	"isolate.cgroups": fmt.Sprintf("`%q`: each VM's jail gets a cgroup with memory, pids and cpu limits when vmgated has a delegated cgroup (systemd `Delegate=yes`), ", builtinCgroups) +
		"else rlimits only, logged when the daemon starts. `\"required\"`: vmgated does not start without one. " +
		"`\"off\"`: rlimits only, a logged relaxation. Read when the daemon starts; a reload does not change it.",
	"isolate.guest_aslr": fmt.Sprintf("`%q`: guests run without address space randomisation (the kernel's `norandmaps`) under TCG with a QEMU before 8.0, ", builtinGuestASLR) +
		"whose translations are tied to the guest's addresses: there every exec translates its libraries anew, 3-4 times slower, and QEMU's translation cache grows with each. " +
		"A logged relaxation of the guest's own hardening; the VM and its jail are the boundary (docs/security.md). `\"on\"`: always randomised. " +
		"Read when the daemon starts (and by `vmgated image warm`): templates are made for it.",
}
