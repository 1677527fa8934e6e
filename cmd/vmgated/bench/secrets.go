package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/inproc"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/vm/netstack"
)

// Secrets (part "secrets"): an HTTPS request from the guest that carries
// a secret's placeholder, through the netstack's interception (the
// guest's TLS ended with the session CA, the value put in, TLS again to
// the server, verified), against the same request to the same local
// server under a name no secret is bound to (not intercepted), verified
// by curl against a bundle of the same size (the guest's system bundle
// and the bench's CA: under TCG, reading the bundle is most of a
// handshake's time in the guest, so -k would be no fair baseline). Both
// are curl's time_total in the guest, interleaved, in one session:
//
//   - secret_https_ms: with the secret; https_ms: without;
//     secret_https_overhead_ms: the median of the pairs' differences.

// secretPolicy binds BENCH_TOKEN to secret.bench on port; plain.bench is
// the same server without it, on one of the host's own addresses (a
// guest's 127.0.0.1 is its own), whose range is allowed: the server is
// the benchmark's. The connect rate is out of the way: its bucket would
// hold back the SYNs of a loop of requests, and time TCP's retries.
const secretPolicy = `version = 1
[[secret]]
name = "BENCH_TOKEN"
file = %q
hosts = ["secret.bench:%[2]d"]
headers = ["Authorization"]
[[profile]]
name = "bench"
match = { any = true }
allow_shell = true
max_vms = 2
max_vms_per_caller = 2
secrets = ["BENCH_TOKEN"]
[profile.sessions]
allowed = true
[profile.timeout]
default = "5m"
max = "10m"
[profile.network]
mode = "allowlist"
allow = ["secret.bench:%[2]d", "plain.bench:%[2]d"]
allow_ranges = ["%[3]s/32"]
connect_rate = 100000
`

// secrets measures a request with a secret (see above) in a daemon of
// its own.
func (r *execRun) secrets(ctx context.Context) error {
	o, rep := r.o, r.rep
	dir := filepath.Join(r.work, "secrets")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// The bench's CA: a session CA serves as any (the server's
	// certificates for both names are its leaves).
	ca, err := netstack.NewSessionCA("bench")
	if err != nil {
		return err
	}
	caPEM := ca.CertPEM
	roots, secretFile := filepath.Join(dir, "roots.pem"), filepath.Join(dir, "token")
	value := "bench_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.WriteFile(roots, caPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(secretFile, []byte(value), 0o600); err != nil {
		return err
	}
	host, err := hostAddr()
	if err != nil {
		return err
	}
	ln, err := tls.Listen("tcp", netip.AddrPortFrom(host, 0).String(), &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return ca.Leaf(h.ServerName)
	}})
	if err != nil {
		return err
	}
	var withValue, without atomic.Int64
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Authorization") == "Bearer "+value {
			withValue.Add(1)
		} else {
			without.Add(1)
		}
		_, _ = w.Write([]byte("ok\n"))
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	at := []netip.Addr{host}
	d, err := inproc.Start(ctx, inproc.Options{Dir: dir, ImageDir: o.ImageDir, TemplateDir: o.TemplateDir,
		Policy: withASLR([]byte(fmt.Sprintf(secretPolicy, secretFile, port, host)), o.GuestASLR), MaxVMs: 2, Ahead: o.Ahead, Accel: o.Accel, TBSizeMiB: o.TBSizeMiB, Log: o.Log,
		NetHosts: map[string][]netip.Addr{"secret.bench": at, "plain.bench": at}, SecretRoots: roots})
	if err != nil {
		return err
	}
	defer d.Stop()
	runs := o.Runs
	r.step("secrets: %d HTTPS requests with a secret and %d without, interleaved", runs, runs)
	curl := `curl -sS -o /dev/null -w "%{time_total}\n" --max-time 30 -H "Authorization: Bearer $BENCH_TOKEN"`
	bundle := fmt.Sprintf("cat /etc/ssl/certs/ca-certificates.crt > /tmp/bench-ca.pem && printf '%%s' '%s' >> /tmp/bench-ca.pem && ", caPEM)
	script := bundle + fmt.Sprintf(`for i in $(seq %d); do printf 's '; %s https://secret.bench:%d/; printf 'p '; %s --cacert /tmp/bench-ca.pem https://plain.bench:%d/; done`,
		runs+1, curl, port, curl, port)
	var out strings.Builder
	res, err := d.Client.Exec(ctx, wire.ExecRequest{Argv: []string{script}, Shell: true, Session: "secrets", Secrets: []string{"BENCH_TOKEN"}},
		client.ExecIO{Stdout: &out, Stderr: &out})
	_ = d.Client.EndSession(context.WithoutCancel(ctx), "secrets")
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("curl in the guest: exit %d: %s", res.ExitCode, out.String())
	}
	var with, plain []time.Duration
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for first := true; sc.Scan(); {
		kind, secs, ok := strings.Cut(sc.Text(), " ")
		f, err := strconv.ParseFloat(secs, 64)
		if !ok || err != nil {
			return fmt.Errorf("curl in the guest printed %q", sc.Text())
		}
		t := time.Duration(f * float64(time.Second))
		switch {
		case kind == "p" && first:
			first = false // the first pair warms the session's CA's leaf and curl's files
		case kind == "s" && first:
		case kind == "s":
			with = append(with, t)
		default:
			plain = append(plain, t)
		}
	}
	if len(with) != runs || len(plain) != runs {
		return fmt.Errorf("curl in the guest: %d and %d times, want %d: %s", len(with), len(plain), runs, out.String())
	}
	// Every request with the placeholder reached the server with the
	// value; every one without, without it.
	if withValue.Load() != int64(runs+1) || without.Load() != int64(runs+1) {
		return fmt.Errorf("the server got the value in %d requests and not in %d; want %d each", withValue.Load(), without.Load(), runs+1)
	}
	rep.SecretHTTPSMS, rep.HTTPSMS, rep.SecretOverheadMS = summarize(with), summarize(plain), pairedMedian(plain, with)
	if rep.SecretOverheadMS > SecretBudgetMS {
		rep.Notes = append(rep.Notes, fmt.Sprintf("an HTTPS request with a secret costs %.1f ms more than without, over its %d ms budget", rep.SecretOverheadMS, SecretBudgetMS))
	}
	return nil
}

// SecretBudgetMS bounds what the interception may add to an HTTPS
// request (the median of the pairs' differences).
const SecretBudgetMS = 10

// hostAddr is an IPv4 address of one of the host's interfaces other than
// loopback, which the guests' netstacks (in the host's network) reach.
func hostAddr() (netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() && !p.Addr().IsLinkLocalUnicast() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no IPv4 address other than loopback to serve the guests on")
}
