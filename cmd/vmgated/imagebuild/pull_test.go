package imagebuild

import (
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/vmgate/vmgate/vm/image"
)

// testRegistry serves an in-process registry on loopback, behind wrap
// (nil: none), and returns its host:port.
func testRegistry(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

// basicAuth lets only user:pass through.
func basicAuth(user, pass string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"who are you"}]}`, http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// pushIndex pushes img (linux/amd64) and an arm64 image beside it as
// an index tagged ref, and returns the index.
func pushIndex(t *testing.T, ref string, img v1.Image, opts ...remote.Option) v1.ImageIndex {
	t.Helper()
	arm := testImage(t, "arm64", testLayer(t, []tfile{{name: "arm", body: "arm"}}))
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &Platform}})
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx, append(opts, remote.WithContext(t.Context()))...); err != nil {
		t.Fatal(err)
	}
	return idx
}

// TestPull: an image pushed to a registry on loopback, plain and behind
// basic auth (credentials from the Docker config file), by tag and by
// digest, unpacks as the layout does, and its source names the
// reference, the amd64 manifest's digest and the platform.
func TestPull(t *testing.T) {
	img, want := multiLayerImage(t)
	plain := testRegistry(t, nil)
	authed := testRegistry(t, basicAuth("vm", "gate"))
	pushIndex(t, plain+"/tools/multi:1", img)
	pushIndex(t, authed+"/tools/multi:1", img, remote.WithAuth(&authn.Basic{Username: "vm", Password: "gate"}))

	// Credentials as docker login writes them.
	cfgDir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte("vm:gate"))
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, authed, auth), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", cfgDir)

	digest := digestOf(t, img)
	for _, ref := range []string{
		plain + "/tools/multi:1",
		plain + "/tools/multi@" + digest,
		authed + "/tools/multi:1",
	} {
		t.Run(ref, func(t *testing.T) {
			src, err := openRemote(t.Context(), PullOptions{ImportOptions: ImportOptions{Source: ref}})
			if err != nil {
				t.Fatal(err)
			}
			r, _ := name.ParseReference(ref)
			ws := image.Source{Kind: image.SourceRegistry, Reference: r.Name(), ManifestDigest: digest, ConfigDigest: configDigestOf(t, img),
				Platform: "linux/amd64", Env: []string{"PATH=/bin:/usr/bin", "GREETING=hello"}, WorkingDir: "/work", User: "1000:1000"}
			if !reflect.DeepEqual(src.source, ws) {
				t.Errorf("source:\n%+v\nwant\n%+v", src.source, ws)
			}
			root, err := unpackInto(t, src, testLimits, false)
			if err != nil {
				t.Fatal(err)
			}
			if got := tree(t, root); !reflect.DeepEqual(got, want) {
				t.Errorf("tree:\n%v\nwant\n%v", brief(got), brief(want))
			}
		})
	}
	// Without credentials the registry's refusal is said.
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	_, err := openRemote(t.Context(), PullOptions{ImportOptions: ImportOptions{Source: authed + "/tools/multi:1"}})
	if err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") {
		t.Errorf("pull without credentials: %v", err)
	}
}

// TestPullBadRegistry: a registry that answers slowly, stops sending, or
// sends garbage or too much is bounded by time and bytes, and says so.
func TestPullBadRegistry(t *testing.T) {
	img := testImage(t, "amd64", testLayer(t, []tfile{{name: "etc/passwd", body: strings.Repeat("x", 1<<20)}}))
	fast := testRegistry(t, nil)
	pushIndex(t, fast+"/r/img:1", img)
	// Each misbehaving registry passes the real one's answers through
	// but for what it breaks.
	proxyTo := func(t *testing.T, bad func(w http.ResponseWriter, r *http.Request) bool) string {
		target := "http://" + fast
		return testRegistry(t, func(http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if bad(w, r) {
					return
				}
				req, _ := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.String(), nil)
				req.Header = r.Header.Clone()
				resp, err := http.DefaultTransport.RoundTrip(req)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadGateway)
					return
				}
				defer resp.Body.Close()
				for k, v := range resp.Header {
					w.Header()[k] = v
				}
				w.WriteHeader(resp.StatusCode)
				_, _ = io.Copy(w, resp.Body)
			})
		})
	}
	isBlob := func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/blobs/") }
	isManifest := func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/manifests/") }
	for _, tc := range []struct {
		name string
		bad  func(w http.ResponseWriter, r *http.Request) bool
		want string
	}{
		{"slow to answer", func(w http.ResponseWriter, r *http.Request) bool {
			if isManifest(r) {
				select {
				case <-time.After(5 * time.Second):
				case <-r.Context().Done():
				}
			}
			return false
		}, "timeout awaiting response headers"},
		{"stops sending a layer", func(w http.ResponseWriter, r *http.Request) bool {
			if !isBlob(r) || r.Method != http.MethodGet {
				return false
			}
			w.Header().Set("Content-Length", "2000000")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte{0x1f, 0x8b})
			w.(http.Flusher).Flush()
			select {
			case <-time.After(5 * time.Second):
			case <-r.Context().Done():
			}
			return true
		}, "the registry stopped sending"},
		{"endless garbage for a manifest", func(w http.ResponseWriter, r *http.Request) bool {
			if !isManifest(r) {
				return false
			}
			w.Header().Set("Content-Type", string(types.OCIImageIndex))
			junk := []byte(strings.Repeat("garbage ", 8192))
			for r.Context().Err() == nil {
				if _, err := w.Write(junk); err != nil {
					break
				}
			}
			return true
		}, "the registry sent more than"},
		{"a manifest that is garbage", func(w http.ResponseWriter, r *http.Request) bool {
			if !isManifest(r) {
				return false
			}
			w.Header().Set("Content-Type", string(types.OCIImageIndex))
			_, _ = w.Write([]byte("{not json"))
			return true
		}, "not a manifest"},
		{"a layer answered with too much", func(w http.ResponseWriter, r *http.Request) bool {
			if !isBlob(r) || r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "sha256:") {
				return false
			}
			if l, _ := img.Layers(); len(l) > 0 {
				if d, _ := l[0].Digest(); !strings.HasSuffix(r.URL.Path, d.String()) {
					return false
				}
			}
			w.Header().Set("Content-Length", fmt.Sprint(int64(1)<<40))
			w.WriteHeader(http.StatusOK)
			return true
		}, "more than a pull may download"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := proxyTo(t, tc.bad)
			start := time.Now()
			opts := PullOptions{ImportOptions: ImportOptions{Source: reg + "/r/img:1", MaxBytes: 4 << 20}, Stall: 300 * time.Millisecond,
				Timeout: 20 * time.Second}
			src, err := openRemote(t.Context(), opts)
			if err == nil {
				_, err = unpackInto(t, src, opts.limits(), false)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("pull: %v, want an error with %q", err, tc.want)
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("the pull took %s", d)
			}
		})
	}
}

// TestCheckScheme: plain HTTP to loopback only.
func TestCheckScheme(t *testing.T) {
	for ref, ok := range map[string]bool{
		"127.0.0.1:5000/a":     true,
		"localhost:5000/a":     true,
		"[::1]:5000/a":         true,
		"registry.test/a":      true, // HTTPS
		"10.1.2.3:5000/a":      false,
		"192.168.1.1/a":        false,
		"reg.localhost:5000/a": false, // loopback by its name only
	} {
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkScheme(r.Context().Registry); (err == nil) != ok {
			t.Errorf("%s: %v, want allowed %v", ref, err, ok)
		}
	}
}
