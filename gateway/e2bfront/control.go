package e2bfront

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
)

// EnvdVersion is the sandbox agent version the door advertises: the SDKs
// use octet-stream uploads and CloseStdin from 0.5.7 on, and leave the
// default user to the sandbox from 0.4.0 on.
const EnvdVersion = "0.5.7"

// baseTemplate is the SDKs' default templateID: the profile's own image.
const baseTemplate = "base"

func (f *Front) routes() http.Handler {
	mux := http.NewServeMux()
	cp := func(pattern string, h func(http.ResponseWriter, *http.Request, *Key)) {
		mux.HandleFunc(pattern, f.withKey(h))
	}
	for _, prefix := range []string{"", "/v2"} {
		cp("POST "+prefix+"/sandboxes", f.create)
		cp("POST "+prefix+"/sandboxes/{id}/connect", f.connect)
	}
	cp("GET /sandboxes", f.listV1)
	cp("GET /v2/sandboxes", f.listV2)
	cp("GET /sandboxes/{id}", f.info)
	cp("DELETE /sandboxes/{id}", f.kill)
	cp("POST /sandboxes/{id}/timeout", f.setTimeout)
	cp("POST /sandboxes/{id}/pause", f.pause)
	cp("POST /sandboxes/{id}/resume", f.resume)
	cp("POST /sandboxes/{id}/fork", f.fork)
	cp("GET /templates/aliases/{alias}", f.alias)
	f.envdRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		cpError(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path+" (docs/e2b.md lists what the door serves)")
	})
	return f.guard(mux)
}

// guard refuses requests whose Host is not the door's own (a web page
// that rebinds a name to the loopback address cannot use the door) and
// cross-origin browser requests; it answers no CORS preflight.
func (f *Front) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !f.hostAllowed(r.Host) {
			cpError(w, http.StatusForbidden, fmt.Sprintf("Host %q is not this door's address", truncate(r.Host, 80)))
			return
		}
		if r.Header.Get("Origin") != "" || r.Method == http.MethodOptions {
			cpError(w, http.StatusForbidden, "browser requests (Origin, OPTIONS) are not served")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// cpError answers a control-plane call with E2B's error body; the SDKs
// read its numeric code.
func cpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

// cpFail answers a control-plane call with the daemon's refusal.
func cpFail(w http.ResponseWriter, what string, err error) {
	status, msg := http.StatusInternalServerError, err.Error()
	var ae *client.APIError
	if errors.As(err, &ae) {
		status, msg = ae.Status, ae.Body.Message()
		if ae.Body.Code == wire.CodeBusy && ae.Status == http.StatusServiceUnavailable {
			// The profile's VM limits: the SDKs show 429's message as a
			// rate limit, without retrying (no Retry-After).
			status = http.StatusTooManyRequests
		}
	}
	cpError(w, status, what+": "+msg)
}

func writeCP(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// withKey authenticates a control-plane call by its API key.
func (f *Front) withKey(h func(http.ResponseWriter, *http.Request, *Key)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		presented := r.Header.Get("X-API-Key")
		if presented == "" {
			cpError(w, http.StatusUnauthorized, "no API key (X-API-Key): set E2B_API_KEY to a key of the door's keys file")
			return
		}
		k := f.keys.Load().Lookup(presented)
		if k == nil {
			f.log.Debug("e2b key not known", "remote", r.RemoteAddr, "key", Fingerprint(presented))
			cpError(w, http.StatusUnauthorized, "API key not known to this door")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, f.cfg.MaxBody)
		h(w, r, k)
	}
}

// decodeBody parses a control-plane body into v; an empty body is {}.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			cpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", mbe.Limit))
		} else {
			cpError(w, http.StatusBadRequest, "request body: "+err.Error())
		}
		return false
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return true
	}
	if err := json.Unmarshal(data, v); err != nil {
		cpError(w, http.StatusBadRequest, "request body: "+err.Error())
		return false
	}
	return true
}

// createBody is what create reads of NewSandbox (v1) and NewSandboxV2.
type createBody struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *struct {
		AllowOut []string `json:"allowOut"`
		DenyOut  []string `json:"denyOut"`
	} `json:"network"`
	AutoPause    *bool           `json:"autoPause"`
	MCP          json.RawMessage `json:"mcp"`
	VolumeMounts json.RawMessage `json:"volumeMounts"`
}

// Bounds of what create keeps.
const (
	maxMetadata = 64
	maxEnvVars  = 256
	maxMetaLen  = 1024
)

// sandboxJSON is E2B's Sandbox (create, connect) and SandboxDetail and
// ListedSandbox (info, list) in one: each reader takes its fields.
type sandboxJSON struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	ClientID        string            `json:"clientID"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	StartedAt       *time.Time        `json:"startedAt,omitempty"`
	EndAt           *time.Time        `json:"endAt,omitempty"`
	State           string            `json:"state,omitempty"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	CPUCount        int               `json:"cpuCount,omitempty"`
	MemoryMB        int               `json:"memoryMB,omitempty"`
	DiskSizeMB      int               `json:"diskSizeMB,omitempty"`
}

func (r *sandboxRecord) created() sandboxJSON {
	return sandboxJSON{SandboxID: r.ID, TemplateID: r.Template, Alias: r.Template, ClientID: "vmgate", EnvdVersion: EnvdVersion,
		EnvdAccessToken: r.Token}
}

func (r *sandboxRecord) detail(s *wire.Session) sandboxJSON {
	j := r.created()
	j.EnvdAccessToken = ""
	start, end := r.StartedAt, r.EndAt
	j.StartedAt, j.EndAt, j.Metadata = &start, &end, r.Metadata
	if j.Metadata == nil {
		j.Metadata = map[string]string{}
	}
	j.State = "running"
	if s != nil && s.State == wire.SessionPaused {
		j.State = "paused"
	}
	return j
}

func (f *Front) create(w http.ResponseWriter, r *http.Request, k *Key) {
	var body createBody
	if !decodeBody(w, r, &body) {
		return
	}
	rec, status, msg := f.newRecord(k, &body)
	if status != 0 {
		cpError(w, status, msg)
		return
	}
	id := caller(k, r.RemoteAddr)
	api := f.apiFor(id)
	ctx := r.Context()
	// The session begins with a command that does nothing, so the
	// sandbox answers its first process at once (the SDKs wait for
	// nothing else).
	// Its environment passes the policy's env rules here, so that a
	// variable the profile refuses fails the create.
	env, secrets := procEnv(rec.Env, nil)
	if _, err := runQuiet(ctx, api, wire.ExecRequest{Argv: []string{"true"}, Shell: true, Session: rec.ID, Image: rec.Image,
		Env: env, Secrets: secrets}); err != nil {
		// Nothing is left of a create that failed.
		_ = api.EndSession(context.WithoutCancel(ctx), rec.ID)
		cpFail(w, "create sandbox", err)
		return
	}
	if rec.AllowOut != nil {
		if _, err := api.LockSessionNet(ctx, rec.ID, *rec.AllowOut); err != nil {
			_ = api.EndSession(context.WithoutCancel(ctx), rec.ID)
			cpFail(w, "narrow the sandbox's network", err)
			return
		}
	}
	if s := f.session(ctx, api, rec.ID); s != nil && !s.Ends.IsZero() && s.Ends.Before(rec.EndAt) {
		// The profile's sessions.max_lifetime comes first.
		rec.EndAt = s.Ends
	}
	f.boxes.add(*rec)
	f.log.Info("e2b sandbox created", "sandbox", rec.ID, "key", k.Fingerprint, "template", rec.Template)
	f.audit(id, rec, fmt.Sprintf("e2b sandbox created: template %s, until %s, %d metadata entries", rec.Template, rec.EndAt.Format(time.RFC3339), len(rec.Metadata)))
	writeCP(w, http.StatusCreated, rec.created())
}

// newRecord checks a create's body and makes the sandbox's record; a
// refusal is a status and its message.
func (f *Front) newRecord(k *Key, b *createBody) (*sandboxRecord, int, string) {
	if len(b.MCP) > 0 && string(b.MCP) != "null" {
		return nil, http.StatusBadRequest, "mcp: the MCP gateway template is not served by vmgate"
	}
	if len(b.VolumeMounts) > 0 && string(b.VolumeMounts) != "null" && string(b.VolumeMounts) != "[]" {
		return nil, http.StatusBadRequest, "volumeMounts: volumes are not served by vmgate"
	}
	if len(b.Metadata) > maxMetadata || len(b.EnvVars) > maxEnvVars {
		return nil, http.StatusBadRequest, fmt.Sprintf("at most %d metadata entries and %d envVars", maxMetadata, maxEnvVars)
	}
	for key, v := range b.Metadata {
		if len(key)+len(v) > maxMetaLen {
			return nil, http.StatusBadRequest, fmt.Sprintf("metadata %q: key and value over %d bytes", truncate(key, 40), maxMetaLen)
		}
	}
	timeout := f.cfg.DefaultTimeout
	if b.Timeout != nil {
		if *b.Timeout <= 0 || *b.Timeout > 1<<31 {
			return nil, http.StatusBadRequest, "timeout: a positive number of seconds"
		}
		timeout = time.Duration(*b.Timeout) * time.Second
	}
	template := b.TemplateID
	if template == "" {
		template = baseTemplate
	}
	image := template
	if template == baseTemplate {
		image = ""
	}
	allow, status, msg := narrowing(b)
	if status != 0 {
		return nil, status, msg
	}
	now := time.Now().UTC()
	return &sandboxRecord{ID: newSandboxID(), Key: k.Fingerprint, Profile: k.Profile, Template: template, Image: image,
		Token: newToken(), Metadata: b.Metadata, Env: b.EnvVars, StartedAt: now, EndAt: now.Add(timeout),
		AutoPause: b.AutoPause != nil && *b.AutoPause, AllowOut: allow}, 0, ""
}

// narrowing is the network a create asks for, as the list of what stays
// allowed (nil: the profile's network). It can only narrow: the
// profile's network decides what each entry may reach.
func narrowing(b *createBody) (*[]string, int, string) {
	var allow *[]string
	if b.AllowInternetAccess != nil && !*b.AllowInternetAccess {
		allow = &[]string{}
	}
	if n := b.Network; n != nil {
		switch {
		case n.AllowOut != nil:
			if allow == nil {
				l := slices.Clone(n.AllowOut)
				allow = &l
			}
		case len(n.DenyOut) > 0:
			if !slices.Contains(n.DenyOut, "0.0.0.0/0") {
				return nil, http.StatusBadRequest, "network.denyOut: only 0.0.0.0/0 (with allowOut for what stays allowed) is served; vmgate's networks are allowlists"
			}
			if allow == nil {
				allow = &[]string{}
			}
		}
	}
	return allow, 0, ""
}

// runQuiet runs a command whose output does not matter and fails unless
// it exits 0.
func runQuiet(ctx context.Context, api *client.Client, req wire.ExecRequest) (*wire.Result, error) {
	res, err := api.Exec(ctx, req, client.ExecIO{Stdout: io.Discard, Stderr: io.Discard})
	if err != nil {
		return nil, err
	}
	if code := res.ExitStatus(); code != 0 {
		return res, fmt.Errorf("the sandbox's first command exited %d", code)
	}
	return res, nil
}

// session returns the daemon's session name, or nil.
func (f *Front) session(ctx context.Context, api *client.Client, name string) *wire.Session {
	all, err := api.Sessions(ctx)
	if err != nil {
		return nil
	}
	for i := range all {
		if all[i].Name == name {
			return &all[i]
		}
	}
	return nil
}

// own looks up the caller's sandbox in the path; a sandbox whose session
// the daemon ended is forgotten. It answers 404 itself.
func (f *Front) own(w http.ResponseWriter, r *http.Request, k *Key) (*sandboxRecord, *wire.Session, *client.Client, bool) {
	sid := r.PathValue("id")
	rec, ok := f.boxes.get(sid, k.Fingerprint)
	if !ok {
		cpError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", truncate(sid, 80)))
		return nil, nil, nil, false
	}
	api := f.apiFor(caller(k, r.RemoteAddr))
	s := f.session(r.Context(), api, rec.ID)
	if s == nil {
		f.boxes.remove(rec.ID)
		cpError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found: its session ended (timeout, sessions.max_lifetime or sessions.idle_timeout)", rec.ID))
		return nil, nil, nil, false
	}
	return &rec, s, api, true
}

func (f *Front) info(w http.ResponseWriter, r *http.Request, k *Key) {
	rec, s, _, ok := f.own(w, r, k)
	if ok {
		writeCP(w, http.StatusOK, rec.detail(s))
	}
}

func (f *Front) kill(w http.ResponseWriter, r *http.Request, k *Key) {
	rec, _, api, ok := f.own(w, r, k)
	if !ok {
		return
	}
	if err := api.EndSession(r.Context(), rec.ID); err != nil && !isNotFound(err) {
		cpFail(w, "kill sandbox", err)
		return
	}
	f.boxes.remove(rec.ID)
	w.WriteHeader(http.StatusNoContent)
}

func isNotFound(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.Body.Code == wire.CodeNotFound
}

// lifetime reads a timeout body ({"timeout": seconds}); ok false when it
// answered.
func (f *Front) lifetime(w http.ResponseWriter, r *http.Request, required bool) (time.Duration, bool) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if !decodeBody(w, r, &body) {
		return 0, false
	}
	switch {
	case body.Timeout == nil && required:
		cpError(w, http.StatusBadRequest, "timeout: required (seconds)")
		return 0, false
	case body.Timeout == nil:
		return f.cfg.DefaultTimeout, true
	case *body.Timeout <= 0 || *body.Timeout > 1<<31:
		cpError(w, http.StatusBadRequest, "timeout: a positive number of seconds")
		return 0, false
	}
	return time.Duration(*body.Timeout) * time.Second, true
}

// endAt is now+d, bounded by the end of the session's lifetime
// (sessions.max_lifetime).
func endAt(d time.Duration, s *wire.Session) time.Time {
	end := time.Now().UTC().Add(d)
	if s != nil && !s.Ends.IsZero() && s.Ends.Before(end) {
		end = s.Ends
	}
	return end
}

func (f *Front) setTimeout(w http.ResponseWriter, r *http.Request, k *Key) {
	d, ok := f.lifetime(w, r, true)
	if !ok {
		return
	}
	rec, s, _, ok := f.own(w, r, k)
	if !ok {
		return
	}
	end := endAt(d, s)
	f.boxes.setEnd(rec.ID, end)
	f.audit(caller(k, r.RemoteAddr), rec, "e2b sandbox timeout: until "+end.Format(time.RFC3339))
	w.WriteHeader(http.StatusNoContent)
}

func (f *Front) pause(w http.ResponseWriter, r *http.Request, k *Key) {
	rec, s, api, ok := f.own(w, r, k)
	if !ok {
		return
	}
	if s.State == wire.SessionPaused {
		cpError(w, http.StatusConflict, fmt.Sprintf("sandbox %q is already paused", rec.ID))
		return
	}
	if _, err := api.PauseSession(r.Context(), rec.ID); err != nil {
		cpFail(w, "pause sandbox", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect resumes a paused sandbox (201) or finds it running (200), and
// sets its deadline.
func (f *Front) connect(w http.ResponseWriter, r *http.Request, k *Key) {
	d, ok := f.lifetime(w, r, false)
	if !ok {
		return
	}
	f.wake(w, r, k, d)
}

// resume is the older SDKs' resume: connect of a paused sandbox.
func (f *Front) resume(w http.ResponseWriter, r *http.Request, k *Key) {
	d, ok := f.lifetime(w, r, false)
	if !ok {
		return
	}
	f.wake(w, r, k, d)
}

func (f *Front) wake(w http.ResponseWriter, r *http.Request, k *Key, d time.Duration) {
	rec, s, api, ok := f.own(w, r, k)
	if !ok {
		return
	}
	status := http.StatusOK
	if s.State == wire.SessionPaused {
		// The session's next command resumes it.
		if _, err := runQuiet(r.Context(), api, wire.ExecRequest{Argv: []string{"true"}, Shell: true, Session: rec.ID}); err != nil {
			cpFail(w, "resume sandbox", err)
			return
		}
		status = http.StatusCreated
		s = f.session(r.Context(), api, rec.ID)
	}
	end := endAt(d, s)
	f.boxes.setEnd(rec.ID, end)
	f.audit(caller(k, r.RemoteAddr), rec, "e2b sandbox connected: until "+end.Format(time.RFC3339))
	writeCP(w, status, rec.created())
}

// fork copies a sandbox into count new ones (POST …/fork {"timeout",
// "count"}); the answer lists each as {"sandbox": …}.
func (f *Front) fork(w http.ResponseWriter, r *http.Request, k *Key) {
	var body struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	n := 1
	if body.Count != nil {
		n = *body.Count
	}
	if n < 1 || n > 16 {
		cpError(w, http.StatusBadRequest, "count: 1 to 16")
		return
	}
	d := f.cfg.DefaultTimeout
	if body.Timeout != nil {
		if *body.Timeout <= 0 || *body.Timeout > 1<<31 {
			cpError(w, http.StatusBadRequest, "timeout: a positive number of seconds")
			return
		}
		d = time.Duration(*body.Timeout) * time.Second
	}
	rec, _, api, ok := f.own(w, r, k)
	if !ok {
		return
	}
	names := make([]string, n)
	for i := range names {
		names[i] = newSandboxID()
	}
	made, err := api.ForkSession(r.Context(), rec.ID, names)
	if err != nil {
		cpFail(w, "fork sandbox", err)
		return
	}
	type forked struct {
		Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	}
	out := make([]forked, 0, len(made))
	for i := range made {
		now := time.Now().UTC()
		c := *rec
		c.ID, c.Token, c.StartedAt, c.EndAt = made[i].Name, newToken(), now, endAt(d, &made[i])
		c.Metadata, c.Env = maps.Clone(rec.Metadata), maps.Clone(rec.Env)
		f.boxes.add(c)
		f.audit(caller(k, r.RemoteAddr), &c, "e2b sandbox forked from "+rec.ID+": until "+c.EndAt.Format(time.RFC3339))
		j := c.created()
		out = append(out, forked{Sandbox: &j})
	}
	writeCP(w, http.StatusCreated, out)
}

// listV1 is GET /sandboxes: the key's running sandboxes.
func (f *Front) listV1(w http.ResponseWriter, r *http.Request, k *Key) {
	rows, err := f.rows(r, k)
	if err != nil {
		cpFail(w, "list sandboxes", err)
		return
	}
	out := []sandboxJSON{}
	for _, row := range rows {
		if row.State == "running" {
			out = append(out, row)
		}
	}
	writeCP(w, http.StatusOK, out)
}

// listV2 is GET /v2/sandboxes: ?state=running,paused &metadata=k%3Dv
// &limit=N &nextToken=T, the next page's token in X-Next-Token.
func (f *Front) listV2(w http.ResponseWriter, r *http.Request, k *Key) {
	q := r.URL.Query()
	limit := f.cfg.MaxPage
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > f.cfg.MaxPage {
			cpError(w, http.StatusBadRequest, fmt.Sprintf("limit: 1 to %d", f.cfg.MaxPage))
			return
		}
		limit = n
	}
	states := map[string]bool{}
	for _, s := range strings.Split(q.Get("state"), ",") {
		if s = strings.TrimSpace(s); s != "" {
			if s != "running" && s != "paused" {
				cpError(w, http.StatusBadRequest, fmt.Sprintf("state %q: running or paused", truncate(s, 40)))
				return
			}
			states[s] = true
		}
	}
	meta, err := parseMetadataQuery(q.Get("metadata"))
	if err != nil {
		cpError(w, http.StatusBadRequest, err.Error())
		return
	}
	rows, err := f.rows(r, k)
	if err != nil {
		cpFail(w, "list sandboxes", err)
		return
	}
	next := q.Get("nextToken")
	out := []sandboxJSON{}
	for _, row := range rows {
		if next != "" && row.SandboxID <= next {
			continue
		}
		if len(states) > 0 && !states[row.State] || !hasMetadata(row.Metadata, meta) {
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", out[len(out)-1].SandboxID)
			break
		}
		out = append(out, row)
	}
	writeCP(w, http.StatusOK, out)
}

// rows are the key's sandboxes as listed, in id order; sandboxes whose
// session is gone are forgotten.
func (f *Front) rows(r *http.Request, k *Key) ([]sandboxJSON, error) {
	api := f.apiFor(caller(k, r.RemoteAddr))
	all, err := api.Sessions(r.Context())
	if err != nil {
		return nil, err
	}
	byName := map[string]*wire.Session{}
	for i := range all {
		byName[all[i].Name] = &all[i]
	}
	var out []sandboxJSON
	for _, rec := range f.boxes.list(k.Fingerprint) {
		s, ok := byName[rec.ID]
		if !ok {
			f.boxes.remove(rec.ID)
			continue
		}
		out = append(out, rec.detail(s))
	}
	slices.SortFunc(out, func(a, b sandboxJSON) int { return strings.Compare(a.SandboxID, b.SandboxID) })
	return out, nil
}

// parseMetadataQuery reads list's metadata filter: a query string of
// its own (k=v&k2=v2), each key and value escaped once more.
func parseMetadataQuery(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(s)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	out := map[string]string{}
	for k, vs := range vals {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(vs[len(vs)-1])
		if err1 != nil || err2 != nil {
			return nil, errors.New("metadata: a key or value is not escaped right")
		}
		out[key] = val
	}
	return out, nil
}

func hasMetadata(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// alias answers whether a template name is one the key's profile may
// use ("base": its own image).
func (f *Front) alias(w http.ResponseWriter, r *http.Request, k *Key) {
	name := r.PathValue("alias")
	if !f.templateAllowed(k, name) {
		cpError(w, http.StatusNotFound, fmt.Sprintf("template %q is not among profile %s's images", truncate(name, 80), k.Profile))
		return
	}
	writeCP(w, http.StatusOK, map[string]any{"templateID": name, "public": false})
}

// templateAllowed reports whether the key's profile lists the image.
func (f *Front) templateAllowed(k *Key, name string) bool {
	if name == baseTemplate {
		return true
	}
	return slices.ContainsFunc(f.core.Policy().Images(), func(pi policy.ProfileImage) bool { return pi.Profile == k.Profile && pi.Image == name })
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// expire ends a sandbox whose deadline passed, or pauses it when it was
// created with autoPause. A paused sandbox has no deadline (as in E2B).
func (f *Front) expire(sid string) {
	rec, ok := f.boxes.peek(sid)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	api := f.apiFor(policy.Identity{SSH: &policy.SSHKey{Door: policy.DoorE2B, Profile: rec.Profile, Fingerprint: rec.Key}})
	s := f.session(ctx, api, sid)
	switch {
	case s == nil:
		f.boxes.remove(sid)
	case s.State == wire.SessionPaused:
	case rec.AutoPause:
		if _, err := api.PauseSession(ctx, sid); err != nil {
			f.log.Error("e2b sandbox timed out and could not be paused", "sandbox", sid, "err", err)
			return
		}
		f.log.Info("e2b sandbox timed out and was paused", "sandbox", sid)
		f.audit(policy.Identity{SSH: &policy.SSHKey{Door: policy.DoorE2B, Profile: rec.Profile, Fingerprint: rec.Key}}, &rec, "e2b sandbox timed out: paused (autoPause)")
	default:
		if err := api.EndSession(ctx, sid); err != nil && !isNotFound(err) {
			f.log.Error("e2b sandbox timed out and could not be ended", "sandbox", sid, "err", err)
			return
		}
		f.boxes.remove(sid)
		f.log.Info("e2b sandbox timed out and was ended", "sandbox", sid)
		f.audit(policy.Identity{SSH: &policy.SSHKey{Door: policy.DoorE2B, Profile: rec.Profile, Fingerprint: rec.Key}}, &rec, "e2b sandbox timed out: ended")
	}
}

// audit records a lifecycle call the daemon's own records do not tell of
// (a deadline set or passed, a connect, a create's template and
// metadata): the session, the key's fingerprint, the message.
func (f *Front) audit(id policy.Identity, rec *sandboxRecord, msg string) {
	k := id.SSH
	r := audit.Record{Kind: audit.KindSession, Session: rec.ID, Profile: rec.Profile, Message: msg,
		SSH: &audit.SSHClient{Door: k.Door, Fingerprint: k.Fingerprint, Comment: k.Comment, Remote: k.RemoteAddr}}
	if err := f.core.Audit(r); err != nil {
		f.log.Error("audit an e2b call", "sandbox", rec.ID, "err", err)
	}
}
