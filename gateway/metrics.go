package gateway

// Metrics in the Prometheus text exposition format (version 0.0.4), at
// GET /metrics on the socket and, with Config.MetricsListen, on a
// loopback TCP address. The format is a few lines of text; the official
// client library would add a dozen modules for the same output, so the
// daemon writes it itself: counters kept here, gauges read from the slots,
// the sessions and the host when scraped.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// execBuckets are the upper bounds (seconds) of the exec duration
// histogram: from a pooled one-shot to a long build.
var execBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

type histogram struct {
	counts []uint64 // per bucket, not cumulative
	sum    float64
	n      uint64
}

// metrics holds the daemon's counters. Safe for concurrent use.
type metrics struct {
	mu       sync.Mutex
	requests map[[2]string]uint64 // profile, verdict
	execs    map[string]*histogram
	busy     uint64
	netConns map[string]uint64 // verdict
	// Sessions: pauses and resumes (count and seconds), copies forked,
	// sessions lost.
	pauses, resumes       uint64
	pauseSecs, resumeSecs float64
	forks, lostSessions   uint64
}

func newMetrics() *metrics {
	return &metrics{requests: map[[2]string]uint64{}, execs: map[string]*histogram{}, netConns: map[string]uint64{}}
}

func (m *metrics) request(profile, verdict string) {
	m.mu.Lock()
	m.requests[[2]string{profile, verdict}]++
	m.mu.Unlock()
}

func (m *metrics) refusedBusy() {
	m.mu.Lock()
	m.busy++
	m.mu.Unlock()
}

func (m *metrics) netConn(verdict string) {
	m.mu.Lock()
	m.netConns[verdict]++
	m.mu.Unlock()
}

func (m *metrics) paused(d time.Duration) {
	m.mu.Lock()
	m.pauses++
	m.pauseSecs += d.Seconds()
	m.mu.Unlock()
}

func (m *metrics) resumed(d time.Duration) {
	m.mu.Lock()
	m.resumes++
	m.resumeSecs += d.Seconds()
	m.mu.Unlock()
}

func (m *metrics) forked(copies int, _ time.Duration) {
	m.mu.Lock()
	m.forks += uint64(copies)
	m.mu.Unlock()
}

func (m *metrics) sessionLost() {
	m.mu.Lock()
	m.lostSessions++
	m.mu.Unlock()
}

// exec records a command's duration by how its VM started (pool,
// restore, boot, or session for a kept VM).
func (m *metrics) exec(start string, d time.Duration) {
	if start == "" {
		start = "session"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.execs[start]
	if h == nil {
		h = &histogram{counts: make([]uint64, len(execBuckets))}
		m.execs[start] = h
	}
	s := d.Seconds()
	for i, b := range execBuckets {
		if s <= b {
			h.counts[i]++
			break
		}
	}
	h.sum += s
	h.n++
}

// gauges are the values read when scraped.
type gauges struct {
	liveVMs, maxVMs, waiting, sessions int
	pausedSessions                     int
	pausedBytes                        int64
	pools                              []poolGauge
	restoreFailures, handshakeRetries  int64
	auditWriteErrors                   uint64
	auditHealthy                       bool
}

type poolGauge struct {
	labels             string
	ready, size, ahead int
}

// promWriter writes metric families.
type promWriter struct{ w io.Writer }

func (p promWriter) family(name, typ, help string) {
	fmt.Fprintf(p.w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func (p promWriter) sample(name, labels string, v any) {
	if labels != "" {
		labels = "{" + labels + "}"
	}
	fmt.Fprintf(p.w, "%s%s %v\n", name, labels, v)
}

// labelValue escapes a label value for the text format.
func labelValue(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// write writes every metric in the text format (pure but for m's state).
func (m *metrics) write(w io.Writer, g gauges) {
	p := promWriter{w}
	m.mu.Lock()
	defer m.mu.Unlock()

	p.family("vmgate_requests_total", "counter", "Requests decided, by profile and verdict (allow, deny).")
	keys := make([][2]string, 0, len(m.requests))
	for k := range m.requests {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		p.sample("vmgate_requests_total", fmt.Sprintf(`profile="%s",verdict="%s"`, labelValue(k[0]), labelValue(k[1])), m.requests[k])
	}

	p.family("vmgate_exec_duration_seconds", "histogram", "Commands' run time in their VM, by how the VM started (pool, restore, boot, session).")
	starts := make([]string, 0, len(m.execs))
	for k := range m.execs {
		starts = append(starts, k)
	}
	sort.Strings(starts)
	for _, st := range starts {
		h := m.execs[st]
		var cum uint64
		for i, b := range execBuckets {
			cum += h.counts[i]
			p.sample("vmgate_exec_duration_seconds_bucket", fmt.Sprintf(`start="%s",le="%g"`, st, b), cum)
		}
		p.sample("vmgate_exec_duration_seconds_bucket", fmt.Sprintf(`start="%s",le="+Inf"`, st), h.n)
		p.sample("vmgate_exec_duration_seconds_sum", fmt.Sprintf(`start="%s"`, st), h.sum)
		p.sample("vmgate_exec_duration_seconds_count", fmt.Sprintf(`start="%s"`, st), h.n)
	}

	p.family("vmgate_busy_refusals_total", "counter", "Requests refused as busy: no VM slot in time, or the caller's share in use.")
	p.sample("vmgate_busy_refusals_total", "", m.busy)
	p.family("vmgate_net_connections_total", "counter", "Guest network connections and DNS queries, by verdict.")
	for _, v := range []string{"allow", "deny"} {
		p.sample("vmgate_net_connections_total", fmt.Sprintf(`verdict="%s"`, v), m.netConns[v])
	}

	p.family("vmgate_vms_live", "gauge", "VMs running now (sessions and pooled VMs included).")
	p.sample("vmgate_vms_live", "", g.liveVMs)
	p.family("vmgate_vms_max", "gauge", "The daemon's limit of live VMs.")
	p.sample("vmgate_vms_max", "", g.maxVMs)
	p.family("vmgate_queue_waiting", "gauge", "Requests waiting for a VM slot.")
	p.sample("vmgate_queue_waiting", "", g.waiting)
	p.family("vmgate_sessions", "gauge", "Sessions, running or paused.")
	p.sample("vmgate_sessions", "", g.sessions)
	p.family("vmgate_sessions_paused", "gauge", "Sessions paused to disk.")
	p.sample("vmgate_sessions_paused", "", g.pausedSessions)
	p.family("vmgate_sessions_paused_bytes", "gauge", "Disk the paused sessions' saved state takes.")
	p.sample("vmgate_sessions_paused_bytes", "", g.pausedBytes)
	p.family("vmgate_session_pause_seconds", "summary", "Time to pause a session (save its VM to disk).")
	p.sample("vmgate_session_pause_seconds_sum", "", m.pauseSecs)
	p.sample("vmgate_session_pause_seconds_count", "", m.pauses)
	p.family("vmgate_session_resume_seconds", "summary", "Time to resume a paused session (its VM restored and its agent answering).")
	p.sample("vmgate_session_resume_seconds_sum", "", m.resumeSecs)
	p.sample("vmgate_session_resume_seconds_count", "", m.resumes)
	p.family("vmgate_session_forks_total", "counter", "Sessions made as copies of another (fork).")
	p.sample("vmgate_session_forks_total", "", m.forks)
	p.family("vmgate_sessions_lost_total", "counter", "Sessions lost: running when the daemon died, or whose saved state could not be resumed.")
	p.sample("vmgate_sessions_lost_total", "", m.lostSessions)
	p.family("vmgate_pool_ready", "gauge", "Restored VMs waiting in a shape's pool.")
	for _, pg := range g.pools {
		p.sample("vmgate_pool_ready", pg.labels, pg.ready)
	}
	p.family("vmgate_pool_size", "gauge", "A shape's pool size.")
	for _, pg := range g.pools {
		p.sample("vmgate_pool_size", pg.labels, pg.size)
	}
	p.family("vmgate_pool_ahead", "gauge", "Clones of a shape launched ahead (QEMU up, waiting for a restore).")
	for _, pg := range g.pools {
		p.sample("vmgate_pool_ahead", pg.labels, pg.ahead)
	}
	p.family("vmgate_restore_failures_total", "counter", "Pool restores that failed.")
	p.sample("vmgate_restore_failures_total", "", g.restoreFailures)
	p.family("vmgate_restore_handshake_retries_total", "counter", "Restores whose first agent handshake failed (each replaced by a second clone).")
	p.sample("vmgate_restore_handshake_retries_total", "", g.handshakeRetries)
	p.family("vmgate_audit_write_errors_total", "counter", "Audit records the log refused (write or fsync failures).")
	p.sample("vmgate_audit_write_errors_total", "", g.auditWriteErrors)
	p.family("vmgate_audit_healthy", "gauge", "1 when the audit log accepts records; 0 means requests are refused.")
	healthy := 0
	if g.auditHealthy {
		healthy = 1
	}
	p.sample("vmgate_audit_healthy", "", healthy)
}

// gauges reads the current values.
func (s *Server) gauges() gauges {
	used, waiting := s.slots.stats()
	g := gauges{liveVMs: used, maxVMs: s.cfg.MaxVMs, waiting: waiting, handshakeRetries: s.host.HandshakeFailures(),
		auditWriteErrors: s.rec.WriteErrors(), auditHealthy: s.rec.Healthy() == nil}
	g.sessions, g.pausedSessions, g.pausedBytes = s.sessions.count()
	for _, ss := range s.host.Stats() {
		g.restoreFailures += ss.Pool.Failures
		g.pools = append(g.pools, poolGauge{labels: fmt.Sprintf(`image="%s",memory_mib="%d",cpus="%d",disk_mib="%d",network="%t"`, labelValue(ss.Image), ss.MemoryMiB, ss.CPUs, ss.DiskMiB, ss.Network),
			ready: ss.Pool.Ready, size: ss.Pool.Size, ahead: ss.Pool.Ahead})
	}
	return g
}

func (s *Server) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	s.metrics.write(w, s.gauges())
}

// listenMetrics serves /metrics alone on addr, which must be a loopback
// address: the figures name profiles and images.
func listenMetrics(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("metrics listen %q: not a loopback address (127.0.0.1:PORT or [::1]:PORT)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen: %w", err)
	}
	return ln, nil
}
