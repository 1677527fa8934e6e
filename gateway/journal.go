package gateway

import (
	"encoding/json"
	"strconv"

	"github.com/coreos/go-systemd/v22/journal"

	"github.com/vmgate/vmgate/gateway/audit"
)

// journalMirror returns an audit mirror that sends each record to the
// systemd journal with structured VMGATE_* fields, or nil when the journal
// is not available (not under systemd).
func journalMirror() func(audit.Record) {
	if !journal.Enabled() {
		return nil
	}
	return func(r audit.Record) {
		msg, prio, fields := journalEntry(r)
		_ = journal.Send(msg, prio, fields)
	}
}

// journalEntry is the pure mapping of an audit record to a journal entry.
func journalEntry(r audit.Record) (string, journal.Priority, map[string]string) {
	f := map[string]string{
		"VMGATE_KIND": string(r.Kind),
		"VMGATE_SEQ":  strconv.FormatUint(r.Seq, 10),
	}
	set := func(k, v string) {
		if v != "" {
			f[k] = v
		}
	}
	set("VMGATE_REQUEST_ID", r.RequestID)
	set("VMGATE_PROFILE", r.Profile)
	set("VMGATE_VERDICT", string(r.Verdict))
	set("VMGATE_RULE", r.Rule)
	set("VMGATE_REASON", r.Reason)
	set("VMGATE_VM_ID", r.VMID)
	set("VMGATE_SESSION", r.Session)
	set("VMGATE_SIGNAL", r.Signal)
	set("VMGATE_ERROR", r.Error)
	if r.UID != nil {
		f["VMGATE_UID"] = strconv.FormatUint(uint64(*r.UID), 10)
	}
	if r.PID != 0 {
		f["VMGATE_PID"] = strconv.FormatInt(int64(r.PID), 10)
	}
	if r.ExitCode != nil {
		f["VMGATE_EXIT_CODE"] = strconv.Itoa(*r.ExitCode)
	}
	if r.TimedOut {
		f["VMGATE_TIMED_OUT"] = "1"
	}
	if len(r.Argv) > 0 {
		b, _ := json.Marshal(r.Argv)
		f["VMGATE_ARGV"] = string(b)
	}
	msg := "vmgate " + string(r.Kind)
	switch {
	case r.Verdict != "":
		msg += " " + string(r.Verdict)
	case r.ExitCode != nil:
		msg += " exit " + strconv.Itoa(*r.ExitCode)
	case r.Message != "":
		msg += ": " + r.Message
	}
	prio := journal.PriInfo
	if r.Verdict == audit.VerdictDeny || r.Error != "" {
		prio = journal.PriNotice
	}
	return msg, prio, f
}
