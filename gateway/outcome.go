package gateway

import (
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/vm"
)

// errCancelled marks a command whose client closed its stream before the
// command's end (vm-exec interrupted, an MCP client's
// notifications/cancelled): the command was killed for it, and its audit
// record says so.
var errCancelled = errors.New("cancelled by the client (its stream closed before the command ended)")

func cancelledByClient(err error) error {
	if err == nil {
		return errCancelled
	}
	return fmt.Errorf("%w: %w", errCancelled, err)
}

// execOutcome is what an exec produced, for its audit record and result.
type execOutcome struct {
	res    *vm.ExecResult // nil when the command did not complete
	target *vmTarget      // nil when no VM was obtained
	err    error
	// The streams as relayed (zero when the command did not run).
	stdin, stdout, stderr receipt.Stream
	execDur               time.Duration
	transfers             []wire.Transfer
	diskBytes             int64 // the VM's overlay on the host's disk when the command ended
}

// auditExec writes the exec record of an outcome.
func (s *Server) auditExec(st *execState, o execOutcome) {
	rec := audit.Record{Kind: audit.KindExec, RequestID: st.reqID,
		Profile: st.verdict.Profile, Argv: st.argv, Shell: st.req.Shell, Session: st.req.Session,
		Image: st.verdict.Image, ImageDigest: s.host.ImageDigestOf(st.verdict.Image), ImageManifestDigest: manifestDigest(st.imageSrc),
		DurationMS: time.Since(st.start).Milliseconds(),
		StdinBytes: o.stdin.Bytes, StdinSHA256: o.stdin.SHA256, StdoutSHA256: o.stdout.SHA256, StderrSHA256: o.stderr.SHA256}
	setCaller(&rec, st.id)
	rec.GuestUser = st.verdict.User
	rec.Network = auditNetwork(st.verdict)
	if t := o.target; t != nil {
		rec.VMID, rec.BootMS, rec.VMStart, rec.DiskBytes = t.vm.ID, t.boot.Milliseconds(), t.start, o.diskBytes
		if t.jail != "" {
			rec.Message = "jail: " + t.jail
		}
	}
	if res := o.res; res != nil {
		code := res.ExitCode
		rec.ExitCode, rec.Signal, rec.TimedOut = &code, res.Signal, res.TimedOut
		rec.StdoutBytes, rec.StderrBytes = res.StdoutBytes, res.StderrBytes
		rec.Truncated = res.StdoutTruncated || res.StderrTruncated
	}
	if o.err != nil {
		rec.Error = vm.Details(o.err)
	}
	if len(o.transfers) > 0 {
		rec.Transfers = auditTransfers(st.req, o.transfers)
	}
	e, err := s.rec.Append(rec)
	if err != nil {
		s.log.Error("audit exec record", "req", st.reqID, "err", err)
		st.recorded, st.auditNote = nil, "the exec record could not be written: "+err.Error()
		return
	}
	st.recorded = &e
}

// result is an outcome as the protocol reports it.
func result(st *execState, o execOutcome) wire.Result {
	out := wire.Result{RequestID: st.reqID, Profile: st.verdict.Profile, TotalMS: time.Since(st.start).Milliseconds(), ExecMS: o.execDur.Milliseconds()}
	if t := o.target; t != nil {
		out.VMID, out.BootMS, out.QueueMS, out.VMStart = t.vm.ID, t.boot.Milliseconds(), t.queue.Milliseconds(), t.start
	}
	if res := o.res; res != nil {
		out.ExitCode, out.Signal, out.TimedOut = res.ExitCode, res.Signal, res.TimedOut
		out.StdoutTruncated, out.StderrTruncated = res.StdoutTruncated, res.StderrTruncated
		out.StdoutBytes, out.StderrBytes = res.StdoutBytes, res.StderrBytes
	}
	out.Transfers = o.transfers
	return out
}

// manifestDigest is the manifest digest an image's source names, "" for
// an image without one.
func manifestDigest(src *vm.ImageSource) string {
	if src == nil {
		return ""
	}
	return src.ManifestDigest
}
