package policy

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// document is the policy file as decoded, before validation. Every key is a
// pointer (or a nil slice) so that "unset" differs from "zero": unset keys
// inherit, zero values are validated.
type document struct {
	Version  *int64       `toml:"version"`
	Defaults *settingsDoc `toml:"defaults"`
	Profiles []profileDoc `toml:"profile"`
	Isolate  *isolateDoc  `toml:"isolate"`
	Secrets  []secretDoc  `toml:"secret"`
}

// isolateDoc is the [isolate] table: how the daemon jails QEMU.
type isolateDoc struct {
	Seccomp   *string `toml:"seccomp"`
	Cgroups   *string `toml:"cgroups"`
	GuestASLR *string `toml:"guest_aslr"`
}

// settingsDoc holds the keys shared by [defaults] and [[profile]].
type settingsDoc struct {
	Image       *string      `toml:"image"`
	Images      *[]string    `toml:"images"`
	User        *string      `toml:"user"`
	Users       *[]string    `toml:"users"`
	MemoryMiB   *int64       `toml:"memory_mib"`
	DiskMiB     *int64       `toml:"disk_mib"`
	CPUs        *int64       `toml:"cpus"`
	MaxVMs      *int64       `toml:"max_vms"`
	CallerVMs   *int64       `toml:"max_vms_per_caller"`
	CallerQueue *int64       `toml:"max_queued_per_caller"`
	OutputLimit *sizeValue   `toml:"output_limit"`
	AllowShell  *bool        `toml:"allow_shell"`
	Env         *[]string    `toml:"env"`
	Timeout     *timeoutDoc  `toml:"timeout"`
	Sessions    *sessionsDoc `toml:"sessions"`
	Network     *networkDoc  `toml:"network"`
	Files       *filesDoc    `toml:"files"`
	Secrets     *[]string    `toml:"secrets"`
}

type filesDoc struct {
	PutMaxBytes *sizeValue `toml:"put_max_bytes"`
	PutMaxFiles *int64     `toml:"put_max_files"`
	GetMaxBytes *sizeValue `toml:"get_max_bytes"`
	GetMaxFiles *int64     `toml:"get_max_files"`
}

type timeoutDoc struct {
	Default *string `toml:"default"`
	Max     *string `toml:"max"`
}

type sessionsDoc struct {
	Allowed      *bool   `toml:"allowed"`
	IdleTimeout  *string `toml:"idle_timeout"`
	MaxLifetime  *string `toml:"max_lifetime"`
	PauseAfter   *string `toml:"pause_after"`
	MaxPaused    *int64  `toml:"max_paused"`
	MaxPausedMiB *int64  `toml:"max_paused_mib"`
	// Publish, PublishAnyAddress, PublishMaxConns and PublishIdle: a session's ports
	// on the host (vm-exec --publish).
	Publish           *bool   `toml:"publish"`
	PublishAnyAddress *bool   `toml:"publish_any_address"`
	PublishMaxConns   *int64  `toml:"publish_max_conns"`
	PublishIdle       *string `toml:"publish_idle"`
	// MaxCommands, MaxProcesses and ProcessBuffer: what runs in a
	// session at once (commands, background processes) and how much of
	// a background process's output is kept.
	MaxCommands   *int64     `toml:"max_commands"`
	MaxProcesses  *int64     `toml:"max_processes"`
	ProcessBuffer *sizeValue `toml:"process_buffer"`
}

type networkDoc struct {
	Mode           *string    `toml:"mode"`
	Allow          *[]string  `toml:"allow"`
	AllowRanges    *[]string  `toml:"allow_ranges"`
	MaxConnections *int64     `toml:"max_connections"`
	MaxBytes       *sizeValue `toml:"max_bytes"`
	ConnectRate    *int64     `toml:"connect_rate"`
}

type profileDoc struct {
	Name        *string   `toml:"name"`
	Admin       *bool     `toml:"admin"`
	AuditRotate *bool     `toml:"audit_rotate"`
	Match       *matchDoc `toml:"match"`
	settingsDoc           // flattened: the same keys as [defaults]
	Deny        []ruleDoc `toml:"deny"`
	Allow       []ruleDoc `toml:"allow"`
}

type matchDoc struct {
	Any    *bool     `toml:"any"`
	UIDs   *[]int64  `toml:"uids"`
	Users  *[]string `toml:"users"`
	GIDs   *[]int64  `toml:"gids"`
	Groups *[]string `toml:"groups"`
	SSH    *bool     `toml:"ssh"`
	E2B    *bool     `toml:"e2b"`
}

type ruleDoc struct {
	Name      *string   `toml:"name"`
	Program   *[]string `toml:"program"`
	Args      *[]string `toml:"args"`
	ArgsAny   *[]string `toml:"args_any"`
	ArgsRegex *string   `toml:"args_regex"`
}

// sizeValue is a byte count written either as a TOML integer or as a string
// with an optional binary unit ("1MiB"). It is checked in validation, so that
// a bad unit is reported with its key path like any other value.
type sizeValue struct {
	n      int64
	s      string
	isText bool
}

// UnmarshalTOML implements toml.Unmarshaler. Errors become toml.ParseError
// values with the key's position.
func (v *sizeValue) UnmarshalTOML(data any) error {
	switch d := data.(type) {
	case int64:
		*v = sizeValue{n: d}
	case string:
		*v = sizeValue{s: d, isText: true}
	default:
		return fmt.Errorf("expected an integer number of bytes or a string like \"1MiB\", found %s", tomlTypeName(data))
	}
	return nil
}

// tomlTypeName names the TOML type of a value as toml decodes it.
func tomlTypeName(v any) string {
	switch v.(type) {
	case bool:
		return "a boolean"
	case float64:
		return "a float"
	case []any:
		return "an array"
	case map[string]any, []map[string]any:
		return "a table"
	case time.Time:
		return "a datetime"
	}
	return fmt.Sprintf("a %T", v)
}

// String formats v as it was written.
func (v sizeValue) String() string {
	if v.isText {
		return strconv.Quote(v.s)
	}
	return strconv.FormatInt(v.n, 10)
}

// decode strictly decodes data into a document. name prefixes every error.
// A syntax error carries the toml.ParseError (errors.As finds it) and its
// source context; type errors and unknown keys are reported as name:line.
func decode(name string, data []byte) (*document, error) {
	var doc document
	md, err := toml.Decode(string(data), &doc)
	if err != nil {
		return nil, decodeError(name, string(data), &md, err)
	}
	if err := unknownKeys(name, string(data), &md); err != nil {
		return nil, err
	}
	return &doc, nil
}

// posError is a decoding error at a known position.
type posError struct {
	file    string
	line    int
	col     int
	msg     string
	context string // source lines with a caret, may be empty
	err     error
}

func (e *posError) Error() string {
	var b strings.Builder
	b.WriteString(e.file)
	if e.line > 0 {
		fmt.Fprintf(&b, ":%d", e.line)
		if e.col > 0 {
			fmt.Fprintf(&b, ":%d", e.col)
		}
	}
	b.WriteString(": ")
	b.WriteString(e.msg)
	if e.context != "" {
		b.WriteString("\n")
		b.WriteString(e.context)
	}
	return b.String()
}

func (e *posError) Unwrap() error { return e.err }

// typeErrorRE matches the errors that toml's decoder builds with fmt for type
// mismatches ("toml: line 7 (last key \"profile.cpus\"): incompatible
// types: …"); a change of wording only loses the line split, not the message.
var typeErrorRE = regexp.MustCompile(`^toml: (?:line (\d+) )?\(last key "((?:[^"\\]|\\.)*)"\): (.*)$`)

func decodeError(name, data string, md *toml.MetaData, err error) error {
	var perr toml.ParseError
	if errors.As(err, &perr) {
		e := &posError{
			file:    name,
			line:    perr.Position.Line,
			col:     perr.Position.Col,
			msg:     parseErrorMessage(perr),
			context: parseErrorContext(perr),
			err:     err,
		}
		if line := refineLine(data, md, perr.LastKey, e.line); line != e.line {
			// The context shows the library's position: drop it.
			e.line, e.col, e.context = line, 0, ""
		}
		return e
	}
	if m := typeErrorRE.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		key, uerr := strconv.Unquote(`"` + m[2] + `"`)
		if uerr != nil {
			key = m[2]
		}
		return &posError{file: name, line: refineLine(data, md, key, line), msg: key + ": " + m[3], err: err}
	}
	return &posError{file: name, msg: strings.TrimPrefix(err.Error(), "toml: "), err: err}
}

// refineLine corrects the line of an error that decoding (not parsing)
// reported at key. toml knows one position per key path, where it was last
// set; when several [[profile]] tables set the key, that is often not the
// one in error. Decoding the profiles one by one finds the one in error, and
// a search of its lines finds the key. Returns line if that fails.
func refineLine(data string, md *toml.MetaData, key string, line int) int {
	k := strings.Split(key, ".")
	if len(k) < 2 || k[0] != "profile" || countKey(md, k) < 2 {
		return line
	}
	var d struct {
		Profile []toml.Primitive `toml:"profile"`
	}
	pmd, err := toml.Decode(data, &d)
	if err != nil {
		return line
	}
	for i, prim := range d.Profile {
		var pd profileDoc
		if pmd.PrimitiveDecode(prim, &pd) != nil {
			if l := profileKeyLines(data, len(d.Profile), k)[i]; l > 0 {
				return l
			}
			break
		}
	}
	return line
}

func countKey(md *toml.MetaData, k []string) int {
	n := 0
	for _, mk := range md.Keys() {
		if slices.Equal([]string(mk), k) {
			n++
		}
	}
	return n
}

var profileHeaderRE = regexp.MustCompile(`^\s*\[\[\s*profile\s*\]\]\s*(#.*)?$`)

// profileKeyLines returns, for each of the n [[profile]] tables, the line
// that sets key k (["profile", "timeout", "max"]), or 0. It is a textual
// search, used only to place messages: it finds the [[profile]] headers
// (all zeros unless there are exactly n), then in each profile's lines the
// first that names k[1], then from there the first that assigns k's last
// part.
func profileKeyLines(data string, n int, k []string) []int {
	out := make([]int, n)
	lines := strings.Split(data, "\n")
	var headers []int
	for i, l := range lines {
		if profileHeaderRE.MatchString(l) {
			headers = append(headers, i)
		}
	}
	if len(headers) != n || len(k) < 2 {
		return out
	}
	last := k[len(k)-1]
	assign := regexp.MustCompile(`(^|[\s{,.])"?` + regexp.QuoteMeta(last) + `"?\s*=`)
	for j, from := range headers {
		to := len(lines)
		if j+1 < n {
			to = headers[j+1]
		}
		if len(k) > 2 {
			for from < to && !strings.Contains(lines[from], k[1]) {
				from++
			}
		}
		for i := from; i < to; i++ {
			if assign.MatchString(lines[i]) {
				out[j] = i + 1
				break
			}
		}
	}
	return out
}

// parseErrorMessage is perr's message with the key it concerns. For errors
// raised while decoding a value (such as output_limit), LastKey names it.
func parseErrorMessage(perr toml.ParseError) string {
	msg := strings.TrimSuffix(perr.Message, ".")
	if perr.LastKey != "" && !strings.Contains(msg, perr.LastKey) {
		msg = perr.LastKey + ": " + msg
	}
	return msg
}

// parseErrorContext returns the source lines and caret that
// toml.ParseError.ErrorWithPosition prints after its header, or the whole
// text if its layout is not the expected one.
func parseErrorContext(perr toml.ParseError) (ctx string) {
	defer func() {
		// ErrorWithPosition indexes lines by the reported position; never
		// let a position past the input turn an error into a panic.
		if recover() != nil {
			ctx = ""
		}
	}()
	full := perr.ErrorWithPosition()
	parts := strings.SplitN(full, "\n\n", 3)
	if len(parts) == 3 && strings.HasPrefix(parts[1], "At line") {
		return strings.TrimRight(parts[2], "\n")
	}
	return strings.TrimRight(full, "\n")
}

// unknownKeys reports every key of the document that the schema does not
// define, with its line. Keys are compared exactly: the toml decoder matches
// struct fields case-insensitively, so "Name" would otherwise be accepted as
// "name".
func unknownKeys(name, data string, md *toml.MetaData) error {
	var unknown []toml.Key
	seen := map[string]int{}
	add := func(k toml.Key) {
		s := k.String()
		if _, ok := seen[s]; !ok {
			unknown = append(unknown, k)
		}
		seen[s]++
	}
	for _, k := range md.Keys() {
		if !schemaKeys.has(k) {
			// Report the outermost unknown key only: [profile.bogus] with
			// keys below it is one mistake, not several.
			if len(k) > 1 && !schemaKeys.has(k[:len(k)-1]) {
				continue
			}
			add(k)
		}
	}
	// A safety net: everything undecoded is unknown to the schema too.
	for _, k := range md.Undecoded() {
		if _, ok := seen[k.String()]; !ok && schemaKeys.has(k[:len(k)-1]) {
			add(k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	// Each key is placed by decoding the file again: report the first few.
	const maxReported = 20
	more := len(unknown) - maxReported
	if more > 0 {
		unknown = unknown[:maxReported]
	}
	errs := make([]error, 0, len(unknown)+1)
	for _, k := range unknown {
		msg := fmt.Sprintf("unknown key %s", k)
		if hint := schemaKeys.suggest(k); hint != "" {
			msg += " (" + hint + ")"
		}
		n := seen[k.String()]
		if n == 1 {
			errs = append(errs, &posError{file: name, line: keyLine(data, md, k), msg: msg})
			continue
		}
		// The same key in several [[profile]] tables: place each one.
		var lines []int
		if k[0] == "profile" {
			for _, l := range profileKeyLines(data, countKey(md, []string{"profile"}), k) {
				if l > 0 {
					lines = append(lines, l)
				}
			}
		}
		if len(lines) != n {
			msg += fmt.Sprintf(" (%d times; the line is that of the last)", n)
			errs = append(errs, &posError{file: name, line: keyLine(data, md, k), msg: msg})
			continue
		}
		for _, l := range lines {
			errs = append(errs, &posError{file: name, line: l, msg: msg})
		}
	}
	if more > 0 {
		errs = append(errs, &posError{file: name, msg: fmt.Sprintf("%d more unknown keys", more)})
	}
	return errors.Join(errs...)
}

// schemaNode is the tree of keys that document defines, built once from its
// toml tags.
type schemaNode map[string]schemaNode

var schemaKeys = schemaOf(reflect.TypeFor[document]())

func schemaOf(t reflect.Type) schemaNode {
	n := schemaNode{}
	addSchemaFields(n, t)
	return n
}

func addSchemaFields(n schemaNode, t reflect.Type) {
	for f := range t.Fields() {
		tag := f.Tag.Get("toml")
		if f.Anonymous && tag == "" {
			addSchemaFields(n, f.Type)
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[sizeValue]() {
			n[tag] = schemaOf(ft)
		} else {
			n[tag] = nil
		}
	}
}

func (n schemaNode) has(k toml.Key) bool {
	for i, part := range k {
		child, ok := n[part]
		if !ok {
			return false
		}
		if child == nil && i < len(k)-1 {
			return false // a value, not a table
		}
		n = child
	}
	return true
}

// suggest returns a hint for unknown key k: a known key next to it that
// differs in case or by a small edit, or "".
func (n schemaNode) suggest(k toml.Key) string {
	for _, part := range k[:len(k)-1] {
		n = n[part]
	}
	last := k[len(k)-1]
	if len(last) > 64 {
		return ""
	}
	if len(k) == 1 {
		// A [table] header after [[profile]] starts a top-level table,
		// not a profile's: write [profile.timeout].
		if _, ok := n["profile"][last]; ok {
			return "a [" + last + "] header after [[profile]] starts a top-level table; did you mean [profile." + last + "]?"
		}
	}
	var best string
	bestDist := 3
	for name := range n {
		d := editDistance(strings.ToLower(last), name)
		if d < bestDist || d == bestDist && name < best {
			best, bestDist = name, d
		}
	}
	if best == "" {
		return ""
	}
	return "did you mean " + strings.Join(append(slices.Clone([]string(k[:len(k)-1])), best), ".") + "?"
}

// editDistance is the Levenshtein distance of short ASCII strings.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// keyLine returns the line on which key k is defined, or 0. MetaData keeps
// key positions but does not export them; they surface in the ParseError of
// a value that refuses to decode. So decode data again into a type that has
// only the path to k, ending in a field that always fails. For a key inside
// an array of tables the parser remembers the last occurrence only.
func keyLine(data string, md *toml.MetaData, k toml.Key) int {
	tagOK := func(part string) bool {
		return part != "" && part != "-" && !strings.Contains(part, ",")
	}
	t := reflect.TypeFor[keyProbe]()
	for i := len(k) - 1; i >= 0; i-- {
		part := k[i]
		if !tagOK(part) {
			return 0 // cannot be spelled as a toml struct tag
		}
		if i < len(k)-1 {
			switch md.Type(k[:i+1]...) {
			case "ArrayHash", "Array":
				t = reflect.SliceOf(t)
			}
		}
		fields := []reflect.StructField{{
			Name: "F",
			Type: t,
			Tag:  reflect.StructTag(`toml:` + strconv.Quote(part)),
		}}
		if i == len(k)-1 {
			// toml falls back to a case-insensitive match of field names:
			// give every sibling key a field of its own, so that "name"
			// does not land in the probe for "Name".
			seen := map[string]bool{part: true}
			for _, sib := range md.Keys() {
				if len(sib) != len(k) || !slices.Equal(sib[:i], k[:i]) {
					continue
				}
				if s := sib[i]; !seen[s] && tagOK(s) {
					seen[s] = true
					fields = append(fields, reflect.StructField{
						Name: fmt.Sprintf("S%d", len(fields)),
						Type: reflect.TypeFor[any](),
						Tag:  reflect.StructTag(`toml:` + strconv.Quote(s)),
					})
				}
			}
		}
		t = reflect.StructOf(fields)
	}
	_, err := toml.Decode(data, reflect.New(t).Interface())
	var perr toml.ParseError
	if !errors.As(err, &perr) || perr.Message != errKeyProbe.Error() || perr.LastKey != k.String() {
		return 0
	}
	return perr.Position.Line
}

var errKeyProbe = errors.New("key probe")

type keyProbe struct{}

func (*keyProbe) UnmarshalTOML(any) error { return errKeyProbe }
