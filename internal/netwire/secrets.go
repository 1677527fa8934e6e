package netwire

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/url"
	"strings"
)

// Secrets a guest knows only by placeholders. The netstack forwards a
// request to a host a secret is bound to with the secret's placeholder
// replaced by its value, in the places the secret allows (header fields
// it names, the query if it says so); a placeholder anywhere else (another
// header, the path, a body, a request to another host, a connection that
// is not HTTP) stops the connection before the bytes that hold it go out.
// What comes back from a bound host is watched for the value: a server
// that echoes it back is cut off before it reaches the guest.

// MaxCheckedBody bounds a request body that is read whole and checked
// before its request is forwarded (CopyRequestsSecrets); a longer or
// chunked body is watched as it streams, and its request cut at a
// placeholder.
const MaxCheckedBody = 1 << 20

// Secret is one secret as the netstack applies it.
type Secret struct {
	Name        string
	Placeholder string
	Value       string
	// Headers are the header fields whose values may hold the
	// placeholder (names, case-insensitive); Query allows the request
	// target's query.
	Headers []string
	Query   bool
}

// Found is a placeholder (or, coming back, a value) where it may not be.
type Found struct {
	Secret string // the secret's name
	Place  string // "header X-Token", "path", "query", "body", …
}

func (f *Found) Error() string {
	return fmt.Sprintf("secret %s: its placeholder in the %s, where it may not go", f.Secret, f.Place)
}

// Secrets are what one connection is forwarded under: Bound, whose
// placeholders are replaced (the connection's host is theirs), and All,
// every secret of the VM, whose placeholders may appear nowhere else.
type Secrets struct {
	Bound []Secret
	All   []Secret
}

func (s *Secrets) bound(name string) *Secret {
	for i := range s.Bound {
		if s.Bound[i].Name == name {
			return &s.Bound[i]
		}
	}
	return nil
}

// firstIn returns the secret of All whose placeholder s holds, or nil.
func (s *Secrets) firstIn(v string) *Secret {
	for i := range s.All {
		if strings.Contains(v, s.All[i].Placeholder) {
			return &s.All[i]
		}
	}
	return nil
}

// rewrite replaces the bound secrets' placeholders in h where they may
// be, and finds any placeholder anywhere else.
func (s *Secrets) rewrite(h *requestHead) *Found {
	if sec := s.firstIn(h.method); sec != nil {
		return &Found{sec.Name, "method"}
	}
	path, query, hasQuery := strings.Cut(h.target.rest, "?")
	if sec := s.firstIn(path); sec != nil {
		return &Found{sec.Name, "path"}
	}
	if sec := s.firstIn(h.target.auth.String()); sec != nil {
		return &Found{sec.Name, "request target"}
	}
	for hasQuery {
		sec := s.firstIn(query)
		if sec == nil {
			break
		}
		b := s.bound(sec.Name)
		if b == nil || !b.Query {
			return &Found{sec.Name, "query"}
		}
		query = strings.ReplaceAll(query, b.Placeholder, url.QueryEscape(b.Value))
	}
	if hasQuery {
		h.target.rest = path + "?" + query
	}
	for i := range h.fields {
		f := &h.fields[i]
		if sec := s.firstIn(f.name); sec != nil {
			return &Found{sec.Name, "header name"}
		}
		for {
			sec := s.firstIn(f.value)
			if sec == nil {
				break
			}
			b := s.bound(sec.Name)
			if b == nil || !allowsHeader(b, f.name) {
				return &Found{sec.Name, "header " + f.name}
			}
			f.value = strings.ReplaceAll(f.value, b.Placeholder, b.Value)
		}
	}
	return nil
}

func allowsHeader(s *Secret, name string) bool {
	for _, h := range s.Headers {
		if strings.EqualFold(h, name) {
			return true
		}
	}
	return false
}

// CopyRequestsSecrets is CopyRequests that also applies s: each request
// head is rewritten (rewrite), and the bodies, chunk framing and trailers
// are watched for placeholders. found names the secret when one stopped
// the connection. On a connection to a bound host a request asks for an
// answer without content coding (Accept-Encoding: identity), so that what
// comes back can be watched for the values (NewValueGuard).
func CopyRequestsSecrets(out io.Writer, in *bufio.Reader, host string, s *Secrets) (why string, found *Found) {
	return copyRequests(out, in, host, s)
}

// identityOnly makes the head ask for an answer without content coding.
func (h *requestHead) identityOnly() {
	var fields []field
	for _, f := range h.fields {
		if !strings.EqualFold(f.name, "accept-encoding") {
			fields = append(fields, f)
		}
	}
	h.fields = append(fields, field{name: "Accept-Encoding", value: "identity"})
}

// Guard is a writer that passes bytes on until one of its secrets'
// placeholders (or, with Values, their values) shows in them, across
// writes; then it writes nothing more. The bytes before the one that
// completes the match have gone out: a part of a placeholder is as
// useless as the whole.
type Guard struct {
	w      io.Writer
	needle []string
	names  []string
	place  string
	max    int
	carry  []byte
	found  *Found
}

// NewGuard watches for the placeholders of secrets.
func NewGuard(w io.Writer, secrets []Secret, place string) *Guard {
	g := &Guard{w: w, place: place}
	for _, s := range secrets {
		g.add(s.Name, s.Placeholder)
	}
	return g
}

// NewValueGuard watches for the values of secrets (what a bound host
// sends back).
func NewValueGuard(w io.Writer, secrets []Secret, place string) *Guard {
	g := &Guard{w: w, place: place}
	for _, s := range secrets {
		g.add(s.Name, s.Value)
	}
	return g
}

func (g *Guard) add(name, needle string) {
	if needle == "" {
		return
	}
	g.needle, g.names = append(g.needle, needle), append(g.names, name)
	g.max = max(g.max, len(needle))
}

// Found is what stopped the guard, or nil.
func (g *Guard) Found() *Found { return g.found }

func (g *Guard) Write(p []byte) (int, error) {
	if g.found != nil {
		return 0, g.found
	}
	if len(g.needle) == 0 {
		return g.w.Write(p)
	}
	data := append(g.carry, p...)
	for i, n := range g.needle {
		if bytes.Contains(data, []byte(n)) {
			g.found = &Found{Secret: g.names[i], Place: g.place}
			return 0, g.found
		}
	}
	n, err := g.w.Write(p)
	if keep := g.max - 1; len(data) > keep {
		data = data[len(data)-keep:]
	}
	g.carry = append(g.carry[:0], data...)
	return n, err
}
